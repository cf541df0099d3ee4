"""Conversion: any model with norm layers becomes a σN-Ens ensemble.

:func:`convert` copies the model, replaces its norms and head by member layers with
:func:`snens.nn.surgery.convert_modules` (the layer surgery, which converts a model in place
without wrapping it) and wraps the result in an :class:`~snens.method.ensemble.Ensemble`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from snens.method.config import SnensConfig
from snens.method.ensemble import Ensemble, InputPolicy
from snens.nn.norms import check_num_members
from snens.nn.surgery import NormSelection, check_initialized, convert_modules

__all__ = ["convert"]


def _check_not_an_ensemble(model: nn.Module) -> None:
    """Refuse an :class:`Ensemble`, or a model holding one: converting it again would nest one
    ensemble in another and fail far from the cause. Plain member norms still convert."""
    for name, module in model.named_modules():
        if isinstance(module, Ensemble):
            what = f"a σN-Ens ensemble with M={module.num_members} members"
            where = f"already holds {what} (its module {name!r})" if name else f"is already {what}"
            raise TypeError(
                f"model {where}; converting it again would nest one ensemble in another. "
                "Convert the original model instead (a notebook cell "
                "`model = snens.convert(model, M)` run twice converts its own output: keep the "
                "original under another name), or use the ensemble as it is"
            )


def convert(
    model: nn.Module,
    num_members: int | SnensConfig,
    *,
    head: str | None = "auto",
    head_init: Literal["copy", "reset"] = "copy",
    skip_unsupported: bool | None = None,
    gamma_mean: float = 0.0,
    gamma_std: float = 1.0,
    generator: torch.Generator | None = None,
    input_policy: InputPolicy = "repeat",
    output: Callable[[Any], Tensor] | None = None,
    inplace: bool = False,
    norms: NormSelection = None,
) -> Ensemble:
    r"""Turn any model with norm layers into a σN-Ens ensemble of ``num_members`` members.

    Every supported norm (BatchNorm1d/2d/3d, LayerNorm, GroupNorm, RMSNorm, and other libraries'
    norms recognized by what they compute, Hugging Face's RMS and layer norms among them) becomes
    a member norm ``σ(γ_m) ⊙ norm_m(x)`` with per-member statistics and affine, and the head is
    replicated per member (:func:`snens.nn.surgery.convert_modules`); the model is then wrapped
    in an :class:`Ensemble`. Right after conversion, in eval mode, every member computes the
    original model's function (with ``head_init="copy"``).

    Args:
        model: any ``nn.Module``, including Hugging Face models (their ``.logits`` are used).
        num_members: M, from 1 to :data:`snens.nn.norms.MAX_MEMBERS`; or a
            :class:`~snens.method.config.SnensConfig`, which gives M, every option below that it
            holds (not passed again), and τ, λ and γ's learning-rate multiplier for training.
            The ensemble keeps it as ``ensemble.snens_config``.
        head: the layer replicated per member: ``"auto"`` (the default) the last ``nn.Linear``
            registered in the model; a name from ``model.named_modules()`` (e.g.
            ``"classifier.1"``) another ``nn.Linear``; ``None`` shares the output layer (a causal
            LM's vocabulary head), the members then differing through their norms only.
        head_init: ``"copy"`` (the default) copies the plain head into every member;
            ``"reset"`` gives each member head a fresh initialization (a new task's head).
        skip_unsupported: what becomes of a norm with no member version (e.g.
            ``LocalResponseNorm``; ``snens.nn.registry.refusal`` says why). ``None`` (the
            default): it stays shared by the members, ``report.skipped`` names it, and one
            ``UserWarning`` says so; ``True``: the same, without the warning; ``False``: it
            refuses the whole model with a ``TypeError`` naming it, its class and why.
        gamma_mean: the mean of the importance logits γ, drawn for every member and feature;
            each member's affine is set so that it reproduces the plain layer all the same.
        gamma_std: their standard deviation: γ ~ N(gamma_mean, gamma_std²) differs between the
            members from the start, so the diversity regularizer has a gradient to follow.
        generator: a ``torch.Generator`` for γ and the reset heads (torch's global random state
            is then neither used nor advanced).
        input_policy: what the members see of a training batch of B examples: ``"repeat"``
            (every member the whole batch) or ``"split"`` (member m the m-th of M equal parts;
            B divisible by M). Evaluation always repeats. Settable later as
            ``ensemble.input_policy``.
        output: a function picking the logits from the model's output; the default takes a
            tensor as it is, a Hugging Face output's ``.logits``, or a tuple's first element.
        inplace: convert ``model`` itself instead of a deep copy of it.
        norms: convert only these norms, by name in ``model.named_modules()``: a regular
            expression the whole name must match (``r".*layers\.(2[2-9])\..*"``), a list of
            names or name endings (``["post_attention_layernorm", "model.norm"]``), or a
            function ``(name, module) -> bool``; the others stay plain, shared by the members
            (``report.unselected``). Default: every norm.

    Returns:
        An :class:`Ensemble`; its ``report`` says what was converted and the parameters added.

    Raises:
        TypeError: bad ``num_members``; a config together with one of the options it holds;
            an unsupported norm with ``skip_unsupported=False``; a head that is not
            ``nn.Linear``; ``model`` is (or holds) an :class:`Ensemble` already; a TorchScript
            module.
        ValueError: ``num_members < 1``; no supported norm in the model (the unsupported
            ones named with their reasons).

    Warns:
        UserWarning: once, where norms with no member version are left shared
            (``skip_unsupported=None``, the default).
    """
    config = _config_of(
        num_members,
        head=head,
        head_init=head_init,
        skip_unsupported=skip_unsupported,
        gamma_mean=gamma_mean,
        gamma_std=gamma_std,
        input_policy=input_policy,
        norms=norms,
    )
    if not callable(norms):
        norms = config.norms
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            f"convert takes an eager nn.Module, got a TorchScript {type(model).__name__} "
            "(torch.jit.script or torch.jit.trace), whose layers cannot be replaced: convert "
            "the module before scripting it; for deployment, export the ensemble with "
            "snens.export or snens.export_onnx"
        )
    _check_not_an_ensemble(model)
    check_initialized(model)  # before the copy, which a lazy module's tensors fail
    try:
        target = model if inplace else copy.deepcopy(model)
    except RuntimeError as error:
        if "deepcopy" not in str(error):
            raise
        raise TypeError(
            f"convert copies the model first, and this {type(model).__name__} cannot be copied "
            f"({str(error).split('.')[0]}): a legacy torch.nn.utils.weight_norm hook or a "
            "non-leaf tensor attribute. Use torch.nn.utils.parametrizations.weight_norm, or "
            "convert the model itself with convert(model, M, inplace=True)"
        ) from error
    report = convert_modules(
        target,
        config.num_members,
        head=config.head,
        head_init=config.head_init,
        skip_unsupported=config.skip_unsupported,
        gamma_mean=config.gamma_mean,
        gamma_std=config.gamma_std,
        generator=generator,
        norms=norms,
    )
    return Ensemble(
        target,
        config.num_members,
        input_policy=config.input_policy,
        output=output,
        report=report,
        config=config,
    )


def _config_of(num_members: int | SnensConfig, **options: Any) -> SnensConfig:
    """The config ``convert`` builds with: the one given, or one of M and the options."""
    if isinstance(num_members, SnensConfig):
        defaults = {f.name: f.default for f in dataclasses.fields(SnensConfig)}
        # a function choosing the norms is not plain data: it goes beside a config
        given = [
            k
            for k, v in options.items()
            if not callable(v) and v is not defaults[k] and v != defaults[k]
        ]
        if given:
            raise TypeError(
                f"convert got a SnensConfig and {', '.join(f'{k}=' for k in given)} as well; "
                f"set {'them' if len(given) > 1 else 'it'} in the config: "
                f"convert(model, config.replace({given[0]}=...))"
            )
        return num_members
    check_num_members(num_members)
    norms = options.pop("norms")  # a list is kept as a tuple by the config
    return SnensConfig(num_members=num_members, norms=None if callable(norms) else norms, **options)
