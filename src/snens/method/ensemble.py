"""The ensemble contract: (B, …) in, logits (M, B, K) out.

This is the one place members are folded into the batch and unfolded again. Inside the
backbone, activations are member-major (M·B, …): rows [m·B, (m+1)·B) belong to member m.
:func:`fold_members` goes from (B, …) to (M·B, …), :func:`unfold_members` from (M·B, …) to
(M, B, …), and :func:`forward_repeated` runs any model between the two; every wrapper in
:mod:`snens.baselines` that repeats its input uses them.

Where members enter:

* ``repeat`` (training default, and always in evaluation): every member sees the whole batch.
  Every tensor argument whose leading size is B is repeated to (M·B, …) at the input, so the
  model may use its inputs anywhere (a pre-norm transformer's residual stream, a Hugging Face
  ``attention_mask``). The layers before the first member layer then compute the same rows M
  times: repeating at the first member layer instead measured 1.00–1.02× the step time on the
  CIFAR ResNet-18, whose stem is 0.3% of its multiply-adds, so there is one path.
* ``split`` (training only): member m sees its own contiguous slice of the batch, rows
  [m·B/M, (m+1)·B/M); the output is (M, B/M, K), so training costs what one model costs.

An ensemble is built by :func:`snens.method.convert.convert`, trained on
:mod:`snens.method.loss`, and exported by :mod:`snens.method.export`.
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
    """Repeat a batch once per member, member-major: rows [m·B, (m+1)·B) of the result are x.

        fold_members(x, M)[m·B + b] = x[b]

    Always a new tensor (also at M = 1), as ``Tensor.repeat`` is.

    Args:
        x: a batch with at least one dimension.
        num_members: M.

    Returns:
        A new tensor of ``x``'s dtype and device, ``x`` repeated M times along dimension 0.

    Shape:
        x: (B, …). Output: (M·B, …).

    Raises:
        TypeError, ValueError: if ``num_members`` is not an int in
            [1, :data:`~snens.nn.norms.MAX_MEMBERS`].
    """
    check_num_members(num_members)
    # repeat, not expand + reshape: one copy either way (measured 33 vs 16 µs for an
    # (8, 3, 32, 32) batch, 161 vs 358 µs at B=128). Folding an activation inside the model
    # the reshaped way fails torch.export with a dynamic batch (strides such as Min(512, 512·B)
    # guard B); folding the ensemble's inputs exports either way
    return x.repeat(num_members, *(1,) * (x.dim() - 1))  # (M·B, …)


def unfold_members(x: Tensor, num_members: int, *, batch_size: int | None = None) -> Tensor:
    """Split member-major rows into a member dimension: the inverse of :func:`fold_members`.

        unfold_members(x, M)[m, b] = x[m·B + b]

    Args:
        x: member-major rows, member m's at [m·B, (m+1)·B).
        num_members: M.
        batch_size: B, when the caller knows it: the row count must then be exactly M·B (a
            model whose output skipped the members, with B a multiple of M, is caught here).

    Returns:
        ``x`` reshaped to one block of rows per member: a view of ``x`` where its strides
        allow one (a copy under ``torch.export``).

    Shape:
        x: (M·B, …). Output: (M, B, …).

    Raises:
        RuntimeError: if ``x`` has no rows dimension, or its leading size is not M·B (not a
            multiple of M, when ``batch_size`` is not given); the message names the shapes.
        TypeError, ValueError: if ``num_members`` is not an int in
            [1, :data:`~snens.nn.norms.MAX_MEMBERS`].
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
    """B of an ensemble's inputs: the leading size of the first tensor with a dimension (the
    rule the ensemble, its export and the deep ensemble share)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() > 0:
            return value.shape[0]
    raise TypeError("the ensemble's input holds no tensor with a batch dimension")


def is_per_example(value: Any, batch_size: int) -> bool:
    """Whether an input argument is per example (a tensor of leading size ``batch_size``),
    so that it is split or folded with the batch."""
    return isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch_size


def _fold_inputs(args: tuple, kwargs: dict, num_members: int, batch_size: int) -> tuple:
    """Every per-example tensor (leading size B) folded to (M·B, …); other arguments as given,
    and at M = 1 nothing is copied."""
    if num_members == 1:
        return args, kwargs

    def fold(value: Any) -> Any:
        return fold_members(value, num_members) if is_per_example(value, batch_size) else value

    return tuple(fold(a) for a in args), {k: fold(v) for k, v in kwargs.items()}


def _unfold_logits(logits: Tensor, num_members: int, batch_size: int) -> Tensor:
    """A model's (M·B, K) logits as (M, B, K); a model that returns no class dimension fails."""
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
    """Run ``model`` once on its inputs folded M times, and unfold the logits per member.

    Every tensor argument whose leading dimension is B (the first such tensor's) is folded
    to (M·B, …) with :func:`fold_members`; others pass as they are. This is what
    :class:`Ensemble` does with ``input_policy="repeat"``, for wrappers whose members differ
    inside the model (:class:`~snens.baselines.BatchEnsemble`,
    :class:`~snens.baselines.MCDropout`).

    Args:
        model: a model taking member-major (M·B, …) inputs.
        num_members: M.
        args, kwargs: the inputs, as ``model(*args, **kwargs)`` would take them unfolded.
        output: callable picking the logits from the model's output; by default a tensor, a
            Hugging Face output's ``.logits``, or the first element of a tuple.

    Returns:
        The logits of every member, as a tensor.

    Shape:
        Inputs: (B, …). Output: (M, B, K).

    Raises:
        TypeError: if the inputs hold no tensor with a batch dimension, or no logits are found
            in the model's output; or ``num_members`` is not an int.
        ValueError: if ``num_members`` is outside [1, :data:`~snens.nn.norms.MAX_MEMBERS`].
        RuntimeError: if the logits are not (M·B, K).
    """
    B = input_batch_size(args, kwargs)
    args, kwargs = _fold_inputs(args, kwargs, num_members, B)
    with model_rows(num_members * B):
        logits = (output or _default_output)(model(*args, **kwargs))  # (M·B, K)
    return _unfold_logits(logits, num_members, B)  # (M, B, K)


