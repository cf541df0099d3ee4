"""A finished or interrupted run's model and metrics again, from its directory, with the
checkpoint checks and validation metrics the engine uses when it resumes and trains."""

from __future__ import annotations

import dataclasses
import errno
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from snens.engine.build import build_model, reproducible, resolve_device, text_encoder
from snens.engine.checkpoint import (
    CheckpointError,
    check_training_state,
    load_checkpoint,
    load_model_state,
)
from snens.engine.config import RunConfig, from_dict, to_dict, with_evaluation_settings
from snens.engine.datasets import build_data, data_shape
from snens.engine.runs import CONFIG, RunDirError, config_differences, read_config
from snens.engine.selection import selected_state
from snens.evaluation.protocol import collect, evaluate, held_out_metrics

__all__ = ["check_progress", "evaluate_run", "load_run_model", "saved_config", "validation_metrics"]


def check_progress(state: Mapping[str, Any], checkpoint: Path, epochs: int) -> None:
    """Check that a checkpoint's counters, optimizer and schedule states are what training
    can have written (its digest proves the file whole, not its values).

    Raises:
        CheckpointError: what is impossible, named, with the file and the way on.
    """

    def count(key: str, low: int, high: float) -> int:
        value = state.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise CheckpointError(
                f"{checkpoint}: {key} = {value!r} is not an int in {low}..{high}, so the file "
                "was not written by this run's training; resume from prev.pt (copy it over "
                "last.pt) or start the run again"
            )
        return value

    count("epoch", 0, epochs)
    count("skipped_steps", 0, count("step", 0, math.inf))
    seconds = state.get("seconds", 0.0)
    number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not (number and math.isfinite(seconds) and seconds >= 0):
        raise CheckpointError(
            f"{checkpoint}: seconds = {seconds!r} is not a finite number >= 0; resume from "
            "prev.pt (copy it over last.pt) or start the run again"
        )
    check_training_state(state, checkpoint)


def final_metrics(
    model: nn.Module,
    loaded: Any,
    config: RunConfig,
    ood_score: str | Sequence[str] = "msp",
    validation: Mapping[str, Tensor] | None = None,
) -> tuple[dict[str, float], dict[str, Tensor]]:
    """The metrics ``final.json`` holds of a model on a run's data, and the member logits it
    keeps (``outputs.npz``); ``validation``: the validation logits (``"val"``, ``"val_labels"``)
    already computed for this model."""
    outputs: dict[str, Tensor] = {}
    metrics = evaluate(
        model,
        loaded.test,
        ood=loaded.ood,
        corruptions=loaded.corruptions,
        ood_score=ood_score,
        keep_logits=outputs,
        domains=loaded.domains,
    )
    if loaded.validation is not None:
        if validation is None:
            outputs["val"], outputs["val_labels"] = collect(model, loaded.validation, logits=True)
        else:
            outputs.update(val=validation["val"], val_labels=validation["val_labels"])
    settings = {
        k: getattr(config.data, k) for k in ("ood_scores", "conformal_alpha", "calibrators")
    }
    return {**metrics, **held_out_metrics(outputs, **settings)}, outputs


def validation_metrics(
    model: nn.Module,
    loader: Any,
    names: tuple[str, ...] | None = None,
    keep_logits: dict | None = None,
) -> dict[str, float]:
    """``val/<metric>`` of the ensemble on the validation set (all test metrics, or ``names``);
    ``keep_logits`` receives its member logits as ``"val"`` and labels as ``"val_labels"``."""
    kept: dict = {}
    values = evaluate(model, loader, keep_logits=kept)
    if keep_logits is not None:
        keep_logits.update(val=kept["test"], val_labels=kept["test_labels"])
    keep = {f"test/{n}" for n in names} if names else values.keys()
    return {"val/" + k.removeprefix("test/"): v for k, v in values.items() if k in keep}


def saved_config(state: Mapping[str, Any], checkpoint: Path) -> dict[str, Any]:
    """The config (as dicts) a checkpoint was trained with, a key added since at its default.

    Raises:
        CheckpointError: a config this version cannot read.
    """
    try:
        return to_dict(from_dict(state["config"]))
    except (ValueError, TypeError) as error:
        raise CheckpointError(
            f"{checkpoint} holds a config this version of snens cannot read ({error}); "
            "evaluate or resume it with the snens version that trained it"
        ) from error


