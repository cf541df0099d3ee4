"""Which member norm replaces a module: one table, one lookup, one reason when there is none.

:func:`lookup`: member modules and modules that do not look like a norm convert to nothing;
classes in the table (torch's norms, :func:`register_norm`'s) by their entry; any other norm
by what it computes (:func:`snens.nn.probe.match` against :data:`FORMULAS`), where exactly one
formula matches and a member version reproduces it.

A module looks like a norm when it is a torch norm, its class name says "…Norm", or it comes
from outside torch and holds a 1-D ``weight`` (and a ``bias``) and nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable
from typing import Any

from torch import nn

from snens.nn import probe
from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.channels_first import MemberLayerNorm2d
from snens.nn.hf_norms import (
    MemberCohereLayerNorm,
    MemberDebertaLayerNorm,
    MemberDeepseekUnweightedRMSNorm,
    MemberGatedRMSNorm,
    MemberGatedRMSNormF32,
    MemberGateFirstRMSNorm,
    MemberGateFirstRMSNormF32,
    MemberGemma3nRMSNorm,
    MemberGemmaRMSNorm,
    MemberLayerNorm1P,
    MemberLlamaRMSNorm,
    MemberOlmo2RMSNorm,
    MemberOlmoLayerNorm,
    MemberT5RMSNorm,
    MemberUnweightedL2Norm,
    MemberUnweightedRMSNorm,
    ScaledRMSNorm,
)
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm, check_num_members
from snens.nn.per_example_norms import (
    MemberGroupNorm,
    MemberInstanceNorm1d,
    MemberInstanceNorm2d,
    MemberInstanceNorm3d,
    MemberLayerNorm,
    MemberRMSNorm,
)
from snens.nn.plain_conversion import from_plain_as

__all__ = [
    "FORMULAS",
    "GATED_FORMULAS",
    "MEMBER_NORMS",
    "SUPPORTED",
    "Converter",
    "Formula",
    "is_norm",
    "is_unsupported_norm",
    "lookup",
    "member_converter",
    "member_norm",
    "refusal",
    "register_norm",
]

#: ``convert(plain, num_members, *, gamma_mean, gamma_std, generator) -> MemberNorm``, the
#: signature of ``MemberNorm.from_plain``: every member of the result reproduces ``plain``.
Converter = Callable[..., MemberNorm]

#: torch's norms -> their member versions.
MEMBER_NORMS: dict[type[nn.Module], type[MemberNorm]] = {
    nn.BatchNorm1d: MemberBatchNorm1d,
    nn.BatchNorm2d: MemberBatchNorm2d,
    nn.BatchNorm3d: MemberBatchNorm3d,
    nn.LayerNorm: MemberLayerNorm,
    nn.GroupNorm: MemberGroupNorm,
    nn.RMSNorm: MemberRMSNorm,
    nn.InstanceNorm1d: MemberInstanceNorm1d,
    nn.InstanceNorm2d: MemberInstanceNorm2d,
    nn.InstanceNorm3d: MemberInstanceNorm3d,
}


@dataclasses.dataclass(frozen=True)
class _Entry:
    member_type: type[MemberNorm] | None  # None for a conversion registered as from_plain=
    convert: Converter


#: plain class (exact) -> its member class and conversion.
_TABLE: dict[type[nn.Module], _Entry] = {
    plain: _Entry(member, member.from_plain) for plain, member in MEMBER_NORMS.items()
}
# what a weightless RMS norm's member becomes when extracted: converts back to its member class
_TABLE[ScaledRMSNorm] = _Entry(None, MemberUnweightedRMSNorm.from_scaled)


@dataclasses.dataclass(frozen=True)
class Formula:
    """What a norm computes, and its member versions (differing in where they round)."""

    name: str
    members: tuple[type[MemberNorm], ...]


#: The formulas a module from outside torch is probed against.
FORMULAS = (
    Formula(
        "layer norm over the last dimension",
        (MemberCohereLayerNorm, MemberDebertaLayerNorm, MemberOlmoLayerNorm, MemberLayerNorm),
    ),
    Formula("layer norm over the channels of (B, C, *) inputs", (MemberLayerNorm2d,)),
    Formula(
        "RMS norm over the last dimension",
        (
            MemberLlamaRMSNorm,
            MemberT5RMSNorm,
            MemberOlmo2RMSNorm,
            MemberGemma3nRMSNorm,
            MemberRMSNorm,
        ),
    ),
    Formula("RMS norm with the weight 1 + w (Gemma)", (MemberGemmaRMSNorm,)),
    Formula(
        "RMS norm without a weight", (MemberUnweightedRMSNorm, MemberDeepseekUnweightedRMSNorm)
    ),
    Formula("L2 norm without a weight (x / ‖x‖, nGPT)", (MemberUnweightedL2Norm,)),
)
#: The formulas a module whose forward takes a gate, ``forward(x, gate)``, is probed against.
GATED_FORMULAS = (
    Formula("gated RMS norm, gated after the norm", (MemberGatedRMSNorm, MemberGatedRMSNormF32)),
    Formula(
        "gated RMS norm, gated before the norm", (MemberGateFirstRMSNorm, MemberGateFirstRMSNormF32)
    ),
)
# a subclass of a torch norm is probed against its family's member versions only
_TORCH_FAMILIES: tuple[tuple[type[nn.Module], tuple[Formula, ...]], ...] = (
    (nn.BatchNorm1d, (Formula("batch norm over (N, C, *)", (MemberBatchNorm1d,)),)),
    (nn.BatchNorm2d, (Formula("batch norm over (N, C, H, W)", (MemberBatchNorm2d,)),)),
    (nn.BatchNorm3d, (Formula("batch norm over (N, C, D, H, W)", (MemberBatchNorm3d,)),)),
    (nn.InstanceNorm1d, (Formula("instance norm over (N, C, L)", (MemberInstanceNorm1d,)),)),
    (nn.InstanceNorm2d, (Formula("instance norm over (N, C, H, W)", (MemberInstanceNorm2d,)),)),
    (nn.InstanceNorm3d, (Formula("instance norm over (N, C, D, H, W)", (MemberInstanceNorm3d,)),)),
    (nn.GroupNorm, (Formula("group norm", (MemberGroupNorm,)),)),
    (
        nn.LayerNorm,
        (
            Formula("layer norm over the last dimensions", (MemberLayerNorm,)),
            Formula("layer norm over the channels of (B, C, *) inputs", (MemberLayerNorm2d,)),
            Formula("layer norm with the weight 1 + w (Nemotron)", (MemberLayerNorm1P,)),
        ),
    ),
    (nn.RMSNorm, (Formula("RMS norm", (MemberRMSNorm,)),)),
)

SUPPORTED = (
    f"{', '.join(t.__name__ for t in MEMBER_NORMS)} (instance norms without running "
    "statistics); modules that compute, on probe inputs, a layer norm over the last dimension "
    "or over the channels of (B, C, *) inputs, an RMS norm (with the weight w or 1 + w, or "
    "none), an L2 norm without a weight, a gated RMS norm (forward(x, gate), the gate before "
    "or after the norm), a layer norm with the weight 1 + w, a group norm or a batch norm "
    "(torch's subclasses), with a weight (and a bias) of their feature size or none; types "
    "registered with snens.nn.register_norm"
)

# "LayerNorm", "T5LayerNorm", "FrozenBatchNorm2d", "RMSNormGated" — but not "Normalize".
_NORM_NAME = re.compile(r"Norm(?:$|[A-Z0-9])")
_TORCH_NORMS = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
    nn.CrossMapLRN2d,
)


def lookup(module: nn.Module, memo: dict[Any, Any] | None = None) -> Converter | str | None:
    """How ``snens.convert`` turns ``module`` into a member norm (a :data:`Converter`), why it
    cannot (a reason), or None where it is not a norm. ``memo`` shares probes over a conversion.
    """
    kind = type(module)
    if isinstance(module, (MemberNorm, MemberLinear)):
        return None
    entry = _TABLE.get(kind)
    if entry is not None:
        member = MEMBER_NORMS.get(kind)
        reason = None if member is None else member.refusal(module)
        return entry.convert if reason is None else reason
    if not _looks_like_norm(module):
        return None
    if memo is None:
        return _recognize(module)
    key = _settings(module)
    if key not in memo:
        memo[key] = _recognize(module)
    return memo[key]


def member_converter(module: nn.Module) -> Converter | None:
    """:func:`lookup`'s conversion, or None."""
    found = lookup(module)
    return None if isinstance(found, str) else found


