"""Lock files held by a process for as long as it lives: ``fcntl.flock`` on the file.

The kernel drops an ``flock`` when its process ends, so a SIGKILL never leaves a stale lock;
the file names its holder (``host pid``). Without ``fcntl`` (Windows) a lock is an ``O_EXCL``
file, taken over when its process is gone from this host. A lock file that is a link or not a
regular file of one name is refused and left as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LockHeldError", "holder", "hold", "process_alive"]

# never follow a link in the lock file's name, never block opening one (a FIFO would wait)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_MAX_HOLDER_BYTES = 1024


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
    """The ``"host pid"`` written in a lock file, or None (also for anything but a regular
    file, which is never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _MAX_HOLDER_BYTES).decode("utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _me() -> str:
    return f"{socket.gethostname()} {os.getpid()}"


@contextlib.contextmanager
def hold(path: str | os.PathLike, what: str, *, wait_s: float = 0.0) -> Iterator[Path]:
    """Hold the lock file ``path`` (in an existing directory) while the block runs, waiting up to
    ``wait_s`` for another holder to let go; ``what`` the lock guards names it in messages.

    Raises:
        LockHeldError: another live process holds it (after ``wait_s``), named.
        OSError: ``path`` is a link, not a regular file, or a file with other names; it is left
            untouched.
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


def _not_a_lock_file(path: Path, what: str) -> OSError:
    return OSError(
        errno.EINVAL,
        f"{path} is {what}, not a lock file, so it was left as it is; remove it (a lock file is "
        "a plain file that its holder creates and removes), then try again",
    )


def _open_lock(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW | _NONBLOCK, 0o644)
    except OSError as error:
        # ELOOP: O_NOFOLLOW met a link (EMLINK on FreeBSD)
        if error.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise _not_a_lock_file(path, "a symbolic link") from None
        raise


def _check_lock_file(fd: int, path: Path) -> None:
    """Refuse to write ``host pid`` into anything but a regular file of one name."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise _not_a_lock_file(path, "not a regular file (a FIFO, device or socket)")
    if info.st_nlink > 1:
        raise _not_a_lock_file(path, f"a file with {info.st_nlink} names (hard links)")


def _take_flock(path: Path, what: str) -> int:
    while True:
        fd = _open_lock(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _refuse(path, what) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            # lstat: a link put in its place meanwhile is another file, never followed
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it between our open and our lock: take the new one
            os.close(fd)
            continue
        try:
            _check_lock_file(fd, path)
            os.ftruncate(fd, 0)
            os.write(fd, _me().encode())
        except BaseException:
            os.close(fd)
            raise
        return fd


def _take_exclusive(path: Path, what: str) -> int:
    for _ in range(2):
        try:
            fd = _open_lock(path, os.O_CREAT | os.O_EXCL | os.O_RDWR)
        except FileExistsError:
            if os.path.islink(path):  # O_EXCL never follows one: refused, never taken over
                raise _not_a_lock_file(path, "a symbolic link") from None
            host, _, pid = (holder(path) or "").partition(" ")
            if host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
                path.unlink(missing_ok=True)  # its process is gone: take it over
                continue
            raise _refuse(path, what) from None
        os.write(fd, _me().encode())
        return fd
    raise _refuse(path, what)
