"""Model selection on the validation split (``optim.select``, ``optim.patience``).

Every run: real Fashion-MNIST, a width-8 small CNN, 1,000 training images without augmentation
at a constant, large learning rate, so validation NLL turns up at the last epoch and the kept
epoch is not the last (σN-Ens: epoch 5 of 6; deep-ensemble members: 5, 5, 5, 4); 1 thread,
deterministic algorithms; about 5 seconds per run.
"""

import json
import math
from pathlib import Path

import pytest
import torch

import snens.engine.selection
from snens.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from snens.engine.config import OptimConfig, RunConfig, load_config
from snens.engine.presets import preset
from snens.engine.reload import evaluate_run, load_run_model
from snens.engine.runs import read_metrics
from snens.engine.selection import BEST
from snens.engine.train import train

EPOCHS = 6


def _config(out_dir: Path, name: str, *overrides: str) -> RunConfig:
    return load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(out_dir))}",
            f"name={json.dumps(name)}",
            "threads=1",
            "deterministic=true",
            "data.train_examples=1000",
            "data.validation_examples=300",
            "data.test_examples=400",
            "data.ood_examples=200",
            "data.batch_size=50",
            "data.augment=[]",
            f"optim.epochs={EPOCHS}",
            "optim.schedule='constant'",
            "optim.lr=0.03",
            "model.options.width=8",
            "eval_every=1",  # the test metrics of every epoch, to hold the final ones against
            'optim.select="nll"',
            *overrides,
        ],
    )


def _final(run_dir: Path) -> dict:
    return json.loads((run_dir / "final.json").read_text())


