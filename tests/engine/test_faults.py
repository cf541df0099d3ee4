"""Faults a red-team run found in the engine's files and inputs, each reproduced here: every one
ends in a clear error naming the path or value and the fix, or in correct behaviour; nothing
half-written is left behind and nothing saved is lost."""

import errno
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import snens
import snens.engine.runs
from snens.engine.checkpoint import (
    CheckpointError,
    atomic_savez,
    atomic_write,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from snens.engine.cli import main
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.runs import CONFIG, RunDirError, create_run
from snens.engine.train import evaluate_run, train
from snens.nn.norms import MAX_MEMBERS


def _config(out: Path, *overrides: str):
    return load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(out))}",
            'name="run"',
            "threads=1",
            "data.train_examples=300",
            "data.test_examples=200",
            "data.ood_examples=200",
            "optim.epochs=2",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return train(_config(out), progress=False, log=None)


# -- two processes, one new run -------------------------------------------------------------


def test_two_creators_of_one_run_one_wins(tmp_path, monkeypatch):
    """Both pass the "no run here yet" check, then both write: exactly one run is made, and
    the loser's config does not replace the winner's."""
    first = _config(tmp_path)
    second = _config(tmp_path, "seed=7")
    barrier = threading.Barrier(2)
    check = snens.engine.runs.check_new_run

    def racing_check(path):
        out = check(path)
        barrier.wait(timeout=10)  # both checked before either writes
        return out

    monkeypatch.setattr(snens.engine.runs, "check_new_run", racing_check)
    outcomes = {}

    def make(config, key):
        try:
            create_run(config)
            outcomes[key] = "created"
        except RunDirError as error:
            outcomes[key] = str(error)

    threads = [threading.Thread(target=make, args=(c, k)) for k, c in (("a", first), ("b", second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v == "created" for v in outcomes.values()) == [False, True]
    loser = next(v for v in outcomes.values() if v != "created")
    assert "already holds a run" in loser and "at the same moment" in loser
    winner = first if outcomes["a"] == "created" else second
    assert load_config(tmp_path / "run" / CONFIG) == winner
    assert not list((tmp_path / "run").glob(".*.tmp"))


def test_atomic_write_exclusive_refuses_an_existing_file(tmp_path):
    target = tmp_path / "a.txt"
    atomic_write(target, b"one", exclusive=True)
    with pytest.raises(FileExistsError):
        atomic_write(target, b"two", exclusive=True)
    assert target.read_bytes() == b"one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_atomic_savez_writes_tensors_and_scalars_whole_or_not_at_all(tmp_path, monkeypatch):
    target = tmp_path / "scores.npz"
    logits = torch.tensor([[[0.5, -1.0]], [[2.0, 0.25]]])
    atomic_savez(target, {"logits": logits, "labels": np.array([1]), "seconds": 3.5}, mode=0o644)
    with np.load(target) as saved:
        assert saved["logits"].tolist() == [[[0.5, -1.0]], [[2.0, 0.25]]]
        assert saved["labels"].tolist() == [1] and saved["seconds"].item() == 3.5
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    # a write that fails leaves the old file and no temporary beside it
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space")))
    with pytest.raises(OSError, match=r"scores\.npz"):
        atomic_savez(target, {"logits": torch.zeros(3)})
    with np.load(target) as saved:
        assert saved["logits"].shape == (2, 1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.npz"]


# -- a kill inside atomic_write -------------------------------------------------------------


def test_resume_removes_the_temporaries_a_kill_left(finished, tmp_path):
    run = tmp_path / "run"
    os.system(f"cp -r {finished} {run}")  # a copy: the module's run stays pristine
    (run / "final.json").unlink()
    (run / ".last.pt.k2j4h1.tmp").write_bytes(b"half a checkpoint")
    (run / ".prev.pt.link.tmp").write_bytes(b"")
    lines = []
    train(load_config(run / CONFIG), resume=True, progress=False, run_dir=run, log=lines.append)
    assert not list(run.glob(".*.tmp"))
    assert any("removed .last.pt.k2j4h1.tmp" in line for line in lines)
    assert (run / "final.json").is_file()


def test_remove_stale_temporaries_keeps_everything_else(tmp_path):
    (tmp_path / ".last.pt.abc.tmp").write_bytes(b"x")
    (tmp_path / "last.pt").write_bytes(b"y")
    (tmp_path / "notes.tmp").write_bytes(b"z")  # not ours: no leading dot
    removed = remove_stale_temporaries(tmp_path)
    assert [p.name for p in removed] == [".last.pt.abc.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "notes.tmp"]


# -- a checkpoint whose digest is valid but whose values are not ----------------------------


@pytest.mark.parametrize(
    "field, value",
    [("epoch", 10**9), ("epoch", -1), ("epoch", "2"), ("step", 2.5), ("seconds", float("nan"))],
)
def test_resume_refuses_impossible_counters(finished, tmp_path, field, value):
    run = tmp_path / "run"
    os.system(f"cp -r {finished} {run}")
    (run / "final.json").unlink()
    state = load_checkpoint(run / "last.pt")
    state[field] = value
    save_checkpoint(run / "last.pt", state, keep_previous=False)
    with pytest.raises(CheckpointError, match=rf"{field} = {value!r:.6}.*prev.pt"):
        train(load_config(run / CONFIG), resume=True, progress=False, run_dir=run, log=None)
    assert not (run / "final.json").exists()
    with pytest.raises(CheckpointError, match=field):
        evaluate_run(run)


# -- a run made before an option existed --------------------------------------------------


def test_a_run_saved_before_a_new_option_still_evaluates_and_resumes(finished, tmp_path):
    """Adding data.on_bad_image made every earlier run's `snens eval` fail ("saved None,
    given 'skip'"): the checkpoint's config lacked the key that config.toml now reads as its
    default. A missing key reads as its default on both sides."""
    run = tmp_path / "run"
    os.system(f"cp -r {finished} {run}")
    state = load_checkpoint(run / "last.pt")
    for key in ("on_bad_image", "scan_images"):
        del state["config"]["data"][key]  # as a run made before the option existed holds it
    save_checkpoint(run / "last.pt", state, keep_previous=False)
    (run / CONFIG).write_text(
        "\n".join(
            line
            for line in (run / CONFIG).read_text().splitlines()
            if not line.startswith(("on_bad_image", "scan_images"))
        )
        + "\n"
    )
    metrics, _ = evaluate_run(run)
    final = json.loads((finished / "final.json").read_text())["metrics"]
    assert metrics["test/nll"] == pytest.approx(final["test/nll"], rel=1e-6)
    (run / "final.json").unlink()
    train(load_config(run / CONFIG), resume=True, progress=False, run_dir=run, log=None)
    assert (run / "final.json").is_file()
    # a key this version does not know is another matter: named, with the way out
    state["config"]["data"]["from_the_future"] = 1
    save_checkpoint(run / "last.pt", state, keep_previous=False)
    with pytest.raises(CheckpointError, match=r"holds a config this version of snens cannot"):
        evaluate_run(run)


# -- snens eval on a run whose config.toml was edited afterwards ----------------------------


def test_eval_refuses_an_edited_config(finished, tmp_path, capsys):
    run = tmp_path / "run"
    os.system(f"cp -r {finished} {run}")
    text = (run / CONFIG).read_text()
    assert "test_examples = 200" in text
    (run / CONFIG).write_text(text.replace("test_examples = 200", "test_examples = 100"))
    with pytest.raises(CheckpointError, match=r"data.test_examples: saved 200, given 100"):
        evaluate_run(run)
    assert main(["eval", str(run)]) == 2
    assert "Restore config.toml" in capsys.readouterr().err


def test_eval_of_an_unedited_run_reproduces_final_json(finished):
    metrics, state = evaluate_run(finished)
    final = json.loads((finished / "final.json").read_text())["metrics"]
    assert metrics["test/nll"] == pytest.approx(final["test/nll"], rel=1e-6)
    assert state["epoch"] == 2


# -- the disk fills, or the run directory is made read-only, mid-run ------------------------


def test_a_full_disk_mid_run_names_the_file_and_how_to_resume(tmp_path, monkeypatch):
    real_fsync = os.fsync
    calls = {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] > 6:  # the first writes succeed: config, provenance, epoch 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    config = _config(tmp_path, "optim.epochs=3")
    train_run = tmp_path / "run"
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(RunDirError, match=r"cannot write .*No space left.*--resume"):
        train(config, progress=False, log=None)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not list(train_run.glob(".*.tmp"))  # nothing half-written left behind
    # what was saved is intact: the run resumes and finishes
    train(load_config(train_run / CONFIG), resume=True, progress=False, run_dir=train_run, log=None)
    assert (train_run / "final.json").is_file()


def test_a_full_disk_as_provenance_json_is_written_says_how_to_resume(
    tmp_path, monkeypatch, capsys
):
    """The disk filled right after config.toml: the raw OSError had reached the CLI (exit
    status 1, no --resume), and the resume had written a provenance.json without versions,
    platform or command. Now the error names the file and the resume, which records a new
    provenance.json, marked as made then."""
    real = snens.engine.runs.atomic_write

    def full(path, data, **kwargs):
        if Path(path).name == "provenance.json":
            raise OSError(errno.ENOSPC, f"cannot write {path}: No space left on device")
        return real(path, data, **kwargs)

    run = tmp_path / "run"
    monkeypatch.setattr(snens.engine.runs, "atomic_write", full)
    with pytest.raises(RunDirError) as err:
        train(_config(tmp_path), progress=False, log=None)
    assert str(err.value) == (
        f"[Errno 28] cannot write {run / 'provenance.json'} (No space left on device); the run "
        "holds its config.toml only, nothing was trained: free space or restore write access, "
        f"then start it with `snens train --resume {run}` (which records provenance.json then)"
    )
    assert sorted(p.name for p in run.iterdir()) == ["config.toml"]
    (run / CONFIG).unlink()
    args = ["train", "--preset", "fashion_mnist_small_cnn_tiny", "--out", str(tmp_path)]
    args += ["--no-progress", "--set", 'name="run"', "--set", "threads=1"]
    assert main([*args, "--set", "data.train_examples=300", "--set", "optim.epochs=2"]) == 2
    err = capsys.readouterr().err
    assert f"`snens train --resume {run}`" in err and "Traceback" not in err
    monkeypatch.undo()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    info = json.loads((run / "provenance.json").read_text())
    assert info["torch"] == torch.__version__ and info["platform"]
    assert info["command"] == info["resumed"][0]["command"]  # the resume's
    assert info["rebuilt"].startswith("provenance.json was missing when the run was resumed")
    assert (run / "final.json").is_file()


def test_cli_reports_a_full_disk_without_a_traceback(tmp_path, monkeypatch, capsys):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snens.engine.runs.Run, "write_final", lambda self, r: no_space())
    code = main(
        [
            "train",
            "--preset",
            "fashion_mnist_small_cnn_tiny",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--set",
            "data.train_examples=200",
            "--set",
            "optim.epochs=1",
            "--set",
            "threads=1",
        ]
    )
    err = capsys.readouterr().err
    assert code in (1, 2) and "No space left on device" in err and "Traceback" not in err


# -- absurd member counts -------------------------------------------------------------------


def test_a_million_members_is_refused_before_any_work():
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )
    with pytest.raises(ValueError, match=r"num_members must be <= 1024, got 1,000,000"):
        snens.convert(model, num_members=10**6)
    with pytest.raises(ValueError, match=r"method.num_members"):
        load_config(preset("fashion_mnist_small_cnn_tiny"), ["method.num_members=1000000"])
    assert snens.convert(model, num_members=MAX_MEMBERS).num_members == MAX_MEMBERS


def test_a_model_that_cannot_be_copied_gets_a_clear_error():
    """Legacy weight_norm hooks make deepcopy fail deep inside torch; convert names the cause
    and the two ways on (parametrized weight norm, or inplace=True)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # weight_norm is deprecated upstream
        legacy = torch.nn.utils.weight_norm(torch.nn.Linear(3, 4))
    model = torch.nn.Sequential(legacy, torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    with pytest.raises(TypeError, match=r"cannot be copied.*parametrizations.weight_norm.*inplace"):
        snens.convert(model, num_members=4)
    x = torch.randn(5, 3)
    expected = model.eval()(x)
    ens = snens.convert(model, num_members=4, inplace=True).eval()
    torch.testing.assert_close(ens(x), expected.expand(4, -1, -1), rtol=1e-5, atol=1e-6)


# -- two processes, one run being trained -------------------------------------------------


def test_a_run_being_trained_is_refused_to_a_second_trainer(finished, capsys):
    """A --resume (or a second sweep) while the first process still trains the run used to
    train it a second time, both writing its checkpoints; now the run lock refuses it, naming
    the process, and leaves every file of the run as it was."""
    before = {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()}
    config = load_config(finished / CONFIG)
    me = f"{socket.gethostname()} {os.getpid()}"
    with snens.engine.runs.hold_run(finished):
        with pytest.raises(snens.engine.runs.RunInUseError) as err:
            train(config, resume=True, run_dir=finished, progress=False, log=None)
        assert str(err.value).startswith(f"the run {finished} is in use by {me} (lock ")
        assert main(["train", "--resume", str(finished), "--no-progress"]) == 2
        assert f"is in use by {me}" in capsys.readouterr().err
    after = {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()}
    assert after == before  # provenance.json not even stamped with a resume


def test_two_sweeps_over_one_grid_share_it_out(tmp_path):
    """The same `snens sweep` in two shells: each run is trained once, by one of them (none
    resumed, none failed), and both exit 0."""
    out = tmp_path / "grid"
    command = [
        sys.executable,
        "-m",
        "snens",
        "sweep",
        "--preset",
        "fashion_mnist_small_cnn_tiny",
        "--set",
        "threads=1",
        "--set",
        "data.train_examples=200",
        "--set",
        "data.test_examples=100",
        "--set",
        "data.ood_examples=100",
        "--set",
        "optim.epochs=1",
        "--grid",
        "seed=0,1,2,3",
        "--out",
        str(out),
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    logs = [p.communicate(timeout=600)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    runs = sorted(out.glob("seed=*"))
    assert [r.name for r in runs] == ["seed=0", "seed=1", "seed=2", "seed=3"]
    for run in runs:
        assert (run / "final.json").is_file() and not (run / snens.engine.runs.LOCK).exists()
        assert json.loads((run / "provenance.json").read_text()).get("resumed", []) == []
    lines = [line for log in logs for line in log.splitlines()]
    assert sum(": finished in" in line for line in lines) == 4, logs  # each run by one of them
    assert not any("FAILED" in line for line in lines), logs


# -- inputs the model cannot take -----------------------------------------------------------


def _small_ensemble(device: str = "cpu") -> snens.Ensemble:
    with torch.device(device):
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 10),
        )
    return snens.convert(net, num_members=4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_input_of_another_dtype_is_named_with_the_fix(dtype):
    """It used to fail inside the first conv ("Input type (c10::Half) and bias type (float)
    should be the same"); the error now names both dtypes and the three ways out."""
    model = _small_ensemble()
    with pytest.raises(TypeError) as err:
        model(torch.randn(2, 3, 8, 8, dtype=dtype))
    assert str(err.value) == (
        f"the ensemble's argument 0 is {dtype}, its parameters torch.float32; cast the input "
        f"(input.to(torch.float32)) or the model (model.to({dtype})), or run it under "
        "torch.autocast"
    )
    # each way out works
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    assert model(x.float()).shape == (4, 2, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x.float()).shape == (4, 2, 10)
    if dtype != torch.float16:  # CPU half convolutions are slow and loose; the cast is the point
        assert model.to(dtype)(x).dtype == dtype


def test_integer_inputs_are_not_checked():
    """Token ids (int64) into a float model are the normal case, not a dtype mismatch."""
    net = torch.nn.Sequential(
        torch.nn.Embedding(20, 8), torch.nn.LayerNorm(8), torch.nn.Flatten(), torch.nn.Linear(24, 3)
    )
    model = snens.convert(net, num_members=2)
    assert model(torch.randint(0, 20, (5, 3))).shape == (2, 5, 3)


def test_input_on_another_device_is_named_with_the_fix():
    model = _small_ensemble()
    with pytest.raises(ValueError) as err:
        model(torch.randn(2, 3, 8, 8, device="meta"))
    assert str(err.value) == (
        "the ensemble's argument 0 is on meta, its parameters on cpu; move one to the other "
        "(input.to('cpu') or model.to('meta'))"
    )


def test_a_meta_model_runs_meta_inputs_for_shapes():
    """Shape inference on the meta device: each forward, in training and in eval, runs the
    model once, on the batch repeated to (M·B, …) at the input."""
    model = _small_ensemble("meta")
    rows = []
    model.model.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    out = model(torch.randn(6, 3, 8, 8, device="meta"))
    assert out.shape == (4, 6, 10) and out.is_meta
    model.eval()
    assert model(torch.randn(6, 3, 8, 8, device="meta")).shape == (4, 6, 10)
    assert rows == [4 * 6, 4 * 6]


# -- counts the data cannot meet ------------------------------------------------------------


def test_more_examples_than_the_set_holds_is_refused_not_capped(tmp_path):
    """data.train_examples=999999999 had silently trained on all 60,000 images."""
    from snens.engine.datasets import build_data

    with pytest.raises(ValueError) as err:
        build_data(_config(tmp_path, "data.train_examples=999999999").data, seed=0)
    assert str(err.value) == (
        "data.train_examples 999,999,999 is more than the 60,000 examples of fashion_mnist's "
        "training set; ask for at most 60,000, or 0 for all of them"
    )
    with pytest.raises(ValueError, match=r"data\.test_examples 10,001 is more than the 10,000"):
        build_data(_config(tmp_path, "data.test_examples=10001").data, seed=0)
    held = _config(tmp_path, "data.validation_examples=59000", "data.train_examples=1001")
    with pytest.raises(ValueError, match=r"1,000 examples of .* left after data\.validation"):
        build_data(held.data, seed=0)
    assert len(build_data(_config(tmp_path, "data.train_examples=60000").data, seed=0).train)


def test_a_batch_larger_than_the_training_set_names_the_engine_key(tmp_path):
    """It had said "set drop_last=False", a loader argument the engine does not offer."""
    from snens.engine.datasets import build_data

    with pytest.raises(ValueError) as err:
        build_data(_config(tmp_path, "data.batch_size=301").data, seed=0)
    assert str(err.value) == (
        "data.batch_size 301 is more than the 300 training examples, so no full batch is left "
        "to train on; lower data.batch_size (at most 300) or train on more examples"
    )
