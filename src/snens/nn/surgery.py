"""Model surgery: replace a model's norms by member norms and its head by a member head.

Targets are collected first, then replaced through their parent modules, so nested models,
``nn.Sequential``/``nn.ModuleList`` children and modules registered under several names are
all handled. A module object shared by several parents becomes one member module shared by
the same parents: the surgery never aliases state that was not aliased before, and never
splits state that was.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from snens.nn.adapters import REGISTERED_NORMS, Converter, member_converter
from snens.nn.factory import MEMBER_NORMS, refusal
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm, check_num_members

__all__ = [
    "ConversionReport",
    "convert_modules",
    "is_norm",
    "is_unsupported_norm",
    "member_modules",
    "replace_modules",
]

HeadInit = Literal["copy", "reset"]

# Norm families torch ships; beyond MEMBER_NORMS' exact types (subclasses, LocalResponseNorm, …)
# they have no member version.
_NORM_BASES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
    nn.CrossMapLRN2d,
)

# "LayerNorm", "T5LayerNorm", "FrozenBatchNorm2d", "RMSNormGated" — but not "Normalize".
_NORM_NAME = re.compile(r"Norm(?:$|[A-Z0-9])")

_SUPPORTED = (
    f"{', '.join(t.__name__ for t in MEMBER_NORMS)} (instance norms without running "
    "statistics); Hugging Face RMS norms whose forward is "
    "the Llama, Gemma, Gemma 3n, T5 or OLMo-2 formula, Cohere and OLMo-1 layer norms; "
    "LayerNorm subclasses normalizing over channels first "
    "(LayerNorm2d, ConvNextLayerNorm) or last; types registered with snens.nn.register_norm"
)


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`convert_modules` changed.

    Attributes:
        num_members: M.
        converted: (module name, plain type, member type) per replaced norm.
        head: name of the replicated head, or None.
        skipped: (module name, type) of unsupported norms left as they were.
        params_before, params_after: parameter counts around the surgery.
    """

    num_members: int
    converted: tuple[tuple[str, str, str], ...]
    head: str | None
    skipped: tuple[tuple[str, str], ...] = ()
    params_before: int = 0
    params_after: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def params_added(self) -> int:
        return self.params_after - self.params_before

    @property
    def params_ratio(self) -> float:
        """params_after / params_before (≈ 1.006 for a CIFAR ResNet-18 at M=4)."""
        return self.params_after / max(self.params_before, 1)

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for _, plain, member in self.converted:
            key = f"{plain} -> {member}"
            counts[key] = counts.get(key, 0) + 1
        lines = [f"snens conversion, num_members={self.num_members}"]
        lines += [f"  {n:4d} × {key}" for key, n in counts.items()]
        lines.append(f"  head: {self.head or 'none (shared output layer)'}")
        if self.skipped:
            names = ", ".join(f"{n} ({t})" for n, t in self.skipped)
            lines.append(f"  skipped unsupported norms: {names}")
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(
            f"  parameters: {self.params_before:,} -> {self.params_after:,} "
            f"(+{self.params_added:,}, ×{self.params_ratio:.4f})"
        )
        return "\n".join(lines)


def member_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every member norm and member head, in registration order."""
    return [
        (name, m) for name, m in model.named_modules() if isinstance(m, (MemberNorm, MemberLinear))
    ]


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalization layer — the one definition that conversion,
    parameter groups (no weight decay) and fine-tuning (``norms_and_heads``) share.

    A member norm, a torch norm family (batch, layer, group, RMS, instance, local response
    norms), a type registered with ``snens.nn.register_norm``, or a leaf module whose class
    name says "…Norm" (a Hugging Face ``T5LayerNorm``, ``LlamaRMSNorm``, ``FrozenBatchNorm2d``).
    """
    return (
        isinstance(module, MemberNorm)
        or type(module) in MEMBER_NORMS
        or is_unsupported_norm(module)
    )


