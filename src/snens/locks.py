"""Lock files held by a process for as long as it lives: ``fcntl.flock`` on the file.

The kernel drops an ``flock`` when its process ends, however it ends, so a SIGKILL never
leaves a lock that blocks the next run — no staleness rule, no liveness guess. The file names
its holder (``host pid``) for the error message, and the holder removes it on release. Where
``fcntl`` is missing (Windows) a lock is an ``O_EXCL`` file naming its process, taken over when
that process is gone from this host.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LockHeldError", "holder", "hold", "process_alive"]


class LockHeldError(OSError):
    """Another live process holds the lock; ``holder`` says which (``"host pid"``)."""

    def __init__(self, message: str, path: Path, holder: str) -> None:
        super().__init__(message)
        self.path, self.holder = path, holder


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (an owner check for lock files)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0
    return True


def holder(path: str | os.PathLike) -> str | None:
    """The ``"host pid"`` written in a lock file, or None when there is none."""
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None


def _me() -> str:
    return f"{socket.gethostname()} {os.getpid()}"


@contextlib.contextmanager
def hold(path: str | os.PathLike, what: str, *, wait_s: float = 0.0) -> Iterator[Path]:
    """Hold the lock file ``path`` while the block runs.

    Args:
        path: the lock file (its directory must exist).
        what: what the lock guards, for the error message (e.g. ``"run runs/a"``).
        wait_s: how long to wait for another holder to let go (polling every 0.25 s) before
            giving up; 0 = refuse at once.

    Raises:
        LockHeldError: another live process holds it (still, after ``wait_s``); the message
            names that process.
    """
    path = Path(path)
    take = _take_flock if fcntl is not None else _take_exclusive
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = take(path, what)
            break
        except LockHeldError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.25)
    try:
        yield path
    finally:
        # unlink first, then unlock: a process that opened the old file and locks it after we
        # let go sees that its inode is no longer the path's, and tries again
        path.unlink(missing_ok=True)
        os.close(fd)


def _refuse(path: Path, what: str) -> LockHeldError:
    owner = holder(path) or "another process"
    return LockHeldError(
        f"{what} is in use by {owner} (lock {path}); wait for it to finish, or stop that "
        "process: its lock goes with it",
        path,
        owner,
    )


def _take_flock(path: Path, what: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _refuse(path, what) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it between our open and our lock: take the new one
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, _me().encode())
        return fd


def _take_exclusive(path: Path, what: str) -> int:
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        except FileExistsError:
            host, _, pid = (holder(path) or "").partition(" ")
            if host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
                path.unlink(missing_ok=True)  # its process is gone: take it over
                continue
            raise _refuse(path, what) from None
        os.write(fd, _me().encode())
        return fd
    raise _refuse(path, what)
