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
    """The whole ensemble (in eval mode) as a ``torch.export`` program that takes any B ≥ 1:
    every tensor argument of the example's leading size B ≥ 2 gets one shared dynamic dimension.

    Returns:
        A ``torch.export.ExportedProgram``.

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
    # DYNAMIC, not a named Dim: a guard the shape solver cannot prove for every B becomes a
    # runtime check instead of an export error
    batch = torch.export.Dim.DYNAMIC

    def spec(value: Any) -> dict | None:
        return {0: batch} if is_per_example(value, B) else None

    # keyword inputs only: no "args" entry, the forward then has no *args parameter
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
    """The whole ensemble as an ONNX file that takes any batch size (:func:`export`, then
    ``torch.onnx.export``); inputs named after the keywords (positional ones ``input``,
    ``input_1``, …, or ``input_names``), the output ``logits``, the batch dimension ``batch``.

    Returns:
        ``path``, as a :class:`~pathlib.Path`.

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


#: (logger, how its message starts): what a correct export logs that needs no action.
_CHATTER = (
    ("torch.onnx._internal.exporter._registration", "torchvision is not installed"),
    ("onnxscript.optimizer._constant_folding", "Evaluation failed"),
)
#: torch's own deprecation, raised by its copy of the program's call graph (torch 2.13).
_TORCH_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


@contextlib.contextmanager
def _without_exporter_chatter() -> Iterator[None]:
    """Drop the log records of :data:`_CHATTER` and torch's ``LeafSpec`` FutureWarning."""
    dropped = [
        (logging.getLogger(name), lambda record, start=start: not str(record.msg).startswith(start))
        for name, start in _CHATTER
    ]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_DEPRECATION, category=FutureWarning)
        for logger, keep in dropped:
            logger.addFilter(keep)
        try:
            yield
        finally:
            for logger, keep in dropped:
                logger.removeFilter(keep)


class _NamedKeywords(nn.Module):
    """``ensemble(*args, **kwargs)`` under the signature ``(*args, <one keyword per name>)``:
    torch.export counts a ``**kwargs`` input twice against ``dynamic_shapes``."""

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
