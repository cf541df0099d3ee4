"""Checkpoints: exact round trip, truncation and tampering caught, no code run, atomic saves."""

import copy
import errno
import functools
import hashlib
import io
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import snens
import snens.engine.runs
from snens.engine.checkpoint import (
    CheckpointError,
    check_training_state,
    checkpoint_digest,
    load_checkpoint,
    load_checkpoint_with_digest,
    load_model_state,
    load_training_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from snens.engine.runs import RunDirError, check_writable

from conftest import TinyResNet


def _state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": {"last_epoch": 3, "base_lrs": [0.1]},
        "rng": rng_state(),
        "epoch": 2,
        "step": 40,
        "config": {"seed": seed, "optim": {"lr": 0.1, "milestones": [1, 2]}, "name": ""},
    }


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_round_trip_is_exact(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path / "last.pt", state)
    _assert_same(load_checkpoint(path), state)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left


def test_rng_states_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(saved)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_previous_checkpoint_is_kept(tmp_path):
    save_checkpoint(tmp_path / "last.pt", _state(0))
    save_checkpoint(tmp_path / "last.pt", _state(1))
    assert load_checkpoint(tmp_path / "last.pt")["config"]["seed"] == 1
    assert load_checkpoint(tmp_path / "prev.pt")["config"]["seed"] == 0


def test_truncated_file_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "last.pt", _state())
    data = path.read_bytes()
    for size in (len(data) - 1, len(data) // 2, 40, 0):
        path.write_bytes(data[:size])
        with pytest.raises(CheckpointError, match="truncated|not a snens checkpoint"):
            load_checkpoint(path)


def test_a_length_other_than_the_headers_is_refused_before_the_payload_is_read(tmp_path):
    """A 3 GiB sparse last.pt had been read whole (6.5 GB of memory) to be refused: the
    file's length is compared with its header's before the payload is read."""
    path = save_checkpoint(tmp_path / "last.pt", {"model": {"w": torch.zeros(3)}})
    size = path.stat().st_size
    os.truncate(path, 3 * 2**30)  # sparse: 3 GiB of zeros after the payload, no disk used
    code = (
        "from snens.engine.checkpoint import CheckpointError, load_checkpoint\n"
        "try:\n"
        f"    load_checkpoint({str(path)!r}, required=())\n"
        "except CheckpointError as error:\n"
        "    print(error)\n"
        # VmHWM: this process's own peak; ru_maxrss keeps the forking parent's across exec
        "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    message, peak_kib = result.stdout.strip().splitlines()
    with open(path, "rb") as file:
        payload = size - len(file.readline())
    assert message == (
        f"{path} has trailing bytes: the header says {payload} bytes of payload, the file holds "
        f"{3 * 2**30 - (size - payload)}; use the previous checkpoint (prev.pt) or retrain"
    )
    assert int(peak_kib) < 2**20  # below 1 GiB: the 3 GiB were never read


def test_flipped_byte_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "last.pt", _state())
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="digest mismatch"):
        load_checkpoint(path)


def test_the_digest_is_read_from_the_header_and_names_the_content(tmp_path):
    path = save_checkpoint(tmp_path / "last.pt", _state(0))
    data = path.read_bytes()
    payload = data[data.index(b"\n") + 1 :]
    assert checkpoint_digest(path) == hashlib.sha256(payload).hexdigest()
    state, digest = load_checkpoint_with_digest(path)
    assert digest == hashlib.sha256(payload).hexdigest()
    torch.testing.assert_close(state["model"], load_checkpoint(path)["model"])
    data = bytearray(data)
    data[-10] ^= 0x01  # verified as load_checkpoint verifies
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="digest mismatch"):
        load_checkpoint_with_digest(path)
    other = save_checkpoint(tmp_path / "other.pt", _state(1))
    assert checkpoint_digest(other) != checkpoint_digest(path)
    (tmp_path / "plain.pt").write_bytes(b"PK\x03\x04 a zip archive")
    with pytest.raises(CheckpointError, match="not a snens checkpoint"):
        checkpoint_digest(tmp_path / "plain.pt")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        checkpoint_digest(tmp_path / "missing.pt")


