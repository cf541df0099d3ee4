"""A run directory's files as a red-team run left them: a FIFO, a link or a directory where a
file should be, an emptied or damaged metrics.jsonl, a final.json without metrics, a checkpoint
whose digest is valid but whose optimizer or schedule state is not. Each ends in an error (or a
warning) naming the file and what to do, never in a hang, a loop or a torch error, and nothing
of the run is changed by it."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from snens.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from snens.engine.cli import main
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.runs import CONFIG, Run, RunDirError, open_run, read_metrics
from snens.engine.train import train


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    config = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(out))}",
            'name="run"',
            "threads=1",
            "data.train_examples=300",
            "data.test_examples=200",
            "data.ood_examples=200",
            "optim.epochs=2",
        ],
    )
    return train(config, progress=False, log=None)


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the finished run, without its final.json: a run to resume."""
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    (path / "final.json").unlink()
    return path


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}


def _resume(path: Path) -> Path:
    return train(load_config(path / CONFIG), resume=True, progress=False, run_dir=path, log=None)


# -- last.pt that is not a file ---------------------------------------------------------------


def test_a_directory_in_place_of_last_pt_is_refused_not_trained_from_epoch_1(run, capsys):
    """It had read as "no checkpoint yet": the run trained again from epoch 1, failed to save
    over the directory and said to --resume, which did the same again."""
    (run / "last.pt").unlink()
    (run / "last.pt").mkdir()
    before = _files(run)
    with pytest.raises(RunDirError) as err:
        _resume(run)
    assert str(err.value) == (
        f"{run / 'last.pt'} is a directory, not a checkpoint file, so the run cannot be resumed "
        "from it; move it away, then copy prev.pt over it to resume from the checkpoint before, "
        "or leave no last.pt to train the run again from epoch 1"
    )
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'last.pt'} is a directory, not a checkpoint file" in err
    assert "Traceback" not in err
    after = _files(run)
    assert after.pop("provenance.json") and before.pop("provenance.json")  # stamps the resume
    assert after == before  # no epoch trained again, metrics.jsonl as it was
    (run / "last.pt").rmdir()
    (run / "last.pt").symlink_to(run / "gone.pt")
    with pytest.raises(RunDirError, match="last.pt is a symbolic link to nothing, not a check"):
        _resume(run)


# -- metrics.jsonl emptied, damaged or not a file ---------------------------------------------


def test_resume_warns_naming_metrics_jsonl_when_it_lost_epochs(run):
    (run / "metrics.jsonl").write_text("")
    with pytest.warns(UserWarning) as caught:
        _resume(run)
    assert (
        f"{run / 'metrics.jsonl'} holds 0 of the 2 epochs that {run / 'last.pt'} has trained "
        "(missing: 1-2): their per-epoch history is lost, training goes on from the "
        "checkpoint; restore the file from a backup of the run to keep it"
    ) in [str(w.message) for w in caught]
    assert (run / "final.json").is_file()


def test_truncating_metrics_warns_of_each_epoch_missing(finished, tmp_path):
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    lines = (path / "metrics.jsonl").read_text().splitlines(keepends=True)
    (path / "metrics.jsonl").write_text(lines[1])  # epoch 2 only
    config = load_config(path / CONFIG)
    with pytest.warns(UserWarning, match=r"holds 1 of the 2 epochs .*\(missing: 1\)"):
        Run(path, config).truncate_metrics(2)
    (path / "metrics.jsonl").write_text("".join(lines))
    with pytest.warns(UserWarning, match=r"holds 2 of the 3 epochs .*\(missing: 3\)"):
        Run(path, config).truncate_metrics(3)  # a third epoch the checkpoint claims
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every epoch there: no warning
        Run(path, config).truncate_metrics(1)
    assert [r["epoch"] for r in read_metrics(path)] == [1]


def test_invalid_utf8_in_metrics_jsonl_names_the_file_and_line(run, capsys):
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(lines[0] + b'{"epoch": 2, "x": "\xff"}\n')
    with pytest.raises(ValueError) as err:
        read_metrics(run)
    assert str(err.value).startswith(
        f"{run / 'metrics.jsonl'}, line 2: not UTF-8 (invalid start byte at byte 19 of the line)"
    )
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'metrics.jsonl'}, line 2: not UTF-8" in err and "Traceback" not in err


