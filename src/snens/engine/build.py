"""What a run config builds, and the settings its process runs under (for the engine and a
reloaded run alike)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from snens import baselines, models
from snens.engine.checkpoint import load_checkpoint_with_digest, load_model_state
from snens.engine.config import OptimConfig, RunConfig, to_dict
from snens.nn.linear import MemberLinear
from snens.nn.registry import is_norm

__all__ = [
    "build_model",
    "build_optimizer",
    "build_schedule",
    "InitFrom",
    "init_from_path",
    "read_init_from",
    "lr_factor",
    "reproducible",
    "resolve_device",
    "seed_everything",
    "select_finetune",
    "text_encoder",
]


def build_model(
    config: RunConfig, *, num_classes: int, channels: int | None, start: InitFrom | None = None
) -> nn.Module:
    """The method of ``config.method`` over the backbone of ``config.model``, freshly built.

    ``channels`` (None for text) and ``num_classes`` are the data set's, unless the config
    sets them. ``start``'s trained weights (:func:`read_init_from`) are loaded into the
    backbone before the method converts or wraps it.
    """
    image = {} if channels is None else {"in_channels": channels}
    backbone_options = {**image, **config.model.options}
    options = dict(config.method.options)
    method = baselines.METHOD_RECORDS[config.method.name]
    policy = config.method.input_policy
    # "own": member m's batch is rows [m·B, (m+1)·B), which the model takes as split inputs
    if method.regularized or policy == "own":
        options.setdefault("input_policy", "split" if policy == "own" else policy)
    single = method.fixed_members == 1
    num_classes = config.model.num_classes or num_classes
    backbone: str | nn.Module = config.model.backbone
    if start is not None:
        # built, then loaded: the same draws from the generator as a backbone built by name
        backbone = models.create(backbone, num_classes=num_classes, **backbone_options)
        load_model_state(backbone, start.weights)
        backbone_options = {}
    model = baselines.create(
        config.method.name,
        backbone,
        num_classes=num_classes,
        num_members=None if single else config.method.num_members,
        backbone_options=backbone_options,
        **options,
    )
    if config.method.name == "snens":  # τ, λ and γ's multiplier beside what convert used
        model.snens_config = config.method.snens_config()
    return model


def init_from_path(config: RunConfig) -> Path:
    """``config.model.init_from`` with ``{seed}`` read as the run's seed."""
    return Path(config.model.init_from.replace("{seed}", str(config.seed)))


@dataclass(frozen=True)
class InitFrom:
    """The trained single model a run starts from (``model.init_from``), read once."""

    weights: dict[str, torch.Tensor]  # its backbone's state dict (without the "model." prefix)
    checkpoint: str  # the absolute path of the checkpoint file read (links resolved)
    sha256: str  # of the payload those weights were read from

    def record(self) -> dict[str, str]:
        """What ``provenance.json`` records of the source: the file and the digest."""
        return {"checkpoint": self.checkpoint, "sha256": self.sha256}


def read_init_from(config: RunConfig) -> InitFrom:
    """The single-model run ``config.model.init_from`` names (its directory or a checkpoint
    file; ``{seed}`` in it reads as the run's seed), checked against ``config.model``.

    Raises:
        FileNotFoundError: no run directory or checkpoint there.
        CheckpointError: the checkpoint is damaged or not a snens checkpoint.
        ValueError: not a single-model run, or of another backbone, options or classes.
    """
    where = init_from_path(config)
    path = (where / "last.pt" if where.is_dir() else where).resolve()
    if not path.is_file():
        raise FileNotFoundError(
            f"model.init_from {str(where)!r}: no run directory with a last.pt and no "
            "checkpoint file there; name a single-model run directory (or its last.pt)"
        )
    state, digest = load_checkpoint_with_digest(path)
    source = state["config"]
    method = source.get("method", {}).get("name")
    if method != "single":
        raise ValueError(
            f"model.init_from {str(where)!r} is a run of method {method!r}; it must be a "
            "single-model run (method.name='single'), whose one network the method here "
            "starts from"
        )
    wanted = to_dict(config)["model"]
    differ = [
        f"{key} {source['model'].get(key)!r} there, {wanted[key]!r} here"
        for key in ("backbone", "options", "num_classes")
        if source["model"].get(key) != wanted[key]
    ]
    if differ:
        raise ValueError(
            f"model.init_from {str(where)!r} trained another network: model."
            + "; model.".join(differ)
            + "; start from a run of the same backbone and options"
        )
    done, epochs = state.get("epoch"), source.get("optim", {}).get("epochs")
    if isinstance(done, int) and isinstance(epochs, int) and done < epochs:
        # an early checkpoint may be what the user wants: said, not refused
        warnings.warn(
            f"model.init_from {str(where)!r}: the source run is unfinished, its checkpoint is "
            f"at epoch {done} of {epochs}; the run starts from that network (let the source "
            f"finish first, snens train --resume {path.parent}, to start from its trained one)",
            UserWarning,
            stacklevel=2,
        )
    model = state["model"].items()
    weights = {name.removeprefix("model."): t for name, t in model if name.startswith("model.")}
    return InitFrom(weights, str(path), digest)


