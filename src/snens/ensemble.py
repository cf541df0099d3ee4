"""The ensemble contract: (B, …) in, logits (M, B, K) out.

This is the one place members are folded into the batch and unfolded again. Inside the
backbone, activations are member-major (M·B, …): rows [m·B, (m+1)·B) belong to member m.

Where members enter:

* ``repeat`` (training default, and always in evaluation): every member sees the whole batch.
  With *lazy replication* the rows are repeated at the first member layer a tensor reaches,
  so a stem that every member would compute identically runs once on (B, …). With *eager
  replication* every tensor argument is repeated at the input, which is right when the
  model uses inputs beyond the first member layer (a pre-norm transformer's residual stream,
  a Hugging Face ``attention_mask``). ``replication="auto"`` tries lazy once, in eval mode and
  without gradients, and keeps it only if it matches eager on that batch.
* ``split`` (training only): member m sees its own contiguous slice of the batch, rows
  [m·B/M, (m+1)·B/M); the output is (M, B/M, K), so training costs what one model costs.

:func:`export` gives the whole ensemble, in eval mode, as a ``torch.export`` program whose
batch size is dynamic (and, through ``torch.onnx.export``, an ONNX model): nothing on the path
branches on the value of B, and the member norms trace their loop of plain norms.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm, check_member, check_num_members
from snens.nn.surgery import ConversionReport, convert_modules, member_modules, replace_modules

__all__ = [
    "Ensemble",
    "convert",
    "ensemble_loss",
    "export",
    "extract_member",
    "predictive_probs",
]

InputPolicy = Literal["repeat", "split"]
Replication = Literal["auto", "lazy", "eager"]


def _repeat_rows(x: Tensor, num_members: int) -> Tensor:
    # (B, …) -> (M·B, …), member-major: [x, x, …, x]. repeat, not expand + reshape: one copy
    # either way (measured 33 vs 16 µs for an (8, 3, 32, 32) batch, 161 vs 358 µs at B=128),
    # but under torch.export the reshaped copy gets strides such as Min(512, 512·B) whose
    # contiguity checks downstream guard B, and a dynamic batch fails to export
    return x.repeat(num_members, *(1,) * (x.dim() - 1))


class _LazyReplicator:
    """Forward pre-hook shared by every member layer: repeats a (B, …) input to (M·B, …).

    Active only while ``batch_size`` is set by :class:`Ensemble` (lazy mode). A member layer
    that receives exactly B rows is the first one its tensor reaches; everything upstream of
    it ran once. A callable object rather than a closure, so ``copy.deepcopy`` of an
    ensemble gives the copy its own replicator.
    """

    def __init__(self, num_members: int) -> None:
        self.num_members = num_members
        self.batch_size: int | None = None

    def __call__(self, module: nn.Module, args: tuple) -> tuple | None:
        if self.batch_size is None or not args or not isinstance(args[0], Tensor):
            return None
        x = args[0]
        if x.dim() > 0 and x.shape[0] == self.batch_size:
            return (_repeat_rows(x, self.num_members), *args[1:])
        return None


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


def _on_meta(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(v, Tensor) and v.is_meta for v in (*args, *kwargs.values()))


def _batch_size(args: tuple, kwargs: dict) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() > 0:
            return value.shape[0]
    raise TypeError("the ensemble's input holds no tensor with a batch dimension")


class Ensemble(nn.Module):
    """A σN-Ens ensemble: a model holding member layers, run so that it returns (M, B, K).

    Build one with :func:`snens.convert`, or wrap a model constructed with
    ``snens.nn.member_norm(M)`` as its ``norm_layer``.

    Args:
        model: a model whose norms (and usually head) are member layers with ``num_members``.
        num_members: M.
        input_policy: ``"repeat"`` or ``"split"`` (training only; evaluation always repeats).
        replication: ``"auto"``, ``"lazy"`` or ``"eager"`` (see the module docstring).
        output: callable picking the logits from the model's output; by default a tensor, a
            Hugging Face output's ``.logits``, or the first element of a tuple.
        report: the :class:`~snens.nn.surgery.ConversionReport`, when built by ``convert``.

    Shape:
        Input: (B, …) (any positional and keyword arguments; every tensor whose leading
        dimension is B is a per-example input). Output: (M, B, K) logits, or (M, B/M, K) when
        training with ``input_policy="split"``.
    """

    def __init__(
        self,
        model: nn.Module,
        num_members: int,
        *,
        input_policy: InputPolicy = "repeat",
        replication: Replication = "auto",
        output: Callable[[Any], Tensor] | None = None,
        report: ConversionReport | None = None,
    ) -> None:
        super().__init__()
        self.num_members = check_num_members(num_members)
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
        if replication not in ("auto", "lazy", "eager"):
            raise ValueError(f"replication must be 'auto', 'lazy' or 'eager', got {replication!r}")
        self.model = model
        self.input_policy = input_policy
        self.replication = replication
        self.output = output
        self.report = report
        self._replicator = _LazyReplicator(num_members)
        self._hooks = [m.register_forward_pre_hook(self._replicator) for _, m in members]

    # -- configuration ---------------------------------------------------------------------------
    @property
    def input_policy(self) -> InputPolicy:
        return self._input_policy

    @input_policy.setter
    def input_policy(self, value: InputPolicy) -> None:
        if value not in ("repeat", "split"):
            raise ValueError(f"input_policy must be 'repeat' or 'split', got {value!r}")
        self._input_policy = value

    # -- forward ---------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        B = _batch_size(args, kwargs)
        M = self.num_members
        self._check_inputs(args, kwargs)
        if self.training and self.input_policy == "split":
            if B % M:
                raise ValueError(
                    f"input_policy='split' needs a batch size divisible by num_members={M}, "
                    f"got B={B}; use a batch size that is a multiple of {M} (e.g. "
                    f"{B - B % M or M}) or drop_last=True in the data loader"
                )
            return self._unfold(self._run(args, kwargs, B, lazy=False, repeat=False), B // M)
        if torch.compiler.is_exporting() or _on_meta(args, kwargs):
            # "auto" compares two runs' outputs, which a traced graph or a meta tensor cannot
            # hold; undecided, such a run takes eager repetition, right for every model
            lazy = self.replication == "lazy"
        else:
            if self.replication == "auto" and B >= 2 and M > 1:
                self.replication = self._choose_replication(args, kwargs, B)
            lazy = self.replication == "lazy"
        return self._unfold(self._run(args, kwargs, B, lazy=lazy, repeat=True), B)

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

    def _run(self, args: tuple, kwargs: dict, B: int, *, lazy: bool, repeat: bool) -> Tensor:
        M = self.num_members
        if repeat and not lazy and M > 1:
            args = tuple(_repeat_rows(a, M) if self._per_example(a, B) else a for a in args)
            kwargs = {
                k: _repeat_rows(v, M) if self._per_example(v, B) else v for k, v in kwargs.items()
            }
        self._replicator.batch_size = B if (repeat and lazy and M > 1) else None
        try:
            out = self.model(*args, **kwargs)
        finally:
            self._replicator.batch_size = None
        return (self.output or _default_output)(out)

    @staticmethod
    def _per_example(value: Any, batch_size: int) -> bool:
        return isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch_size

    def _unfold(self, logits: Tensor, rows_per_member: int) -> Tensor:
        M = self.num_members
        if logits.dim() < 2 or logits.shape[0] != M * rows_per_member:
            raise RuntimeError(
                f"the model returned logits of shape {tuple(logits.shape)}, expected "
                f"{M * rows_per_member} member-major rows (M={M} × {rows_per_member}); "
                "does every path to the output pass through a member layer?"
            )
        if torch.compiler.is_exporting():
            # a head's (M·B, K) view of its (M, B, K) product has the stride Min(K, K·B) under
            # torch.export, and viewing it as (M, B, K) would guard B; a copy has plain strides
            logits = logits.clone(memory_format=torch.contiguous_format)
        return logits.reshape(M, rows_per_member, *logits.shape[1:])  # (M, B, K)

    @torch.no_grad()
    def _choose_replication(self, args: tuple, kwargs: dict, B: int) -> Replication:
        """Lazy if, on this batch in eval mode, it gives what eager repetition gives."""
        was_training = self.training
        self.eval()
        try:
            eager = self._run(args, kwargs, B, lazy=False, repeat=True)
            try:
                lazy = self._run(args, kwargs, B, lazy=True, repeat=True)
            except Exception:
                return "eager"
        finally:
            self.train(was_training)
        if lazy.shape != eager.shape:
            return "eager"
        finite = eager[torch.isfinite(eager)]  # NaN/inf outputs must not poison the tolerance
        scale = float(finite.abs().max()) if finite.numel() else 1.0
        atol = 1e-5 * max(scale, 1e-12)
        close = torch.allclose(lazy, eager, rtol=1e-4, atol=atol, equal_nan=True)
        return "lazy" if close else "eager"

    def extra_repr(self) -> str:
        return (
            f"num_members={self.num_members}, input_policy={self.input_policy!r}, "
            f"replication={self.replication!r}"
        )


def convert(
    model: nn.Module,
    num_members: int,
    *,
    head: str | None = "auto",
    head_init: Literal["copy", "reset"] = "copy",
    skip_unsupported: bool = False,
    gamma_mean: float = 0.0,
    gamma_std: float = 1.0,
    generator: torch.Generator | None = None,
    input_policy: InputPolicy = "repeat",
    replication: Replication = "auto",
    output: Callable[[Any], Tensor] | None = None,
    inplace: bool = False,
) -> Ensemble:
    """Turn any model with norm layers into a σN-Ens ensemble of ``num_members`` members.

    Every supported norm (BatchNorm1d/2d/3d, LayerNorm, GroupNorm, RMSNorm) becomes a member
    norm, ``σ(γ_m) ⊙ norm_m(x)`` with per-member statistics and affine, and the head (the last
    ``nn.Linear``, or ``head=``) is replicated per member. Right after conversion, in eval mode,
    every member computes the original model's function (with ``head_init="copy"``), while γ
    starts asymmetric, ~ N(gamma_mean, gamma_std²), so the diversity regularizer has a gradient.

    Args:
        model: any ``nn.Module``, including Hugging Face models (their ``.logits`` are used).
        num_members: M.
        head, head_init, skip_unsupported, gamma_mean, gamma_std, generator: see
            :func:`snens.nn.surgery.convert_modules`.
        input_policy, replication, output: see :class:`Ensemble`.
        inplace: convert ``model`` itself instead of a deep copy of it.

    Returns:
        An :class:`Ensemble`; its ``report`` says what was converted and the parameters added.

    Raises:
        TypeError: bad ``num_members``; an unsupported norm, named (unless
            ``skip_unsupported``); a head that is not ``nn.Linear``.
        ValueError: ``num_members < 1``; no supported norm in the model.
    """
    check_num_members(num_members)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    try:
        target = model if inplace else copy.deepcopy(model)
    except RuntimeError as error:
        if "deepcopy" not in str(error):
            raise
        raise TypeError(
            f"convert copies the model first, and this {type(model).__name__} cannot be copied "
            f"({str(error).split('.')[0]}): a legacy torch.nn.utils.weight_norm hook or a "
            "non-leaf tensor attribute. Use torch.nn.utils.parametrizations.weight_norm, or "
            "convert the model itself with convert(model, M, inplace=True)"
        ) from error
    report = convert_modules(
        target,
        num_members,
        head=head,
        head_init=head_init,
        skip_unsupported=skip_unsupported,
        gamma_mean=gamma_mean,
        gamma_std=gamma_std,
        generator=generator,
    )
    return Ensemble(
        target,
        num_members,
        input_policy=input_policy,
        replication=replication,
        output=output,
        report=report,
    )


def _check_logits(logits: Tensor, *, allow_empty: bool = False) -> None:
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


def _check_labels(labels: Any, num_classes: int) -> Tensor:
    if not isinstance(labels, Tensor):
        raise TypeError(
            f"labels must be a tensor of class indices, got {type(labels).__name__}; "
            "use torch.as_tensor(labels)"
        )
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise TypeError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if labels.dim() != 1:
        raise ValueError(f"labels must be 1-D class indices (B,), got shape {tuple(labels.shape)}")
    if labels.numel():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            bad = low if low < 0 else high
            raise ValueError(
                f"label {bad} is out of range for {num_classes} classes; labels must lie in "
                f"[0, {num_classes - 1}]"
            )
    return labels.long()


def ensemble_loss(logits: Tensor, labels: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """Mean over members of each member's cross-entropy.

        L = (1/M) Σ_m CE(logits[m], labels_m)

    Labels are broadcast here, never repeated by the caller: with (B,) labels and logits
    (M, B, K) every member is scored on all labels (``repeat``); with logits (M, B/M, K) from
    ``split`` training, member m is scored on its own slice labels[m·B/M:(m+1)·B/M].

    Args:
        logits: member logits.
        labels: class indices.
        label_smoothing: as in ``torch.nn.functional.cross_entropy``.

    Shape:
        logits: (M, B, K) or (M, B/M, K). labels: (B,). Output: scalar.

    Raises:
        ValueError: if the shapes fit neither policy, a label is out of range, the logits are
            empty or not 3-D, or ``label_smoothing`` is outside [0, 1].
        TypeError: for non-floating logits, or labels that are not integer tensors.
    """
    _check_logits(logits)
    if logits.dim() != 3:
        raise ValueError(
            f"ensemble_loss takes logits (M, B, K), got {tuple(logits.shape)}; for per-token "
            "logits (M, B, T, K) fold the tokens into the batch: logits.flatten(1, -2) with "
            "labels (B·T,)"
        )
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float):
        raise TypeError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    return _member_cross_entropy(logits, _check_labels(labels, logits.shape[2]), label_smoothing)


def _member_cross_entropy(logits: Tensor, labels: Tensor, label_smoothing: float) -> Tensor:
    """:func:`ensemble_loss` after its checks; for a training step that checked its labels on
    the host (a range check of labels on a GPU costs a device sync)."""
    M, b, _ = logits.shape
    if labels.shape[0] == b:
        target = labels.unsqueeze(0).expand(M, b)  # repeat: every member, every label
    elif labels.shape[0] == M * b:
        target = labels.reshape(M, b)  # split: member m gets its own slice
    else:
        raise ValueError(
            f"labels of length {labels.shape[0]} fit neither logits {tuple(logits.shape)} "
            f"(repeat: B={b}) nor split training (B={M * b})"
        )
    return F.cross_entropy(
        logits.reshape(M * b, -1).float(),
        target.reshape(-1).long(),
        label_smoothing=label_smoothing,
    )


def predictive_probs(logits: Tensor) -> Tensor:
    """The ensemble's prediction: the mean of member softmaxes, p = (1/M) Σ_m softmax(z_m).

    Computed in float32 whatever the logits' dtype.

    Shape:
        logits: (M, B, K). Output: (B, K).

    Raises:
        ValueError: if ``logits`` has fewer than 3 dimensions or no members (M = 0).
        TypeError: if ``logits`` is not floating point.
    """
    _check_logits(logits, allow_empty=True)
    return logits.float().softmax(dim=-1).mean(dim=0)


def extract_member(ensemble: Ensemble, member: int) -> nn.Module:
    """Member ``member`` as a plain model of the input model's class.

    Norms become ordinary norms holding that member's statistics, with sigmoid(gamma) folded
    into their affine; the member head becomes an ordinary ``nn.Linear``. The result's output
    equals ``ensemble(x)[member]``.

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
    return plain


