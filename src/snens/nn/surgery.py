"""Model surgery: replace a model's norms by member norms and its head by a member head.

Targets are collected first, then replaced through their parents; a module shared by several
parents becomes one member module shared by the same parents.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm, check_num_members
from snens.nn.registry import MEMBER_NORMS, SUPPORTED, Converter, lookup

__all__ = [
    "ConversionReport",
    "NormSelection",
    "check_initialized",
    "convert_modules",
    "member_modules",
    "only_named",
    "replace_modules",
]

HeadInit = Literal["copy", "reset"]
#: (name, module) pairs; (name, module, why) of the norms with no member version; id -> conversion
_Modules = list[tuple[str, nn.Module]]
_Refused = list[tuple[str, nn.Module, str]]
_Targets = dict[int, Converter]

#: Which norms become member norms, as PEFT's ``target_modules``: a regular expression the
#: whole name must match, a sequence of names or name endings, a function
#: ``(name, module) -> bool``, or None (every norm).
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
        unselected: (module name, type) of the norms ``norms=`` left shared.
        skipped_reasons: (type, reason) of each class in ``skipped``, once.
    """

    num_members: int
    converted: tuple[tuple[str, str, str], ...]
    head: str | None
    skipped: tuple[tuple[str, str], ...] = ()
    params_before: int = 0
    params_after: int = 0
    notes: tuple[str, ...] = ()
    unselected: tuple[tuple[str, str], ...] = ()
    skipped_reasons: tuple[tuple[str, str], ...] = ()

    @property
    def params_added(self) -> int:
        return self.params_after - self.params_before

    @property
    def params_ratio(self) -> float:
        return self.params_after / max(self.params_before, 1)

    def __str__(self) -> str:
        counts = Counter(f"{plain} -> {member}" for _, plain, member in self.converted)
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
    """(name, module) of every member norm and member head."""
    return [
        (name, m) for name, m in model.named_modules() if isinstance(m, (MemberNorm, MemberLinear))
    ]


