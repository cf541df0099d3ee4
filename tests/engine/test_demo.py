"""``snens demo`` end to end on the bundled data, at a size that runs in seconds."""

import csv
import json

import pytest
import torch

import snens
from snens import data
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
    with (out / "report.csv").open(newline="", encoding="utf-8") as f:
        return out, list(csv.DictReader(f))


def _label(row):
    """A report.csv row's method and the keys that set it apart, as the verdicts name it."""
    if row["method.name"] != "snens":
        return row["method.name"]
    return f"snens τ={float(row['method.temperature']):g} {row['method.input_policy']}"


def test_demo_trains_every_method_and_writes_its_table(demo):
    """Every method, as ``snens report`` tabulates runs: one row per configuration."""
    out, rows = demo
    rows = {_label(r): r for r in rows}
    assert sorted(rows) == [
        "deep_ensemble",
        "packed",
        "single",
        "snens τ=0.05 repeat",
        "snens τ=1 repeat",
        "snens τ=1 split",
        "snens τ=5 repeat",
    ]
    params = {label: int(float(row["params mean"])) for label, row in rows.items()}
    # split inputs: each member sees a quarter of the batch, the same parameters
    assert params["snens τ=1 split"] == params["snens τ=1 repeat"]
    assert params["deep_ensemble"] == 4 * params["single"]
    # σN-Ens adds M−1 heads and M−1 copies of each norm's affine and gamma, nothing else
    assert params["single"] < params["snens τ=5 repeat"] < 1.3 * params["single"]
    for label, row in rows.items():
        for key in ("test/accuracy", "test/ece", "ood/mnist_5k/auroc", "shift/mean/ece"):
            assert 0.0 <= float(row[f"{key} mean"]) <= 1.0, (label, key)
        assert float(row["test/nll mean"]) > 0 and float(row["train seconds mean"]) > 0
    # each run at the epoch it selected on the validation split (deep-ensemble members each at
    # its own), and after temperature scaling fitted there: the table holds final.json's numbers
    for path in (out / "runs").iterdir():
        if not path.is_dir():
            continue
        final = json.loads((path / "final.json").read_text())
        row = rows[_label(_flat(load_config(path / "config.toml")))]
        selection = final["selection"]
        epochs = selection.get("member_epochs") or [selection["epoch"]]
        assert selection["metric"] == "nll" and set(epochs) <= {1, 2}, path.name
        for key in ("test/nll", "test_ts/nll", "test_ts/ece", "shift/mean/ece"):
            assert float(row[f"{key} mean"]) == final["metrics"][key], (path.name, key)
    assert {k.split("/")[1] for k in final["metrics"] if k.startswith("shift/")} >= {
        "gaussian_noise",
        "contrast",
    }

    report = (out / "report.md").read_text()
    assert report.startswith("# snens demo\n")
    budget = next(line for line in report.splitlines() if line.startswith("This demo trained"))
    # the budget it ran, said to be short
    assert "600 images for 2 epochs (8 steps, SmallCNN width 4, no augmentation)" in budget
    # whether one model overfit, read off its own run: after two epochs it has not
    single = next(p for p in (out / "runs").iterdir() if "name=single" in p.name)
    loss = json.loads((single / "metrics.jsonl").read_text().splitlines()[-1])["task_loss"]
    nll = json.loads((single / "final.json").read_text())["metrics"]["test/nll"]
    said = (
        f"training loss of {loss:.3f} and a test NLL of {nll:.3f} at the epoch it is evaluated at"
    )
    assert f"{said}: it does not overfit" in budget
    # the studies are pointed to, none of their numbers copied into the demo
    assert "README compares σN-Ens with one model and a deep ensemble" in budget
    # then the report of snens report, with a section against each baseline
    for name in ("single", "deep_ensemble, M=4", "packed, M=4"):
        assert f"## Differences against {name}" in report


def _flat(config):
    method = config.method
    return {
        "method.name": method.name,
        "method.temperature": method.temperature,
        "method.input_policy": method.input_policy,
    }