def export(ensemble: Ensemble, /, *args: Any, **kwargs: Any) -> torch.export.ExportedProgram:
    """The whole ensemble as a ``torch.export`` program that takes any batch size.

    Every tensor argument whose leading dimension is the example's batch size B (the inputs
    :class:`Ensemble` repeats) gets one shared dynamic dimension ``batch``; the rest stay as in
    the example. ``program.module()(…)`` equals ``ensemble(…)`` at every B ≥ 1 and
    ``torch.onnx.export(program, dynamo=True)`` turns the program into an ONNX model. An
    ensemble still on ``replication="auto"`` is run once on the example first (without
    gradients), as its first forward would be, so the program keeps the replication chosen
    there (lazy: a stem shared by every member runs once). The graph holds standard ops only:
    the member norms trace their per-member loop of plain norms, not the fused CPU kernels.

    Args:
        ensemble: an :class:`Ensemble` in eval mode.
        *args, **kwargs: example inputs, as ``ensemble(*args, **kwargs)`` takes them.

    Returns:
        A ``torch.export.ExportedProgram``.

    Shape:
        Inputs: (B, …) with B ≥ 2 in the example; the program takes any B ≥ 1. Output:
        (M, B, K) logits.

    Raises:
        TypeError: if ``ensemble`` is not an :class:`Ensemble`, or the inputs hold no tensor
            with a batch dimension.
        ValueError: if ``ensemble`` is in training mode, or the example has B < 2.
    """
    if not isinstance(ensemble, Ensemble):
        raise TypeError(f"snens.export expects a snens.Ensemble, got {type(ensemble).__name__}")
    if ensemble.training:
        raise ValueError(
            "snens.export exports an ensemble in eval mode (running statistics, every member "
            "on the whole batch); call ensemble.eval() first"
        )
    B = _batch_size(args, kwargs)
    if B < 2:
        raise ValueError(
            f"the example batch has B={B}, and torch.export fixes a dimension of size 0 or 1 to "
            "that size; pass an example with B >= 2 (the program then takes any B >= 1)"
        )
    if ensemble.replication == "auto":
        with torch.no_grad():
            ensemble(*args, **kwargs)
    batch = torch.export.Dim("batch")

    def spec(value: Any) -> dict | None:
        return {0: batch} if Ensemble._per_example(value, B) else None

    dynamic_shapes = {"args": tuple(spec(a) for a in args)}
    dynamic_shapes.update({k: spec(v) for k, v in kwargs.items()})
    return torch.export.export(
        _NamedKeywords(ensemble, kwargs), args, kwargs=kwargs, dynamic_shapes=dynamic_shapes
    )


class _NamedKeywords(nn.Module):
    """``ensemble(*args, **kwargs)`` under the signature ``(*args, <one keyword per name>)``.

    torch.export matches ``dynamic_shapes`` to the forward's parameters, and for a ``**kwargs``
    parameter (torch 2.13) counts each keyword input twice, under "kwargs" and by its name, and
    fails; keyword-only parameters named as in the example are counted once.
    """

    def __init__(self, ensemble: Ensemble, names: Sequence[str]) -> None:
        super().__init__()
        self.ensemble = ensemble
        P = inspect.Parameter
        parameters = [P("args", P.VAR_POSITIONAL), *(P(n, P.KEYWORD_ONLY) for n in names)]

        def forward(*args: Any, **kwargs: Any) -> Tensor:
            return ensemble(*args, **kwargs)

        forward.__signature__ = inspect.Signature(parameters)  # what torch.export reads
        self.forward = forward
