"""Data-parallel training across processes: the process group, the rank's shard, the guards.

``snens train`` under ``torchrun --nproc_per_node=N`` trains with DistributedDataParallel:
:func:`session` joins the process group (NCCL with CUDA, gloo on the CPU); every other
function here is a no-op for a single process. Every rank builds the same model and data
order and takes rows ``[r·b, (r+1)·b)`` of each global batch, b = B / N, so N processes take
the steps of one with batch B (BatchNorm statistics are per rank); rank 0 alone writes the
run directory and evaluates. A collective that fails or waits longer than
``SNENS_DIST_TIMEOUT`` seconds (default 60) is re-raised by :func:`guard` as a
``RuntimeError`` naming the rank and what it was doing.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import os
import re
import sys
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "TIMEOUT_ENV",
    "Context",
    "guard",
    "leave",
    "local_batch_size",
    "session",
    "shutdown",
    "timeout",
]

TIMEOUT_ENV = "SNENS_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0  # long enough for rank 0's checkpoint write between two collectives


@dataclass(frozen=True)
class Context:
    """Where this process stands in the group; ``world_size == 1`` for a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        """True when more than one process trains."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the one that writes files and evaluates."""
        return self.rank == 0

    def barrier(self, what: str) -> None:
        """Wait for every rank (no-op for one process)."""
        if self.enabled:
            with guard(self, what):
                dist.barrier()

    def broadcast(self, value: Any, what: str) -> Any:
        """Rank 0's ``value`` on every rank (a picklable object)."""
        if not self.enabled:
            return value
        box = [value]
        with guard(self, what):
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean(self, value: float, what: str) -> float:
        """The mean of ``value`` over the ranks."""
        if not self.enabled:
            return value
        device = torch.device("cuda") if self.backend == "nccl" else torch.device("cpu")
        total = torch.tensor([value], dtype=torch.float64, device=device)
        with guard(self, what):
            dist.all_reduce(total)
        return total.item() / self.world_size


def timeout() -> datetime.timedelta:
    """The process group's timeout: ``SNENS_DIST_TIMEOUT`` seconds, default 60.

    Raises:
        ValueError: the variable is not a positive number.
    """
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return datetime.timedelta(seconds=seconds)


def local_batch_size(batch_size: int, world_size: int) -> int:
    """Examples per rank and step: ``batch_size / world_size``.

    Raises:
        ValueError: ``batch_size`` is not a multiple of ``world_size`` (both named).
    """
    if batch_size % world_size:
        raise ValueError(
            f"data.batch_size {batch_size} is not divisible by the {world_size} processes; "
            f"the global batch is split evenly, so choose a multiple of {world_size}"
        )
    return batch_size // world_size


def _world_from_env() -> tuple[int, int, int]:
    def read(name: str, default: int) -> int:
        raw = os.environ.get(name)
        try:
            return int(raw) if raw is not None else default
        except ValueError:
            raise ValueError(f"environment variable {name} must be an int, got {raw!r}") from None

    return read("RANK", 0), read("WORLD_SIZE", 1), read("LOCAL_RANK", 0)


