"""snens report: groups by everything but seed, mean ± std (ddof=1) equal to NumPy's, the CSV,
the plots with that std as error bars, reliability diagrams from the runs' member logits and
allocation heatmaps from their checkpoints, and the report without matplotlib.

Run directories are written by hand (config.toml from a preset, final.json with chosen
numbers), so every expected number is known.
"""

import builtins
import csv
import errno
import io
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import snens
import snens.engine.runs
from snens.engine.checkpoint import save_checkpoint
from snens.engine.cli import main
from snens.engine.config import load_config, to_toml
from snens.engine.presets import preset
from snens.engine.report import (
    Group,
    _point_labels,
    collect_runs,
    group_runs,
    summarize,
    write_report,
)

TINY = "fashion_mnist_small_cnn_tiny"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RNG = np.random.default_rng(0)
# (method, τ, seeds): σN-Ens τ=0.05 × 3 seeds, τ=5 × 2 seeds, single × 1 seed
GROUPS = [("snens", 0.05, (0, 1, 2)), ("snens", 5.0, (0, 1)), ("single", 1.0, (0,))]


def _metrics(shift: bool) -> dict:
    values = {
        "test/accuracy": float(RNG.uniform(0.7, 0.9)),
        "test/nll": float(RNG.uniform(0.3, 0.6)),
        "test/ece": float(RNG.uniform(0.01, 0.1)),
        "test/brier": float(RNG.uniform(0.2, 0.4)),
        "test/mutual_information": 0.01,
        "ood/mnist_5k/auroc": float(RNG.uniform(0.6, 0.9)),
        "ood/mnist_5k/aupr": float(RNG.uniform(0.6, 0.9)),
        "ood/mnist_5k/fpr95": float(RNG.uniform(0.3, 0.6)),
    }
    if shift:
        for s in (1, 2):
            for m in ("accuracy", "nll", "ece", "brier"):
                value = float(RNG.uniform(0.1, 0.7))
                values[f"shift/contrast/{s}/{m}"] = value
                values[f"shift/severity/{s}/{m}"] = value
        for m in ("accuracy", "nll", "ece", "brier"):
            values[f"shift/mean/{m}"] = (
                values[f"shift/severity/1/{m}"] + values[f"shift/severity/2/{m}"]
            ) / 2
    return values


def _write_run(path, method, tau, seed, shift=True, seconds=1.5):
    overrides = [f'method.name="{method}"', f"method.temperature={tau}", f"seed={seed}"]
    if method == "single":
        overrides.append("method.num_members=1")
    config = load_config(preset(TINY), overrides)
    path.mkdir(parents=True)
    (path / "config.toml").write_text(to_toml(config))
    final = {
        "metrics": _metrics(shift),
        "model": {"params": 5852 if method == "snens" else 4782},
        "train": {"epochs": 1, "seconds": seconds + seed},
    }
    (path / "final.json").write_text(json.dumps(final))
    return final


@pytest.fixture
def sweep(tmp_path):
    finals = {}
    for method, tau, seeds in GROUPS:
        for seed in seeds:
            path = tmp_path / "sweep" / f"{method}-{tau}-{seed}"
            finals[(method, tau, seed)] = _write_run(path, method, tau, seed)
    (tmp_path / "sweep" / "unfinished").mkdir()  # config.toml without final.json: not a run
    (tmp_path / "sweep" / "unfinished" / "config.toml").write_text(to_toml(preset(TINY)))
    return tmp_path / "sweep", finals


def _read_csv(path):
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def test_groups_differ_only_in_seed(sweep):
    root, _ = sweep
    runs, skipped = collect_runs([root])
    assert len(runs) == 6 and skipped == []
    groups, varied = group_runs(runs)
    assert varied == ["method.name", "method.num_members", "method.temperature",
                      "method.diversity_weight"]  # fmt: skip
    got = [(dict(g.key)["method.name"], dict(g.key).get("method.temperature"), g.seeds)
           for g in groups]  # fmt: skip
    assert got == [("single", None, [0]), ("snens", 0.05, [0, 1, 2]), ("snens", 5.0, [0, 1])]


def test_mean_and_std_match_numpy(sweep, tmp_path):
    root, finals = sweep
    report = write_report([root], tmp_path / "report")
    rows = _read_csv(report.csv)
    assert [(r["method.name"], r["method.temperature"], r["n"], r["seeds"]) for r in rows] == [
        ("single", "—", "1", "0"),
        ("snens", "0.05", "3", "0 1 2"),
        ("snens", "5.0", "2", "0 1"),
    ]
    metrics = [
        "test/accuracy",
        "test/nll",
        "test/ece",
        "test/brier",
        "ood/mnist_5k/auroc",
        "ood/mnist_5k/aupr",
        "ood/mnist_5k/fpr95",
        "shift/mean/accuracy",
        "shift/mean/ece",
    ]
    for row, (method, tau, seeds) in zip(rows, [GROUPS[2], GROUPS[0], GROUPS[1]]):
        for metric in metrics:
            values = np.array([finals[(method, tau, s)]["metrics"][metric] for s in seeds])
            assert float(row[f"{metric} mean"]) == np.mean(values), metric
            if len(seeds) > 1:
                assert float(row[f"{metric} std"]) == np.std(values, ddof=1), metric
            else:
                assert row[f"{metric} std"] == ""
        seconds = [finals[(method, tau, s)]["train"]["seconds"] for s in seeds]
        assert float(row["train seconds mean"]) == np.mean(seconds)
        assert float(row["params mean"]) == (5852 if method == "snens" else 4782)
    assert "test/mutual_information mean" not in rows[0]  # not a key metric
    assert summarize([1.0, 2.0, 4.0]) == (7 / 3, float(np.std([1.0, 2.0, 4.0], ddof=1)), 3)


