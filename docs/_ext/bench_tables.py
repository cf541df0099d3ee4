"""The benchmark tables of the Performance page, copied from the committed record when the docs
build: never typed by hand.

:func:`table` takes a Markdown table of ``results/bench_cpu.md`` by its heading: the ``index``-th
table (the first by default) between that heading and the next heading of any level. A heading
or table that is missing fails the build, naming the file and the heading. :func:`write` writes
each table of :data:`TABLES` to ``bench_<name>.md`` of ``docs/study/sections/``, which
``docs/performance.md`` includes.
"""

from __future__ import annotations

from pathlib import Path

#: Each generated table: its name (``bench_<name>.md``) → (heading, which table under it).
TABLES: dict[str, tuple[str, int]] = {
    "run10": ("## Current record (run 10): the fused member-norm kernels", 0),
    "run10_norms_15": ("## Current record (run 10): the fused member-norm kernels", 1),
    "absolute": ("## Absolute numbers: `snens bench --absolute`", 0),
    "llm": ("## The LLM step: `snens bench --llm`", 0),
    "compile": ("## torch.compile: the compiled σN-Ens step against the compiled single model", 0),
    "compile_llm": (
        "## torch.compile: the compiled σN-Ens step against the compiled single model",
        1,
    ),
    "compile_llm_norms": (
        "## torch.compile: the compiled σN-Ens step against the compiled single model",
        3,
    ),
    "paths": ("## Each hand-written member-norm path, eager", 0),
}


def _is_row(line: str) -> bool:
    return line.lstrip().startswith("|")


def table(path: Path, heading: str, index: int = 0) -> str:
    """The ``index``-th Markdown table under ``heading`` (the heading's whole text, with or
    without its ``#`` marks) of the file ``path``, as its lines with a final newline."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    title = heading.lstrip("#").strip()
    starts = [
        i
        for i, line in enumerate(lines)
        if line.startswith("#") and line.lstrip("#").strip() == title
    ]
    if not starts:
        raise ValueError(f"{path}: no heading {heading!r}")
    tables: list[list[str]] = []
    in_fence = previous_row = False
    for line in lines[starts[0] + 1 :]:
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("#"):
            break  # the next section
        row = not in_fence and _is_row(line)
        if row and previous_row:
            tables[-1].append(line)
        elif row:
            tables.append([line])
        previous_row = row
    # a table: a header row, then a delimiter row of dashes
    found = [t for t in tables if len(t) >= 2 and set(t[1].replace(" ", "")) <= set("|-:")]
    if index >= len(found):
        which = "a table" if index == 0 else f"table {index + 1}"
        raise ValueError(f"{path}: no {which} under the heading {heading!r}")
    return "\n".join(found[index]) + "\n"


def write(sections: Path, record: Path) -> list[Path]:
    """Write each table of :data:`TABLES` from ``record`` (``results/bench_cpu.md``) to
    ``sections/bench_<name>.md`` (a file whose text is unchanged is left alone: no rebuild);
    returns the files' paths."""
    sections.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (heading, index) in TABLES.items():
        text = table(record, heading, index)
        path = sections / f"bench_{name}.md"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
