"""Model surgery: replace a model's norms by member norms and its head by a member head.

Targets are collected first, then replaced through their parent modules, so nested models,
``nn.Sequential``/``nn.ModuleList`` children and modules registered under several names are
all handled. A module object shared by several parents becomes one member module shared by
the same parents: the surgery never aliases state that was not aliased before, and never
splits state that was.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm, check_num_members
from snens.nn.registry import (
    MEMBER_NORMS,
    SUPPORTED,
    Converter,
    lookup,
)

__all__ = [
    "ConversionReport",
    "NormSelection",
    "convert_modules",
    "member_modules",
    "only_named",
    "replace_modules",
]

HeadInit = Literal["copy", "reset"]

#: Which norms become member norms (``norms=`` of :func:`convert_modules`), as PEFT's
#: ``target_modules`` names modules: a regular expression the whole module name must match,
#: a sequence of names (a module is chosen when its name is one of them or ends with
#: ``"." + name``), or a function ``(name, module) -> bool``; None chooses every norm.
NormSelection = str | Sequence[str] | Callable[[str, nn.Module], bool] | None


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`convert_modules` changed.

    Attributes:
        num_members: M.
        converted: (module name, plain type, member type) per replaced norm.
        head: name of the replicated head, or None.
        skipped: (module name, type) of norms with no member version, left as they were,
            shared by the members (``skip_unsupported`` not False).
        params_before, params_after: parameter counts around the surgery.
        unselected: (module name, type) of the norms ``norms=`` left shared (plain).
        skipped_reasons: (type, reason) of each class in ``skipped``, once.
    """

    num_members: int
    converted: tuple[tuple[str, str, str], ...]
    head: str | None
    skipped: tuple[tuple[str, str], ...] = ()
    params_before: int = 0
    params_after: int = 0
    notes: tuple[str, ...] = field(default=())
    unselected: tuple[tuple[str, str], ...] = ()
    skipped_reasons: tuple[tuple[str, str], ...] = ()

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
        lines.append(
            f"  head: {self.head!r} (its name in the model), one copy per member"
            if self.head
            else "  head: none (the output layer is shared)"
        )
        if self.skipped:
            names = ", ".join(f"{n} ({t})" for n, t in self.skipped[:8])
            if len(self.skipped) > 8:
                names += f" and {len(self.skipped) - 8} more"
            lines.append(
                f"  left shared, no member version: {len(self.skipped)} "
                f"norm{'s' if len(self.skipped) > 1 else ''}: {names}"
            )
            lines += [f"    {kind}: {reason}" for kind, reason in self.skipped_reasons]
        if self.unselected:
            first = ", ".join(n for n, _ in self.unselected[:3])
            more = ", …" if len(self.unselected) > 3 else ""
            lines.append(f"  left shared by norms=: {len(self.unselected)} ({first}{more})")
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
    skip_unsupported: bool | None = None,
    gamma_mean: float = 0.0,
    gamma_std: float = 1.0,
    generator: torch.Generator | None = None,
    norms: NormSelection = None,
) -> ConversionReport:
    r"""Replace, in place, every supported norm by its member norm and the head by a member head.

    Which norms are supported, and by which member norm, is decided by
    :func:`snens.nn.registry.lookup`. Every member is set to reproduce the plain layer it
    replaces; with ``head_init="copy"`` each member head is a copy of the plain head, so right
    after conversion every member computes the original function.

    Args:
        model: any ``nn.Module``; modified in place.
        num_members: M.
        head: ``"auto"`` (the last registered ``nn.Linear``), a module name, or None (share
            the output layer between members).
        head_init: ``"copy"`` the plain head into every member, or ``"reset"`` every member
            head to an independent fresh initialization.
        skip_unsupported: what becomes of a norm with no member version: None (the
            default) leaves it shared by the members, names it in the report's ``skipped``
            and warns once; True the same without the warning; False refuses the whole model
            (``TypeError`` naming each such norm, its class and why).
        gamma_mean, gamma_std: gamma ~ N(gamma_mean, gamma_std²).
        generator: optional ``torch.Generator`` for gamma and reset heads.
        norms: which norms to convert, by their names in ``model.named_modules()``: a
            regular expression the whole name must match (``r".*layers\.(2[2-9])\..*"``), a
            sequence of names or name endings (``["input_layernorm", "model.norm"]``), or a
            function ``(name, module) -> bool``; None (the default) converts every norm.
            The others stay plain, shared by the members (the report's ``unselected``); the
            head is replicated either way.

    Returns:
        A :class:`ConversionReport`.

    Raises:
        TypeError: on a bad ``num_members``, an unsupported norm (its name and type in the
            message) with ``skip_unsupported=False``, a registered conversion that does not return
            a member norm with ``num_members``, or a head that is not ``nn.Linear``.
        ValueError: if the model has no supported norm (or ``norms=`` chooses none), a name
            in a ``norms=`` sequence matches no norm, ``norms=`` is not a valid regular
            expression, the model already holds member modules with a different M, or
            ``head_init`` is unknown.
    """
    _check_arguments(num_members, head_init)
    chosen = _norm_selector(norms)
    _check_initialized(model)
    params_before = _count_params(model)
    existing = _existing_members(model, num_members)

    targets, refused, unselected = _collect_norms(model, chosen)
    _check_selection(model, norms, targets, refused, unselected)
    _check_skip_unsupported(skip_unsupported)
    _refuse_unsupported(model, refused, skip_unsupported is False)
    _require_a_norm(model, targets, existing, refused)
    if refused and skip_unsupported is None:
        _warn_skipped(model, refused)
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
        skipped=tuple((name, type(m).__name__) for name, m, _ in refused),
        params_before=params_before,
        params_after=_count_params(model),
        notes=_notes(found, head, existing),
        unselected=tuple((name, type(m).__name__) for name, m in unselected),
        skipped_reasons=tuple(
            dict.fromkeys((type(m).__name__, reason) for _, m, reason in refused)
        ),
    )


