"""Lock files held for a process's lifetime (snens.locks) and the run lock built on them."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from snens import locks
from snens.engine.runs import LOCK, RunDirError, RunInUseError, hold_run

ME = f"{socket.gethostname()} {os.getpid()}"


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    path = tmp_path / "x.lock"
    with locks.hold(path, "the thing"):
        assert locks.holder(path) == ME
        with pytest.raises(locks.LockHeldError) as err, locks.hold(path, "the thing"):
            pass
        assert str(err.value) == (
            f"the thing is in use by {ME} (lock {path}); wait for it to finish, or stop that "
            "process: its lock goes with it"
        )
        assert err.value.holder == ME
    assert not path.exists()  # released and removed
    with locks.hold(path, "the thing"):  # and free again
        pass


HOLDER = textwrap.dedent(
    """
    import sys, time
    from snens import locks
    with locks.hold(sys.argv[1], "the thing"):
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_a_killed_holder_leaves_nothing_that_blocks(tmp_path):
    """SIGKILL mid-hold: the file stays, naming the dead process, but the kernel dropped its
    flock, so the next holder takes it at once (no staleness rule, no waiting)."""
    path = tmp_path / "x.lock"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"held"
        with pytest.raises(locks.LockHeldError, match=f"in use by .* {child.pid} "):
            with locks.hold(path, "the thing"):
                pass
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
    assert locks.holder(path).endswith(f" {child.pid}")  # left behind by the kill
    with locks.hold(path, "the thing"):
        assert locks.holder(path) == ME


# snens.locks alone, loaded by path: without the package's torch import each process starts
# in a fraction of a second
LOAD_LOCKS = (
    "import importlib.util as u; s = u.spec_from_file_location('locks', "
    f"{str(locks.__file__)!r}); locks = u.module_from_spec(s); s.loader.exec_module(locks)"
)
COUNTER = LOAD_LOCKS + textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    lock, counter, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    done = 0
    while done < rounds:
        try:
            with locks.hold(lock, "the counter"):
                value = int(counter.read_text())
                time.sleep(0.0005)  # a window for a second holder to lose an update
                counter.write_text(str(value + 1))
                done += 1
        except locks.LockHeldError:
            time.sleep(0.001)
    """
)


def test_four_processes_never_hold_it_at_once(tmp_path):
    """Read-sleep-write under the lock, 4 processes × 40 rounds: a lost update would show."""
    lock, counter = tmp_path / "c.lock", tmp_path / "counter"
    counter.write_text("0")
    procs = [
        subprocess.Popen([sys.executable, "-c", COUNTER, str(lock), str(counter), "40"])
        for _ in range(4)
    ]
    for proc in procs:
        assert proc.wait(120) == 0
    assert counter.read_text() == "160"
    assert not lock.exists()


def test_without_fcntl_a_dead_processes_lock_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "fcntl", None)
    path = tmp_path / "x.lock"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(f"{socket.gethostname()} {dead.pid}")
    with locks.hold(path, "the thing"):
        assert locks.holder(path) == ME
        with pytest.raises(locks.LockHeldError, match="in use by " + ME):
            with locks.hold(path, "the thing"):
                pass
    path.write_text("another-host 1")  # liveness cannot be checked there: refused
    with pytest.raises(locks.LockHeldError, match="in use by another-host 1"):
        with locks.hold(path, "the thing"):
            pass


def test_the_run_lock_names_the_run_and_its_holder(tmp_path):
    run = tmp_path / "runs" / "a"
    with hold_run(run) as lock:
        assert lock == run / LOCK and locks.holder(lock) == ME
        with pytest.raises(RunInUseError) as err, hold_run(run):
            pass
        assert f"the run {run} is in use by {ME}" in str(err.value)
        assert err.value.holder == ME
    assert sorted(p.name for p in run.iterdir()) == []  # nothing left in the run directory


# -- a lock file that is not one: a link, a FIFO, a second name of another file -------------


def test_a_symlinked_run_lock_is_refused_and_its_target_left_untouched(tmp_path):
    """A red-team run: `run.lock -> /any/file` in a shared run directory made the next
    `snens train --resume` truncate that file and write `host pid` into it."""
    target = tmp_path / "precious.txt"
    target.write_bytes(b"not yours to overwrite\n")
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / LOCK).symlink_to(target)
    with pytest.raises(RunDirError) as err, hold_run(run):
        pass
    assert str(run / LOCK) in str(err.value)
    assert "is a symbolic link, not a lock file" in str(err.value) and "remove it" in str(err.value)
    assert not isinstance(err.value, RunInUseError)  # nobody holds it: it is not a lock
    assert target.read_bytes() == b"not yours to overwrite\n"
    assert (run / LOCK).is_symlink()  # left as it was, for its owner to look at
    assert locks.holder(run / LOCK) is None  # never read through the link either


def test_a_dangling_symlink_is_not_followed_to_create_its_target(tmp_path):
    target = tmp_path / "elsewhere" / "made-by-the-lock"
    target.parent.mkdir()
    (tmp_path / "x.lock").symlink_to(target)
    with pytest.raises(OSError, match="is a symbolic link, not a lock file"):
        with locks.hold(tmp_path / "x.lock", "the thing"):
            pass
    assert not target.exists()


@pytest.mark.timeout(20)
def test_a_fifo_or_hard_linked_lock_is_refused_and_left_untouched(tmp_path):
    fifo = tmp_path / "fifo.lock"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match=r"fifo.lock is not a regular file \(a FIFO"):
        with locks.hold(fifo, "the thing"):
            pass
    assert locks.holder(fifo) is None  # read without blocking: None, not a hang
    other = tmp_path / "other.txt"
    other.write_bytes(b"another name of this file")
    os.link(other, tmp_path / "linked.lock")
    with pytest.raises(OSError, match="linked.lock is a file with 2 names"):
        with locks.hold(tmp_path / "linked.lock", "the thing"):
            pass
    assert other.read_bytes() == b"another name of this file"


def test_without_fcntl_a_symlinked_lock_is_refused_not_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "fcntl", None)
    target = tmp_path / "precious.txt"
    target.write_text(f"{socket.gethostname()} 999999999")  # "a dead process's lock"
    (tmp_path / "x.lock").symlink_to(target)
    with pytest.raises(OSError, match="is a symbolic link, not a lock file"):
        with locks.hold(tmp_path / "x.lock", "the thing"):
            pass
    assert target.read_text() == f"{socket.gethostname()} 999999999"