@pytest.fixture(scope="module")
def selected(tmp_path_factory):
    """σN-Ens selected on validation NLL, trained uninterrupted."""
    out = tmp_path_factory.mktemp("runs")
    return train(_config(out, "snens"), progress=False, log=None)


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A deep ensemble of 4 trained in one run, each member selected on its own NLL."""
    out = tmp_path_factory.mktemp("runs")
    return train(_config(out, "deep", "method.name=deep_ensemble"), progress=False, log=None)


def test_the_kept_epoch_is_the_best_on_validation_and_is_what_the_test_set_sees(selected):
    records = read_metrics(selected)
    val = [r["val/nll"] for r in records]
    best = 1 + val.index(min(val))
    assert best < EPOCHS, f"the fixture must overfit: validation NLL {val}"
    final = _final(selected)
    assert final["selection"] == {
        "metric": "nll",
        "epoch": best,
        "value": min(val),
        "epochs_trained": EPOCHS,
        "patience": 0,
    }
    # the test metrics logged during training at the kept epoch, from the weights of then
    logged = records[best - 1]
    for key in ("test/accuracy", "test/nll", "test/ece", "val/accuracy", "val/nll"):
        assert final["metrics"][key] == logged[key], key
    assert final["metrics"]["test/nll"] != records[-1]["test/nll"]


def test_the_run_without_selection_evaluates_its_last_epoch(tmp_path, selected):
    run = train(_config(tmp_path, "last", 'optim.select=""'), progress=False, log=None)
    final, records = _final(run), read_metrics(run)
    assert "selection" not in final
    assert final["metrics"]["test/nll"] == records[-1]["test/nll"]
    # the same training either way: only which weights are evaluated differs
    assert [r["val/nll"] for r in records] == [r["val/nll"] for r in read_metrics(selected)]
    assert not (run / BEST).exists()


def test_evaluate_run_reproduces_the_selected_metrics_and_can_take_the_last_epoch(selected):
    metrics, state = evaluate_run(selected, corruptions=False)
    final = _final(selected)["metrics"]
    for key in ("test/nll", "test/ece", "val/nll", "test_ts/nll", "ood/mnist_5k/auroc"):
        assert metrics[key] == final[key], key
    assert state["selection"]["epochs"] == [_final(selected)["selection"]["epoch"]]
    # without the validation split (OOD scores of a finished run): the same selected weights
    alone, _ = evaluate_run(selected, corruptions=False, validation=False)
    assert alone["test/nll"] == final["test/nll"] and "val/nll" not in alone
    last, _, _ = load_run_model(selected, selected=False)
    kept, _, _ = load_run_model(selected)
    gammas = [n for n, _ in kept.named_parameters() if n.endswith("gamma")]
    assert gammas
    assert not torch.equal(last.state_dict()[gammas[0]], kept.state_dict()[gammas[0]])


def test_best_pt_holds_only_what_training_changes(selected):
    best = load_checkpoint(selected / BEST, required=("model", "selection"))
    model, _, _ = load_run_model(selected)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n for n, _ in model.named_buffers()}
    assert set(best["model"]) == trainable | buffers


def test_each_deep_ensemble_member_is_kept_at_its_own_best_epoch(deep):
    records = read_metrics(deep)
    per_epoch = [r["val/member_nll"] for r in records]  # (epochs, M)
    best = [1 + min(range(EPOCHS), key=lambda e: per_epoch[e][m]) for m in range(4)]
    assert len(set(best)) > 1, f"the members should peak apart: {per_epoch}"
    selection = _final(deep)["selection"]
    assert selection["member_epochs"] == best
    assert selection["member_values"] == [min(row[m] for row in per_epoch) for m in range(4)]
    # the composite model's members score their kept values on the validation split, and
    # a re-evaluation of the run (which rebuilds it from best.pt) gives the same
    assert _member_nll(deep) == selection["member_values"]
    metrics, _ = evaluate_run(deep, corruptions=False)
    assert metrics["val/nll"] == _final(deep)["metrics"]["val/nll"]
    assert metrics["test/nll"] == _final(deep)["metrics"]["test/nll"]


def _member_nll(run: Path) -> list[float]:
    import numpy as np

    from snens.metrics import nll

    with np.load(run / "outputs.npz") as kept:
        logits, labels = torch.from_numpy(kept["val"]), torch.from_numpy(kept["val_labels"])
    return [nll(logits[m].float().softmax(-1), labels) for m in range(logits.shape[0])]


def _interrupt_before_best_pt(monkeypatch, epoch: int) -> type:
    """Make training stop right after ``epoch``'s last.pt was written and before its best.pt
    (the moment a kill would lose the kept weights, were they not in last.pt)."""

    class Killed(Exception):
        pass

    original = snens.engine.selection.Selection.save

    def save(self, path, config):
        if self.epoch == epoch:
            raise Killed
        original(self, path, config)

    monkeypatch.setattr(snens.engine.selection.Selection, "save", save)
    return Killed


@pytest.mark.parametrize("method", ["snens", "deep_ensemble"])
def test_a_run_killed_between_last_pt_and_best_pt_resumes_to_the_same_result(
    tmp_path, monkeypatch, method, selected, deep
):
    reference = {"snens": selected, "deep_ensemble": deep}[method]
    kept = _final(reference)["selection"]
    epoch = kept.get("epoch") or max(kept["member_epochs"])
    config = _config(tmp_path, "killed", f"method.name={method}")
    killed = _interrupt_before_best_pt(monkeypatch, epoch)
    with pytest.raises(killed):
        train(config, progress=False, log=None)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "killed" / "last.pt")["epoch"] == epoch
    train(config, resume=True, progress=False, log=None)
    resumed, uninterrupted = _final(tmp_path / "killed"), _final(reference)
    assert resumed["selection"] == uninterrupted["selection"]
    for key in ("test/nll", "test/ece", "test/accuracy", "val/nll", "test_ts/nll"):
        assert resumed["metrics"][key] == uninterrupted["metrics"][key], key


def test_patience_stops_training_and_a_resume_does_not_train_on(tmp_path, selected):
    val = [r["val/nll"] for r in read_metrics(selected)]
    best = 1 + val.index(min(val))
    # a longer run at the same constant rate: its first epochs are the fixture's
    config = _config(tmp_path, "patient", "optim.patience=1", f"optim.epochs={EPOCHS + 2}")
    run = train(config, progress=False, log=None)
    final = _final(run)
    # the first epoch after the best that does not improve on it stops training
    stop = next(e for e in range(best + 1, EPOCHS + 1) if val[e - 1] >= min(val[:e]))
    assert final["train"]["epochs"] == stop == len(read_metrics(run)) < EPOCHS + 2
    assert final["selection"]["epoch"] == best and final["selection"]["epochs_trained"] == stop
    assert final["metrics"]["test/nll"] == _final(selected)["metrics"]["test/nll"]
    # stopped, but killed before final.json: the resume evaluates, it does not train on
    (run / "final.json").unlink()
    train(config, resume=True, progress=False, log=None)
    assert len(read_metrics(run)) == stop
    assert _final(run)["metrics"]["test/nll"] == final["metrics"]["test/nll"]


def test_a_missing_best_pt_is_named_not_replaced_by_the_last_epoch(tmp_path, selected):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(selected, copy)
    (copy / BEST).unlink()
    with pytest.raises(CheckpointError, match=r"best\.pt is missing.*optim\.select"):
        load_run_model(copy)
    load_run_model(copy, selected=False)  # the last epoch is still there, when asked for


def test_a_damaged_best_pt_says_the_selected_weights_are_lost_not_to_use_prev_pt(
    tmp_path, selected
):
    """prev.pt is the epoch before the last, not the selected one: advising it for a damaged
    best.pt would evaluate other weights under the selected epoch's name."""
    import shutil

    for damage in ("truncated", "changed"):
        copy = tmp_path / damage
        shutil.copytree(selected, copy)
        data = (copy / BEST).read_bytes()
        if damage == "truncated":
            (copy / BEST).write_bytes(data[:-100])
        else:
            (copy / BEST).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        with pytest.raises(CheckpointError) as error:
            load_run_model(copy)
        message = str(error.value)
        assert "best.pt" in message and "prev.pt" not in message
        assert "selected epoch's weights are lost" in message and "train the run again" in message


