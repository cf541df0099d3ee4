"""The training engine: one readable function from a :class:`~snens.engine.config.RunConfig`
to a run.

:func:`train` reads top to bottom: seed → data → model → parameter groups → optimizer →
schedule (per step) → per epoch: :func:`run_epoch` → one line of metrics.jsonl → checkpoint
(atomic) → at the end: snens.evaluate → final.json.

A checkpoint holds the model, optimizer, schedule, all RNG states, epoch and step, so
``train(config, resume=True)`` ends with the same final metrics as a run never interrupted —
bitwise on the CPU with ``deterministic = true`` and the same ``threads``; bf16 and
``torch.compile`` may pick other kernels on other hardware.

The public names of :mod:`~snens.engine.build`, :mod:`~snens.engine.reload` and
:mod:`~snens.engine.fit` are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from snens.baselines import METHOD_RECORDS
from snens.engine import checkpoint, distributed, reload
from snens.engine.build import (
    build_model,
    build_optimizer,
    build_schedule,
    init_from_path,
    lr_factor,
    read_init_from,
    reproducible,
    resolve_device,
    seed_everything,
    select_finetune,
    text_encoder,
)
from snens.engine.config import RunConfig, to_dict
from snens.engine.datasets import Data, build_data
from snens.engine.epoch import EpochStats, NonFiniteLossError, StepSettings, run_epoch
from snens.engine.fit import TrainResult, fit, predict
from snens.engine.memory import PeakMemory, peak_over
from snens.engine.reload import evaluate_run, load_run_model, validation_metrics
from snens.engine.runs import (
    Run,
    _run_path,
    create_run,
    hold_run,
    open_run,
    read_metrics,
    refuse_existing_run,
)
from snens.engine.selection import BEST, Selection, _restore_checkpoint
from snens.evaluation.bootstrap import run_examples
from snens.evaluation.predictions import progress_bars
from snens.evaluation.protocol import evaluate
from snens.method.allocation import allocation, mean_effective_members
from snens.method.optim import param_groups
from snens.method.regularizer import diversity_gain, optimal_k

__all__ = [
    "Data",
    "EpochStats",
    "NonFiniteLossError",
    "StepSettings",
    "TrainResult",
    "load_run_model",
    "build_data",
    "build_model",
    "build_optimizer",
    "build_schedule",
    "evaluate_run",
    "fit",
    "lr_factor",
    "predict",
    "run_epoch",
    "seed_everything",
    "select_finetune",
    "train",
]


class _CompiledOrEager:
    """``torch.compile(model, fullgraph=True)``; a model with a graph break is compiled in
    pieces instead, and a failure falls back to the eager model (with a warning)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        try:
            self.compiled: Callable | None = torch.compile(model, fullgraph=True)
        except Exception as error:  # noqa: BLE001 - any failure means: run eagerly
            warnings.warn(f"torch.compile failed, training eagerly: {error}", stacklevel=3)
            self.compiled = None

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except torch._dynamo.exc.Unsupported:  # a graph break, refused by fullgraph=True
                self.compiled = torch.compile(self.model)
                return self(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - e.g. no C++ compiler for inductor
                warnings.warn(f"torch.compile failed, training eagerly: {error}", stacklevel=2)
                self.compiled = None
        return self.model(*args, **kwargs)


def _progress(batches: Iterable, enabled: bool, description: str) -> Iterable:
    if not enabled or not sys.stderr.isatty():  # a bar redrawn into a log file is one line
        return batches
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return batches
    return tqdm(batches, desc=description, leave=False, dynamic_ncols=True)


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    progress: bool = True,
    run_dir: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = print,
    until_epoch: int | None = None,
) -> Path:
    """Train and evaluate one run in ``run_dir`` (default ``out_dir/name``).

    ``resume`` continues the run from its ``last.pt`` (``config`` must equal its saved one);
    ``log`` gets one line per epoch and a few setup lines (None: silence). ``until_epoch``
    pauses the run after that epoch of its schedule, checkpointed and not evaluated on test;
    a later call with ``resume`` goes on as if it had not paused. Under ``torchrun`` the same
    call trains with DistributedDataParallel, rank 0 alone writing the run.

    Returns:
        The run directory (see :mod:`snens.engine.runs`).

    Raises:
        RunDirError: the output directory is not writable, or a new run's already holds a run.
        RunInUseError: another live process is training this run.
        NonFiniteLossError: a NaN/inf loss with ``on_nonfinite = "stop"``.
        CheckpointError: on resume, ``last.pt`` is damaged or does not fit.
        ValueError: on resume, a config that differs from the run's; under torchrun, a batch
            size not divisible by the processes, or ``on_nonfinite = "skip"``; an
            ``until_epoch`` that is not an epoch of the schedule.
        RuntimeError: under torchrun, another rank died or stopped answering.
    """
    if until_epoch is not None and (
        not isinstance(until_epoch, int)
        or isinstance(until_epoch, bool)
        or not 1 <= until_epoch <= config.optim.epochs
    ):
        raise ValueError(
            f"until_epoch must be an epoch of the schedule, an int in 1..{config.optim.epochs} "
            f"(optim.epochs), got {until_epoch!r}; or None to train every epoch"
        )
    path = _run_path(config, run_dir)
    existed = path.exists()
    try:
        with distributed.session() as group, contextlib.ExitStack() as held:
            if group.is_main:
                held.enter_context(hold_run(path))
            return _train(
                config,
                group,
                resume=resume,
                progress=progress,
                run_dir=path,
                log=log,
                until=until_epoch or config.optim.epochs,
            )
    except BaseException:
        # a failed start leaves no empty run directory
        if not existed and path.is_dir() and not any(path.iterdir()):
            with contextlib.suppress(OSError):
                path.rmdir()
        raise


