"""The ensemble contract: (B, …) in, logits (M, B, K) out.

Inside the backbone, activations are member-major (M·B, …): rows [m·B, (m+1)·B) belong to
member m. Input policies:

* ``repeat`` (training default, always in evaluation): every tensor argument whose leading
  size is B is repeated to (M·B, …), so every member sees the whole batch.
* ``split`` (training only): member m sees rows [m·B/M, (m+1)·B/M); the output is (M, B/M, K).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import types
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from snens.method.config import SnensConfig
from snens.nn.layout import model_rows
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm, check_member, check_num_members
from snens.nn.surgery import ConversionReport, member_modules, replace_modules
from snens.nn.torch_transformers import adapt, restore_fast_paths

__all__ = [
    "Ensemble",
    "extract_member",
    "fold_members",
    "forward_repeated",
    "predictive_probs",
    "unfold_members",
]

InputPolicy = Literal["repeat", "split"]


def fold_members(x: Tensor, num_members: int) -> Tensor:
    """Repeat a batch once per member, member-major: ``fold_members(x, M)[m·B + b] = x[b]``.

    Returns:
        A new (M·B, …) tensor (also at M = 1).

    Raises:
        TypeError, ValueError: if ``num_members`` is not an int in [1, MAX_MEMBERS].
    """
    check_num_members(num_members)
    # repeat, not expand + reshape: the reshaped way fails torch.export with a dynamic batch
    return x.repeat(num_members, *(1,) * (x.dim() - 1))  # (M·B, …)


def unfold_members(x: Tensor, num_members: int, *, batch_size: int | None = None) -> Tensor:
    """(M·B, …) member-major rows as (M, B, …), the inverse of :func:`fold_members`; a known
    ``batch_size`` makes the row count required to be exactly M·B.

    Returns:
        ``x`` reshaped, a view where its strides allow one (a copy under ``torch.export``).

    Raises:
        RuntimeError: if ``x``'s leading size is not M·B (or not a multiple of M).
        TypeError, ValueError: if ``num_members`` is not an int in [1, MAX_MEMBERS].
    """
    M = check_num_members(num_members)
    rows = x.shape[0] if x.dim() else None
    if batch_size is None and rows is not None and rows % M == 0:
        batch_size = rows // M
    if rows is None or batch_size is None or rows != M * batch_size:
        expected = (
            f"a multiple of M={M} member-major rows"
            if batch_size is None
            else f"{M * batch_size} member-major rows (M={M} × B={batch_size})"
        )
        raise RuntimeError(
            f"cannot unfold a tensor of shape {tuple(x.shape)} into (M, B, …): expected "
            f"{expected}; does every path to the model's output pass through a member layer?"
        )
    if torch.compiler.is_exporting():
        # a head's (M·B, K) view of its (M, B, K) product has the stride Min(K, K·B) under
        # torch.export, and viewing it as (M, B, K) would guard B; a copy has plain strides
        x = x.clone(memory_format=torch.contiguous_format)
    return x.reshape(M, batch_size, *x.shape[1:])  # (M, B, …)


def _default_output(out: Any) -> Tensor:
    if isinstance(out, Tensor):
        return out
    logits = getattr(out, "logits", None)  # Hugging Face ModelOutput
    if isinstance(logits, Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    raise TypeError(
        f"cannot find logits in the model's output of type {type(out).__name__}; pass "
        "output=callable to snens.convert / snens.Ensemble to pick them"
    )


def input_batch_size(args: tuple, kwargs: dict) -> int:
    """B of an ensemble's inputs: the leading size of the first tensor with a dimension."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() > 0:
            return value.shape[0]
    raise TypeError("the ensemble's input holds no tensor with a batch dimension")


def is_per_example(value: Any, batch_size: int) -> bool:
    """Whether an input argument is a tensor of leading size ``batch_size``."""
    return isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch_size