def is_unsupported_norm(module: nn.Module) -> bool:
    """True for a normalization layer that is not one of the exact torch types of
    ``MEMBER_NORMS``.

    Torch norm families other than those exact types (subclasses may change forward), types
    registered with ``snens.nn.register_norm``, and leaf modules whose class name says "…Norm"
    (e.g. a Hugging Face ``T5LayerNorm``). :func:`convert_modules` converts what
    ``snens.nn.adapters.member_converter`` finds first and refuses the rest of these; a
    conversion with a table of exact types of its own (FiLM) refuses all of them.
    """
    if isinstance(module, (MemberNorm, MemberLinear)):
        return False
    if type(module) in MEMBER_NORMS:  # a setting its member version does not compute
        return refusal(module) is not None
    if isinstance(module, _NORM_BASES) or type(module) in REGISTERED_NORMS:
        return True
    has_children = next(module.children(), None) is not None
    return not has_children and _NORM_NAME.search(type(module).__name__) is not None


def _count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def replace_modules(
    model: nn.Module, make: Callable[[str, nn.Module], nn.Module | None]
) -> list[tuple[str, nn.Module, nn.Module]]:
    """Replace, through their parents, every module for which ``make(name, module)`` returns
    a new module. Targets are collected before anything changes; a module registered under
    several names is replaced by one new module under all of them.

    Returns:
        (first name, old module, new module) per replaced module, in registration order.
    """
    new_of: dict[int, nn.Module] = {}
    replaced = []
    for name, module in model.named_modules():
        new = make(name, module)
        if new is not None:
            new_of[id(module)] = new
            replaced.append((name, module, new))
    for _, parent in list(model.named_modules(remove_duplicate=False)):
        # _modules, not named_children(): the latter skips a child registered twice.
        for attr, child in list(parent._modules.items()):
            if id(child) in new_of:
                setattr(parent, attr, new_of[id(child)])
    return replaced


def _find_head(model: nn.Module, head: str | None) -> tuple[str, nn.Module] | None:
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    if head is None:
        return None
    if head == "auto":
        # The last registered nn.Linear; exact type, so attention's out_proj
        # (a NonDynamicallyQuantizableLinear) is never mistaken for the head.
        return linears[-1] if linears else None
    if not isinstance(head, str):
        raise TypeError(f"head must be 'auto', a module name or None, got {head!r}")
    try:
        module = model.get_submodule(head)
    except AttributeError:
        names = ", ".join(n for n, _ in linears[-5:]) or "none"
        raise ValueError(
            f"head={head!r} is not a submodule of {type(model).__name__}; its last linear "
            f"layers are: {names}"
        ) from None
    if type(module) is not nn.Linear:
        raise TypeError(
            f"head={head!r} is a {type(module).__name__}; the head must be an nn.Linear "
            "(pass head=None to share the output layer between members)"
        )
    return head, module


def convert_modules(
    model: nn.Module,
    num_members: int,
    *,
    head: str | None = "auto",
    head_init: HeadInit = "copy",
    skip_unsupported: bool = False,
    gamma_mean: float = 0.0,
    gamma_std: float = 1.0,
    generator: torch.Generator | None = None,
) -> ConversionReport:
    """Replace, in place, every supported norm by its member norm and the head by a member head.

    Which norms are supported, and by which member norm, is decided by
    ``snens.nn.adapters.member_converter``: torch's norms, Hugging Face RMS norms and
    channels-first LayerNorms it recognises, and types registered with
    ``snens.nn.register_norm``. Every member is set to reproduce the plain layer it replaces (see
    ``MemberNorm.from_plain``); with ``head_init="copy"`` each member head is a copy of the
    plain head, so right after conversion every member computes the original function.

    Args:
        model: any ``nn.Module``; modified in place.
        num_members: M.
        head: ``"auto"`` (the last registered ``nn.Linear``), a module name, or None (share
            the output layer between members).
        head_init: ``"copy"`` the plain head into every member, or ``"reset"`` every member
            head to an independent fresh initialization.
        skip_unsupported: leave norms with no member version as they are instead of raising.
        gamma_mean, gamma_std: gamma ~ N(gamma_mean, gamma_std²).
        generator: optional ``torch.Generator`` for gamma and reset heads.

    Returns:
        A :class:`ConversionReport`.

    Raises:
        TypeError: on a bad ``num_members``, an unsupported norm (its name and type in the
            message) unless ``skip_unsupported``, a registered conversion that does not return
            a member norm with ``num_members``, or a head that is not ``nn.Linear``.
        ValueError: if the model has no supported norm, already holds member modules with a
            different M, or ``head_init`` is unknown.
    """
    _check_arguments(num_members, head_init)
    _check_initialized(model)
    params_before = _count_params(model)
    existing = _existing_members(model, num_members)

    targets, unsupported = _collect_norms(model)
    _refuse_unsupported(model, unsupported, skip_unsupported)
    _require_a_norm(model, targets, existing)
    if head not in ("auto", None):  # a bad head name fails before anything is replaced
        _head_to_replace(model, head, existing)

    converted = _replace_norms(
        model, targets, num_members, gamma_mean=gamma_mean, gamma_std=gamma_std, generator=generator
    )
    found = _head_to_replace(model, head, existing)
    head_name = _replace_head(model, found, num_members, head_init, generator)

    return ConversionReport(
        num_members=num_members,
        converted=tuple(converted),
        head=head_name,
        skipped=tuple(unsupported),
        params_before=params_before,
        params_after=_count_params(model),
        notes=_notes(found, head, existing),
    )