def _train(
    config: RunConfig,
    group: distributed.Context,
    *,
    resume: bool,
    progress: bool,
    run_dir: str | os.PathLike | None,
    log: Callable[[str], None] | None,
    until: int,
) -> Path:
    say = (log if group.is_main else None) or (lambda line: None)
    # A timestamped default name could differ between ranks: rank 0's path is the run's.
    path = group.broadcast(_run_path(config, run_dir), "agreeing on the run directory")
    config = _check_start(config, group, path, resume=resume)

    with reproducible(config):
        seed_everything(config.seed)
        device = resolve_device(config.device)

        loaded = build_data(
            config.data,
            seed=config.seed,
            device=device,
            encoder=text_encoder(config),
            member_orders=config.method.member_orders,
        )
        if group.enabled:
            loaded.train.shard(group.rank, group.world_size)
        steps_per_epoch = len(loaded.train)

        start = read_init_from(config) if config.model.init_from and not resume else None
        model = build_model(
            config, num_classes=loaded.num_classes, channels=loaded.channels, start=start
        )
        # its weights are in the model now; keep what the run records, not a second copy
        source = None if start is None else start.record()
        del start
        model.to(device)
        if config.optim.channels_last:
            model.to(memory_format=torch.channels_last)
        num_classes = config.model.num_classes or loaded.num_classes
        trainable = select_finetune(model, config.optim.finetune, num_classes)
        if config.method.diversity_layers:  # names that are not member norms: refused now
            try:
                diversity_gain(model, config.method.temperature, config.method.diversity_layers)
            except ValueError as error:
                raise ValueError(f"method.diversity_layers: {error}") from None

        groups = param_groups(
            model,
            config.optim.lr,
            config.optim.weight_decay,
            config.method.gamma_lr_multiplier,
            config.optim.affine_weight_decay,
        )
        optimizer = build_optimizer(config.optim, groups)
        schedule = build_schedule(config.optim, optimizer, steps_per_epoch)
        settings = _step_settings(config, steps_per_epoch)

        patience = config.optim.patience
        select = config.optim.select and group.is_main
        selection = Selection.for_model(model, config.optim.select) if select else None

        run = create_run(config, path) if group.is_main and not resume else Run(path, config)
        epoch, step, seconds, skipped = 0, 0, 0.0, 0
        if resume:
            epoch, step, seconds, skipped = _resume_state(
                run, model, optimizer, schedule, say, selection
            )
            if group.is_main:
                # the metrics of epochs after the checkpoint, the temporary files a kill left
                run.truncate_metrics(epoch)
                for tmp in checkpoint.remove_stale_temporaries(run.path):
                    say(f"removed {tmp.name}, a temporary file an interrupted write left")
        group.barrier("waiting for rank 0 to prepare the run directory")
        _announce(run, group, source, groups, say, (model, trainable, steps_per_epoch, device))
        replicated = _wrap_ddp(model, group, device)  # checkpoints hold the plain model's state
        forward = _CompiledOrEager(replicated) if config.optim.compile else replicated

        # the last epoch's validation logits: the final evaluation's, with the same weights
        validation_logits: dict[str, Tensor] = {}
        stop = _patience_ran_out(selection, epoch, patience)  # a resumed run that had stopped
        if patience:
            stop = group.broadcast(stop, "agreeing whether training goes on")
        while epoch < until and not stop:
            loaded.train.set_epoch(epoch)
            description = f"epoch {epoch + 1}/{config.optim.epochs}"
            batches = _progress(loaded.train, progress and group.is_main, description)
            all_reduce = f"epoch {epoch + 1} (gradient all-reduce)"
            with (
                _naming_last_checkpoint(run),
                distributed.guard(group, all_reduce),
                PeakMemory(device) as peak,
            ):
                stats = run_epoch(
                    model,
                    batches,
                    optimizer,
                    schedule,
                    settings,
                    epoch=epoch,
                    step=step,
                    forward=forward,
                    # a log file gets no bar: a line a minute instead
                    say=None if batches is not loaded.train else say,
                )
            epoch, step = epoch + 1, step + stats.steps
            seconds, skipped = seconds + stats.seconds, skipped + stats.skipped
            # equal shards: the mean of the ranks' means is the global batches' mean
            task_loss = group.mean(stats.task_loss, f"averaging epoch {epoch}'s loss")
            if group.is_main:
                kept = validation_logits if epoch == config.optim.epochs or selection else None
                record, bad = _epoch_record(
                    config, model, loaded, stats, epoch, step, task_loss, keep_logits=kept
                )
                record.update(peak.record())
                improved: list[int] = []
                if selection is not None and kept is not None:
                    improved = selection.update(epoch, kept["val"], kept["val_labels"], model)
                if selection is not None and len(selection.groups) > 1:
                    # each member's own score, which its kept epoch is chosen by
                    record[f"val/member_{selection.metric}"] = selection.latest
                stop = _patience_ran_out(selection, epoch, patience)
                run.log(record)
                say(_epoch_line(record, config.optim.epochs, selection))
                if bad:
                    say(_bad_images_line(bad))
                # an epoch that is kept is checkpointed too, so its weights are in last.pt
                # until best.pt holds them (a kill between the two writes loses nothing)
                every = epoch % config.checkpoint_every == 0 or epoch in (
                    until,
                    config.optim.epochs,
                )
                if every or improved or stop:
                    counters = (epoch, step, seconds, skipped)
                    _save_checkpoint(run, model, optimizer, schedule, counters, selection)
                if improved:
                    with run.writing(run.path / BEST):
                        selection.save(run.path / BEST, to_dict(run.config))  # type: ignore[union-attr]
            if patience:
                stop = group.broadcast(stop, f"agreeing whether training goes on after {epoch}")
            if stop:
                say(
                    f"stopping after epoch {epoch}: validation {config.optim.select} has not "
                    f"improved for {patience} epochs (optim.patience)"
                )

        # Rank 0 evaluates over the full test set. The ranks leave the group together first
        # (so none tears it down meanwhile), and the DDP wrapper, which references it, before.
        del replicated, forward
        distributed.leave(group, "finishing training")
        if not group.is_main:
            return run.path
        if epoch < config.optim.epochs and not stop:
            say(f"paused after epoch {epoch} of {config.optim.epochs}: resume to go on")
            return run.path
        counters = (epoch, step, seconds, skipped)
        _finish(run, model, loaded, counters, selection, validation_logits, progress, say)
    return run.path