def test_markdown_table(sweep, tmp_path, capsys):
    root, finals = sweep
    assert main(["report", str(root), "--out", str(tmp_path / "report")]) == 0
    printed = capsys.readouterr().out
    text = (tmp_path / "report" / "report.md").read_text()
    glance = text[text.index("## At a glance") : text.index("## Every metric")]
    assert "\n".join(line for line in glance.splitlines() if line.startswith("|")) in printed
    full = text[text.index("## Every metric") : text.index("## Runs")]
    table = [line for line in full.splitlines() if line.startswith("|")]
    assert "\n".join(table) not in printed  # the terminal gets the table at a glance
    assert table[0].startswith("| method | M | τ | λ | n | seeds | test/accuracy | test/nll |")
    single = table[2].split(" | ")
    accuracy = finals[("single", 1.0, 0)]["metrics"]["test/accuracy"]
    assert single[:6] == ["| single", "—", "—", "—", "1", "0"]
    assert single[6] == f"{accuracy:.4f} (n=1)"
    cold = table[3].split(" | ")
    values = [finals[("snens", 0.05, s)]["metrics"]["test/nll"] for s in (0, 1, 2)]
    assert cold[:6] == ["| snens", "4", "0.05", "0.1", "3", "0 1 2"]
    assert cold[7] == f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}"
    assert "6 runs in 3 configurations" in text and "std with ddof=1" in text
    assert str(root / "snens-5.0-1") in text


def test_plots_are_pngs(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    root, _ = sweep
    report = write_report([root], tmp_path / "report")
    assert [p.name for p in report.plots] == ["pareto_nll.png", "pareto_ece.png", "shift.png"]
    for path in report.plots:
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 5000
    assert "![shift](shift.png)" in report.path.read_text()


def test_no_shift_plot_without_corruptions(tmp_path):
    pytest.importorskip("matplotlib")
    for seed in (0, 1):
        _write_run(tmp_path / "runs" / f"r{seed}", "snens", 1.0, seed, shift=False)
    report = write_report([tmp_path / "runs"], tmp_path / "report")
    assert [p.name for p in report.plots] == ["pareto_nll.png", "pareto_ece.png"]
    rows = _read_csv(report.csv)
    assert len(rows) == 1 and "shift/mean/accuracy mean" not in rows[0]
    assert report.table.splitlines()[0].startswith("| n | seeds | test/accuracy |")


def test_without_matplotlib(sweep, tmp_path, monkeypatch, capsys):
    root, _ = sweep
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["report", str(root), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "Plots skipped: matplotlib is not installed" in out
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["report.csv", "report.md"]
    assert "Plots skipped" in (tmp_path / "report" / "report.md").read_text()


def test_run_dirs_and_sweep_dirs_together_count_each_run_once(sweep, tmp_path):
    root, _ = sweep
    report = write_report([root / "snens-5.0-0", root, root / "single-1.0-0"], tmp_path / "r")
    assert [r["n"] for r in _read_csv(report.csv)] == ["1", "3", "2"]


def test_broken_runs_are_skipped_with_a_note(sweep, tmp_path):
    root, _ = sweep
    (root / "snens-5.0-1" / "final.json").write_text("{not json")
    (root / "single-1.0-0" / "config.toml").write_text("seed = 'zero'\n")
    (root / "snens-0.05-2" / "config.toml").unlink()  # its results can no longer be placed
    report = write_report([root], tmp_path / "report")
    assert [r["n"] for r in _read_csv(report.csv)] == ["2", "1"]
    assert any("snens-5.0-1" in n and "not valid JSON" in n for n in report.notes)
    assert any("single-1.0-0" in n and "seed must be an int" in n for n in report.notes)
    assert any(
        "snens-0.05-2" in n and "final.json without config.toml; restore it" in n
        for n in report.notes
    )


def test_output_directory_from_undecodable_bytes(sweep, tmp_path, capsys):
    root, _ = sweep
    out = tmp_path / "r\udcff"  # what Python makes of the byte 0xff in a file name
    assert main(["report", str(root), "--out", str(out)]) == 0
    assert "snens report: " in capsys.readouterr().out
    assert (out / "report.md").is_file() and (out / "report.csv").is_file()


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist; give run or sweep directories" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r")]) == 2
    assert "no finished runs" in capsys.readouterr().err
    # without --out the report goes to DIRS[0]/report: nothing is made when there is no run
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no finished runs" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "report").exists()
    assert not (tmp_path / "r").exists()


