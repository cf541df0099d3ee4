"""The documentation is tested: the site builds with warnings as errors, every how-to script
runs as a user would run it, and the examples in the main docstrings are doctests."""

import doctest
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import snens
import snens.evaluation.conformal
import snens.method.ensemble
import snens.method.loss
import snens.method.regularizer

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = (
    "snens",
    "nn",
    "metrics",
    "evaluation",
    "data",
    "baselines",
    "models",
    "integrations",
    "engine",
)
HOWTO = ROOT / "docs" / "howto"
SCRIPTS = sorted([*(HOWTO / "scripts").glob("*.py"), *(HOWTO / "scripts").glob("*.sh")])
# scripts that load pretrained models or train real runs (a minute or two each on a CPU)
SLOW_SCRIPTS = {
    "calibrators.sh",
    "llm_peft.py",
    "pretrained_minilm.py",
    "pretrained_mobilenet.py",
    "runs.sh",
    "sweeps.sh",
    "trainer_huggingface.py",
    "trainer_lightning.py",
}
# the `snens` command of this environment first on PATH, for the shell scripts
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
}


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=pytest.mark.slow) if s.name in SLOW_SCRIPTS else s for s in SCRIPTS],
    ids=[s.name for s in SCRIPTS],
)
def test_every_how_to_script_runs(script, tmp_path):
    if script.stem == "llm_peft":
        pytest.importorskip("peft")
    command = ["bash", str(script)] if script.suffix == ".sh" else [sys.executable, str(script)]
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "a how-to script says what it did"


def test_every_how_to_script_is_shown_on_a_page():
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert [s.name for s in SCRIPTS if f"scripts/{s.name}" not in pages] == []
    assert set(SLOW_SCRIPTS) <= {s.name for s in SCRIPTS}


FENCE = re.compile(r"^(```+|~~~+|:::+)\s*(\S*)\s*(.*)$")


def _code_blocks(page: Path) -> list[tuple[str, str, dict[str, str]]]:
    """(kind, argument, options) of every fenced block of a MyST page, nested ones included."""
    blocks, lines = [], page.read_text().splitlines()
    for number, line in enumerate(lines):
        match = FENCE.match(line.strip())
        if not match or not match.group(2):
            continue  # a closing fence, or a fence without an info string
        options = {}
        for option in lines[number + 1 :]:
            found = re.match(r"^\s*:([\w-]+):\s*(.*)$", option)
            if not found:
                break
            options[found.group(1)] = found.group(2).strip().strip('"')
        blocks.append((match.group(2), match.group(3).strip(), options))
    return blocks


@pytest.mark.parametrize("page", sorted(HOWTO.glob("*.md")), ids=lambda p: p.name)
def test_every_how_to_code_block_is_a_script_the_suite_runs(page):
    scripts = {s.name: s for s in SCRIPTS}
    for kind, argument, options in _code_blocks(page):
        if kind == "{toctree}":
            continue
        assert kind == "{literalinclude}", f"{page.name}: a {kind} block no test runs"
        assert argument.startswith("scripts/"), argument
        script = scripts[argument.removeprefix("scripts/")]
        source = script.read_text()
        for marker in ("start-after", "end-before"):
            assert marker not in options or options[marker] in source, (script, options)
        assert options.get("language") == {".py": "python", ".sh": "bash"}[script.suffix]


@pytest.mark.parametrize(
    "module",
    [
        snens.method.ensemble,
        snens.method.loss,
        snens.method.regularizer,
        snens.evaluation.conformal,
    ],
)
def test_docstring_examples_run(module):
    results = doctest.testmod(module, extraglobs={"snens": snens, "torch": torch})
    assert results.attempted > 0 and results.failed == 0


def test_convert_documents_every_parameter_where_it_is_defined():
    doc = inspect.getdoc(snens.convert)
    arguments = doc[doc.index("Args:") : doc.index("Returns:")]
    described = dict(re.findall(r"^    (\w+): (.*)$", arguments, re.MULTILINE))
    assert list(described) == list(inspect.signature(snens.convert).parameters)
    assert [n for n, text in described.items() if text.lower().startswith("see ")] == []


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("furo")
    pytest.importorskip("myst_parser")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-E",
            "-q",
            "-b",
            "html",
            str(ROOT / "docs"),
            str(tmp_path / "html"),
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    html = tmp_path / "html"
    for page in (
        "index.html",
        "reference/api.html",
        *(f"reference/api/{name}.html" for name in API_PAGES),
        "reference/config.html",
        "howto/llm.html",
        "howto/uncertainty.html",
        "study/converged.html",
        "study/recipes.html",
        "study/holdout.html",
        "search.html",
    ):
        assert (html / page).is_file(), page
    config = (html / "reference" / "config.html").read_text()
    assert "method.temperature" in config and "optim.lr" in config  # generated, every key
    assert "data.calibrators" in config and "data.conformal_alpha" in config
    cli = (html / "reference" / "cli.html").read_text()
    assert "--calibrators" in cli and "--alpha" in cli  # snens eval's and snens pool's flags
    assert "snens fetch-data" in cli and "--no-download" in cli
    api = (html / "reference" / "api" / "snens.html").read_text()
    assert 'id="snens.convert"' in api and 'id="snens.tau_for_k"' in api
    # convert's docstring links the conversion it calls, on the page of snens.nn
    assert 'href="nn.html#snens.nn.surgery.convert_modules"' in api
    index = (html / "reference" / "api.html").read_text()
    assert [n for n in API_PAGES if f'href="api/{n}.html"' not in index] == []
    # no method shows torch's docstring for a forward or any method it inherits
    inherited = [
        str(p.relative_to(html))
        for p in html.rglob("*.html")
        if "Define the computation performed at every call" in p.read_text()
    ]
    assert inherited == []


def test_the_performance_page_tables_are_the_benchmark_record_s():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import bench_tables
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    record = ROOT / "results" / "bench_cpu.md"
    rows = bench_tables.table(record, "## Current record (run 10): the fused member-norm kernels")
    rows = rows.splitlines()
    assert rows[0].startswith("| measure | ratio (median) |") and len(rows) == 31
    row = "| member BatchNorm2d fwd+bwd vs plain, same (M·B, …) | 0.877× | 0.72–1.04 |"
    assert rows[2].startswith(row)
    with pytest.raises(ValueError, match="no heading '## Run 99'") as error:
        bench_tables.table(record, "## Run 99")
    assert "bench_cpu.md" in str(error.value)
    page = (ROOT / "docs" / "performance.md").read_text()
    assert [n for n in bench_tables.TABLES if f"study/sections/bench_{n}.md" not in page] == []


def test_the_config_reference_gives_each_key_its_own_comment():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import snens_reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    cells = [
        re.split(r"(?<!\\)\|", line)  # a "\|" inside a cell is no border
        for line in snens_reference.config_page().splitlines()
        if line.startswith("| `")
    ]
    rows = {cell[1].strip().strip("`"): cell[4].strip() for cell in cells}
    # a comment ending a field's line, continued below while its parenthesis is open
    assert rows["data.train_examples"] == (
        "N training examples (image sets: the first N; texts, folders: a fixed random subset, "
        "as they are stored in order); 0 = all"
    )
    # the next field's comment is its own, not the fields' above it run together
    assert rows["data.test_examples"] == "N test examples, chosen as train_examples; 0 = all"
    assert rows["data.validation_examples"].startswith("N training examples held out")
    assert rows["threads"] == "torch CPU threads, 0..MAX_THREADS; 0 = torch's default"
    assert rows["method.name"] == ""  # a type-checker comment is no meaning
