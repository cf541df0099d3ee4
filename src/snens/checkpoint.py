"""Crash-safe checkpoints that run no code when loaded.

File layout: one header line, then a ``torch.save`` payload::

    snens-checkpoint 1 sha256=<64 hex digits> bytes=<payload length>\\n
    <payload>

* **Atomic.** :func:`atomic_write` writes a temporary file in the target's directory, flushes
  and fsyncs it, ``os.replace``-s it over the target and fsyncs the directory. A crash at any
  moment leaves either the old complete file or the new complete file, never a mix; a failed
  write removes its temporary file. :func:`save_checkpoint` first keeps the current file as
  ``prev.pt`` beside it (a hard link, so the current one is never absent).
* **Verified.** :func:`load_checkpoint` checks the header, the length (a truncated file is
  caught) and the SHA-256 of the payload (a flipped byte is caught) before unpickling anything,
  and raises :class:`CheckpointError` on any mismatch. The digest detects corruption, not
  forgery: whoever can write the file can write a matching digest, so safety against a
  malicious file comes from the next point.
* **No code.** The payload is read with ``torch.load(..., weights_only=True)`` only, which
  refuses any pickled object other than tensors and plain containers; RNG states are stored
  as tensors and lists so they pass. A refused file raises :class:`CheckpointError`.
* **All or nothing.** :func:`load_model_state` compares names, shapes and dtypes with the
  model before copying a single tensor (``nn.Module.load_state_dict`` copies matching tensors
  before it reports a mismatch).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import random
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "TRAINING_KEYS",
    "CheckpointError",
    "atomic_write",
    "checkpoint_digest",
    "load_checkpoint",
    "load_checkpoint_with_digest",
    "load_model_state",
    "remove_stale_temporaries",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

_MAGIC = b"snens-checkpoint"
_VERSION = 1
_MAX_HEADER = 256  # bytes; the header line is ~110

#: Keys of a training checkpoint written by ``snens.train``.
TRAINING_KEYS = ("model", "optimizer", "schedule", "rng", "epoch", "step", "config")


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or used: truncated, modified, refused or incomplete."""


