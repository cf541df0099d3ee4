"""The numbers a reviewer looks at, for src/snens: module and package sizes, the most complex
functions (McCabe, as ruff's C901 counts it, and radon's where it is installed) with their
lengths, repeated code (the ``duplicates`` tool, where it is installed), the circles of the
import graph (imports inside functions included) and the private names one package of snens
takes from another.

    python scripts/code_metrics.py [--top 12] [--min-complexity 12]

``tests/test_code_metrics.py`` holds the package to no circle and no private name across
packages, but for the sites it lists with their reasons.

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
from dataclasses import dataclass
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


# ---------------------------------------------------------------------------------------------
# The import graph of src/snens: every import statement, at module level or inside a function
# (an import inside a function hides a circle; it does not remove it), except those under
# ``if TYPE_CHECKING:``, which never run.

#: The packages of snens; a module outside them (snens, snens.files, snens.locks) is its own.
PACKAGES = (
    "snens.baselines",
    "snens.data",
    "snens.engine",
    "snens.evaluation",
    "snens.integrations",
    "snens.method",
    "snens.metrics",
    "snens.models",
    "snens.nn",
)


@dataclass(frozen=True)
class Import:
    """One import of a snens module by another: ``names`` the names taken from it (empty for
    ``import a.b``), ``line`` where, ``in_function`` whether it sits inside a function."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int
    in_function: bool


