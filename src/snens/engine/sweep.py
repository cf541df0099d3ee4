"""Grids of engine runs: every combination of a few config values, one run directory each.

    snens sweep --preset fashion_mnist_small_cnn_tiny \\
        --grid method.temperature=0.05,0.5,5 --grid seed=0,1,2 --out runs/sweeps/tau

A grid axis is ``KEY=V1,V2,…`` over any config key, each value read as a ``--set`` value.
The runs are the cartesian product of the axes (the last varies fastest), each trained into
``OUT/<run name>``, e.g. ``method.temperature=0.5,seed=1``. Axes that do not apply to a run's
method (:data:`METHOD_ONLY_KEYS`) are dropped from its config and name, so
``--grid method.name=single,snens --grid method.temperature=0.05,5`` is three runs, not four.
Every config is checked before the first run starts; running the command again skips finished
runs and resumes interrupted ones. ``OUT/sweep.csv`` holds one row per run.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snens import files
from snens.engine.config import (
    MEMBER_NORM_METHODS,
    ONE_NETWORK_METHODS,
    OWN_BATCH_METHODS,
    REGULARIZED_METHODS,
    RunConfig,
    apply_overrides,
    load_config,
    to_dict,
)
from snens.engine.runs import (
    CONFIG,
    FINAL,
    LAST,
    MAX_FILE_BYTES,
    RunDirError,
    read_config,
    read_final,
    read_metrics,
)
from snens.engine.toml_io import read_toml

__all__ = [
    "MAX_RUNS",
    "METHOD_ONLY_KEYS",
    "SweepResult",
    "SweepRun",
    "applies",
    "config_differences",
    "final_row",
    "parse_grid",
    "plan",
    "run_sweep",
    "write_csv",
]

#: A grid of more runs than this is refused (almost always a typo in a value list).
MAX_RUNS = 10_000

#: Config keys that apply to some methods only: key -> the methods they apply to (None: every
#: method but "single").
METHOD_ONLY_KEYS: dict[str, tuple[str, ...] | None] = {
    "method.temperature": REGULARIZED_METHODS,
    "method.diversity_weight": REGULARIZED_METHODS,
    "method.diversity_layers": REGULARIZED_METHODS,
    "method.gamma_lr_multiplier": REGULARIZED_METHODS,
    "method.input_policy": OWN_BATCH_METHODS,
    "optim.affine_weight_decay": MEMBER_NORM_METHODS,
    "model.init_from": ONE_NETWORK_METHODS,
    "method.num_members": None,
}

_RESERVED = ("name", "out_dir")  # set by the sweep: the run directory is OUT/<run name>
_MAX_NAME = 200
_SAFE = re.compile(r"[^A-Za-z0-9._,=+-]")
CSV = "sweep.csv"


def applies(key: str, method: str) -> bool:
    """Whether config ``key`` changes a run of ``method`` (see :data:`METHOD_ONLY_KEYS`)."""
    if key not in METHOD_ONLY_KEYS:
        return True
    methods = METHOD_ONLY_KEYS[key]
    return method != "single" if methods is None else method in methods


def _split_values(text: str) -> list[str]:
    """``a,[1, 2],"x,y"`` -> ``["a", "[1, 2]", '"x,y"']``: commas at depth 0, outside quotes."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and (quote == "'" or text[i - 1] != "\\"):
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items]


def _lookup(values: Mapping[str, Any], key: str) -> Any:
    """``values["a"]["b"]`` for key ``"a.b"``; KeyError when absent."""
    target: Any = values
    for part in key.split("."):
        target = target[part]
    return target