def _announce(
    run: Run,
    group: distributed.Context,
    source: dict[str, Any] | None,
    groups: list[dict],
    say: Callable[[str], None],
    trained: tuple[nn.Module, int, int, torch.device],
) -> None:
    """The setup lines; rank 0 records the launch and the start in the run. ``trained``: the
    model, its trainable parameters, steps per epoch and device."""
    config = run.config
    model, trainable, steps_per_epoch, device = trained
    params = sum(p.numel() for p in model.parameters())
    say(
        f"run {run.path}: {config.method.name} over {config.model.backbone}, {params:,} "
        f"parameters ({trainable:,} trainable), {steps_per_epoch} steps per epoch on {device}"
    )
    if group.enabled:
        if group.is_main:
            run.record(distributed=_launch_record(group))
        say(
            f"data-parallel over {group.world_size} processes ({group.backend}); each "
            f"takes {config.data.batch_size // group.world_size} rows of every global batch"
        )
    if source is not None:
        if group.is_main:
            run.record(init_from=source)
        say(
            f"backbone started from the trained single model of {init_from_path(config)} "
            f"(sha256 {source['sha256'][:12]}…)"
        )
    described = (
        f"{g['name']}: {len(g['params'])} tensors, {sum(p.numel() for p in g['params']):,} "
        f"params, lr {g['lr']:.3g}, weight decay {g['weight_decay']:g}"
        for g in groups
    )
    say(f"parameter groups: {'; '.join(described)}")
    if METHOD_RECORDS[config.method.name].regularized:
        say(_legend_line(config))