def test_a_directory_at_best_pt_is_named_not_called_missing(tmp_path, selected, capsys):
    """A directory in best.pt's place had been reported as "best.pt is missing"."""
    import shutil

    from snens.engine.cli import main

    copy = tmp_path / "copy"
    shutil.copytree(selected, copy)
    (copy / BEST).unlink()
    (copy / BEST).mkdir()
    kept = _final(selected)["selection"]["epoch"]
    with pytest.raises(CheckpointError) as error:
        load_run_model(copy)
    assert str(error.value) == (
        f"{copy / BEST} is a directory, not a checkpoint file, so the weights of the epochs "
        f"the run selected ([{kept}]) cannot be read from it; move it away and put the run's "
        "own best.pt there (from a backup of the run), else the selected model is lost: start "
        'the run again, or evaluate its last epoch with optim.select = ""'
    )
    assert main(["eval", str(copy), "--no-corruptions"]) == 2
    err = capsys.readouterr().err
    assert f"{copy / BEST} is a directory, not a checkpoint file" in err
    assert "missing" not in err and "Traceback" not in err


@pytest.fixture(scope="module")
def other_seed(selected):
    """The `selected` run's config with another seed, beside it."""
    return train(_config(selected.parent, "seed1", "seed=1"), progress=False, log=None)


