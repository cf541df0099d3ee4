"""Crash-safe checkpoints that run no code when loaded.

File layout: one header line, then a ``torch.save`` payload::

    snens-checkpoint 1 sha256=<64 hex digits> bytes=<payload length>\\n
    <payload>

* **Atomic.** :func:`atomic_write` replaces the target only with a complete file;
  :func:`save_checkpoint` first keeps the current file as ``prev.pt`` (a hard link).
* **Verified.** :func:`load_checkpoint` checks the header, the length and the SHA-256 of the
  payload before unpickling anything. The digest detects corruption, not forgery.
* **No code.** The payload is read with ``torch.load(..., weights_only=True)`` only; RNG
  states are stored as tensors and lists so they pass.
* **All or nothing.** :func:`load_model_state` and :func:`check_training_state` check every
  tensor and the optimizer and schedule states before anything is loaded.
* **Regular files only.** A directory or FIFO named ``last.pt`` is a :class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import math
import os
import pickle
import random
import secrets
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from snens import files

__all__ = [
    "TRAINING_KEYS",
    "CheckpointError",
    "atomic_write",
    "check_training_state",
    "checkpoint_digest",
    "load_checkpoint",
    "load_checkpoint_with_digest",
    "load_model_state",
    "load_training_state",
    "remove_stale_temporaries",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

_MAGIC = b"snens-checkpoint"
_VERSION = 1
_MAX_HEADER = 256  # bytes; the header line is ~110

#: Keys of a training checkpoint written by ``snens.engine.train``.
TRAINING_KEYS = ("model", "optimizer", "schedule", "rng", "epoch", "step", "config")


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or used: truncated, modified, refused or incomplete."""


#: Atomic writes (:mod:`snens.files`): a crash leaves the old file or the new one, whole; a
#: link at the path is replaced, never followed; a new file has ``mode``, else ``0o600``.
atomic_write = files.write_bytes
atomic_savez = files.savez
#: Removes the temporary files a killed write left in a directory, where no other process writes.
remove_stale_temporaries = files.remove_stale_temporaries


def _keep_previous(path: Path, previous: Path) -> None:
    """Make ``previous`` a complete copy of ``path`` (a hard link, else a copy)."""
    for _ in range(100):
        tmp = previous.with_name(f".{previous.name}.{secrets.token_hex(8)}.tmp")
        try:
            os.link(path, tmp)  # never follows a link at tmp: it fails where anything is
            break
        except FileExistsError:
            continue
        except OSError:  # no hard links on this file system: copy (atomically)
            atomic_write(previous, _read(path))
            return
    else:
        raise FileExistsError(errno.EEXIST, f"no free temporary name beside {previous}")
    try:
        os.replace(tmp, previous)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _header(payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).hexdigest().encode()
    return b"%s %d sha256=%s bytes=%d\n" % (_MAGIC, _VERSION, digest, len(payload))


def save_checkpoint(
    path: str | os.PathLike, state: Mapping[str, Any], *, keep_previous: bool = True
) -> Path:
    """Save ``state`` (what ``torch.load(weights_only=True)`` accepts) atomically with a
    content digest; with ``keep_previous``, an existing ``path`` is first kept as ``prev.pt``
    (``<stem>.prev<suffix>`` beside a file not named ``last.pt``).

    Raises:
        TypeError: ``state`` is not a mapping.
        OSError: the file cannot be written; the old checkpoint is then unchanged.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping (dict), got {type(state).__name__}")
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    payload = buffer.getvalue()
    if keep_previous and path.is_file() and not path.is_symlink():
        previous = "prev.pt" if path.name == "last.pt" else f"{path.stem}.prev{path.suffix}"
        _keep_previous(path, path.with_name(previous))
    return atomic_write(path, _header(payload) + payload)


def _parse_header(data: bytes, path: Path) -> tuple[int, str, int]:
    """The header line's end, digest and payload length."""
    newline = data.find(b"\n", 0, _MAX_HEADER)
    fields = data[:newline].split(b" ") if newline > 0 else []
    if len(fields) != 4 or fields[0] != _MAGIC:
        raise CheckpointError(
            f"{path} is not a snens checkpoint (no 'snens-checkpoint' header line); it may be "
            "truncated to nothing, or another format; load plain torch files with "
            "torch.load(..., weights_only=True)"
        )
    try:
        version = int(fields[1])
        digest = fields[2].removeprefix(b"sha256=").decode("ascii")
        size = int(fields[3].removeprefix(b"bytes="))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: malformed header {data[:newline]!r}") from error
    if version != _VERSION:
        raise CheckpointError(f"{path}: checkpoint format {version}, this snens reads {_VERSION}")
    if size < 0 or len(digest) != 64:
        raise CheckpointError(f"{path}: malformed header {data[:newline]!r}")
    return newline, digest, size