def _check_initialized(model: nn.Module) -> None:
    """Lazy modules have no shapes to copy into members until their first forward pass."""
    for name, param in model.named_parameters():
        if isinstance(param, nn.parameter.UninitializedParameter):
            raise ValueError(
                f"{name} of {type(model).__name__} is an uninitialized parameter of a lazy "
                "module; run one forward pass on an example batch first, then convert"
            )


def _check_arguments(num_members: int, head_init: HeadInit) -> None:
    """Refuse a bad ``num_members`` or an unknown ``head_init``, before the model is touched."""
    check_num_members(num_members)
    if head_init not in ("copy", "reset"):
        raise ValueError(f"head_init must be 'copy' or 'reset', got {head_init!r}")


def _existing_members(model: nn.Module, num_members: int) -> list[tuple[str, nn.Module]]:
    """The model's member modules already there, refused when their M is not ``num_members``."""
    existing = member_modules(model)
    for name, m in existing:
        if m.num_members != num_members:
            raise ValueError(
                f"{name} is already a {type(m).__name__} with num_members={m.num_members}, "
                f"but num_members={num_members} was asked for; build the model with "
                f"member_norm({num_members}) or convert with num_members={m.num_members}"
            )
    return existing


def _collect_norms(model: nn.Module) -> tuple[dict[int, Converter], list[tuple[str, str]]]:
    """(id -> conversion) of every supported norm, and (name, type) of every unsupported one."""
    targets: dict[int, Converter] = {}
    inside_targets: set[int] = set()  # modules of a registered norm that is replaced whole
    unsupported: list[tuple[str, str]] = []
    for name, m in model.named_modules():
        if id(m) in inside_targets:
            continue
        convert = member_converter(m)
        if convert is not None:
            targets[id(m)] = convert
            inside_targets.update(id(child) for child in m.modules())
        elif is_unsupported_norm(m):
            unsupported.append((name, type(m).__name__))
    return targets, unsupported


def _refuse_unsupported(
    model: nn.Module, unsupported: list[tuple[str, str]], skip_unsupported: bool
) -> None:
    """Raise naming the unsupported norms (the first 8) unless they are to be skipped."""
    if not unsupported or skip_unsupported:
        return
    listed = ", ".join(f"{n} ({t})" for n, t in unsupported[:8])
    more = f" and {len(unsupported) - 8} more" if len(unsupported) > 8 else ""
    # a supported type in a setting its member version does not compute: the reason, not
    # registration (torch's own types cannot be registered)
    reasons = {
        name: reason
        for name, _ in unsupported
        if (reason := refusal(model.get_submodule(name))) is not None
    }
    why = "".join(f" {reason}." for reason in sorted(set(reasons.values())))
    others = [kind for name, kind in unsupported if name not in reasons]
    register = (
        f" Register yours with snens.nn.register_norm({others[0]}, <MemberNorm class computing "
        f"it>) or register_norm({others[0]}, from_plain=<function>),"
        if others
        else ""
    )
    raise TypeError(
        f"{type(model).__name__} has norms with no member version: {listed}{more}.{why} "
        f"Supported: {_SUPPORTED}.{register} Pass skip_unsupported=True to leave them shared, "
        "or replace them with a supported norm first"
    )


