"""Run directories: the evidence every training run leaves behind.

    runs/<name>/
        config.toml       the resolved config (every key): snens.engine.config.load_config
        provenance.json   versions, platform, git SHA of the snens source, command line, times
        metrics.jsonl     one JSON object per epoch, flushed and fsynced as it is written
        last.pt, prev.pt  the newest two checkpoints (snens.engine.checkpoint)
        outputs.npz       the member logits of that evaluation (test, validation, OOD sets)
        final.json        the final evaluation (snens.evaluate), written at the end, last

Everything except ``metrics.jsonl`` is written atomically, nothing through a link, and
non-finite numbers as ``null``. Files are read only as regular files of at most
:data:`MAX_FILE_BYTES`; anything else is a :class:`RunDirError`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import stat
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from snens import files, locks
from snens.engine.checkpoint import atomic_savez, atomic_write
from snens.engine.config import RunConfig, load_config, to_dict, to_toml
from snens.engine.toml_io import parse_toml

__all__ = [
    "Run",
    "RunDirError",
    "RunInUseError",
    "check_new_run",
    "check_writable",
    "config_differences",
    "create_run",
    "git_sha",
    "hold_run",
    "open_run",
    "provenance",
    "read_config",
    "read_final",
    "read_metrics",
    "read_run_file",
    "read_selected_epoch",
    "refuse_existing_run",
    "to_json",
]

CONFIG = "config.toml"
PROVENANCE = "provenance.json"
METRICS = "metrics.jsonl"
FINAL = "final.json"
OUTPUTS = "outputs.npz"
#: What a run's confidence intervals need per example (snens.evaluation.bootstrap.run_examples).
EXAMPLES = "examples.npz"
LAST = "last.pt"
#: A run's files besides config.toml, which is written first.
_RUN_FILES = (PROVENANCE, METRICS, FINAL, OUTPUTS, LAST, "prev.pt")
#: Held (``fcntl.flock``) by the process training the run.
LOCK = "run.lock"
#: The largest run file read (config.toml, final.json, metrics.jsonl, provenance.json).
MAX_FILE_BYTES = 64 * 2**20
#: The largest outputs.npz read, or inflated (ImageNet's test logits at M=4 are 800 MB).
OUTPUTS_MAX_BYTES = 4 * 2**30


class RunDirError(OSError):
    """The run directory cannot be used: not writable, already holding a run, or not a run."""


class RunInUseError(RunDirError):
    """Another live process is training this run; ``holder`` names it (``"host pid"``)."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