def test_a_last_line_cut_short_by_a_kill_is_still_skipped(run):
    data = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(data + b'{"epoch": 3, "x": "\xc3')  # cut mid-character
    assert [r["epoch"] for r in read_metrics(run)] == [1, 2]


@pytest.mark.timeout(20)
def test_run_files_that_are_fifos_or_links_are_refused_never_waited_for(run, tmp_path):
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    with pytest.raises(RunDirError, match=f"^{run / 'metrics.jsonl'} is a FIFO, not a regular"):
        read_metrics(run)
    os.mkfifo(run / "provenance.json.fifo")
    (run / "provenance.json").unlink()
    (run / "provenance.json").symlink_to(run / "provenance.json.fifo")
    with pytest.raises(RunDirError, match="provenance.json is a symbolic link, not a regular"):
        Run(run, load_config(run / CONFIG)).provenance()  # not read, not waited for
    (run / CONFIG).rename(tmp_path / "config.toml")
    (run / CONFIG).symlink_to(tmp_path / "config.toml")
    with pytest.raises(RunDirError, match=f"^{run / CONFIG} is a symbolic link, not a regular"):
        open_run(run)


def test_a_final_json_without_metrics_is_not_a_finished_run(run):
    from snens.engine.runs import read_final

    (run / "final.json").write_text("{}")
    with pytest.raises(ValueError) as err:
        read_final(run)
    assert str(err.value) == (
        f'{run / "final.json"} holds no "metrics" mapping, so the run is not finished (the file '
        f"is damaged or was not written by snens); finish it with `snens train --resume {run}`"
    )
    _resume(run)  # which finishes it
    assert set(read_final(run)["metrics"]) >= {"test/accuracy", "test/nll"}


# -- a checkpoint with a valid digest and a state torch.optim cannot use ----------------------


def _damage_optimizer(state):
    index = next(iter(state["optimizer"]["state"]))
    state["optimizer"]["state"][index]["exp_avg"] = torch.zeros(7)
    state["optimizer"]["state"][index]["exp_avg_sq"] = torch.zeros(7)


def _damage_schedule(state):
    state["schedule"]["lr_lambdas"] = 5


def _damage_schedule_step(state):
    """The schedule of the last step of the run (lr 0 under the cosine) in epoch 1's
    checkpoint: it had resumed and trained the rest at lr 0, exit status 0."""
    state["schedule"]["last_epoch"] = 2 * state["step"]
    state["schedule"]["_step_count"] = 2 * state["step"] + 1


def _damage_amsgrad(state):
    state["optimizer"]["param_groups"][0]["amsgrad"] = "yes"


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (_damage_optimizer, r"the optimizer state of parameter \d+ \(param group 0\) has shape"),
        (_damage_schedule, "the schedule's lr_lambdas = 5 is not 3 entries"),
        (_damage_schedule_step, r"the schedule is at step (\d+), the checkpoint's step is \d+"),
        (_damage_amsgrad, "optimizer param group 0: amsgrad = 'yes' is not a bool"),
    ],
)
def test_resume_refuses_a_state_torch_optim_cannot_use(run, damage, named, capsys):
    """The checkpoint of epoch 1 of 2 (prev.pt), so that the resumed run trains a step: a wrong
    shape had failed there, inside torch.optim; a malformed schedule inside LambdaLR."""
    shutil.copy(run / "prev.pt", run / "last.pt")
    state = load_checkpoint(run / "last.pt")
    assert state["epoch"] == 1 and len(state["optimizer"]["param_groups"]) == 3
    damage(state)
    save_checkpoint(run / "last.pt", state, keep_previous=False)  # a valid digest
    before = _files(run)
    with pytest.raises(CheckpointError, match=f"^{run / 'last.pt'}: {named}.*prev.pt"):
        _resume(run)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'last.pt'}: " in err and "prev.pt" in err and "Traceback" not in err
    after = _files(run)
    assert after.pop("provenance.json") and before.pop("provenance.json")
    assert after == before


# -- links planted where a run's files go -----------------------------------------------------


def _tiny(out: Path, name: str = "run", *overrides: str):
    return load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(out))}",
            f"name={json.dumps(name)}",
            "threads=1",
            "data.train_examples=100",
            "data.test_examples=100",
            "data.ood_examples=100",
            "optim.epochs=1",
            *overrides,
        ],
    )


