"""The converged study's numbers on the results page (docs/results.md) are the committed run
directories' numbers.

The results page's tables are written from ``results/converged/<stage>/<variant>/seed=<s>/``
by ``docs/_ext/results_tables.py`` when the docs build. They are checked here: cells are
recomputed from the runs' ``final.json`` (mean over seeds, sample standard deviation after
``±``), so a table rounded the wrong way fails; and cells of the generated tables are pinned
to literal values, so a change to the generator or to a committed run shows up as a failing
line. (The README's comparisons are generated and checked by tests/docs/test_readme_claims.py.)
"""

import functools
import json
import re
import shutil
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import results_tables  # noqa: E402

RESULTS_PAGE = ROOT / "docs" / "results.md"
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


@functools.cache
def _generated() -> dict[str, str]:
    """The generated tables by name, from the committed runs, made once."""
    return results_tables.tables(RESULTS)


def _rows(lines: list[str], after: str = "|") -> list[list[str]]:
    """The cells of the first Markdown table of ``lines`` whose header starts with ``after``."""
    first = next(i for i, line in enumerate(lines) if line.startswith(after))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _table(name: str) -> list[list[str]]:
    """A generated table's body rows."""
    return _rows(_generated()[name].splitlines())[2:]


def _cell(name: str, label: str, column: str) -> str:
    """The cell of the generated table ``name`` in the row labelled ``label`` and the column
    headed ``column``."""
    header, _, *body = _rows(_generated()[name].splitlines())
    row = next(row for row in body if row[0] == label)
    return row[header.index(column)]


def _numbers(cell: str) -> list[str]:
    return NUMBER.findall(cell)


# ------------------------------------------------------------------------------------------------
# The results page's tables (generated)
# ------------------------------------------------------------------------------------------------


def test_the_results_page_includes_every_generated_table_and_types_only_the_defaults():
    text = RESULTS_PAGE.read_text(encoding="utf-8")
    for name in results_tables.TABLES:
        assert f"```{{include}} study/sections/converged_{name}.md\n```" in text, name
    lines = text.splitlines()
    headers = [
        line
        for before, line in zip([""] + lines, lines)
        if line.startswith("|") and not before.startswith("|")
    ]
    assert [h.split("|")[1].strip() for h in headers] == ["setting"]  # the defaults' evidence