def test_each_point_is_labelled_by_what_sets_it_apart():
    # τ and λ wherever they apply; any other key only where it differs from what most have
    keys = ["method.temperature", "method.diversity_weight", "method.gamma_lr_multiplier",
            "method.options.head_init"]  # fmt: skip
    groups = [
        Group((("method.name", "deep_ensemble"),)),
        Group((("method.name", "snens"), ("method.temperature", 1.0),
               ("method.diversity_weight", 0.1), ("method.gamma_lr_multiplier", 30.0))),
        Group((("method.name", "snens"), ("method.temperature", 5.0),
               ("method.diversity_weight", 0.01), ("method.gamma_lr_multiplier", 30.0))),
        Group((("method.name", "snens"), ("method.temperature", 5.0),
               ("method.diversity_weight", 0.01), ("method.gamma_lr_multiplier", 3.0))),
        Group((("method.name", "snens"), ("method.temperature", 1.0),
               ("method.diversity_weight", 0.0), ("method.gamma_lr_multiplier", 30.0),
               ("method.options.head_init", "reset"))),
    ]  # fmt: skip
    assert _point_labels(groups, keys) == [
        "",
        "τ=1.0, λ=0.1",
        "τ=5.0, λ=0.01",
        "τ=5.0, λ=0.01, gamma_lr_multiplier=3.0",
        "τ=1.0, λ=0.0, head_init=reset",
    ]


def test_groups_apart_only_by_a_key_some_lack_are_labelled_by_it(tmp_path, monkeypatch):
    # a fresh-head variant next to the default: head_init is set in one group only
    pytest.importorskip("matplotlib")
    from snens.evaluation import plots

    for name, extra in (("copy", []), ("reset", ['method.options.head_init="reset"'])):
        config = load_config(preset(TINY), ['method.name="snens"', "seed=0", *extra])
        path = tmp_path / "runs" / name
        path.mkdir(parents=True)
        (path / "config.toml").write_text(to_toml(config))
        final = {"metrics": _metrics(True), "model": {"params": 5852}, "train": {"seconds": 1}}
        (path / "final.json").write_text(json.dumps(final))
    drawn = {}

    def record(name):
        return lambda what, out, **kw: drawn.setdefault(name, what) and out

    monkeypatch.setattr(plots, "pareto_plot", record("rows"))
    monkeypatch.setattr(plots, "shift_plot", record("legend"))
    write_report([tmp_path / "runs"], tmp_path / "report")
    assert [r["settings"] for r in drawn["rows"]] == ["", "head_init=reset"]
    assert list(drawn["legend"]) == ["snens", "snens head_init=reset"]


# -- figures from the runs' member logits and checkpoints, error bars --------------------------


def _member_model():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
        torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 10),
    )  # fmt: skip
    return snens.convert(plain, num_members=4)


