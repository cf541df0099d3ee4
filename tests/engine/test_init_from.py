"""``model.init_from``: a run that starts from a trained single model's network, on real
Fashion-MNIST through the engine (tiny SmallCNN, 1 thread)."""

import dataclasses
import hashlib
import json
import shutil

import pytest
import torch

from snens import data
from snens.engine.build import build_model, read_init_from
from snens.engine.checkpoint import CheckpointError
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.reload import load_run_model
from snens.engine.train import train

TINY = "fashion_mnist_small_cnn_tiny"


def _config(tmp_path, name, *overrides):
    return load_config(
        preset(TINY),
        [
            f"out_dir={json.dumps(str(tmp_path))}",
            f"name={json.dumps(name)}",
            "threads=1",
            "deterministic=true",
            "data.train_examples=2000",
            "data.test_examples=500",
            "data.ood_examples=200",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A single model trained 2 epochs on 2,000 images: the network the others start from."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("init_from")
    config = _config(out, "single", "method.name=single", "method.num_members=1", "optim.epochs=2")
    return out, train(config, progress=False, log=None)


def _images():
    x, _ = data.load_fashion_mnist("test", None, False)
    return (x[:64].float() / 255 - data.FASHION_MNIST_MEAN) / data.FASHION_MNIST_STD


def test_every_member_starts_as_the_trained_network(trained):
    out, source = trained
    single, _, _ = load_run_model(source)
    config = _config(out, "ens", "method.name=snens", f"model.init_from={json.dumps(str(source))}")
    ens = build_model(config, num_classes=10, channels=1, start=read_init_from(config))
    fresh = build_model(config, num_classes=10, channels=1)  # resumed or reloaded: no source
    x = _images()
    with torch.no_grad():
        expected = single.eval()(x)[0]  # (B, K)
        logits = ens.eval()(x)  # (M, B, K)
        other = fresh.eval()(x)
    assert logits.shape == (4, 64, 10)
    for member in logits:
        torch.testing.assert_close(member, expected, rtol=1e-4, atol=1e-4)
    assert (other - expected).abs().max() > 1.0  # the untrained network is far from it
    # "{seed}" reads as the run's seed
    template = json.dumps(str(source.parent / "sin{seed}le"))
    (source.parent / "sin0le").symlink_to(source)
    seeded = _config(out, "s", "method.name=snens", "seed=0", f"model.init_from={template}")
    with torch.no_grad():
        torch.testing.assert_close(
            build_model(seeded, num_classes=10, channels=1, start=read_init_from(seeded)).eval()(x),
            logits,
        )
    with pytest.raises(FileNotFoundError, match=r"sin1le': no run directory"):
        read_init_from(dataclasses.replace(seeded, seed=1))
    # a checkpoint file names the same weights as its run directory
    by_file = _config(
        out, "f", "method.name=snens", f"model.init_from={json.dumps(str(source / 'last.pt'))}"
    )
    with torch.no_grad():
        torch.testing.assert_close(
            build_model(by_file, num_classes=10, channels=1, start=read_init_from(by_file)).eval()(
                x
            ),
            logits,
        )


def test_a_run_started_from_it_resumes_without_it(trained, tmp_path):
    out, source = trained
    start = tmp_path / "source"
    shutil.copytree(source, start)
    init = f"model.init_from={json.dumps(str(start))}"
    lines = []
    config = _config(tmp_path, "ens", "method.name=snens", "optim.epochs=2", "optim.lr=1e-3", init)
    run = train(config, progress=False, log=lines.append)
    # the run records which checkpoint it read: its path and the SHA-256 of its content
    content = (start / "last.pt").read_bytes()
    digest = hashlib.sha256(content[content.index(b"\n") + 1 :]).hexdigest()
    recorded = json.loads((run / "provenance.json").read_text())["init_from"]
    assert recorded == {"checkpoint": str((start / "last.pt").resolve()), "sha256": digest}
    said = f"backbone started from the trained single model of {start} (sha256 {digest[:12]}…)"
    assert said in lines
    whole = json.loads((run / "final.json").read_text())["metrics"]
    scratch = train(
        _config(tmp_path, "scratch", "method.name=snens", "optim.epochs=2", "optim.lr=1e-3"),
        progress=False,
        log=None,
    )
    from_scratch = json.loads((scratch / "final.json").read_text())["metrics"]
    single = json.loads((source / "final.json").read_text())["metrics"]
    # it goes on from the trained network: test NLL measured 1.287 from it, 2.246 from
    # scratch (ln 10 = 2.303: two epochs of a width-4 network from nothing), the single 1.409
    assert whole["test/nll"] < from_scratch["test/nll"] - 0.5
    assert whole["test/nll"] < single["test/nll"]
    # stopped after epoch 1 and the source gone: the resumed run reads its own checkpoint
    shutil.copy(run / "prev.pt", run / "last.pt")
    (run / "final.json").unlink()
    shutil.rmtree(start)
    train(config, resume=True, progress=False, log=None, run_dir=run)
    again = json.loads((run / "final.json").read_text())["metrics"]
    assert again["test/nll"] == pytest.approx(whole["test/nll"], rel=1e-6)


def test_the_source_recorded_is_the_one_read_when_it_is_replaced_meanwhile(trained, tmp_path):
    # The source run goes on training and rewrites its last.pt after this run has read its
    # weights and before it records where they came from: the record names the bytes read.
    out, source = trained
    start = tmp_path / "source"
    shutil.copytree(source, start)
    read = (start / "last.pt").read_bytes()
    digest = hashlib.sha256(read[read.index(b"\n") + 1 :]).hexdigest()
    newer = (start / "prev.pt").read_bytes()  # another single model's checkpoint (epoch 1)
    assert newer != read

    def replace_source(line):
        if line.startswith("run "):  # said once the model is built, before the record
            (start / "last.pt").write_bytes(newer)

    init = f"model.init_from={json.dumps(str(start))}"
    config = _config(tmp_path, "ens", "method.name=snens", "optim.epochs=1", init)
    run = train(config, progress=False, log=replace_source)
    assert (start / "last.pt").read_bytes() == newer  # replaced while the run was starting
    recorded = json.loads((run / "provenance.json").read_text())["init_from"]
    assert recorded == {"checkpoint": str((start / "last.pt").resolve()), "sha256": digest}


def test_what_it_cannot_start_from_is_refused_naming_it(trained, tmp_path):
    out, source = trained
    init = f"model.init_from={json.dumps(str(source))}"
    with pytest.raises(ValueError, match=r"method 'deep_ensemble' builds networks of its own"):
        _config(tmp_path, "x", "method.name=deep_ensemble", init)

    def build(*overrides):
        config = _config(tmp_path, "x", "method.name=snens", *overrides)
        return build_model(config, num_classes=10, channels=1, start=read_init_from(config))

    with pytest.raises(FileNotFoundError, match=r"model.init_from '.*nowhere': no run directory"):
        build(f"model.init_from={json.dumps(str(tmp_path / 'nowhere'))}")
    with pytest.raises(
        ValueError, match=r"model.options \{'width': 4\} there, \{'width': 8\} here"
    ):
        build(init, "model.options={width=8}")
    # a run of another method: not one network to start from
    ens = train(
        _config(tmp_path, "ens", "method.name=snens", "optim.epochs=1"), progress=False, log=None
    )
    with pytest.raises(ValueError, match=r"is a run of method 'snens'; it must be a single-model"):
        build(f"model.init_from={json.dumps(str(ens))}")
    # a damaged checkpoint is caught before anything is loaded
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    raw = bytearray((broken / "last.pt").read_bytes())
    raw[-100] ^= 0xFF
    (broken / "last.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"digest mismatch"):
        build(f"model.init_from={json.dumps(str(broken))}")
    # an unfinished source (its checkpoint at epoch 1 of 2, no final.json) is said, not silent
    unfinished = tmp_path / "unfinished"
    shutil.copytree(source, unfinished)
    shutil.copy(unfinished / "prev.pt", unfinished / "last.pt")  # the epoch-1 checkpoint
    (unfinished / "final.json").unlink()
    with pytest.warns(
        UserWarning, match=r"source run is unfinished, its checkpoint is at epoch 1 of 2"
    ):
        build(f"model.init_from={json.dumps(str(unfinished))}")
