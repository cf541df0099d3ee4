"""The numbers a reviewer looks at, for src/snens: module sizes, the most complex functions
(McCabe, as ruff's C901 counts it) with their lengths, and repeated code (the ``duplicates``
tool, where it is installed).

    python scripts/code_metrics.py [--top 12] [--min-complexity 12]

Prints Markdown; writes nothing.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "snens"


def module_sizes() -> list[tuple[int, str]]:
    """(lines, path) of every module, largest first."""
    sizes = [
        (len(path.read_text(encoding="utf-8").splitlines()), str(path.relative_to(SRC.parent)))
        for path in SRC.rglob("*.py")
    ]
    return sorted(sizes, reverse=True)


def _function_lengths() -> dict[tuple[str, int], int]:
    """(path, first line) → lines of every function and method."""
    out = {}
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out[(str(path.relative_to(SRC.parent)), node.lineno)] = (
                    node.end_lineno - node.lineno + 1
                )
    return out


def complexities(minimum: int) -> list[tuple[int, str, str, int]]:
    """(complexity, function, path:line, lines) above ``minimum``, most complex first."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        raise SystemExit("ruff is needed (pip install ruff)")
    result = subprocess.run(
        [
            ruff,
            "check",
            "--select",
            "C901",
            "--config",
            f"lint.mccabe.max-complexity={minimum}",
            "--output-format",
            "json",
            "--no-cache",
            str(SRC),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    lengths = _function_lengths()
    out = []
    for item in json.loads(result.stdout or "[]"):
        match = re.match(r"`(.+)` is too complex \((\d+) > \d+\)", item["message"])
        if not match:
            continue
        path = str(Path(item["filename"]).resolve().relative_to(SRC.parent))
        line = item["location"]["row"]
        out.append((int(match[2]), match[1], f"{path}:{line}", lengths.get((path, line), 0)))
    return sorted(out, reverse=True)


def duplicate_pairs() -> str | None:
    """The ``duplicates`` tool's summary line over src/, or None where it is not installed."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    result = subprocess.run(
        [tool, "--most", "1"], cwd=SRC.parent, capture_output=True, text=True, check=False
    )
    return next((line for line in result.stdout.splitlines() if "pairs of places" in line), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=12, help="modules to list")
    parser.add_argument("--min-complexity", type=int, default=12, help="list functions above")
    args = parser.parse_args(argv)
    sizes = module_sizes()
    print(f"**src/snens**: {len(sizes)} modules, {sum(n for n, _ in sizes):,} lines\n")
    print("| lines | module |\n|---:|---|")
    for n, path in sizes[: args.top]:
        print(f"| {n} | `{path}` |")
    print("\n| complexity | lines | function |\n|---:|---:|---|")
    for complexity, name, where, lines in complexities(args.min_complexity):
        print(f"| {complexity} | {lines} | `{name}` ({where}) |")
    pairs = duplicate_pairs()
    print(f"\nduplicates: {pairs if pairs else 'the duplicates tool is not installed here'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