def _check_skip_unsupported(skip_unsupported: object) -> None:
    if not (skip_unsupported is None or isinstance(skip_unsupported, bool)):
        raise TypeError(
            f"skip_unsupported must be None (the default: leave norms with no member version "
            f"shared and warn), True (the same, silently) or False (all or nothing), got "
            f"{skip_unsupported!r}"
        )


def _warn_skipped(model: nn.Module, refused: list[tuple[str, nn.Module, str]]) -> None:
    """One warning for a conversion that leaves norms with no member version shared."""
    kinds = list(dict.fromkeys(type(m).__name__ for _, m, _ in refused))
    why = _why(refused).lstrip()
    warnings.warn(
        f"snens.convert left {len(refused)} norm{'s' if len(refused) > 1 else ''} of "
        f"{type(model).__name__} shared by the members, with no member version: "
        f"{', '.join(kinds)} (the report's skipped lists them). {why} Every member still "
        "computes the model at conversion; pass skip_unsupported=True to leave them shared "
        "without this warning, or skip_unsupported=False to refuse the model instead",
        UserWarning,
        stacklevel=4,
    )


def _check_initialized(model: nn.Module) -> None:
    """Refuse lazy modules: they have no shapes to copy into members before a forward pass."""
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


def only_named(names: Sequence[str] | None) -> Callable[[str, nn.Module], bool] | None:
    """A ``norms=`` choosing exactly the modules named ``names`` (None: every norm); how a
    saved ensemble's converted norms are converted again on loading."""
    if names is None:
        return None
    return _Named(names)


