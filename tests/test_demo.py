"""``snens demo`` end to end on the bundled data, at a size that runs in seconds."""

import json

import pytest
import torch

import snens
from snens import data
from snens.demo import DemoConfig, run
from snens.fit import fit
from snens.models import create

TINY = DemoConfig(
    train_examples=600,
    test_examples=300,
    epochs=1,
    width=4,
    temperatures=(0.05, 5.0),
    corruptions=("gaussian_noise", "contrast"),
    corruption_examples=200,
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("demo")
    try:
        assert run(out=out, config=TINY) == 0
    finally:
        torch.set_num_threads(threads)
    return out, json.loads((out / "results.json").read_text())


def test_demo_trains_every_method_and_writes_its_table(demo):
    out, results = demo
    rows = {r["method"]: r for r in results["rows"]}
    assert list(rows) == [
        "single",
        "deep ensemble",
        "Packed-Ensembles",
        "σN-Ens τ=0.05",
        "σN-Ens τ=5",
    ]
    single = rows["single"]["params"]
    assert rows["deep ensemble"]["params"] == 4 * single
    # σN-Ens adds M−1 heads and M−1 copies of each norm's affine and gamma, nothing else
    assert single < rows["σN-Ens τ=5"]["params"] < 1.3 * single
    for row in rows.values():
        for key in ("accuracy", "ece", "ood_auroc", "corrupted_accuracy", "corrupted_ece"):
            assert 0.0 <= row[key] <= 1.0, (row["method"], key)
        assert row["nll"] > 0 and row["train_seconds"] > 0
    assert rows["single"]["disagreement"] == 0.0 and rows["deep ensemble"]["disagreement"] > 0
    # the realized sharing and the optimum are reported for σN-Ens only
    assert rows["σN-Ens τ=0.05"]["k_star"] == pytest.approx(snens.optimal_k(0.05, 4))
    assert rows["single"]["effective_members"] is None
    # every row's metrics are snens.evaluate's, corruption means included
    metrics = results["metrics"]["σN-Ens τ=5"]
    assert rows["σN-Ens τ=5"]["corrupted_ece"] == metrics["shift/mean/ece"]
    assert {k.split("/")[1] for k in metrics if k.startswith("shift/")} >= {
        "gaussian_noise",
        "contrast",
    }

    report = (out / "report.md").read_text()
    assert report.count("\n| ") == 1 + len(rows)  # the header, one line per run
    assert "| Packed-Ensembles | " in report and "corrupted ECE" in report


def test_demo_draws_every_figure(demo):
    pytest.importorskip("matplotlib")
    out, _ = demo
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(
        ["pareto_nll.png", "pareto_ece.png", "corruption_severity.png"]
        + [
            f"reliability_{i}_{name}.png"
            for i, name in enumerate(
                ["single", "deep_ensemble", "Packed-Ensembles", "snens_tau0.05", "snens_tau5"]
            )
        ]
        + ["allocation_snens_tau0.05.png", "allocation_snens_tau5.png"]
    )
    report = (out / "report.md").read_text()
    for name in pngs:
        assert f"]({name})" in report
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_converted_model_learns_fashion_mnist():
    """A few hundred steps of σN-Ens on real images: the task loss falls, accuracy follows."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        x, y = data.load_fashion_mnist("train")
        xt, yt = data.load_fashion_mnist("test")
        norm = {"mean": data.FASHION_MNIST_MEAN, "std": data.FASHION_MNIST_STD}
        train = data.TensorLoader(x[:2000], y[:2000], 100, shuffle=True, seed=0, **norm)
        test = data.TensorLoader(xt[:1000], yt[:1000], 500, **norm)
        ens = snens.convert(
            create("small_cnn", num_classes=10, in_channels=1, width=8),
            4,
            generator=torch.Generator().manual_seed(0),
        )
        before = snens.evaluate(ens, test)["test/accuracy"]
        result = fit(ens, train, epochs=3, lr=1e-2, temperature=1.0, log=None)
        after = snens.evaluate(ens, test)["test/accuracy"]
    finally:
        torch.set_num_threads(threads)
    losses = result.task_loss
    # measured: losses 1.81, 1.27, 1.10; accuracy 0.093 before, 0.665 after
    assert losses[0] > losses[1] > losses[2]
    assert losses[2] < losses[0] - 0.5
    assert before < 0.2 and after > 0.55


def test_demo_again_reads_its_finished_runs_and_refuses_other_settings(demo, capsys):
    """The demo trains through the engine: its runs are run directories; a second call
    retrains nothing and reports the same numbers; other settings into the same --out are
    refused before any training, naming the difference."""
    from snens.cli import main

    out, results = demo
    for run_dir in (out / "runs").iterdir():
        if run_dir.is_dir():
            assert (run_dir / "final.json").is_file() and (run_dir / "last.pt").is_file()
    capsys.readouterr()
    assert run(out=out, config=TINY) == 0
    printed = capsys.readouterr().out
    assert printed.count("done, skipped") == len(results["rows"]) and "training" not in printed
    again = json.loads((out / "results.json").read_text())
    assert again["rows"] == results["rows"]
    assert main(["demo", "--full", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another config" in err and "data.train_examples" in err
