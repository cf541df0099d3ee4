"""scripts/gpu_check.sh at tiny sizes on the CPU: every section runs and lands in the report.

The GPU machine runs the same script at full sizes; this keeps its commands and flags working.
One run takes 2–4 minutes of wall time on a 2-core machine that other jobs keep busy (225 s at a
load average of ~10).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
HEADINGS = (
    "## 1. environment",
    "## 2. CUDA tests",
    "## 3. snens bench ratios",
    "## 4. snens bench --absolute",
    "## 5. torch.compile",
    "## 6. multi-GPU (NCCL)",
    "## 7. profile",
    "## Issue 51: the rows of its table",
    "## Summary",
)
# The sections' own limits add up to 1,200 s at tiny sizes; this only stops a hang.
TIMEOUT_S = 1300


def _gpu_check(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.slow
def test_every_section_runs_on_the_cpu_and_is_reported(tmp_path):
    report_path = tmp_path / "gpu_cpu.md"
    result = _gpu_check("--device", "cpu", "--tiny", "--out", str(report_path))
    report = report_path.read_text()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:] + report[-4000:]

    for heading in HEADINGS:
        assert f"\n{heading}\n" in report, heading
    assert re.search(r"^- device: cpu \(", report, re.MULTILINE), report[:1000]
    assert f"torch {torch.__version__}" in report
    assert "FAILED" not in report

    # a ratio row of the bench: "| member BatchNorm2d fwd+bwd vs plain, … | 1.043× | …"
    bench = report.split("## 3. snens bench ratios")[1].split("## 4.")[0]
    ratios = [float(r) for r in re.findall(r"^\| [^|]+ \| (\d+\.\d{3})× \|", bench, re.MULTILINE)]
    assert ratios and all(r > 0 for r in ratios), bench[-3000:]
    # the LLM rows: SmolLM2's architecture, random weights, one layer at tiny sizes
    assert re.search(
        r"^\| SmolLM2 \(1 layers, T=8\): σN-Ens-LoRA step \(B=2\) vs one LoRA "
        r"model at M·B \| \d+\.\d{3}× \|",
        bench,
        re.MULTILINE,
    ), bench[-3000:]
    absolute = report.split("## 4. snens bench --absolute")[1].split("## 5.")[0]
    assert re.search(r"^\| σN-Ens \| [\d,]+ \| [\d,]+ \|", absolute, re.MULTILINE), absolute
    # the compiled row (eager against eager at tiny sizes: compilation is off)
    compiled = report.split("## 5. torch.compile")[1].split("## 6.")[0]
    assert re.search(
        r"^\| cnn: compiled σN-Ens step \(B=2\) vs compiled single at M·B=4 \| \d+\.\d{3}× \|",
        compiled,
        re.MULTILINE,
    ), compiled
    # issue 51's rows, gathered: the norms and the LLM step with and without the Triton path
    issue = report.split("## Issue 51: the rows of its table")[1].split("## Summary")[0]
    for row in (
        "member LayerNorm fwd+bwd vs plain, bf16",
        "member LlamaRMSNorm fwd+bwd, (M·B·T, 576)",
        "SmolLM2-LoRA σN-Ens step vs one LoRA model at M·B",
    ):
        assert re.search(
            rf"^\| {re.escape(row)} \| \d+\.\d{{3}}× \| \d+\.\d{{3}}× \|", issue, re.M
        ), (
            row,
            issue,
        )
    assert re.search(r"^\| resnet18 σN-Ens step at B=8 vs one model at M·B \| \d", issue, re.M)
    assert "skipped (no CUDA device)" in report.split("## 2. CUDA tests")[1]
    assert "NCCL not checked" in report.split("## 6. multi-GPU (NCCL)")[1]
    # the profile: both pairs, with their ratio and the operators that differ
    profile = report.split("## 7. profile")[1].split("## Summary")[0]
    ratio = r"^ratio σN-Ens / floor: \d+\.\d{3} \(wall\), \d+\.\d{3} \(CPU\)$"
    assert len(re.findall(ratio, profile, re.MULTILINE)) == 2, profile
    assert profile.count("largest differences, σN-Ens − floor (CPU µs per step)") == 2


def test_failed_sections_are_reported_and_the_run_goes_on(tmp_path):
    """A Python whose every ``-m`` command and script fails: sections 2-5 and 7 fail, each is
    written with its command and output, the environment section still passes, and the exit
    status is 1."""
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ $1 == -m || $1 == *.py ]]; then echo "no module run here: $*" >&2; exit 3; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    report_path = tmp_path / "gpu_cpu.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": str(python)}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--device", "cpu", "--out", str(report_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = report_path.read_text()
    summary = report.split("## Summary")[1]
    assert "| 1. environment | passed |" in summary
    section_3 = (
        "snens bench --quick exited 3; SNENS_TRITON=0 snens bench --norms-only exited 3; "
        "snens bench --llm exited 3; SNENS_TRITON=0 snens bench --llm"
    )
    for section, command in [
        ("2. CUDA tests", "pytest -m cuda"),
        ("3. snens bench ratios", section_3),
        ("4. snens bench --absolute", "snens bench --absolute (ResNet-18)"),
        ("5. torch.compile", "benchmarks/compile_step.py"),
        ("7. profile", "benchmarks/profile_steps.py"),
    ]:
        assert f"| {section} | FAILED: {command} exited 3 |" in summary, summary
    assert report.count("no module run here: -m ") == 6  # section 3 runs four commands
    assert report.count("no module run here: benchmarks/profile_steps.py") == 1
    assert report.count("no module run here: benchmarks/compile_step.py") == 1
    # the issue's rows are there, empty: no section measured them
    issue = report.split("## Issue 51: the rows of its table")[1]
    assert "| SmolLM2-LoRA σN-Ens step vs one LoRA model at M·B | — | — | ≤1.05× |" in issue
    assert "| 6. multi-GPU (NCCL) | no GPU: NCCL not checked |" in summary


def test_a_bad_device_is_a_usage_error():
    result = _gpu_check("--device", "gpu")
    assert result.returncode == 2
    assert "--device must be cuda or cpu, got 'gpu'" in result.stderr
    assert "usage: scripts/gpu_check.sh" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a CUDA device")
def test_cuda_without_a_device_is_refused(tmp_path):
    result = _gpu_check("--device", "cuda", "--out", str(tmp_path / "gpu.md"))
    assert result.returncode == 2
    assert "sees no CUDA device" in result.stderr and "use --device cpu" in result.stderr
    assert not (tmp_path / "gpu.md").exists()