def _count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def replace_modules(
    model: nn.Module, make: Callable[[str, nn.Module], nn.Module | None]
) -> list[tuple[str, nn.Module, nn.Module]]:
    """Replace, through their parents, every module for which ``make(name, module)`` returns
    a new module (one new module for all the names of one).

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
        for attr, child in list(parent._modules.items()):
            if id(child) in new_of:
                setattr(parent, attr, new_of[id(child)])
    return replaced


def _head_to_replace(
    model: nn.Module, head: str | None, existing: _Modules
) -> tuple[str, nn.Module] | None:
    if head is None or any(isinstance(m, MemberLinear) for _, m in existing):
        return None
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    if head == "auto":
        # exact type: attention's out_proj (NonDynamicallyQuantizableLinear) is not a head
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
    """Replace, in place, every supported norm by its member norm and the head by a member head
    (arguments as :func:`snens.convert`'s).

    Returns:
        A :class:`ConversionReport`.

    Raises:
        TypeError: a bad ``num_members``, an unsupported norm with ``skip_unsupported=False``,
            a registered conversion not returning a member norm of M, a head not ``nn.Linear``.
        ValueError: no supported norm (or ``norms=`` chooses none), a ``norms=`` name matching
            no norm or a bad regular expression, member modules of another M, a bad
            ``head_init``.
    """
    check_num_members(num_members)
    if head_init not in ("copy", "reset"):
        raise ValueError(f"head_init must be 'copy' or 'reset', got {head_init!r}")
    chosen = _norm_selector(norms)
    check_initialized(model)
    params_before = _count_params(model)
    existing = _existing_members(model, num_members)

    targets, refused, unselected = _collect_norms(model, chosen)
    _check_selection(model, norms, targets, refused, unselected)
    if not (skip_unsupported is None or isinstance(skip_unsupported, bool)):
        raise TypeError(
            f"skip_unsupported must be None (the default: leave norms with no member version "
            f"shared and warn), True (the same, silently) or False (all or nothing), got "
            f"{skip_unsupported!r}"
        )
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
    no_head = found is None and head == "auto" and not existing
    notes = ("no nn.Linear found: members share the output layer",) if no_head else ()

    return ConversionReport(
        num_members=num_members,
        converted=tuple(converted),
        head=head_name,
        skipped=tuple((name, type(m).__name__) for name, m, _ in refused),
        params_before=params_before,
        params_after=_count_params(model),
        notes=notes,
        unselected=tuple((name, type(m).__name__) for name, m in unselected),
        skipped_reasons=tuple(
            dict.fromkeys((type(m).__name__, reason) for _, m, reason in refused)
        ),
    )


def _warn_skipped(model: nn.Module, refused: _Refused) -> None:
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


def check_initialized(model: nn.Module) -> None:
    """Raise if a lazy module of ``model`` has not yet run: its tensors have no shape.

    Raises:
        ValueError: naming the tensor and the fix (one forward pass first).
    """
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in tensors:
        if nn.parameter.is_lazy(tensor):
            raise ValueError(
                f"{name} of {type(model).__name__} is an uninitialized parameter or buffer of a "
                "lazy module; run one forward pass on an example batch first, then convert"
            )


def _existing_members(model: nn.Module, num_members: int) -> _Modules:
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
    """A ``norms=`` choosing exactly the modules named ``names`` (None: every norm)."""
    return None if names is None else _Named(names)


class _Named:
    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def __call__(self, name: str, module: nn.Module) -> bool:
        return name in self.names

    def __repr__(self) -> str:
        return f"only_named({sorted(self.names)})"


def _norm_selector(norms: NormSelection) -> Callable[[str, nn.Module], bool] | None:
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
    return name == end or name.endswith("." + end)


def _collect_norms(
    model: nn.Module, chosen: Callable[[str, nn.Module], bool] | None = None
) -> tuple[_Targets, _Refused, _Modules]:
    """(id -> conversion) of the supported norms, (name, module, reason) of the refused ones,
    (name, module) of those ``chosen`` leaves out."""
    targets: _Targets = {}
    inside_targets: set[int] = set()  # modules of a norm replaced whole, or left whole
    refused: _Refused = []
    unselected: _Modules = []
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
    targets: _Targets,
    refused: _Refused,
    unselected: _Modules,
) -> None:
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
    unique = list(dict.fromkeys(names))
    shown = unique[:2] + unique[-1:] if len(unique) > 3 else unique
    return ", ".join(shown) or "(none)"


_REASONS = 4


def _why(refused: _Refused) -> str:
    reasons = list(dict.fromkeys(reason for _, _, reason in refused))
    return "".join(f" {reason}." for reason in reasons[:_REASONS])


def _refuse_unsupported(model: nn.Module, refused: _Refused, all_or_nothing: bool) -> None:
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
    model: nn.Module, targets: _Targets, existing: _Modules, refused: _Refused = ()
) -> None:
    has_member_norms = any(isinstance(m, MemberNorm) for _, m in existing)
    if not targets and not has_member_norms:
        unsupported = f" Its norms have no member version:{_why(refused)}" if refused else ""
        raise ValueError(
            f"{type(model).__name__} has no supported norm layer to convert (looked for "
            f"{SUPPORTED}).{unsupported} σN-Ens members live in the norms, so the model needs "
            "at least one"
        )


def _replace_norms(
    model: nn.Module, targets: _Targets, num_members: int, **kw
) -> list[tuple[str, str, str]]:

    def member_norm(name: str, module: nn.Module) -> MemberNorm | None:
        convert = targets.get(id(module))
        if convert is None:
            return None
        try:
            member = convert(module, num_members, **kw)
        except (TypeError, ValueError) as err:
            error = TypeError if isinstance(err, TypeError) else ValueError
            raise error(f"cannot convert {name} ({type(module).__name__}): {err}") from err
        if not isinstance(member, MemberNorm) or member.num_members != num_members:
            raise TypeError(
                f"converting {name} ({type(module).__name__}) with {convert!r} gave a "
                f"{type(member).__name__} (num_members={getattr(member, 'num_members', None)}); "
                "the conversion registered with snens.nn.register_norm must return a MemberNorm "
                f"with num_members={num_members}"
            )
        return member

    return [
        (name, type(old).__name__, type(new).__name__)
        for name, old, new in replace_modules(model, member_norm)
    ]


def _replace_head(
    model: nn.Module,
    found: tuple[str, nn.Module] | None,
    num_members: int,
    head_init: HeadInit,
    generator: torch.Generator | None,
) -> str | None:
    if found is None:
        return None
    head_name, plain_head = found
    factory = {"device": plain_head.weight.device, "dtype": plain_head.weight.dtype}
    sizes = (plain_head.in_features, plain_head.out_features, num_members)
    member_head = MemberLinear(*sizes, bias=plain_head.bias is not None, **factory)
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