def test_missing_keys_are_refused(tmp_path):
    state = _state()
    del state["optimizer"]
    path = save_checkpoint(tmp_path / "last.pt", state)
    with pytest.raises(CheckpointError, match=r"missing \['optimizer'\]"):
        load_checkpoint(path)
    assert load_checkpoint(path, required=())["epoch"] == 2


class _Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({**_state(), "model": _Payload(marker)}, buffer)
    payload = buffer.getvalue()
    from snens.engine.checkpoint import (
        _header,  # a valid header and digest: only weights_only stops it
    )

    path = tmp_path / "evil.pt"
    path.write_bytes(_header(payload) + payload)
    with pytest.raises(CheckpointError, match="refused to load"):
        load_checkpoint(path)
    assert not marker.exists()

    raw = tmp_path / "raw.pt"  # a plain torch file, as someone might share one
    raw.write_bytes(payload)
    with pytest.raises(CheckpointError, match="not a snens checkpoint"):
        load_checkpoint(raw)
    assert not marker.exists()


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.pt", _state(0))
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, _state(1))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_checkpoint(path)["config"]["seed"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary files


def test_model_state_loads_all_or_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    other = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 5))  # same first layer, other head
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"mismatched.*1\.weight"):
        load_model_state(model, other.state_dict())
    _assert_same(model.state_dict(), before)  # the matching first layer was not copied either
    load_model_state(model, {k: v + 1 for k, v in before.items()})
    torch.testing.assert_close(model[0].bias, before["0.bias"] + 1)


