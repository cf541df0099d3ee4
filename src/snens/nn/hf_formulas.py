"""What Hugging Face's norm classes compute, and which of those formulas a module computes.

**RMS norms.** Hugging Face models do not use ``nn.RMSNorm``: about 160 of their RMS norm
classes (transformers 5.24) are copies of a few formulas, which compute the statistics in
float32 and differ in where they cast, with x̂ = x_f32 · rsqrt(mean(x_f32²) + eps):

* Llama (``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, …): weight ⊙ x̂.to(x.dtype);
* Gemma (``GemmaRMSNorm``, ``Gemma2RMSNorm``, ``Qwen3NextRMSNorm``, …): (x̂ ⊙ (1 + weight_f32))
  .to(x.dtype), the weight stored as an offset from 1;
* T5 (``T5LayerNorm``, ``MT5LayerNorm``, ``LongT5LayerNorm``, …): weight ⊙ (x · rsqrt(…)), the
  product cast to the weight's dtype first where that is half precision;
* OLMo-2 (``Olmo2RMSNorm``, …): (weight ⊙ x̂).to(x.dtype), the product in float32 (in float64
  for a float64 weight) and cast once;
* Gemma 3n (``Gemma3nRMSNorm``): (x̂ ⊙ weight_f32).to(x.dtype) with x̂ = x_f32 ·
  pow(mean(x_f32²) + eps, −0.5), ``torch.pow`` rather than ``rsqrt`` (their rounding differs).

**Layer norms**, mean-centred in float32 and cast back once:

* Cohere (``CohereLayerNorm``): weight_f32 ⊙ (x_f32 − μ) · rsqrt(mean((x_f32 − μ)²) + eps), as
  explicit ops, over the last dimension; the weight may be (H, D) (its QK norms);
* OLMo-1 (``OlmoLayerNorm``): ``F.layer_norm(x_f32, (C,), eps=1e-5)``, no weight at all.

A class is recognised by its attributes (its weight, the attribute holding eps, no other state)
and by the source of its forward (and of Gemma's ``_norm``), which must be, token for token, one
of the formulas below (comments, docstrings, annotations and layout aside): a copy whose forward
was edited is unknown. :mod:`snens.nn.hf_norms` holds the member versions, which compute these
functions with each member's folded scale in place of the weight.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from snens.nn.plain_conversion import only_state

__all__ = [
    "HFFormula",
    "cohere_layer_norm",
    "formula_eps",
    "gemma3n_rms_norm",
    "gemma_rms_norm",
    "hf_formula",
    "llama_rms_norm",
    "olmo2_rms_norm",
    "olmo_layer_norm",
    "t5_rms_norm",
]

HFFormula = Literal["llama", "gemma", "t5", "olmo2", "gemma3n", "cohere", "olmo"]


# -- the formulas ----------------------------------------------------------------------------
def llama_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype), as ``LlamaRMSNorm`` computes it.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x, in the promoted dtype.
    """
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def gemma_rms_norm(x: Tensor, factor: Tensor, eps: float) -> Tensor:
    """(x̂ ⊙ factor_f32).to(x.dtype), x̂ = x_f32 · rsqrt(mean(x_f32²) + eps), as ``GemmaRMSNorm``
    computes it with factor = 1 + weight.

    Shape:
        x: (*, C). factor: broadcastable to x. Output: like x.
    """
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * factor.float()).type_as(x)


def t5_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight ⊙ (x · rsqrt(mean(x_f32²) + eps)), as ``T5LayerNorm`` computes it: the normalized
    input is cast to the weight's dtype first where that is float16 or bfloat16.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x, in the promoted dtype.
    """
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(weight.dtype)
    return weight * h


def olmo2_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps))).to(x.dtype), as ``Olmo2RMSNorm`` computes
    it: the product in the promoted dtype of the weight and float32, cast once.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x.
    """
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h).to(x.dtype)


def gemma3n_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(x_f32 · pow(mean(x_f32²) + eps, −0.5) ⊙ weight_f32).to(x.dtype), as
    ``Gemma3nRMSNorm(with_scale=True)`` computes it.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x.
    """
    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (h * weight.float()).type_as(x)


def cohere_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight_f32 ⊙ (x_f32 − μ) · rsqrt(mean((x_f32 − μ)²) + eps)).to(x.dtype), μ the mean
    over the last dimension, as ``CohereLayerNorm`` computes it.

    Shape:
        x: (*, C) or (*, H, C). weight: broadcastable to x. Output: like x.
    """
    h = x.to(torch.float32)
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt(variance + eps)
    return (weight.to(torch.float32) * h).to(x.dtype)


def olmo_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(F.layer_norm(x_f32, (C,), eps=eps) ⊙ weight_f32).to(x.dtype): ``OlmoLayerNorm``'s
    float32 layer norm and its one cast, with a weight (``OlmoLayerNorm`` is weight = 1).

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x.
    """
    h = F.layer_norm(x.to(torch.float32), x.shape[-1:], None, None, eps=eps)
    return (h * weight.to(torch.float32)).to(x.dtype)


# -- recognition -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Known:
    """What a module computing one formula holds: the Hugging Face sources its methods must
    match (as ASTs), where its eps is (an attribute, or a constant of the source), whether it
    has a 1-D weight ("vector"), a weight of any shape ("tensor") or no parameter ("none"),
    and the values of the attributes its forward branches on."""

    sources: dict[str, str]
    eps: str | float
    weight: Literal["vector", "tensor", "none"] = "vector"
    flags: dict[str, object] = dataclasses.field(default_factory=dict)


_KNOWN: dict[HFFormula, _Known] = {
    "llama": _Known(
        {
            "forward": """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
