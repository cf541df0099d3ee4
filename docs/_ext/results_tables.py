"""The converged study's tables of the results page, written from the committed runs when the
docs build: never typed by hand.

Every number is read from the run directories
``results/converged/<stage>/<variant>/seed=<s>/`` of seeds 0, 1, 2:

* ``final.json`` — the metrics (mean over the seeds, the sample standard deviation after
  ``±``), the parameter count and the training's wall-clock seconds;
* ``ood_scores.json`` — OOD detection's AUROC by max-probability, entropy and mutual
  information;
* ``conformal_halves.json`` — where a run has it (the final stage's): the coverage of conformal
  sets calibrated on random halves of the test set, mean and standard deviation over the
  halvings;
* ``metrics.jsonl`` — the seconds of each epoch (a run's training seconds as its epochs × its
  median epoch's, robust to stretches a run was paused or shared its core);
* ``config.toml`` — ``model.init_from``: a run that continues another's training shows its
  seconds as ``+ N``.

The ``train s`` column is the wall clock's mean in the ``overfit``, ``text`` and ``vision``
tables, and the epochs × the median epoch's in the ``final`` and ``posthoc`` tables, as the
page says of each.

A run with one member has no disagreement and no mutual information: ``–``. No cell is marked
as the best of its column: the cells are the runs' means and standard deviations over seeds,
each method at its last epoch, with no interval on any difference between them, so they
describe the runs and rank none (the README's comparisons, written by ``experiments/claims.py``,
carry the intervals).

:func:`write` writes each table to ``converged_<name>.md`` of ``docs/study/sections/``, which
``docs/results.md`` includes. Written here, not read from the files: the row labels, the column
headers, and in the at-a-glance table the regimes and the notes beside a σN-Ens cell
(:data:`GLANCE`). Hand-written in the page, not here: the prose around the
tables and the table of the defaults and their evidence, whose cells weigh runs of several
stages in sentences (single-seed values among them) rather than show one run per row.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from snens.engine.report import markdown_table
from snens.engine.runs import CONFIG, FINAL, METRICS, read_config, read_final, read_metrics

#: The seeds every reported run has; a missing one fails the tables.
SEEDS = (0, 1, 2)
#: OOD detection's AUROC by each score, which the converged study keeps beside final.json.
OOD_SCORES_FILE = "ood_scores.json"
#: The cell of a value that does not apply (a single member's disagreement).
DASH = "–"
SEV5 = "shift/severity/5"
OOD_SCORES = ("msp", "entropy", "mutual_information")
#: Conformal sets calibrated on random test halves, which the converged study keeps for the runs
#: whose logits it kept.
HALVES_FILE = "conformal_halves.json"


# ------------------------------------------------------------------------------------------------
# Reading the runs
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    """One seed's run: what the tables read of its directory."""

    metrics: dict[str, float]
    params: int
    wall_seconds: float
    median_seconds: float
    ood: dict[str, float]
    continues: bool  # trained from another run's weights (``model.init_from``)
    path: Path
    halves: dict[str, float] = field(default_factory=dict)  # empty: no conformal_halves.json

    @property
    def one_member(self) -> bool:
        """Whether the run predicts with one member (no disagreement to show)."""
        return self.metrics.get("test/num_members") == 1.0


#: The files the tables read of each run directory.
RUN_FILES = (FINAL, CONFIG, METRICS, OOD_SCORES_FILE)


def read_seed(path: Path) -> Seed:
    """The run in directory ``path`` (``.../<variant>/seed=<s>``); a missing file fails naming
    it."""
    for name in RUN_FILES:
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"the converged study's tables need {path / name}, which is missing"
            )
    final = read_final(path)
    seconds = [r["seconds"] for r in read_metrics(path) if "seconds" in r]
    return Seed(
        metrics=final["metrics"],
        params=final["model"]["params"],
        wall_seconds=final["train"]["seconds"],
        median_seconds=statistics.median(seconds) * len(seconds),  # epochs × median epoch
        ood=json.loads((path / OOD_SCORES_FILE).read_text(encoding="utf-8")),
        continues=bool(read_config(path).model.init_from),
        path=path,
        halves=(
            json.loads((path / HALVES_FILE).read_text(encoding="utf-8"))
            if (path / HALVES_FILE).is_file()
            else {}
        ),
    )