def _keep_outputs(path, seed):
    """outputs.npz as snens train writes it: member logits (M, N, K) and labels (N,)."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(4, 300, 10, generator=g)
    labels = torch.randint(0, 10, (300,), generator=g)
    labels[:200] = logits.mean(0)[:200].argmax(-1)  # better than chance
    np.savez_compressed(path / "outputs.npz", test=logits.numpy(), test_labels=labels.numpy())
    return snens.predictive_probs(logits), labels


@pytest.fixture
def kept(tmp_path):
    """σN-Ens τ=1 × 2 seeds with outputs.npz, seed 1 with last.pt; a single model with
    outputs.npz; σN-Ens τ=5 with neither."""
    root = tmp_path / "kept"
    for seed in (0, 1):
        _write_run(root / f"snens-{seed}", "snens", 1.0, seed)
        _keep_outputs(root / f"snens-{seed}", seed)
    ens = _member_model()
    save_checkpoint(root / "snens-1" / "last.pt", {"model": ens.state_dict()})
    _write_run(root / "single", "single", 1.0, 0)
    _keep_outputs(root / "single", 2)
    _write_run(root / "bare", "snens", 5.0, 0)
    return root, ens


def _figures(monkeypatch):
    """The matplotlib figures the plots write, by file name."""
    from snens.evaluation import plots

    figures, save = {}, plots._save

    def keep(figure, path):
        figures[Path(path).name] = figure
        return save(figure, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def _bars(ax):
    from matplotlib.container import ErrorbarContainer

    return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_report_draws_reliability_and_allocation_where_the_runs_kept_them(kept, tmp_path):
    pytest.importorskip("matplotlib")
    root, _ = kept
    report = write_report([root], tmp_path / "report")
    # rows: single (1), σN-Ens τ=1 (2), σN-Ens τ=5 (3)
    assert [p.name for p in report.plots] == [
        "pareto_nll.png", "pareto_ece.png", "shift.png",
        "reliability_1.png", "reliability_2.png", "allocation_2.png",
    ]  # fmt: skip
    for path in report.plots:
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 5000, path.name
    text = report.path.read_text()
    assert "![reliability: snens, M=4, τ=1.0, λ=0.1](reliability_2.png)" in text
    assert "![allocation: snens, M=4, τ=1.0, λ=0.1](allocation_2.png)" in text
    assert (
        "Reliability diagrams not drawn for snens, M=4, τ=5.0, λ=0.1: no run of theirs holds "
        "outputs.npz"
    ) in text
    assert (
        "Allocation heatmaps not drawn for snens, M=4, τ=5.0, λ=0.1: no run of theirs holds its "
        "checkpoint (last.pt)"
    ) in text


def test_report_figures_draw_the_std_over_seeds_as_error_bars(kept, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    root, _ = kept
    figures = _figures(monkeypatch)
    report = write_report([root], tmp_path / "report")
    rows = _read_csv(report.csv)
    assert [r["n"] for r in rows] == ["1", "2", "1"]
    std = {k: float(rows[1][f"{k} std"]) for k in ("test/nll", "test/accuracy")}
    (ax,) = figures["pareto_nll.png"].axes
    # the σN-Ens points (one colour): τ=1 has two runs, τ=5 one; the single model no bars
    (bars,) = _bars(ax)
    _, caps, (x_bar, y_bar) = bars
    (x_segment,) = [seg for seg in x_bar.get_segments() if len(seg)]
    (y_segment,) = [seg for seg in y_bar.get_segments() if len(seg)]
    assert x_segment[1, 0] - x_segment[0, 0] == pytest.approx(2 * std["test/nll"], rel=1e-9)
    assert y_segment[1, 1] - y_segment[0, 1] == pytest.approx(2 * std["test/accuracy"], rel=1e-9)
    assert "bars: ± std over seeds" in ax.get_title()
    accuracy, ece = figures["shift.png"].axes[:2]
    for panel, metric in ((accuracy, "accuracy"), (ece, "ece")):
        (bars,) = _bars(panel)
        (y_bar,) = bars.lines[2]
        lengths = [seg[1, 1] - seg[0, 1] for seg in y_bar.get_segments()]
        finals = [json.loads((root / f"snens-{s}" / "final.json").read_text()) for s in (0, 1)]
        expected = [
            np.std([f["metrics"][key] for f in finals], ddof=1) * 2
            for key in (f"test/{metric}", *(f"shift/severity/{s}/{metric}" for s in (1, 2)))
        ]
        assert lengths == pytest.approx(expected, rel=1e-9)


def test_allocation_from_a_checkpoint_is_the_models(kept):
    from snens.engine.report import _checkpoint_allocation

    root, ens = kept
    got = _checkpoint_allocation(root / "snens-1" / "last.pt")
    expected = snens.allocation(ens)
    assert list(got) == list(expected) == ["model.1", "model.4"]
    for name, layer in expected.items():
        torch.testing.assert_close(got[name].importances, layer.importances, rtol=0, atol=0)
        torch.testing.assert_close(
            got[name].effective_members, layer.effective_members, rtol=0, atol=0
        )


def test_a_damaged_outputs_file_is_left_out_by_name(kept, tmp_path):
    pytest.importorskip("matplotlib")
    root, _ = kept
    (root / "snens-0" / "outputs.npz").write_bytes(b"PK\x03\x04 not a whole archive")
    report = write_report([root], tmp_path / "report")
    assert "reliability_2.png" in [p.name for p in report.plots]  # from seed 1 alone
    assert any(
        f"{root / 'snens-0'} left out: {root / 'snens-0' / 'outputs.npz'} is not a readable "
        "npz archive" in note
        for note in report.notes
    )


# -- faults a red-team run found: files that are not what they seem, a full disk, copies ------


@pytest.mark.timeout(20)
def test_a_fifo_among_the_run_files_is_refused_by_name_not_waited_for(sweep, tmp_path):
    """A FIFO named final.json had blocked `snens report` forever; every run file is read
    only if it is a regular file (O_NONBLOCK, fstat), so each is a note naming it."""
    root, _ = sweep
    (root / "snens-5.0-1" / "final.json").unlink()
    os.mkfifo(root / "snens-5.0-1" / "final.json")
    (root / "snens-0.05-2" / "config.toml").unlink()
    os.mkfifo(root / "snens-0.05-2" / "config.toml")
    os.mkfifo(root / "snens-0.05-0" / "provenance.json")  # read for the hardware line
    report = write_report([root], tmp_path / "report")
    assert [r["n"] for r in _read_csv(report.csv)] == ["1", "2", "1"]
    for name in ("snens-5.0-1/final.json", "snens-0.05-2/config.toml"):
        assert any(
            f"{root / name} is a FIFO, not a regular file, so it was not read" in note
            for note in report.notes
        ), name


def test_a_symlinked_run_file_is_not_followed(sweep, tmp_path):
    root, _ = sweep
    final = root / "single-1.0-0" / "final.json"
    final.rename(tmp_path / "elsewhere.json")
    final.symlink_to(tmp_path / "elsewhere.json")
    report = write_report([root], tmp_path / "report")
    assert [r["n"] for r in _read_csv(report.csv)] == ["3", "2"]  # the single model left out
    assert any(f"{final} is a symbolic link, not a regular file" in n for n in report.notes)


def test_a_run_file_above_the_size_limit_is_refused_by_name(sweep, tmp_path):
    root, _ = sweep
    assert snens.engine.runs.MAX_FILE_BYTES == 64 * 2**20
    final = root / "single-1.0-0" / "final.json"
    with open(final, "r+b") as file:  # sparse: 64 MiB + 1 byte that take no disk space
        file.truncate(64 * 2**20 + 1)
    report = write_report([root], tmp_path / "report")
    assert len(_read_csv(report.csv)) == 2
    assert any(
        f"{final} holds 67,108,865 bytes, above the limit of 67,108,864 for a run file" in n
        for n in report.notes
    )


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files by /proc")
def test_a_full_disk_leaves_the_previous_report_whole_and_names_the_file(
    sweep, tmp_path, monkeypatch, capsys
):
    """On a full disk report.md had been left empty (opened, truncated, then the write
    failed) with an error naming no file; now it is written atomically."""
    root, _ = sweep
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plots: only the two files
    out = tmp_path / "report"
    write_report([root], out)
    before = (out / "report.md").read_bytes()
    (root / "snens-5.0-1" / "final.json").unlink()  # the new report differs
    real_open = io.open

    class FullDisk:
        """A file open for writing on a full disk: every write fails."""

        def __init__(self, file):
            self._file = file

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._file.close()

    def full_open(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        name = os.readlink(f"/proc/self/fd/{opened.fileno()}")
        return FullDisk(opened) if "report.md" in name and "r" not in mode else opened

    monkeypatch.setattr(io, "open", full_open)  # what pathlib and os.fdopen open with
    monkeypatch.setattr(builtins, "open", full_open)
    with pytest.raises(OSError) as err:
        write_report([root], out)
    assert err.value.errno == errno.ENOSPC
    assert str(err.value).startswith(f"cannot write {out / 'report.md'} (No space left on")
    assert "the previous report.md there is unchanged" in str(err.value)
    assert (out / "report.md").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["report.csv", "report.md"]  # no temporary
    assert main(["report", str(root), "--out", str(out)]) == 2
    assert f"snens report: cannot write {out / 'report.md'}" in capsys.readouterr().err


def test_a_copied_run_directory_counts_once(sweep, tmp_path):
    """A backup beside a run, or kept inside it, had counted as another seed: n=2, seeds
    "0 0", ± 0.0000."""
    root, finals = sweep
    shutil.copytree(root / "single-1.0-0", root / "single-1.0-0-backup")
    shutil.copytree(root / "snens-5.0-1", root / "snens-5.0-1" / "old")
    report = write_report([root], tmp_path / "report")
    rows = _read_csv(report.csv)
    assert [(r["method.name"], r["n"], r["seeds"]) for r in rows] == [
        ("single", "1", "0"),
        ("snens", "3", "0 1 2"),
        ("snens", "2", "0 1"),
    ]
    accuracy = finals[("single", 1.0, 0)]["metrics"]["test/accuracy"]
    assert float(rows[0]["test/accuracy mean"]) == accuracy and rows[0]["test/accuracy std"] == ""
    assert (
        f"skipped {root / 'single-1.0-0-backup'}: the same configuration and seed (0) as "
        f"{root / 'single-1.0-0'}, so a copy of that run (or a rerun of it); each seed counts "
        "once: remove the copy, or give it another seed"
    ) in report.notes
    assert (
        f"skipped {root / 'snens-5.0-1' / 'old'}: it lies inside the run directory "
        f"{root / 'snens-5.0-1'} (a backup or copy of a run?), and a run counts once; move it "
        "out of that run to report it"
    ) in report.notes
    assert "4 runs in 3 configurations" not in report.path.read_text()
    assert "6 runs in 3 configurations" in report.path.read_text()


def test_a_final_json_without_metrics_is_not_a_finished_run(sweep, tmp_path):
    root, _ = sweep
    (root / "snens-5.0-1" / "final.json").write_text("{}")
    report = write_report([root], tmp_path / "report")
    assert [r["n"] for r in _read_csv(report.csv)] == ["1", "3", "1"]
    assert (
        f"skipped {root / 'snens-5.0-1'}: {root / 'snens-5.0-1' / 'final.json'} holds no "
        '"metrics" mapping, so the run is not finished (the file is damaged or was not written '
        f"by snens); finish it with `snens train --resume {root / 'snens-5.0-1'}`"
    ) in report.notes


def test_a_non_finite_metric_is_named_and_left_out_of_mean_and_std(sweep, tmp_path):
    """`Infinity` in one run's test/nll had made its row read "inf ± nan"."""
    root, finals = sweep
    for name in ("snens-5.0-1", "single-1.0-0"):
        path = root / name / "final.json"
        path.write_text(path.read_text().replace('"test/nll": ', '"test/nll": Infinity, "x": '))
    report = write_report([root], tmp_path / "report")
    rows = _read_csv(report.csv)
    header, _, *table = [line.split(" | ") for line in report.table.splitlines()]
    nll = header.index("test/nll")
    kept = finals[("snens", 5.0, 0)]["metrics"]["test/nll"]
    assert table[0][nll] == "inf (n=1)"  # single: its one value, as it is
    assert table[2][nll] == f"{kept:.4f} (n=1; left out: inf)"  # τ=5: seed 0's only
    assert (rows[2]["test/nll mean"], rows[2]["test/nll std"]) == (repr(kept), "")
    assert [r["test/nll left out"] for r in rows] == ["inf", "", "inf"]
    assert rows[0]["test/nll mean"] == ""  # no finite value: no mean
    assert "test/accuracy left out" not in rows[0]  # only where a value was left out
    assert (
        f"test/nll of {root / 'snens-5.0-1'} is inf: left out of its row's mean and std"
        in report.notes
    )


