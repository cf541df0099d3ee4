"""torch's fused transformer fast path, which computes a layer without calling its submodules.

In eval mode with autograd off, ``nn.TransformerEncoderLayer.forward`` hands its submodules'
weights to one fused kernel, which would compute one plain network for every member once a
submodule is replaced. :func:`route_through_modules` turns the fast path off there;
:func:`restore_fast_paths` turns it back on; :func:`mark_sequence_first` marks the member
layers of torch's sequence-first modules. :func:`adapt` does both.
"""

from __future__ import annotations

from torch import nn

from snens.nn.layout import sequence_first

__all__ = ["adapt", "mark_sequence_first", "restore_fast_paths", "route_through_modules"]

#: The submodules the fused kernel stands in for, and the types it computes them as.
_FUSED = {
    "norm1": nn.LayerNorm,
    "norm2": nn.LayerNorm,
    "linear1": nn.Linear,
    "linear2": nn.Linear,
    "dropout": nn.Dropout,
    "dropout1": nn.Dropout,
    "dropout2": nn.Dropout,
}

_PER_POSITION = ("norm1", "norm2", "norm3", "linear1", "linear2")

_SAVED = "_snens_fast_path"


def _fusable(layer: nn.TransformerEncoderLayer) -> bool:
    return all(type(getattr(layer, name, None)) is kind for name, kind in _FUSED.items())


def _routed(module: nn.Module) -> bool:
    if isinstance(module, nn.TransformerEncoderLayer):
        return not _fusable(module)
    if isinstance(module, nn.TransformerEncoder):
        return any(_routed(layer) for layer in module.layers)
    return False


def route_through_modules(model: nn.Module) -> list[str]:
    """Turn torch's fused path off on every encoder layer (and encoder) it would compute wrongly.

    Returns:
        The names of the modules whose fast path is off, for a conversion report.
    """
    changed = []
    for name, module in model.named_modules():
        if not _routed(module):
            continue
        attribute, off = (
            ("activation_relu_or_gelu", 0)
            if isinstance(module, nn.TransformerEncoderLayer)
            else ("use_nested_tensor", False)
        )
        vars(module).setdefault(_SAVED, {}).setdefault(attribute, getattr(module, attribute))
        setattr(module, attribute, off)
        changed.append(name)
    return changed


def restore_fast_paths(model: nn.Module) -> None:
    """Give back their fast-path settings to the modules that are fusable again."""
    for module in model.modules():
        saved = vars(module).get(_SAVED)
        if saved is None or _routed(module):
            continue
        for attribute, value in saved.items():
            setattr(module, attribute, value)
        del vars(module)[_SAVED]


def _sequence_first(module: nn.Module) -> bool:
    if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        return not module.self_attn.batch_first
    if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)):
        return len(module.layers) > 0 and _sequence_first(module.layers[0])
    return False


def mark_sequence_first(model: nn.Module) -> list[str]:
    """Mark the member layers of torch's sequence-first transformer modules as seeing (S, M·B, …).

    Returns:
        The names of the layers newly marked.
    """
    marked = []
    for name, module in model.named_modules():
        if not _sequence_first(module):
            continue
        children = ("norm",) if not hasattr(module, "self_attn") else _PER_POSITION
        for child in children:
            layer = getattr(module, child, None)
            if getattr(layer, "member_major", False) and sequence_first(layer):
                marked.append(f"{name}.{child}" if name else child)
    return marked


def adapt(model: nn.Module) -> tuple[str, ...]:
    """:func:`route_through_modules` and :func:`mark_sequence_first`.

    Returns:
        The notes for a conversion report, one line per kind of change.
    """
    notes = []
    routed = route_through_modules(model)
    if routed:
        notes.append(
            f"torch's fused transformer fast path is off in {', '.join(routed)}: it reads "
            "LayerNorm and Linear weights instead of calling the modules, so the member layers "
            "run as modules"
        )
    marked = mark_sequence_first(model)
    if marked:
        notes.append(
            f"sequence-first (batch_first=False): {', '.join(marked)} take their (S, M·B, …) "
            "input with the batch moved first (snens.nn.sequence_first)"
        )
    return tuple(notes)
