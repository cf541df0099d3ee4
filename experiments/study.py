"""What the long studies (``converged.py``, ``llm.py``) share: variants of a preset planned as
engine runs (:func:`snens.engine.sweep.plan`), a queue of them that two processes share, and
the listing of their status.

A variant is a name, ``--set`` overrides over a preset, and the seeds it runs; its runs live
in ``<out>/<stage>/<variant>/seed=<s>/`` and its ``sweep.csv`` lists them all. The queue is
resumable and parallel: each process takes the next run nobody trains (the engine's
``run.lock``), a finished run is skipped, an interrupted one resumes from its ``last.pt``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from snens.engine.presets import preset
from snens.engine.runs import FINAL
from snens.engine.sweep import SweepRun, plan, run_sweep


@dataclass(frozen=True)
class Variant:
    """One row of a study: ``overrides`` (``--set`` syntax) over ``preset``, run per seed."""

    name: str
    overrides: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    preset: str = "fashion_mnist_small_cnn"


#: A run in a study's queue: (stage, variant, the run).
Item = tuple[str, Variant, SweepRun]


def plan_variant(variant: Variant, out: Path, overrides: Sequence[str] = ()) -> list[SweepRun]:
    """The variant's runs, one per seed, in ``out/<variant>/``: their configs built and
    checked, nothing written. ``overrides`` come before the variant's own."""
    return plan(
        preset(variant.preset),
        [f"seed={','.join(str(s) for s in variant.seeds)}"],
        out / variant.name,
        overrides=(*overrides, *variant.overrides),
    )


def train(
    queue: Sequence[Item],
    after: Callable[[str, Path], object] | None = None,
    only: Callable[[SweepRun], bool] | None = None,
) -> int:
    """Train every unfinished run of ``queue`` in order (those ``only`` accepts, where given:
    the rest still listed in their variant's ``sweep.csv``); a run another process trains (its
    ``run.lock`` held) is left to it; ``after(stage, run directory)`` is called once a run this
    process trained has finished, while its checkpoint is there. Returns 1 if a run failed,
    else 0."""
    tables: dict[tuple[str, str], list[SweepRun]] = {}  # a variant's sweep.csv lists every run
    for stage, variant, sweep_run in queue:
        tables.setdefault((stage, variant.name), []).append(sweep_run)
    failed = 0
    for stage, variant, sweep_run in queue:
        path = sweep_run.path()
        if (path / FINAL).is_file() or (only is not None and not only(sweep_run)):
            continue
        print(f"== {stage}/{variant.name}/{sweep_run.name}", flush=True)
        table = tables[(stage, variant.name)]
        failed += len(run_sweep([sweep_run], path.parent, keys=("seed",), table=table).failed)
        if after is not None and (path / FINAL).is_file():
            after(stage, path)
    return 1 if failed else 0


def status(run: SweepRun) -> str:
    """``done`` (its ``final.json`` written), ``started`` or ``todo``."""
    path = run.path()
    return "done" if (path / FINAL).is_file() else "started" if path.is_dir() else "todo"


def print_plan(queue: Sequence[Item]) -> None:
    """One line per run: stage, variant, seed, status."""
    width = max((len(variant.name) for _, variant, _ in queue), default=0)
    for stage, variant, sweep_run in queue:
        print(f"{stage:11s} {variant.name:{width}s} {sweep_run.name:8s} {status(sweep_run)}")


def chosen_runs(probes: Path) -> list[tuple[Path, str]]:
    """The finished run `snens tune` chose in each ``probes/seed=<s>/`` (whose ``tune.json``
    names it, a directory beside it), with its recipe's name, by seed."""
    import json

    from snens.engine.runs import EXAMPLES
    from snens.engine.tune import TUNE_FILE

    chosen = []
    for record in sorted(probes.glob(f"seed=*/{TUNE_FILE}")):
        name = json.loads(record.read_text())["chosen"]
        run = record.parent / name
        if (run / FINAL).is_file() and (run / EXAMPLES).is_file():
            chosen.append((run, name))
    return chosen


def mean_cell(metrics: Sequence[dict], key: str) -> str:
    """``key``'s mean over the runs' ``metrics`` (each a ``final.json``'s), ± the sample
    standard deviation where there are several; "–" where no run has it."""
    values = [m[key] for m in metrics if key in m]
    if not values:
        return "–"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.4f}"
    spread = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.4f} ± {spread:.4f}"


# ------------------------------------------------------------------------------------------------
# Differences with intervals
# ------------------------------------------------------------------------------------------------

#: The comparisons the studies' tables give: (set of examples.npz, metric).
DIFFERENCES = (("test", "nll"), ("test", "ece"), ("test_ts", "nll"), ("test_ts", "ece"))


def difference_cell(comparison) -> str:
    """``−0.021 [−0.030, −0.012] better``: Δ, its 95 % interval and the word it supports."""
    return f"{comparison.interval} {comparison.verdict}"


def difference_table(
    groups: dict[str, list],
    pairs: Sequence[tuple[str, str]],
    *,
    ood: tuple[str, str] | None = None,
    differences: Sequence[tuple[str, str]] = DIFFERENCES,
) -> list[str]:
    """Markdown rows of A − B for each pair of ``groups`` (name → per-seed ``examples.npz``
    arrays): test NLL and ECE raw and after temperature scaling, and with ``ood`` = (set,
    score) the AUROC of that score, each with its paired bootstrap 95 % interval (test
    examples resampled in pairs, seeds as a second level) and the word it supports; a pair
    whose runs are not all finished is left out."""
    from snens.engine.compare import compare_ood

    header = ["A", "B", *(f"Δ {s} {m}" for s, m in differences)]
    if ood:
        header.append(f"Δ OOD AUROC ({ood[1]})")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for a, b in pairs:
        if not groups.get(a) or not groups.get(b):
            continue
        cells = [a, b, *(difference_cell(c) for c in compared(groups[a], groups[b], differences))]
        if ood:
            cells.append(difference_cell(compare_ood(groups[a], groups[b], *ood)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def compared(a: list, b: list, differences: Sequence[tuple[str, str]]) -> list:
    """The comparisons of ``differences`` ((set, metric) pairs), in their order, from one
    bootstrap draw for them all (:func:`snens.engine.compare.compare_arrays`)."""
    from snens.engine.compare import compare_arrays

    sets = tuple(dict.fromkeys(s for s, _ in differences))
    metrics = tuple(dict.fromkeys(m for _, m in differences))
    found = {(c.set, c.metric): c for c in compare_arrays(a, b, sets=sets, metrics=metrics)}
    return [found[pair] for pair in differences]