class Ensemble(nn.Module):
    """A σN-Ens ensemble: a model holding member layers, run so that it returns (M, B, K).

    Build one with :func:`snens.convert`, or wrap a model constructed with
    ``snens.nn.member_norm(M)`` as its ``norm_layer``.

    Args:
        model: a model whose norms (and usually head) are member layers with ``num_members``.
        num_members: M.
        input_policy: ``"repeat"`` or ``"split"`` (training only; evaluation always repeats).
        output: callable picking the logits from the model's output; by default a tensor, a
            Hugging Face output's ``.logits``, or the first element of a tuple.
        report: the :class:`~snens.nn.surgery.ConversionReport`, when built by ``convert``.
        config: the :class:`~snens.method.config.SnensConfig` it was built with (τ, λ, γ's
            learning-rate multiplier, …), read back as ``ensemble.snens_config``; by default one of
            M members and the input policy, the other fields at their defaults. Its M and
            input policy must be those given.

    Shape:
        Input: (B, …) (any positional and keyword arguments; every tensor whose leading
        dimension is B is a per-example input, repeated to (M·B, …) at the input). Output:
        (M, B, K) logits, or (M, B/M, K) when training with ``input_policy="split"``.
        ``inspect.signature(ensemble.forward)`` names the model's inputs (keyword-only,
        between ``*args`` and ``**kwargs``), as tools that choose a module's inputs by name
        read it. ``labels=`` is refused: an ensemble computes no loss (see
        :func:`snens.ensemble_loss`).

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
        # torch's transformer modules around the member layers, for every way an ensemble is
        # built (convert, FiLM, member layers at construction); the report names what changed
        adapted = adapt(model)
        self.model = model
        self.input_policy = input_policy
        self._config = config
        self.output = output
        self.report = (
            report if report is None else dataclasses.replace(report, notes=report.notes + adapted)
        )
        self.forward = _forward_naming_inputs(self)

    def __getstate__(self) -> dict[str, Any]:
        # the instance's forward (see _forward_naming_inputs) is rebuilt, not pickled
        state = super().__getstate__()
        state.pop("forward", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.forward = _forward_naming_inputs(self)

    # -- configuration ---------------------------------------------------------------------------
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
        """The :class:`~snens.method.config.SnensConfig` of this ensemble: what it was built with,
        its input policy as it is now; what the saves write beside the weights. (Not
        ``config``: Hugging Face's Trainer reads and sets ``model.config`` as the model's own.)"""
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

    # -- forward ---------------------------------------------------------------------------------
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
            if B % M:
                raise ValueError(
                    f"input_policy='split' needs a batch size divisible by num_members={M}, "
                    f"got B={B}; use a batch size that is a multiple of {M} (e.g. "
                    f"{B - B % M or M}) or drop_last=True in the data loader"
                )
            with model_rows(B):
                logits = (self.output or _default_output)(self.model(*args, **kwargs))  # (B, K)
            return _unfold_logits(logits, M, B // M)  # (M, B/M, K)
        return forward_repeated(self.model, M, args, kwargs, output=self.output)  # (M, B, K)

    def _check_inputs(self, args: tuple, kwargs: dict) -> None:
        """A floating input on another device, or of a dtype none of the model's parameters
        has, fails here, named, instead of inside the first layer. (Integer inputs — token ids,
        CPU lengths for packed sequences — are the model's business.)"""
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
    """``ensemble.forward`` bound under the signature ``(*args, <the model's named inputs,
    keyword-only>, **kwargs)``.

    Tools read a module's inputs from ``inspect.signature(module.forward)``: Hugging Face's
    ``Trainer`` keeps only the batch columns named there, and ``(*args, **kwargs)`` named none,
    so every column was dropped before the ensemble was called. The calls it accepts are those
    of ``(*args, **kwargs)``; positional inputs still bind to ``args`` (``torch.export``'s
    ``dynamic_shapes={"args": …}``), keyword inputs by their names.
    """
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
    """Refuse what is not ensemble logits: a floating tensor (M, B, K, …) with a member, and
    (unless ``allow_empty``) at least one example and one class."""
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
    """The ensemble's prediction: the mean of member softmaxes, p = (1/M) Σ_m softmax(z_m).

    Computed in float32 whatever the logits' dtype.

    Args:
        logits: member logits.

    Returns:
        A float32 tensor of class probabilities; each row sums to 1.

    Shape:
        logits: (M, B, K). Output: (B, K).

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
    """Member ``member`` as a plain model of the input model's class.

    Norms become ordinary norms holding that member's statistics, with sigmoid(gamma) folded
    into their affine; the member head becomes an ordinary ``nn.Linear``. The result's output
    equals ``ensemble(x)[member]``.

    Args:
        ensemble: an :class:`Ensemble`; it is not modified.
        member: the member's index, 0 <= member < M.

    Returns:
        A new ``nn.Module``: a deep copy of ``ensemble.model`` whose member layers are plain.

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


# Their home until the module was split; snens.baselines.factory imports convert from here.
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