def test_the_demo_trains_what_users_get_by_default():
    """Its σN-Ens runs include the library's default τ and λ (the row labelled "(default)" in
    test_demo_trains_every_method_and_writes_its_table), with --full or without."""
    for config in (DemoConfig(), FULL_DEMO):
        assert DEFAULT_TEMPERATURE in config.temperatures
        assert config.diversity_weight == DEFAULT_DIVERSITY_WEIGHT


def test_demo_draws_every_figure(demo):
    """The figures of ``snens report``: Pareto fronts, the shift plot, a reliability diagram
    per row and an allocation heatmap per σN-Ens row, each shown in the report."""
    pytest.importorskip("matplotlib")
    out, rows = demo
    pngs = sorted(p.name for p in out.glob("*.png"))
    snens_rows = [i for i, r in enumerate(rows, start=1) if r["method.name"] == "snens"]
    assert len(snens_rows) == 4
    assert pngs == sorted(
        ["pareto_nll.png", "pareto_ece.png", "shift.png"]
        + [f"reliability_{i}.png" for i in range(1, len(rows) + 1)]
        + [f"allocation_{i}.png" for i in snens_rows]
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

    out, rows = demo
    for run_dir in (out / "runs").iterdir():
        if run_dir.is_dir():
            assert (run_dir / "final.json").is_file() and (run_dir / "last.pt").is_file()
    before = (out / "report.csv").read_text()
    capsys.readouterr()
    assert run(out=out, config=TINY) == 0
    printed = capsys.readouterr().out
    # run_sweep logs "<run>: training" for a run it trains
    assert printed.count("done, skipped") == len(rows) and ": training" not in printed
    assert (out / "report.csv").read_text() == before
    assert main(["demo", "--full", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another config" in err and "data.train_examples" in err


def test_the_report_says_whether_one_model_overfit_from_its_own_numbers():
    """Measured on the default demo's settings (2,000 images, no augmentation, width 32, 20
    epochs, seed 0): the single model's last training loss 0.005 against a test NLL of 0.592 at
    its last epoch, 0.556 at the epoch it selects on validation (9)."""
    from snens.engine.demo import _reference

    def reference(train_loss, nll):
        return _reference(DemoConfig(), 300, (train_loss, nll))

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
    """One verdict line for each σN-Ens row and each baseline, on test NLL and ECE raw and +TS,
    each clause the bootstrap's interval and the word it supports."""
    from snens.engine.compare import compare_runs

    out, rows = demo
    report = (out / "report.md").read_text()
    verdicts = [line for line in report.splitlines() if line.startswith("Verdict: ")]
    assert len(verdicts) == 4 * 3
    runs = {p.name: p for p in (out / "runs").iterdir() if p.is_dir()}
    default = next(
        p for name, p in runs.items()
        if "snens" in name and "temperature=1.0" in name and "split" not in name
    )  # fmt: skip
    subject = "snens, M=4, τ=1.0, λ=0.1, method.input_policy=repeat"
    lines = [v for v in verdicts if v.startswith(f"Verdict: {subject} ")]
    words = {"better": "beats", "worse": "is behind", "level": "is level with"}
    for line, (key, name) in zip(
        lines,
        (("single", "one model"), ("deep_ensemble", "the deep ensemble"),
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


def test_the_demo_names_the_run_chosen_on_validation_from_the_runs_files(demo):
    out, _ = demo
    report = (out / "report.md").read_text()
    (line,) = [x for x in report.splitlines() if x.startswith("Chosen on validation: ")]
    # every run's selected validation NLL, read from its final.json apart from the library
    values = {}
    for run_dir in (out / "runs").iterdir():
        if run_dir.is_dir():
            selection = json.loads((run_dir / "final.json").read_text())["selection"]
            values[run_dir.name] = selection.get("value")  # None: members selected apart
    assert [name for name, v in values.items() if v is None] == ["method.name=deep_ensemble"]
    best = min(v for v in values.values() if v is not None)
    assert f"the lowest validation NLL at the selected epoch ({best:.4f}, seed 0" in line
    assert "Not candidates: deep_ensemble, M=4" in line