def _finish(
    run: Run,
    model: nn.Module,
    loaded: Data,
    counters: tuple[int, int, float, int],
    selection: Selection | None,
    validation_logits: dict[str, Tensor],
    progress: bool,
    say: Callable[[str], None],
) -> None:
    """The final evaluation (of the kept weights under selection): final.json, outputs.npz and
    examples.npz."""
    config, (epoch, step, seconds, skipped) = run.config, counters
    if selection is not None:
        checkpoint.load_model_state(model, {**model.state_dict(), **selection.weights()})
        validation_logits = selection.kept_validation() or {}
        kept = "members at epochs " + ", ".join(map(str, selection.epochs))
        if selection.groups == ("",):
            kept = f"epoch {selection.epochs[0]} ({selection.metric} {selection.values[0]:.4f})"
        say(f"evaluating the weights of {kept}, the best on validation (optim.select)")
    with progress_bars(progress):
        validation = validation_logits or None
        results, outputs = reload.final_metrics(model, loaded, config, validation=validation)
    params = list(model.parameters())
    summary = {
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
    }
    if METHOD_RECORDS[config.method.name].regularized:
        summary["effective_members"] = _effective_members(model, config)
        summary["k_star"] = optimal_k(config.method.temperature, config.method.num_members)
    final: dict[str, Any] = {
        "metrics": results,
        "model": summary,
        "train": {"epochs": epoch, "steps": step, "skipped_steps": skipped, "seconds": seconds},
    }
    bad = loaded.bad_images()
    if bad is not None:  # in this process's life: a resumed run counts from its restart
        final["data"] = {"bad_images": bad}
    if selection is not None:
        final["selection"] = selection.summary(epoch, config.optim.patience)
    final["train"].update(peak_over(read_metrics(run.path)))  # over every epoch logged
    run.write_outputs(outputs)
    run.write_examples(run_examples(outputs, calibrators=config.data.calibrators))
    run.write_final(final)
    say(
        f"done: test accuracy {results['test/accuracy']:.4f}, NLL {results['test/nll']:.4f}, "
        f"ECE {results['test/ece']:.4f}; {run.path / 'final.json'}"
    )


def _launch_record(group: distributed.Context) -> dict[str, Any]:
    """What ``provenance.json`` records of a data-parallel run's launch (from the environment)."""
    env = os.environ
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "environment (MASTER_ADDR, …)"
    return {
        "world_size": group.world_size,
        "backend": group.backend,
        "launcher": launcher,
        "nproc_per_node": int(env.get("LOCAL_WORLD_SIZE", group.world_size)),
        "nnodes": int(env.get("GROUP_WORLD_SIZE", 1)),
        "master": f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}",
    }


def _check_start(
    config: RunConfig, group: distributed.Context, path: Path, *, resume: bool
) -> RunConfig:
    """Fail before loading anything; return the config to train with (a resumed run's own)."""
    if group.enabled:
        distributed.local_batch_size(config.data.batch_size, group.world_size)
        if config.on_nonfinite == "skip":
            raise ValueError(
                'on_nonfinite = "skip" is not supported under torchrun: a rank that skips '
                "its backward pass would leave the others waiting in the gradient all-reduce; "
                'use "stop"'
            )
    if group.is_main:  # rank 0 writes the run (opening one to resume records the resume)
        if resume:
            return open_run(path, config).config
        refuse_existing_run(path)
    return config


