"""``snens demo`` end to end on the bundled data, at a size that runs in seconds."""

import json

import pytest
import torch

import snens
from snens import data
from snens.engine import demo as demo_module
from snens.engine.config import load_config
from snens.engine.demo import FULL_DEMO, DemoConfig, run
from snens.engine.fit import fit
from snens.method.regularizer import DEFAULT_DIVERSITY_WEIGHT, DEFAULT_TEMPERATURE
from snens.models import create

TINY = DemoConfig(
    train_examples=600,
    validation_examples=300,
    test_examples=300,
    epochs=2,
    width=4,
    temperatures=(0.05, DEFAULT_TEMPERATURE, 5.0),
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
        "σN-Ens τ=1 (default)",
        "σN-Ens τ=5",
        "σN-Ens τ=1, split",
    ]
    # split inputs: each member sees a quarter of the batch, the same parameters
    assert rows["σN-Ens τ=1, split"]["params"] == rows["σN-Ens τ=1 (default)"]["params"]
    single = rows["single"]["params"]
    assert rows["deep ensemble"]["params"] == 4 * single
    # σN-Ens adds M−1 heads and M−1 copies of each norm's affine and gamma, nothing else
    assert single < rows["σN-Ens τ=5"]["params"] < 1.3 * single
    for row in rows.values():
        for key in ("accuracy", "ece", "ood_auroc", "corrupted_accuracy", "corrupted_ece"):
            assert 0.0 <= row[key] <= 1.0, (row["method"], key)
        assert row["nll"] > 0 and row["train_seconds"] > 0
    assert rows["single"]["disagreement"] == 0.0 and rows["deep ensemble"]["disagreement"] > 0
    # each run at the epoch it selected on the validation split (deep-ensemble members each at
    # its own), and after temperature scaling fitted there
    runs = {p.name: p for p in (out / "runs").iterdir() if p.is_dir()}
    for name, path in runs.items():
        final = json.loads((path / "final.json").read_text())
        label = demo_module._label(load_config(path / "config.toml"))
        selection = final["selection"]
        epochs = selection.get("member_epochs") or [selection["epoch"]]
        assert rows[label]["epoch"] == "/".join(map(str, epochs)), name
        assert rows[label]["nll_ts"] == final["metrics"]["test_ts/nll"]
        assert rows[label]["ece_ts"] == final["metrics"]["test_ts/ece"]
        assert selection["metric"] == "nll" and set(epochs) <= {1, 2}
    assert len(rows["deep ensemble"]["epoch"].split("/")) == 4
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
    table, reference = report.split("## This budget")
    assert table.count("\n| ") == 1 + len(rows)  # the header, one line per run
    assert "| Packed-Ensembles | " in table and "corrupted ECE" in table
    # the budget it ran, said to be short
    assert "600 images for 2 epochs (8 steps, SmallCNN width 4, no augmentation)" in reference
    # whether one model overfit, read off its own run: after two epochs it has not
    loss, nll = rows["single"]["train_loss"], rows["single"]["nll"]
    said = (
        f"training loss of {loss:.3f} and a test NLL of {nll:.3f} at the epoch it is evaluated at"
    )
    assert f"{said}: it does not overfit" in (reference.replace("\n", " "))
    # the studies are pointed to, none of their numbers copied into the demo
    assert "README compares σN-Ens with one model and a deep ensemble" in reference
    assert "\n|" not in reference


def test_the_demo_trains_what_users_get_by_default():
    """Its σN-Ens runs include the library's default τ and λ (the row labelled "(default)" in
    test_demo_trains_every_method_and_writes_its_table), with --full or without."""
    for config in (DemoConfig(), FULL_DEMO):
        assert DEFAULT_TEMPERATURE in config.temperatures
        assert config.diversity_weight == DEFAULT_DIVERSITY_WEIGHT