def test_report_files_are_readable_as_files_written_in_place(sweep, tmp_path):
    """Written atomically, yet with the mode a file written in place gets (the temporary
    file's 0o600 had made a shared report unreadable to the group): 0o666 less the umask, or
    the previous file's mode."""
    root, _ = sweep
    old = os.umask(0o022)
    try:
        report = write_report([root], tmp_path / "report")
    finally:
        os.umask(old)
    assert stat.S_IMODE(report.path.stat().st_mode) == 0o644
    assert stat.S_IMODE(report.csv.stat().st_mode) == 0o644
    report.path.chmod(0o640)
    assert stat.S_IMODE(write_report([root], tmp_path / "report").path.stat().st_mode) == 0o640


def test_calibrated_conformal_and_logit_ood_columns_where_runs_report_them(tmp_path):
    """Runs with data.calibrators, conformal sets and data.ood_scores: the table and the CSV
    carry those metrics after the test metrics, each OOD set's other scores after its MSP."""
    extra = {"test_ts/nll": 0.30, "test_ts/ece": 0.02, "test_vs/nll": 0.31, "test_vs/ece": 0.03}
    extra |= {"test/conformal_thr_coverage": 0.9, "test/conformal_thr_size": 1.1}
    extra |= {"ood/mnist_5k/energy/auroc": 0.8, "ood/mnist_5k/energy/fpr95": 0.5}
    for seed in (0, 1):
        path = tmp_path / "runs" / f"s{seed}"
        final = _write_run(path, "snens", 1.0, seed)
        values = {k: v + seed / 100 for k, v in extra.items()}
        (path / "final.json").write_text(
            json.dumps({**final, "metrics": final["metrics"] | values})
        )
    report = write_report([tmp_path / "runs"], tmp_path / "report")
    header = [c.strip() for c in report.table.splitlines()[0].strip("|").split("|")]
    metrics = header[header.index("seeds") + 1 :]
    assert metrics[:10] == [
        "test/accuracy",
        "test/nll",
        "test/ece",
        "test/brier",
        "test_ts/nll",
        "test_ts/ece",
        "test_vs/nll",
        "test_vs/ece",
        "test/conformal_thr_coverage",
        "test/conformal_thr_size",
    ]
    at = metrics.index("ood/mnist_5k/auroc")
    # the energy score before the maximum probability's, its AUROC only (the table stays narrow)
    assert metrics[at - 1] == "ood/mnist_5k/energy/auroc"
    assert "ood/mnist_5k/energy/fpr95" not in metrics
    row = _read_csv(tmp_path / "report" / "report.csv")[0]
    assert float(row["test_vs/nll mean"]) == pytest.approx(0.315)
    assert float(row["ood/mnist_5k/energy/auroc std"]) == pytest.approx(np.std([0.8, 0.81], ddof=1))