@contextlib.contextmanager
def hold_run(path: str | os.PathLike) -> Iterator[Path]:
    """Hold ``path/run.lock`` while the block runs, so that no second process trains the run.

    Raises:
        RunInUseError: a live process holds it; the message names the process.
        RunDirError: the directory cannot be created or written.
    """
    path = check_writable(path)
    with contextlib.ExitStack() as stack:
        try:
            lock = stack.enter_context(locks.hold(path / LOCK, f"the run {path}"))
        except locks.LockHeldError as error:
            raise RunInUseError(str(error), error.holder) from None
        except OSError as error:
            raise RunDirError(
                error.errno, f"cannot take the lock of the run {path} ({error.strerror or error})"
            ) from error
        yield lock


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def to_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` with NaN and inf written as null (strict JSON)."""
    return json.dumps(_json_safe(value), allow_nan=False, **kwargs)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_sha(path: str | os.PathLike | None = None, timeout: float = 5.0) -> str | None:
    """``git rev-parse HEAD`` of the repository holding ``path`` (default: the snens source).

    Returns:
        The SHA, or None (no git, no repository, or slower than ``timeout`` seconds).
    """
    sha = _git(Path(path or Path(__file__).resolve().parent), ["rev-parse", "HEAD"], timeout)
    return sha if sha is not None and len(sha) == 40 else None


def _git(where: Path, args: list[str], timeout: float) -> str | None:
    """Stripped stdout of ``git -C where args``; None if git is missing, fails or times out."""
    command = ["git", "-C", str(where), *args]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance() -> dict[str, Any]:
    """Versions, platform, git SHA (or None) and whether the source has uncommitted changes,
    command line and start time (UTC)."""
    import numpy
    import torch

    import snens

    where = Path(__file__).resolve().parent
    status = _git(where, ["status", "--porcelain", "--untracked-files=no"], 5.0)
    return {
        "snens": snens.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "git_sha": git_sha(),
        "git_dirty": None if status is None else bool(status),
        "command": [sys.executable, *sys.argv],
        "started": _now(),
    }


def check_writable(directory: str | os.PathLike) -> Path:
    """Create ``directory`` if needed and prove it writable by writing and fsyncing a probe.

    Raises:
        RunDirError: the directory cannot be created or written; the message names the cause
            and the fix (for a run's directory, which ``--resume`` keeps where it is, not
            ``--out``).
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        files.check_writable(directory)
    except OSError as error:
        why = error.strerror or error
        if os.path.lexists(directory / CONFIG):  # a run's: resumed where it is
            message = (
                f"the run directory {directory} is not writable ({why}); restore write access "
                "to it, or copy the run directory somewhere writable and resume it there "
                "(`snens train --resume COPY`), nothing was started"
            )
        else:
            message = (
                f"output directory {directory} is not writable ({why}); choose another one "
                "with --out DIR (or run.out_dir), nothing was started"
            )
        raise RunDirError(error.errno, message) from error
    return directory


def refuse_existing_run(path: str | os.PathLike) -> Path:
    """Raise :class:`RunDirError` when ``path`` holds a run, or files of a run without its
    ``config.toml``; ``path`` as a Path otherwise."""
    path = Path(path)
    if os.path.lexists(path / CONFIG):
        raise RunDirError(
            f"{path} already holds a run; resume it with `snens train --resume {path}`, or "
            "choose another name (--set name=…) or --out"
        )
    # config.toml is a run's first file: any other without it is not snens's
    stray = [name for name in _RUN_FILES if os.path.lexists(path / name)]
    if stray:
        raise RunDirError(
            f"{path} holds {', '.join(stray)} but no {CONFIG}, so no run of snens: a new run "
            "is not started among them (they were left as they are); move them away, or "
            "choose another name (--set name=…) or --out"
        )
    return path


def check_new_run(path: str | os.PathLike) -> Path:
    """Check that a new run can be made at ``path``: holding no run yet, and writable.

    Raises:
        RunDirError: already holding a run, or not writable.
    """
    return check_writable(refuse_existing_run(path))


@dataclass(frozen=True)
class Run:
    """An open run directory."""

    path: Path
    config: RunConfig

    @property
    def checkpoint(self) -> Path:
        """``last.pt``: the newest complete checkpoint."""
        return self.path / LAST

    @contextlib.contextmanager
    def writing(self, what: str | os.PathLike) -> Iterator[None]:
        """Turn an ``OSError`` while writing ``what`` into a :class:`RunDirError` that names the
        file and how to go on."""
        try:
            yield
        except RunDirError:
            raise
        except files.FileRefusedError as error:  # a link or FIFO in the run
            raise _refused(error, str(error)) from None
        except OSError as error:
            raise RunDirError(
                error.errno,
                f"cannot write {what} ({error.strerror or error}); free space or restore write "
                f"access, then continue with `snens train --resume {self.path}`: what was saved "
                "before (the last checkpoint, metrics.jsonl) is intact",
            ) from error

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line to ``metrics.jsonl``, flushed and fsynced."""
        with self.writing(self.path / METRICS):
            with files.open_append(self.path / METRICS) as file:
                file.write((to_json(record) + "\n").encode())
                file.flush()
                os.fsync(file.fileno())

    def truncate_metrics(self, epochs: int) -> None:
        """Keep the lines of epochs 1..``epochs`` only (and drop a half-written last line),
        on resume; warn where some of those epochs are missing."""
        records = read_metrics(self.path)
        # a record without an epoch is kept as before; one whose epoch is not an int is not
        kept = [r for r in records if "epoch" not in r or (_epoch(r) or 0) in range(epochs + 1)]
        missing = sorted(set(range(1, epochs + 1)) - {_epoch(r) for r in kept})
        if missing:
            warnings.warn(
                f"{self.path / METRICS} holds {epochs - len(missing)} of the {epochs} epochs "
                f"that {self.checkpoint} has trained (missing: {_spans(missing)}): their "
                "per-epoch history is lost, training goes on from the checkpoint; restore the "
                "file from a backup of the run to keep it",
                stacklevel=2,
            )
        with self.writing(self.path / METRICS):
            atomic_write(self.path / METRICS, "".join(to_json(r) + "\n" for r in kept).encode())

    def provenance(self) -> dict[str, Any]:
        """``provenance.json`` as a dict; empty where it is missing.

        Raises:
            RunDirError: as :func:`read_run_file`.
            ValueError: it is not UTF-8 JSON holding an object; the message names the fix.
        """
        info = self._provenance()
        return {} if info is None else info

    def _provenance(self) -> dict[str, Any] | None:
        """``provenance.json`` as a dict, None where it is missing (see :meth:`provenance`)."""
        path = self.path / PROVENANCE
        try:
            data = read_run_file(path)
        except FileNotFoundError:
            return None
        fix = (
            "the file is damaged, so it was left as it is; restore it from a backup of the "
            "run, or move it away to have the next `snens train --resume "
            f"{self.path}` record a new one (the versions, platform and command of the run's "
            "start are then lost)"
        )
        try:
            info = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path} is not UTF-8 ({error.reason} at byte {error.start}): {fix}"
            ) from None
        except (ValueError, RecursionError) as error:
            raise ValueError(f"{path} is not valid JSON ({error}): {fix}") from None
        if not isinstance(info, dict):
            raise ValueError(f"{path} holds a JSON {type(info).__name__}, not an object: {fix}")
        return info

    def _write(self, name: str, content: Mapping[str, Any]) -> Path:
        """Write ``name`` atomically: an npz archive of arrays, else indented JSON."""
        with self.writing(self.path / name):
            if name.endswith(".npz"):
                return atomic_savez(self.path / name, content)
            return atomic_write(self.path / name, (to_json(content, indent=2) + "\n").encode())

    def record(self, **fields: Any) -> None:
        """Set ``fields`` in ``provenance.json`` (rewritten atomically)."""
        self._write(PROVENANCE, {**self.provenance(), **fields})

    def write_outputs(self, outputs: Mapping[str, Any]) -> Path:
        """Write the final evaluation's member logits (M, N, K) and labels, ``outputs.npz``."""
        return self._write(OUTPUTS, outputs)

    def write_examples(self, arrays: Mapping[str, Any]) -> Path:
        """Write the per-example quantities of the final evaluation, ``examples.npz``."""
        return self._write(EXAMPLES, arrays)

    def write_final(self, results: Mapping[str, Any]) -> Path:
        """Write ``final.json`` atomically."""
        return self._write(FINAL, results)


