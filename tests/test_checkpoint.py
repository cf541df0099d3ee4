"""Checkpoints: exact round trip, truncation and tampering caught, no code run, atomic saves."""

import errno
import hashlib
import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import snens.runs
from snens.checkpoint import (
    CheckpointError,
    checkpoint_digest,
    load_checkpoint,
    load_checkpoint_with_digest,
    load_model_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from snens.runs import RunDirError, check_writable


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
    from snens.checkpoint import _header  # a valid header and digest: only weights_only stops it

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
        snens.runs.check_new_run(read_only / "run")
    with pytest.raises(OSError, match="Read-only file system"):
        save_checkpoint(read_only / "last.pt", _state())
    assert not [p for p in read_only.rglob("*") if p.is_file()]  # nothing half-written


def test_a_file_in_the_way_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RunDirError, match="not writable"):
        check_writable(blocker / "runs")