def split_size(batch_size: int, num_members: int) -> int:
    """B/M, the rows of each member under ``input_policy="split"``; refuses a B not divisible."""
    B, M = batch_size, num_members
    if B % M:
        raise ValueError(
            f"input_policy='split' needs a batch size divisible by num_members={M}, "
            f"got B={B}; use a batch size that is a multiple of {M} (e.g. "
            f"{B - B % M or M}) or drop_last=True in the data loader"
        )
    return B // M


def _fold_inputs(args: tuple, kwargs: dict, num_members: int, batch_size: int) -> tuple:
    """Every per-example tensor folded to (M·B, …); at M = 1 nothing is copied."""
    if num_members == 1:
        return args, kwargs

    def fold(value: Any) -> Any:
        return fold_members(value, num_members) if is_per_example(value, batch_size) else value

    return tuple(fold(a) for a in args), {k: fold(v) for k, v in kwargs.items()}


def _unfold_logits(logits: Tensor, num_members: int, batch_size: int) -> Tensor:
    if logits.dim() < 2:
        raise RuntimeError(
            f"the model returned logits of shape {tuple(logits.shape)}, expected "
            f"({num_members * batch_size}, K): member-major rows (M={num_members} × "
            f"B={batch_size}) of K class scores"
        )
    return unfold_members(logits, num_members, batch_size=batch_size)  # (M, B, K)


def forward_repeated(
    model: nn.Module,
    num_members: int,
    args: tuple,
    kwargs: dict,
    *,
    output: Callable[[Any], Tensor] | None = None,
) -> Tensor:
    """Run ``model`` once on every tensor argument of leading size B folded to (M·B, …)
    (``input_policy="repeat"``); ``output`` picks the logits from the model's output (default: a
    tensor, ``.logits``, or the first element of a tuple).

    Returns:
        The (M, B, K) logits of every member.

    Raises:
        TypeError: if the inputs hold no batch tensor, no logits are found, or ``num_members``
            is not an int.
        ValueError: if ``num_members`` is outside [1, MAX_MEMBERS].
        RuntimeError: if the logits are not (M·B, K).
    """
    B = input_batch_size(args, kwargs)
    args, kwargs = _fold_inputs(args, kwargs, num_members, B)
    with model_rows(num_members * B):
        logits = (output or _default_output)(model(*args, **kwargs))  # (M·B, K)
    return _unfold_logits(logits, num_members, B)  # (M, B, K)