def test_the_report_and_its_plots_never_write_through_a_link_in_out(kept, tmp_path):
    """The PNGs had been saved by a plain savefig, following a link planted in --out."""
    pytest.importorskip("matplotlib")
    root, _ = kept
    out = tmp_path / "report"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    names = ("pareto_nll.png", "reliability_1.png", "allocation_2.png", "report.md", "report.csv")
    for name in names:
        (out / name).symlink_to(victim)
    report = write_report([root], out)
    assert victim.read_bytes() == b"keep"
    assert not [p.name for p in out.iterdir() if p.is_symlink()]
    assert {p.name for p in report.plots} >= {"pareto_nll.png", "reliability_1.png"}
    assert (out / "pareto_nll.png").read_bytes()[:8] == PNG_SIGNATURE


def test_a_copy_whose_seed_was_edited_counts_once(kept, tmp_path):
    """A copied run whose config.toml says another seed had shown as a second seed (n=2,
    ± 0.0000) — the symptom a copy of the same seed no longer showed."""
    root, _ = kept
    copy = root / "snens-0-copy"
    shutil.copytree(root / "snens-0", copy)
    (copy / "config.toml").write_text(
        (copy / "config.toml").read_text().replace("seed = 0", "seed = 7")
    )
    bare = root / "snens-1-copy"  # a copy holding the checkpoint alone
    shutil.copytree(root / "snens-1", bare, ignore=shutil.ignore_patterns("outputs.npz"))
    (bare / "config.toml").write_text(
        (bare / "config.toml").read_text().replace("seed = 1", "seed = 8")
    )
    report = write_report([root], tmp_path / "report")
    assert [(r["n"], r["seeds"]) for r in _read_csv(report.csv)] == [
        ("1", "0"),
        ("2", "0 1"),
        ("1", "0"),
    ]
    assert (
        f"skipped {copy}: its outputs.npz is byte for byte that of {root / 'snens-0'}, so it is "
        "a copy of that run whatever its config.toml says (a seed edited in a copy trains "
        "nothing); each run counts once: remove the copy"
    ) in report.notes
    assert any(
        note.startswith(f"skipped {bare}: its last.pt is byte for byte that of {root / 'snens-1'}")
        for note in report.notes
    )