"""
        },
        eps="variance_epsilon",
    ),
    "gemma": _Known(
        {
            "_norm": """
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
""",
            "forward": """
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
""",
        },
        eps="eps",
    ),
    "t5": _Known(
        {
            "forward": """
def forward(self, hidden_states):
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states
"""
        },
        eps="variance_epsilon",
    ),
    "olmo2": _Known(
        {
            "forward": """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight * hidden_states).to(input_dtype)
"""
        },
        eps="variance_epsilon",
    ),
    # Gemma3nRMSNorm(with_scale=False) holds no weight and does not record its size, so a member
    # version cannot be built for it: it stays unrecognised, and is refused by name.
    "gemma3n": _Known(
        {
            "_norm": """
def _norm(self, hidden_states):
    mean_squared = hidden_states.pow(2).mean(-1, keepdim=True) + self.eps
    return hidden_states * torch.pow(mean_squared, -0.5)
""",
            "forward": """
def forward(self, hidden_states):
    normed_output = self._norm(hidden_states.float())
    if self.with_scale:
        normed_output = normed_output * self.weight.float()
    return normed_output.type_as(hidden_states)
""",
        },
        eps="eps",
        flags={"with_scale": True},
    ),
    "cohere": _Known(
        {
            "forward": """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    mean = hidden_states.mean(-1, keepdim=True)
    variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
    hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight.to(torch.float32) * hidden_states
    return hidden_states.to(input_dtype)
"""
        },
        eps="variance_epsilon",
        weight="tensor",
    ),
    "olmo": _Known(
        {
            "forward": """
def forward(self, hidden_states):
    orig_dtype = hidden_states.dtype
    return F.layer_norm(
        hidden_states.to(dtype=torch.float32), self.normalized_shape, None, None, eps=1e-5
    ).to(orig_dtype)
"""
        },
        eps=1e-5,
        weight="none",
    ),
}


def _code_of(source: str) -> str:
    """A function's AST without what does not change what it computes: its name, decorators,
    annotations and docstring (comments and layout are not in an AST)."""
    (function,) = ast.parse(textwrap.dedent(source)).body
    if not isinstance(function, ast.FunctionDef):
        return ""
    function.name, function.decorator_list, function.returns = "f", [], None
    arguments = function.args
    for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
        arg.annotation = None
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:] or [ast.Pass()]
    return ast.dump(function)


_KNOWN_CODE = {
    formula: {name: _code_of(source) for name, source in known.sources.items()}
    for formula, known in _KNOWN.items()
}


@functools.cache
def _class_formula(cls: type) -> HFFormula | None:
    for formula, methods in _KNOWN_CODE.items():
        if all(_method_code(cls, name) == code for name, code in methods.items()):
            return formula
    return None


def _method_code(cls: type, name: str) -> str | None:
    try:
        return _code_of(inspect.getsource(getattr(cls, name)))
    except (AttributeError, OSError, TypeError, SyntaxError, ValueError):
        return None  # no such method, or no source to read (a C extension, an exec'd class)


def _is_real(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _holds(module: nn.Module, known: _Known) -> bool:
    """Whether ``module`` holds exactly the state ``known`` describes."""
    if known.weight == "none":
        shape = getattr(module, "normalized_shape", None)
        if not (isinstance(shape, tuple) and len(shape) == 1):
            return False
        size = shape[0]
        sized = isinstance(size, int) and not isinstance(size, bool) and size >= 1
        return sized and only_state(module, set())
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() == 0:
        return False
    if known.weight == "vector" and weight.dim() != 1:
        return False
    return only_state(module, {"weight"}) and all(
        getattr(module, name, None) is value for name, value in known.flags.items()
    )


def formula_eps(module: nn.Module, formula: HFFormula) -> float:
    """The eps ``module`` adds to the variance when it computes ``formula``."""
    eps = _KNOWN[formula].eps
    return eps if isinstance(eps, float) else getattr(module, eps)


def hf_formula(module: nn.Module) -> HFFormula | None:
    """Which Hugging Face norm formula ``module`` computes, or None for any other module.

    ``module`` must hold exactly the formula's weight (a 1-D ``weight`` parameter; Cohere's of
    any shape; none for OLMo-1, which has a one-dimensional ``normalized_shape`` instead), a
    real ``variance_epsilon`` (Llama, T5, OLMo-2, Cohere) or ``eps`` (Gemma, Gemma 3n), Gemma
    3n's ``with_scale=True``, and its class's methods must be the formula's source.
    """
    if not only_state(module, {"weight"}):
        return None
    formula = _class_formula(type(module))
    if formula is None or not _holds(module, _KNOWN[formula]):
        return None
    known_eps = _KNOWN[formula].eps
    if isinstance(known_eps, str) and not _is_real(getattr(module, known_eps, None)):
        return None
    return formula