def test_demo_draws_every_figure(demo):
    pytest.importorskip("matplotlib")
    out, _ = demo
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(
        ["pareto_nll.png", "pareto_ece.png", "corruption_severity.png"]
        + [
            f"reliability_{i}_{name}.png"
            for i, name in enumerate(
                [
                    "single",
                    "deep_ensemble",
                    "Packed-Ensembles",
                    "snens_tau0.05",
                    "snens_tau1_default",
                    "snens_tau5",
                    "snens_tau1_split",
                ]
            )
        ]
        + [
            "allocation_snens_tau0.05.png",
            "allocation_snens_tau1_default.png",
            "allocation_snens_tau5.png",
            "allocation_snens_tau1_split.png",
        ]
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
    from snens.engine.cli import main

    out, results = demo
    for run_dir in (out / "runs").iterdir():
        if run_dir.is_dir():
            assert (run_dir / "final.json").is_file() and (run_dir / "last.pt").is_file()
    capsys.readouterr()
    assert run(out=out, config=TINY) == 0
    printed = capsys.readouterr().out
    # run_sweep logs "<run>: training" for a run it trains
    assert printed.count("done, skipped") == len(results["rows"]) and ": training" not in printed
    again = json.loads((out / "results.json").read_text())
    assert again["rows"] == results["rows"]
    assert main(["demo", "--full", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another config" in err and "data.train_examples" in err


def test_the_report_says_whether_one_model_overfit_from_its_own_numbers():
    """Measured on the default demo's settings (2,000 images, no augmentation, width 32, 20
    epochs, seed 0): the single model's last training loss 0.005 against a test NLL of 0.592 at
    its last epoch, 0.556 at the epoch it selects on validation (9)."""
    from snens.engine.demo import _reference

    def reference(train_loss, nll):
        row = {"method": "single", "train_loss": train_loss, "nll": nll}
        return _reference(DemoConfig(), 300, [row]).replace("\n", " ")

    assert "2,000 images for 20 epochs (300 steps, SmallCNN width 32, no augmentation)" in (
        reference(0.005, 0.592)
    )
    assert "a test NLL of 0.592 at the epoch it is evaluated at: it overfits" in reference(
        0.005, 0.592
    )
    assert "it does not overfit" in reference(0.30, 0.35)


def test_demo_out_a_file_is_named_with_the_fix(tmp_path, capsys):
    """It had printed "[Errno 17] File exists: '<path>'"."""
    from snens.engine.cli import main

    (tmp_path / "file").write_text("x")
    assert main(["demo", "--out", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == (
        f"snens demo: --out {tmp_path / 'file'} is a file, not a directory; choose another --out\n"
    )


def test_the_demo_ends_with_a_verdict_its_intervals_support(demo):
    from snens.engine.compare import compare_runs

    out, results = demo
    report = (out / "report.md").read_text()
    verdicts = [line for line in report.splitlines() if line.startswith("Verdict: ")]
    sigma = [r["method"] for r in results["rows"] if r["method"].startswith("σN-Ens")]
    # one line for each σN-Ens run and each baseline
    assert [v.split(" beats ")[0].split(" is ")[0].removeprefix("Verdict: ") for v in verdicts] == (
        [label for label in sigma for _ in range(3)]
    )
    runs = {p.name: p for p in (out / "runs").iterdir() if p.is_dir()}
    default = next(
        p for name, p in runs.items()
        if "snens" in name and "temperature=1.0" in name and "split" not in name
    )  # fmt: skip
    lines = [v for v in verdicts if v.startswith("Verdict: σN-Ens τ=1 (default) ")]
    words = {"better": "beats", "worse": "is behind", "level": "is level with"}
    for line, (key, name) in zip(
        lines,
        (("single", "the single model"), ("deep_ensemble", "the deep ensemble"),
         ("packed", "Packed-Ensembles")),
        strict=True,
    ):  # fmt: skip
        baseline = next(p for run_name, p in runs.items() if f"name={key}" in run_name)
        found = compare_runs(
            [default], [baseline], sets=("test", "test_ts"), metrics=("nll", "ece")
        )
        assert len(found) == 4
        for c in found:
            assert f"{words[c.verdict]} {name} on {c.set} {c.metric} (Δ {c.interval})" in line


def test_the_demo_says_its_times_were_taken_under_load(monkeypatch):
    from snens.engine import demo

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 6.5, 3.0))
    assert demo._load_note().startswith(
        "The train s column was measured under load (5-minute load average 6.5 on 2 cores)"
    )
    monkeypatch.setattr("os.getloadavg", lambda: (0.5, 1.5, 1.0))
    assert demo._load_note() == ""


def test_the_epoch_column_says_which_epoch_each_run_was_evaluated_at():
    selected = demo_module._selected
    assert selected({"selection": {"metric": "nll", "epoch": 7}, "train": {"epochs": 20}}) == "7"
    members = {
        "selection": {"metric": "nll", "member_epochs": [6, 5, 9, 7]},
        "train": {"epochs": 20},
    }
    assert selected(members) == "6/5/9/7"
    assert selected({"selection": None, "train": {"epochs": 20}}) == "20"  # no selection: the last


def test_the_demo_names_the_run_chosen_on_validation_from_the_runs_files(demo):
    out, results = demo
    report = (out / "report.md").read_text()
    (line,) = [x for x in report.splitlines() if x.startswith("Chosen on validation: ")]
    # every run's selected validation NLL, read from its final.json apart from the library
    values = {}
    for run_dir in (out / "runs").iterdir():
        if run_dir.is_dir():
            selection = json.loads((run_dir / "final.json").read_text())["selection"]
            label = demo_module._label(load_config(run_dir / "config.toml"))
            values[label] = selection.get("value")  # None: members selected apart
    assert [label for label, v in values.items() if v is None] == ["deep ensemble"]
    best = min((v, label) for label, v in values.items() if v is not None)
    assert line.startswith(
        f"Chosen on validation: {best[1]} (validation NLL {best[0]:.4f} at its selected "
        "epoch, the lowest; the test set played no part); not ranked: deep ensemble (its members"
    )