def parse_grid(axes: Sequence[str]) -> dict[str, list[str]]:
    """``["seed=0,1", "method.temperature=0.05,5"]`` -> ``{"seed": ["0", "1"], …}``.

    Only the syntax is checked here; :func:`plan` checks keys and values against the config.

    Raises:
        ValueError: an axis without ``=``, an empty key, axis or value, or a key given twice.
    """
    grid: dict[str, list[str]] = {}
    for axis in axes:
        if not isinstance(axis, str) or "=" not in axis:
            raise ValueError(
                f"--grid {axis!r}: an axis must read KEY=V1,V2,…, e.g. method.temperature=0.05,0.5"
            )
        key, text = axis.split("=", 1)
        key = key.strip()
        if not key:
            raise ValueError(f"--grid {axis!r}: the key is empty; e.g. seed=0,1,2")
        _refuse_reserved("--grid", axis)
        if key in grid:
            raise ValueError(
                f"--grid {axis!r}: {key} already has an axis; list all its values in one --grid"
            )
        if not text.strip():
            raise ValueError(f"--grid {axis!r}: the axis {key} has no values; e.g. {key}=V1,V2")
        values = _split_values(text)
        if "" in values:
            raise ValueError(
                f"--grid {axis!r}: the axis {key} has an empty value (two commas, or a comma at "
                "an end); remove it"
            )
        grid[key] = values
    return grid


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its directory's name, grid key -> resolved value (keys its method
    ignores left out), its config, and ``status`` "new", "resume" or "done"."""

    name: str
    values: dict[str, Any]
    config: RunConfig
    status: str

    def path(self) -> Path:
        """The run directory."""
        return Path(self.config.out_dir) / self.name


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "+".join(_format(v) for v in value) if value else "empty"
    if isinstance(value, Mapping):
        return "+".join(f"{k}-{_format(v)}" for k, v in value.items()) if value else "empty"
    return str(value)


def _run_name(values: Mapping[str, Any]) -> str:
    readable = ",".join(f"{key}={_format(value)}" for key, value in values.items()) or "base"
    safe = _SAFE.sub("_", readable)
    if safe != readable or len(safe) > _MAX_NAME:
        # keep apart names that differ only in replaced characters or in a cut tail
        digest = hashlib.sha256(readable.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe[:_MAX_NAME]}-{digest}"
    return safe


def config_differences(path: str | Path, config: RunConfig) -> list[str]:
    """The keys (other than out_dir and name) in which the run saved in ``path`` differs from
    ``config``; a key its ``config.toml`` does not record is not compared.

    Returns:
        One ``"section.key: saved …, grid …"`` line per differing key.

    Raises:
        ValueError: an unreadable ``config.toml``: a directory, FIFO or link, a file above
            ``runs.MAX_FILE_BYTES`` (not read), not UTF-8 TOML or not a valid config; named.
    """
    path = Path(path)
    try:  # a run file: a regular file of at most MAX_FILE_BYTES, never through a link
        what = "run file (snens writes kilobytes there)"  # as runs.read_run_file says
        recorded = read_toml(path / CONFIG, limit=MAX_FILE_BYTES, follow_links=False, what=what)
        saved = to_dict(load_config(recorded))
    except (ValueError, TypeError, OSError) as error:
        raise ValueError(
            f"{path} holds an unreadable {CONFIG} ({error}); move it away or choose another --out"
        ) from None
    wanted = to_dict(config)
    out = []
    for section in sorted(set(saved) - set(_RESERVED)):
        va, vb = saved[section], wanted[section]
        if isinstance(va, dict) and isinstance(vb, dict):
            kept = recorded.get(section, {})
            out += [
                f"{section}.{k}: saved {va.get(k)!r}, grid {vb.get(k)!r}"
                for k in sorted(set(va) | set(vb))
                if va.get(k) != vb.get(k) and k in kept
            ]
        elif va != vb and section in recorded:
            out.append(f"{section}: saved {va!r}, grid {vb!r}")
    return out


def _status(path: Path, config: RunConfig) -> str:
    if not os.path.lexists(path / CONFIG):  # a directory, FIFO or link there: named below
        return "new"
    diff = config_differences(path, config)
    if diff:
        raise ValueError(
            f"{path} holds a run of another config ({'; '.join(diff)}); choose another --out, "
            "or remove that run"
        )
    return "done" if _finished(path) else "resume"


def _finished(path: Path) -> bool:
    """Whether the run in ``path`` has a ``final.json`` with its metrics."""
    try:
        read_final(path)
    except FileNotFoundError:
        return False
    except (ValueError, RunDirError):
        return not os.path.lexists(path / CONFIG)  # unreadable, nothing to resume: reported later
    return True


def plan(
    base: str | os.PathLike | RunConfig | Mapping[str, Any],
    grid: Sequence[str] | Mapping[str, Sequence[str]],
    out: str | os.PathLike,
    overrides: Sequence[str] = (),
) -> list[SweepRun]:
    """Every run of the grid (``KEY=V1,V2`` axes or ``{key: [texts]}``) over ``base`` and its
    ``overrides``, into ``out/<name>``, each config built and checked; nothing is written.

    Returns:
        The runs in grid order, combinations that differ only in keys their method ignores
        merged into one.

    Raises:
        ValueError: an empty, invalid or too large grid, ``--set`` of ``name`` or ``out_dir``,
            or an existing run directory of another config.
        TypeError: a value of the wrong type.
    """
    if isinstance(grid, Mapping):
        grid = [f"{k}={','.join(v)}" for k, v in grid.items()]
    axes = parse_grid(grid)
    if not axes:
        raise ValueError("the grid is empty; give at least one axis, e.g. --grid seed=0,1,2")
    overrides = list(overrides)  # read twice below
    for item in overrides:
        _refuse_reserved("--set", item)
    total = math.prod(len(values) for values in axes.values())
    if total > MAX_RUNS:
        sizes = " × ".join(f"{len(v)} ({k})" for k, v in axes.items())
        raise ValueError(f"the grid has {sizes} = {total} runs, more than {MAX_RUNS}; split it")
    base_values = _base_values(base, overrides)
    out = Path(out)
    _check_axes(axes, base_values)

    runs: dict[str, SweepRun] = {}
    texts_of: dict[str, dict[str, str]] = {}
    for combination in itertools.product(*axes.values()):
        kept, config, values = _combination(base_values, dict(zip(axes, combination)))
        name = _run_name(values)
        if name in runs:
            _check_same_setting(texts_of[name], kept, values)
            continue  # differs from an earlier combination only in keys its method ignores
        config = dataclasses.replace(config, out_dir=str(out), name=name)
        runs[name] = SweepRun(name, values, config, _status(out / name, config))
        texts_of[name] = kept
    return list(runs.values())


def _refuse_reserved(flag: str, item: Any) -> None:
    """Refuse an ``item`` ``KEY=…`` of a key the sweep sets (``name``, ``out_dir``)."""
    key = item.split("=", 1)[0].strip() if isinstance(item, str) else ""
    if key in _RESERVED:
        raise ValueError(
            f"{flag} {item!r}: {key} is set by the sweep (each run goes to OUT/<run name>); "
            "give the parent directory with --out"
        )


def _base_values(
    base: str | os.PathLike | RunConfig | Mapping[str, Any], overrides: Sequence[str]
) -> dict[str, Any]:
    """The base config with the ``--set`` values applied, as dicts."""
    overrides = list(overrides)
    start = apply_overrides(to_dict(load_config(base)), overrides)
    if start["method"].get("name") == "single":  # M of "single" is 1 whatever the base says
        overrides.append("method.num_members=1")
    return to_dict(load_config(base, overrides))


def _check_axes(axes: Mapping[str, list[str]], base_values: dict[str, Any]) -> None:
    """Refuse, axis by axis, a value listed twice or a key the config does not have."""
    for key, texts in axes.items():
        repeated = sorted({t for t in texts if texts.count(t) > 1})
        if repeated:
            raise ValueError(f"--grid {key}: the value {repeated[0]!r} is listed twice; remove one")
        try:  # the key alone: an unknown key is named with the valid ones
            apply_overrides(base_values, [f"{key}={texts[0]}"])
        except (ValueError, TypeError) as error:
            raise type(error)(f"--grid {key}: {error}") from None


def _combination(
    base_values: dict[str, Any], texts: dict[str, str]
) -> tuple[dict[str, str], RunConfig, dict[str, Any]]:
    """A combination's (kept texts, config, resolved values), keys its method ignores dropped."""
    settings = [f"{k}={t}" for k, t in texts.items()]
    method = _lookup(apply_overrides(base_values, settings), "method.name")
    kept = {k: t for k, t in texts.items() if applies(k, method)}
    settings = [f"{k}={t}" for k, t in kept.items()]
    if method == "single":
        settings.append("method.num_members=1")
    try:
        config = load_config(base_values, settings)
    except (ValueError, TypeError) as error:
        raise _blame(error, base_values, kept) from None
    resolved = to_dict(config)
    return kept, config, {k: _lookup(resolved, k) for k in kept}


