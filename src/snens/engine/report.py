"""Tables of finished runs: mean ± std over seeds per configuration, as Markdown, CSV and plots.

    snens report runs/sweeps/tau --out runs/sweeps/tau/report

A run is any directory holding ``config.toml`` and ``final.json``, searched recursively; runs
whose configs differ only in ``seed`` (and keys their method ignores,
:func:`snens.engine.sweep.applies`) form a row. A non-finite value is left out of the mean and
std and named. Each run counts once: a nested run or a copy of a counted one is skipped with a
note. With matplotlib the report also draws Pareto, shift, reliability and allocation plots.
Where the runs selected their epoch on validation, the row of the best validation metric is
chosen (:func:`snens.engine.selection.choose_on_validation`): the test set plays no part.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from snens import files
from snens.engine.checkpoint import CheckpointError, checkpoint_digest, load_checkpoint
from snens.engine.compare import COMPARISON_HEADER, Comparison, compare_runs, comparison_cells
from snens.engine.config import to_dict
from snens.engine.runs import (
    CONFIG,
    FINAL,
    LAST,
    OUTPUTS,
    OUTPUTS_MAX_BYTES,
    PROVENANCE,
    read_config,
    read_final,
    read_outputs,
    read_run_file,
    read_selected_epoch,
)
from snens.engine.selection import SELECT_METRICS, SELECT_NAMES, Choice, choose_on_validation
from snens.engine.sweep import applies
from snens.evaluation.protocol import CALIBRATED_PREFIXES, CONFORMAL_SCORES
from snens.method.allocation import LayerAllocation, allocation
from snens.method.ensemble import predictive_probs
from snens.nn import MemberNorm

__all__ = [
    "Group",
    "Report",
    "collect_runs",
    "group_runs",
    "markdown_table",
    "summarize",
    "write_report",
]

_IGNORED = ("seed", "name", "out_dir")
_SHORT = {
    "method.name": "method",
    "method.temperature": "τ",
    "method.num_members": "M",
    "method.diversity_weight": "λ",
}
_VALIDATION = ("val/accuracy", "val/nll", "val/ece", "val/disagreement")
_CORE = ("test/accuracy", "test/nll", "test/ece", "test/brier")
_CALIBRATED = tuple(
    f"{prefix}/{m}" for prefix in CALIBRATED_PREFIXES.values() for m in ("nll", "ece")
)
_CONFORMAL = tuple(
    f"test/conformal_{score}_{m}" for score in CONFORMAL_SCORES for m in ("coverage", "size")
)
_SHIFT = ("shift/mean/accuracy", "shift/mean/ece")
_OOD = ("auroc", "aupr", "fpr95")
# the OOD scores shown before the maximum probability's, in this order
_OOD_FIRST = ("energy", "max_logit")
_EXTRA = {"params": ("model", "params"), "train seconds": ("train", "seconds")}
# The methods whose member norms learn importances σ(γ) (FiLM's γ is fixed at +∞).
_ALLOCATION_METHODS = ("snens",)
# a larger int in final.json has no float value
_LARGEST_FLOAT = int(np.finfo(np.float64).max)


@dataclass(frozen=True)
class RunRecord:
    """One finished run: its directory, flat config (``"method.temperature"`` keys), final.json."""

    path: Path
    config: dict[str, Any]
    final: dict[str, Any]

    def metric(self, name: str) -> float | None:
        """A metric of final.json, or params/train seconds; None when absent, NaN for null."""
        section, key = _EXTRA.get(name, ("metrics", name))
        values = self.final.get(section, {})
        if not isinstance(values, Mapping) or key not in values:
            return None
        value = values[key]
        return math.nan if value is None else float(value)


@dataclass(frozen=True)
class Group:
    """Runs of one configuration: ``key`` the config values but seed, ``runs`` in seed order."""

    key: tuple[tuple[str, Any], ...]
    runs: list[RunRecord] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return [r.config["seed"] for r in self.runs]


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` wrote: the Markdown table, the files and notes."""

    table: str
    path: Path
    csv: Path
    plots: list[Path]
    notes: list[str]
    #: The table at a glance (:data:`GLANCE`), for a terminal.
    summary: str = ""
    #: The sentence naming the row chosen on validation (None: no two rows to choose from).
    choice: str | None = None
    #: Every row against each baseline: ``(row, baseline, comparison)``, labels as in the table.
    comparisons: list[tuple[str, str, Comparison]] = field(default_factory=list)