def refusal(module: nn.Module) -> str | None:
    """:func:`lookup`'s reason, or None."""
    found = lookup(module)
    return found if isinstance(found, str) else None


def _recognize(module: nn.Module) -> Converter | str:
    name = type(module).__name__
    if isinstance(module, (nn.LocalResponseNorm, nn.CrossMapLRN2d)):
        return f"{name} (torch) normalizes across neighbouring channels; no member version does"
    if isinstance(module, nn.SyncBatchNorm):
        return (
            f"{name} (torch) computes its batch statistics over every process, which no member "
            "version does; convert the model while it holds nn.BatchNorm*d layers (before "
            "nn.SyncBatchNorm.convert_sync_batchnorm): each member then normalizes with its "
            "process's own batch"
        )
    why = probe.unprobeable(module)
    if why is not None:
        return f"{name} {why}"
    formulas = _formulas_for(module)
    found = [(f, c) for f in formulas if (c := probe.match(module, f.members)) is not None]
    if not found:
        names = "; ".join(f.name for f in formulas) or "none for its class"
        return f"{name} computes none of the supported formulas on probe inputs ({names})"
    if len(found) > 1:
        names = " and ".join(f.name for f, _ in found)
        choices = ", or ".join(
            f"snens.nn.register_norm({name}, snens.nn.{c.member_type.__name__}) for a {f.name}"
            for f, c in found
        )
        return (
            f"{name} computes both {names} on probe inputs, depending on their shape, and the "
            f"module does not tell which one your model gives it; register its class as the one "
            f"your model needs: {choices}"
        )
    ((formula, best),) = found
    if not best.reproduces:
        how = (
            "returns another dtype or fails there"
            if math.isinf(best.worst)
            else f"differs by {best.worst:.3g}× the tolerance"
        )
        return (
            f"{name} computes a {formula.name} in float32, but no member version reproduces it "
            f"in {best.worst_setting} (the closest, {best.member_type.__name__}, {how})"
        )
    return functools.partial(from_plain_as, best.member_type, eps=best.eps)


