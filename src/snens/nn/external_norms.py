"""Member norms for norm classes from outside torch: Hugging Face's RMS norms, channels-first
LayerNorms.

**RMS norms.** Hugging Face models do not use ``nn.RMSNorm``: about 160 of their RMS norm
classes (transformers 5.24) are copies of three formulas, which compute the statistics in
float32 and differ in where they cast, with x̂ = x_f32 · rsqrt(mean(x_f32²) + eps):

* Llama (``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, …): weight ⊙ x̂.to(x.dtype);
* Gemma (``GemmaRMSNorm``, ``Gemma2RMSNorm``, ``Qwen3NextRMSNorm``, …): (x̂ ⊙ (1 + weight_f32))
  .to(x.dtype), the weight stored as an offset from 1;
* T5 (``T5LayerNorm``, ``MT5LayerNorm``, ``LongT5LayerNorm``, …): weight ⊙ (x · rsqrt(…)), the
  product cast to the weight's dtype first where that is half precision.

A class is recognised by its attributes (a 1-D ``weight``, ``variance_epsilon`` or ``eps``, no
other state) and by the source of its forward (and of Gemma's ``_norm``), which must be, token
for token, one of the formulas below (comments, docstrings, annotations and layout aside): a
copy whose forward was edited is unknown. The member version computes the same formula, op for
op, with member m's folded scale sigmoid(gamma_m)·weight_m in place of the weight (for Gemma in
place of the whole factor 1 + weight), so every member reproduces the plain module in every
dtype, up to the rounding of that folded scale (none in float32 beyond 1e-6).

**Channels-first LayerNorms.** timm's ``LayerNorm2d`` and Hugging Face's ``ConvNextLayerNorm``
(``data_format="channels_first"``) are ``nn.LayerNorm`` subclasses that normalize (B, C, H, W)
inputs over C: permute to channels-last, layer norm, permute back. Their sources vary between
libraries and versions, so these are recognised by what they compute: a float32 copy of the
module with a random affine runs on a probe input and must equal that formula.

Both families convert through :func:`from_plain_as`, the steps of ``MemberNorm.from_plain`` for
a plain type the member class does not own; ``snens.nn.adapters`` decides which module goes
where.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import textwrap
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from snens.nn import fused
from snens.nn.norms import MemberNorm, path_override
from snens.nn.per_example_norms import MemberLayerNorm

__all__ = [
    "MemberGemmaRMSNorm",
    "MemberLayerNorm2d",
    "MemberLlamaRMSNorm",
    "MemberT5RMSNorm",
    "from_plain_as",
    "gemma_rms_norm",
    "layer_norm_layout",
    "llama_rms_norm",
    "rms_formula",
    "t5_rms_norm",
]

RMSFormula = Literal["llama", "gemma", "t5"]
Layout = Literal["channels_first", "channels_last"]


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


# The Hugging Face sources a class must match (as ASTs) to be converted with a formula above.
_KNOWN_SOURCES: dict[RMSFormula, dict[str, str]] = {
    "llama": {
        "forward": """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
"""
    },
    "gemma": {
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
    "t5": {
        "forward": """