#: The columns of the table at a glance (those the runs hold), then an OOD set's AUROCs.
GLANCE = ("test/accuracy", "test/nll", "test/ece", "test_ts/nll", "test_ts/ece")
_GLANCE_TAIL = ("params", "train seconds")
_GLANCE_NAMES = {
    "test/accuracy": "acc",
    "test/nll": "NLL",
    "test/ece": "ECE",
    "test_ts/nll": "NLL +TS",
    "test_ts/ece": "ECE +TS",
    "params": "params",
    "train seconds": "train s",
}


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def _read_run(path: Path) -> RunRecord:
    config = _flatten(to_dict(read_config(path)))
    final = read_final(path)
    for section in ("metrics", *(s for s, _ in _EXTRA.values())):
        values = final.get(section, {})
        ok = isinstance(values, dict) and all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool))
            for v in values.values()
        )
        if not ok:
            raise ValueError(f"{path / FINAL}: {section!r} must map names to numbers")
        for key, value in values.items():  # 10**400 parses as an int no float holds
            if isinstance(value, int) and abs(value) > _LARGEST_FLOAT:
                raise ValueError(
                    f"{path / FINAL}: {section}.{key} = {str(value)[:20]}… ({len(str(value))} "
                    "digits) is larger than any float, so the file is damaged or was not "
                    "written by snens"
                )
    return RunRecord(path, config, final)


def collect_runs(paths: Iterable[str | os.PathLike]) -> tuple[list[RunRecord], list[str]]:
    """Every run directory (config.toml and final.json) at or under ``paths``, each once.

    Returns:
        ``(runs, skipped)``: the runs in path order, and a line per directory that looks like
        a run but could not be read, or that repeats a run, saying why.

    Raises:
        ValueError: a path that does not exist or is not a directory, or no run at all.
    """
    paths = list(paths)
    if not paths:
        raise ValueError("give at least one run or sweep directory")
    found: dict[Path, None] = {}
    for given in paths:
        path = Path(given)
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            raise ValueError(f"{str(given)!r} {what}; give run or sweep directories")
        # lexists: a final.json that is a FIFO or link is read (refused) below, not passed over
        candidates = [path] if os.path.lexists(path / FINAL) else []
        candidates += sorted(p.parent for p in path.rglob(FINAL) if p.parent != path)
        found.update(dict.fromkeys(c.resolve() for c in candidates))
    runs, skipped = [], []
    counted: dict[tuple, Path] = {}  # (configuration, seed) -> the run counted for it
    trained: dict[tuple[str, str], Path] = {}  # (file, digest) -> the run counted with it
    for path in found:
        if not os.path.lexists(path / CONFIG):  # a final.json alone: its settings are unknown
            skipped.append(f"skipped {path}: {FINAL} without {CONFIG}; restore it from the run")
            continue
        outer = next((p for p in path.parents if p in found), None)
        if outer is not None:  # a backup or copy kept inside a run: not another seed
            skipped.append(
                f"skipped {path}: it lies inside the run directory {outer} (a backup or copy "
                "of a run?), and a run counts once; move it out of that run to report it"
            )
            continue
        try:
            run = _read_run(path)
        except (ValueError, TypeError, OSError) as error:
            skipped.append(f"skipped {path}: {error}")
            continue
        same = counted.setdefault((_group_key(run.config), run.config["seed"]), path)
        if same != path:  # a copied run directory
            skipped.append(
                f"skipped {path}: the same configuration and seed ({run.config['seed']}) as "
                f"{same}, so a copy of that run (or a rerun of it); each seed counts once: "
                "remove the copy, or give it another seed"
            )
            continue
        # a copy whose config.toml was edited (another seed) is the same trained model
        prints = _fingerprints(path)
        copied = next(((k[0], trained[k]) for k in prints.items() if k in trained), None)
        if copied is not None:
            counted.pop((_group_key(run.config), run.config["seed"]))
            kind, original = copied
            skipped.append(
                f"skipped {path}: its {kind} is byte for byte that of {original}, so it is a "
                "copy of that run whatever its config.toml says (a seed edited in a copy "
                "trains nothing); each run counts once: remove the copy"
            )
            continue
        trained.update(dict.fromkeys(prints.items(), path))
        runs.append(run)
    if not runs:
        where = ", ".join(repr(str(p)) for p in paths)
        raise ValueError(
            f"no finished runs (directories with {CONFIG} and {FINAL}) under {where}"
            + (f"; {len(skipped)} could not be read: {'; '.join(skipped)}" if skipped else "")
        )
    return runs, skipped


def _fingerprints(path: Path) -> dict[str, str]:
    """The digests of a run's ``outputs.npz`` and ``last.pt`` payload, where readable."""
    prints = {}
    with contextlib.suppress(OSError, ValueError):
        prints[OUTPUTS] = files.sha256(path / OUTPUTS, limit=OUTPUTS_MAX_BYTES)
    with contextlib.suppress(OSError, ValueError):
        prints[LAST] = checkpoint_digest(path / LAST)
    return prints