def _is_head(module: nn.Module, num_classes: int) -> bool:
    """A member head, or any linear layer with K outputs (each deep-ensemble member's head)."""
    linear = isinstance(module, nn.Linear) or type(module).__name__.endswith("Linear")
    outputs = getattr(module, "out_features", None)
    return isinstance(module, MemberLinear) or (linear and outputs == num_classes)


def select_finetune(model: nn.Module, mode: str, num_classes: int) -> int:
    """Freeze what ``mode`` does not train; return the number of trainable parameters.

    ``"all"`` trains everything; ``"norms_and_heads"`` only the norm layers and the heads.

    Raises:
        ValueError: ``norms_and_heads`` found no norm and no head to train.
    """
    if mode == "norms_and_heads":
        keep = {
            id(p)
            for module in model.modules()
            if is_norm(module) or _is_head(module, num_classes)
            for p in module.parameters(recurse=False)
        }
        if not keep:
            raise ValueError(
                "optim.finetune 'norms_and_heads' found no norm layer and no head with "
                f"{num_classes} outputs in {type(model).__name__}; use finetune 'all'"
            )
        for p in model.parameters():
            p.requires_grad_(id(p) in keep)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_optimizer(config: OptimConfig, groups: list[dict]) -> torch.optim.Optimizer:
    """SGD (momentum, optionally Nesterov) or AdamW over the given parameter groups."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov
        )
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))


def lr_factor(
    step: int,
    *,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    steps_per_epoch: int = 1,
    milestones: tuple[int, ...] = (),
    decay: float = 0.1,
) -> float:
    """The learning rate of step ``step`` (0-based) over the base learning rate.

    warm-up:    (step + 1) / warmup_steps                     for step < warmup_steps
    cosine:     ½·(1 + cos(π·t)),  t = (step − warmup) / (total − warmup) ∈ [0, 1]
    multistep:  decay ** (number of milestones ≤ the step's epoch)
    constant:   1
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        t = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0)))
    if schedule == "multistep":
        epoch = step // steps_per_epoch
        return decay ** sum(epoch >= m for m in milestones)
    return 1.0


def build_schedule(
    config: OptimConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step schedule of :func:`lr_factor`."""
    factor = functools.partial(
        lr_factor,
        total_steps=config.epochs * steps_per_epoch,
        warmup_steps=config.warmup_epochs * steps_per_epoch,
        schedule=config.schedule,
        steps_per_epoch=steps_per_epoch,
        milestones=config.milestones,
        decay=config.lr_decay,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (torch: every device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def reproducible(config: RunConfig) -> Iterator[None]:
    """Set threads and deterministic algorithms for the run; restore the process's after."""
    threads, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
    deterministic = torch.are_deterministic_algorithms_enabled()
    if config.threads:
        torch.set_num_threads(config.threads)
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.benchmark = benchmark


def resolve_device(name: str | torch.device) -> torch.device:
    """The device ``name`` names (a CUDA one only where torch sees it); ``"auto"``: CUDA when
    available, else the CPU.

    Raises:
        ValueError: ``name`` is not a device, or a CUDA device that is not there.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{str(name)!r} is not a torch device; use cpu or cuda") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"{str(name)!r}, but torch {torch.__version__} sees no CUDA device "
                "(torch.cuda.is_available() is False); use cpu"
            )
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"{str(name)!r}, but torch sees {count} CUDA device(s): cuda:0 to cuda:{count - 1}"
            )
    return device


def text_encoder(config: RunConfig) -> str | None:
    """The text model the backbone is built from (its ``encoder`` or ``path`` option; the
    cached SmolLM2 directory for ``smollm2``), for its tokenizer."""
    encoder = config.model.options.get("encoder") or config.model.options.get("path")
    if not encoder and config.model.backbone == "smollm2":
        encoder = models.smollm2_path()
    return str(encoder) if encoder else None
