"""experiments/holdout.py: its own backbones convert as σN-Ens expects, every committed run is
the run its plan makes, and the committed report is the committed runs' report."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import snens
import snens.models

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("backbone", "norm", "count"),
    [("holdout_mlp", nn.LayerNorm, 3), ("holdout_gn_cnn", nn.GroupNorm, 6)],
)
def test_the_studys_backbones_convert_every_norm_and_start_as_the_plain_model(
    holdout, backbone, norm, count
):
    torch.manual_seed(0)
    model = snens.models.create(backbone, num_classes=10, in_channels=1).eval()
    assert sum(isinstance(m, norm) for m in model.modules()) == count
    x = torch.randn(5, 1, 28, 28)
    plain = model(x)
    ens = snens.convert(model, num_members=4).eval()
    assert not any(isinstance(m, norm) for m in ens.modules())  # every one became a member norm
    logits = ens(x)
    assert logits.shape == (4, 5, 10)
    # member 0 extracted is a plain model of the backbone's class computing member 0's logits
    member = snens.extract_member(ens, 0).eval()
    assert type(member) is type(model) and plain.shape == (5, 10)
    torch.testing.assert_close(member(x), logits[0], rtol=1e-5, atol=1e-5)
    # every member starts as the plain model (σ(γ)'s spread folded into the norm's scale), so
    # conversion changes no prediction: the members part only as they train
    for m in range(4):
        torch.testing.assert_close(logits[m], plain, rtol=1e-5, atol=1e-5)


def test_every_committed_run_is_the_run_its_plan_makes(holdout):
    from snens.engine.sweep import config_differences

    compared = 0
    for stage, variant, run in holdout.runs():
        if (run.path() / "config.toml").is_file():
            assert run.path().relative_to(ROOT).parts[:3] == ("results", "holdout", stage)
            assert config_differences(run.path(), run.config) == [], (stage, variant.name)
            compared += 1
    assert compared >= 5  # the runs committed so far: few_mlp's four methods and more


def test_the_plan_runs_every_method_of_every_cell_on_both_seeds_selected_on_validation(holdout):
    items = holdout.runs()
    # every method in every cell on both seeds, but the limited ones: repeat τ=5 λ=0.01 on the
    # GroupNorm CNN's seed 0 only
    everywhere = len(holdout.METHODS) - len(holdout.LIMITED)
    assert len(items) == len(holdout.CELLS) * everywhere * len(holdout.SEEDS) + 1 == 49
    weak = [(stage, r.config) for stage, v, r in items if v.name == "snens_tau5_lam0.01"]
    assert [(stage, c.seed) for stage, c in weak] == [("few_gncnn", 0)]
    assert weak[0][1].method.input_policy == "repeat" and weak[0][1].method.temperature == 5.0
    assert weak[0][1].method.diversity_weight == 0.01
    still = [(stage, r.config) for stage, v, r in items if v.name == "snens_tau1_lam0_glr1"]
    assert sorted((stage, c.seed) for stage, c in still) == [
        (stage, seed) for stage in ("all_mlp", "few_gncnn", "few_mlp", "few_vit") for seed in (0, 1)
    ]
    for _, config in still:
        assert (config.method.input_policy, config.method.temperature) == ("repeat", 1.0)
        assert (config.method.diversity_weight, config.method.gamma_lr_multiplier) == (0.0, 1.0)
    for _, variant, run in items:
        config = run.config
        assert config.optim.select == "nll" and config.data.validation_examples == 5000
        if variant.name.startswith("snens") and variant.name != "snens_tau1_lam0_glr1":
            assert config.method.gamma_lr_multiplier == 30.0
    split = next(r.config for _, v, r in items if v.name == "snens_split_tau5_lam0.01")
    assert split.method.input_policy == "split" and split.method.temperature == 5.0
    assert split.method.diversity_weight == 0.01
    split = next(r.config for _, v, r in items if v.name == "snens_split_tau1_lam0.1")
    assert split.method.input_policy == "split" and split.method.temperature == 1.0
    assert split.method.diversity_weight == 0.1
    # one seed's runs all come before the next seed's, so a stopped queue has whole cells
    seeds = [run.config.seed for _, _, run in items]
    assert seeds == sorted(seeds)


@pytest.mark.pins_text
def test_the_committed_report_is_the_committed_runs_report(holdout, tmp_path, monkeypatch):
    (tmp_path / "holdout").symlink_to(ROOT / "results" / "holdout")
    monkeypatch.setitem(holdout.WHERE, "out", tmp_path / "holdout")
    assert holdout.report() == tmp_path / "holdout.md"
    written = (ROOT / "results" / "holdout.md").read_text(encoding="utf-8")
    assert (tmp_path / "holdout.md").read_text(encoding="utf-8") == written, (
        "results/holdout.md is not the committed runs' report: python experiments/holdout.py report"
    )