class Ensemble(nn.Module):
    """A σN-Ens ensemble: a model holding member layers, run so that it returns (M, B, K).

    Args:
        model: a model whose norms (and usually head) are member layers with ``num_members``.
        input_policy: ``"repeat"`` or ``"split"`` (training only; evaluation always repeats).
        output: picks the logits from the model's output (as :func:`forward_repeated`'s).
        report: the :class:`~snens.nn.surgery.ConversionReport`, when built by ``convert``.
        config: the :class:`~snens.method.config.SnensConfig` it was built with (default: one
            of M and the input policy), of the M and input policy given.

    Shape:
        Input: (B, …). Output: (M, B, K), or (M, B/M, K) training with ``"split"``.
        ``inspect.signature(ensemble.forward)`` names the model's inputs, keyword-only.

    Raises:
        ValueError: if ``model`` holds no member norm, or a member layer has another M.
    """

    def __init__(
        self,
        model: nn.Module,
        num_members: int,
        *,
        input_policy: InputPolicy = "repeat",
        output: Callable[[Any], Tensor] | None = None,
        report: ConversionReport | None = None,
        config: SnensConfig | None = None,
    ) -> None:
        super().__init__()
        self.num_members = check_num_members(num_members)
        if config is None:
            config = SnensConfig(num_members=num_members, input_policy=input_policy)
        elif (config.num_members, config.input_policy) != (num_members, input_policy):
            raise ValueError(
                f"config has num_members={config.num_members}, input_policy="
                f"{config.input_policy!r}; the ensemble num_members={num_members}, input_policy="
                f"{input_policy!r}: give the same values"
            )
        members = member_modules(model)
        if not any(isinstance(m, MemberNorm) for _, m in members):
            raise ValueError(
                f"{type(model).__name__} holds no member norm; use snens.convert(model, "
                f"num_members={num_members}) to build an ensemble from a plain model"
            )
        for name, m in members:
            if m.num_members != num_members:
                raise ValueError(
                    f"{name} has num_members={m.num_members}, the ensemble num_members="
                    f"{num_members}; build every member layer with the same M"
                )
        adapted = adapt(model)
        self.model = model
        # the ensemble's own mode is its model's (nn.Module starts in training mode), so an
        # ensemble of a model in eval mode evaluates: `split` applies only in training
        self.training = model.training
        self.input_policy = input_policy
        self._config = config
        self.output = output
        self.report = (
            report if report is None else dataclasses.replace(report, notes=report.notes + adapted)
        )
        self.forward = _forward_naming_inputs(self)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("forward", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.forward = _forward_naming_inputs(self)

    @property
    def input_policy(self) -> InputPolicy:
        return self._input_policy

    @input_policy.setter
    def input_policy(self, value: InputPolicy) -> None:
        if value not in ("repeat", "split"):
            raise ValueError(f"input_policy must be 'repeat' or 'split', got {value!r}")
        self._input_policy = value

    @property
    def snens_config(self) -> SnensConfig:
        """The :class:`~snens.method.config.SnensConfig` it was built with, with its input policy
        now (Hugging Face's Trainer owns ``model.config``)."""
        config = self.__dict__.get("_config") or SnensConfig(num_members=self.num_members)
        return dataclasses.replace(config, input_policy=self.input_policy)

    @snens_config.setter
    def snens_config(self, value: SnensConfig) -> None:
        if not isinstance(value, SnensConfig):
            raise TypeError(
                f"ensemble.snens_config takes a SnensConfig, got {type(value).__name__}"
            )
        if value.num_members != self.num_members:
            raise ValueError(
                f"config.num_members={value.num_members}, the ensemble has {self.num_members} "
                "members; convert the model again for another M"
            )
        self.input_policy = value.input_policy
        self.__dict__["_config"] = value

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        if "labels" in kwargs:
            raise TypeError(
                "the ensemble got labels=: it returns its members' logits (M, B, K) and computes "
                "no loss (its model would score the labels once per member and the loss be "
                "dropped). Leave the labels out of its inputs and train on "
                "snens.ensemble_loss(logits, labels) + snens.diversity_loss(ensemble, τ, λ); "
                "with the Hugging Face Trainer, use snens.integrations.huggingface.SnensTrainer, "
                "which does so"
            )
        B = input_batch_size(args, kwargs)
        M = self.num_members
        self._check_inputs(args, kwargs)
        if self.training and self.input_policy == "split":
            b = split_size(B, M)
            with model_rows(B):
                logits = (self.output or _default_output)(self.model(*args, **kwargs))  # (B, K)
            return _unfold_logits(logits, M, b)  # (M, B/M, K)
        return forward_repeated(self.model, M, args, kwargs, output=self.output)  # (M, B, K)

    def _check_inputs(self, args: tuple, kwargs: dict) -> None:
        """Refuse a floating input on another device, or of a dtype no parameter has."""
        param = next(self.model.parameters(), None)
        if param is None:
            return
        named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        for name, value in named:
            if not isinstance(value, Tensor) or not value.is_floating_point():
                continue
            if value.device != param.device:
                raise ValueError(
                    f"the ensemble's {name} is on {value.device}, its parameters on "
                    f"{param.device}; move one to the other (input.to('{param.device}') or "
                    f"model.to('{value.device}'))"
                )
            if (
                param.is_floating_point()
                and value.dtype != param.dtype
                and not torch.is_autocast_enabled(value.device.type)
                and all(p.dtype != value.dtype for p in self.model.parameters())
            ):
                raise TypeError(
                    f"the ensemble's {name} is {value.dtype}, its parameters {param.dtype}; "
                    f"cast the input (input.to({param.dtype})) or the model "
                    f"(model.to({value.dtype})), or run it under torch.autocast"
                )

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, input_policy={self.input_policy!r}"


def _forward_naming_inputs(ensemble: Ensemble) -> Callable[..., Tensor]:
    """``ensemble.forward`` under the signature ``(*args, <the model's inputs>, **kwargs)``:
    Hugging Face's ``Trainer`` keeps only the batch columns the signature names."""
    P = inspect.Parameter
    try:
        named = inspect.signature(ensemble.model.forward).parameters.values()
    except (TypeError, ValueError):  # a forward without a signature: nothing to name
        named = []
    keywords = [
        P(p.name, P.KEYWORD_ONLY, default=None if p.default is P.empty else p.default)
        for p in named
        if p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD) and p.name not in ("args", "kwargs")
    ]
    cls_forward = type(ensemble).forward
    function = types.FunctionType(
        cls_forward.__code__,
        cls_forward.__globals__,
        cls_forward.__name__,
        cls_forward.__defaults__,
        cls_forward.__closure__,
    )
    function.__qualname__ = cls_forward.__qualname__
    function.__doc__ = cls_forward.__doc__
    function.__signature__ = inspect.Signature(
        [P("self", P.POSITIONAL_ONLY), P("args", P.VAR_POSITIONAL), *keywords]
        + [P("kwargs", P.VAR_KEYWORD)]
    )
    return types.MethodType(function, ensemble)