def _require_a_norm(
    model: nn.Module, targets: dict[int, Converter], existing: list[tuple[str, nn.Module]]
) -> None:
    """Raise if the model will hold no member norm: nothing to convert and none built in."""
    has_member_norms = any(isinstance(m, MemberNorm) for _, m in existing)
    if not targets and not has_member_norms:
        raise ValueError(
            f"{type(model).__name__} has no supported norm layer to convert (looked for "
            f"{_SUPPORTED}); σN-Ens members live in the norms, so the model needs at least one"
        )


def _replace_norms(
    model: nn.Module,
    targets: dict[int, Converter],
    num_members: int,
    *,
    gamma_mean: float,
    gamma_std: float,
    generator: torch.Generator | None,
) -> list[tuple[str, str, str]]:
    """Replace every collected norm by its member norm; (name, plain type, member type) each."""

    def member_norm(name: str, module: nn.Module) -> MemberNorm | None:
        convert = targets.get(id(module))
        if convert is None:
            return None
        return _member_norm(
            name,
            module,
            convert,
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            generator=generator,
        )

    return [
        (name, type(old).__name__, type(new).__name__)
        for name, old, new in replace_modules(model, member_norm)
    ]


def _member_norm(
    name: str,
    module: nn.Module,
    convert: Converter,
    num_members: int,
    *,
    gamma_mean: float,
    gamma_std: float,
    generator: torch.Generator | None,
) -> MemberNorm:
    """``convert(module)``, its errors naming the module, checked to be a member norm of M."""
    try:
        member = convert(
            module,
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            generator=generator,
        )
    except (TypeError, ValueError) as err:
        error = TypeError if isinstance(err, TypeError) else ValueError
        raise error(f"cannot convert {name} ({type(module).__name__}): {err}") from err
    if not isinstance(member, MemberNorm) or member.num_members != num_members:
        got = getattr(member, "num_members", None)
        raise TypeError(
            f"converting {name} ({type(module).__name__}) with {convert!r} gave a "
            f"{type(member).__name__} (num_members={got}); the conversion registered with "
            f"snens.nn.register_norm must return a MemberNorm with num_members={num_members}"
        )
    return member


def _head_to_replace(
    model: nn.Module, head: str | None, existing: list[tuple[str, nn.Module]]
) -> tuple[str, nn.Module] | None:
    """(name, plain head) to replicate; None when the model already has a member head."""
    if any(isinstance(m, MemberLinear) for _, m in existing):
        return None
    return _find_head(model, head)


def _replace_head(
    model: nn.Module,
    found: tuple[str, nn.Module] | None,
    num_members: int,
    head_init: HeadInit,
    generator: torch.Generator | None,
) -> str | None:
    """Replace the plain head by a member head through its parents; the head's name, or None."""
    if found is None:
        return None
    head_name, plain_head = found
    member_head = MemberLinear(
        plain_head.in_features,
        plain_head.out_features,
        num_members,
        bias=plain_head.bias is not None,
        device=plain_head.weight.device,
        dtype=plain_head.weight.dtype,
    )
    if head_init == "copy":
        member_head.load_plain(plain_head)
    elif generator is not None:
        bound = plain_head.in_features**-0.5
        with torch.no_grad():
            for p in member_head.parameters():
                noise = torch.rand(p.shape, generator=generator, dtype=torch.float32)
                p.copy_(noise.mul_(2 * bound).sub_(bound))
    member_head.train(plain_head.training)
    replace_modules(model, lambda _, m: member_head if m is plain_head else None)
    return head_name


def _notes(
    found: tuple[str, nn.Module] | None, head: str | None, existing: list[tuple[str, nn.Module]]
) -> tuple[str, ...]:
    """The report's notes: a model with no head to replicate under ``head="auto"``."""
    if found is None and head == "auto" and not existing:
        return ("no nn.Linear found: members share the output layer",)
    return ()
