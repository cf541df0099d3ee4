"""The package plan shows the architecture, and its dependency rule holds: the engine (and the
integrations beside it) import the method and evaluation, never the reverse."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "snens"
#: Packages that must not import the engine (or the integrations): everything below them.
BELOW_THE_ENGINE = ("method", "evaluation", "nn", "metrics", "models", "data", "baselines")
ABOVE = ("snens.engine", "snens.integrations")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("package", BELOW_THE_ENGINE)
def test_the_method_evaluation_and_layers_never_import_the_engine(package):
    offending = {
        str(path.relative_to(SRC)): sorted(n for n in _imports(path) if n.startswith(ABOVE))
        for path in (SRC / package).rglob("*.py")
    }
    assert {k: v for k, v in offending.items() if v} == {}


def test_the_method_never_imports_evaluation():
    """The method is below evaluation: it never imports it."""
    offending = [
        str(p.relative_to(SRC))
        for p in (SRC / "method").rglob("*.py")
        if any(n.startswith("snens.evaluation") for n in _imports(p))
    ]
    assert offending == []


def test_the_top_level_holds_only_the_public_api_and_library_wide_modules():
    """A newcomer finds each part from the folder names: no module sits beside the packages
    but the public API (``__init__``), the ``python -m snens`` entry, the file locks that the
    kernel build and the run directories share, and the one way every layer writes and reads
    files (``files``)."""
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "files.py", "locks.py"]
    packages = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())
    assert packages == [
        "baselines",
        "data",
        "engine",
        "evaluation",
        "integrations",
        "method",
        "metrics",
        "models",
        "nn",
    ]


def test_the_tests_mirror_the_packages_with_unique_file_names():
    """Tests live in the folder of the package they test (tests/method/ for snens.method, …);
    at the top only the checks of the whole package. Names are unique across folders (pytest
    imports test files by their name)."""
    tests = Path(__file__).resolve().parent
    top = sorted(p.name for p in tests.glob("test_*.py"))
    assert top == [
        "test_code_metrics.py",
        "test_files.py",
        "test_fuzz.py",
        "test_layout.py",
        "test_locks.py",
        "test_package.py",
        "test_public_api.py",
    ]
    folders = {p.parent.name for p in tests.rglob("test_*.py") if p.parent != tests}
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert folders - packages == {"docs", "studies"}
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_tests_share_one_conftest():
    """Test files import their shared models with `from conftest import …`; a second conftest.py
    in a folder would be imported under the same module name, and which of the two a test file
    gets would depend on the order a worker collects them in."""
    tests = Path(__file__).resolve().parent
    assert [p.relative_to(tests).as_posix() for p in tests.rglob("conftest.py")] == ["conftest.py"]
