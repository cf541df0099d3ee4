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
import snens.method.regularizer

ROOT = Path(__file__).resolve().parents[1]
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
SCRIPTS = sorted((ROOT / "docs" / "howto" / "scripts").glob("*.py"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_every_how_to_script_runs(script, tmp_path):
    if script.stem == "llm_peft":
        pytest.importorskip("peft")
    result = subprocess.run(
        [sys.executable, str(script)],
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


@pytest.mark.parametrize(
    "module", [snens.method.ensemble, snens.method.regularizer, snens.evaluation.conformal]
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
        "search.html",
    ):
        assert (html / page).is_file(), page
    config = (html / "reference" / "config.html").read_text()
    assert "method.temperature" in config and "optim.lr" in config  # generated, every key
    assert "data.calibrators" in config and "data.conformal_alpha" in config
    cli = (html / "reference" / "cli.html").read_text()
    assert "--calibrators" in cli and "--alpha" in cli  # snens eval's and snens pool's flags
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
