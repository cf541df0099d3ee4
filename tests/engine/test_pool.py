"""snens pool: finished runs trained apart measured as one ensemble of all their members."""

import hashlib
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from snens.engine.cli import main
from snens.engine.config import load_config
from snens.engine.pool import pool_runs
from snens.engine.presets import preset
from snens.engine.runs import read_outputs
from snens.engine.train import train
from snens.evaluation.calibration import fit_calibrator
from snens.evaluation.protocol import (
    ensemble_metrics,
    held_out_metrics,
    logit_metrics,
    posthoc_metrics,
    stack_members,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = (0, 1, 2)


def _config(out, seed, *overrides):
    return load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir='{out}'",
            f"name='single-{seed}'",
            f"seed={seed}",
            "threads=1",
            "method.name='single'",
            "method.num_members=1",
            "data.train_examples=400",
            "data.validation_examples=200",
            "data.test_examples=300",
            "data.ood_examples=300",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three single models of the tiny preset under seeds 0, 1, 2: a deep ensemble run apart."""
    out = tmp_path_factory.mktemp("pool")
    return [train(_config(out, seed), progress=False, log=None) for seed in SEEDS]


def _copy(run, where):
    return shutil.copytree(run, where, ignore=shutil.ignore_patterns("*.pt"))


def test_pooled_metrics_are_the_ensemble_of_the_runs_models(runs, tmp_path):
    result = pool_runs(runs, tmp_path / "ensemble")
    metrics = result["metrics"]
    # computed here by hand from the three runs' kept logits
    kept = [np.load(run / "outputs.npz") for run in runs]
    probs = np.stack([torch.from_numpy(k["test"][0]).softmax(-1).numpy() for k in kept])
    labels = kept[0]["test_labels"]
    mean = probs.mean(axis=0)
    assert metrics["test/num_members"] == 3
    assert metrics["test/accuracy"] == pytest.approx(float((mean.argmax(1) == labels).mean()))
    nll = -np.log(mean[np.arange(len(labels)), labels]).mean()
    assert metrics["test/nll"] == pytest.approx(float(nll), rel=1e-5)
    # each member is its run's model: their mean accuracy is the runs' own, from final.json
    finals = [json.loads((run / "final.json").read_text()) for run in runs]
    own = [f["metrics"]["test/accuracy"] for f in finals]
    assert metrics["test/member_accuracy_mean"] == pytest.approx(np.mean(own))
    assert metrics["val/num_members"] == 3 and "test_ts/nll" in metrics
    assert {"ood/mnist_5k/auroc", "ood/mnist_5k/energy/auroc"} <= set(metrics)
    assert "test/conformal_aps_coverage" in metrics
    assert result["model"] == {
        "params": sum(f["model"]["params"] for f in finals),
        "trainable_params": sum(f["model"]["trainable_params"] for f in finals),
        "members": 3,
    }
    assert result["train"]["seconds"] == pytest.approx(sum(f["train"]["seconds"] for f in finals))
    assert [r["path"] for r in result["runs"]] == [str(r) for r in runs]
    digests = [hashlib.sha256((r / "outputs.npz").read_bytes()).hexdigest() for r in runs]
    assert [r["outputs_sha256"] for r in result["runs"]] == digests
    written = json.loads((tmp_path / "ensemble" / "final.json").read_text())
    assert written["metrics"] == pytest.approx(metrics, nan_ok=True)
    assert read_outputs(tmp_path / "ensemble")["test"].shape == (3, 300, 10)


def test_one_runs_own_logits_give_its_final_metrics(runs):
    """logit_metrics composes what the engine's final evaluation measured, from logits alone:
    one run's kept logits give its final.json's metrics."""
    final = json.loads((runs[0] / "final.json").read_text())["metrics"]
    config = load_config(runs[0] / "config.toml")
    again = logit_metrics(
        read_outputs(runs[0]),
        ood_scores=config.data.ood_scores,
        conformal_alpha=config.data.conformal_alpha,
    )
    assert set(again) == set(final)
    for key, value in final.items():
        if value is None:  # NaN, which JSON writes as null: a single model's correlation
            assert math.isnan(again[key]), key
        else:
            assert again[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_held_out_metrics_need_the_validation_split_for_its_metrics_and_temperature(runs):
    outputs = read_outputs(runs[0])
    final = json.loads((runs[0] / "final.json").read_text())["metrics"]
    with_val = held_out_metrics(outputs, ood_scores=("energy",), conformal_alpha=0.2)
    assert with_val["val/nll"] == pytest.approx(final["val/nll"], rel=1e-5)
    assert with_val["test_ts/temperature"] == pytest.approx(final["test_ts/temperature"], rel=1e-4)
    assert "test/conformal_aps_coverage" in with_val
    test_only = {k: v for k, v in outputs.items() if not k.startswith("val")}
    without = held_out_metrics(test_only, ood_scores=("energy",), conformal_alpha=0.2)
    assert without == posthoc_metrics(test_only, ood_scores=("energy",), conformal_alpha=0.2)
    assert not any(k.startswith(("val/", "test_ts/", "test/conformal")) for k in without)
    assert any(k.endswith("/energy/auroc") for k in without)


def test_the_cli_pools_and_names_what_it_refuses(runs, tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "snens", "pool", *map(str, runs), "--out", str(tmp_path / "e")],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert "3 runs pooled: one ensemble of 3 members" in ok.stdout
    assert "| test/nll |" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "snens", "pool", str(runs[0]), str(runs[0])],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert f"snens pool: {runs[0]} is given twice" in bad.stderr


def test_runs_that_are_not_one_ensemble_are_refused_by_name(runs, tmp_path):
    with pytest.raises(ValueError, match="pool two or more run directories"):
        pool_runs(runs[:1])
    before = (runs[0] / "final.json").read_bytes()
    with pytest.raises(ValueError, match="holds a config.toml: it is a run directory"):
        pool_runs(runs, out=runs[0])  # would have replaced the run's own final.json
    assert (runs[0] / "final.json").read_bytes() == before
    copy = _copy(runs[1], tmp_path / "copy")  # the same model under another path
    with pytest.raises(ValueError, match=r"same configuration and seed \(1\).*copies"):
        pool_runs([runs[0], runs[1], copy])
    other = _copy(runs[2], tmp_path / "other")
    text = (other / "config.toml").read_text()
    (other / "config.toml").write_text(text.replace("test_examples = 300", "test_examples = 299"))
    with pytest.raises(ValueError, match=r"differ in data.test_examples.*same data"):
        pool_runs([runs[0], other])


def test_unfinished_runs_and_damaged_logits_are_refused_by_name(runs, tmp_path):
    unfinished = _copy(runs[1], tmp_path / "unfinished")
    (unfinished / "final.json").unlink()
    with pytest.raises(FileNotFoundError, match="final.json"):
        pool_runs([runs[0], unfinished])
    bare = _copy(runs[1], tmp_path / "bare")
    (bare / "outputs.npz").unlink()
    with pytest.raises(FileNotFoundError, match=f"{bare} kept no outputs.npz"):
        pool_runs([runs[0], bare])
    damaged = _copy(runs[1], tmp_path / "damaged")
    (damaged / "outputs.npz").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(ValueError, match="is not a readable npz archive"):
        pool_runs([runs[0], damaged])
    relabeled = _copy(runs[1], tmp_path / "relabeled")
    arrays = dict(np.load(relabeled / "outputs.npz"))
    arrays["test_labels"] = np.roll(arrays["test_labels"], 1)
    np.savez(relabeled / "outputs.npz", **arrays)
    with pytest.raises(ValueError, match="evaluated on different test examples"):
        pool_runs([runs[0], relabeled])
    wrong = _copy(runs[1], tmp_path / "wrong")
    arrays["test_labels"] = arrays["test_labels"].astype(np.float32)
    np.savez(wrong / "outputs.npz", **arrays)
    with pytest.raises(ValueError, match=r"test_labels is a float32 array .* integer labels"):
        pool_runs([runs[0], wrong])


def test_stack_members_refuses_dicts_of_other_sets():
    a = {"test": torch.zeros(2, 5, 3), "test_labels": torch.zeros(5, dtype=torch.long)}
    b = {**a, "ood/x": torch.zeros(2, 4, 3)}
    assert stack_members([a, a])["test"].shape == (4, 5, 3)
    with pytest.raises(ValueError, match=r"different sets \(ood/x in one only\)"):
        stack_members([a, b])
    with pytest.raises(ValueError, match="two or more keep_logits dicts"):
        stack_members(a)
    c = {"test": torch.zeros(2, 5, 4), "test_labels": a["test_labels"]}
    with pytest.raises(
        ValueError, match=r"test: member logits of shapes \[\(2, 5, 3\), \(2, 5, 4\)\]"
    ):
        stack_members([a, c])


def _with_config(run, where, old, new):
    copy = _copy(run, where)
    text = (copy / "config.toml").read_text()
    assert old in text
    (copy / "config.toml").write_text(text.replace(old, new))
    return copy


def test_pooled_logits_are_measured_at_the_alpha_calibrators_and_scores_given(runs, tmp_path):
    runs_own = pool_runs(runs)["metrics"]
    given = pool_runs(runs, conformal_alpha=0.3, calibrators=["vector"], ood_scores=["entropy"])
    metrics = given["metrics"]
    assert "test_vs/nll" in metrics and not [k for k in metrics if k.startswith("test_ts/")]
    assert "ood/mnist_5k/entropy/auroc" in metrics and "ood/mnist_5k/energy/auroc" not in metrics
    assert metrics["test/conformal_thr_size"] < runs_own["test/conformal_thr_size"]
    assert metrics["test/nll"] == runs_own["test/nll"]  # the same logits
    # by hand: vector scaling fitted on the pooled validation logits
    kept = stack_members([read_outputs(run) for run in runs])
    fitted = fit_calibrator("vector", kept["val"], kept["val_labels"])
    expected = ensemble_metrics(fitted.apply(kept["test"]).softmax(-1), kept["test_labels"])
    assert metrics["test_vs/nll"] == pytest.approx(expected["nll"], rel=1e-9)


def test_runs_that_differ_only_in_how_they_are_measured_pool(runs, tmp_path, capsys):
    """Calibrators, α and scores do not change the logits: such runs pool, measured as given;
    their settings must then be given (or agree), and copies are still copies."""
    other = _with_config(
        runs[2], tmp_path / "other", "conformal_alpha = 0.1", "conformal_alpha = 0.2"
    )
    with pytest.raises(ValueError, match=r"conformal_alpha 0.1 and 0.2: give.*--alpha"):
        pool_runs([runs[0], runs[1], other])
    pooled = pool_runs([runs[0], runs[1], other], conformal_alpha=0.2)
    assert pooled["metrics"]["test/num_members"] == 3
    copy = _with_config(
        runs[1], tmp_path / "copy", 'calibrators = ["temperature"]', 'calibrators = ["vector"]'
    )
    with pytest.raises(ValueError, match=r"same configuration and seed \(1\).*copies"):
        pool_runs([runs[0], runs[1], copy], calibrators=["vector"])
    assert main(["pool", str(runs[0]), str(runs[1]), "--alpha", "2"]) == 2
    assert "data.conformal_alpha" in capsys.readouterr().err


def test_alpha_or_calibrators_for_runs_without_a_validation_split_are_refused(tmp_path):
    plain = [
        train(_config(tmp_path, seed, "data.validation_examples=0"), progress=False, log=None)
        for seed in (0, 1)
    ]
    assert "test_ts/nll" not in pool_runs(plain)["metrics"]
    with pytest.raises(ValueError, match=r"kept none \(data.validation_examples = 0\)"):
        pool_runs(plain, calibrators=["histogram"])


def test_runs_trained_on_other_machines_pool(runs, tmp_path):
    """Where the data lay and how it was read (data.root, data.num_workers, …) differ from
    machine to machine: such runs pool; a copy under another root is still a copy."""
    moved = _with_config(runs[2], tmp_path / "moved", 'root = ""', 'root = "/mnt/data"')
    text = (moved / "config.toml").read_text()
    (moved / "config.toml").write_text(text.replace("num_workers = -1", "num_workers = 3"))
    assert pool_runs([runs[0], runs[1], moved])["metrics"] == pytest.approx(
        pool_runs(runs)["metrics"], nan_ok=True
    )
    copy = _with_config(runs[1], tmp_path / "copy", 'root = ""', 'root = "/mnt/data"')
    with pytest.raises(ValueError, match=r"same configuration and seed \(1\).*copies"):
        pool_runs([runs[0], runs[1], copy])


def _edit(run, where, **arrays):
    """A copy of ``run`` whose outputs.npz holds ``arrays`` in place of its own."""
    copy = _copy(run, where)
    kept = {**dict(np.load(copy / "outputs.npz")), **arrays}
    np.savez_compressed(copy / "outputs.npz", **kept)
    return copy


def test_a_copy_whose_seed_was_edited_is_refused_as_a_copy(runs, tmp_path):
    """snens pool had pooled a run with a copy whose config.toml said another seed, although
    the two outputs hashes it recorded were equal."""
    copy = _copy(runs[1], tmp_path / "copy")
    text = (copy / "config.toml").read_text()
    (copy / "config.toml").write_text(text.replace("seed = 1", "seed = 7"))
    digest = hashlib.sha256((runs[1] / "outputs.npz").read_bytes()).hexdigest()
    with pytest.raises(ValueError) as err:
        pool_runs([runs[0], runs[1], copy])
    assert str(err.value) == (
        f"{runs[1]} and {copy} kept the same outputs.npz, SHA-256 {digest[:16]}…: one is a copy "
        "of the other, whatever their configs say (a seed edited in a copy's config.toml trains "
        "nothing); pool runs trained apart"
    )
    resaved = _copy(copy, tmp_path / "resaved")  # the same logits, other bytes
    np.savez(resaved / "outputs.npz", **dict(np.load(copy / "outputs.npz")))
    with pytest.raises(ValueError, match="kept equal test logits in their outputs.npz: one is"):
        pool_runs([runs[1], resaved])


def test_logits_of_no_member_nan_logits_and_unsigned_labels(runs, tmp_path):
    """An outputs.npz of 0 members had pooled without a word; a NaN logit had stopped pooling
    with an error naming no run; uint8 labels had ended in a traceback."""
    kept = dict(np.load(runs[1] / "outputs.npz"))
    empty = _edit(runs[1], tmp_path / "empty", test=kept["test"][:0])
    with pytest.raises(ValueError) as err:
        pool_runs([runs[0], empty])
    assert str(err.value) == (
        f"{empty / 'outputs.npz'}: test holds logits of shape (0, 300, 10) (M, N, K): no member, "
        "no example or fewer than 2 classes, so there is nothing to measure; the file is damaged "
        "or not a run's, train the run again to write it"
    )
    bad = kept["test"].copy()
    bad[0, 5, 3] = np.nan
    diverged = _edit(runs[1], tmp_path / "nan", test=bad)
    with pytest.raises(ValueError) as err:
        pool_runs([runs[0], diverged])
    assert str(err.value).startswith(
        f"{diverged / 'outputs.npz'}: test holds 1 logits that are NaN or infinite"
    )
    unsigned = {k: kept[k].astype(np.uint8) for k in kept if k.endswith("_labels")}
    small = _edit(runs[1], tmp_path / "uint8", **unsigned)
    assert pool_runs([runs[0], small])["metrics"] == pytest.approx(
        pool_runs([runs[0], runs[1]])["metrics"], nan_ok=True
    )
    out_of_range = _edit(runs[1], tmp_path / "range", test_labels=kept["test_labels"] + 10)
    with pytest.raises(ValueError, match=r"test_labels holds label \d+, outside the 10 classes"):
        pool_runs([runs[0], out_of_range])


def _inflating_npz(path, inflated_bytes):
    """An outputs.npz whose test logits are ``inflated_bytes`` of zeros: a few kB of file."""
    import io
    import zipfile

    rows = inflated_bytes // (4 * 10)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (1, rows, 10)}
    )
    labels = io.BytesIO()
    np.save(labels, np.zeros(rows, np.int64))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        with archive.open("test.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            zeros = bytes(1 << 20)
            for _ in range(rows * 40 // len(zeros)):
                member.write(zeros)
            member.write(bytes(rows * 40 % len(zeros)))
        archive.writestr("test_labels.npy", labels.getvalue())


def test_an_outputs_npz_inflating_past_its_bound_is_refused_before_inflating(runs, tmp_path):
    """A 7 MB outputs.npz had inflated to 1.85 GB in snens report and snens pool: the cap was
    on the file, not on what it inflates to."""
    from snens.engine.runs import outputs_inflation_limit

    assert outputs_inflation_limit(7 * 10**6) == 256 * 2**20  # the 7 MB file: 1.85 GB refused
    assert outputs_inflation_limit(21 * 10**6) == 32 * 21 * 10**6  # 21 MB: 4.5 GiB refused
    assert outputs_inflation_limit(800 * 10**6) == 4 * 2**30  # ImageNet's 800 MB at M=4
    bomb = _copy(runs[1], tmp_path / "bomb")
    _inflating_npz(bomb / "outputs.npz", 300 * 2**20)
    assert (bomb / "outputs.npz").stat().st_size < 2 * 2**20
    with pytest.raises(
        ValueError, match=r"declares 3\d\d,\d{3},\d{3} bytes once inflated .* above"
    ):
        pool_runs([runs[0], bomb])