def test_a_metrics_jsonl_link_planted_in_a_directory_without_a_run_is_never_written(
    tmp_path, capsys
):
    """In a shared runs/, a directory that holds no run yet held a metrics.jsonl link: `snens
    train` appended its epoch records to the link's target."""
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(RunDirError) as err:
        train(_tiny(tmp_path / "runs"), progress=False, log=None)
    assert str(err.value) == (
        f"{run} holds metrics.jsonl but no config.toml, so no run of snens: a new run is not "
        "started among them (they were left as they are); move them away, or choose another "
        "name (--set name=…) or --out"
    )
    args = ["train", "--preset", "fashion_mnist_small_cnn_tiny", "--out", str(tmp_path / "runs")]
    assert main([*args, "--set", 'name="run"', "--no-progress"]) == 2
    assert "holds metrics.jsonl but no config.toml" in capsys.readouterr().err
    assert victim.read_text() == "someone else's file\n"
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


def test_a_metrics_jsonl_link_made_while_the_run_trains_is_refused_by_name(finished, tmp_path):
    """A link put in place after the run started: the append refuses it, naming it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    path = tmp_path / "run"
    shutil.copytree(finished, path)
    (path / "metrics.jsonl").unlink()
    (path / "metrics.jsonl").symlink_to(victim)
    run = Run(path, load_config(path / CONFIG))
    with pytest.raises(RunDirError) as err:
        run.log({"epoch": 3})
    assert str(err.value).startswith(f"{path / 'metrics.jsonl'} is a symbolic link, so it was")
    assert victim.read_text() == "keep\n"


# -- a checkpoint whose model state is damaged, evaluated or resumed --------------------------


def _with_model_state(run: Path, value) -> None:
    state = load_checkpoint(run / "last.pt")
    state["model"] = value(state["model"])
    save_checkpoint(run / "last.pt", state, keep_previous=False)  # a valid digest


def _nan_weight(model):
    key = next(k for k, v in model.items() if v.is_floating_point())
    return {**model, key: torch.full_like(model[key], float("nan"))}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (_nan_weight, "the checkpoint's model state holds values that are NaN or inf ("),
        (lambda model: list(model.values()), "the checkpoint's model state is a list, not a"),
        (lambda model: 3, "the checkpoint's model state is an int, not a mapping of tensors"),
    ],
)
def test_a_damaged_model_state_is_named_by_eval_and_resume(run, value, named, capsys):
    """NaN weights had been evaluated, and snens eval blamed its NaN outputs on the command
    line ("(given on the command line)"); a list or an int had ended in a traceback."""
    _with_model_state(run, value)
    for argv in (["eval", str(run), "--no-corruptions"], ["train", "--resume", str(run)]):
        assert main([*argv, "--no-progress"] if argv[0] == "train" else argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"snens {argv[0]}: {run / 'last.pt'}: {named}"), err
        assert "command line" not in err and "Traceback" not in err


# -- provenance.json damaged, missing or in a read-only run -----------------------------------


def _oversized(path: Path) -> None:
    with path.open("r+b") as file:
        file.truncate(65 * 2**20)  # sparse: above runs.MAX_FILE_BYTES, no disk used


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda p: p.write_text('{"snens": "0.1.0", "tor'), "is not valid JSON (Unterminated"),
        (lambda p: p.write_text("[1, 2]"), "holds a JSON list, not an object: the file is dam"),
        (lambda p: p.write_bytes(b'{"snens": "\xff"}'), "is not UTF-8 (invalid start byte at"),
        (lambda p: (p.unlink(), os.mkfifo(p)), "is a FIFO, not a regular file, so it was not"),
        (_oversized, "holds 68,157,440 bytes, above the limit of 67,108,864 for a run file"),
    ],
    ids=["truncated", "list", "not-utf8", "fifo", "oversized"],
)
def test_a_damaged_provenance_json_is_refused_on_resume_never_overwritten(
    run, damage, named, capsys
):
    """A resume had read every damaged provenance.json as {} and rewritten it from that: the
    versions, platform, git SHA, command and start time of the run silently gone."""
    path = run / "provenance.json"
    damage(path)
    before = os.lstat(path)
    with pytest.raises((ValueError, RunDirError)) as err:
        open_run(run)
    assert str(err.value).startswith(f"{path} "), str(err.value)
    assert named in str(err.value)
    if "JSON" in named or "UTF-8" in named:
        assert str(err.value).endswith(
            "the file is damaged, so it was left as it is; restore it from a backup of the "
            f"run, or move it away to have the next `snens train --resume {run}` record a new "
            "one (the versions, platform and command of the run's start are then lost)"
        )
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"snens train: {path} " in err and named in err and "Traceback" not in err
    after = os.lstat(path)
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (
        before.st_mode,
        before.st_size,
        before.st_mtime_ns,
    )  # never overwritten
    assert not (run / "final.json").exists()  # nothing trained


def test_a_missing_provenance_json_is_rebuilt_at_resume_and_says_so(run):
    """A run whose provenance.json was lost (a full disk as the run was created) gets a new
    record at its resume, marked as made then."""
    import torch

    (run / "provenance.json").unlink()
    _resume(run)
    info = json.loads((run / "provenance.json").read_text())
    assert info["torch"] == torch.__version__ and info["python"] and info["platform"]
    assert info["rebuilt"] == (
        "provenance.json was missing when the run was resumed, so this record was made at that "
        "resume: its versions, platform, git SHA, command and start time are the resume's, not "
        "those the run started with"
    )
    assert len(info["resumed"]) == 1 and info["started"] <= info["resumed"][0]["time"]
    assert (run / "final.json").is_file()


def test_a_read_only_run_is_not_told_to_choose_another_out(run, tmp_path, monkeypatch, capsys):
    """A resume on a read-only file system had advised "--out DIR", which --resume refuses;
    a new run's output directory still gets that advice."""
    import errno

    import snens.files
    from snens.engine.runs import check_writable

    def read_only(directory):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(snens.files, "check_writable", read_only)
    before = _files(run)
    with pytest.raises(RunDirError) as err:
        _resume(run)
    assert str(err.value) == (
        f"[Errno 30] the run directory {run} is not writable (Read-only file system); restore "
        "write access to it, or copy the run directory somewhere writable and resume it there "
        "(`snens train --resume COPY`), nothing was started"
    )
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "restore write access to it" in err and "--out" not in err
    assert _files(run) == before
    with pytest.raises(RunDirError, match=r"output directory .* choose another one with --out"):
        check_writable(tmp_path / "new")


