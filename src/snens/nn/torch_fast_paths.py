"""torch's fused transformer fast path, which computes a layer without calling its submodules.

In eval mode with autograd off (``torch.no_grad``, ``torch.inference_mode``: every evaluation),
``nn.TransformerEncoderLayer.forward`` does not call its norms, linears or dropouts: it hands
their weights (``norm1.weight``, ``linear1.weight``, …), as a plain ``nn.LayerNorm``'s and
``nn.Linear``'s, to one fused kernel, which applies no dropout; and ``nn.TransformerEncoder``
first packs a padded batch into a nested tensor for that kernel. An ensemble that replaced one
of those submodules — a member norm ((M, C) affine), a BatchEnsemble or FiLM layer, an
always-on MC-dropout — would then fail ("Expected weight to be of same shape as
normalized_shape") or, worse, silently compute one plain network for every member.

torch takes the fast path only where ``activation_relu_or_gelu`` (set at construction from the
activation, read by nothing else) is nonzero and, for the encoder, ``use_nested_tensor`` is
true. :func:`route_through_modules` clears both on every layer whose fused submodules are no
longer torch's own types, and keeps their values; :func:`restore_fast_paths` puts them back
once they are again (``snens.extract_member``), so an extracted member runs as fast as the
original. The layers' own forward, which training always takes, computes the same function.
"""

from __future__ import annotations

from torch import nn

__all__ = ["restore_fast_paths", "route_through_modules"]

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

#: Where a module keeps the fast-path settings it had before (attribute → value).
_SAVED = "_snens_fast_path"


def _fusable(layer: nn.TransformerEncoderLayer) -> bool:
    """Whether the fused kernel computes what ``layer``'s submodules compute."""
    return all(type(getattr(layer, name, None)) is kind for name, kind in _FUSED.items())


def _routed(module: nn.Module) -> bool:
    """Whether ``module`` is an encoder layer, or an encoder with a layer, that is not fusable."""
    if isinstance(module, nn.TransformerEncoderLayer):
        return not _fusable(module)
    if isinstance(module, nn.TransformerEncoder):
        return any(_routed(layer) for layer in module.layers)
    return False


def route_through_modules(model: nn.Module) -> list[str]:
    """Turn torch's fused path off on every encoder layer (and encoder) it would compute wrongly.

    Call after replacing submodules of a model; calling it again changes nothing.

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
