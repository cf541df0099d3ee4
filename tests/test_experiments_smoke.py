"""Every experiment script runs end to end at a tiny scale and writes what its table promises.

Each ``main(argv)`` trains on 200 Fashion-MNIST images for one epoch at width 4 and evaluates on
200 test and 200 MNIST-5k images and 200 validation images (the last of the training set); the
CSV must hold one row per (grid point, seed) with finite metrics, and the markdown table and
figure must exist.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
TINY = [
    "--train-examples",
    "200",
    "--epochs",
    "1",
    "--width",
    "4",
    "--seeds",
    "0",
    "--test-examples",
    "200",
    "--ood-examples",
    "200",
    "--threads",
    "1",
    "--val-examples",
    "200",
]


def _script(name: str):
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))  # the scripts import their sibling `common`
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _finite(rows: list[dict[str, str]], keys: tuple[str, ...]) -> None:
    for row in rows:
        for key in keys:
            assert math.isfinite(float(row[key])), (key, row)


QUALITY = ("accuracy", "nll", "ece", "ood_msp_auroc", "train_seconds")
VALIDATION = ("val_accuracy", "val_nll", "val_ece")


def test_validation_split_is_disjoint_from_training():
    common = _script("common")
    assert common.validation_range(55_000, 5_000, 60_000) == range(55_000, 60_000)
    assert len(common.validation_range(60_000, 0, 60_000)) == 0
    with pytest.raises(ValueError, match="overlap"):
        common.validation_range(55_001, 5_000, 60_000)


def test_select_temperature_and_merge():
    common = _script("common")
    rows = [
        {"method": "snens", "temperature": t, "num_members": 4, "seed": s, "width": 4, "val_nll": v}
        for t, s, v in ((1.0, 0, 0.6), (1.0, 1, 0.7), (5.0, 0, 0.5), (5.0, 1, 0.9))
    ]
    assert common.select_temperature(rows) == 1.0  # mean over seeds 0.65 < 0.7, not the best run
    old = [{"method": "single", "temperature": float("nan"), "num_members": 1, "seed": 0}, *rows]
    new = [{"method": "snens", "temperature": 5, "num_members": 4, "seed": 0, "val_nll": 0.1}]
    merged = common.merge_rows(old, new)
    assert len(merged) == len(old)  # (snens, τ=5, M=4, seed 0) replaced, the rest kept
    assert merged[-1] is new[0] and merged[0]["method"] == "single"
    assert common.select_temperature(merged) == 5.0
    assert common.label(new[0]) == "σN-Ens τ=5" and common.label(old[0]) == "single"


def test_tau_sweep(tmp_path):
    _script("tau_sweep").main([*TINY, "--temperatures", "0.1", "5", "--out-dir", str(tmp_path)])
    rows = _rows(tmp_path / "tau_sweep.csv")
    assert [float(r["temperature"]) for r in rows] == [0.1, 5.0]
    _finite(rows, (*QUALITY, *VALIDATION, "effective_members", "k_star"))
    for row in rows:
        assert 1.0 <= float(row["effective_members"]) <= 4.0
    assert float(rows[0]["k_star"]) < float(rows[1]["k_star"])  # k*(τ) grows with τ
    assert (tmp_path / "tau_sweep.png").stat().st_size > 0
    text = (tmp_path / "tau_sweep.md").read_text()
    assert "| 0.1 |" in text
    means = {float(r["temperature"]): float(r["val_nll"]) for r in rows}  # one seed
    assert f"τ*={min(means, key=means.get):g}" in text


def test_m_scaling(tmp_path):
    _script("m_scaling").main([*TINY, "--members", "2", "4", "--out-dir", str(tmp_path)])
    rows = _rows(tmp_path / "m_scaling.csv")
    assert len(rows) == 1 + 2 * 3  # the single reference + M ∈ {2, 4} × 3 methods
    _finite(rows, (*QUALITY, *VALIDATION))
    params = {(r["method"], int(r["num_members"])): int(r["params"]) for r in rows}
    single = params[("single", 1)]
    for M in (2, 4):
        assert params[("deep_ensemble", M)] == M * single
        assert single < params[("snens", M)] < 1.5 * single  # ~1× one model
    assert (tmp_path / "m_scaling.png").stat().st_size > 0
    # σN-Ens alone at a second τ: merged in, every earlier row kept, the single not re-run
    _script("m_scaling").main(
        [
            *TINY,
            "--members",
            "2",
            "--methods",
            "snens",
            "--snens-temperatures",
            "5",
            "--out-dir",
            str(tmp_path),
        ]
    )
    merged = _rows(tmp_path / "m_scaling.csv")
    assert merged[: len(rows)] == rows
    assert [(r["method"], float(r["temperature"])) for r in merged[len(rows) :]] == [("snens", 5.0)]
    assert "| σN-Ens τ=5 | 2 |" in (tmp_path / "m_scaling.md").read_text()


def test_methods_corruption_and_ood(tmp_path):
    _script("methods").main(
        [
            *TINY,
            "--corruptions",
            "gaussian_noise",
            "contrast",
            "--corruption-examples",
            "50",
            "--out-dir",
            str(tmp_path),
        ]
    )
    rows = _rows(tmp_path / "corruption.csv")
    methods = ["single", "deep_ensemble", "batch_ensemble", "packed", "mc_dropout", "snens"]
    assert [r["method"] for r in rows] == methods
    shift = tuple(f"shift{s}_{m}" for s in range(1, 6) for m in ("accuracy", "ece"))
    _finite(rows, (*QUALITY, *shift, "ood_entropy_auroc"))
    params = {r["method"]: int(r["params"]) for r in rows}
    assert params["deep_ensemble"] == 4 * params["single"] == 4 * params["mc_dropout"]
    ood = _rows(tmp_path / "ood.csv")
    # 3 scores per method, mutual information left out for the single model
    assert len(ood) == 3 * len(methods) - 1
    assert {r["score"] for r in ood if r["method"] == "single"} == {"msp", "entropy"}
    _finite(ood, ("auroc", "aupr", "fpr95"))
    for name in ("corruption.md", "corruption.png", "ood.md", "ood.png"):
        assert (tmp_path / name).stat().st_size > 0
    _finite(rows, VALIDATION)
    # σN-Ens alone at τ* of a sweep: merged into the CSV, the other rows kept as they were
    sweep = tmp_path / "sweep.csv"
    sweep.write_text(
        "method,temperature,seed,val_nll,val_examples\nsnens,1.0,0,0.9,200\nsnens,5.0,0,0.5,200\n",
        encoding="utf-8",
    )
    _script("methods").main(
        [
            *TINY,
            "--corruptions",
            "contrast",
            "--corruption-examples",
            "20",
            "--methods",
            "snens",
            "--tau-from-sweep",
            str(sweep),
            "--out-dir",
            str(tmp_path),
        ]
    )
    merged = _rows(tmp_path / "corruption.csv")
    assert [r["method"] for r in merged] == [*methods, "snens"]
    assert merged[: len(rows)] == rows
    assert float(merged[-1]["temperature"]) == 5.0
    corruption = (tmp_path / "corruption.md").read_text()
    assert "| σN-Ens τ=1 |" in corruption and "| σN-Ens τ=5 |" in corruption
    assert "τ*=5 was selected on the validation split" in corruption
    assert "| σN-Ens τ=5 | mutual_information |" in (tmp_path / "ood.md").read_text()
    assert len(_rows(tmp_path / "ood.csv")) == 3 * (len(methods) + 1) - 1


def test_lambda_sensitivity(tmp_path):
    _script("lambda_sensitivity").main([*TINY, "--weights", "0.1", "1", "--out-dir", str(tmp_path)])
    rows = _rows(tmp_path / "lambda_sensitivity.csv")
    assert [float(r["diversity_weight"]) for r in rows] == [0.0, 0.1, 1.0]  # λ=0 reference
    _finite(rows, (*QUALITY, "effective_members", "disagreement"))


def test_split_vs_repeat(tmp_path):
    _script("split_vs_repeat").main([*TINY, "--timing-steps", "2", "--out-dir", str(tmp_path)])
    rows = _rows(tmp_path / "split_vs_repeat.csv")
    assert [r["input_policy"] for r in rows] == ["repeat", "split"]
    _finite(rows, (*QUALITY, "seconds_per_epoch", "step_ms_median", "step_ratio_to_repeat"))
    assert float(rows[0]["step_ratio_to_repeat"]) == 1.0
    assert "median ms" in (tmp_path / "split_vs_repeat.md").read_text()