# -- examples.npz with values snens never writes ----------------------------------------------


def _damage_examples(run: Path) -> None:
    import numpy as np

    path = run / "examples.npz"
    with np.load(path) as kept:
        arrays = dict(kept)
    arrays["test/nll"][5] = np.inf
    arrays["test/brier"][:] = np.nan
    path.unlink()
    np.savez(path, **arrays)


def test_non_finite_per_example_values_are_refused_naming_the_file_and_key(tmp_path, capsys):
    """An inf or NaN in examples.npz had been bootstrapped: `snens report --baseline` printed
    "+inf [+nan, +nan] level" with numpy's RuntimeWarnings, exit status 0. The report now stops,
    naming the file, the key and the fix, and writes no report (report.py notes only a missing
    examples.npz as "not compared")."""
    import warnings

    import numpy as np

    from snens.engine.report import write_report
    from snens.engine.runs import read_examples

    out = tmp_path / "runs"
    base = train(_tiny(out, "base"), progress=False, log=None)
    other = train(_tiny(out, "other", "optim.lr=0.05"), progress=False, log=None)
    assert sorted(read_examples(other)) == sorted(read_examples(base))  # the same keys, finite
    _damage_examples(other)
    path = other / "examples.npz"
    with pytest.raises(ValueError) as err:
        read_examples(other)
    assert str(err.value) == (
        f"{path}: test/nll holds 1 value(s) that are NaN or infinite (the first at example 5: "
        "inf), which snens never writes there: the file is damaged; restore it from a backup "
        f"of the run, or move final.json away and run `snens train --resume {other}`, which "
        "evaluates the run's kept weights again and rewrites it"
    )
    report = tmp_path / "report"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's had been printed
        with pytest.raises(ValueError, match=f"^{path}: test/nll holds 1 value"):
            write_report([out], report, baseline=base)
        assert main(["report", str(out), "--baseline", str(base), "--out", str(report)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"snens report: {path}: test/nll holds 1 value") and "+nan" not in err
    assert not (report / "report.md").exists()
    # the fix the message gives: the resume evaluates the kept weights again
    (other / "final.json").rename(tmp_path / "final.json")
    _resume(other)
    assert all(np.isfinite(a).all() for a in read_examples(other).values())
    assert "| test | nll |" in write_report([out], report, baseline=base).path.read_text()
