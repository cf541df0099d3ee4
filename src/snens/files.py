"""Files written and read one way: never through a link, never more than was meant.

**Writing.** Every file snens writes goes through :func:`write_bytes` (or :func:`open_atomic`):
a temporary ``.<name>.<random>.tmp`` beside the destination, created with ``O_CREAT | O_EXCL |
O_NOFOLLOW``, is written, fsynced, renamed over the destination (``os.link`` when
``exclusive``) and the directory fsynced; a failure leaves the destination as it was.
:func:`open_append` appends to a regular file, never a link; a library that writes a directory
itself writes into :func:`staged_directory`. ``tests/test_files.py`` fails on a write site that
bypasses these.

**Reading.** :func:`read_bytes` opens with ``O_NOFOLLOW | O_NONBLOCK`` and checks by ``fstat``
for a regular file of at most ``limit`` bytes before a byte is read; :func:`inside` refuses a
name that leads out of its directory; :func:`load_npz` bounds what an ``.npz`` inflates to.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import shutil
import stat
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

__all__ = [
    "FileRefusedError",
    "check_writable",
    "file_kind",
    "fsync_directory",
    "inside",
    "load_npz",
    "open_append",
    "open_atomic",
    "open_regular",
    "plain_mode",
    "read_bytes",
    "remove_stale_temporaries",
    "savez",
    "sha256",
    "staged_directory",
    "write_bytes",
    "write_text",
]

# Where the platform has them (not Windows): never follow a link in a file's last component,
# never block opening one (a FIFO opened for reading waits for a writer).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)
# A file name holds at most 255 bytes (NAME_MAX): the temporary's ".<name>.<16 hex>.tmp" keeps
# 200 bytes of the name, so a destination of a long name still gets a temporary beside it.
_NAME_KEPT = 200
_CHUNK = 1 << 20


class FileRefusedError(OSError):
    """A file snens will not read or write (a link, a special file, too large, …); the message
    names it and the fix, ``errno`` says which (``ELOOP``, ``EFBIG``, ``EINVAL``)."""

    def __init__(self, message: str, code: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.errno = code


def fsync_directory(directory: str | os.PathLike) -> None:
    """fsync ``directory`` (makes a rename in it durable); a no-op where the platform cannot."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temporary(path: Path, mode: int | None) -> tuple[int, Path]:
    """A new file beside ``path`` under a unique name, opened ``O_EXCL | O_NOFOLLOW``."""
    stem = os.fsencode(path.name)[:_NAME_KEPT].decode(errors="ignore") or "file"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY
    for _ in range(100):  # 64 random bits: a clash is a planted name, tried again
        tmp = path.with_name(f".{stem}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o600 if mode is None else mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")


def _cannot_write(path: Path, error: OSError) -> OSError:
    named = type(error)(error.errno, f"cannot write {path}: {error.strerror or error}")
    named.__cause__ = error
    return named