@dataclass
class Results:
    """The committed runs under ``root`` (``results/converged``), each read once."""

    root: Path
    _runs: dict[tuple[str, str], tuple[Seed, ...]] = field(default_factory=dict)

    def runs(self, stage: str, variant: str) -> tuple[Seed, ...]:
        """Each of :data:`SEEDS`' runs of ``variant`` in ``stage``."""
        key = (stage, variant)
        if key not in self._runs:
            folder = self.root / stage / variant
            self._runs[key] = tuple(read_seed(folder / f"seed={s}") for s in SEEDS)
        return self._runs[key]


# ------------------------------------------------------------------------------------------------
# Cells
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One number of a cell: its digits, and what follows them (`` ± 0.003``)."""

    text: str
    suffix: str = ""


def _mean(values: Sequence[float], digits: int) -> Part:
    """The mean of ``values`` at ``digits`` decimals."""
    return Part(f"{statistics.mean(values):.{digits}f}")


def _mean_std(values: Sequence[float], digits: int) -> Part:
    """The mean of ``values``, then `` ± `` their sample standard deviation."""
    part = _mean(values, digits)
    return Part(part.text, f" ± {statistics.stdev(values):.{digits}f}")


def _not_applicable() -> Part:
    """The part of a value that does not apply to the run."""
    return Part(DASH)


#: A column's numbers for a row: the seeds' runs → the parts of its cell, joined by " / ".
Cell = Callable[[Sequence[Seed]], list[Part]]


@dataclass(frozen=True)
class Column:
    """A column: its header and its cell."""

    header: str
    cell: Cell


def metric(key: str, digits: int = 3, spread: bool = False, members: bool = False) -> Cell:
    """A metric of ``final.json``: its mean (``spread``: ``± std`` after it); ``members``: a
    measure between members, ``–`` for a run of one."""

    def cell(seeds: Sequence[Seed]) -> list[Part]:
        if members and seeds[0].one_member:
            return [_not_applicable()]
        values = [s.metrics[key] for s in seeds]
        return [_mean_std(values, digits) if spread else _mean(values, digits)]

    return cell


def ood(dataset: str) -> Cell:
    """AUROC of the ``dataset`` OOD set by MSP / entropy / mutual information (``–`` for a run of
    one member, whose mutual information is 0)."""

    def cell(seeds: Sequence[Seed]) -> list[Part]:
        parts = []
        for score in OOD_SCORES:
            if score == "mutual_information" and seeds[0].one_member:
                parts.append(_not_applicable())
            else:
                parts.append(_mean([s.ood[f"{dataset}/{score}/auroc"] for s in seeds], 3))
        return parts

    return cell


def logit_ood(dataset: str) -> Cell:
    """AUROC of the ``dataset`` OOD set by the max logit / the energy of the members' mean
    logit, as ``final.json`` records them."""

    def cell(seeds: Sequence[Seed]) -> list[Part]:
        return [
            _mean([s.metrics[f"ood/{dataset}/{score}/auroc"] for s in seeds], 3)
            for score in ("max_logit", "energy")
        ]

    return cell


def halves(score: str) -> Cell:
    """The coverage of ``score``'s sets calibrated on random test halves: the mean over the
    seeds, then `` ± `` the standard deviation from one halving to the next (the seeds'
    mean)."""

    def cell(seeds: Sequence[Seed]) -> list[Part]:
        missing = [str(s.path / HALVES_FILE) for s in seeds if not s.halves]
        if missing:
            raise FileNotFoundError(
                f"the converged study's tables need {', '.join(missing)}, which is missing"
            )
        part = _mean([s.halves[f"{score}/coverage"] for s in seeds], 3)
        spread = statistics.mean(s.halves[f"{score}/coverage_std"] for s in seeds)
        return [Part(part.text, f" ± {spread:.3f}")]

    return cell


def params(millions: bool = False) -> Cell:
    """The parameter count: ``72,666``, or ``2.24 M`` with ``millions``."""

    def cell(seeds: Sequence[Seed]) -> list[Part]:
        count = seeds[0].params
        return [Part(f"{count / 1e6:.2f} M" if millions else f"{count:,}")]

    return cell


def seed_list(seeds: Sequence[Seed]) -> list[Part]:
    """The seeds averaged over."""
    return [Part(", ".join(str(s) for s in SEEDS))]


def train_seconds(median: bool) -> Cell:
    """The mean training seconds: the wall clock's, or with ``median`` the epochs × the median
    epoch's; ``+ N`` for a run that continues another's training."""

    def cell(seeds: Sequence[Seed]) -> list[Part]:
        values = [s.median_seconds if median else s.wall_seconds for s in seeds]
        plus = "+ " if seeds[0].continues else ""
        return [Part(f"{plus}{statistics.mean(values):.0f}")]

    return cell


def _render(parts: list[Part]) -> str:
    """A cell's Markdown: its parts joined by `` / ``."""
    return " / ".join(p.text + p.suffix for p in parts)