def _epoch(record: Mapping[str, Any]) -> int | None:
    """A metrics record's epoch, None when it has none (or not an int)."""
    epoch = record.get("epoch")
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def _spans(numbers: list[int]) -> str:
    """``1-3, 5`` for ``[1, 2, 3, 5]``."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _run_path(config: RunConfig, run_dir: str | os.PathLike | None) -> Path:
    """``run_dir``, by default ``out_dir/name`` (a timestamped name where ``name`` is "")."""
    if run_dir is not None:
        return Path(run_dir)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    default = f"{config.data.dataset}-{config.model.backbone}-{config.method.name}-{stamp}"
    return Path(config.out_dir) / (config.name or default)


def create_run(config: RunConfig, run_dir: str | os.PathLike | None = None) -> Run:
    """Make a new run directory (``run_dir``, default ``out_dir/name``) holding
    ``config.toml`` and ``provenance.json``.

    Raises:
        RunDirError: not writable, or it already holds a run; or ``provenance.json`` could not
            be written after ``config.toml`` (the message says to ``--resume`` the run).
    """
    path = _run_path(config, run_dir)
    check_new_run(path)
    try:  # of two processes creating the same run at once, one gets it
        atomic_write(path / CONFIG, to_toml(config).encode(), exclusive=True)
    except FileExistsError:
        raise RunDirError(
            f"{path} already holds a run (another process created it at the same moment); "
            f"resume it with `snens train --resume {path}`, or choose another name"
        ) from None
    try:
        atomic_write(path / PROVENANCE, (to_json(provenance(), indent=2) + "\n").encode())
    except OSError as error:
        why = os.strerror(error.errno) if error.errno else error  # its strerror names the file
        raise RunDirError(
            error.errno,
            f"cannot write {path / PROVENANCE} ({why}); the run holds its "
            f"{CONFIG} only, nothing was trained: free space or restore write access, then "
            f"start it with `snens train --resume {path}` (which records provenance.json then)",
        ) from error
    return Run(path, config)


def open_run(run_dir: str | os.PathLike, config: RunConfig | None = None) -> Run:
    """Open an existing run directory to resume it; records the resume in ``provenance.json``
    (a missing one is made anew, marked as made at the resume).

    ``config``, where given, must equal the saved ``config.toml``.

    Raises:
        RunDirError: not a run directory, not writable, or a ``provenance.json`` that is not a
            regular file of at most :data:`MAX_FILE_BYTES`.
        ValueError: ``config`` differs from the saved one (the keys named), or
            ``provenance.json`` is damaged (left as it is).
    """
    path = Path(run_dir)
    if not os.path.lexists(path / CONFIG):
        raise RunDirError(f"{path} is not a run directory (no {CONFIG})")
    check_writable(path)
    saved = read_config(path)
    _check_checkpoint_file(path / LAST)
    if config is not None and config != saved:
        diff = config_differences(to_dict(saved), to_dict(config))
        raise ValueError(
            f"the config differs from the one {path} was started with: {'; '.join(diff)}. A "
            "resumed run continues the same run; start a new one to change settings"
        )
    run = Run(path, saved)
    info = run._provenance()  # a damaged one is refused, never overwritten
    if info is None:  # lost, e.g. to a full disk as the run was created
        info = {**provenance(), "rebuilt": _REBUILT}
    resume = {"time": _now(), "command": [sys.executable, *sys.argv], "git_sha": git_sha()}
    earlier = info.get("resumed", [])
    run._write(PROVENANCE, {**info, "resumed": [*_as_list(earlier), resume]})
    return run


#: provenance.json's note where a resume found none and recorded a new one.
_REBUILT = (
    "provenance.json was missing when the run was resumed, so this record was made at that "
    "resume: its versions, platform, git SHA, command and start time are the resume's, not "
    "those the run started with"
)


def _as_list(value: Any) -> list[Any]:
    """``value`` if it is a list, else a list of it (an edited ``resumed`` entry kept)."""
    return value if isinstance(value, list) else [value]


def _check_checkpoint_file(path: Path) -> None:
    """A ``last.pt`` that exists must be a regular file (a directory in its place would make
    the run start again at epoch 1, then fail to save)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.path.islink(path):
            return  # stopped before its first checkpoint: it starts afresh
        kind = "a symbolic link to nothing"
    else:
        if stat.S_ISREG(mode):
            return
        kind = files.file_kind(mode)
    raise RunDirError(
        f"{path} is {kind}, not a checkpoint file, so the run cannot be resumed from it; move "
        f"it away, then copy prev.pt over it to resume from the checkpoint before, or leave "
        "no last.pt to train the run again from epoch 1"
    )


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``"key: saved A, given B"`` for every key whose values differ between two config dicts."""
    out = []
    for key in sorted(set(a) | set(b)):
        full = f"{prefix}{key}"
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += config_differences(va, vb, full + ".")
        elif va != vb:
            out.append(f"{full}: saved {va!r}, given {vb!r}")
    return out


def read_run_file(path: str | os.PathLike, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path``, read only if it is a regular file (not a link, never blocking on
    a FIFO) of at most ``limit`` bytes.

    Raises:
        FileNotFoundError: no file at ``path``.
        RunDirError: not a regular file, a file above ``limit`` bytes, or a read that failed.
    """
    try:
        return files.read_bytes(path, limit=limit, what="run file (snens writes kilobytes there)")
    except FileNotFoundError:
        raise
    except OSError as error:
        raise _refused(error, error.strerror or str(error)) from None