# Each generated table: the row label → (stage, variant), and the columns recomputed here:
# index → (metric key, "mean" or "mean ± std", decimals). Parameters, seeds and training
# seconds are pinned below instead.
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
    "final_uncertainty": (
        FINAL,
        {
            1: ("test/nll", "mean", 3),
            2: ("test_ts/nll", "±", 3),
            4: ("test/conformal_thr_coverage", "±", 3),
            6: ("test/conformal_thr_size", "mean", 2),
            7: ("test/conformal_aps_coverage", "±", 3),
            9: ("test/conformal_aps_size", "mean", 2),
        },
    ),
    "overfit": (
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
def test_every_generated_table_is_the_runs_it_names(table):
    labels, columns = TABLES[table]
    rows = {row[0]: row for row in _table(table)}
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
    row = {row[0]: row for row in _table("final")}[label]
    stage, variant = FINAL[label]
    final = json.loads((RESULTS / stage / variant / "seed=0" / "final.json").read_text())
    assert row[1] == f"{final['model']['params']:,}"
    assert row[2] == "0, 1, 2"
    assert _numbers(row[12])[0] == _mean(stage, variant, "ood/mnist_5k/auroc")  # MSP


@pytest.mark.parametrize("label", FINAL)
def test_the_final_tables_logit_scores_are_the_runs(label):
    row = {row[0]: row for row in _table("final_uncertainty")}[label]
    stage, variant = FINAL[label]
    assert _numbers(row[3]) == [
        _mean(stage, variant, f"ood/mnist_5k/{score}/auroc") for score in ("max_logit", "energy")
    ]
    # the sets calibrated on random test halves: the seeds' mean coverage ± the halvings' std
    halves = [
        json.loads((RESULTS / stage / variant / f"seed={s}" / "conformal_halves.json").read_text())
        for s in SEEDS
    ]
    for column, score in ((5, "thr"), (8, "aps")):
        coverage = statistics.mean(h[f"{score}/coverage"] for h in halves)
        spread = statistics.mean(h[f"{score}/coverage_std"] for h in halves)
        assert row[column] == f"{coverage:.3f} ± {spread:.3f}", (label, score)


# (table, row label, column header) → the cell, as the committed runs give it
PINNED = {
    ("overfit", "σN-Ens τ=1 λ=0.1, split", "test NLL"): "0.311 ± 0.003",
    ("overfit", "σN-Ens τ=1 λ=0.1, split", "method"): "σN-Ens τ=1 λ=0.1, split",
    ("overfit", "σN-Ens τ=1 λ=0.1, split", "val ECE"): "0.009",
    ("overfit", "deep ensemble", "test acc"): "0.8952 ± 0.0027",
    ("overfit", "single", "params"): "288,170",
    ("overfit", "single", "train s"): "155",
    ("final", "single", "disagreement"): "–",
    ("final", "single", "OOD AUROC MSP / entropy / MI"): "0.816 / 0.831 / –",
    ("final", "deep ensemble", "OOD AUROC MSP / entropy / MI"): "0.822 / 0.842 / 0.909",
    (
        "final",
        "σN-Ens λ=0, γ ×1 (chosen on validation)",
        "OOD AUROC MSP / entropy / MI",
    ): "0.824 / 0.842 / 0.900",
    ("final", "σN-Ens τ=1 λ=0.1 (default)", "test NLL"): "0.233 ± 0.004",
    ("final", "σN-Ens τ=1 λ=0.1 (default)", "train s"): "1921",  # epochs × median epoch
    (
        "final_uncertainty",
        "σN-Ens λ=0, γ ×1 (chosen on validation)",
        "OOD AUROC max-logit / energy",
    ): "0.965 / 0.969",
    ("final_uncertainty", "deep ensemble", "THR size"): "0.93",
    # the seeds' mean coverage over 200 test halvings ± the coverage's std from one to the next
    (
        "final_uncertainty",
        "σN-Ens τ=1 λ=0.1 (default)",
        "THR coverage, test halves (± per halving)",
    ): "0.900 ± 0.006",
    ("final_uncertainty", "σN-Ens τ=1 λ=0.1 (default)", "THR coverage"): "0.896 ± 0.001",
    ("posthoc", "… + 4 epochs more", "train s"): "+ 56",
    ("posthoc", "… + σN-Ens τ=1 λ=0.1, γ ×3, 4 epochs", "ECE, sev. 5"): "0.149 ± 0.018",
    ("posthoc", "deep ensemble, 40 epochs", "ECE, sev. 5"): "0.113 ± 0.007",
    ("text", "σN-Ens τ=1 λ=0.1, γ ×150 (chosen on validation)", "test NLL"): "0.513 ± 0.007",
    ("text", "σN-Ens τ=1 λ=0.1, γ ×150 (chosen on validation)", "params"): "22.77 M",
    ("text", "single", "disagreement"): "–",
    ("text", "single", "OOD AUROC (MSP)"): "0.662 ± 0.018",
    ("vision", "σN-Ens, γ ×10", "OOD AUROC MSP / entropy / MI"): "0.809 / 0.853 / 0.887",
    ("vision", "σN-Ens, γ ×3 (chosen; the preset)", "ECE, sev. 5"): "0.101",
    ("vision", "single", "train s"): "82",  # wall clock, 81.51 s
    (
        "glance",
        "one model overfits: 10,000 images, SmallCNN width 32, 20 epochs",
        "σN-Ens, the defaults (1.002–1.09×)",
    ): "0.331 / 0.199 (`split`: 0.311 / 0.184)",
    (
        "glance",
        "MiniLM fine-tuned on 2,000 Rotten Tomatoes reviews",
        "deep ensemble (4× the parameters)",
    ): "0.551",
}


@pytest.mark.parametrize("where", PINNED, ids=[" / ".join(k) for k in PINNED])
def test_a_generated_cell_is_the_committed_runs_value(where):
    assert _cell(*where) == PINNED[where]


@pytest.mark.parametrize("table", results_tables.TABLES)
def test_no_generated_table_ranks_the_runs(table):
    """The tables carry no interval on a difference between runs, so none marks a best value:
    no cell is bold and no column names a winner."""
    header, _, *body = _rows(_generated()[table].splitlines())
    assert [cell for row in body for cell in row if "**" in cell] == []
    assert [h for h in header if h.lower() in ("best", "verdict", "winner")] == []


def test_the_tables_are_the_same_each_time_they_are_written(tmp_path):
    first = results_tables.tables(RESULTS)
    assert results_tables.tables(RESULTS) == first
    paths = results_tables.write(tmp_path, RESULTS)
    assert {p.name for p in paths} == {f"converged_{name}.md" for name in first}
    for name, text in first.items():
        assert (tmp_path / f"converged_{name}.md").read_text(encoding="utf-8") == text


def _committed_files(directory: str, names: list[str]) -> set[str]:
    """What a copy of the study leaves out: the files git ignores (a run's checkpoints hold
    gigabytes where the runs were trained) and the runs under selection, which these tables do
    not read."""
    left_out = shutil.ignore_patterns("*.pt", "*.lock", "*.tmp", "outputs.npz")(directory, names)
    return left_out | ({"selected"} if Path(directory) == RESULTS else set())


def test_a_missing_seed_fails_naming_its_file(tmp_path):
    root = tmp_path / "converged"
    shutil.copytree(RESULTS, root, ignore=_committed_files)
    assert results_tables.tables(root) == _generated()  # the copy gives the same tables
    missing = root / "final" / "snens_default" / "seed=1" / "final.json"
    missing.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        results_tables.tables(root)
    shutil.copy(RESULTS / "final" / "snens_default" / "seed=1" / "final.json", missing)
    halves = root / "final" / "packed" / "seed=2" / "conformal_halves.json"
    halves.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(halves))):
        results_tables.tables(root)