def module_name(path: Path, src: Path = SRC) -> str:
    """``src/snens/evaluation/protocol.py`` → ``snens.evaluation.protocol`` (a package's
    ``__init__.py`` is the package)."""
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The package of :data:`PACKAGES` that holds ``module``, else ``module`` itself."""
    return next((p for p in PACKAGES if module == p or module.startswith(p + ".")), module)


def _modules(src: Path) -> dict[str, Path]:
    return {module_name(path, src): path for path in sorted(src.rglob("*.py"))}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    lines.update(range(child.lineno, child.end_lineno + 1))
    return lines


def _function_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(src: Path = SRC) -> list[Import]:
    """Every import of a snens module by a snens module under ``src`` (see the section's
    comment). ``from a import b`` where ``a.b`` is a module imports ``a.b``; else ``a``."""
    modules = _modules(src)
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip, inside = _type_checking_lines(tree), _function_lines(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skip:
                continue
            where = dict(line=node.lineno, in_function=node.lineno in inside)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        found.append(Import(module, alias.name, (), **where))
                continue
            base = _absolute(node, module, path.name == "__init__.py")
            if base not in modules:
                continue
            names = []
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.append(Import(module, f"{base}.{alias.name}", (), **where))
                else:
                    names.append(alias.name)
            if names:
                found.append(Import(module, base, tuple(names), **where))
    return found


def import_circles(found: list[Import] | None = None) -> list[list[str]]:
    """The circles of the import graph: each strongly connected component of more than one
    module (or a module that imports itself), its modules sorted; the components sorted."""
    found = imports() if found is None else found
    graph: dict[str, set[str]] = {}
    for imp in found:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:  # Tarjan; the graph has a few hundred nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def circle_edges(circle: list[str], found: list[Import] | None = None) -> list[Import]:
    """The imports between the modules of one circle."""
    found = imports() if found is None else found
    members = set(circle)
    return [i for i in found if i.source in members and i.target in members]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(src: Path = SRC) -> list[tuple[str, int, str]]:
    """(importing module, line, what) of every private name one package of snens takes from
    another: a name with a leading underscore imported from, or read as an attribute of, a
    module of another package, or any name from a private module (``snens.metrics._inputs``)
    of another package."""
    modules = _modules(src)
    out = []
    for imp in imports(src):
        if package_of(imp.source) == package_of(imp.target):
            continue
        target_private = any(_private(part) for part in imp.target.split("."))
        if target_private:
            what = ", ".join(imp.names) or "(the module)"
            out.append((imp.source, imp.line, f"{imp.target}: {what}"))
            continue
        for name in imp.names:
            if _private(name):
                out.append((imp.source, imp.line, f"{imp.target}.{name}"))
    # attributes: `from snens.method import ensemble` … `ensemble._batch_size`
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:
                        aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, path.name == "__init__.py")
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if not isinstance(value, ast.Name):
                continue
            root = aliases.get(value.id, value.id if value.id == "snens" else None)
            if root is None:
                continue
            target = ".".join([root, *reversed(chain)])
            if target in modules and package_of(target) != package_of(module):
                out.append((module, node.lineno, f"{target}.{node.attr}"))
    return sorted(set(out))


def private_snens_names(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every private name a file outside the package (``benchmarks/*.py``)
    takes from snens: a name with a leading underscore imported from a snens module or read
    as an attribute of one, or any name from a private module of snens."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "snens":
                    if any(_private(part) for part in alias.name.split(".")):
                        out.append((node.lineno, alias.name))
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "snens":
                continue
            module_private = any(_private(part) for part in node.module.split("."))
            for alias in node.names:
                if module_private or _private(alias.name):
                    out.append((node.lineno, f"{node.module}.{alias.name}"))
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                out.append((node.lineno, ".".join([aliases[value.id], *reversed(chain)])))
    return sorted(set(out))


def package_lines(src: Path = SRC) -> list[tuple[str, int, int]]:
    """(package, modules, lines) of every package of :data:`PACKAGES` and every top-level
    module, largest first."""
    totals: dict[str, list[int]] = {}
    for module, path in _modules(src).items():
        entry = totals.setdefault(package_of(module), [0, 0])
        entry[0] += 1
        entry[1] += len(path.read_text(encoding="utf-8").splitlines())
    return sorted(((p, m, n) for p, (m, n) in totals.items()), key=lambda r: (-r[2], r[0]))


def repeated_helpers(src: Path = SRC, prefixes=("_check_", "resolve_")) -> dict[str, list[str]]:
    """Top-level functions whose name starts with one of ``prefixes`` defined in more than one
    module: name → the modules."""
    seen: dict[str, list[str]] = {}
    for module, path in _modules(src).items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith(prefixes):
                seen.setdefault(node.name, []).append(module)
    return {name: mods for name, mods in sorted(seen.items()) if len(mods) > 1}


def worst_complexity(top: int) -> list[tuple[str, str, int]] | None:
    """radon's ``(rank, function, complexity)`` of the ``top`` most complex functions, or None
    where radon is not installed (the ruff C901 table above measures the same, McCabe)."""
    try:
        from radon.complexity import cc_rank, cc_visit
    except ImportError:
        return None
    blocks = []
    for module, path in _modules(SRC).items():
        for block in cc_visit(path.read_text(encoding="utf-8")):
            blocks.append((block.complexity, f"{module}.{block.fullname}"))
    blocks.sort(reverse=True)
    return [(cc_rank(c), name, c) for c, name in blocks[:top]]


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
    radon = worst_complexity(args.top)
    if radon is None:
        print("\nradon: not installed here (the C901 table above is the McCabe complexity)")
    else:
        print("\n| radon rank | complexity | function |\n|---|---:|---|")
        for rank, name, complexity in radon:
            print(f"| {rank} | {complexity} | `{name}` |")
    print("\n| package | modules | lines |\n|---|---:|---:|")
    for package, count, lines in package_lines():
        print(f"| `{package}` | {count} | {lines:,} |")
    found = imports()
    circles = import_circles(found)
    hidden = sum(i.in_function for i in found)
    print(
        f"\n**import circles**: {len(circles)} (over {len(found)} imports between snens modules, "
        f"{hidden} of them inside functions)"
    )
    for circle in circles:
        print(f"\n- {' ↔ '.join(circle)}")
        for imp in circle_edges(circle, found):
            where = " (inside a function)" if imp.in_function else ""
            print(f"  - {imp.source}:{imp.line} imports {imp.target}{where}")
    private = private_imports()
    print(f"\n**private names across packages**: {len(private)}")
    for module, line, what in private:
        print(f"- {module}:{line}: {what}")
    repeated = repeated_helpers()
    print(f"\n**checks defined in more than one module**: {len(repeated)}")
    for name, modules in repeated.items():
        print(f"- `{name}`: {', '.join(modules)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
