"""snens sweep: a real grid on Fashion-MNIST; names, sweep.csv, skipping, resuming, collapsing.

The module's sweep trains 6 tiny runs (300 images, one epoch, width 4): single × seeds {0, 1}
(τ collapses) and σN-Ens × τ {0.05, 5} × seeds {0, 1}.
"""

import csv
import json
import math
import os
import shutil
import sys

import pytest
import torch

import snens.engine.train
from snens.engine.cli import main
from snens.engine.config import load_config, to_toml
from snens.engine.presets import preset
from snens.engine.runs import read_metrics
from snens.engine.sweep import applies, final_row, parse_grid, plan, run_sweep, write_csv

TINY = "fashion_mnist_small_cnn_tiny"
SMALL = [
    "--set",
    "optim.epochs=1",
    "--set",
    "data.train_examples=300",
    "--set",
    "data.test_examples=300",
    "--set",
    "data.ood_examples=300",
    "--set",
    "threads=1",
    "--no-progress",
]
GRID = ["--grid", "method.name=single,snens", "--grid", "method.temperature=0.05,5", "--grid"]
NAMES = [
    "method.name=single,seed=0",
    "method.name=single,seed=1",
    "method.name=snens,method.temperature=0.05,seed=0",
    "method.name=snens,method.temperature=0.05,seed=1",
    "method.name=snens,method.temperature=5.0,seed=0",
    "method.name=snens,method.temperature=5.0,seed=1",
]


def _sweep(out, grid="seed=0,1", extra=()):
    return main(["sweep", "--preset", TINY, *GRID, grid, *SMALL, *extra, "--out", str(out)])


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("sweep") / "tau"
    assert _sweep(out) == 0
    return out


def _read_csv(path):
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def test_every_run_has_its_directory_and_config(swept):
    assert sorted(p.name for p in swept.iterdir() if p.is_dir()) == sorted(NAMES)
    for name in NAMES:
        config = load_config(swept / name / "config.toml")
        assert (swept / name / "final.json").is_file()
        assert config.name == name and config.seed == int(name[-1])
        assert config.optim.epochs == 1 and config.data.train_examples == 300
        if "single" in name:  # M forced to 1, τ left at the preset's
            assert config.method.num_members == 1 and config.method.temperature == 1.0
        else:
            assert config.method.num_members == 4
            assert config.method.temperature == (0.05 if "0.05" in name else 5.0)


def test_sweep_csv_holds_final_json_values(swept):
    rows = _read_csv(swept / "sweep.csv")
    assert [r["run"] for r in rows] == NAMES
    assert list(rows[0])[:5] == ["run", "method.name", "method.temperature", "seed", "status"]
    for row in rows:
        assert row["status"] == "done"
        final = json.loads((swept / row["run"] / "final.json").read_text())
        flat = final_row(swept / row["run"])
        assert flat["test/accuracy"] == final["metrics"]["test/accuracy"]
        assert flat["model/params"] == final["model"]["params"]
        for key, value in flat.items():
            got = float(row[key])
            assert got == value or (math.isnan(got) and math.isnan(value)), key
        tau = "" if "single" in row["run"] else "0.05" if "0.05" in row["run"] else "5.0"
        assert row["method.temperature"] == tau
    single, snens_run = rows[0], rows[2]
    assert float(single["test/num_members"]) == 1 and float(snens_run["test/num_members"]) == 4
    assert float(single["model/params"]) < float(snens_run["model/params"])


def test_rerun_does_no_work(swept, monkeypatch, capsys):
    before = {n: (swept / n / "final.json").stat().st_mtime_ns for n in NAMES}
    calls = []
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: calls.append(a))
    assert _sweep(swept) == 0
    out = capsys.readouterr().out
    assert calls == []
    assert out.count("done, skipped") == 6 and "(0 new, 0 to resume, 6 done)" in out
    assert before == {n: (swept / n / "final.json").stat().st_mtime_ns for n in NAMES}