def checkpoint_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of the payload that the header of checkpoint ``path`` records.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: not a snens checkpoint, or a malformed header.
    """
    path = Path(path)
    return _parse_header(_read(path, _MAX_HEADER), path)[1]


def _open_checkpoint(path: Path) -> int:
    """A read-only descriptor of the regular file ``path`` (non-blocking: a FIFO never hangs)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"no checkpoint at {path}") from None
    except IsADirectoryError:  # where a directory cannot be opened (Windows)
        mode = stat.S_IFDIR
    else:
        try:
            mode = os.fstat(fd).st_mode
        except BaseException:
            os.close(fd)
            raise
        if stat.S_ISREG(mode):
            return fd
        os.close(fd)
    kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
    raise CheckpointError(
        f"{path} is {kind}, not a checkpoint file; move it away, then resume from the previous "
        "checkpoint (copy prev.pt over last.pt) or start the run again"
    )


def _read(path: Path, size: int = -1) -> bytes:
    """Up to ``size`` bytes (-1: all) of the checkpoint file ``path``."""
    fd = _open_checkpoint(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(size)
    finally:
        os.close(fd)


def _remedy(path: Path) -> str:
    """What to do about a damaged checkpoint (``best.pt`` has no previous one)."""
    if path.name == "best.pt":
        return (
            "the selected epoch's weights are lost with it: train the run again (its last.pt "
            "holds the last epoch's)"
        )
    return "use the previous checkpoint (prev.pt) or retrain"


def _read_checkpoint(path: Path) -> tuple[str, bytes]:
    """The header's digest and the payload, read only once the file's length matches the
    header's."""
    fd = _open_checkpoint(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as file:
            head = file.read(_MAX_HEADER)
            newline, digest, size = _parse_header(head, path)
            held = os.fstat(fd).st_size - (newline + 1)
            if held != size:
                what = "is truncated" if held < size else "has trailing bytes"
                raise CheckpointError(
                    f"{path} {what}: the header says {size} bytes of payload, the file holds "
                    f"{held}; {_remedy(path)}"
                )
            file.seek(newline + 1)
            payload = file.read(size + 1)
    finally:
        os.close(fd)
    if len(payload) != size:
        raise CheckpointError(
            f"{path} changed while being read (the header says {size} bytes of payload, "
            f"{len(payload)} were read); read it again once nothing writes it"
        )
    return digest, payload


def load_checkpoint(
    path: str | os.PathLike,
    *,
    required: Iterable[str] = TRAINING_KEYS,
    map_location: str | torch.device | None = "cpu",
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, verified and without running code;
    ``required``: keys the state must hold.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: not a snens checkpoint, truncated, a digest mismatch, objects other
            than tensors and plain containers, or a required key missing.
    """
    return load_checkpoint_with_digest(path, required=required, map_location=map_location)[0]


def load_checkpoint_with_digest(
    path: str | os.PathLike,
    *,
    required: Iterable[str] = TRAINING_KEYS,
    map_location: str | torch.device | None = "cpu",
) -> tuple[dict[str, Any], str]:
    """:func:`load_checkpoint`, and the SHA-256 of the payload the state was read from.

    Raises:
        The errors of :func:`load_checkpoint`.
    """
    path = Path(path)
    digest, payload = _read_checkpoint(path)
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(
            f"{path}: content digest mismatch (SHA-256 of the payload differs from the header): "
            f"the file is corrupted or was modified; {_remedy(path)}"
        )
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path}: refused to load: it holds objects other than tensors and plain containers "
            f"(torch.load weights_only=True; nothing from it was run): {error}"
        ) from error
    except Exception as error:  # noqa: BLE001 - a malformed archive fails in many ways
        raise CheckpointError(f"{path}: unreadable payload: {error}") from error
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: the payload is a {type(state).__name__}, not a dict")
    missing = [key for key in required if key not in state]
    if missing:
        raise CheckpointError(
            f"{path}: incomplete checkpoint, missing {missing}; it holds {sorted(state)}"
        )
    return state, digest


def _a(name: str) -> str:
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _more(items: list, shown: int) -> str:
    return f" (+{len(items) - shown} more)" if len(items) > shown else ""


def _tensor_problem(value: Any, own: torch.Tensor) -> str | None:
    """Why ``value`` cannot be copied into the model's tensor ``own``; None when it can."""
    if not isinstance(value, torch.Tensor):
        return f"{_a(type(value).__name__)}, not a tensor"
    if value.layout != torch.strided:
        return f"a {value.layout} tensor, not a dense one"
    if value.is_meta:
        return "a tensor on the meta device, which holds no values"
    if value.shape != own.shape or value.dtype != own.dtype:
        return (
            f"checkpoint {tuple(value.shape)} {value.dtype}, model {tuple(own.shape)} {own.dtype}"
        )
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        return f"{int((~torch.isfinite(value)).sum())} of its {value.numel()} values NaN or inf"
    return None


def load_model_state(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """``model.load_state_dict(state_dict)``, but only after every entry was found to fit:
    the names, and each value a dense, finite tensor of the model's shape and dtype.

    Raises:
        CheckpointError: not a mapping, or names or values that do not fit; nothing is loaded.
    """
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(
            f"the checkpoint's model state is {_a(type(state_dict).__name__)}, not a mapping of "
            "tensors; nothing was loaded. The file was not written by snens (or was changed): "
            "use the previous checkpoint (prev.pt)"
        )
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [str(k) for k in state_dict if k not in own]
    found = {k: _tensor_problem(v, own[k]) for k, v in state_dict.items() if k in own}
    mismatched = [f"{k}: {problem}" for k, problem in found.items() if problem is not None]
    nonfinite = [m for m in mismatched if m.endswith("NaN or inf")]
    if nonfinite and len(nonfinite) == len(mismatched) and not (missing or unexpected):
        named = "; ".join(nonfinite[:3]) + _more(nonfinite, 3)
        raise CheckpointError(
            f"the checkpoint's model state holds values that are NaN or inf ({named}), so "
            "nothing was loaded: the run had diverged, or the file was changed; "
            "use the previous checkpoint (prev.pt), or train again"
        )
    named = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
    problems = [f"{label}: {items[:5]}{_more(items, 5)}" for label, items in named.items() if items]
    if problems:
        raise CheckpointError(
            "the checkpoint does not fit this model; nothing was loaded. "
            + "; ".join(problems)
            + ". Was it saved with another config?"
        )
    try:
        model.load_state_dict(state_dict)
    except (RuntimeError, TypeError, ValueError) as error:  # every entry was checked above
        raise CheckpointError(
            f"the checkpoint's model state could not be loaded: {error}"
        ) from error


# hyperparameters of a param group: finite numbers >= 0 where present
_GROUP_NUMBERS = ("lr", "initial_lr", "weight_decay", "momentum", "dampening", "eps")
# switches of a param group: a bool, or None for torch's default
_GROUP_FLAGS = ("amsgrad", "maximize", "nesterov", "capturable", "differentiable", "foreach")
_GROUP_FLAGS += ("fused", "decoupled_weight_decay")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_rate(value: Any) -> bool:
    """A finite real number >= 0 (or a 0-d tensor of one: torch allows a tensor lr)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_complex():
            return False
        value = value.item()
    real = isinstance(value, int | float) and not isinstance(value, bool)
    return real and math.isfinite(value) and value >= 0


def _list_of(value: Any, length: int, ok: Callable[[Any], bool]) -> bool:
    return isinstance(value, list | tuple) and len(value) == length and all(map(ok, value))


def check_training_state(
    state: Mapping[str, Any],
    path: str | os.PathLike,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Check a training checkpoint's ``optimizer`` and ``schedule`` states before they are
    loaded (``torch.optim`` takes a wrong shape silently): shapes against the live
    ``optimizer`` where given, else the checkpoint's ``model``.

    Raises:
        CheckpointError: what does not fit, named, with the file and the way on.
    """

    def bad(what: str) -> CheckpointError:
        return CheckpointError(
            f"{path}: {what}, so the file was not written by this run's training (its digest "
            "proves it whole, not its values); resume from prev.pt (copy it over last.pt) or "
            "start the run again"
        )

    saved = state.get("optimizer")
    if not (
        isinstance(saved, Mapping)
        and isinstance(saved.get("state"), Mapping)
        and isinstance(saved.get("param_groups"), list | tuple)
        and saved["param_groups"]
    ):
        raise bad("the optimizer state is not torch's mapping of 'state' and 'param_groups'")
    listed = [_group_params(g, group, bad) for g, group in enumerate(saved["param_groups"])]
    shapes = _state_shapes(saved["state"], listed, bad)
    if optimizer is not None:
        _fit_live_optimizer(optimizer, listed, shapes, bad)
    else:
        _fit_model_state(state.get("model"), listed, shapes, bad)
    _check_schedule_state(state.get("schedule"), len(listed), bad)
    step = state.get("step")
    last = state["schedule"]["last_epoch"]
    if _is_int(step) and last != step:  # the schedule steps once per batch, as step counts
        raise bad(
            f"the schedule is at step {last}, the checkpoint's step is {step} (the schedule "
            "steps once per training step): resumed, the rest would train at the learning "
            "rate of another step"
        )


_Bad = Callable[[str], CheckpointError]


def _group_params(g: int, group: Any, bad: _Bad) -> list[int]:
    """The parameter indices of optimizer param group ``g``, its rates and flags checked."""
    params = group.get("params") if isinstance(group, Mapping) else None
    if not isinstance(params, list | tuple) or not all(_is_int(i) for i in params):
        raise bad(f"optimizer param group {g} lists no parameter indices")
    for key in _GROUP_NUMBERS:
        if key in group and not _is_rate(group[key]):
            raise bad(f"optimizer param group {g}: {key} = {group[key]!r:.40} is not a number >= 0")
    for key in _GROUP_FLAGS:
        if key in group and group[key] is not None and not isinstance(group[key], bool):
            raise bad(f"optimizer param group {g}: {key} = {group[key]!r:.40} is not a bool")
    betas = group.get("betas", (0.0, 0.0))
    if not _list_of(betas, 2, lambda b: _is_rate(b) and float(b) < 1):
        raise bad(f"optimizer param group {g}: betas = {betas!r:.60} is not two numbers in [0, 1)")
    return list(params)


def _state_shapes(
    saved: Mapping[Any, Any], listed: list[list[int]], bad: _Bad
) -> dict[int, tuple[int, ...]]:
    """The one shape of the tensors the optimizer keeps for each parameter that has state."""
    indices = [i for params in listed for i in params]
    if len(set(indices)) != len(indices):
        raise bad("the optimizer's param groups list a parameter twice")
    shapes: dict[int, tuple[int, ...]] = {}
    for index, entry in saved.items():
        if index not in set(indices):
            raise bad(f"the optimizer holds a state of parameter {index!r}, which no group lists")
        if not isinstance(entry, Mapping):
            raise bad(f"the optimizer state of parameter {index} is not a mapping")
        found = set()
        for key, value in entry.items():
            if value is None or (key == "step" and _is_rate(value)):
                continue
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise bad(
                    f"the optimizer state of parameter {index} holds {key} = "
                    f"{type(value).__name__}, not a floating-point tensor"
                )
            found.add(tuple(value.shape))
        if len(found) > 1:
            raise bad(
                f"the optimizer state of parameter {index} holds tensors of shapes "
                f"{sorted(found)}, where one parameter's are all of its shape"
            )
        if found:
            shapes[index] = found.pop()
    return shapes


def _fit_live_optimizer(
    optimizer: torch.optim.Optimizer,
    listed: list[list[int]],
    shapes: Mapping[int, tuple[int, ...]],
    bad: _Bad,
) -> None:
    """Every group's size and every state's shape equal the live optimizer's."""
    live = optimizer.param_groups
    if len(live) != len(listed):
        raise bad(
            f"the optimizer state holds {len(listed)} param groups, this model's optimizer "
            f"{len(live)}"
        )
    for g, (group, params) in enumerate(zip(live, listed, strict=True)):
        if len(group["params"]) != len(params):
            raise bad(
                f"optimizer param group {g} holds {len(params)} parameters, this model's "
                f"{len(group['params'])}"
            )
        for param, index in zip(group["params"], params, strict=True):
            if index in shapes and shapes[index] != tuple(param.shape):
                raise bad(
                    f"the optimizer state of parameter {index} (param group {g}) has shape "
                    f"{shapes[index]}, the parameter {tuple(param.shape)}"
                )


def _fit_model_state(
    model: Any, listed: list[list[int]], shapes: Mapping[int, tuple[int, ...]], bad: _Bad
) -> None:
    """Each group's state shapes appear, in order, among the model state's tensor shapes."""
    if not isinstance(model, Mapping):
        return  # load_model_state checks it
    order = [tuple(v.shape) for v in model.values() if isinstance(v, torch.Tensor)]
    for g, params in enumerate(listed):
        at = 0  # greedy: the earliest place of each parameter in model order
        for index in params:
            want = shapes.get(index)  # None: no state yet (never stepped), any place fits
            while at < len(order) and want is not None and order[at] != want:
                at += 1
            if at >= len(order):
                raise bad(
                    f"the optimizer state of parameter {index} (param group {g}) has shape "
                    f"{want}, which no parameter of the checkpoint's model has at that place"
                    if want is not None
                    else f"optimizer param group {g} lists more parameters than the model has"
                )
            at += 1


def _check_schedule_state(schedule: Any, groups: int, bad: _Bad) -> None:
    """A ``LambdaLR`` state: ``last_epoch``, and one base rate and lambda state per group."""
    if not isinstance(schedule, Mapping):
        raise bad(f"the schedule state is a {type(schedule).__name__}, not a mapping")
    if "optimizer" in schedule:  # loading would replace the schedule's optimizer with it
        raise bad("the schedule state holds an 'optimizer' entry")
    last = schedule.get("last_epoch")
    if not _is_int(last) or last < -1:
        raise bad(f"the schedule's last_epoch = {last!r} is not an int >= -1")
    if not _is_int(schedule.get("_step_count", 0)) or schedule.get("_step_count", 0) < 0:
        raise bad(f"the schedule's _step_count = {schedule['_step_count']!r} is not an int >= 0")
    for key, required in (("base_lrs", True), ("_last_lr", False)):
        if key not in schedule and not required:
            continue
        rates = schedule.get(key)
        if not _list_of(rates, groups, _is_rate):
            raise bad(
                f"the schedule's {key} = {rates!r:.80} is not {groups} numbers >= 0, one per "
                "param group"
            )
    lambdas = schedule.get("lr_lambdas")
    if not _list_of(lambdas, groups, lambda fn: fn is None or isinstance(fn, Mapping)):
        raise bad(
            f"the schedule's lr_lambdas = {lambdas!r:.80} is not {groups} entries (None or a "
            "mapping), one per param group"
        )


def load_training_state(
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    state: Mapping[str, Any],
    path: str | os.PathLike,
) -> None:
    """Load a training checkpoint's optimizer and schedule states, after
    :func:`check_training_state` against the live optimizer.

    Raises:
        CheckpointError: the states do not fit (a failure inside torch too).
    """
    check_training_state(state, path, optimizer)
    try:
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(dict(state["schedule"]))
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as error:
        raise CheckpointError(
            f"{path}: its optimizer or schedule state does not fit this run ({error}); resume "
            "from prev.pt (copy it over last.pt) or start the run again"
        ) from error


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators (CPU and every CUDA device),
    as tensors, ints and lists, which ``weights_only=True`` loads."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": list(mt), "gauss_next": gauss},
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned.

    Raises:
        CheckpointError: missing or unusable entries, or CUDA states of another device count.
    """
    missing = [k for k in ("python", "numpy", "torch") if k not in state]
    if missing:
        raise CheckpointError(f"the RNG state lacks {missing}")
    try:
        py, npy = state["python"], state["numpy"]
        random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state(
            (npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
        )
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            cuda = state["cuda"]
            if len(cuda) != torch.cuda.device_count():
                raise CheckpointError(
                    f"the checkpoint holds RNG states of {len(cuda)} CUDA devices, this process "
                    f"sees {torch.cuda.device_count()}; resume with the same devices"
                )
            torch.cuda.set_rng_state_all(cuda)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        raise CheckpointError(f"the checkpoint's RNG state is unusable: {error!r}") from error