@pytest.mark.parametrize(
    "bad, named",
    [
        (torch.zeros(2, 3).to_sparse(), "torch.sparse_coo tensor, not a dense one"),
        (torch.zeros(2, 3, device="meta"), "on the meta device"),
        ([[0.0] * 3] * 2, "a list, not a tensor"),
        (7, "an int, not a tensor"),
    ],
)
def test_a_model_state_of_the_right_shape_but_unusable_values_loads_nothing(bad, named):
    """A sparse or meta tensor of the right shape passed the check: the tensors before it
    were copied, then load_state_dict raised a raw RuntimeError (a list or int: a TypeError)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: v + 1 for k, v in before.items()}
    state["1.weight"] = bad
    with pytest.raises(
        CheckpointError, match=rf"nothing was loaded. mismatched: \['1\.weight: .*{named}"
    ):
        load_model_state(model, state)
    _assert_same(model.state_dict(), before)


@pytest.mark.parametrize("state", [[1, 2], 3, None])
def test_a_model_state_that_is_not_a_mapping_is_named(state):
    model = nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match="model state is an? .*, not a mapping of tensors"):
        load_model_state(model, state)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_directory_is_a_clear_error(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o555)
    try:
        with pytest.raises(RunDirError, match="not writable"):
            check_writable(directory)
    finally:
        directory.chmod(0o755)


def test_read_only_file_system_is_a_clear_error(tmp_path, monkeypatch):
    """A read-only mount, simulated at the system call: every file creation fails (EROFS)."""
    read_only = tmp_path / "mnt"
    read_only.mkdir()
    real_open = os.open

    def open_(path, *args, **kwargs):
        if str(path).startswith(str(read_only)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(RunDirError, match=r"mnt.*not writable \(Read-only file system\)"):
        check_writable(read_only)
    with pytest.raises(RunDirError, match="not writable"):
        snens.engine.runs.check_new_run(read_only / "run")
    with pytest.raises(OSError, match="Read-only file system"):
        save_checkpoint(read_only / "last.pt", _state())
    assert not [p for p in read_only.rglob("*") if p.is_file()]  # nothing half-written


def test_a_file_in_the_way_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RunDirError, match="not writable"):
        check_writable(blocker / "runs")


# -- faults a red-team run found -------------------------------------------------------------


def test_trailing_bytes_are_named_in_plain_words(tmp_path):
    path = save_checkpoint(tmp_path / "last.pt", _state())
    path.write_bytes(path.read_bytes() + b"extra")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value).startswith(f"{path} has trailing bytes: the header says ")  # not "is has"


@pytest.mark.timeout(20)
def test_a_directory_or_fifo_in_place_of_a_checkpoint_is_refused_naming_it(tmp_path):
    """A directory named last.pt had read as "no checkpoint": the run started again at epoch 1
    and then failed to save, suggesting --resume in a loop. A FIFO would block the reader."""
    (tmp_path / "last.pt").mkdir()
    os.mkfifo(tmp_path / "fifo.pt")
    for name, kind in (("last.pt", "a directory"), ("fifo.pt", "not a regular file (a FIFO")):
        for read in (load_checkpoint, checkpoint_digest):
            with pytest.raises(CheckpointError) as err:
                read(tmp_path / name)
            assert str(err.value).startswith(f"{tmp_path / name} is {kind}"), read
            assert "prev.pt" in str(err.value)


def _trained(
    model: nn.Module, optimizer: str = "adamw", steps: int = 2, no_grad: tuple = ()
) -> dict:
    """A training checkpoint's state of ``model`` after ``steps`` steps, made as snens.engine.train
    makes it: snens.param_groups, the optimizer, a per-step LambdaLR; the parameters named in
    ``no_grad`` get no gradient, so no optimizer state."""
    groups = snens.param_groups(model, 0.01, weight_decay=1e-4)
    opt = (
        torch.optim.AdamW(groups, lr=0.01)
        if optimizer == "adamw"
        else torch.optim.SGD(groups, lr=0.01, momentum=0.9)
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(lambda s, k: k, k=0.5))
    for _ in range(steps):
        model(torch.randn(4, 3, 8, 8)).float().square().mean().backward()
        for name, param in model.named_parameters():
            if name in no_grad:
                param.grad = None
        opt.step()
        schedule.step()
        opt.zero_grad()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "schedule": schedule.state_dict()}  # fmt: skip


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_optimizer_states_of_trained_models_pass_the_check(optimizer):
    """No false alarm: snens.param_groups' order (gamma, no-decay and decay groups, each in
    module order) is found in model.state_dict()'s order, for a plain and a σN-Ens model, also
    where parameters never stepped (no gradient: no state)."""
    torch.manual_seed(0)
    plain = TinyResNet(num_classes=3)
    ensemble = snens.convert(TinyResNet(num_classes=3), 4)
    for model in (plain, ensemble):
        check_training_state(_trained(model, optimizer), "last.pt")
        live = torch.optim.AdamW(snens.param_groups(model, 0.01, weight_decay=1e-4))
        check_training_state(_trained(model, optimizer), "last.pt", live)
    check_training_state(_trained(TinyResNet(3), optimizer, steps=0), "last.pt")  # no state
    some = _trained(TinyResNet(3), optimizer, no_grad=("stem.0.weight", "fc.bias"))
    assert len(some["optimizer"]["state"]) == len(list(plain.parameters())) - 2
    check_training_state(some, "last.pt")


def _adamw_state() -> tuple[dict, nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    model = TinyResNet(num_classes=3)
    state = _trained(model)
    optimizer = torch.optim.AdamW(snens.param_groups(model, 0.01, weight_decay=1e-4), lr=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lambda s, k: k, k=1))
    return state, model, optimizer, schedule


def test_an_optimizer_state_of_the_wrong_shape_is_refused_before_loading(tmp_path):
    """A valid digest over an optimizer state of the wrong shape had failed inside torch.optim
    at the first step of the resumed run."""
    state, _, optimizer, schedule = _adamw_state()
    path = save_checkpoint(tmp_path / "last.pt", {**_state(), **state}, keep_previous=False)
    loaded = load_checkpoint(path)
    index, entry = next(iter(loaded["optimizer"]["state"].items()))
    wrong = torch.zeros(7)
    entry["exp_avg"], entry["exp_avg_sq"] = wrong, wrong
    with pytest.raises(CheckpointError) as err:
        check_training_state(loaded, path)
    assert str(err.value) == (
        f"{path}: the optimizer state of parameter {index} (param group 0) has shape (7,), which "
        "no parameter of the checkpoint's model has at that place, so the file was not written "
        "by this run's training (its digest proves it whole, not its values); resume from "
        "prev.pt (copy it over last.pt) or start the run again"
    )
    before = optimizer.state_dict()
    with pytest.raises(CheckpointError, match=r"has shape \(7,\), the parameter \(8, 3, 3, 3\)"):
        load_training_state(optimizer, schedule, loaded, path)
    _assert_same(optimizer.state_dict(), before)  # nothing was loaded
    entry["exp_avg_sq"] = torch.zeros(3)  # two shapes for one parameter
    with pytest.raises(CheckpointError, match=r"tensors of shapes \[\(3,\), \(7,\)\]"):
        check_training_state(loaded, path)


@pytest.mark.parametrize(
    ("schedule", "named"),
    [
        ({"last_epoch": 2, "base_lrs": [0.01], "lr_lambdas": [{}]}, "base_lrs"),
        ({"last_epoch": "2"}, "last_epoch = '2'"),
        (None, "the schedule state is a NoneType"),
        ("lr_lambdas", "the schedule state is a str"),
        ({"last_epoch": 2, "base_lrs": [0.01] * 2, "lr_lambdas": 5}, "lr_lambdas = 5"),
        ({"last_epoch": 2, "base_lrs": [0.01] * 2, "lr_lambdas": [{}, 1]}, "lr_lambdas"),
        ({"last_epoch": 2, "base_lrs": [0.01, -1], "lr_lambdas": [{}] * 2}, "base_lrs"),
        ({"last_epoch": 2, "base_lrs": [0.01] * 2, "lr_lambdas": [{}] * 2, "optimizer": 1},
         "'optimizer' entry"),
    ],
)  # fmt: skip
def test_a_malformed_schedule_state_is_refused_naming_the_file(tmp_path, schedule, named):
    state, _, optimizer, live_schedule = _adamw_state()
    assert len(state["optimizer"]["param_groups"]) == 2  # decay and no_decay
    state["schedule"] = schedule
    path = tmp_path / "last.pt"
    with pytest.raises(CheckpointError, match=f"^{path}: .*{named}.*prev.pt"):
        check_training_state(state, path)
    with pytest.raises(CheckpointError, match="prev.pt"):
        load_training_state(optimizer, live_schedule, state, path)


def test_a_malformed_optimizer_state_is_refused_naming_the_file(tmp_path):
    state, _, optimizer, schedule = _adamw_state()
    path = tmp_path / "last.pt"
    cases = [
        (lambda o: o.pop("param_groups"), "not torch's mapping of 'state' and 'param_groups'"),
        (lambda o: o["param_groups"][1].update(lr=float("nan")), "group 1: lr = nan"),
        (lambda o: o["param_groups"][0].update(betas=(0.9,)), r"betas = \(0.9,\)"),
        (lambda o: o["param_groups"][0].update(params=["0"]), "group 0 lists no parameter"),
        (lambda o: o["param_groups"][1]["params"].append(0), "list a parameter twice"),
        (lambda o: o["state"].update({99: {}}), "state of parameter 99, which no group lists"),
        (lambda o: o["state"][0].update(exp_avg="x"), "holds exp_avg = str, not a floating"),
    ]
    for damage, named in cases:
        broken = {**state, "optimizer": copy.deepcopy(state["optimizer"])}
        damage(broken["optimizer"])
        with pytest.raises(CheckpointError, match=f"^{path}: .*{named}"):
            check_training_state(broken, path)
        with pytest.raises(CheckpointError, match="prev.pt"):
            load_training_state(optimizer, schedule, broken, path)
    load_training_state(optimizer, schedule, state, path)  # and the intact one loads
    assert schedule.last_epoch == state["schedule"]["last_epoch"] == 2


@pytest.mark.parametrize(
    "digest, size", [(b"0" * 64, b"-5"), (b"abc", b"3")], ids=["negative length", "short digest"]
)
def test_a_header_of_a_negative_length_or_a_short_digest_is_malformed(tmp_path, digest, size):
    """bytes=-5 had been reported as a file with trailing bytes."""
    path = tmp_path / "last.pt"
    path.write_bytes(b"snens-checkpoint 1 sha256=" + digest + b" bytes=" + size + b"\nabc")
    with pytest.raises(CheckpointError, match="malformed header"):
        load_checkpoint(path)