def _step_settings(config: RunConfig, steps_per_epoch: int) -> StepSettings:
    """The training step's settings (a diversity loss for σN-Ens only)."""
    regularized = METHOD_RECORDS[config.method.name].regularized
    return StepSettings(
        temperature=config.method.temperature,
        diversity_weight=config.method.diversity_weight if regularized else 0.0,
        diversity_ramp_steps=round(config.method.diversity_ramp_epochs * steps_per_epoch),
        diversity_layers=config.method.diversity_layers,
        label_smoothing=config.optim.label_smoothing,
        grad_clip=config.optim.grad_clip,
        bf16=config.optim.bf16,
        channels_last=config.optim.channels_last,
        on_nonfinite=config.on_nonfinite,
    )


def _resume_state(
    run: Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LambdaLR,
    say: Callable[[str], None],
    selection: Selection | None = None,
) -> tuple[int, int, float, int]:
    """Load ``last.pt`` (checked) into model, optimizer, schedule, RNGs and ``selection``;
    return its counters."""
    if not run.checkpoint.is_file():  # stopped before its first checkpoint
        say(f"resuming {run.path}: no checkpoint yet, starting from epoch 1")
        return 0, 0, 0.0, 0
    state = checkpoint.load_checkpoint(run.checkpoint)
    if reload.saved_config(state, run.checkpoint) != to_dict(run.config):
        raise ValueError(f"{run.checkpoint} was saved by another config than {run.path}")
    reload.check_progress(state, run.checkpoint, run.config.optim.epochs)
    if selection is not None:  # checked before anything is loaded
        fix = "resume from prev.pt (copy it over last.pt) or start the run again"
        _restore_checkpoint(selection, state, run.path, fix)
    checkpoint.load_model_state(model, state["model"])
    checkpoint.load_training_state(optimizer, schedule, state, run.checkpoint)
    checkpoint.set_rng_state(state["rng"])
    epoch, step = state["epoch"], state["step"]
    say(f"resuming {run.path} after epoch {epoch} (step {step})")
    return epoch, step, state.get("seconds", 0.0), state.get("skipped_steps", 0)


def _wrap_ddp(model: nn.Module, group: distributed.Context, device: torch.device) -> nn.Module:
    """The model in DistributedDataParallel under torchrun; the model itself otherwise.

    Averaging gradients over the ranks leaves the diversity loss's (the same on every rank) as
    it is and makes the task loss's the global batch's mean."""
    if not group.enabled:
        return model
    index = next(model.parameters()).device.index  # "cuda" resolved to its index
    ids = [index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=False)


@contextlib.contextmanager
def _naming_last_checkpoint(run: Run) -> Iterator[None]:
    """Add to a :class:`NonFiniteLossError`'s message that training stopped, and what was kept."""
    try:
        yield
    except NonFiniteLossError as error:
        kept = f"the last good checkpoint is {run.checkpoint}"
        if not run.checkpoint.is_file():
            kept = "no checkpoint was saved before it"
        raise NonFiniteLossError(f"{error}. Training stopped; {kept}.") from error


