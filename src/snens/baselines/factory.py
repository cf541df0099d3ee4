"""One factory for every method, for sweeps and the CLI.

    net = snens.baselines.create("batch_ensemble", "resnet18", num_classes=10, num_members=4)
    logits = net(x)  # (M, B, K), whatever the method

Packed-Ensembles take only the backbone names ``resnet18``, ``resnet50``, ``small_cnn``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torch import nn

from snens import models
from snens.baselines.batch_ensemble import batch_ensemble
from snens.baselines.deep_ensemble import DeepEnsemble, reinitialized_copy
from snens.baselines.film import film
from snens.baselines.mc_dropout import MCDropout
from snens.baselines.packed import packed_resnet18, packed_resnet50, packed_small_cnn
from snens.baselines.single import SingleModel
from snens.method.convert import convert
from snens.nn.norms import check_num_members

__all__ = ["DEFAULT_NUM_MEMBERS", "METHODS", "METHOD_RECORDS", "Method", "create", "option_names"]


@dataclass(frozen=True)
class Method:
    """What a method is, for the code that builds, trains and configures it.

    Attributes:
        name: the name :func:`create` and ``method.name`` take.
        one_network: it wraps one network (``model.init_from`` can hand it a trained one).
        member_norms: its norms have an affine of each member's own.
        regularized: the diversity regularizer and ``split`` inputs apply (σN-Ens).
        fixed_members: the number of members it has whatever is asked (1 for ``single``).
    """

    name: str
    one_network: bool
    member_norms: bool = False
    regularized: bool = False
    fixed_members: int | None = None


#: Every method :func:`create` builds, by name: the one table the engine reads.
METHOD_RECORDS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("single", one_network=True, fixed_members=1),
        Method("deep_ensemble", one_network=False),
        Method("batch_ensemble", one_network=True),
        Method("packed", one_network=False),
        Method("film", one_network=True, member_norms=True),
        Method("mc_dropout", one_network=True),
        Method("snens", one_network=True, member_norms=True, regularized=True),
    )
}
#: Every method :func:`create` builds.
METHODS = tuple(METHOD_RECORDS)

#: M when ``num_members`` is not given (the field's standard).
DEFAULT_NUM_MEMBERS = 4

_PACKED = {"resnet18": packed_resnet18, "resnet50": packed_resnet50, "small_cnn": packed_small_cnn}
#: The methods that wrap one network: (model, M, inplace=, **options) → ensemble.
_WRAPPERS = {
    "batch_ensemble": batch_ensemble,
    "film": film,
    "mc_dropout": MCDropout,
    "snens": convert,
}


def create(
    method: str,
    backbone: str | nn.Module,
    num_classes: int | None = None,
    num_members: int | None = None,
    *,
    backbone_options: dict[str, Any] | None = None,
    **options: Any,
) -> nn.Module:
    """Build ``method`` over ``backbone``; the result maps (B, …) to logits (M, B, K).

    ====================  ===========================================================
    method                built as
    ====================  ===========================================================
    ``single``            ``SingleModel(model)``, M = 1
    ``deep_ensemble``     ``DeepEnsemble``: M members, each built under its own seed
                          (a module backbone is copied and re-initialized per member)
    ``batch_ensemble``    ``batch_ensemble(model, M, **options)``
    ``packed``            ``packed_resnet18/50``, ``packed_small_cnn(num_classes, M, …)``
    ``film``              ``film(model, M, **options)``
    ``mc_dropout``        ``MCDropout(model, M, **options)``
    ``snens``             ``snens.convert(model, M, **options)``
    ====================  ===========================================================

    ``backbone`` is a name of :func:`snens.models.available` (built with ``num_classes`` and
    ``backbone_options``) or an ``nn.Module`` (converted or copied, never modified);
    ``num_members`` defaults to 4 (1 for ``single``); ``options`` go to the method
    (:func:`option_names`).

    Returns:
        An ``nn.Module`` of the class in the table, (B, …) -> logits (M, B, K).

    Raises:
        ValueError: an unknown method or option, ``num_members != 1`` for ``single``, a ``packed``
            backbone other than its three names, ``num_members`` out of range,
            ``backbone_options`` with a module backbone, or a size too large for memory.
        TypeError: a backbone neither a name nor an ``nn.Module``; ``num_members`` not an int.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
    if not isinstance(backbone, (str, nn.Module)):
        raise TypeError(
            f"backbone must be a model name ({', '.join(models.available())}) or an nn.Module, "
            f"got {type(backbone).__name__}"
        )
    backbone_options = dict(backbone_options or {})
    _check_options(method, backbone, options)
    try:
        return _create(method, backbone, num_classes, num_members, backbone_options, options)
    except (RuntimeError, MemoryError) as error:
        # a size within its bounds can still be too large for this machine
        if not isinstance(error, MemoryError) and "allocate" not in str(error):
            raise
        raise ValueError(
            f"method {method!r} over {backbone if isinstance(backbone, str) else 'the model'} "
            f"with options {options} needs more memory than this machine has "
            f"({str(error).splitlines()[-1][:160]}); choose smaller sizes"
        ) from None


