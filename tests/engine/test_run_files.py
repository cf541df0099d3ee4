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
    assert Run(run, load_config(run / CONFIG)).provenance() == {}  # not read, not waited for
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


def _tiny(out: Path, name: str = "run"):
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