# ------------------------------------------------------------------------------------------------
# The tables
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """A table of one run per row: rows of (label, stage, variant), one column per measure."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[str, str, str], ...]

    def render(self, results: Results) -> str:
        """The table's Markdown, from ``results``."""
        grid = [  # column by column: each row's parts
            [column.cell(results.runs(stage, variant)) for _, stage, variant in self.rows]
            for column in self.columns
        ]
        body = [
            [label] + [_render(column[r]) for column in grid]
            for r, (label, _, _) in enumerate(self.rows)
        ]
        return markdown_table(["method"] + [c.header for c in self.columns], body) + "\n"


#: Where one model overfits: 10,000 training images, SmallCNN width 32, 20 epochs.
OVERFIT = Table(
    columns=(
        Column("params", params()),
        Column("val NLL", metric("val/nll", spread=True)),
        Column("val ECE", metric("val/ece")),
        Column("test acc", metric("test/accuracy", 4, spread=True)),
        Column("test NLL", metric("test/nll", spread=True)),
        Column("test ECE", metric("test/ece")),
        Column("corrupted ECE, sev. 5", metric(f"{SEV5}/ece", spread=True)),
        Column("train s", train_seconds(median=False)),
    ),
    rows=(
        ("single", "overfit", "single"),
        ("deep ensemble", "overfit", "deep_ensemble"),
        ("BatchEnsemble", "overfit", "batch_ensemble"),
        ("Packed-Ensembles (α=2, γ=2)", "overfit", "packed"),
        ("σN-Ens τ=1 λ=0.1, repeat (default)", "overfit", "snens_tau1_lam0.1"),
        ("σN-Ens τ=1 λ=0.1, split", "overfit", "snens_tau1_lam0.1_split"),
    ),
)

#: All the data at the converged budget: SmallCNN width 16, 40 epochs.
FINAL = Table(
    columns=(
        Column("params", params()),
        Column("seeds", seed_list),
        Column("val NLL", metric("val/nll", spread=True)),
        Column("member acc (val)", metric("val/member_accuracy_mean")),
        Column("disagreement", metric("val/disagreement", members=True)),
        Column("test acc", metric("test/accuracy", spread=True)),
        Column("test NLL", metric("test/nll", spread=True)),
        Column("test ECE", metric("test/ece")),
        Column("Brier", metric("test/brier")),
        Column("acc, sev. 5", metric(f"{SEV5}/accuracy", spread=True)),
        Column("ECE, sev. 5", metric(f"{SEV5}/ece", spread=True)),
        Column("OOD AUROC MSP / entropy / MI", ood("mnist_5k")),
        Column("train s", train_seconds(median=True)),
    ),
    rows=(
        ("single", "final", "single"),
        ("deep ensemble", "final", "deep_ensemble"),
        ("BatchEnsemble", "final", "batch_ensemble"),
        ("Packed-Ensembles (α=2, γ=2)", "final", "packed"),
        ("MC-dropout (4 samples)", "final", "mc_dropout"),
        ("σN-Ens τ=1 λ=0.1 (default)", "final", "snens_default"),
        ("σN-Ens λ=0, γ ×1 (chosen on validation)", "final", "snens_lam0_glr1_chosen"),
    ),
)