def _check_same_setting(
    earlier: Mapping[str, str], kept: Mapping[str, str], values: Mapping[str, Any]
) -> None:
    """Refuse two value texts of an axis that give the same run name (the same setting)."""
    if earlier != kept:  # e.g. temperature 5 and 5.0
        k = next(k for k in kept if kept[k] != earlier[k])
        raise ValueError(
            f"--grid {k}: the values {earlier[k]!r} and {kept[k]!r} are the same "
            f"setting ({_format(values[k])}); remove one"
        )


def _blame(error: Exception, base: Mapping[str, Any], texts: Mapping[str, str]) -> Exception:
    """The error of a combination, blamed on one axis value when that value alone fails."""
    for key, text in texts.items():
        try:
            load_config(base, [f"{key}={text}"])
        except (ValueError, TypeError) as alone:
            if str(alone) == str(error):
                return type(error)(f"--grid {key}: value {text!r}: {error}")
    where = ", ".join(f"{k}={t}" for k, t in texts.items())
    return type(error)(f"--grid: the run {where}: {error}")


def final_row(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The numbers of a run's ``final.json``, flat: ``metrics`` keys as they are, others as
    ``<section>/<key>`` (null as NaN).

    Raises:
        RunDirError, ValueError: as :func:`snens.engine.runs.read_final`.
    """
    final = read_final(run_dir)
    row: dict[str, Any] = {}
    for section, values in final.items():
        if not isinstance(values, Mapping):
            continue
        for key, value in values.items():
            name = key if section == "metrics" else f"{section}/{key}"
            row[name] = math.nan if value is None else value
    return row


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, list | tuple | Mapping) else _format(value)


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows as CSV, columns in order of first appearance, missing cells empty, floats exact."""
    columns = {k: None for row in rows for k in row}
    text = io.StringIO(newline="")
    csv.writer(text).writerows([list(columns), *([_cell(r.get(c)) for c in columns] for r in rows)])
    return files.write_text(path, text.getvalue(), mode=files.plain_mode(path))


@dataclass(frozen=True)
class SweepResult:
    """What :func:`run_sweep` did: the runs, and the names and errors of those that failed."""

    runs: list[SweepRun]
    failed: dict[str, str]
    trained: list[str]
    csv: Path
    busy: dict[str, str] = dataclasses.field(default_factory=dict)  # run name → its holder


def _rows(
    runs: Sequence[SweepRun],
    failed: Mapping[str, str],
    keys: Sequence[str],
    busy: Mapping[str, str],
) -> list[dict]:
    rows = []
    for run in runs:
        row: dict[str, Any] = {"run": run.name} | {k: run.values.get(k) for k in keys}
        if (run.path() / FINAL).is_file():
            try:
                values = final_row(run.path())
            except (ValueError, OSError, AttributeError):
                row["status"] = "unreadable final.json"
            else:
                row["status"] = "done"
                row.update(values)
        elif run.name in failed:
            row["status"] = "failed"
        else:
            row["status"] = f"in use by {busy[run.name]}" if run.name in busy else _unfinished(run)
        rows.append(row)
    return rows


def _unfinished(run: SweepRun) -> str:
    """The status of a run with no final.json: "stopped after epoch N" (resumable: interrupted,
    or paused by ``snens tune``) or "pending"."""
    epochs = [r["epoch"] for r in read_metrics(run.path()) if isinstance(r.get("epoch"), int)]
    return f"stopped after epoch {max(epochs)}" if epochs else "pending"


def run_sweep(
    runs: Sequence[SweepRun],
    out: str | os.PathLike,
    *,
    keys: Sequence[str] = (),
    table: Sequence[SweepRun] | None = None,
    progress: bool = False,
    train: Callable[..., Path] | None = None,
    log: Callable[[str], None] = print,
) -> SweepResult:
    """Train the runs of :func:`plan` one after the other, skipping and resuming as planned.

    A run that raises is reported and the sweep goes on; ``sweep.csv`` (listing ``table``,
    default ``runs``, ``keys`` first) is rewritten after every run. A run another live process
    is training is left to it, so the same command in two shells shares the grid out.

    Returns:
        The runs, those that failed, were trained or were in use, and the CSV's path.

    Raises:
        RunDirError: ``out`` is not writable (before any run).
        ValueError: ``table`` lacks a run of ``runs``.
    """
    from snens.engine.runs import RunInUseError, check_writable

    if train is None:
        from snens.engine.train import train
    out = check_writable(out)
    listed = list(runs) if table is None else list(table)
    paths = {r.path() for r in listed}
    missing = [run.name for run in runs if run.path() not in paths]
    if missing:
        raise ValueError(f"table= must list every run trained; it lacks {missing}")
    failed: dict[str, str] = {}
    busy: dict[str, str] = {}
    trained = []
    for i, run in enumerate(runs, 1):
        head = f"[{i}/{len(runs)}] {run.name}"
        path = run.path()
        if _finished(path):
            log(f"{head}: done, skipped")
            continue
        resume = os.path.lexists(path / CONFIG)  # read as a run file: a link is refused
        from_last = " from last.pt" if (path / LAST).is_file() else ""
        log(f"{head}: resuming{from_last}" if resume else f"{head}: training")
        start = time.perf_counter()
        try:
            config = read_config(path) if resume else run.config
            train(config, resume=resume, progress=progress, run_dir=path, log=log)
            trained.append(run.name)
            log(f"{head}: finished in {time.perf_counter() - start:.1f} s")
        except RunInUseError as error:
            busy[run.name] = error.holder
            log(f"{head}: in use by {error.holder}, left to it")
        except Exception as error:  # one failed run must not stop the others
            if isinstance(error, RunDirError) and (path / FINAL).is_file():
                log(f"{head}: finished meanwhile by another process")
            else:
                failed[run.name] = f"{type(error).__name__}: {error}"
                log(f"{head}: FAILED ({failed[run.name]})")
        write_csv(out / CSV, _rows(listed, failed, keys, busy))
    csv_path = write_csv(out / CSV, _rows(listed, failed, keys, busy))
    return SweepResult(list(runs), failed, trained, csv_path, busy)