def forward(self, hidden_states):
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states
"""
    },
}
_EPS_ATTRIBUTE: dict[RMSFormula, str] = {
    "llama": "variance_epsilon",
    "gemma": "eps",
    "t5": "variance_epsilon",
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
    formula: {name: _code_of(source) for name, source in methods.items()}
    for formula, methods in _KNOWN_SOURCES.items()
}


@functools.cache
def _class_formula(cls: type) -> RMSFormula | None:
    for formula, methods in _KNOWN_CODE.items():
        if all(_method_code(cls, name) == code for name, code in methods.items()):
            return formula
    return None


def _method_code(cls: type, name: str) -> str | None:
    try:
        return _code_of(inspect.getsource(getattr(cls, name)))
    except (AttributeError, OSError, TypeError, SyntaxError, ValueError):
        return None  # no such method, or no source to read (a C extension, an exec'd class)


def _only_state(module: nn.Module, names: set[str]) -> bool:
    """A leaf holding no parameters beyond ``names`` and no buffers."""
    params = {name for name, _ in module.named_parameters(recurse=False)}
    return (
        next(module.children(), None) is None
        and params <= names
        and next(module.buffers(recurse=False), None) is None
    )


def rms_formula(module: nn.Module) -> RMSFormula | None:
    """Which Hugging Face RMS formula ``module`` computes, or None for any other module.

    ``module`` must hold exactly a 1-D ``weight`` parameter, a real ``variance_epsilon``
    (Llama, T5) or ``eps`` (Gemma), and its class's forward must be the formula's source.
    """
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1:
        return None
    if not _only_state(module, {"weight"}):
        return None
    formula = _class_formula(type(module))
    if formula is None:
        return None
    eps = getattr(module, _EPS_ATTRIBUTE[formula], None)
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        return None
    return formula


def layer_norm_layout(module: nn.Module) -> Layout | None:
    """Which layout an ``nn.LayerNorm`` (or subclass) over one dimension C normalizes, found by
    running its forward.

    A float32 CPU copy with a random affine (whatever the module's device and dtype, meta
    included) runs, hooks aside, on a random (2, C, 1, W) input, W ≠ C: "channels_first" if it
    equals layer norm over dim 1 (to channels-last, ``F.layer_norm``, back); else on a
    (2, 3, C) input, "channels_last" if it equals ``F.layer_norm`` over the last dim; else None
    (a forward that raises on a probe does not take that layout).
    """
    if not isinstance(module, nn.LayerNorm) or len(module.normalized_shape) != 1:
        return None
    if not _only_state(module, {"weight", "bias"}):
        return None
    probe = copy.deepcopy(module).to_empty(device="cpu").float()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if probe.weight is not None:
            probe.weight.copy_(1 + 0.5 * torch.randn(probe.weight.shape, generator=g))
        if probe.bias is not None:
            probe.bias.copy_(0.5 * torch.randn(probe.bias.shape, generator=g))
        (C,) = probe.normalized_shape

        def layer_norm(x: Tensor) -> Tensor:
            return F.layer_norm(x, (C,), probe.weight, probe.bias, probe.eps)

        channels_first = torch.randn(2, C, 1, 2 if C != 2 else 3, generator=g)
        if _computes(
            probe, channels_first, layer_norm(channels_first.movedim(1, -1)).movedim(-1, 1)
        ):
            return "channels_first"
        channels_last = torch.randn(2, 3, C, generator=g)
        if _computes(probe, channels_last, layer_norm(channels_last)):
            return "channels_last"
    return None


def _computes(module: nn.Module, x: Tensor, expected: Tensor) -> bool:
    try:
        out = type(module).forward(module, x)
    except (RuntimeError, ValueError, IndexError):
        return False
    return (
        isinstance(out, Tensor)
        and out.shape == expected.shape
        and torch.allclose(out, expected, rtol=1e-5, atol=1e-5)
    )


# -- conversion --------------------------------------------------------------------------------
def from_plain_as(
    member_type: type[MemberNorm],
    plain: nn.Module,
    num_members: int,
    *,
    generator: torch.Generator | None = None,
    **kw: Any,
) -> MemberNorm:
    """A ``member_type`` whose every member reproduces ``plain``, a module of any type that
    computes what ``member_type`` does.

    ``MemberNorm.from_plain`` without its exact-type check: ``member_type`` is built
    from ``member_type._plain_config(plain)`` on plain's device and dtype, gamma drawn from
    N(gamma_mean, gamma_std²), each member's affine set to plain's ``weight`` and ``bias``
    divided by sigmoid(gamma_m), running statistics copied.

    Args:
        member_type: a :class:`MemberNorm` subclass.
        plain: the module to replace.
        num_members: M.
        generator: optional ``torch.Generator`` for gamma.
        **kw: ``gamma_mean``, ``gamma_std``.

    Raises:
        TypeError: if ``plain`` lacks what ``member_type`` reads from it (named in the message).
    """
    try:
        config = member_type._plain_config(plain)
    except AttributeError as err:
        raise TypeError(
            f"{member_type.__name__} cannot be built from {type(plain).__name__}: {err}; "
            "register it with snens.nn.register_norm(..., from_plain=function) instead"
        ) from None
    return member_type._from_plain_config(plain, config, num_members, generator, kw)


class _RebuildsPlain:
    """to_plain's half for member norms of external classes: the plain class is rebuilt as
    ``plain_type(size, eps=eps, **plain_options)`` (recorded by from_plain)."""

    plain_type: type[nn.Module] | None
    plain_options: dict[str, Any]
    eps: float
    weight: Tensor

    def _rebuild_plain(self, size: int) -> nn.Module:
        if self.plain_type is None:
            raise ValueError(
                f"this {type(self).__name__} was built without plain_type, so it has no plain "
                "class to become; build it with plain_type= (from_plain records the converted "
                "module's class)"
            )
        try:
            plain = self.plain_type(size, eps=self.eps, **self.plain_options)
        except TypeError as err:
            raise TypeError(
                f"cannot rebuild {self.plain_type.__name__}({size}, eps={self.eps}, "
                f"**{self.plain_options}): {err}; register it with snens.nn.register_norm(..., "
                "from_plain=function) returning a member norm whose to_plain builds it"
            ) from None
        return plain.to(device=self.weight.device, dtype=self.weight.dtype)


# -- channels-first layer norm ---------------------------------------------------------------
class MemberLayerNorm2d(_RebuildsPlain, MemberLayerNorm):
    """σNorm over a channels-first LayerNorm: layer norm over dim 1 of (M·B, C, *) inputs.

    What timm's ``LayerNorm2d`` and Hugging Face's ``ConvNextLayerNorm(data_format=
    "channels_first")`` compute, member m with its folded affine:

        y_m = F.layer_norm(x_m.movedim(1, -1), (C,), scale_m, shift_m, eps).movedim(-1, 1)

    through :class:`MemberLayerNorm`'s kernels on the channels-last view.

    Args:
        num_channels: C.
        num_members: M.
        eps: as in ``torch.nn.LayerNorm``.
        bias: whether the member affine has a bias (default True).
        plain_type, plain_options: the class ``to_plain`` rebuilds, called as
            ``plain_type(C, eps=eps, **plain_options)``; ``from_plain`` records the converted
            module's (with ``data_format`` where it has one).

    Shape:
        Input: (M·B, C, *), member-major. Output: same shape.
    """

    def __init__(
        self,
        num_channels: int,
        num_members: int,
        eps: float = 1e-6,
        bias: bool = True,
        *,
        plain_type: type[nn.Module] | None = None,
        plain_options: dict[str, Any] | None = None,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            num_channels,
            num_members,
            eps,
            bias,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
        self.num_channels = num_channels
        self.plain_type = plain_type
        self.plain_options = dict(plain_options or {})

    def _check_input(self, x: Tensor) -> None:
        if x.dim() < 3 or x.shape[1] != self.num_channels:
            raise ValueError(
                f"{type(self).__name__} normalizes over {self.num_channels} channels at dim 1 of "
                f"(M·B, C, *), got input of shape {tuple(x.shape)}"
            )

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """:class:`MemberLayerNorm`'s paths, in its order and on its conditions, on the
        channels-last view (M·B, *, C).

        1. fused (:func:`snens.nn.fused.member_layer_norm` on the view): M > 1, CPU,
           float32/64 with x and scale of one dtype, non-empty, kernels built and
           ``SNENS_FUSED`` ≠ 0, neither traced by ``torch.compile``/``torch.export`` nor
           inside a ``torch.func`` transform (why: :meth:`MemberLayerNorm._normalize`).
        2. vectorized (:meth:`_vectorized` on the view): M > 1, non-empty, on any device other
           than the CPU. Unmeasured on a GPU so far: ``scripts/gpu_check.sh`` compares it with
           the reference loop.
        3. reference (:meth:`_reference`): everything else.

        :func:`snens.nn.norms.force_path` sends every input with M > 1 that is non-empty down
        path 2 or 3, on any device.
        """
        view = x.movedim(1, -1)  # (M·B, C, *) -> (M·B, *, C)
        if self.num_members > 1 and x.numel() > 0:
            path = path_override(x)
            if path == "vectorized":
                return self._vectorized(view, scale, shift).movedim(-1, 1)
            if path is None and fused.applies(view, scale):
                y = fused.member_layer_norm(
                    view, scale, shift, self.normalized_shape, self.eps, self.num_members
                )
                return y.movedim(-1, 1)
        return self._reference(x, scale, shift)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """:meth:`MemberLayerNorm._reference` (``F.layer_norm`` over C of each member's rows)
        on the channels-last view, moved back."""
        # (M·B, C, *) -> (M·B, *, C) -> normalized over C -> (M·B, C, *)
        return super()._reference(x.movedim(1, -1), scale, shift).movedim(-1, 1)

    @classmethod
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberLayerNorm2d:
        """A member norm whose every member reproduces ``plain``, an ``nn.LayerNorm`` subclass
        that normalizes over dim 1 (see :func:`layer_norm_layout`).

        Raises:
            TypeError: if ``plain`` does not compute a channels-first layer norm.
        """
        if layer_norm_layout(plain) != "channels_first":
            raise TypeError(
                f"{cls.__name__}.from_plain expects an nn.LayerNorm subclass normalizing over "
                f"dim 1 (timm's LayerNorm2d, ConvNextLayerNorm(data_format='channels_first')); "
                f"{type(plain).__name__} does not compute one on a probe input"
            )
        return from_plain_as(cls, plain, num_members, generator=generator, **kw)

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if hasattr(plain, "data_format"):
            options["data_format"] = plain.data_format
        has_bias = plain.bias is not None or plain.weight is None
        if not has_bias:
            options["bias"] = False
        return {
            "num_channels": plain.normalized_shape[0],
            "eps": plain.eps,
            "bias": has_bias,
            "plain_type": type(plain),
            "plain_options": options,
        }

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = self._rebuild_plain(self.num_channels)
        scale, shift = self.scale_and_shift()
        with torch.no_grad():
            plain.weight.copy_(scale[member])
            if shift is not None:
                plain.bias.copy_(shift[member])
        return plain.train(self.training)

    def extra_repr(self) -> str:
        plain = "" if self.plain_type is None else f", plain_type={self.plain_type.__name__}"
        return f"{self.num_channels}, num_members={self.num_members}, eps={self.eps}{plain}"


# -- Hugging Face RMS norms ------------------------------------------------------------------
class _MemberHFRMSNorm(_RebuildsPlain, MemberNorm):
    """Shared body of the member versions of Hugging Face's RMS norms.

    Member m computes ``formula(x_m, scale_m, eps)`` with its folded scale
    sigmoid(gamma_m)·weight_m (:meth:`_reference`); ``_normalize`` computes all members at
    once, the (M·B, …, C) input viewed as (M, B, …, C) and the scales as (M, 1, …, C), which is
    each member's formula elementwise.
    """

    has_bias = False
    formula: RMSFormula
    plain_type = None

    def __init__(
        self,
        hidden_size: int,
        num_members: int,
        eps: float = 1e-6,
        *,
        plain_type: type[nn.Module] | None = None,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"hidden_size must be an int >= 1, got {hidden_size!r}")
        super().__init__(
            (hidden_size,),
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
        self.hidden_size = hidden_size
        self.eps = eps
        self.plain_type = plain_type
        self.plain_options: dict[str, Any] = {}
        self.reset_parameters()

    # the formula's function; not named _apply, which is nn.Module's (.to() and .float() call
    # it on every submodule)
    @staticmethod
    def _rms_norm(x: Tensor, scale: Tensor, eps: float) -> Tensor:
        raise NotImplementedError

    def _check_input(self, x: Tensor) -> None:
        if x.dim() < 2 or x.shape[-1] != self.hidden_size:
            raise ValueError(
                f"{type(self).__name__} normalizes over a trailing dimension of "
                f"{self.hidden_size}, got input of shape {tuple(x.shape)}"
            )

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """One path for every input: the formula once, over (M, B, …, C) with the member
        scales broadcast as (M, 1, …, C). Its reductions are over C, row by row, so this is
        :meth:`_reference`'s arithmetic elementwise, without the per-member calls and the
        concatenation."""
        M = self.num_members
        rows = x.unflatten(0, (M, -1))  # (M·B, …, C) -> (M, B, …, C)
        scale = scale.view(M, *(1,) * (x.dim() - 1), self.hidden_size)
        return self._rms_norm(rows, scale, self.eps).flatten(0, 1)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """The formula on each member's rows with its folded scale, concatenated."""
        return self._per_member(
            x, scale, None, lambda rows, m, scale_m, _: self._rms_norm(rows, scale_m, self.eps)
        )

    @classmethod
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberNorm:
        """A member norm whose every member reproduces ``plain``, a module computing this
        class's formula (see :func:`rms_formula`).

        Raises:
            TypeError: if ``plain`` is not recognised as computing it.
        """
        if rms_formula(plain) != cls.formula:
            raise TypeError(
                f"{cls.__name__}.from_plain expects a module whose forward is the Hugging Face "
                f"{cls.formula} RMS norm formula; {type(plain).__name__} is not one"
            )
        return from_plain_as(cls, plain, num_members, generator=generator, **kw)

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        return {
            "hidden_size": plain.weight.shape[0],
            "eps": getattr(plain, _EPS_ATTRIBUTE[cls.formula]),
            "plain_type": type(plain),
        }

    def _plain_weight(self, scale: Tensor) -> Tensor:
        """The plain module's weight that computes ``scale`` (one member's folded scale)."""
        return scale

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = self._rebuild_plain(self.hidden_size)
        with torch.no_grad():
            plain.weight.copy_(self._plain_weight(self.scale_and_shift()[0][member]))
        return plain.train(self.training)

    def extra_repr(self) -> str:
        plain = "" if self.plain_type is None else f", plain_type={self.plain_type.__name__}"
        return f"{self.hidden_size}, num_members={self.num_members}, eps={self.eps}{plain}"


class MemberLlamaRMSNorm(_MemberHFRMSNorm):
    """σNorm over the Llama RMS norm (``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, …).

    Member m computes :func:`llama_rms_norm` with its folded scale:
    sigmoid(gamma_m)·weight_m ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype).

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "llama"
    _rms_norm = staticmethod(llama_rms_norm)


class MemberT5RMSNorm(_MemberHFRMSNorm):
    """σNorm over the T5 RMS norm (``T5LayerNorm``, ``MT5LayerNorm``, ``LongT5LayerNorm``, …).

    Member m computes :func:`t5_rms_norm` with its folded scale: no mean subtraction, the
    variance in float32, the normalized input cast to the parameters' dtype if that is half.

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "t5"
    _rms_norm = staticmethod(t5_rms_norm)


class MemberGemmaRMSNorm(_MemberHFRMSNorm):
    """σNorm over the Gemma RMS norm (``GemmaRMSNorm``, ``Gemma2RMSNorm``, …).

    The plain module multiplies by 1 + weight in float32; a member's weight is that whole
    factor, so member m computes :func:`gemma_rms_norm` with factor sigmoid(gamma_m)·weight_m.
    A plain weight w (from a module or a state_dict) is loaded as the factor 1 + w, and
    ``to_plain`` gives back w = factor − 1.

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``eps``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "gemma"
    _rms_norm = staticmethod(gemma_rms_norm)

    @torch.no_grad()
    def load_plain_affine(self, weight: Tensor | None, bias: Tensor | None) -> None:
        factor = None if weight is None else 1 + weight.detach().double()
        super().load_plain_affine(factor, None)

    def _plain_weight(self, scale: Tensor) -> Tensor:
        return scale.float() - 1


#: Formula -> member version.
RMS_MEMBER_NORMS: dict[RMSFormula, type[_MemberHFRMSNorm]] = {
    "llama": MemberLlamaRMSNorm,
    "gemma": MemberGemmaRMSNorm,
    "t5": MemberT5RMSNorm,
}