# ------------------------------------------------------------------------------------------------
# Atomic files
# ------------------------------------------------------------------------------------------------


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable. Not possible on every platform (Windows): skip there.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes, *, exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, whole.

    temporary file in the same directory → write → flush → fsync → ``os.replace`` → fsync of
    the directory. On any error the temporary file is removed and ``path`` is untouched.
    With ``exclusive`` the last step is ``os.link`` instead, which fails if ``path`` exists:
    of two processes writing the same new file at once, exactly one succeeds.

    Raises:
        FileExistsError: ``exclusive`` and ``path`` exists.
        OSError: the directory is missing or not writable, the disk is full, …; the message
            names the path.
    """
    path = Path(path)
    directory = path.parent
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise type(error)(error.errno, f"cannot write {path}: {error.strerror}") from error
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except FileExistsError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if str(path) in str(error):
            raise
        raise type(error)(error.errno, f"cannot write {path}: {error.strerror or error}") from error
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)
    return path


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files a killed :func:`atomic_write` left in ``directory``
    (``.<name>.<random>.tmp``, ``.<name>.link.tmp``); return them. Call it only where no other
    process writes (a run being resumed): a live writer's temporary file looks the same."""
    removed = []
    for tmp in Path(directory).glob(".*.tmp"):
        if tmp.is_file() and not tmp.is_symlink():
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def _keep_previous(path: Path, previous: Path) -> None:
    """Make ``previous`` a complete copy of ``path`` without ever removing ``path``."""
    tmp = previous.with_name(f".{previous.name}.link.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        os.link(path, tmp)  # a second name for the same complete file
    except OSError:  # no hard links on this file system: copy (atomically)
        atomic_write(previous, path.read_bytes())
        return
    try:
        os.replace(tmp, previous)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ------------------------------------------------------------------------------------------------
# Save and load
# ------------------------------------------------------------------------------------------------


def _header(payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).hexdigest()
    return b"%s %d sha256=%s bytes=%d\n" % (_MAGIC, _VERSION, digest.encode(), len(payload))


def save_checkpoint(
    path: str | os.PathLike, state: Mapping[str, Any], *, keep_previous: bool = True
) -> Path:
    """Save ``state`` atomically with a content digest.

    When ``path`` already exists and ``keep_previous``, it is first kept as ``prev.pt`` (for
    ``last.pt``; ``<stem>.prev<suffix>`` otherwise) in the same directory, so after a save the
    two newest checkpoints exist. The new file replaces ``path`` only once it is complete.

    Args:
        path: destination, e.g. ``run_dir / "last.pt"``.
        state: tensors, numbers, strings, bools, None and (nested) dicts, lists, tuples of
            them — what ``torch.load(weights_only=True)`` accepts. A ``state_dict`` qualifies.
        keep_previous: keep the file being replaced as ``prev.pt``.

    Returns:
        ``path``.

    Raises:
        TypeError: ``state`` is not a mapping.
        OSError: the file cannot be written; the old checkpoint is then unchanged and no
            temporary file is left.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping (dict), got {type(state).__name__}")
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    payload = buffer.getvalue()
    if keep_previous and path.is_file():
        _keep_previous(path, _previous_path(path))
    return atomic_write(path, _header(payload) + payload)


def _previous_path(path: Path) -> Path:
    return (
        path.with_name("prev.pt")
        if path.name == "last.pt"
        else path.with_suffix(".prev" + path.suffix)
    )


def _parse_header(data: bytes, path: Path) -> tuple[int, str, int]:
    """The header line's end, digest and payload length, from the file's first bytes."""
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
    return newline, digest, size


def checkpoint_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of the payload that the header of checkpoint ``path`` records, read from
    the header alone (:func:`load_checkpoint` checks the payload against it).

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: not a snens checkpoint, or a malformed header.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    with open(path, "rb") as file:
        head = file.read(_MAX_HEADER)
    return _parse_header(head, path)[1]


def load_checkpoint(
    path: str | os.PathLike,
    *,
    required: Iterable[str] = TRAINING_KEYS,
    map_location: str | torch.device | None = "cpu",
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, verified and without running code.

    Args:
        path: the checkpoint file.
        required: keys the state must hold (the training keys by default; ``()`` for none).
        map_location: where tensors are loaded (CPU by default).

    Returns:
        The state dict.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: not a snens checkpoint; truncated or with trailing bytes; the digest
            does not match (corrupted or modified); the payload holds objects other than
            tensors and plain containers (refused by ``weights_only=True``, nothing is run);
            a required key is missing.
    """
    return load_checkpoint_with_digest(path, required=required, map_location=map_location)[0]


def load_checkpoint_with_digest(
    path: str | os.PathLike,
    *,
    required: Iterable[str] = TRAINING_KEYS,
    map_location: str | torch.device | None = "cpu",
) -> tuple[dict[str, Any], str]:
    """:func:`load_checkpoint`, and the SHA-256 of the payload the state was read from.

    Both come from one read of the file, so the digest names the bytes the state holds even
    if the file is replaced a moment later (reading :func:`checkpoint_digest` afterwards
    could name the newer file's).

    Raises:
        The errors of :func:`load_checkpoint`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    data = path.read_bytes()
    newline, digest, size = _parse_header(data, path)
    payload = data[newline + 1 :]
    if len(payload) != size:
        what = "truncated" if len(payload) < size else "has trailing bytes"
        raise CheckpointError(
            f"{path} is {what}: the header says {size} bytes of payload, the file holds "
            f"{len(payload)}; use the previous checkpoint (prev.pt) or retrain"
        )
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(
            f"{path}: content digest mismatch (SHA-256 of the payload differs from the header): "
            "the file is corrupted or was modified; use the previous checkpoint (prev.pt)"
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


def load_model_state(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """``model.load_state_dict(state_dict)``, but only after every name, shape and dtype matched.

    Raises:
        CheckpointError: missing or unexpected names, or a shape or dtype that differs (the
            first few of each listed); the model is then unchanged.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    mismatched = [
        f"{k}: checkpoint {tuple(v.shape)} {v.dtype}, model {tuple(own[k].shape)} {own[k].dtype}"
        for k, v in state_dict.items()
        if k in own
        and (not isinstance(v, torch.Tensor) or v.shape != own[k].shape or v.dtype != own[k].dtype)
    ]
    if missing or unexpected or mismatched:
        problems = []
        for label, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("mismatched", mismatched),
        ):
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                problems.append(f"{label}: {items[:5]}{more}")
        raise CheckpointError(
            "the checkpoint does not fit this model; nothing was loaded. "
            + "; ".join(problems)
            + ". Was it saved with another config?"
        )
    model.load_state_dict(state_dict)


# ------------------------------------------------------------------------------------------------
# Random number generator states, as tensors and lists (weights_only-safe)
# ------------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators (CPU and every CUDA device).

    Stored as tensors, ints and lists, so the checkpoint loads with ``weights_only=True``.
    """
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
        CheckpointError: a state without the python, numpy or torch entries, with unusable
            entries, or with CUDA states for another number of devices.
    """
    missing = [k for k in ("python", "numpy", "torch") if k not in state]
    if missing:
        raise CheckpointError(f"the RNG state lacks {missing}")
    try:
        _set_rng_state(state)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        raise CheckpointError(f"the checkpoint's RNG state is unusable: {error!r}") from error


def _set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) != torch.cuda.device_count():
            raise CheckpointError(
                f"the checkpoint holds RNG states of {len(cuda)} CUDA devices, this process "
                f"sees {torch.cuda.device_count()}; resume with the same devices"
            )
        torch.cuda.set_rng_state_all(cuda)