def _group_key(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The configuration a run belongs to: its config but the ignored keys."""
    method = config["method.name"]
    return tuple(
        (k, v) for k, v in sorted(config.items()) if k not in _IGNORED and applies(k, method)
    )


def group_runs(runs: Sequence[RunRecord]) -> tuple[list[Group], list[str]]:
    """Groups of runs whose configs differ only in seed, and the keys that vary between them.

    Returns:
        ``(groups, varied)``: groups sorted by their varied values; ``varied`` the config keys
        (other than seed, name, out_dir) whose values differ between the groups that have
        them, and M, τ and λ wherever some groups lack them (a single model next to σN-Ens).
    """
    groups: dict[tuple, Group] = {}
    for run in runs:
        key = _group_key(run.config)
        groups.setdefault(key, Group(key)).runs.append(run)
    known = {k for group in groups for k, _ in group}
    keys = [k for k in runs[0].config if k in known] + sorted(known - set(runs[0].config))
    values = [dict(group) for group in groups]
    varied = [k for k in keys if _varies(k, values)]
    # method.name first, then the keys in config order
    varied.sort(key=lambda k: (k != "method.name", keys.index(k)))
    ordered = sorted(groups.values(), key=lambda g: [_order(dict(g.key).get(k)) for k in varied])
    for group in ordered:
        group.runs.sort(key=lambda r: (r.config["seed"], str(r.path)))
    return ordered, varied


_MISSING = "—"


def _varies(key: str, values: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the groups differ in ``key``, one it applies to lacks it, or some lack M, τ, λ."""
    lacking = [v["method.name"] for v in values if key not in v]
    return (
        len({repr(v[key]) for v in values if key in v}) > 1
        or any(applies(key, method) for method in lacking)
        or (key in _SHORT and bool(lacking))
    )


def _order(value: Any) -> tuple:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (1, str(value))
    return (0, float(value))


def metric_names(runs: Sequence[RunRecord]) -> list[str]:
    """The report's metrics that at least one run holds, in report order."""
    present = {k: None for run in runs for k in run.final.get("metrics", {})}
    names = [m for m in (*_VALIDATION, *_CORE, *_CALIBRATED, *_CONFORMAL) if m in present]
    ood_sets = dict.fromkeys(k.split("/")[1] for k in present if k.startswith("ood/"))
    for s in ood_sets:
        scored = [
            k
            for k in present
            if k.startswith(f"ood/{s}/") and k.endswith("/auroc") and k.count("/") == 3
        ]
        first = [k for k in (f"ood/{s}/{score}/auroc" for score in _OOD_FIRST) if k in scored]
        names += first
        names += [f"ood/{s}/{m}" for m in _OOD if f"ood/{s}/{m}" in present]
        names += [k for k in scored if k not in first]
    names += [m for m in _SHIFT if m in present]
    names += [m for m in _EXTRA if any(r.metric(m) is not None for r in runs)]
    return names


def summarize(values: Sequence[float]) -> tuple[float, float, int]:
    """``(mean, std, n)``: std over the values with ddof=1, NaN for one value."""
    array = np.asarray(values, dtype=np.float64)
    std = float(np.std(array, ddof=1)) if array.size > 1 else math.nan
    return float(np.mean(array)), std, int(array.size)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of ``header`` and ``rows`` of cells (a ``|`` inside a cell escaped).

    Returns:
        The header line, its ``|---|`` line and one line per row, without a final newline.
    """

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def _value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _cell(
    metric: str,
    stats: tuple[float, float, int] | None,
    n_group: int,
    left_out: Sequence[float] = (),
) -> str:
    """``mean ± std`` over the finite values, n where it is not the group's, and ``left_out``."""
    if stats is None and not left_out:
        return "—"
    if stats is None:  # nothing finite: the values as they are, with their count
        shown = ", ".join(dict.fromkeys(_nonfinite(v) for v in left_out))
        return f"{shown} (n={len(left_out)})"
    mean, std, n = stats
    digits = _digits(metric)
    text = f"{mean:.{digits}f}"
    if n > 1:
        text += f" ± {std:.{digits}f}"
    if left_out:
        text += f" (n={n}; left out: {', '.join(_nonfinite(v) for v in left_out)})"
    elif n == 1 or n < n_group:
        text += f" (n={n})"
    return text


def _digits(metric: str) -> int:
    return 0 if metric == "params" else 1 if metric == "train seconds" else 4


def _nonfinite(value: float) -> str:
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def _label(group: Group, varied: Sequence[str]) -> str:
    values = dict(group.key)
    parts = [
        f"{_SHORT.get(k, k)}={_value(values[k])}" if k != "method.name" else str(values[k])
        for k in varied
        if k in values
    ]
    return ", ".join(parts) or "all runs"


def _baseline_group(groups: Sequence[Group], varied: Sequence[str], baseline: Any) -> Group:
    """The row whose runs lie in ``baseline``."""
    where = Path(baseline).resolve()

    def inside(run: RunRecord) -> bool:
        path = run.path.resolve()
        return path == where or where in path.parents

    chosen = [g for g in groups if any(inside(r) for r in g.runs)]
    if len(chosen) != 1:
        labels = "; ".join(_label(g, varied) for g in groups)
        raise ValueError(
            f"--baseline {str(baseline)!r} holds the runs of {len(chosen)} rows, not one; give "
            f"one run of the baseline row, or a directory of its runs only (rows: {labels})"
        )
    return chosen[0]


def _differences(
    groups: Sequence[Group],
    varied: Sequence[str],
    base: Group,
    found: list[tuple[str, str, Comparison]],
) -> list[str]:
    """The section comparing every row with ``base``; adds ``(row, baseline, comparison)``s to
    ``found``."""
    name = _label(base, varied)
    lines = [
        "",
        f"## Differences against {name}",
        "",
        "Δ = the row's metric − the baseline's, on the same test examples; the 95 % interval of "
        "a paired bootstrap over test examples (seeds as a second level, 2,000 resamples). "
        '"better" or "worse" only where the interval excludes 0, "level" otherwise. '
        "test_ts: after temperature scaling fitted on each run's validation split.",
        "",
    ]
    rows = []
    for group in groups:
        if group is base:
            continue
        runs, base_runs = [r.path for r in group.runs], [r.path for r in base.runs]
        validated = all("val/nll" in r.final.get("metrics", {}) for r in [*group.runs, *base.runs])
        sets = ("test", "test_ts") if validated else ("test",)
        try:
            compared = compare_runs(runs, base_runs, sets=sets)
        except (FileNotFoundError, KeyError) as error:
            lines.append(f"* {_label(group, varied)}: not compared ({error})")
            continue
        found += [(_label(group, varied), name, c) for c in compared]
        rows += [[_label(group, varied), *cells] for cells in comparison_cells(compared)]
    if rows:
        lines.append(markdown_table(["row", *COMPARISON_HEADER], rows))
    return lines


def _selected_nll(run: RunRecord) -> tuple[float, float] | None:
    """(ensemble, members' mean) validation NLL at the epoch the run selected, or None."""
    try:
        record = read_selected_epoch(run.path)
    except (OSError, ValueError):
        return None
    values = [record.get(k) for k in ("val/nll", "val/member_nll_mean")] if record else []
    if len(values) < 2 or not all(isinstance(v, int | float) for v in values):
        return None
    return float(values[0]), float(values[1])


def _members_alone(groups: Sequence[Group], varied: Sequence[str], base: Group) -> list[str]:
    """The section taking every row's validation NLL at its selected epoch apart against
    ``base``'s: what its members lose alone, what averaging wins back (empty: no selection)."""
    parts = {id(g): [p for r in g.runs if (p := _selected_nll(r))] for g in groups}
    if not parts[id(base)]:
        return []
    reference = summarize([nll for nll, _ in parts[id(base)]])[0]
    rows = []
    for group in groups:
        if group is base or not parts[id(group)]:
            continue
        nll = summarize([n for n, _ in parts[id(group)]])[0]
        members = summarize([m for _, m in parts[id(group)]])[0]
        reading = "ahead" if nll < reference else "behind"
        if nll >= reference and dict(group.key).get("method.name") == "snens":
            reading += ": a weaker partition (higher τ, lower λ) costs each member less"
        alone, gain = members - reference, members - nll
        cells = [f"{nll:.4f}", f"{members:.4f}", f"{alone:+.4f}", f"{gain:.4f}", reading]
        rows.append([_label(group, varied), *cells])
    if not rows:
        return []
    header = ["row", "val NLL", "members' mean", "members − baseline", "gain of averaging"]
    return [
        "",
        f"## Members alone and the gain of averaging, against {_label(base, varied)}",
        "",
        "Validation NLL at each run's selected epoch, means over the row's runs: the members' "
        "mean NLL, its difference from the baseline's NLL (what a member loses or gains alone) "
        "and the members' mean less the ensemble's (what averaging them wins back, ≥ 0). A row "
        "is ahead of the baseline on validation exactly where averaging wins back more than "
        "its members lose alone.",
        "",
        markdown_table([*header, "reading"], rows),
    ]


def _provenance(runs: Sequence[RunRecord]) -> str | None:
    for run in runs:
        try:
            info = json.loads(read_run_file(run.path / PROVENANCE).decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(info, dict):
            continue
        gpus = info.get("gpus")  # a list of names; anything else (an edited file) as it is
        gpus = (", ".join(map(str, gpus)) if isinstance(gpus, list) else gpus) or "no GPU"
        return (
            f"Hardware and versions (from {run.path / PROVENANCE}): {info.get('platform')}, "
            f"{info.get('cpu_count')} CPUs, {gpus}; torch {info.get('torch')}, snens "
            f"{info.get('snens')}, git {info.get('git_sha')}."
        )
    return None


def write_report(
    dirs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    baseline: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
) -> Report:
    """Collect the runs under ``dirs`` and write ``out/report.md``, ``out/report.csv`` and the
    plots; with ``baseline`` (a run of one row, or a directory of its runs only; or several),
    every other row is compared with each baseline's row (:mod:`snens.engine.compare`).

    Raises:
        ValueError: a directory that does not exist, no finished runs, an empty ``out``, or
            a ``baseline`` that does not hold the runs of one row.
        OSError: ``out`` cannot be written; the previous report there is left as it was.
    """
    if not str(out).strip():
        raise ValueError("--out is empty; give the directory for report.md")
    runs, notes = collect_runs(dirs)
    groups, varied = group_runs(runs)
    metrics = metric_names(runs)
    with_left_out = [
        m for m in metrics if any(_left_out([r.metric(m) for r in group.runs]) for group in groups)
    ]
    choice: Choice | None = choose_on_validation(
        [{r.config["seed"]: r.final.get("selection") for r in g.runs} for g in groups]
    )
    split = None
    if sum(why is None for why in choice.left_out) < 2:  # nothing to choose between
        choice = None
    elif (split := _split_difference(groups, choice)) is not None:
        choice = replace(choice, index=None)  # validation NLLs of different examples rank nothing
    rows: list[dict[str, Any]] = []
    table_rows: list[list[str]] = []
    for i, group in enumerate(groups):
        values = dict(group.key)
        row: dict[str, Any] = {k: values.get(k, _MISSING) for k in varied}
        row["n"] = len(group.runs)
        row["seeds"] = " ".join(str(s) for s in group.seeds)
        if choice is not None and choice.metric is not None:
            row[f"val/{choice.metric} selected mean"] = choice.values[i]
            row["chosen on validation"] = i == choice.index
        cells = [_value(row[k]) for k in varied] + [str(row["n"]), row["seeds"]]
        for metric in metrics:
            found = [r.metric(metric) for r in group.runs]
            left_out = _left_out(found)
            finite = [v for v in found if v is not None and math.isfinite(v)]
            stats = summarize(finite) if finite else None
            row[f"{metric} mean"] = stats[0] if stats else None
            row[f"{metric} std"] = stats[1] if stats and stats[2] > 1 else None
            if metric in with_left_out:
                row[f"{metric} left out"] = " ".join(_nonfinite(v) for v in left_out) or None
            cells.append(_cell(metric, stats, len(group.runs), left_out))
            notes += [
                f"{metric} of {r.path} is {_nonfinite(v)}: left out of its row's mean and std"
                for r, v in zip(group.runs, found, strict=True)
                if v is not None and not math.isfinite(v)
            ]
        rows.append(row)
        table_rows.append(cells)
    header = [*(_SHORT.get(k, k) for k in varied), "n", "seeds", *metrics]
    table = markdown_table(header, table_rows)
    summary = _glance(groups, varied, metrics, choice)
    sentence = _choice_sentence(groups, varied, choice, split) if choice is not None else None
    if sentence:
        summary += "\n\n" + sentence
    differences: list[str] = []
    compared: list[tuple[str, str, Comparison]] = []
    bases = [baseline] if isinstance(baseline, str | os.PathLike) else list(baseline or ())
    chosen = [_baseline_group(groups, varied, b) for b in bases]  # every one checked first
    for i, base in enumerate(chosen):
        if base in chosen[:i]:
            raise ValueError(
                f"--baseline {str(bases[i])!r} names the row {_label(base, varied)!r} again, as "
                f"--baseline {str(bases[chosen.index(base)])!r} does; give each baseline once"
            )
    for base in chosen:
        differences += _differences(groups, varied, base, compared)
        differences += _members_alone(groups, varied, base)

    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _named(
            error,
            f"cannot create the report directory {out} ({error.strerror or error}); choose "
            "another --out",
        ) from None
    csv_path = out / "report.csv"
    text_csv = io.StringIO(newline="")
    csv.writer(text_csv).writerows(
        [list(rows[0]), *(["" if v is None else _csv_value(v) for v in r.values()] for r in rows)]
    )
    _write(csv_path, text_csv.getvalue())

    drawn, plot_notes = _plots(groups, varied, out)
    notes += plot_notes
    text = [
        "# snens report",
        "",
        f"{len(runs)} runs in {len(groups)} configurations. Each row: mean ± std over the "
        "row's runs (std with ddof=1; one run shows its value and n=1). Config keys not in the "
        "table are the same in every run.",
        "",
        "## At a glance",
        "",
        summary,
        "",
        "## Every metric",
        "",
        table,
        "",
        "## Runs",
        "",
    ]
    text += [f"* {_label(g, varied)}: " + ", ".join(f"`{r.path}`" for r in g.runs) for g in groups]
    text += differences
    evidence = _provenance(runs)
    if evidence:
        text += ["", evidence]
    if drawn:
        text += ["", "## Plots", ""] + [f"![{_alt(caption)}]({p.name})" for p, caption in drawn]
    kept = [n for n in notes if n]
    path = out / "report.md"
    _write(path, "\n".join([*text, "", *kept]) + "\n")
    plots = [p for p, _ in drawn]
    return Report(table, path, csv_path, plots, kept, summary, sentence, compared)


#: The config keys that fix which examples a run validates on.
_SPLIT_KEYS = ("data.dataset", "data.validation_examples")


def _split_difference(groups: Sequence[Group], choice: Choice) -> str | None:
    """``"key: a, b"`` where the candidate rows validated on different examples, else None."""
    for key in _SPLIT_KEYS:
        found = {
            _value(dict(g.key).get(key, _MISSING))
            for g, why in zip(groups, choice.left_out, strict=True)
            if why is None
        }
        if len(found) > 1:
            return f"{key}: {', '.join(sorted(found))}"
    return None


def _choice_sentence(
    groups: Sequence[Group], varied: Sequence[str], choice: Choice, split: str | None = None
) -> str:
    """What the choice on validation kept, over which seeds, and the rows it left out."""
    if split is not None:
        return (
            f"No choice on validation: the rows were validated on different examples ({split}); "
            "choose among rows of one validation split."
        )
    if choice.metric is None:
        return (
            "No choice on validation: the rows were selected on different metrics "
            "(optim.select); train them with one."
        )
    name = f"validation {SELECT_NAMES[choice.metric]}"
    seeds = (
        f"seed {choice.seeds[0]}, the one every candidate row has"
        if len(choice.seeds) == 1
        else f"mean over seeds {', '.join(map(str, choice.seeds))}, those every candidate row has"
        if choice.seeds
        else "mean over each row's own seeds (no seed is common to every candidate row)"
    )
    if choice.index is None:
        text = f"No choice on validation: every candidate row's {name} is non-finite."
    else:
        best = "highest" if SELECT_METRICS[choice.metric] else "lowest"
        text = (
            f"Chosen on validation: **{_label(groups[choice.index], varied)}**, the {best} "
            f"{name} at the selected epoch ({choice.values[choice.index]:.4f}, {seeds}); the "
            "test set played no part in the choice."
        )
    out = [
        f"{_label(g, varied)} ({why})"
        for g, why in zip(groups, choice.left_out, strict=True)
        if why is not None
    ]
    return text + (f" Not candidates: {'; '.join(out)}." if out else "")


def _glance(
    groups: Sequence[Group], varied: Sequence[str], metrics: Sequence[str], choice: Choice | None
) -> str:
    """The table at a glance: a row per configuration, n, the validation metric a choice rests
    on (over the seeds it compared; the chosen row marked), and the :data:`GLANCE` metrics."""
    ood = [
        m
        for score in _OOD_FIRST
        for m in metrics
        if m.startswith("ood/") and m.endswith(f"/{score}/auroc")
    ]
    first_set = ood[0].split("/")[1] if ood else None
    ood = [m for m in ood if m.split("/")[1] == first_set]
    columns = [m for m in (*GLANCE, *ood, *_GLANCE_TAIL) if m in metrics]
    names = [
        _GLANCE_NAMES.get(m) or f"OOD {m.split('/')[2].replace('_', '-')} AUROC" for m in columns
    ]
    picked = choice is not None and choice.metric is not None
    rows = []
    for i, group in enumerate(groups):
        cells = [_label(group, varied), str(len(group.runs))]
        if picked:  # the runs the choice compared: of the seeds every candidate row has
            kept = choice.left_out[i] is None  # type: ignore[union-attr]
            seeds = choice.seeds or group.seeds  # type: ignore[union-attr]
            found = [
                r.final["selection"]["value"]
                for r in group.runs
                if kept and r.config["seed"] in seeds
            ]
            cells.append(_glance_cell("val", found, len(group.runs)))
            if i == choice.index:  # type: ignore[union-attr]
                cells[-1] += " ← chosen"
        cells += [
            _glance_cell(m, [r.metric(m) for r in group.runs], len(group.runs)) for m in columns
        ]
        rows.append(cells)
    if picked:
        names.insert(0, f"val {SELECT_NAMES[choice.metric]}")  # type: ignore[union-attr,index]
    return markdown_table(["run", "n", *names], rows)


def _glance_cell(metric: str, found: Sequence[float | None], n_runs: int) -> str:
    """A cell at a glance: mean ± std of the finite values, n where some are missing."""
    finite = [
        v
        for v in found
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]
    if not finite:
        return "—"
    mean, std, n = summarize(finite)
    digits = _digits(metric)
    text = f"{mean:,.{digits}f}" if metric == "params" else f"{mean:.{digits}f}"
    if n > 1 and metric != "params":  # one config: one size
        text += f" ± {std:.{digits}f}"
    if n < n_runs:
        text += f" (n={n})"
    return text


def _left_out(values: Sequence[float | None]) -> list[float]:
    """The values that are not finite (inf, NaN), which the mean and std leave out."""
    return [v for v in values if v is not None and not math.isfinite(v)]


def _write(path: Path, text: str) -> None:
    """Write a report file atomically; the error names the file."""
    try:  # surrogateescape: a path from undecodable bytes is written back as those bytes
        files.write_text(path, text, mode=files.plain_mode(path), errors="surrogateescape")
    except OSError as error:
        raise _named(
            error,
            f"cannot write {path} ({os.strerror(error.errno) if error.errno else error}); "
            "free space (or restore write access) and run snens report again, or choose "
            f"another --out; the previous {path.name} there is unchanged",
        ) from None


def _named(error: OSError, message: str) -> OSError:
    """An OSError of ``error``'s type and errno whose text is ``message`` alone."""
    named = type(error)(message)
    named.errno = error.errno
    return named


def _csv_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return str(value)


def _group_stats(group: Group) -> dict[str, tuple[float, float]]:
    """``{metric: (mean, std)}`` over the finite values of the group's runs, NaN where too few."""
    keys = {k: None for run in group.runs for k in run.final.get("metrics", {})}
    out = {}
    for key in keys:
        values = [v for run in group.runs if (v := run.metric(key)) is not None]
        if values:
            finite = [v for v in values if math.isfinite(v)]
            out[key] = summarize(finite)[:2] if finite else (math.nan, math.nan)
    return out


def _plots(
    groups: Sequence[Group], varied: Sequence[str], out: Path
) -> tuple[list[tuple[Path, str]], list[str]]:
    """The figures drawn, each with its caption, and notes on what was not drawn and why."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return [], ["Plots skipped: matplotlib is not installed (`pip install snens[plot]`)."]
    drawn, failed = _summary_plots(groups, varied, out)
    labels = [_label(group, varied) for group in groups]
    reliability, notes = _reliability_diagrams(groups, labels, out)
    allocations, more = _allocation_heatmaps(groups, labels, out)
    notes += more
    if failed:
        notes.append("; ".join(["Plots not drawn:", *failed]))
    return drawn + reliability + allocations, notes


def _summary_plots(
    groups: Sequence[Group], varied: Sequence[str], out: Path
) -> tuple[list[tuple[Path, str]], list[str]]:
    """The Pareto and shift plots of the groups' means, with ± std bars."""
    from snens.evaluation import plots

    stats = {_label(g, varied): _group_stats(g) for g in groups}
    means = {label: {k: mean for k, (mean, _) in s.items()} for label, s in stats.items()}
    spread = {
        label: {k: std for k, (_, std) in s.items() if math.isfinite(std)}
        for label, s in stats.items()
    }
    settings = _point_labels(groups, [k for k in varied if k != "method.name"])
    rows = [
        {"method": dict(g.key)["method.name"], **means[_label(g, varied)], "settings": s}
        | {f"{k} std": v for k, v in spread[_label(g, varied)].items()}
        for g, s in zip(groups, settings, strict=True)
    ]
    written, failed = [], []
    style = {"y": "test/accuracy", "y_err": "test/accuracy std", "label": "method"}
    style |= {"annotate": "settings", "annotate_with_key": False}
    for x, name in (("test/nll", "pareto_nll.png"), ("test/ece", "pareto_ece.png")):
        usable = [r for r in rows if _finite(r, x) and _finite(r, "test/accuracy")]
        if usable:
            try:
                path = plots.pareto_plot(usable, out / name, x=x, x_err=f"{x} std", **style)
                written.append((path, path.stem))
            except (ValueError, OSError) as error:
                failed.append(f"{name}: {error}")
    short = {
        _label(group, varied): " ".join(filter(None, (dict(group.key)["method.name"], label)))
        for group, label in zip(groups, settings, strict=True)
    }
    if len(set(short.values())) < len(short):  # two alike: the full labels, which differ
        short = {label: label for label in short}
    shifted = [
        label for label, m in means.items() if any(k.startswith("shift/severity/") for k in m)
    ]
    if shifted:
        try:
            path = plots.shift_plot(
                {short[label]: means[label] for label in shifted},
                out / "shift.png",
                metric="ece",
                std={short[label]: spread[label] for label in shifted},
            )
            written.append((path, path.stem))
        except (ValueError, OSError) as error:
            failed.append(f"shift.png: {error}")
    return written, failed


def _reliability_diagrams(
    groups: Sequence[Group], labels: Sequence[str], out: Path
) -> tuple[list[tuple[Path, str]], list[str]]:
    """A reliability diagram per group: the test predictions of its runs, pooled."""
    from snens.evaluation import plots

    drawn, notes, without = [], [], []
    for row, (group, label) in enumerate(zip(groups, labels, strict=True), start=1):
        probs, targets = [], []
        for run in group.runs:
            if not os.path.lexists(run.path / OUTPUTS):
                continue
            try:
                outputs = read_outputs(run.path)
                p, y = predictive_probs(outputs["test"].float()), outputs["test_labels"].long()
                if probs and p.shape[1] != probs[0].shape[1]:
                    raise ValueError(
                        f"its test predictions are of {p.shape[1]} classes, the group's first "
                        f"run's of {probs[0].shape[1]} ({OUTPUTS} does not belong to its config?)"
                    )
            except (OSError, ValueError) as error:
                notes.append(f"Reliability diagram of {label}: {run.path} left out: {error}")
                continue
            probs.append(p)
            targets.append(y)
        if not probs:
            without.append(label)
            continue
        pooled = "1 run" if len(probs) == 1 else f"{len(probs)} runs pooled"
        if len(probs) < len(group.runs):
            pooled += f", of {len(group.runs)}"
        name = f"reliability_{row}.png"
        try:
            path = plots.reliability_diagram(
                torch.cat(probs), torch.cat(targets), out / name, title=f"{label} ({pooled})"
            )
        except (ValueError, TypeError, OSError) as error:
            notes.append(f"{name} ({label}) not drawn: {error}")
            continue
        drawn.append((path, f"reliability: {label}"))
    if without:
        notes.append(
            f"Reliability diagrams not drawn for {'; '.join(without)}: no run of theirs holds "
            f"{OUTPUTS}, the member logits snens train keeps beside {FINAL} (runs finished "
            "before it kept them have none); train them again to draw them"
        )
    return drawn, notes


def _checkpoint_allocation(path: Path) -> dict[str, LayerAllocation]:
    """The allocation of a checkpoint's member norms, each ``<name>.gamma`` set in a bare
    :class:`snens.nn.MemberNorm` at ``<name>`` (no model built)."""
    state = load_checkpoint(path, required=("model",))["model"]
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{path}: its model state is of type {type(state).__name__}, not a mapping of "
            "tensors: the file was not written by snens (or was changed)"
        )
    root = nn.Module()
    for key, gamma in state.items():
        if not key.endswith(".gamma") or not isinstance(gamma, Tensor) or gamma.dim() < 2:
            continue
        *parents, leaf = key.split(".")[:-1]
        node = root
        for part in parents:
            if part not in node._modules:
                node.add_module(part, nn.Module())
            node = node._modules[part]
        norm = MemberNorm(gamma.shape[1:], gamma.shape[0])
        with torch.no_grad():
            norm.gamma.copy_(gamma)
        node.add_module(leaf, norm)
    return allocation(root)


def _allocation_heatmaps(
    groups: Sequence[Group], labels: Sequence[str], out: Path
) -> tuple[list[tuple[Path, str]], list[str]]:
    """An allocation heatmap per σN-Ens group, from its first run's checkpoint (members of
    different seeds do not correspond)."""
    from snens.evaluation import plots

    drawn, notes, without = [], [], []
    for row, (group, label) in enumerate(zip(groups, labels, strict=True), start=1):
        if dict(group.key)["method.name"] not in _ALLOCATION_METHODS:
            continue
        run = next((r for r in group.runs if os.path.lexists(r.path / LAST)), None)
        if run is None:
            without.append(label)
            continue
        name = f"allocation_{row}.png"
        try:
            layers = _checkpoint_allocation(run.path / LAST)
            seed = run.config["seed"]
            path = plots.allocation_heatmap(layers, out / name, title=f"{label}, seed {seed}")
        except (CheckpointError, ValueError, OSError) as error:
            notes.append(f"{name} ({label}) not drawn: {error}")
            continue
        drawn.append((path, f"allocation: {label}"))
    if without:
        notes.append(
            f"Allocation heatmaps not drawn for {'; '.join(without)}: no run of theirs holds "
            f"its checkpoint ({LAST}), which holds the importances σ(γ)"
        )
    return drawn, notes


def _alt(caption: str) -> str:
    """A caption as Markdown image text: brackets escaped."""
    return caption.replace("[", "\\[").replace("]", "\\]")


def _point_labels(groups: Sequence[Group], keys: Sequence[str]) -> list[str]:
    """What sets each group apart beside its point: τ and λ, other keys where uncommon."""
    from collections import Counter

    values = [dict(group.key) for group in groups]
    common = {
        k: Counter(repr(v.get(k, _MISSING)) for v in values).most_common(1)[0][0] for k in keys
    }
    return [
        ", ".join(
            f"{_SHORT.get(k, k.rsplit('.', 1)[-1])}={_value(v[k])}"
            for k in keys
            if k in v and (k in _SHORT or repr(v[k]) != common[k])
        )
        for v in values
    ]


def _finite(row: Mapping[str, Any], key: str) -> bool:
    return key in row and math.isfinite(row[key])