def test_runs_of_other_class_counts_huge_numbers_and_odd_provenance_are_named(kept, tmp_path):
    """A group whose runs kept logits of other class counts had stopped the report with a
    trace from torch.cat; an int of 400 digits in final.json with an OverflowError; a list of
    ints as provenance.json's gpus with a TypeError."""
    pytest.importorskip("matplotlib")
    root, _ = kept
    g = torch.Generator().manual_seed(5)
    np.savez_compressed(
        root / "snens-1" / "outputs.npz",
        test=torch.randn(4, 300, 5, generator=g).numpy(),
        test_labels=torch.randint(0, 5, (300,), generator=g).numpy(),
    )
    huge = root / "huge"
    _write_run(huge, "snens", 9.0, 0)
    (huge / "final.json").write_text('{"metrics": {"test/accuracy": 1' + "0" * 400 + "}}")
    (root / "single" / "provenance.json").write_text('{"platform": "x", "gpus": [1, 2]}')
    report = write_report([root], tmp_path / "report")
    assert any(
        note.startswith(f"skipped {huge}: {huge / 'final.json'}: metrics.test/accuracy = ")
        and "(401 digits) is larger than any float" in note
        for note in report.notes
    )
    assert (
        f"Reliability diagram of snens, M=4, τ=1.0, λ=0.1: {root / 'snens-1'} left out: its "
        "test predictions are of 5 classes, the group's first run's of 10 (outputs.npz does "
        "not belong to its config?)"
    ) in report.notes
    assert "reliability_2.png" in [p.name for p in report.plots]  # from seed 0 alone
    assert f"Hardware and versions (from {root / 'single' / 'provenance.json'}): x" in (
        report.path.read_text()
    )
    assert ", 1, 2; torch" in report.path.read_text()


def test_the_table_at_a_glance_names_rows_by_what_differs_and_keeps_few_columns(
    sweep, tmp_path, capsys
):
    import statistics

    root, finals = sweep
    assert main(["report", str(root), "--out", str(tmp_path / "report")]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines[:5]]
    assert table[0] == ["run", "n", "acc", "NLL", "ECE", "params", "train s"]
    assert [row[:2] for row in table[2:]] == [
        ["single", "1"],
        ["snens, M=4, τ=0.05, λ=0.1", "3"],
        ["snens, M=4, τ=5.0, λ=0.1", "2"],
    ]
    nll = [finals[("snens", 0.05, s)]["metrics"]["test/nll"] for s in (0, 1, 2)]
    assert table[3][3] == f"{statistics.mean(nll):.4f} ± {statistics.stdev(nll):.4f}"
    one = finals[("single", 1.0, 0)]["metrics"]["test/ece"]
    assert table[2][4] == f"{one:.4f}"  # one run: its value, no "(n=1)"
    assert table[3][5] == "5,852" and table[2][6] == "1.5"
    assert lines[5] == "every metric, the runs and the plots: report.md; every number: report.csv"
    text = (tmp_path / "report" / "report.md").read_text()
    assert text.index("## At a glance") < text.index("## Every metric") < text.index("## Runs")


HOLDOUT_GN = Path(__file__).resolve().parents[2] / "results" / "holdout" / "few_gncnn"


def _copy_runs(tmp_path: Path, *variants: str) -> dict[str, Path]:
    """The committed holdout runs of ``variants`` (seed 0), their files but the checkpoints."""
    out = {}
    for name in variants:
        out[name] = tmp_path / name / "seed=0"
        shutil.copytree(
            HOLDOUT_GN / name / "seed=0", out[name], ignore=shutil.ignore_patterns("*.pt")
        )
    return out


def test_the_report_takes_the_validation_nll_apart_against_a_single_model_baseline(tmp_path):
    runs = _copy_runs(tmp_path, "single", "snens_tau1_lam0.1", "snens_split_tau5_lam0.01")
    report = write_report([tmp_path], tmp_path / "report", baseline=runs["single"])
    text = report.path.read_text()
    section = text[text.index("## Members alone") :].split("\n\n")[2].splitlines()[2:]
    rows = {line.split(" | ")[0].strip("| "): line.strip("| ").split(" | ")[1:] for line in section}
    # the GroupNorm CNN at the defaults (seed 0, epoch 20): members 0.0543 worse alone than one
    # model (0.3183 at its epoch 18), averaging wins 0.0307 back, so it is behind
    defaults = next(v for k, v in rows.items() if "λ=0.1" in k)
    assert defaults[:4] == ["0.3419", "0.3726", "+0.0543", "0.0307"]
    assert defaults[4].startswith("behind: a weaker partition")
    weak = next(v for k, v in rows.items() if "λ=0.01" in k)
    assert weak == ["0.3083", "0.3123", "-0.0060", "0.0040", "ahead"]
    # the same numbers from metrics.jsonl, read here apart from the library
    for name, cells in (("snens_tau1_lam0.1", defaults), ("snens_split_tau5_lam0.01", weak)):
        epoch = json.loads((runs[name] / "final.json").read_text())["selection"]["epoch"]
        lines = (runs[name] / "metrics.jsonl").read_text().splitlines()
        record = [json.loads(x) for x in lines if json.loads(x).get("epoch") == epoch][-1]
        assert float(cells[0]) == pytest.approx(record["val/nll"], abs=5e-5)
        assert float(cells[1]) == pytest.approx(record["val/member_nll_mean"], abs=5e-5)
    single = json.loads((runs["single"] / "final.json").read_text())["selection"]["value"]
    assert float(defaults[2]) == pytest.approx(float(defaults[1]) - single, abs=2e-4)


