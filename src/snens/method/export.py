"""Export: the whole ensemble, in eval mode, as a ``torch.export`` program or an ONNX file.

The batch size is dynamic: nothing on the path branches on the value of B, and the member
norms trace their loop of plain norms, so one program takes any B ≥ 1.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from snens import files
from snens.method.ensemble import Ensemble, input_batch_size, is_per_example

__all__ = ["export", "export_onnx"]


def export(ensemble: Ensemble, /, *args: Any, **kwargs: Any) -> torch.export.ExportedProgram:
    """The whole ensemble as a ``torch.export`` program that takes any batch size.

    Every tensor argument whose leading dimension is the example's batch size B (the inputs
    :class:`Ensemble` repeats) gets one shared dynamic dimension ``batch``; the rest stay as in
    the example. ``program.module()(…)`` equals ``ensemble(…)`` at every B ≥ 1 and
    ``torch.onnx.export(program, dynamo=True)`` turns the program into an ONNX model. The
    graph holds standard ops only: the member norms trace their per-member loop of plain
    norms, not the fused CPU kernels.

    Args:
        ensemble: an :class:`Ensemble` in eval mode.
        args, kwargs: example inputs, as ``ensemble(*args, **kwargs)`` takes them.

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
    B = input_batch_size(args, kwargs)
    if B < 2:
        raise ValueError(
            f"the example batch has B={B}, and torch.export fixes a dimension of size 0 or 1 to "
            "that size; pass an example with B >= 2 (the program then takes any B >= 1)"
        )
    # DYNAMIC, not a named Dim: a guard the shape solver cannot prove for every B (the
    # last-non-pad-token pooling of a *ForSequenceClassification yields B·min(L, L·B) == L·B)
    # becomes a runtime check instead of an export error; a B it would fix still raises
    batch = torch.export.Dim.DYNAMIC

    def spec(value: Any) -> dict | None:
        return {0: batch} if is_per_example(value, B) else None

    # keyword inputs only (input_ids=…, pixel_values=…): no "args" entry, the forward then has
    # no *args parameter for it to match
    dynamic_shapes = {"args": tuple(spec(a) for a in args)} if args else {}
    dynamic_shapes.update({k: spec(v) for k, v in kwargs.items()})
    return torch.export.export(
        _NamedKeywords(ensemble, kwargs, positional=bool(args)),
        args,
        kwargs=kwargs,
        dynamic_shapes=dynamic_shapes,
    )


def export_onnx(
    ensemble: Ensemble,
    path: str | os.PathLike,
    /,
    *args: Any,
    input_names: Sequence[str] | None = None,
    **kwargs: Any,
) -> Path:
    """The whole ensemble as an ONNX file that takes any batch size, with named inputs, output
    and batch dimension.

    :func:`export`, then ``torch.onnx.export(program, dynamo=True)``; the file's inputs are
    named after the forward's keywords (``input_ids``, ``attention_mask``, …; positional
    inputs ``input``, ``input_1``, …, or ``input_names``), its output ``logits``, and the
    shared batch dimension ``batch`` wherever it appears. Needs ``onnx`` and ``onnxscript``
    (``pip install 'snens[export]'``); ONNX Runtime runs the file. A correct export prints
    nothing: torch.onnx's progress lines and the exporter's notes that need no action (skipped
    torchvision ops, nodes constant folding leaves unfolded) are silenced while it runs; every
    other log record and warning shows.

    Args:
        ensemble: an :class:`Ensemble` in eval mode.
        path: the ``.onnx`` file to write.
        args, kwargs: example inputs, as ``ensemble(*args, **kwargs)`` takes them (B >= 2).
        input_names: names for the inputs in order, positional then keyword; default as above.

    Returns:
        ``path``, as a :class:`~pathlib.Path`.

    Shape:
        Inputs: (batch, …). Output ``logits``: (M, batch, K).

    Raises:
        TypeError, ValueError: as :func:`export`; ``input_names`` of another length than the
            inputs.
        ImportError: ``onnx`` or ``onnxscript`` missing (the message says what to install).
    """
    try:
        import onnx  # noqa: F401 - torch.onnx builds an onnx model
        import onnxscript  # noqa: F401 - torch.onnx's dynamo exporter needs it
    except ImportError as error:
        raise ImportError(
            f"snens.export_onnx needs onnx and onnxscript ({error}); pip install 'snens[export]'"
        ) from error
    default = ["input" if i == 0 else f"input_{i}" for i in range(len(args))] + list(kwargs)
    names = list(input_names) if input_names is not None else default
    if len(names) != len(default):
        raise ValueError(
            f"input_names {names} name {len(names)} inputs, but the example has {len(default)} "
            f"({len(args)} positional, keywords {list(kwargs)})"
        )
    program = export(ensemble, *args, **kwargs)
    with _without_exporter_chatter():
        onnx_program = torch.onnx.export(
            program, dynamo=True, input_names=names, output_names=["logits"], verbose=False
        )
    model = onnx_program.model_proto
    batch = next(
        dim.dim_param
        for value in model.graph.input
        for dim in value.type.tensor_type.shape.dim[:1]
        if dim.dim_param
    )
    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == batch:
                dim.dim_param = "batch"
    # atomic, never through a link at the name; one protobuf holds at most 2 GiB, as onnx.save
    return files.write_bytes(path, model.SerializeToString(), mode=files.plain_mode(path))


#: (logger, how its message starts): what torch.onnx and onnxscript log during a correct export,
#: nothing the user can act on: the exporter's table skipping torchvision's ops when torchvision
#: is not installed, and constant folding leaving a node it cannot evaluate unfolded.
_CHATTER = (
    ("torch.onnx._internal.exporter._registration", "torchvision is not installed"),
    ("onnxscript.optimizer._constant_folding", "Evaluation failed"),
)
#: torch's own deprecation, raised by its copy of the program's call graph (torch 2.13).
_TORCH_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


@contextlib.contextmanager
def _without_exporter_chatter() -> Iterator[None]:
    """During ``torch.onnx.export`` only: drop the log records of :data:`_CHATTER` and torch's
    own FutureWarning about ``LeafSpec``; every other record and warning shows, errors raise,
    and the loggers' filters and the warning filters are restored after."""
    dropped = [(logging.getLogger(name), _starts_otherwise(start)) for name, start in _CHATTER]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_DEPRECATION, category=FutureWarning)
        for logger, keep in dropped:
            logger.addFilter(keep)
        try:
            yield
        finally:
            for logger, keep in dropped:
                logger.removeFilter(keep)


def _starts_otherwise(start: str):
    """A logging filter keeping the records whose message does not start with ``start``."""

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(start)

    return keep


class _NamedKeywords(nn.Module):
    """``ensemble(*args, **kwargs)`` under the signature ``(*args, <one keyword per name>)``.

    torch.export matches ``dynamic_shapes`` to the forward's parameters, and for a ``**kwargs``
    parameter (torch 2.13) counts each keyword input twice, under "kwargs" and by its name, and
    fails; keyword-only parameters named as in the example are counted once.
    """

    def __init__(self, ensemble: Ensemble, names: Sequence[str], positional: bool = True) -> None:
        super().__init__()
        self.ensemble = ensemble
        P = inspect.Parameter
        parameters = [P("args", P.VAR_POSITIONAL)] if positional else []
        parameters += [P(n, P.KEYWORD_ONLY) for n in names]

        def forward(*args: Any, **kwargs: Any) -> Tensor:
            return ensemble(*args, **kwargs)

        forward.__signature__ = inspect.Signature(parameters)  # what torch.export reads
        self.forward = forward