def load_run_model(
    run_dir: str | os.PathLike, *, selected: bool = True
) -> tuple[nn.Module, RunConfig, dict[str, Any]]:
    """A run's model, rebuilt from its config.toml and loaded from its verified last.pt, with
    the weights it selected (``best.pt``) unless ``selected`` is False.

    Returns:
        ``(model, config, state)``: the model on the run's device (in training mode), the
        run's config and the checkpoint.

    Raises:
        RunDirError: not a run directory, or its config.toml is not a regular file (a
            directory, FIFO, link) or is above ``runs.MAX_FILE_BYTES``; the message names it.
        ValueError, TypeError: its config.toml is not UTF-8 TOML, or not a valid config.
        FileNotFoundError: the run has no last.pt.
        CheckpointError: last.pt or best.pt is damaged, missing or does not fit, or the
            config changed since training.
    """
    path = Path(run_dir)
    try:  # a regular file of at most runs.MAX_FILE_BYTES, never through a link
        config = read_config(path)
    except FileNotFoundError:
        raise RunDirError(f"{path} is not a run directory (no {CONFIG})") from None
    except RunDirError as error:
        if error.errno != errno.ENOTDIR:  # a directory, FIFO or link there, or too large
            raise  # ENOTDIR: run_dir is a file
        raise RunDirError(f"{path} is not a run directory (no {CONFIG})") from None
    state = load_checkpoint(path / "last.pt")
    saved = saved_config(state, path / "last.pt")
    if saved != to_dict(config):
        changed = config_differences(saved, to_dict(config))
        raise CheckpointError(
            f"{path / CONFIG} differs from the config {path / 'last.pt'} was trained with "
            f"({'; '.join(changed)}); evaluating it would score other data or another model "
            "as this run's. Restore config.toml, or train a new run with the new settings"
        )
    check_progress(state, path / "last.pt", config.optim.epochs)
    num_classes, channels = data_shape(config.data)
    with reproducible(config):
        torch.manual_seed(config.seed)
        model = build_model(config, num_classes=num_classes, channels=channels)
        weights = state["model"]
        if selected and config.optim.select:
            weights, _ = selected_state(model, path, state, config.optim.select)
        load_model_state(model, weights)
        model.to(resolve_device(config.device))
    return model, config, state


def evaluate_run(
    run_dir: str | os.PathLike,
    *,
    ood_score: str | Sequence[str] = "msp",
    corruptions: bool = True,
    validation: bool = True,
    ood_scores: Sequence[str] | None = None,
    conformal_alpha: float | None = None,
    calibrators: Sequence[str] | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """Re-evaluate a run (:func:`load_run_model`) on its data with its threads and determinism
    settings, reproducing ``final.json``'s metrics.

    ``corruptions`` / ``validation`` False leave those sets out; ``ood_scores``,
    ``conformal_alpha`` and ``calibrators`` replace the run's ``data.*`` (None keeps them).

    Returns:
        ``(metrics, state)``: the metrics as in ``final.json``, and the checkpoint.

    Raises:
        RunDirError, FileNotFoundError, CheckpointError: see :func:`load_run_model`.
        ValueError: an override the config refuses, or α or calibrators without a
            validation split.
    """
    model, config, state = load_run_model(run_dir)
    data_config = with_evaluation_settings(
        dataclasses.replace(
            config.data,
            corruptions=config.data.corruptions and corruptions,
            validation_examples=config.data.validation_examples if validation else 0,
        ),
        ood_scores=ood_scores,
        conformal_alpha=conformal_alpha,
        calibrators=calibrators,
    )
    fitted = conformal_alpha is not None or bool(calibrators)
    if fitted and data_config.validation_examples == 0:
        why = "it has none" if validation else "validation=False leaves it out"
        raise ValueError(
            f"conformal sets and calibrators are fitted on the run's validation split, and "
            f"{why} (data.validation_examples = {config.data.validation_examples}); train a run "
            "with data.validation_examples > 0 to measure them"
        )
    if not data_config.validation_examples and config.optim.select:
        # the selected weights are loaded already: this config only says which data to score
        config = dataclasses.replace(
            config, optim=dataclasses.replace(config.optim, select="", patience=0)
        )
    config = dataclasses.replace(config, data=data_config)
    with reproducible(config):
        device = resolve_device(config.device)
        loaded = build_data(
            data_config, seed=config.seed, device=device, encoder=text_encoder(config)
        )
        metrics, _ = final_metrics(model, loaded, config, ood_score=ood_score)
    return metrics, state