def test_runs_that_selected_no_epoch_give_no_decomposition(tmp_path):
    runs = _copy_runs(tmp_path, "single", "snens_tau1_lam0.1")
    for run in runs.values():
        final = json.loads((run / "final.json").read_text())
        del final["selection"]
        (run / "final.json").write_text(json.dumps(final))
    assert snens.engine.runs.read_selected_epoch(runs["single"]) is None
    report = write_report([tmp_path], tmp_path / "report", baseline=runs["single"])
    assert "## Differences against" in report.path.read_text()
    assert "## Members alone" not in report.path.read_text()


@pytest.mark.parametrize("selection", ["nll", {"epoch": True}, {"epoch": "20"}, {"epoch": 99}])
def test_a_selection_record_that_names_no_kept_epoch_reads_as_none(tmp_path, selection):
    run = _copy_runs(tmp_path, "single")["single"]
    final = json.loads((run / "final.json").read_text())
    assert snens.engine.runs.read_selected_epoch(run)["epoch"] == final["selection"]["epoch"]
    final["selection"] = selection
    (run / "final.json").write_text(json.dumps(final))
    assert snens.engine.runs.read_selected_epoch(run) is None


def test_the_report_chooses_the_row_of_lowest_validation_nll_from_the_runs_files(tmp_path):
    # the committed GroupNorm CNN runs of seed 0: one model (0.3183 at epoch 18), σN-Ens at the
    # defaults (0.3419) and split with τ=5, λ=0.01 (0.3083), and the deep ensemble, whose
    # members were selected apart
    names = ("single", "snens_tau1_lam0.1", "snens_split_tau5_lam0.01", "deep_ensemble")
    runs = _copy_runs(tmp_path, *names)
    value = {
        n: json.loads((runs[n] / "final.json").read_text())["selection"].get("value") for n in names
    }
    best = min(names[:3], key=lambda n: value[n])
    assert best == "snens_split_tau5_lam0.01"
    report = write_report([tmp_path], tmp_path / "report")
    label = "snens, M=4, τ=5.0, λ=0.01, method.input_policy=split"
    assert report.choice.startswith(
        f"Chosen on validation: **{label}**, the lowest validation NLL at the selected epoch "
        f"({value[best]:.4f}, seed 0, the one every candidate row has)"
    )
    assert "Not candidates: deep_ensemble, M=4, method.input_policy=repeat (its members" in (
        report.choice
    )
    assert report.choice in report.path.read_text()
    glance = {
        row.split(" | ")[0].strip("| "): row.split(" | ") for row in report.summary.split("\n")[2:6]
    }
    assert glance[label][2] == f"{value[best]:.4f} ← chosen"
    assert glance["single"][2] == f"{value['single']:.4f}"
    assert glance["deep_ensemble, M=4, method.input_policy=repeat"][2] == "—"
    rows = {r["method.name"] + r["method.input_policy"]: r for r in _read_csv(report.csv)}
    assert [k for k, r in rows.items() if r["chosen on validation"] == "True"] == ["snenssplit"]
    assert rows["single—"]["method.input_policy"] == "—"  # one model has one way to take inputs
    assert float(rows["single—"]["val/nll selected mean"]) == value["single"]


def test_runs_without_selection_give_no_choice(sweep, tmp_path):
    root, _ = sweep
    report = write_report([root], tmp_path / "report")
    assert report.choice is None and "Chosen on validation" not in report.path.read_text()
    assert "chosen on validation" not in _read_csv(report.csv)[0]


def test_rows_validated_on_different_examples_are_not_ranked(tmp_path):
    runs = _copy_runs(tmp_path, "single", "snens_split_tau5_lam0.01")
    config = (runs["single"] / "config.toml").read_text()
    assert "validation_examples = 5000" in config
    (runs["single"] / "config.toml").write_text(
        config.replace("validation_examples = 5000", "validation_examples = 4000")
    )
    report = write_report([tmp_path], tmp_path / "report")
    assert report.choice == (
        "No choice on validation: the rows were validated on different examples "
        "(data.validation_examples: 4000, 5000); choose among rows of one validation split."
    )
    assert "← chosen" not in report.summary
    assert [r["chosen on validation"] for r in _read_csv(report.csv)] == ["False", "False"]


def test_the_validation_column_shows_the_runs_the_choice_compared(tmp_path):
    # one model with seeds 0 and 1, σN-Ens with seed 0 only: the choice compares seed 0, and
    # the column shows one model's seed-0 value, "n=1", not its mean over both seeds
    (tmp_path / "single").mkdir()
    for seed in (0, 1):
        shutil.copytree(
            HOLDOUT_GN / "single" / f"seed={seed}",
            tmp_path / "single" / f"seed={seed}",
            ignore=shutil.ignore_patterns("*.pt"),
        )
    _copy_runs(tmp_path / "snens", "snens_tau1_lam0.1")
    report = write_report([tmp_path], tmp_path / "report")
    value = json.loads((HOLDOUT_GN / "single/seed=0/final.json").read_text())["selection"]
    cells = report.summary.splitlines()[2].split(" | ")
    assert cells[0].strip("| ") == "single"
    assert cells[2] == f"{value['value']:.4f} (n=1) ← chosen"
    assert report.choice.startswith(
        "Chosen on validation: **single**, the lowest validation NLL at the selected epoch "
        "(0.3183, seed 0, the one every candidate row has)"
    )