@contextlib.contextmanager
def open_atomic(
    path: str | os.PathLike, *, exclusive: bool = False, mode: int | None = None
) -> Iterator[IO[bytes]]:
    """A binary file whose content becomes ``path`` (in an existing directory), whole, when the
    block ends without error; only where nothing is at ``path`` with ``exclusive``; with the
    permission bits ``mode`` (default ``0o600``).

    Raises:
        FileExistsError: ``exclusive`` and something is at ``path``.
        OSError: the file cannot be written; the message names ``path``, left as it was.
    """
    path = Path(path)
    try:
        fd, tmp = _temporary(path, mode)
    except OSError as error:
        raise _cannot_write(path, error) from error
    try:
        if mode is not None and hasattr(os, "fchmod"):
            os.fchmod(fd, mode)  # the umask had cut the bits os.open was given
        with os.fdopen(fd, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(error, OSError) and not isinstance(error, FileExistsError):
            raise _cannot_write(path, error) from error
        raise
    fsync_directory(path.parent)


def write_bytes(
    path: str | os.PathLike, data: bytes, *, exclusive: bool = False, mode: int | None = None
) -> Path:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, whole, and a
    link at ``path`` (or at any name the write uses) is never followed; as :func:`open_atomic`.

    Returns:
        ``path`` as a Path.

    Raises:
        FileExistsError, OSError: as :func:`open_atomic`.
    """
    with open_atomic(path, exclusive=exclusive, mode=mode) as file:
        file.write(data)
    return Path(path)


def write_text(
    path: str | os.PathLike,
    text: str,
    *,
    exclusive: bool = False,
    mode: int | None = None,
    errors: str = "strict",
) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8 (``errors`` as ``str.encode`` takes it)."""
    return write_bytes(path, text.encode("utf-8", errors), exclusive=exclusive, mode=mode)


def savez(path: str | os.PathLike, arrays: Mapping[str, Any], *, mode: int | None = None) -> Path:
    """``np.savez_compressed`` of ``arrays`` (NumPy arrays, tensors or scalars) to ``path``
    through :func:`write_bytes`."""
    import numpy as np

    def numpy(value: Any) -> Any:
        return value.numpy() if hasattr(value, "numpy") and hasattr(value, "detach") else value

    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{k: numpy(v) for k, v in arrays.items()})
    return write_bytes(path, buffer.getvalue(), mode=mode)


def plain_mode(path: str | os.PathLike) -> int:
    """The permission bits of the present file at ``path``, or ``0o666`` less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The umask, read from /proc (setting it to read it would race other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _refused(path: Path, what: str, fix: str) -> FileRefusedError:
    return FileRefusedError(f"{path} is {what}, so it was left as it is; {fix}")


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``"a FIFO"``)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_nofollow(path: Path, flags: int, perm: int = 0o666) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW | _NONBLOCK | _BINARY, perm)
    except OSError as error:
        # ELOOP: O_NOFOLLOW met a link (EMLINK on FreeBSD)
        if error.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise FileRefusedError(
                f"{path} is a symbolic link, so it was neither followed nor changed; remove it "
                "(snens writes this file itself, in place), then try again",
                errno.ELOOP,
            ) from None
        raise


def _kind_if_not_regular(path: Path) -> str | None:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


def open_append(path: str | os.PathLike, *, truncate: bool = False) -> IO[bytes]:
    """``path`` opened to append bytes (created if missing, emptied first with ``truncate``),
    never through a link.

    Returns:
        A binary file object, positioned at the end; the caller closes it.

    Raises:
        FileRefusedError: a link, not a regular file, or a file with other names (hard links).
        OSError: it cannot be opened; the message names it.
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    try:
        fd = _open_nofollow(path, flags)
    except FileRefusedError:
        raise
    except OSError as error:
        # a FIFO without a reader (ENXIO), a directory (EISDIR): named as what it is
        if kind := _kind_if_not_regular(path):
            raise _refused(path, kind, "move it away, then try again") from None
        raise _cannot_write(path, error) from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refused(path, file_kind(info.st_mode), "move it away, then try again")
        if info.st_nlink > 1:
            raise _refused(
                path,
                f"a file with {info.st_nlink} names (hard links)",
                "appending would change the other names' file too; move it away, then try again",
            )
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def staged_directory(directory: str | os.PathLike, *, last: str | None = None) -> Iterator[Path]:
    """A private empty directory (mode ``0o700``, inside ``directory``) for a writer that writes
    files by name, whose files replace their namesakes in ``directory`` when the block ends
    without error; on an error (a full disk while writing) nothing is moved.

    ``last`` names the file that marks a save complete: where the writer wrote it, its namesake
    in ``directory`` is removed before anything moves and it moves in after the rest, so a kill
    while moving leaves no marker beside a mix of two saves.

    Raises:
        FileRefusedError: the writer left a link, FIFO or device (not moved).
        OSError: ``directory`` cannot be created or written; the message names it.
    """
    import tempfile

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging.", suffix=".tmp", dir=directory))
    except OSError as error:
        raise _cannot_write(directory, error) from error
    try:
        yield staging
        if last is not None and os.path.lexists(staging / last):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / last)
            fsync_directory(directory)
        _move_contents(staging, directory, last)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_contents(source: Path, destination: Path, last: str | None = None) -> None:
    entries = sorted(os.scandir(source), key=lambda e: (e.name == last, e.name))
    for entry in entries:
        target = destination / entry.name
        if entry.is_symlink():
            raise _refused(
                source / entry.name, "a symbolic link", "the save was not moved into place"
            )
        if entry.is_dir(follow_symlinks=False):
            if os.path.islink(target) or (os.path.lexists(target) and not target.is_dir()):
                raise _refused(target, "not a directory", "move it away, then save again")
            target.mkdir(exist_ok=True)
            _move_contents(Path(entry.path), target)
            continue
        if not entry.is_file(follow_symlinks=False):
            raise _refused(
                source / entry.name, "not a regular file", "the save was not moved into place"
            )
        try:
            os.replace(entry.path, target)
        except OSError as error:
            raise _cannot_write(target, error) from error
    fsync_directory(destination)


