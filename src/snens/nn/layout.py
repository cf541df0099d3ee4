"""Where member layers find the members: along the first dimension, and how to say otherwise.

While an ensemble's forward runs (:func:`model_rows`), a member layer checks that its first
dimension is a multiple of the rows the model was fed (:func:`check_batch_first`); a layer that
sees the batch in dimension 1 is marked with :func:`sequence_first`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import Tensor, nn

__all__ = ["check_batch_first", "model_rows", "sequence_first"]

#: The rows the running ensemble's forward feeds its model (M·B; B with ``split`` inputs).
_MODEL_ROWS: ContextVar[int | None] = ContextVar("snens_model_rows", default=None)

_MARK = "_snens_sequence_first"


@contextlib.contextmanager
def model_rows(rows: int) -> Iterator[None]:
    """While the block runs, member layers expect a multiple of ``rows`` in dimension 0 (not
    under ``torch.compile``, which cannot trace a ``ContextVar``)."""
    if torch.compiler.is_compiling():
        yield
        return
    token = _MODEL_ROWS.set(rows)
    try:
        yield
    finally:
        _MODEL_ROWS.reset(token)


def check_batch_first(layer: nn.Module, x: Tensor) -> None:
    """Raise if ``x``'s first dimension cannot be the batch the running ensemble fed its model.

    Raises:
        ValueError: naming the layer, the shape, the rows expected and the fix.
    """
    if torch.compiler.is_compiling():  # before the ContextVar, which dynamo cannot trace
        return
    rows = _MODEL_ROWS.get()
    if not rows or x.dim() == 0:  # None, or an empty batch
        return
    if x.shape[0] % rows:
        raise ValueError(
            f"{type(layer).__name__} got a tensor of shape {tuple(x.shape)}, whose first "
            f"dimension ({x.shape[0]}) is not a multiple of the {rows} rows the ensemble feeds "
            "the model: the batch is not first there (a sequence-first layout, "
            "batch_first=False?). Member layers find the members along the first dimension; "
            "keep the batch first inside the model, or mark the module whose member layers see "
            "(S, batch, …) inputs with snens.nn.sequence_first(module). A norm of a tensor "
            "with no batch dimension (learned queries) stays shared: leave it out of "
            "snens.convert(model, M, norms=...)"
        )


def _batch_to_front(layer: nn.Module, args: tuple) -> tuple:
    return (args[0].transpose(0, 1), *args[1:])


def _batch_back(layer: nn.Module, args: tuple, output: Tensor) -> Tensor:
    return output.transpose(0, 1)


def sequence_first(module: nn.Module) -> list[str]:
    """Mark every member layer under ``module`` (itself included) as seeing (S, M·B, …) inputs:
    dimensions 0 and 1 are swapped around it.

    Returns:
        The names (relative to ``module``) of the layers newly marked.

    Raises:
        ValueError: if ``module`` holds no member layer.
    """
    layers = [(n, m) for n, m in module.named_modules() if getattr(m, "member_major", False)]
    if not layers:
        raise ValueError(
            f"{type(module).__name__} holds no member layer to mark; call "
            "snens.nn.sequence_first on a module of the converted model"
        )
    marked = []
    for name, layer in layers:
        if vars(layer).get(_MARK):
            continue
        layer.register_forward_pre_hook(_batch_to_front)
        layer.register_forward_hook(_batch_back)
        vars(layer)[_MARK] = True
        marked.append(name)
    return marked