#: The final stage's runs by what a user of the peer libraries reads next: the NLL after
#: temperature scaling, OOD detection by the logit scores, and split-conformal prediction sets
#: at α = 0.1 — calibrated on the validation split and measured on the test set, and
#: calibrated on random test halves and measured on the other half.
FINAL_UNCERTAINTY = Table(
    columns=(
        Column("test NLL", metric("test/nll")),
        Column("NLL +TS", metric("test_ts/nll", spread=True)),
        Column("OOD AUROC max-logit / energy", logit_ood("mnist_5k")),
        Column("THR coverage", metric("test/conformal_thr_coverage", spread=True)),
        Column("THR coverage, test halves (± per halving)", halves("thr")),
        Column("THR size", metric("test/conformal_thr_size", 2)),
        Column("APS coverage", metric("test/conformal_aps_coverage", spread=True)),
        Column("APS coverage, test halves (± per halving)", halves("aps")),
        Column("APS size", metric("test/conformal_aps_size", 2)),
    ),
    rows=FINAL.rows,
)

#: The final stage's single model converted to σN-Ens and fine-tuned 4 epochs more.
POSTHOC = Table(
    columns=(
        Column("val NLL", metric("val/nll", spread=True)),
        Column("member NLL (val)", metric("val/member_nll_mean")),
        Column("disagreement", metric("val/disagreement", members=True)),
        Column("test acc", metric("test/accuracy")),
        Column("test NLL", metric("test/nll", spread=True)),
        Column("ECE, sev. 5", metric(f"{SEV5}/ece", spread=True)),
        Column("OOD AUROC MSP / entropy / MI", ood("mnist_5k")),
        Column("train s", train_seconds(median=True)),
    ),
    rows=(
        ("single, 40 epochs", "final", "single"),
        ("… + 4 epochs more", "posthoc", "single_continued"),
        (
            "… + σN-Ens τ=5 λ=0.01, 4 epochs (chosen on validation)",
            "posthoc",
            "snens_tau5_lam0.01_lr3e-4_chosen",
        ),
        ("… + σN-Ens τ=1 λ=0.1, γ ×3, 4 epochs", "posthoc", "snens_glr3_lr3e-4"),
        ("deep ensemble, 40 epochs", "final", "deep_ensemble"),
    ),
)

#: MiniLM-L6 fine-tuned on 2,000 Rotten Tomatoes reviews, plot descriptions as OOD.
TEXT = Table(
    columns=(
        Column("params", params(millions=True)),
        Column("test acc", metric("test/accuracy", spread=True)),
        Column("test NLL", metric("test/nll", spread=True)),
        Column("test ECE", metric("test/ece", spread=True)),
        Column("Brier", metric("test/brier", spread=True)),
        Column("OOD AUROC (MSP)", metric("ood/rt_plots/auroc", spread=True)),
        Column("disagreement", metric("test/disagreement", members=True)),
        Column("train s", train_seconds(median=False)),
    ),
    rows=(
        ("single", "text", "single"),
        ("deep ensemble", "text", "deep_ensemble"),
        ("MC-dropout (4 samples)", "text", "mc_dropout"),
        ("σN-Ens τ=1 λ=0.1 (default)", "text", "snens_default"),
        ("σN-Ens τ=1 λ=0.1, γ ×150 (chosen on validation)", "text", "snens_glr150_chosen"),
    ),
)

#: ImageNet MobileNetV2 fine-tuned on 5,000 Fashion-MNIST images.
VISION = Table(
    columns=(
        Column("params", params(millions=True)),
        Column("test acc", metric("test/accuracy", spread=True)),
        Column("test NLL", metric("test/nll", spread=True)),
        Column("test ECE", metric("test/ece")),
        Column("Brier", metric("test/brier")),
        Column("ECE, sev. 5", metric(f"{SEV5}/ece")),
        Column("OOD AUROC MSP / entropy / MI", ood("mnist_5k")),
        Column("disagreement", metric("test/disagreement", members=True)),
        Column("member NLL", metric("test/member_nll_mean")),
        Column("train s", train_seconds(median=False)),
    ),
    rows=(
        ("single", "vision", "single"),
        ("deep ensemble", "vision", "deep_ensemble"),
        ("MC-dropout (4 samples)", "vision", "mc_dropout"),
        ("σN-Ens, γ ×10", "vision", "snens_default"),
        ("σN-Ens, γ ×3 (chosen; the preset)", "vision", "snens_glr3_chosen"),
    ),
)


