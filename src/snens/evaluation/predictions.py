"""Collecting predictions: a model run over a data set, batch by batch, in eval mode, keeping
only the members' float32 probabilities (or logits) on the CPU."""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["collect", "progress_bars", "to_device"]

_PROGRESS: ContextVar[bool] = ContextVar("snens_evaluation_progress", default=False)


@contextlib.contextmanager
def progress_bars(enabled: bool = True) -> Iterator[None]:
    """Within the block, every pass over a data set shows a tqdm bar named after the set,
    where stderr is a terminal and tqdm is installed; ``enabled=False`` turns them off inside
    an enclosing block."""
    token = _PROGRESS.set(enabled)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _with_bar(loader: Iterable[Any], what: str) -> Iterable[Any]:
    if not _PROGRESS.get() or not sys.stderr.isatty():
        return loader
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return loader
    try:
        total = len(loader)  # type: ignore[arg-type]
    except TypeError:  # a one-shot iterable: a count without a total
        total = None
    return tqdm(loader, desc=f"evaluating the {what}", total=total, leave=False, dynamic_ncols=True)


def to_device(x: Any, device: torch.device | None) -> Any:
    """A batch's inputs or labels on ``device``: a tensor moved, a mapping's tensors moved
    (Hugging Face ``input_ids``, ``attention_mask``, …), anything else as it is.

    Args:
        x: a tensor, a mapping of names to tensors, or anything else.
        device: where to move it; None leaves ``x`` where it is.

    Returns:
        ``x`` on ``device`` (a new dict for a mapping).
    """
    if device is None:
        return x
    if isinstance(x, Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, Mapping):
        return {k: to_device(v, device) for k, v in x.items()}
    return x


def _split_batch(batch: Any, what: str) -> tuple[Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) in (1, 2):
        return batch[0], (batch[1] if len(batch) == 2 else None)
    raise TypeError(
        f"{what}: a batch must be a pair (x, y), got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )


def _collect(
    model: nn.Module,
    loader: Iterable[Any],
    device: torch.device | str | None,
    *,
    what: str,
    logits: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The members' outputs (M, N, K) of the set named ``what``, and its labels (None: none)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    device = torch.device(device) if device is not None else getattr(first, "device", None)
    modes = {module: module.training for module in model.modules()}
    outputs: list[Tensor] = []
    labels: list[Tensor] = []
    model.eval()
    batches = _with_bar(loader, what)
    try:
        with torch.no_grad():
            for batch in batches:
                x, y = _split_batch(batch, what)
                x = to_device(x, device)
                out = model(**x) if isinstance(x, Mapping) else model(x)
                if not isinstance(out, Tensor) or out.dim() != 3:
                    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise ValueError(
                        f"{what}: {type(model).__name__} returned {got}, but evaluation needs "
                        "the ensemble contract, inputs (B, …) -> logits (M, B, K). Wrap a plain "
                        "classifier in snens.baselines.SingleModel(model) (M = 1), or convert it "
                        "with snens.convert(model, num_members=M)"
                    )
                out = out.float()
                if outputs and out.shape[::2] != outputs[0].shape[::2]:
                    raise ValueError(
                        f"{what}: the model's logits changed from (M, K) = "
                        f"{tuple(outputs[0].shape[::2])} to {tuple(out.shape[::2])} between "
                        "batches"
                    )
                out = out if logits else out.softmax(dim=-1)
                outputs.append(out.cpu())  # (M, B, K)
                if y is not None:
                    labels.append(torch.as_tensor(y).detach().reshape(-1).cpu())
    finally:
        for module, training in modes.items():
            module.training = training
        if batches is not loader:
            batches.close()  # type: ignore[attr-defined]
    if not outputs:
        raise ValueError(f"{what}: the loader yielded no batch; the data set is empty")
    member_out = torch.cat(outputs, dim=1)  # (M, N, K)
    if len(labels) != len(outputs):
        return member_out, None
    label_tensor = torch.cat(labels)
    if label_tensor.shape[0] != member_out.shape[1]:
        raise ValueError(
            f"{what}: the loader yielded {label_tensor.shape[0]} labels for "
            f"{member_out.shape[1]} examples; yield one label per example"
        )
    return member_out, label_tensor


def collect(
    model: nn.Module,
    loader: Iterable[Any],
    device: torch.device | str | None = None,
    *,
    logits: bool = False,
) -> tuple[Tensor, Tensor]:
    """The members' probabilities and the labels over a whole data set, one batch at a time, the
    model in eval mode under ``torch.no_grad`` (each module's training flag restored after).

    Args:
        model: returns logits (M, B, K) from inputs (B, …); a batch ``x`` that is a mapping is
            passed as ``model(**x)``.
        loader: re-iterable or one-shot ``(x, y)`` batches.
        device: where the inputs are moved; default the model's (which is never moved).
        logits: return the members' logits instead of their softmax.

    Returns:
        ``(member_probs, labels)``, (M, N, K) float32 on the CPU and (N,).

    Raises:
        ValueError: an empty loader, a model not returning (M, B, K), M or K changing between
            batches, or labels not one per example.
        TypeError: a batch that is not an ``(x, y)`` pair.
    """
    out, labels = _collect(model, loader, device, what="data set", logits=logits)
    if labels is None:
        raise ValueError("the loader yielded batches without labels; yield (x, y) pairs")
    return out, labels
