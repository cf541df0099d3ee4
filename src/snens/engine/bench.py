"""``snens bench``: the cost measures of a checkout, ``benchmarks/harness.py``, run from the CLI.

    snens bench --quick                       # or: python benchmarks/bench.py --quick

The harness is not part of the package: an installed package holds none, and ``snens bench``
says so.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["HARNESS_DIR", "load_harness", "main"]

#: Where a checkout of the repository holds the harness: ``benchmarks/`` beside ``src/``.
HARNESS_DIR = Path(__file__).resolve().parents[3] / "benchmarks"


def load_harness() -> ModuleType:
    """The harness of this checkout, ``benchmarks/harness.py``, imported (its folder first on
    ``sys.path``).

    Raises:
        FileNotFoundError: not run from a checkout of the repository.
    """
    if not (HARNESS_DIR / "harness.py").is_file():
        raise FileNotFoundError(
            f"no benchmarks/harness.py in {HARNESS_DIR.parent}: the cost measures run from a "
            "checkout of the repository, and an installed package holds none; clone the "
            "repository, pip install -e . and run snens bench there"
        )
    if str(HARNESS_DIR) not in sys.path:
        sys.path.insert(0, str(HARNESS_DIR))
    return importlib.import_module("harness")


def main(argv: list[str] | None = None) -> int:
    """``snens bench ARGS``: the checkout's harness with ``ARGS``; its exit status, 2 without a
    checkout (said on stderr)."""
    try:
        harness = load_harness()
    except FileNotFoundError as error:
        print(f"snens bench: {error}", file=sys.stderr)
        return 2
    return harness.main(argv)