def test_changed_base_config_is_refused_before_training(swept, monkeypatch, capsys):
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    assert _sweep(swept, extra=["--set", "optim.lr=0.5"]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another config" in err and "optim.lr: saved 0.01, grid 0.5" in err


def test_a_key_the_saved_config_does_not_record_is_not_compared(swept, tmp_path, monkeypatch):
    # A run written before data.ood_scores existed: its file lacks the key, so the grid's value
    # cannot conflict with it; a key the file records still does.
    copy = tmp_path / "tau"
    shutil.copytree(swept, copy)
    for name in NAMES:
        path = copy / name / "config.toml"
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("ood_scores =")]
        assert len(kept) == len(lines) - 1
        path.write_text("".join(kept))
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    scores = '["entropy"]'
    assert _sweep(copy, extra=["--set", f"data.ood_scores={scores}", "--dry-run"]) == 0
    assert _sweep(swept, extra=["--set", f"data.ood_scores={scores}", "--dry-run"]) == 2


def test_interrupted_run_resumes_to_the_same_result(tmp_path, capsys):
    torch.set_num_threads(1)
    args = ["--set", "optim.epochs=2", "--set", "deterministic=true"]
    out = tmp_path / "resume"
    command = ["sweep", "--preset", TINY, "--grid", "seed=3", *SMALL, *args, "--out", str(out)]
    assert main(command) == 0
    run = out / "seed=3"
    whole = json.loads((run / "final.json").read_text())
    # Stopped after epoch 1: the epoch-1 checkpoint is last.pt, no final.json.
    shutil.copy(run / "prev.pt", run / "last.pt")
    (run / "final.json").unlink()
    capsys.readouterr()
    assert main([*command, "--dry-run"]) == 0
    assert "[1/1] resume seed=3" in capsys.readouterr().out
    assert main(command) == 0
    out_text = capsys.readouterr().out
    assert "[1/1] seed=3: resuming from last.pt" in out_text
    assert "resuming" in out_text and "after epoch 1" in out_text
    again = json.loads((run / "final.json").read_text())
    assert again["metrics"] == whole["metrics"]
    assert [r["epoch"] for r in read_metrics(run)] == [1, 2]


def test_plan_collapses_axes_that_do_not_apply(tmp_path):
    grid = [
        "method.name=single,deep_ensemble,snens",
        "method.temperature=0.05,5",
        "method.num_members=2,4",
    ]
    runs = plan(preset(TINY), grid, tmp_path / "s")
    assert [r.name for r in runs] == [
        "method.name=single",
        "method.name=deep_ensemble,method.num_members=2",
        "method.name=deep_ensemble,method.num_members=4",
        "method.name=snens,method.temperature=0.05,method.num_members=2",
        "method.name=snens,method.temperature=0.05,method.num_members=4",
        "method.name=snens,method.temperature=5.0,method.num_members=2",
        "method.name=snens,method.temperature=5.0,method.num_members=4",
    ]
    assert runs[0].config.method.num_members == 1 and runs[0].values == {"method.name": "single"}
    assert runs[2].config.method.num_members == 4 and runs[2].config.method.temperature == 1.0
    assert runs[-1].config.out_dir == str(tmp_path / "s") and runs[-1].path().parent.name == "s"
    assert all(r.status == "new" for r in runs)
    assert not (tmp_path / "s").exists()  # planning writes nothing
    assert applies("method.temperature", "snens") and not applies("method.temperature", "film")
    assert applies("method.num_members", "film") and not applies("method.num_members", "single")
    assert applies("optim.lr", "single")
    assert applies("optim.affine_weight_decay", "film")
    assert not applies("optim.affine_weight_decay", "deep_ensemble")
    assert not applies("method.diversity_layers", "film")


def test_the_input_policy_and_gammas_rate_apply_where_a_method_has_them(tmp_path):
    """One model has no γ and one way to take its inputs: a grid over them trains it once
    (it had been one run per value, the same model trained again under another name)."""
    grid = [
        "method.name=single,deep_ensemble,snens",
        'method.input_policy="repeat","own"',
        "method.gamma_lr_multiplier=1,30",
    ]
    runs = plan(preset(TINY), grid, tmp_path / "s")
    assert [r.name for r in runs] == [
        "method.name=single",
        "method.name=deep_ensemble,method.input_policy=repeat",
        "method.name=deep_ensemble,method.input_policy=own",
        "method.name=snens,method.input_policy=repeat,method.gamma_lr_multiplier=1.0",
        "method.name=snens,method.input_policy=repeat,method.gamma_lr_multiplier=30.0",
        "method.name=snens,method.input_policy=own,method.gamma_lr_multiplier=1.0",
        "method.name=snens,method.input_policy=own,method.gamma_lr_multiplier=30.0",
    ]
    assert runs[0].config.method.input_policy == "repeat"
    assert not applies("method.input_policy", "film") and applies("method.input_policy", "snens")
    assert not applies("method.gamma_lr_multiplier", "deep_ensemble")