# ------------------------------------------------------------------------------------------------
# The table at a glance
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Regime:
    """A row of the table at a glance: a stage's single model, deep ensemble and σN-Ens.

    ``also`` is a second σN-Ens variant shown beside the first, ``(label: numbers)``; ``note``
    follows the σN-Ens cell.
    """

    label: str
    stage: str
    variants: tuple[str, str, str]
    also: tuple[str, str] | None = None
    note: str = ""


GLANCE_HEADER = (
    "regime",
    "single",
    "deep ensemble (4× the parameters)",
    "σN-Ens, the defaults ({low:.3f}–{high:.2f}×)",  # its parameters over one model's
)
GLANCE = (
    Regime(
        "one model overfits: 10,000 images, SmallCNN width 32, 20 epochs",
        "overfit",
        ("single", "deep_ensemble", "snens_tau1_lam0.1"),
        also=("`split`", "snens_tau1_lam0.1_split"),
    ),
    Regime(
        "all 55,000 images, SmallCNN width 16, 40 epochs (converged)",
        "final",
        ("single", "deep_ensemble", "snens_default"),
    ),
    Regime(
        "MiniLM fine-tuned on 2,000 Rotten Tomatoes reviews",
        "text",
        ("single", "deep_ensemble", "snens_default"),
    ),
    Regime(
        "MobileNetV2 fine-tuned on 5,000 Fashion-MNIST images",
        "vision",
        ("single", "deep_ensemble", "snens_glr3_chosen"),
        note="(the preset's γ ×3)",
    ),
)


def _glance_parts(seeds: Sequence[Seed]) -> list[Part]:
    """Test NLL, and ECE at corruption severity 5 where the stage measures it."""
    keys = ["test/nll"] + ([f"{SEV5}/ece"] if f"{SEV5}/ece" in seeds[0].metrics else [])
    return [_mean([s.metrics[k] for s in seeds], 3) for k in keys]


def _glance_row(regime: Regime, results: Results) -> list[str]:
    """A regime's cells: each run's test NLL / severity-5 ECE."""
    variants = list(regime.variants) + ([regime.also[1]] if regime.also else [])
    shown = [_render(_glance_parts(results.runs(regime.stage, v))) for v in variants]
    if regime.also:
        shown[2] += f" ({regime.also[0]}: {shown.pop()})"
    if regime.note:
        shown[2] += f" {regime.note}"
    return [regime.label, *shown]


def glance(results: Results) -> str:
    """The table at a glance: test NLL (and severity-5 ECE) per regime, as the README shows."""
    ratios = [
        results.runs(r.stage, r.variants[2])[0].params / results.runs(r.stage, "single")[0].params
        for r in GLANCE
    ]
    header = [column.format(low=min(ratios), high=max(ratios)) for column in GLANCE_HEADER]
    return markdown_table(header, [_glance_row(r, results) for r in GLANCE]) + "\n"


#: Each generated table: its name (``converged_<name>.md``) → its Markdown from the results.
TABLES: dict[str, Callable[[Results], str]] = {
    "glance": glance,
    "overfit": OVERFIT.render,
    "final": FINAL.render,
    "final_uncertainty": FINAL_UNCERTAINTY.render,
    "posthoc": POSTHOC.render,
    "text": TEXT.render,
    "vision": VISION.render,
}


def tables(root: Path) -> dict[str, str]:
    """Every table's Markdown by name, from the runs under ``root`` (``results/converged``)."""
    results = Results(Path(root))
    return {name: render(results) for name, render in TABLES.items()}


def write(sections: Path, root: Path) -> list[Path]:
    """Write each table of :func:`tables` to ``sections/converged_<name>.md`` (a file whose text
    is unchanged is left alone: no rebuild); returns the files' paths."""
    sections.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in tables(root).items():
        path = sections / f"converged_{name}.md"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