@contextlib.contextmanager
def session() -> Iterator[Context]:
    """Join the process group described by torchrun's environment, and leave it at the end.

    Without ``WORLD_SIZE`` > 1 this touches nothing; a group the caller initialized is used
    and kept. When the block raises, the group is only destroyed (the traceback still
    references it), else shut down (:func:`shutdown`).

    Raises:
        ValueError: malformed ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``SNENS_DIST_TIMEOUT``.
        RuntimeError: torch.distributed is not available in this build of torch.
    """
    rank, world_size, local_rank = _world_from_env()
    if dist.is_available() and dist.is_initialized():
        yield Context(dist.get_rank(), dist.get_world_size(), local_rank, dist.get_backend())
        return
    if world_size <= 1:
        yield Context()
        return
    if not dist.is_available():
        raise RuntimeError(
            f"WORLD_SIZE={world_size} asks for a distributed run, but this torch build has no "
            "torch.distributed; run a single process"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # so that device "cuda" is this rank's GPU
    # Imported while no group exists: its functions' defaults (group=group.WORLD), evaluated
    # on import, would otherwise hold the group so that shutdown() could not stop its threads.
    importlib.import_module("torch.distributed.nn.functional")
    dist.init_process_group(
        backend, rank=rank, world_size=world_size, timeout=timeout(), init_method="env://"
    )
    try:
        yield Context(rank, world_size, local_rank, backend)
    except BaseException:
        if dist.is_initialized():  # so that a later session can start
            dist.destroy_process_group()
        raise
    shutdown()  # a no-op when leave() shut the group down already


def leave(group: Context, what: str) -> None:
    """Every rank leaves the process group together (a barrier, then :func:`shutdown`); drop
    every DistributedDataParallel wrapper first, as one still referenced keeps its threads."""
    if group.enabled and dist.is_initialized():
        group.barrier(what)
        shutdown()


def shutdown() -> None:
    """Destroy the default process group and wait until its worker threads have stopped.

    ``dist.destroy_process_group()`` alone stops no thread: gloo's workers stop when the last
    reference to the group goes, and one that frees a tensor while the interpreter exits
    aborts the process. Call it once the DDP wrappers and FSDP-sharded models are dropped
    (torch's DTensor caches of device meshes are emptied here). A no-op without a group.

    Warns:
        RuntimeWarning: the group is still referenced after it was destroyed; the message says
            what holds it where that is known, and the fix.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    alive = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    if alive() is not None:
        _forget_device_meshes()
        gc.collect()  # a wrapper of the group inside a reference cycle
    group = alive()
    if group is not None:
        warnings.warn(_still_held(group), RuntimeWarning, stacklevel=2)


#: Where torch.distributed.tensor keeps device meshes (each holding its process group) after
#: the FSDP2 model that made them is gone: (module, the path of a callable that empties it).
_MESH_CACHES = (
    ("torch.distributed.tensor.debug", "_clear_sharding_prop_cache"),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos.cache_clear"),
    ("torch.distributed.tensor._redistribute", "_planner_cache.clear"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh.cache_clear"),
)


def _forget_device_meshes() -> None:
    """Empty torch.distributed.tensor's caches of device meshes, where it was imported and has
    them."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    for module, path in _MESH_CACHES:
        try:
            found: Any = importlib.import_module(module)
        except ImportError:
            continue
        for name in path.split("."):
            found = getattr(found, name, None)
        if callable(found):
            found()


def _still_held(group: dist.ProcessGroup) -> str:
    functional = sys.modules.get("torch.distributed.nn.functional")
    defaults = getattr(getattr(functional, "broadcast", None), "__defaults__", None) or ()
    sharded = _sharded_tensors()
    if any(value is group for value in defaults):
        holder = (
            "torch.distributed.nn.functional, imported after the group was made, holds it in "
            "its functions' defaults: import that module before the group is made"
        )
    elif sharded:
        holder = (
            f"{sharded} sharded tensors (DTensor) are still alive, each holding the group "
            "through its device mesh: drop what holds them before shutting the group down — "
            "an FSDP-sharded model, its optimizer, or a state dict given to "
            "torch.distributed.checkpoint's set_state_dict (which fills it with sharded "
            "tensors: `del` it once loaded)"
        )
    else:
        holder = (
            "drop every DistributedDataParallel wrapper (a trainer holding one), every "
            "FSDP-sharded model with what reaches it (its optimizer, a loss, a loop variable "
            "naming one of its modules) and any saved dist.group.WORLD before shutting the "
            "group down"
        )
    return (
        "the process group was destroyed but is still referenced, so its worker threads run on "
        "until the interpreter exits, where one that frees a tensor aborts the process "
        f"('terminate called without an active exception'); {holder}"
    )


def _sharded_tensors() -> int:
    """How many DTensors the garbage collector can see (0 where DTensor was never imported)."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is None:
        return 0
    # type(), not isinstance: a proxy whose __class__ warns (reduce_op) stays quiet
    return sum(1 for value in gc.get_objects() if issubclass(type(value), dtensor))


# the DDP reducer reports a peer's death as a plain RuntimeError carrying the backend's text
_COLLECTIVE_FAILURE = re.compile(r"gloo|nccl|connection|peer|timed out|timeout", re.IGNORECASE)


@contextlib.contextmanager
def guard(context: Context, what: str) -> Iterator[None]:
    """Re-raise a failed collective as a ``RuntimeError`` naming this rank and ``what``."""
    if not context.enabled:
        yield
        return
    try:
        yield
    except RuntimeError as error:
        if not (isinstance(error, dist.DistError) or _COLLECTIVE_FAILURE.search(str(error))):
            raise
        seconds = timeout().total_seconds()
        raise RuntimeError(
            f"rank {context.rank} lost contact with the group of {context.world_size} during "
            f"{what}: another rank died, or did not answer within the {seconds:g} s timeout "
            f"({type(error).__name__}: {error})"
        ) from error