def test_set_single_forces_one_member(tmp_path):
    runs = plan(preset(TINY), ["seed=0,1"], tmp_path, ['method.name="single"'])
    assert [r.config.method.num_members for r in runs] == [1, 1]


def test_values_with_commas_and_unsafe_characters(tmp_path):
    assert parse_grid(['optim.milestones=[1, 2],[3],"a,b"']) == {
        "optim.milestones": ["[1, 2]", "[3]", '"a,b"']
    }
    runs = plan(preset(TINY), ['data.root="/x/y","/x_y"'], tmp_path)
    names = [r.name for r in runs]
    assert len(set(names)) == 2 and all("/" not in n for n in names)
    assert names[0].startswith("data.root=_x_y-") and names[1].startswith("data.root=_x_y-")
    assert [r.config.data.root for r in runs] == ["/x/y", "/x_y"]
    runs = plan(preset(TINY), ["optim.milestones=[2, 3],[4]", "optim.epochs=5"], tmp_path)
    assert [r.name for r in runs] == [
        "optim.milestones=2+3,optim.epochs=5",
        "optim.milestones=4,optim.epochs=5",
    ]


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (["method.temprature=0.5,1"], "unknown config key 'method.temprature'"),
        (["method.temperature=0.5,-1"], "--grid method.temperature: value '-1'"),
        (["seed=0,x"], "--grid seed: value 'x': seed must be an int"),
        (["seed="], "the axis seed has no values"),
        (["seed=0,,1"], "the axis seed has an empty value"),
        (["seed"], "an axis must read KEY=V1,V2"),
        (["seed=0,0"], "the value '0' is listed twice"),
        (["method.temperature=5,5.0"], "the values '5' and '5.0' are the same setting"),
        (["seed=0", "seed=1"], "seed already has an axis"),
        (["name=a,b"], "name is set by the sweep"),
        ([], "the grid is empty"),
        (
            ["seed=" + ",".join(map(str, range(200))), "optim.lr=" + ",".join(["1"] * 60)],
            "200 (seed) × 60 (optim.lr) = 12000 runs, more than 10000",
        ),
    ],
)
def test_bad_grid_fails_before_training(tmp_path, grid, message):
    with pytest.raises((ValueError, TypeError)) as error:
        plan(preset(TINY), grid, tmp_path / "s")
    assert message in str(error.value)
    assert not (tmp_path / "s").exists()


def test_a_grid_given_as_a_mapping_plans_the_same_runs(tmp_path):
    axes = {"method.temperature": ["0.05", "5"], "seed": ["0", "1"]}
    runs = plan(preset(TINY), axes, tmp_path)
    same = plan(preset(TINY), ["method.temperature=0.05,5", "seed=0,1"], tmp_path)
    assert [(r.name, r.config) for r in runs] == [(r.name, r.config) for r in same]


def test_a_combination_bad_only_as_a_whole_is_named_whole(tmp_path):
    grid = ['method.input_policy="split","repeat"', "data.batch_size=100,102"]
    with pytest.raises(ValueError) as error:
        plan(preset(TINY), grid, tmp_path / "s")
    assert str(error.value).startswith(
        '--grid: the run method.input_policy="split", data.batch_size=102: '
        "data.batch_size 102 is not divisible by method.num_members 4"
    )
    assert not (tmp_path / "s").exists()