def _refused(error: OSError, message: str) -> RunDirError:
    """A :class:`RunDirError` of ``message`` with ``error``'s errno."""
    refused = RunDirError(message)
    refused.errno = error.errno
    return refused


def _text(path: Path, data: bytes) -> str:
    """``data`` decoded as UTF-8 with universal newlines, as ``Path.read_text`` reads it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 ({error.reason} at byte {error.start}): the file is damaged; "
            "restore it from a backup of the run"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_config(run_dir: str | os.PathLike) -> RunConfig:
    """A run's ``config.toml``, read as :func:`read_run_file` reads.

    Raises:
        FileNotFoundError, RunDirError: as :func:`read_run_file`.
        ValueError, TypeError: it is not UTF-8 TOML, or not a valid config.
    """
    path = Path(run_dir) / CONFIG
    return load_config(parse_toml(_text(path, read_run_file(path)), path))


def read_final(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A finished run's ``final.json``: a JSON object holding a ``"metrics"`` mapping.

    Raises:
        FileNotFoundError, RunDirError: as :func:`read_run_file`.
        ValueError: it is not UTF-8 JSON, not an object, or holds no ``"metrics"`` mapping.
    """
    path = Path(run_dir) / FINAL
    text = _text(path, read_run_file(path))
    try:
        final = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(final, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(final).__name__}")
    if not isinstance(final.get("metrics"), Mapping):
        raise ValueError(
            f'{path} holds no "metrics" mapping, so the run is not finished (the file is '
            f"damaged or was not written by snens); finish it with `snens train --resume "
            f"{Path(run_dir)}`"
        )
    return final


