import json
import os
import sys

import pytest

import snens.engine.train
from snens.engine.checkpoint import save_checkpoint
from snens.engine.cli import build_parser, main
from snens.engine.config import load_config, to_dict
from snens.engine.presets import preset
from snens.engine.runs import CONFIG, create_run

TINY = "fashion_mnist_small_cnn_tiny"


def test_help_lists_the_demo(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "demo" in out
    assert "exit status: 0 done; 1 a run failed on the way" in out  # what scripts can rely on


def test_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["dance"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'dance'" in capsys.readouterr().err


def test_sweep_refuses_a_key_given_by_set_and_by_grid(tmp_path, capsys):
    """``--set seed=5`` beside ``--grid seed=1,2`` was dropped without a word: every run took
    its seed from the grid."""
    out = tmp_path / "sweep"
    command = ["sweep", "--preset", TINY, "--grid", "seed=1,2", "--out", str(out), "--dry-run"]
    assert main([*command, "--set", "optim.epochs=1", "--set", " seed =5"]) == 2
    assert capsys.readouterr().err == (
        "snens sweep: seed is given by --set ' seed =5' and by --grid 'seed=1,2'; every run "
        "takes its value from the grid, so the --set value would be dropped. Give seed once: "
        "drop the --set, or list that value in the --grid axis\n"
    )
    assert main([*command, "--set", "optim.epochs=1"]) == 0  # other keys: as before
    assert not out.exists()


def _edited_run(tmp_path, *edits):
    """A run directory whose last.pt was trained with the tiny preset, and whose config.toml
    then had ``edits`` applied."""
    config = load_config(
        preset(TINY), [f"out_dir={json.dumps(str(tmp_path))}", 'name="run"', "threads=1"]
    )
    run = create_run(config).path
    state = {"model": {}, "optimizer": {}, "schedule": {}, "rng": {}, "epoch": 1, "step": 3}
    save_checkpoint(run / "last.pt", {**state, "config": to_dict(config)})
    text = (run / CONFIG).read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    (run / CONFIG).write_text(text, encoding="utf-8")
    return run


def test_resume_with_an_edited_config_names_the_keys(tmp_path, capsys, monkeypatch):
    """``snens eval`` named the keys an edited config.toml changed; ``snens train --resume``
    said only that last.pt "was saved by another config", after loading the data."""
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    run = _edited_run(
        tmp_path, ("\nlr = 0.01\n", "\nlr = 0.5\n"), ("\nepochs = 1\n", "\nepochs = 2\n")
    )
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"snens train: {run / CONFIG} differs from the config {run / 'last.pt'} was trained "
        "with (optim.epochs: saved 1, given 2; optim.lr: saved 0.01, given 0.5); a resumed run "
        "continues the same run. Restore config.toml, or start a new run with the new settings "
        "(snens train --config FILE)\n"
    )


def test_resume_with_the_config_it_was_trained_with_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(snens.engine.train, "train", lambda config, **kwargs: kwargs["run_dir"])
    run = _edited_run(tmp_path)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert capsys.readouterr().out == f"{run}\n"


def test_ctrl_c_says_how_to_resume_instead_of_a_traceback(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(snens.engine.train, "train", interrupted)
    argv = ["train", "--preset", "fashion_mnist_small_cnn_tiny", "--out", str(tmp_path)]
    assert main([*argv, "--set", 'name="cut"']) == 130
    err = capsys.readouterr().err
    assert err.strip() == (
        "snens train: interrupted; the run keeps its last complete checkpoint, continue it "
        f"with: snens train --resume {tmp_path / 'cut'}"
    )


# -- config.toml read as a run file: a regular file of at most 64 MiB, never through a link ----

_RUN_FILE_REFUSED = (
    "holds 1,073,741,824 bytes, above the limit of 67,108,864 for a run file (snens writes "
    "kilobytes there), so it was not read: move it away, or restore the file that belongs there"
)


def _peak_mib():
    """This process's peak resident memory so far, in MiB (ru_maxrss is in KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB, sparse files: Linux")
def test_an_oversized_config_toml_is_refused_unread_by_eval_and_resume(
    tmp_path, capsys, monkeypatch
):
    """``snens eval`` and ``snens train --resume`` read a run's config.toml whole: a 2 GiB
    (sparse) one cost 4.4 GB of memory before failing as "not valid TOML", where ``snens
    report`` refused it by its size, as every run file is."""
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    run = _edited_run(tmp_path)
    os.truncate(run / CONFIG, 2**30)  # 1 GiB, sparse: no disk used
    peak = _peak_mib()
    assert main(["eval", str(run), "--no-corruptions"]) == 2
    assert capsys.readouterr().err == f"snens eval: {run / CONFIG} {_RUN_FILE_REFUSED}\n"
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"snens train: {run / CONFIG} {_RUN_FILE_REFUSED}\n"
    assert _peak_mib() - peak < 256  # read whole, it would cost over 2 GiB


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["a directory", "a FIFO", "a symbolic link"])
def test_a_config_toml_that_is_no_regular_file_is_named_by_eval_and_resume(
    kind, tmp_path, capsys, monkeypatch
):
    """A directory or FIFO at config.toml was "config file … not found" to ``snens train
    --resume`` and "(no config.toml)" to ``snens eval``; a FIFO is never waited for, a link
    never followed."""
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    run = _edited_run(tmp_path)
    (run / CONFIG).rename(tmp_path / "config.toml")
    if kind == "a directory":
        (run / CONFIG).mkdir()
    elif kind == "a FIFO":
        os.mkfifo(run / CONFIG)
    else:  # to the very file it held: still refused, as a run file is
        (run / CONFIG).symlink_to(tmp_path / "config.toml")
    refused = (
        f"{run / CONFIG} is {kind}, not a regular file, so it was not read (a link could lead "
        "anywhere and a FIFO would block): replace it with the file itself, or move it away\n"
    )
    assert main(["eval", str(run), "--no-corruptions"]) == 2
    assert capsys.readouterr().err == f"snens eval: {refused}"
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"snens train: {refused}"


def test_a_missing_config_toml_is_no_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(snens.engine.train, "train", lambda *a, **k: pytest.fail("trained"))
    run = _edited_run(tmp_path)
    (run / CONFIG).unlink()
    assert main(["eval", str(run)]) == 2
    assert capsys.readouterr().err == f"snens eval: {run} is not a run directory (no {CONFIG})\n"
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"snens train: config file {run / CONFIG} not found\n"
    (run / "file").write_text("x")
    assert main(["eval", str(run / "file")]) == 2
    assert capsys.readouterr().err == (
        f"snens eval: {run / 'file'} is not a run directory (no {CONFIG})\n"
    )


def test_a_config_given_by_hand_is_still_read_through_a_link(tmp_path, capsys):
    (tmp_path / "mine.toml").write_text('seed = 7\nname = "x"\n', encoding="utf-8")
    (tmp_path / "link.toml").symlink_to(tmp_path / "mine.toml")
    assert main(["train", "--config", str(tmp_path / "link.toml"), "--print-config"]) == 0
    assert "\nseed = 7\n" in capsys.readouterr().out
