"""Which member norm replaces a module, and how a user adds a norm class snens does not know.

:func:`member_converter` answers, for every module, how ``snens.convert`` turns it into a
member norm, in this order:

1. torch norms of exactly the types in ``MEMBER_NORMS`` (``nn.BatchNorm2d``, ``nn.LayerNorm``,
   …): their member norm's ``from_plain``;
2. exact types registered with :func:`register_norm`: the registered conversion;
3. norms of other libraries, recognised by their attributes and what they compute:
   Hugging Face norms whose forward is one of the formulas of :mod:`snens.nn.hf_formulas`
   (the Llama, Gemma, T5, OLMo-2 and Gemma 3n RMS norms, Cohere's and OLMo-1's float32 layer
   norms), which become their member versions of :mod:`snens.nn.hf_norms`; ``nn.LayerNorm``
   subclasses that normalize over channels first (timm's ``LayerNorm2d``,
   ``ConvNextLayerNorm(data_format="channels_first")``, :mod:`snens.nn.channels_first`) or
   last (``ConvNextLayerNorm``'s default, which becomes a :class:`MemberLayerNorm`).

Anything else that looks like a norm is refused by name
(:func:`snens.nn.surgery.is_unsupported_norm`). Registration is by exact type, as for torch's
norms: a subclass may change ``forward``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn

from snens.nn.channels_first import MemberLayerNorm2d, layer_norm_layout
from snens.nn.factory import MEMBER_NORMS, refusal
from snens.nn.hf_formulas import hf_formula
from snens.nn.hf_norms import HF_MEMBER_NORMS
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm
from snens.nn.per_example_norms import MemberLayerNorm
from snens.nn.plain_conversion import from_plain_as

__all__ = ["REGISTERED_NORMS", "Converter", "member_converter", "register_norm"]

#: ``convert(plain, num_members, *, gamma_mean, gamma_std, generator) -> MemberNorm``, the
#: signature of ``MemberNorm.from_plain``: every member of the result reproduces ``plain``.
Converter = Callable[..., MemberNorm]

#: Plain norm type -> its conversion, filled by :func:`register_norm`. Exact types.
REGISTERED_NORMS: dict[type[nn.Module], Converter] = {}


def register_norm(
    plain_type: type[nn.Module],
    member_type: type[MemberNorm] | None = None,
    *,
    from_plain: Converter | None = None,
) -> None:
    """Teach ``snens.convert`` a norm class: modules of exactly ``plain_type`` become member norms.

    Give either ``member_type``, a :class:`MemberNorm` subclass computing what ``plain_type``
    computes, or ``from_plain``, a function with the signature of ``MemberNorm.from_plain``,
    ``(plain, num_members, *, gamma_mean, gamma_std, generator) -> MemberNorm``, returning a
    member norm whose every member reproduces ``plain``::

        snens.nn.register_norm(MyLayerNorm, snens.nn.MemberLayerNorm)
        snens.nn.register_norm(MyScaleNorm, from_plain=my_scale_norm_to_members)
        ens = snens.convert(model, 4)

    With ``member_type``, a module is converted by ``member_type.from_plain`` where the class
    defines its own (it decides what it accepts), else as ``member_type`` converts its own plain
    type (:func:`~snens.nn.plain_conversion.from_plain_as`): built from
    ``member_type._plain_config(module)``, every member set to the module's ``weight`` and
    ``bias``. Registering a type again replaces its conversion.

    Args:
        plain_type: the norm class, an ``nn.Module`` subclass.
        member_type: a :class:`MemberNorm` subclass.
        from_plain: a conversion function (instead of ``member_type``).

    Raises:
        TypeError: if ``plain_type`` is not an ``nn.Module`` class, is a torch norm snens already
            converts or a member module; if ``member_type`` is not a ``MemberNorm`` subclass,
            ``from_plain`` not callable, or not exactly one of them is given.
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
        if member_type.from_plain.__func__ is not MemberNorm.from_plain.__func__:
            from_plain = member_type.from_plain
        else:
            from_plain = functools.partial(from_plain_as, member_type)
    elif not callable(from_plain):
        raise TypeError(f"from_plain must be callable, got {from_plain!r}")
    REGISTERED_NORMS[plain_type] = from_plain


def member_converter(module: nn.Module) -> Converter | None:
    """How ``snens.convert`` turns ``module`` into a member norm, or None where it does not.

    See the module docstring for the order. Member modules give None.
    """
    kind = type(module)
    if kind in MEMBER_NORMS:
        return MEMBER_NORMS[kind].from_plain if refusal(module) is None else None
    if kind in REGISTERED_NORMS:
        return REGISTERED_NORMS[kind]
    if isinstance(module, (MemberNorm, MemberLinear)):
        return None
    formula = hf_formula(module)
    if formula is not None:
        return functools.partial(from_plain_as, HF_MEMBER_NORMS[formula])
    layout = layer_norm_layout(module)
    if layout == "channels_first":
        return functools.partial(from_plain_as, MemberLayerNorm2d)
    if layout == "channels_last":
        return functools.partial(from_plain_as, MemberLayerNorm)
    return None