def read_outputs(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A finished run's kept member logits, ``outputs.npz``, as tensors: ``test`` (M, N, K),
    ``test_labels`` (N,), and ``val``, ``val_labels``, ``ood/<name>`` where the run had them.

    Raises:
        FileNotFoundError, RunDirError: as :func:`read_run_file`.
        ValueError: not an npz archive, damaged, or an array of the wrong kind.
    """
    path = Path(run_dir) / OUTPUTS
    return parse_outputs(path, read_run_file(path, limit=OUTPUTS_MAX_BYTES))


def read_examples(run_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """A finished run's per-example quantities, ``examples.npz``: 1-d arrays by name.

    Raises:
        FileNotFoundError, RunDirError: as :func:`read_run_file`.
        ValueError: not an npz archive, damaged, or an array that is not 1-d, numeric and
            finite (snens writes finite values only: a NaN or inf is damage).
    """
    path = Path(run_dir) / EXAMPLES
    data = read_run_file(path, limit=OUTPUTS_MAX_BYTES)
    arrays = files.load_npz(data, name=path, limit=outputs_inflation_limit(len(data)))
    for key, array in arrays.items():
        if array.ndim != 1 or array.dtype.kind not in "fiub":
            raise ValueError(
                f"{path}: {key} is a {array.dtype} array of shape {array.shape}, expected one "
                "number per example"
            )
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = np.flatnonzero(~np.isfinite(array))
            raise ValueError(
                f"{path}: {key} holds {len(bad)} value(s) that are NaN or infinite (the first "
                f"at example {bad[0]}: {array[bad[0]]}), which snens never writes there: the "
                "file is damaged; restore it from a backup of the run, or move final.json away "
                f"and run `snens train --resume {Path(run_dir)}`, which evaluates the run's kept "
                "weights again and rewrites it"
            )
    return arrays


def outputs_inflation_limit(size: int) -> int:
    """The most bytes an ``outputs.npz`` of ``size`` bytes may inflate to (float logits
    compress less than 2×)."""
    return min(OUTPUTS_MAX_BYTES, max(256 * 2**20, 32 * size))


def parse_outputs(path: Path, data: bytes) -> dict[str, Any]:
    """The tensors of ``outputs.npz``'s bytes ``data`` (read from ``path``), checked as
    :func:`read_outputs` says; labels as int64."""
    import torch  # runs.py serves the CLI's light commands without torch

    arrays = files.load_npz(data, name=path, limit=outputs_inflation_limit(len(data)))
    if "test" not in arrays or "test_labels" not in arrays:
        raise ValueError(f"{path} holds no test logits and labels (test, test_labels)")
    out = {}
    for key, array in arrays.items():
        labels = key.endswith("_labels")
        logits_of = arrays.get(key.removesuffix("_labels")) if labels else None
        if labels:
            ok = array.ndim == 1 and array.dtype.kind in "iu"
            ok = ok and logits_of is not None and logits_of.ndim == 3
            ok = ok and array.shape[0] == logits_of.shape[1]
        else:
            ok = array.ndim == 3 and array.dtype.kind == "f"
        if not ok:
            want = "(N,) integer labels of its logits' N" if labels else "(M, N, K) float logits"
            raise ValueError(
                f"{path}: {key} is a {array.dtype} array of shape {array.shape}, expected {want}"
            )
        if not labels and (array.shape[0] < 1 or array.shape[1] < 1 or array.shape[2] < 2):
            raise ValueError(
                f"{path}: {key} holds logits of shape {array.shape} (M, N, K): no member, no "
                "example or fewer than 2 classes, so there is nothing to measure; the file is "
                "damaged or not a run's, train the run again to write it"
            )
        if labels and array.size:
            classes = logits_of.shape[2]
            low, high = int(array.min()), int(array.max())
            if low < 0 or high >= classes:
                raise ValueError(
                    f"{path}: {key} holds label {low if low < 0 else high}, outside the "
                    f"{classes} classes (0..{classes - 1}) of its logits; the file is damaged"
                )
            array = array.astype(np.int64)
        out[key] = torch.from_numpy(array)
    return out


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The per-epoch records of ``metrics.jsonl``, oldest first; a half-written last line is
    skipped, and no file reads as no records.

    Raises:
        RunDirError: as :func:`read_run_file`.
        ValueError: a line before the last that is not UTF-8.
    """
    path = Path(run_dir) / METRICS
    try:
        data = read_run_file(path)
    except FileNotFoundError:
        return []
    records = []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        last = number == len(lines)  # no newline after it: possibly cut short by a kill
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            if last:
                continue
            raise ValueError(
                f"{path}, line {number}: not UTF-8 ({error.reason} at byte {error.start} of "
                "the line): the file is damaged; restore it from a backup, or delete that line "
                "(its epoch's record is then lost; the checkpoints are not affected)"
            ) from None
        with contextlib.suppress(ValueError, RecursionError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def read_selected_epoch(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The ``metrics.jsonl`` record of the epoch a finished run selected on validation.

    Returns:
        The record; None for a run that selected no single epoch (no ``optim.select``, or a
        deep ensemble's members each on its own) or whose record of that epoch is missing.

    Raises:
        FileNotFoundError, RunDirError, ValueError: as :func:`read_final`.
    """
    selection = read_final(run_dir).get("selection")
    epoch = selection.get("epoch") if isinstance(selection, dict) else None
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    return next((r for r in reversed(read_metrics(run_dir)) if r.get("epoch") == epoch), None)