def _epoch_record(
    config: RunConfig,
    model: nn.Module,
    loaded: Data,
    stats: EpochStats,
    epoch: int,
    step: int,
    task_loss: float,
    keep_logits: dict[str, Tensor] | None = None,
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The epoch's metrics.jsonl record, and the undecodable images so far (None: no folders);
    ``keep_logits`` receives the validation logits (``"val"``, ``"val_labels"``)."""
    record: dict[str, Any] = {"epoch": epoch, "step": step, "task_loss": task_loss, "lr": stats.lr}
    record.update(grad_norm=stats.grad_norm, skipped_steps=stats.skipped, seconds=stats.seconds)
    if METHOD_RECORDS[config.method.name].regularized:
        layers = config.method.diversity_layers or None
        record["diversity_loss"] = stats.diversity_loss
        record["diversity_gain"] = diversity_gain(model, config.method.temperature, layers)
        record["effective_members"] = _effective_members(model, config)
    if loaded.validation is not None:
        record.update(validation_metrics(model, loaded.validation, _CURVE_METRICS, keep_logits))
    if config.eval_every and epoch % config.eval_every == 0:
        quick = evaluate(model, loaded.test)
        record.update({k: quick[k] for k in ("test/accuracy", "test/nll", "test/ece")})
    bad = loaded.bad_images()  # after the evaluations above, which read images too
    if bad is not None:
        record["bad_images"] = len(bad)
    return record, bad


def _bad_images_line(bad: Mapping[str, str]) -> str:
    """The warning logged after an epoch that found undecodable images."""
    return (
        f"{len(bad)} undecodable images so far, each read as the next image of its "
        f"class (e.g. {', '.join(list(bad)[:3])}); final.json lists them all, and "
        'data.on_bad_image="raise" stops at the first'
    )


def _save_checkpoint(
    run: Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LambdaLR,
    counters: tuple[int, int, float, int],
    selection: Selection | None = None,
) -> None:
    """Write ``last.pt``: everything a resumed run needs to go on as this one."""
    epoch, step, seconds, skipped_steps = counters
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "rng": checkpoint.rng_state(),
        "epoch": epoch,
        "step": step,
        "config": to_dict(run.config),
        "seconds": seconds,
        "skipped_steps": skipped_steps,
    }
    if selection is not None:
        state["selection"] = selection.record()
    with run.writing(run.checkpoint):
        checkpoint.save_checkpoint(run.checkpoint, state)


def _patience_ran_out(selection: Selection | None, epoch: int, patience: int) -> bool:
    """Whether ``patience`` epochs have passed since the last kept one (never with 0)."""
    return bool(selection is not None and patience and epoch - selection.epoch >= patience)


#: Validation metrics logged after every epoch.
_CURVE_METRICS = ("accuracy", "nll", "ece", "disagreement")
_CURVE_METRICS += ("member_accuracy_mean", "member_nll_mean")


def _legend_line(config: RunConfig) -> str:
    """What the σN-Ens numbers of the epoch lines mean."""
    tau, M = config.method.temperature, config.method.num_members
    weight = config.method.diversity_weight
    target = (
        f"which the diversity loss (λ = {weight:g}) pulls toward k*(τ={tau:g}) = "
        f"{optimal_k(tau, M):.2f} of M={M}, against the task loss (the smaller λ, the less "
        "it moves them)"
        if weight > 0
        else f"M={M} (no diversity loss: λ = 0)"
    )
    layers = config.method.diversity_layers
    where = f" of {', '.join(layers)}" if layers else ""
    return (
        "per epoch, 'gain over uniform' is M·KL(uniform ‖ member importances) per feature, in "
        "nats (0: every member weighs every feature alike; higher: features owned by fewer "
        f"members), and 'effective members' the members sharing a feature{where} on average, "
        f"{target}"
    )


def _epoch_line(record: Mapping[str, Any], epochs: int, selection: Selection | None = None) -> str:
    line = f"epoch {record['epoch']}/{epochs}  loss {record['task_loss']:.4f}"
    if "diversity_gain" in record:
        line += (
            f"  gain over uniform {record['diversity_gain']:.4f}"
            f"  effective members {record['effective_members']:.2f}"
        )
    if "val/accuracy" in record:
        line += f"  val acc {record['val/accuracy']:.4f}  NLL {record['val/nll']:.4f}"
    if "test/accuracy" in record:
        line += f"  test acc {record['test/accuracy']:.4f}  NLL {record['test/nll']:.4f}"
    line += f"  lr {record['lr']:.3g}  {record['seconds']:.1f}s"
    if record["skipped_steps"]:
        line += f"  ({record['skipped_steps']} steps skipped)"
    if selection is not None and record["epoch"] in selection.epochs:
        line += "  *kept*"
    return line


def _effective_members(model: nn.Module, config: RunConfig) -> float:
    """The realized sharing of the member norms the diversity loss acts on, against k*(τ)."""
    shares = allocation(model)
    if config.method.diversity_layers:
        shares = {n: a for n, a in shares.items() if n in config.method.diversity_layers}
    return mean_effective_members(shares)
