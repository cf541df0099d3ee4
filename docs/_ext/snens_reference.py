"""Reference pages written from the code when the docs build: never typed by hand.

* ``reference/config.md`` — every key of the run config, from the config dataclasses: section,
  key, type, default and the meaning (the comment beside the field in ``snens.engine.config``);
* ``reference/cli.md`` — every ``snens`` sub-command and option, from the argument parser;
* ``reference/presets.md`` — every preset, as the TOML file ``--print-config`` writes;
* ``study/sections/converged_*.md`` — the converged study's tables of the results page, from
  the committed runs (``results_tables``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import tokenize
import typing
from pathlib import Path

import bench_tables
import results_tables


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the comment lines right above it, then the comment ending its line
    (with the lines below that continue it while a parenthesis is open)."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}  # line: the comment ending it
    standalone: set[int] = set()  # lines that hold nothing but a comment
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        text = token.string.lstrip("#").strip()
        if token.type == tokenize.COMMENT and not text.startswith(("type:", "noqa")):
            comments[token.start[0]] = text
            if token.line.lstrip().startswith("#"):
                standalone.add(token.start[0])
    fields = sorted(
        (node.lineno, node.target.id)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    )
    found: dict[str, str] = {}
    for line, name in fields:
        above, previous = [], line - 1
        while previous in standalone:
            above.insert(0, comments[previous])
            previous -= 1
        ending = [comments[line]] if line in comments and line not in standalone else []
        below = line + 1
        while ending and " ".join(ending).count("(") > " ".join(ending).count(")"):
            if below not in standalone:
                break
            ending.append(comments[below])
            standalone.discard(below)  # a continuation, not the next field's comment
            below += 1
        found[name] = " — ".join(part for part in (" ".join(above), " ".join(ending)) if part)
    return found


def _type_name(hint: object) -> str:
    text = getattr(hint, "__name__", None) or str(hint)
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(hint))
    return text.replace("typing.", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_page() -> str:
    from snens.engine import config as module

    lines = [
        "# Config reference",
        "",
        "Every key of a run config (`snens train --config FILE`, `--set KEY=VALUE`), written "
        "from the config dataclasses of `snens.engine.config` when these pages are built. Values "
        "are checked when a config is built: an unknown key or a wrong type is refused, naming "
        "the key.",
        "",
    ]
    run = module.RunConfig
    sections = [("(top level)", run, "")] + [
        (f"[{f.name}]", f.type if isinstance(f.type, type) else getattr(module, f.type), f.name)
        for f in dataclasses.fields(run)
        if f.name in ("data", "model", "method", "optim")
    ]
    for title, cls, prefix in sections:
        hints = typing.get_type_hints(cls)
        comments = _field_comments(cls)
        lines += [f"## `{title}`" if prefix else "## Top level", ""]
        doc = inspect.getdoc(cls) or ""
        lines += [
            doc.splitlines()[0],
            "",
            "| key | type | default | meaning |",
            "|---|---|---|---|",
        ]
        for f in dataclasses.fields(cls):
            if f.name in ("data", "model", "method", "optim"):
                continue
            if f.default is not dataclasses.MISSING:
                default = repr(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = repr(f.default_factory())
            else:
                default = "—"
            key = f"{prefix}.{f.name}" if prefix else f.name
            meaning = _cell(comments.get(f.name, ""))
            kind = _cell(_type_name(hints[f.name]))
            lines.append(f"| `{key}` | `{kind}` | `{_cell(default)}` | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def cli_page() -> str:
    import argparse

    from snens.engine.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command-line reference",
        "",
        "Written from the `snens` argument parser when these pages are built.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        lines += [f"## `snens {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def presets_page() -> str:
    from snens.engine.config import to_toml
    from snens.engine.presets import PRESETS, preset

    lines = [
        "# Presets",
        "",
        "Every named preset (`snens train --preset NAME`), as the TOML file "
        "`snens train --preset NAME --print-config` writes, from `snens.engine.presets` when "
        "these pages are built.",
        "",
    ]
    for name in PRESETS:
        lines += [f"## `{name}`", "", "```toml", to_toml(preset(name)).rstrip(), "```", ""]
    return "\n".join(lines)


#: The study reports the experiments write under results/, shown as pages of their own.
STUDIES = {
    "converged": "the converged study",
    "llm": "the LLM study",
    "holdout": "the holdout study",
    "fresh": "snens tune on fresh networks",
    "recipes": "the recipes by situation",
    "bench_cpu": "CPU costs",
    "gpu_nvidia-h200": "GPU costs (NVIDIA H200)",
}


def _study_page(source: Path) -> str:
    """A report of ``results/``, its figures' paths made relative to ``docs/study/``."""
    text = source.read_text(encoding="utf-8")
    return re.sub(r"\]\((?!https?:|/|\.\./)([^)]+\.png)\)", r"](../../results/\1)", text)


def _write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf-8") != text:  # unchanged: no rebuild
        path.write_text(text, encoding="utf-8")


def write(docs: Path) -> None:
    out = docs / "reference"
    out.mkdir(exist_ok=True)
    for name, page in (("config", config_page), ("cli", cli_page), ("presets", presets_page)):
        _write(out / f"{name}.md", page() + "\n")
    study = docs / "study"
    study.mkdir(exist_ok=True)
    for name in STUDIES:
        source = docs.parent / "results" / f"{name}.md"
        if source.is_file():
            _write(study / f"{name}.md", _study_page(source))
    sections = study / "sections"  # excluded from the pages (conf.py): included, not listed
    sections.mkdir(exist_ok=True)
    # the converged study's tables of the results page, from its committed runs
    results_tables.write(sections, docs.parent / "results" / "converged")
    # the benchmark tables of the performance page, from the committed record
    bench_tables.write(sections, docs.parent / "results" / "bench_cpu.md")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def literal_formulas(app, what, name, obj, options, lines: list[str]) -> None:
    """Show the formulas of the docstrings as they are written.

    snens' docstrings set a formula apart as an indented block after a paragraph (the Google
    and nanoGPT habit), which reStructuredText would read as a block quote with inline markup
    (``x * y`` as emphasis, ``|x|`` as a substitution). Each such block becomes a literal
    block.
    """
    out: list[str] = []
    starts = (":", "..", "* ", "- ", ">>>", "|")
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        out.append(line)
        if line.strip() or not nxt.strip():
            continue
        prev = next((p for p in reversed(out[:-1]) if p.strip()), None)
        if (
            prev is not None
            and _indent(nxt) > _indent(prev)
            and not prev.rstrip().endswith("::")
            and not prev.lstrip().startswith(starts)
            and not nxt.lstrip().startswith(starts)
        ):
            out += [" " * _indent(prev) + "::", ""]
    # shapes such as (M, *feature_shape) or (M·B, *, D): their stars are not emphasis
    in_literal = False
    for i, line in enumerate(out):
        if line.rstrip().endswith("::"):
            in_literal = True
        elif line.strip() and _indent(line) == 0:
            in_literal = False
        if not in_literal and "*" in line and "**" not in line:
            out[i] = re.sub(
                r"\(([^()]*)\)", lambda m: "(" + m.group(1).replace("*", "\\*") + ")", line
            )
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", literal_formulas, priority=600)
    return {"parallel_read_safe": True}
