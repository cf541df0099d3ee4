"""RELIABILITY.md names, for each guarantee, the tests that pin it: every test named there
exists, so a renamed or deleted test cannot leave a guarantee pinned by nothing."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "RELIABILITY.md"
REFERENCE = re.compile(r"`((?:tests/[\w/]+\.py)?(?:::\w+(?:\[[^\]`]*\])?)?)`")


def _pinned_by() -> list[tuple[str, str]]:
    """Every (test file, test function) the guarantees' last column names; ``::name`` is a
    test of the file named before it in the same cell; a file alone is ``(file, "")``."""
    named = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith("| guarantee"):
            continue
        # two cells; a pipe inside one is escaped (``\\|``), or GitHub splits the cell there
        cells = re.split(r"(?<!\\)\|", line.rstrip().removeprefix("|").removesuffix("|"))
        assert len(cells) == 2, f"a row of {len(cells)} cells (an unescaped |?): {line[:80]}"
        cell = cells[1]
        current = None
        for reference in REFERENCE.findall(cell):
            path, _, test = reference.partition("::")
            current = path or current
            assert current is not None, f"{reference!r} names no file before it: {line[:80]}"
            named.append((current, test.split("[")[0]))
    return named


def test_every_test_pinning_a_guarantee_exists():
    named = _pinned_by()
    assert len(named) > 100  # the table's rows were read, not skipped
    missing = []
    for path, test in named:
        source = ROOT / path
        if not source.is_file():
            missing.append(path)
        elif test and not re.search(rf"^\s*def {test}\(", source.read_text(), re.MULTILINE):
            missing.append(f"{path}::{test}")
    assert not missing, f"RELIABILITY.md names tests that do not exist: {missing}"