class _Named:
    """The ``norms=`` of :func:`only_named`, shown by its names in messages."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def __call__(self, name: str, module: nn.Module) -> bool:
        return name in self.names

    def __repr__(self) -> str:
        return f"only_named({sorted(self.names)})"


def _norm_selector(norms: NormSelection) -> Callable[[str, nn.Module], bool] | None:
    """``norms=`` as a function ``(name, module) -> bool`` (None: every norm), checked."""
    if norms is None or callable(norms):
        return norms
    if isinstance(norms, str):
        try:
            pattern = re.compile(norms)
        except re.error as error:
            raise ValueError(
                f"norms={norms!r} is not a valid regular expression ({error}); a string is "
                "matched against whole module names, a list of strings by name endings"
            ) from error
        return lambda name, _: pattern.fullmatch(name) is not None
    if isinstance(norms, Sequence) and all(isinstance(n, str) and n for n in norms):
        ends = tuple(norms)
        return lambda name, _: any(_ends_with(name, end) for end in ends)
    raise TypeError(
        f"norms must be None, a regular expression, a list of module names or name endings, "
        f"or a function (name, module) -> bool; got {norms!r}"
    )


def _ends_with(name: str, end: str) -> bool:
    """Whether module ``name`` is ``end`` or ends with ``"." + end`` (PEFT's rule)."""
    return name == end or name.endswith("." + end)


def _collect_norms(
    model: nn.Module, chosen: Callable[[str, nn.Module], bool] | None = None
) -> tuple[dict[int, Converter], list[tuple[str, nn.Module, str]], list[tuple[str, nn.Module]]]:
    """(id -> conversion) of every supported norm, (name, module, reason) of every refused
    one, and (name, module) of every norm ``chosen`` leaves out."""
    targets: dict[int, Converter] = {}
    inside_targets: set[int] = set()  # modules of a norm replaced whole, or left whole
    refused: list[tuple[str, nn.Module, str]] = []
    unselected: list[tuple[str, nn.Module]] = []
    memo: dict = {}
    for name, m in model.named_modules():
        if id(m) in inside_targets:
            continue
        found = lookup(m, memo)
        if found is None:
            continue
        if chosen is not None and not chosen(name, m):
            unselected.append((name, m))
            if not isinstance(found, str):
                inside_targets.update(id(child) for child in m.modules())
        elif isinstance(found, str):
            refused.append((name, m, found))
        else:
            targets[id(m)] = found
            inside_targets.update(id(child) for child in m.modules())
    return targets, refused, unselected


def _check_selection(
    model: nn.Module,
    norms: NormSelection,
    targets: dict[int, Converter],
    refused: list[tuple[str, nn.Module, str]],
    unselected: list[tuple[str, nn.Module]],
) -> None:
    """Refuse a ``norms=`` that chooses no norm, or a listed name that matches none."""
    if norms is None:
        return
    ids = set(targets) | {id(m) for _, m, _ in refused} | {id(m) for _, m in unselected}
    names = [n for n, m in model.named_modules() if id(m) in ids]  # in the model's order
    if isinstance(norms, Sequence) and not isinstance(norms, str):
        left_out = {n for n, _ in unselected}
        chosen = [n for n in names if n not in left_out]
        unmatched = [end for end in norms if not any(_ends_with(n, end) for n in chosen)]
        if unmatched:
            raise ValueError(
                f"norms= names {unmatched} match no norm of {type(model).__name__}; its norms "
                f"are named like {_examples(names)}"
            )
    if not targets and not refused and unselected:
        raise ValueError(
            f"norms={norms!r} chooses none of the {len(unselected)} norms of "
            f"{type(model).__name__}, named like {_examples(names)}"
        )


def _examples(names: list[str]) -> str:
    """A few of ``names`` for an error message: the first two and the last."""
    unique = list(dict.fromkeys(names))
    shown = unique[:2] + unique[-1:] if len(unique) > 3 else unique
    return ", ".join(shown) or "(none)"


#: The most distinct reasons a refusal spells out.
_REASONS = 4


def _why(refused: list[tuple[str, nn.Module, str]]) -> str:
    """The first :data:`_REASONS` distinct reasons, each as `` reason.``."""
    reasons = list(dict.fromkeys(reason for _, _, reason in refused))
    return "".join(f" {reason}." for reason in reasons[:_REASONS])


def _refuse_unsupported(
    model: nn.Module, refused: list[tuple[str, nn.Module, str]], all_or_nothing: bool
) -> None:
    """Raise naming the refused norms (the first 8) and why, in the all-or-nothing mode."""
    if not refused or not all_or_nothing:
        return
    listed = ", ".join(f"{n} ({type(m).__name__})" for n, m, _ in refused[:8])
    more = f" and {len(refused) - 8} more" if len(refused) > 8 else ""
    why = _why(refused)
    extra = len({reason for _, _, reason in refused}) - _REASONS
    if extra > 0:
        why += f" ({extra} more reasons.)"
    # torch's own types cannot be registered: for them the reason is the answer
    others = [type(m).__name__ for _, m, _ in refused if type(m) not in MEMBER_NORMS]
    register = (
        f" Register yours with snens.nn.register_norm({others[0]}, <MemberNorm class computing "
        f"it>) or register_norm({others[0]}, from_plain=<function>),"
        if others
        else ""
    )
    raise TypeError(
        f"{type(model).__name__} has norms with no member version: {listed}{more}.{why} "
        f"Supported: {SUPPORTED}.{register} Leave skip_unsupported at its default (None) to "
        "convert the other norms and leave these shared, or replace them with a supported "
        "norm first"
    )


def _require_a_norm(
    model: nn.Module,
    targets: dict[int, Converter],
    existing: list[tuple[str, nn.Module]],
    refused: list[tuple[str, nn.Module, str]] = (),
) -> None:
    """Raise if the model will hold no member norm: nothing to convert and none built in."""
    has_member_norms = any(isinstance(m, MemberNorm) for _, m in existing)
    if not targets and not has_member_norms:
        unsupported = f" Its norms have no member version:{_why(refused)}" if refused else ""
        raise ValueError(
            f"{type(model).__name__} has no supported norm layer to convert (looked for "
            f"{SUPPORTED}).{unsupported} σN-Ens members live in the norms, so the model needs "
            "at least one"
        )


def _replace_norms(
    model: nn.Module, targets: dict[int, Converter], num_members: int, **kw
) -> list[tuple[str, str, str]]:
    """Replace every collected norm by its member norm; (name, plain type, member type) each."""

    def member_norm(name: str, module: nn.Module) -> MemberNorm | None:
        convert = targets.get(id(module))
        return None if convert is None else _member_norm(name, module, convert, num_members, **kw)

    return [
        (name, type(old).__name__, type(new).__name__)
        for name, old, new in replace_modules(model, member_norm)
    ]


def _member_norm(
    name: str, module: nn.Module, convert: Converter, num_members: int, **kw
) -> MemberNorm:
    """``convert(module)``, its errors naming the module, checked to be a member norm of M."""
    try:
        member = convert(module, num_members, **kw)
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