def _formulas_for(module: nn.Module) -> tuple[Formula, ...]:
    for base, formulas in _TORCH_FAMILIES:
        if isinstance(module, base):
            return formulas
    if isinstance(module, _TORCH_NORMS):
        return ()  # other subclasses of torch's norm bases (SyncBatchNorm, …)
    return GATED_FORMULAS if probe.takes_gate(module) else FORMULAS


def _looks_like_norm(module: nn.Module) -> bool:
    if isinstance(module, _TORCH_NORMS):
        return True
    if type(module).__module__.startswith("torch."):
        # torch's other classes are not norms: nn.PReLU holds a 1-D weight, and the weight
        # and spectral norm parametrizations (_WeightNorm) normalize weights, not activations
        return False
    own = {name for name, p in module._parameters.items() if p is not None}
    leaf = next(module.children(), None) is None
    if _NORM_NAME.search(type(module).__name__):
        # a leaf, or a norm with more inside it (IBert's IntLayerNorm); not a block named
        # after one (RobertaPreLayerNormLMHead holds a bias and its layers)
        return leaf or "weight" in own
    weight = module._parameters.get("weight")
    return leaf and weight is not None and weight.dim() == 1 and own <= {"weight", "bias"}


def _settings(module: nn.Module) -> tuple:
    tensors = [
        (name, None if t is None else (tuple(t.shape), t.device.type))
        for name, t in [*module._parameters.items(), *module._buffers.items()]
    ]
    attributes = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or name == "training":
            continue
        plain = isinstance(value, int | float | str | bool | type(None) | tuple)
        attributes.append((name, value if plain and _hashable(value) else id(value)))
    return (type(module), tuple(tensors), tuple(attributes))


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalization layer (a member norm, a class in the table, or
    one that looks like a norm): the definition conversion and parameter groups share."""
    return (
        isinstance(module, MemberNorm) or type(module) in _TABLE or _looks_like_norm(module)
    ) and not isinstance(module, MemberLinear)


def is_unsupported_norm(module: nn.Module) -> bool:
    """True for a norm that is not one of :data:`MEMBER_NORMS` in a setting it computes."""
    if isinstance(module, (MemberNorm, MemberLinear)):
        return False
    member = MEMBER_NORMS.get(type(module))
    if member is not None:
        return member.refusal(module) is not None
    return is_norm(module)


def register_norm(
    plain_type: type[nn.Module],
    member_type: type[MemberNorm] | None = None,
    *,
    from_plain: Converter | None = None,
) -> None:
    """Teach ``snens.convert`` a norm class: modules of exactly ``plain_type`` become member norms.

    Give either ``member_type``, a :class:`MemberNorm` subclass computing what ``plain_type``
    computes, or ``from_plain``, a :data:`Converter`. The class is not probed; registering it
    again replaces its conversion.

    Raises:
        TypeError: a ``plain_type`` that is not an ``nn.Module`` class, a torch norm snens
            converts or a member module; a bad ``member_type`` or ``from_plain``, or not
            exactly one of them.
    """
    if not (isinstance(plain_type, type) and issubclass(plain_type, nn.Module)):
        raise TypeError(f"plain_type must be an nn.Module class, got {plain_type!r}")
    if plain_type in MEMBER_NORMS:
        raise TypeError(
            f"{plain_type.__name__} already converts to {MEMBER_NORMS[plain_type].__name__}; "
            "register a subclass of it, not the torch type itself"
        )
    if issubclass(plain_type, (MemberNorm, MemberLinear)):
        raise TypeError(f"{plain_type.__name__} is a member module; register the plain norm")
    if (member_type is None) == (from_plain is None):
        raise TypeError(
            f"register_norm({plain_type.__name__}, …) takes either member_type (a MemberNorm "
            "subclass) or from_plain= (a function plain, num_members, **kw -> MemberNorm), "
            "exactly one of them"
        )
    if member_type is not None:
        if not (isinstance(member_type, type) and issubclass(member_type, MemberNorm)):
            raise TypeError(
                f"member_type must be a MemberNorm subclass such as snens.nn.MemberLayerNorm, "
                f"got {member_type!r}; pass a conversion function as from_plain= instead"
            )
        from_plain = functools.partial(from_plain_as, member_type)
    elif not callable(from_plain):
        raise TypeError(f"from_plain must be callable, got {from_plain!r}")
    _TABLE[plain_type] = _Entry(member_type, from_plain)


def member_norm(
    num_members: int, norm: type[nn.Module] = nn.BatchNorm2d, **defaults
) -> Callable[..., MemberNorm]:
    """A ``norm_layer=`` factory for models built with one (torchvision, timm style).

    ``member_norm(4)(64)`` builds ``MemberBatchNorm2d(64, num_members=4)``. The layer takes
    ``norm``'s own signature (``**defaults`` for every layer); ``gamma_mean`` and
    ``gamma_std`` go to the member norm.

    Returns:
        A callable taking ``norm``'s arguments and returning its member norm.

    Raises:
        TypeError: if ``num_members`` is not an int, or ``norm`` has no member class.
        ValueError: if ``num_members`` is outside [1, :data:`~snens.nn.norms.MAX_MEMBERS`].
    """
    check_num_members(num_members)
    entry = _TABLE.get(norm)
    if entry is None or entry.member_type is None:
        supported = ", ".join(t.__name__ for t, e in _TABLE.items() if e.member_type is not None)
        raise TypeError(f"no member version of {norm!r}; supported norms: {supported}")
    cls = entry.member_type

    def build(*args: Any, **kwargs: Any) -> MemberNorm:
        options = {**defaults, **kwargs}
        member = {k: options.pop(k) for k in _MEMBER_OPTIONS if k in options}
        factory = {k: options[k] for k in ("device", "dtype") if k in options}
        plain = norm(*args, **options)  # torch's own signature and checks
        return cls(**cls._plain_config(plain), num_members=num_members, **member, **factory)

    build.__name__ = build.__qualname__ = f"member_norm({num_members}, {norm.__name__})"
    return build


# Keyword arguments of the member norms that the plain norms do not take.
_MEMBER_OPTIONS = ("gamma_mean", "gamma_std")