def check_writable(directory: str | os.PathLike) -> None:
    """Prove ``directory`` writable: a probe file written, fsynced and removed there.

    Raises:
        OSError: it cannot be written (read-only file system, permissions, a full disk).
    """
    fd, probe = _temporary(Path(directory) / ".snens-write-test", None)
    try:
        os.write(fd, b"snens")
        os.fsync(fd)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files a killed writer left in ``directory`` (``.<name>.<random>
    .tmp``); return them. Call it only where no other process writes (a run being resumed): a
    live writer's temporary file looks the same. Links and directories are left alone."""
    removed = []
    for tmp in Path(directory).glob(".*.tmp"):
        if tmp.is_file() and not tmp.is_symlink():
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def open_regular(path: str | os.PathLike, *, follow_links: bool = False) -> int:
    """A read-only descriptor of the regular file ``path``, opened without blocking;
    ``follow_links`` follows a link in the last component (a path given by hand).

    Raises:
        FileNotFoundError: nothing at ``path``.
        FileRefusedError: a link (unless ``follow_links``), a directory, FIFO, socket or
            device; the message names it.
        OSError: it cannot be opened; the message names it.
    """
    path = Path(path)
    flags = os.O_RDONLY | _NONBLOCK | _BINARY | (0 if follow_links else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        missing = FileNotFoundError(f"no file at {path}")
        missing.errno = errno.ENOENT
        raise missing from None
    except OSError as error:
        # a link (ELOOP under O_NOFOLLOW), or a directory where opening one fails (Windows)
        if kind := _kind_if_not_regular(path):
            raise _not_readable(path, kind) from None
        raise type(error)(error.errno, f"cannot read {path}: {error.strerror}") from error
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_readable(path, file_kind(mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_readable(path: Path, what: str) -> FileRefusedError:
    return FileRefusedError(
        f"{path} is {what}, not a regular file, so it was not read (a link could lead anywhere "
        "and a FIFO would block): replace it with the file itself, or move it away",
        errno.ELOOP if what == "a symbolic link" else errno.EINVAL,
    )


def read_bytes(
    path: str | os.PathLike, *, limit: int, follow_links: bool = False, what: str = "file"
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, checked before a byte
    is read; ``follow_links`` as :func:`open_regular`, ``what`` names the file in messages.

    Raises:
        FileNotFoundError: nothing at ``path``.
        FileRefusedError: not a regular file, above ``limit`` bytes, or grown past it while
            being read.
        OSError: a read that failed; the message names it.
    """
    path = Path(path)
    fd = open_regular(path, follow_links=follow_links)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise FileRefusedError(
                f"{path} holds {size:,} bytes, above the limit of {limit:,} for a {what}, so it "
                "was not read: move it away, or restore the file that belongs there",
                errno.EFBIG,
            )
        chunks, read = [], 0
        while chunk := os.read(fd, min(_CHUNK, limit + 1 - read)):
            chunks.append(chunk)
            read += len(chunk)
            if read > limit:
                raise FileRefusedError(
                    f"{path} grew past {limit:,} bytes while being read", errno.EFBIG
                )
        return b"".join(chunks)
    except FileRefusedError:
        raise
    except OSError as error:
        raise type(error)(error.errno, f"cannot read {path}: {error.strerror}") from error
    finally:
        os.close(fd)


def sha256(path: str | os.PathLike, *, limit: int, follow_links: bool = False) -> str:
    """The SHA-256 of the regular file ``path``, read in blocks, with :func:`read_bytes`' checks.

    Raises:
        The errors of :func:`read_bytes`.
    """
    import hashlib

    path = Path(path)
    fd = open_regular(path, follow_links=follow_links)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise FileRefusedError(
                f"{path} holds {size:,} bytes, above the limit of {limit:,}, so it was not read",
                errno.EFBIG,
            )
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def inside(directory: str | os.PathLike, name: str) -> Path:
    """``directory / name`` for a ``name`` read from a file, refused where it leads out of
    ``directory``; the file itself may be a link (a Hub snapshot links to its blobs).

    Raises:
        ValueError: ``name`` is not a plain relative name inside ``directory``.
    """
    directory = Path(directory)
    parts = Path(name).parts if isinstance(name, str) and name else ()
    bad = (
        not parts
        or Path(name).is_absolute()
        or Path(name).drive
        or any(part in ("..", "") for part in parts)
        or "\x00" in name
    )
    if not bad:
        folder = (directory / name).parent.resolve()
        bad = not folder.is_relative_to(directory.resolve())
    if bad:
        raise ValueError(
            f"{name!r} names a file outside {directory}, so it was not read: a save names its "
            "files by their plain names in its own directory; the file naming it is damaged or "
            "was made to read elsewhere"
        )
    return directory / name


def load_npz(data: bytes, *, name: str | os.PathLike, limit: int) -> dict[str, Any]:  # numpy arrays
    """The arrays of an ``.npz`` archive's bytes ``data`` (from the file ``name``), inflated
    only after what every member declares (and its ``.npy`` header promises) was checked
    against ``limit`` bytes.

    Returns:
        ``{name: numpy array}``; pickled arrays are refused.

    Raises:
        ValueError: not an npz archive, damaged, a member of another kind, or inflating past
            ``limit``; the message names the file and the member.
    """
    import numpy as np
    from numpy.lib import format as npy

    def bad(why: str) -> ValueError:
        return ValueError(f"{name} is not a readable npz archive of arrays ({why})")

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, EOFError, ValueError, OSError) as error:
        raise bad(str(error) or type(error).__name__) from None
    total = sum(info.file_size for info in members)
    if total > limit:
        largest = max(members, key=lambda info: info.file_size)
        raise ValueError(
            f"{name} declares {total:,} bytes once inflated (its largest member, "
            f"{largest.filename}, {largest.file_size:,}), above the limit of {limit:,}: it was "
            "not inflated; a file snens wrote inflates to a few times its size at most, so this "
            "one is damaged or not snens's"
        )
    out = {}
    with archive:
        for info in members:
            key = info.filename.removesuffix(".npy")
            if not info.filename.endswith(".npy") or info.is_dir():
                raise bad(f"member {info.filename!r} is not an .npy array")
            try:
                with archive.open(info) as member:
                    version = npy.read_magic(member)
                    read_header = (
                        npy.read_array_header_1_0
                        if version == (1, 0)
                        else npy.read_array_header_2_0
                    )
                    shape, fortran, dtype = read_header(member)
                    if dtype.hasobject:
                        raise bad(f"member {key!r} holds Python objects (a pickle), refused")
                    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if size != info.file_size - member.tell():
                        raise bad(
                            f"member {key!r}'s header promises {size:,} bytes of data, the "
                            f"archive holds {info.file_size - member.tell():,}"
                        )
                with archive.open(info) as member:
                    out[key] = npy.read_array(member, allow_pickle=False)
            except ValueError as error:
                if str(error).startswith(str(name)):
                    raise
                raise bad(f"member {key!r}: {error}") from None
            except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError) as error:
                raise bad(f"member {key!r}: {error}") from None
    return out