def test_cli_bad_grid_exits_2_naming_the_value(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    out = tmp_path / "bad"
    command = ["sweep", "--preset", TINY, "--grid", "seed=0,1", "--out", str(out)]
    assert main([*command, "--grid", "method.diversity_weight=0.1,nan"]) == 2
    assert "--grid method.diversity_weight: value 'nan'" in capsys.readouterr().err
    assert main(["sweep", "--grid", "seed=0", "--out", str(out)]) == 2
    assert "give one of --preset NAME, --config FILE" in capsys.readouterr().err
    assert main([*command, "--set", "out_dir=x"]) == 2
    assert "out_dir is set by the sweep" in capsys.readouterr().err
    assert not out.exists()


def test_dry_run_lists_runs_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "dry"
    assert _sweep(out, extra=["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"snens sweep: 6 runs in {out} (6 new, 0 to resume, 0 done)"
    assert lines[1:] == [f"[{i}/6] new    {name}" for i, name in enumerate(NAMES, 1)]
    assert not out.exists()


def test_base_config_from_a_toml_file(tmp_path, capsys):
    path = tmp_path / "base.toml"
    path.write_text(to_toml(load_config(preset(TINY), ["optim.epochs=2"])))
    command = ["sweep", "--config", str(path), "--grid", "method.num_members=2,4", "--dry-run"]
    assert main([*command, "--out", str(tmp_path / "m")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "[1/2] new    method.num_members=2",
        "[2/2] new    method.num_members=4",
    ]
    assert main([*command, "--preset", TINY, "--out", str(tmp_path / "m")]) == 2
    assert "give one of --preset NAME, --config FILE" in capsys.readouterr().err
    assert (
        main(["sweep", "--config", str(tmp_path / "no.toml"), "--grid", "seed=0", "--out", "x"])
        == 2
    )
    assert "no.toml not found" in capsys.readouterr().err


def test_a_failed_run_is_listed_and_the_others_continue(tmp_path, capsys, monkeypatch):
    def fake_train(config, *, resume, progress, run_dir, log):
        if config.seed == 1:
            raise RuntimeError("out of memory in member 3")
        run_dir.mkdir(parents=True)
        (run_dir / "config.toml").write_text(to_toml(config))
        (run_dir / "final.json").write_text(json.dumps({"metrics": {"test/accuracy": 0.25}}))
        return run_dir

    monkeypatch.setattr(snens.engine.train, "train", fake_train)
    out = tmp_path / "fail"
    command = ["sweep", "--preset", TINY, "--grid", "seed=0,1,2", "--out", str(out)]
    assert main(command) == 1
    captured = capsys.readouterr()
    assert "[2/3] seed=1: FAILED (RuntimeError: out of memory in member 3)" in captured.out
    assert "1 of 3 runs failed:\n  seed=1: RuntimeError: out of memory in member 3" in captured.err
    rows = _read_csv(out / "sweep.csv")
    assert [(r["run"], r["status"], r["test/accuracy"]) for r in rows] == [
        ("seed=0", "done", "0.25"),
        ("seed=1", "failed", ""),
        ("seed=2", "done", "0.25"),
    ]


def test_a_sweep_trained_run_by_run_keeps_every_row_in_its_table(tmp_path):
    def fake_train(config, *, resume, progress, run_dir, log):
        run_dir.mkdir(parents=True)
        (run_dir / "config.toml").write_text(to_toml(config))
        final = {"metrics": {"test/accuracy": 0.5 + config.seed / 10}}
        (run_dir / "final.json").write_text(json.dumps(final))
        return run_dir

    out = tmp_path / "piecewise"
    runs = plan(preset(TINY), ["seed=0,1,2"], out)
    for run in runs[:2]:  # one run per call, as a queue shared by processes trains them
        run_sweep([run], out, keys=("seed",), table=runs, train=fake_train, log=lambda _: None)
    rows = _read_csv(out / "sweep.csv")
    assert [(r["run"], r["status"], r["test/accuracy"]) for r in rows] == [
        ("seed=0", "done", "0.5"),
        ("seed=1", "done", "0.6"),
        ("seed=2", "pending", ""),
    ]
    # without table= the CSV lists the runs of the call only
    run_sweep(runs[2:], out, keys=("seed",), train=fake_train, log=lambda _: None)
    assert [r["run"] for r in _read_csv(out / "sweep.csv")] == ["seed=2"]
    with pytest.raises(
        ValueError, match=r"table= must list every run trained; it lacks \['seed=2'\]"
    ):
        run_sweep(runs[2:], out, table=runs[:2], train=fake_train, log=lambda _: None)


def test_sweep_csv_is_never_written_through_a_link_at_a_temporary_name(tmp_path):
    """sweep.csv had been written to the fixed sweep.csv.tmp first, through a link there."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "sweep.csv.tmp").symlink_to(victim)
    (tmp_path / "sweep.csv").symlink_to(victim)
    write_csv(tmp_path / "sweep.csv", [{"a": 1.5, "b": "x"}])
    assert victim.read_text() == "keep"
    assert (tmp_path / "sweep.csv").read_bytes() == b"a,b\r\n1.5,x\r\n"
    assert not (tmp_path / "sweep.csv").is_symlink()


def test_a_final_json_that_is_a_link_is_not_read(tmp_path):
    """final_row had read final.json through a link, a large file whole."""
    from snens.engine.runs import RunDirError

    (tmp_path / "elsewhere.json").write_text('{"metrics": {"test/accuracy": 0.5}}')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "final.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(RunDirError, match=r"final\.json is a symbolic link, not a regular file"):
        final_row(tmp_path / "run")
    (tmp_path / "run" / "final.json").unlink()
    (tmp_path / "run" / "final.json").write_text('{"metrics": {"test/accuracy": 0.5}}')
    assert final_row(tmp_path / "run") == {"test/accuracy": 0.5}


# -- a saved run's config.toml read as a run file: at most 64 MiB, regular, never a link -------


def _peak_mib():
    """This process's peak resident memory so far, in MiB (ru_maxrss is in KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB, sparse files: Linux")
def test_an_oversized_config_toml_is_refused_unread_by_sweep_and_tune(
    tmp_path, capsys, monkeypatch
):
    """config_differences read a saved run's config.toml whole, twice: a 2 GiB (sparse) one
    cost ``snens sweep --dry-run`` 4.4 GB of memory before it failed as "not valid TOML"."""
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    too_big = (
        "holds 1,073,741,824 bytes, above the limit of 67,108,864 for a run file (snens writes "
        "kilobytes there), so it was not read: move it away, or restore the file that belongs "
        "there"
    )
    out = tmp_path / "sweep"
    (out / "seed=0").mkdir(parents=True)
    (out / "seed=0" / "config.toml").write_bytes(b"")
    os.truncate(out / "seed=0" / "config.toml", 2**30)  # 1 GiB, sparse: no disk used
    peak = _peak_mib()
    command = ["sweep", "--preset", TINY, "--grid", "seed=0,1", "--out", str(out), "--dry-run"]
    assert main(command) == 2
    assert capsys.readouterr().err == (
        f"snens sweep: {out / 'seed=0'} holds an unreadable config.toml ({out / 'seed=0'}/"
        f"config.toml {too_big}); move it away or choose another --out\n"
    )
    tuned = tmp_path / "tune"
    (tuned / "base").mkdir(parents=True)
    (tuned / "base" / "config.toml").write_bytes(b"")
    os.truncate(tuned / "base" / "config.toml", 2**30)
    command = ["tune", "--preset", TINY, "--set", "data.validation_examples=300"]
    assert main([*command, "--no-progress", "--out", str(tuned)]) == 2
    assert capsys.readouterr().err == (
        f"snens tune: {tuned / 'base'} holds an unreadable config.toml ({tuned / 'base'}/"
        f"config.toml {too_big}); move it away or choose another --out\n"
    )
    assert _peak_mib() - peak < 256  # read whole, it would cost over 2 GiB


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["a directory", "a FIFO", "a symbolic link"])
def test_a_saved_config_toml_that_is_no_regular_file_is_named_by_sweep(kind, tmp_path, capsys):
    """A directory or FIFO at config.toml made the run "new", to be trained over it."""
    out = tmp_path / "sweep"
    config = out / "seed=0" / "config.toml"
    config.parent.mkdir(parents=True)
    if kind == "a directory":
        config.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(config)
    else:
        (tmp_path / "elsewhere.toml").write_text("seed = 0\n", encoding="utf-8")
        config.symlink_to(tmp_path / "elsewhere.toml")
    command = ["sweep", "--preset", TINY, "--grid", "seed=0,1", "--out", str(out), "--dry-run"]
    assert main(command) == 2
    assert capsys.readouterr().err == (
        f"snens sweep: {config.parent} holds an unreadable config.toml ({config} is {kind}, not "
        "a regular file, so it was not read (a link could lead anywhere and a FIFO would "
        "block): replace it with the file itself, or move it away); move it away or choose "
        "another --out\n"
    )