def check_logits(logits: Tensor, *, allow_empty: bool = False) -> None:
    """Refuse what is not floating ensemble logits (M, B, K, …) with a member and (unless
    ``allow_empty``) an example and a class."""
    if not isinstance(logits, Tensor) or logits.dim() < 3:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"expected ensemble logits of shape (M, B, K), got {shape}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if logits.shape[0] == 0 or (logits.numel() == 0 and not allow_empty):
        raise ValueError(
            f"empty ensemble logits of shape {tuple(logits.shape)}: need at least one member, "
            "one example and one class"
        )


def predictive_probs(logits: Tensor) -> Tensor:
    """The ensemble's prediction: the mean of member softmaxes of (M, B, K) logits.

    Returns:
        (B, K) float32 class probabilities.

    Raises:
        ValueError: if ``logits`` has fewer than 3 dimensions or no members (M = 0).
        TypeError: if ``logits`` is not floating point.

    Example:
        >>> logits = torch.tensor([[[2.0, 0.0]], [[0.0, 2.0]]])  # (M=2, B=1, K=2)
        >>> snens.predictive_probs(logits)  # two confident members that disagree
        tensor([[0.5000, 0.5000]])
    """
    check_logits(logits, allow_empty=True)
    return logits.float().softmax(dim=-1).mean(dim=0)


def extract_member(ensemble: Ensemble, member: int) -> nn.Module:
    """Member ``member`` as a plain model of the input model's class: ``ensemble(x)[member]``.

    Returns:
        A deep copy of ``ensemble.model`` whose member layers are plain.

    Raises:
        TypeError: if ``ensemble`` is not an :class:`Ensemble` or ``member`` not an int.
        ValueError: if ``member`` is out of range.
    """
    if not isinstance(ensemble, Ensemble):
        raise TypeError(f"extract_member expects a snens.Ensemble, got {type(ensemble).__name__}")
    check_member(member, ensemble.num_members)
    plain = copy.deepcopy(ensemble.model)
    replace_modules(
        plain,
        lambda _, m: m.to_plain(member) if isinstance(m, (MemberNorm, MemberLinear)) else None,
    )
    restore_fast_paths(plain)
    return plain


# Their home until the module was split: old imports keep working.
_MOVED = {
    "convert": "snens.method.convert",
    "ensemble_loss": "snens.method.loss",
    "export": "snens.method.export",
    "export_onnx": "snens.method.export",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
