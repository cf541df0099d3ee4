"""The converged study's numbers in the README and the results page (docs/results.md) are the
committed run directories' numbers.

Every cell checked here is recomputed from ``results/converged/<stage>/<variant>/seed=<s>/
final.json`` (mean over seeds, sample standard deviation after ``±``), so a table that was
written by hand and not updated after a run finished, or rounded the wrong way, fails.
"""

import functools
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The pages that report the study: the README's table at a glance, the results page's tables.
PAGES = (ROOT / "README.md", ROOT / "docs" / "results.md")
RESULTS = ROOT / "results" / "converged"
SEEDS = (0, 1, 2)
SEV5_ECE = "shift/severity/5/ece"
NUMBER = re.compile(r"\d+\.\d+")


@functools.cache
def _metrics(stage: str, variant: str) -> tuple[dict, ...]:
    """Each seed's ``final.json`` metrics, read once."""
    runs = [RESULTS / stage / variant / f"seed={s}" / "final.json" for s in SEEDS]
    missing = [str(r.relative_to(ROOT)) for r in runs if not r.is_file()]
    assert not missing, f"the results pages report runs that are not committed: {missing}"
    return tuple(json.loads(r.read_text())["metrics"] for r in runs)


def _values(stage: str, variant: str, key: str) -> list[float]:
    return [metrics[key] for metrics in _metrics(stage, variant)]


def _mean(stage: str, variant: str, key: str, digits: int = 3) -> str:
    return f"{statistics.mean(_values(stage, variant, key)):.{digits}f}"


def _mean_std(stage: str, variant: str, key: str, digits: int = 3) -> str:
    values = _values(stage, variant, key)
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _table(after: str) -> list[list[str]]:
    """The cells of the first Markdown table after the line starting with ``after``."""
    lines = [line for page in PAGES for line in page.read_text(encoding="utf-8").splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    rows = []
    for line in lines[first + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("**", "") for cell in line.strip("|").split("|")])
    return rows


def _numbers(cell: str) -> list[str]:
    return NUMBER.findall(cell)


def test_the_at_a_glance_table_is_the_runs_test_nll_and_corrupted_ece():
    rows = _table("At a glance")
    # (stage, the single / deep ensemble / σN-Ens variants, σN-Ens' second variant or None);
    # every regime but text has corruptions
    regimes = [
        ("overfit", ("single", "deep_ensemble", "snens_tau1_lam0.1"), "snens_tau1_lam0.1_split"),
        ("final", ("single", "deep_ensemble", "snens_default"), None),
        ("text", ("single", "deep_ensemble", "snens_default"), None),
        ("vision", ("single", "deep_ensemble", "snens_glr3_chosen"), None),
    ]
    assert len(rows) == len(regimes)
    for row, (stage, variants, also) in zip(rows, regimes, strict=True):
        shifted = stage != "text"
        for cell, variant in zip(row[1:4], variants, strict=True):
            expected = [_mean(stage, variant, "test/nll")]
            if shifted:
                expected.append(_mean(stage, variant, SEV5_ECE))
            if also is not None and variant == variants[-1]:
                expected += [_mean(stage, also, "test/nll"), _mean(stage, also, SEV5_ECE)]
            assert _numbers(cell) == expected, (stage, variant, cell)
    # the MiniLM row's "MC-dropout ties" is MC-dropout's test NLL
    assert _numbers(rows[2][4]) == [_mean("text", "mc_dropout", "test/nll")]


