"""Comparing groups of finished runs with intervals (snens.engine.compare, snens report
--baseline): the differences are the runs' own metrics', their intervals are the bootstrap's,
and the words follow the intervals."""

import json

import pytest

from snens.engine.cli import main
from snens.engine.compare import compare_runs, describe
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.runs import read_examples
from snens.engine.sweep import plan, run_sweep
from snens.evaluation.bootstrap import Examples, paired_bootstrap


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A single model and σN-Ens, seeds 0 and 1: 300 images, 2 epochs, width 8."""
    out = tmp_path_factory.mktemp("sweep")
    base = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            "threads=1",
            "data.train_examples=300",
            "data.validation_examples=200",
            "data.test_examples=300",
            "data.ood_examples=100",
            "optim.epochs=2",
            "model.options.width=8",
        ],
    )
    runs = plan(base, ["method.name=single,snens", "seed=0,1"], out)
    result = run_sweep(runs, out, progress=False)
    assert not result.failed
    return out


def _runs(sweep, method):
    return sorted(p.parent for p in sweep.rglob("final.json") if f"method.name={method}" in str(p))


def test_a_comparison_is_the_bootstrap_of_the_runs_examples(sweep):
    snens, single = _runs(sweep, "snens"), _runs(sweep, "single")
    assert len(snens) == len(single) == 2
    rows = compare_runs(snens, single, sets=("test", "test_ts"), metrics=("nll", "ece"))
    assert [(r.set, r.metric) for r in rows] == [
        ("test", "nll"),
        ("test", "ece"),
        ("test_ts", "nll"),
        ("test_ts", "ece"),
    ]
    finals = {p: json.loads((p / "final.json").read_text())["metrics"] for p in [*snens, *single]}
    mean = lambda runs, key: sum(finals[p][key] for p in runs) / len(runs)  # noqa: E731
    assert rows[0].interval.estimate == pytest.approx(
        mean(snens, "test/nll") - mean(single, "test/nll"), abs=1e-5
    )
    assert rows[3].interval.estimate == pytest.approx(
        mean(snens, "test_ts/ece") - mean(single, "test_ts/ece"), abs=1e-5
    )
    a = [Examples.from_arrays(read_examples(p), "test/") for p in snens]
    b = [Examples.from_arrays(read_examples(p), "test/") for p in single]
    assert rows[0].interval == paired_bootstrap(a, b, "nll")
    sentence = describe(rows[0], "σN-Ens", "one model")
    word = {"better": "beats", "worse": "is behind", "level": "is level with"}[rows[0].verdict]
    assert sentence.startswith(f"σN-Ens {word} one model on test nll (Δ {rows[0].interval}")


def test_snens_report_baseline_adds_the_differences(sweep, tmp_path, capsys):
    single = _runs(sweep, "single")[0]  # one run of the row: the row's seeds all count
    assert main(["report", str(sweep), "--out", str(tmp_path), "--baseline", str(single)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "## Differences against" in text
    assert "| row | set | metric | Δ (A − B) | 95 % interval | A against B |" in text
    assert text.count("| snens, M=4, τ=1.0, λ=0.1 | test_ts | nll |") == 1
    # a directory holding both rows' runs is refused, naming the rows
    assert main(["report", str(sweep), "--out", str(tmp_path), "--baseline", str(sweep)]) == 2
    assert "holds the runs of 2 rows, not one" in capsys.readouterr().err


def test_snens_report_takes_several_baselines_a_section_each(sweep, tmp_path):
    """``--baseline`` repeated: every row against each baseline's row, in the order given, the
    comparisons returned as (row, baseline, comparison) with the intervals of one baseline."""
    from snens.engine.report import write_report

    single, snens = _runs(sweep, "single")[0], _runs(sweep, "snens")[0]
    args = ["report", str(sweep), "--out", str(tmp_path)]
    assert main([*args, "--baseline", str(snens), "--baseline", str(single)]) == 0
    text = (tmp_path / "report.md").read_text()
    sections = [line for line in text.splitlines() if line.startswith("## Differences against")]
    assert sections == [
        "## Differences against snens, M=4, τ=1.0, λ=0.1",
        "## Differences against single",
    ]
    report = write_report([sweep], tmp_path / "two", baseline=[single, snens])
    alone = write_report([sweep], tmp_path / "one", baseline=single)
    assert [(row, base) for row, base, _ in report.comparisons][:1] == [
        ("snens, M=4, τ=1.0, λ=0.1", "single")
    ]
    assert {(r, b) for r, b, _ in report.comparisons} == {
        ("snens, M=4, τ=1.0, λ=0.1", "single"),
        ("single", "snens, M=4, τ=1.0, λ=0.1"),
    }
    against_single = [c for _, base, c in report.comparisons if base == "single"]
    assert against_single == [c for _, _, c in alone.comparisons]
    # one row given twice (two of its runs) is refused, named
    other_seed = _runs(sweep, "single")[1]
    with pytest.raises(ValueError, match=r"names the row 'single' again, as --baseline"):
        write_report([sweep], tmp_path / "twice", baseline=[single, other_seed])


def test_an_ood_comparison_is_the_auroc_of_the_kept_scores(sweep):
    from snens.engine.compare import compare_ood, run_arrays
    from snens.metrics import auroc

    snens, single = _runs(sweep, "snens"), _runs(sweep, "single")
    row = compare_ood(run_arrays(snens), run_arrays(single), "mnist_5k", "msp", resamples=100)
    finals = [json.loads((p / "final.json").read_text())["metrics"] for p in [*snens, *single]]
    mean = lambda rows: sum(r["ood/mnist_5k/auroc"] for r in rows) / len(rows)  # noqa: E731
    assert row.interval.estimate == pytest.approx(mean(finals[:2]) - mean(finals[2:]), abs=1e-6)
    assert row.set == "ood/mnist_5k/msp" and row.metric == "auroc"
    arrays = run_arrays(snens)[0]
    import torch

    own = auroc(
        torch.from_numpy(arrays["test/ood/energy"]), torch.from_numpy(arrays["ood/mnist_5k/energy"])
    )
    assert own == pytest.approx(finals[0]["ood/mnist_5k/energy/auroc"], abs=1e-6)
    with pytest.raises(KeyError, match="no 'odin' scores"):
        compare_ood(run_arrays(snens), run_arrays(single), "mnist_5k", "odin")