def test_a_best_pt_of_another_seed_is_refused_by_eval_and_resume(
    tmp_path, selected, other_seed, capsys
):
    """A best.pt copied from a run of another seed had been evaluated by `snens eval` as this
    run's, and `snens train --resume` had rewritten final.json from its weights: only the kept
    epoch was compared with last.pt's record, never the config best.pt was saved with."""
    import shutil

    from snens.engine.cli import main

    copy = tmp_path / "copy"
    shutil.copytree(selected, copy)
    shutil.copyfile(other_seed / BEST, copy / BEST)
    final = (copy / "final.json").read_bytes()
    with pytest.raises(CheckpointError) as error:
        load_run_model(copy)
    assert str(error.value) == (
        f"{copy / BEST} was saved by another run: its config differs from the run's (name: the "
        "run's 'snens', best.pt's 'seed1'; seed: the run's 0, best.pt's 1), so its weights are "
        "not this run's kept weights. Put the run's own best.pt back (from a backup of the "
        "run), or start the run again"
    )
    assert main(["eval", str(copy), "--no-corruptions"]) == 2
    assert "seed: the run's 0, best.pt's 1" in capsys.readouterr().err
    assert main(["train", "--resume", str(copy), "--no-progress"]) == 2
    assert "seed: the run's 0, best.pt's 1" in capsys.readouterr().err
    assert (copy / "final.json").read_bytes() == final  # not rewritten from the other's weights


def _edit_best_pt(path: Path, member: int | None = None) -> None:
    """Change one kept weight of ``path`` (of a deep ensemble's ``member``), saved with a valid
    digest and the same config and epochs: a best.pt the config check cannot tell apart."""
    saved = load_checkpoint(path, required=("model", "selection", "config"))
    prefix = "" if member is None else f"members.{member}."
    key = next(
        k for k, v in saved["model"].items() if k.startswith(prefix) and v.is_floating_point()
    )
    saved["model"][key] = saved["model"][key] + 1e-3
    save_checkpoint(path, saved, keep_previous=False)


def test_best_pt_weights_other_than_last_pt_recorded_are_refused(tmp_path, selected, deep):
    """last.pt records the SHA-256 of the kept weights; a best.pt of the same config and epochs
    but other weights (another run of the same seed, or an edit) is refused, naming the epoch
    and the member."""
    import shutil

    kept = _final(selected)["selection"]["epoch"]
    digest = load_checkpoint(selected / "last.pt")["selection"]["digests"][0]
    assert len(digest) == 64
    copy = tmp_path / "copy"
    shutil.copytree(selected, copy)
    _edit_best_pt(copy / BEST)
    with pytest.raises(CheckpointError) as error:
        load_run_model(copy)
    message = str(error.value)
    assert message.startswith(
        f"{copy / BEST}: the weights are not those this run kept at epoch {kept} (SHA-256 "
    )
    assert f"last.pt recorded {digest[:12]}…): it is another run's best.pt or was edited" in message
    # a deep ensemble: each member's own digest
    members = tmp_path / "deep"
    shutil.copytree(deep, members)
    _edit_best_pt(members / BEST, member=2)
    epoch = _final(deep)["selection"]["member_epochs"][2]
    with pytest.raises(
        CheckpointError,
        match=f"the weights of member 2 are not those this run kept at epoch {epoch} ",
    ):
        load_run_model(members)