def _create(
    method: str,
    backbone: str | nn.Module,
    num_classes: int | None,
    num_members: int | None,
    backbone_options: dict[str, Any],
    options: dict[str, Any],
) -> nn.Module:
    if method == "single":
        if num_members not in (None, 1):
            raise ValueError(
                f"method 'single' has one member, got num_members={num_members}; leave it out "
                "or pass 1"
            )
        return SingleModel(_build(backbone, num_classes, backbone_options), **options)

    M = check_num_members(DEFAULT_NUM_MEMBERS if num_members is None else num_members)
    if method == "packed":
        return _packed(backbone, num_classes, M, {**backbone_options, **options})
    if method == "deep_ensemble":

        def member() -> nn.Module:
            if isinstance(backbone, nn.Module):
                return reinitialized_copy(backbone)
            return models.create(backbone, num_classes=num_classes, **backbone_options)

        return DeepEnsemble(member, M, **options)
    # the wrappers of one network; a backbone built here is converted in place, no copy needed
    model = _build(backbone, num_classes, backbone_options)
    return _WRAPPERS[method](model, M, inplace=isinstance(backbone, str), **options)


#: The arguments create() itself gives each builder: an option of the same name would clash.
_GIVEN = {
    "single": ("model",),
    "deep_ensemble": ("models", "num_members"),
    "packed": ("num_members", "num_classes"),
}
_GIVEN_TO_WRAPPERS = ("model", "num_members", "inplace")


def _builder(method: str, backbone: str | nn.Module) -> Any:
    if method == "packed":
        return _PACKED.get(backbone) if isinstance(backbone, str) else None
    return {"single": SingleModel, "deep_ensemble": DeepEnsemble, **_WRAPPERS}[method]


def option_names(method: str, backbone: str | nn.Module) -> tuple[str, ...] | None:
    """The options :func:`create` passes on to ``method``'s builder over ``backbone`` (its
    keyword parameters but those create() gives itself); None for a ``packed`` backbone it
    cannot build.

    Raises:
        ValueError: an unknown method.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
    builder = _builder(method, backbone)
    if builder is None:
        return None
    given = _GIVEN.get(method, _GIVEN_TO_WRAPPERS)
    return tuple(
        name
        for name, p in inspect.signature(builder).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in given
    )


def _check_options(method: str, backbone: str | nn.Module, options: dict[str, Any]) -> None:
    takes = option_names(method, backbone)
    unknown = [k for k in options if takes is not None and k not in takes]
    if unknown:
        raise ValueError(
            f"method {method!r} takes no option {unknown[0]!r}; its options are: "
            f"{', '.join(takes) or 'none'}"
        )


def _packed(backbone: str | nn.Module, num_classes: int | None, M: int, kwargs: dict) -> nn.Module:
    if not isinstance(backbone, str) or backbone not in _PACKED:
        raise ValueError(
            "Packed-Ensembles build their own widened network: backbone must be one of "
            f"{', '.join(_PACKED)}, got {backbone!r}"
        )
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    return _PACKED[backbone](num_members=M, **kwargs)


def _build(backbone: str | nn.Module, num_classes: int | None, options: dict) -> nn.Module:
    if isinstance(backbone, nn.Module):
        if options:
            raise ValueError(
                "backbone_options apply to a backbone built by name; the module was given built"
            )
        return backbone
    return models.create(backbone, num_classes=num_classes, **options)