# Each table of the converged section: the line its header starts with, the row label →
# (stage, variant), and the columns checked: index → (metric key, "mean" or "mean ± std",
# decimals). Parameters, seeds and training seconds are left out (the seconds are the
# epochs × the median epoch's, tested in test_converged_study.py).
FINAL = {
    "single": ("final", "single"),
    "deep ensemble": ("final", "deep_ensemble"),
    "BatchEnsemble": ("final", "batch_ensemble"),
    "Packed-Ensembles (α=2, γ=2)": ("final", "packed"),
    "MC-dropout (4 samples)": ("final", "mc_dropout"),
    "σN-Ens τ=1 λ=0.1 (default)": ("final", "snens_default"),
    "σN-Ens λ=0, γ ×1 (chosen on validation)": ("final", "snens_lam0_glr1_chosen"),
}
TABLES = {
    "final": (
        "| method | params | seeds | val NLL |",
        FINAL,
        {
            3: ("val/nll", "±", 3),
            4: ("val/member_accuracy_mean", "mean", 3),
            5: ("val/disagreement", "mean", 3),
            6: ("test/accuracy", "±", 3),
            7: ("test/nll", "±", 3),
            8: ("test/ece", "mean", 3),
            9: ("test/brier", "mean", 3),
            10: ("shift/severity/5/accuracy", "±", 3),
            11: (SEV5_ECE, "±", 3),
        },
    ),
    "overfit": (
        "| method | params | val NLL | val ECE |",
        {
            "single": ("overfit", "single"),
            "deep ensemble": ("overfit", "deep_ensemble"),
            "BatchEnsemble": ("overfit", "batch_ensemble"),
            "Packed-Ensembles (α=2, γ=2)": ("overfit", "packed"),
            "σN-Ens τ=1 λ=0.1, repeat (default)": ("overfit", "snens_tau1_lam0.1"),
            "σN-Ens τ=1 λ=0.1, split": ("overfit", "snens_tau1_lam0.1_split"),
        },
        {
            2: ("val/nll", "±", 3),
            3: ("val/ece", "mean", 3),
            4: ("test/accuracy", "±", 4),
            5: ("test/nll", "±", 3),
            6: ("test/ece", "mean", 3),
            7: (SEV5_ECE, "±", 3),
        },
    ),
    "posthoc": (
        "| method | val NLL | member NLL (val) |",
        {
            "single, 40 epochs": ("final", "single"),
            "… + 4 epochs more": ("posthoc", "single_continued"),
            "… + σN-Ens τ=5 λ=0.01, 4 epochs (chosen on validation)": (
                "posthoc",
                "snens_tau5_lam0.01_lr3e-4_chosen",
            ),
            "… + σN-Ens τ=1 λ=0.1, γ ×3, 4 epochs": ("posthoc", "snens_glr3_lr3e-4"),
            "deep ensemble, 40 epochs": ("final", "deep_ensemble"),
        },
        {
            1: ("val/nll", "±", 3),
            2: ("val/member_nll_mean", "mean", 3),
            4: ("test/accuracy", "mean", 3),
            5: ("test/nll", "±", 3),
            6: (SEV5_ECE, "±", 3),
        },
    ),
    "text": (
        "| method | params | test acc | test NLL | test ECE | Brier | OOD AUROC (MSP) |",
        {
            "single": ("text", "single"),
            "deep ensemble": ("text", "deep_ensemble"),
            "MC-dropout (4 samples)": ("text", "mc_dropout"),
            "σN-Ens τ=1 λ=0.1 (default)": ("text", "snens_default"),
            "σN-Ens τ=1 λ=0.1, γ ×150 (chosen on validation)": ("text", "snens_glr150_chosen"),
        },
        {
            2: ("test/accuracy", "±", 3),
            3: ("test/nll", "±", 3),
            4: ("test/ece", "±", 3),
            5: ("test/brier", "±", 3),
            6: ("ood/rt_plots/auroc", "±", 3),
            7: ("test/disagreement", "mean", 3),
        },
    ),
    "vision": (
        "| method | params | test acc | test NLL | test ECE | Brier | ECE, sev. 5 |",
        {
            "single": ("vision", "single"),
            "deep ensemble": ("vision", "deep_ensemble"),
            "MC-dropout (4 samples)": ("vision", "mc_dropout"),
            "σN-Ens, γ ×10": ("vision", "snens_default"),
            "σN-Ens, γ ×3 (chosen; the preset)": ("vision", "snens_glr3_chosen"),
        },
        {
            2: ("test/accuracy", "±", 3),
            3: ("test/nll", "±", 3),
            4: ("test/ece", "mean", 3),
            5: ("test/brier", "mean", 3),
            6: (SEV5_ECE, "mean", 3),
            8: ("test/disagreement", "mean", 3),
            9: ("test/member_nll_mean", "mean", 3),
        },
    ),
}


@pytest.mark.parametrize("table", TABLES)
def test_every_converged_table_is_the_runs_it_names(table):
    header, labels, columns = TABLES[table]
    rows = {row[0].replace("**", ""): row for row in _table(header)}
    assert set(rows) == set(labels), "a row added or renamed: name its runs here"
    for label, (stage, variant) in labels.items():
        for index, (key, kind, digits) in columns.items():
            value = _mean_std if kind == "±" else _mean
            expected = value(stage, variant, key, digits)
            if rows[label][index] == "–":  # one member: no disagreement to show
                assert expected == f"{0:.{digits}f}", (table, label, key)
                continue
            assert rows[label][index] == expected, (table, label, key)


@pytest.mark.parametrize("label", FINAL)
def test_the_final_table_names_each_runs_parameters_and_seeds(label):
    row = {row[0]: row for row in _table(TABLES["final"][0])}[label]
    stage, variant = FINAL[label]
    final = json.loads((RESULTS / stage / variant / "seed=0" / "final.json").read_text())
    assert row[1] == f"{final['model']['params']:,}"
    assert row[2] == "0, 1, 2"
    assert _numbers(row[12])[0] == _mean(stage, variant, "ood/mnist_5k/auroc")  # MSP