def test_a_run_saved_before_digests_were_recorded_still_evaluates(tmp_path, selected):
    """A last.pt whose selection record holds no digests (written before they were kept) is
    read as before, best.pt checked by its config alone; a resume records them from then on."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(selected, copy)
    state = load_checkpoint(copy / "last.pt")
    del state["selection"]["digests"]
    save_checkpoint(copy / "last.pt", state, keep_previous=False)
    metrics, _ = evaluate_run(copy, corruptions=False)
    assert metrics["test/nll"] == _final(selected)["metrics"]["test/nll"]
    model, _, state = load_run_model(copy, selected=False)
    _, record = snens.engine.selection.selected_state(model, copy, state, "nll")
    assert record["digests"] == load_checkpoint(selected / "last.pt")["selection"]["digests"]
    _edit_best_pt(copy / BEST)  # undetectable without a recorded digest: loads
    load_run_model(copy)


def test_selection_settings_are_checked_naming_the_key_and_the_fix():
    with pytest.raises(ValueError, match=r"optim\.select must be one of 'nll'.*got 'loss'"):
        OptimConfig(select="loss")
    with pytest.raises(ValueError, match=r"optim\.patience = 2 .*optim\.select = \"nll\""):
        OptimConfig(patience=2)
    with pytest.raises(ValueError, match=r"optim\.patience must be an int in \[0, epochs=10\]"):
        OptimConfig(select="nll", patience=11)
    with pytest.raises(ValueError, match=r"data\.validation_examples is 0.*data\.validation"):
        RunConfig(optim=OptimConfig(select="nll"))


def test_a_non_finite_epoch_is_never_kept():
    model = torch.nn.Linear(3, 2)
    selection = snens.engine.selection.Selection.for_model(model, "nll")
    labels = torch.tensor([0, 1])
    good = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])
    bad = torch.full((1, 2, 2), math.nan)
    assert selection.update(1, bad, labels, model) == [0]  # the first epoch, whatever it is
    assert selection.update(2, good, labels, model) == [0]  # a finite one replaces it
    assert selection.update(3, bad, labels, model) == []
    assert selection.epochs == [2]


def test_snens_eval_says_it_measured_the_kept_epoch_not_the_last(selected, capsys):
    from snens.engine.cli import main

    assert main(["eval", str(selected), "--no-corruptions"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    kept = _final(selected)["selection"]["epoch"]
    assert first == (
        f"{selected}: best.pt, epoch {kept} kept on validation nll "
        f"(last.pt after epoch {EPOCHS} (step {EPOCHS * 1000 // 50}))"
    )


def _picked(value, metric="nll"):
    return {"metric": metric, "epoch": 3, "value": value, "epochs_trained": 6, "patience": 0}


def test_the_choice_on_validation_compares_the_seeds_every_candidate_has():
    from snens.engine.selection import choose_on_validation

    candidates = [
        {0: _picked(0.30), 1: _picked(0.40)},  # mean 0.35 over seeds 0 and 1
        {0: _picked(0.34), 1: _picked(0.34), 2: _picked(0.10)},  # seed 2 alone would win
        {0: None, 1: None},  # trained without optim.select
        {0: {"metric": "nll", "member_epochs": [3, 4], "member_values": [0.2, 0.2]}},
    ]
    choice = choose_on_validation(candidates)
    assert choice.index == 1 and choice.metric == "nll" and choice.seeds == (0, 1)
    assert choice.values[:2] == pytest.approx((0.35, 0.34)) and choice.values[2:] == (None, None)
    assert choice.left_out[:2] == (None, None)
    assert "without optim.select" in choice.left_out[2]
    assert "each selected on their own" in choice.left_out[3]
    # no seed common to all: each candidate's mean over its own seeds
    apart = choose_on_validation([{0: _picked(0.30)}, {1: _picked(0.20), 2: _picked(0.50)}])
    assert apart.seeds == () and apart.index == 0
    assert apart.values == pytest.approx((0.30, 0.35))


def test_the_choice_follows_the_metric_and_a_diverged_run_never_wins():
    from snens.engine.selection import choose_on_validation

    # accuracy: higher is better
    found = choose_on_validation([{0: _picked(0.8, "accuracy")}, {0: _picked(0.9, "accuracy")}])
    assert found.index == 1 and found.metric == "accuracy"
    # a non-finite value (null in final.json, or NaN) never wins; ties go to the earlier
    found = choose_on_validation([{0: _picked(None)}, {0: _picked(0.5)}, {0: _picked(0.5)}])
    assert found.index == 1 and math.isnan(found.values[0])
    assert choose_on_validation([{0: _picked(math.nan)}]).index is None
    # runs selected on different metrics cannot be compared: no choice
    mixed = choose_on_validation([{0: _picked(0.3)}, {0: _picked(0.9, "accuracy")}])
    assert mixed.index is None and mixed.metric is None
    assert choose_on_validation([{0: None}]).index is None
    # an edited record is read, never a crash: a metric that is no name, a value that is no
    # number
    odd = choose_on_validation([{0: {"metric": ["nll"], "value": 0.1}}, {0: _picked(True)}])
    assert odd.index is None and "names no metric" in odd.left_out[0]
