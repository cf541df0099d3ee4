"""experiments/pretrained.py at toy scale: the rows it writes, and that its conversion of the
pretrained models preserves their predictions before fine-tuning."""

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

import snens

pytest.importorskip("transformers")

_SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "pretrained.py"
_TINY = [
    "--seeds", "0",
    "--methods", "single", "snens",
    "--text-train", "40", "--text-test", "20", "--text-ood", "20", "--max-length", "16",
    "--image-train", "32", "--image-test", "16", "--image-ood", "16", "--image-size", "32",
    "--eval-batch-size", "16",
]  # fmt: skip


@pytest.fixture(scope="module")
def experiment():
    spec = importlib.util.spec_from_file_location("experiment_pretrained", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_main_writes_one_finite_row_per_run(experiment, tmp_path):
    threads = torch.get_num_threads()
    try:
        experiment.main([*_TINY, "--out", str(tmp_path / "pretrained.csv")])
    finally:
        torch.set_num_threads(threads)
    with (tmp_path / "pretrained.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == experiment.COLUMNS
    assert [(r["task"], r["method"]) for r in rows] == [
        ("text", "single"),
        ("text", "snens"),
        ("vision", "single"),
        ("vision", "snens"),
    ]
    always = (
        "accuracy", "nll", "ece", "brier", "ood_auroc_msp", "ood_aupr_msp", "ood_fpr95_msp",
        "disagreement", "params", "train_seconds",
    )  # fmt: skip
    for row in rows:
        for key in always:
            assert math.isfinite(float(row[key])), (row["task"], row["method"], key)
        members = 4 if row["method"] == "snens" else 1
        assert int(row["num_members"]) == members
        has_mi = math.isfinite(float(row["ood_auroc_mi"]))
        assert has_mi == (members > 1)
    for row in rows:
        if row["method"] == "snens":
            assert float(row["conversion_error"]) < 1e-4
            assert 1.0 <= float(row["effective_members"]) <= 4.0
            single = next(r for r in rows if r["task"] == row["task"] and r["method"] == "single")
            # ~1× the parameters: members own only norms and heads
            assert int(row["params"]) < 1.1 * int(single["params"])
    table = (tmp_path / "pretrained.md").read_text()
    assert "| snens |" in table and "wall time" in table
    assert (tmp_path / "pretrained.png").stat().st_size > 0


@pytest.mark.parametrize("task", ["text", "vision"])
def test_converted_members_predict_like_the_pretrained_model(experiment, task):
    args = experiment.parse_args(_TINY)
    built = {"text": experiment.text_task, "vision": experiment.vision_task}[task](args)
    torch.manual_seed(0)
    plain = built.build().eval()
    ens = snens.convert(plain, 4, generator=torch.Generator().manual_seed(0)).eval()
    x, _ = next(iter(built.test))
    with torch.no_grad():
        reference = plain(**x) if isinstance(x, dict) else plain(x)  # (B, K)
        members = ens(**x) if isinstance(x, dict) else ens(x)  # (M, B, K)
    assert members.shape == (4, *reference.shape)
    torch.testing.assert_close(members[0], reference, rtol=0, atol=1e-4)
    torch.testing.assert_close(members, reference.expand_as(members), rtol=0, atol=1e-4)
    assert experiment.conversion_error(plain, ens, built.test) < 1e-4
