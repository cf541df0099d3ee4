"""experiments/fresh.py: its backbones convert as σN-Ens expects, `snens tune` there starts from
the library's defaults, the study's glue (the chosen runs, the report) works end to end, every
committed run is the run its plan makes, and the committed report is the committed runs'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import snens
import snens.models

ROOT = Path(__file__).resolve().parents[2]


def _texts() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 1000, (5, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # a shorter text, padded
    mask[3, 3:] = 0
    return ids, mask


@pytest.mark.parametrize(
    ("backbone", "norm", "count"),
    [("fresh_review_transformer", nn.RMSNorm, 5), ("fresh_convnext", nn.LayerNorm, 6)],
)
def test_the_studys_backbones_convert_every_norm_and_start_as_the_plain_model(
    fresh, backbone, norm, count
):
    torch.manual_seed(0)
    model = snens.models.create(backbone).eval()
    assert sum(isinstance(m, norm) for m in model.modules()) == count
    inputs = _texts() if backbone == "fresh_review_transformer" else (torch.randn(5, 1, 28, 28),)
    plain = model(*inputs)
    ens = snens.convert(model, num_members=4).eval()
    assert not any(isinstance(m, norm) for m in ens.modules())  # every one a member norm
    logits = ens(*inputs)
    assert logits.shape == (4, *plain.shape)
    member = snens.extract_member(ens, 0).eval()
    assert type(member) is type(model)
    torch.testing.assert_close(member(*inputs), logits[0], rtol=1e-5, atol=1e-5)
    for m in range(4):  # conversion changes no prediction: the members part as they train
        torch.testing.assert_close(logits[m], plain, rtol=1e-5, atol=1e-5)


def test_the_text_model_ignores_what_padding_hides(fresh):
    torch.manual_seed(0)
    model = snens.models.create("fresh_review_transformer").eval()
    ids, mask = _texts()
    changed = ids.clone()
    changed[1, 7:] = 5  # other tokens where the mask hides them
    torch.testing.assert_close(model(changed, mask), model(ids, mask))
    changed[1, 0] = 5  # a token it sees changes that text's logits, and only them
    out, before = model(changed, mask), model(ids, mask)
    assert not torch.allclose(out[1], before[1])
    torch.testing.assert_close(out[[0, 2, 3, 4]], before[[0, 2, 3, 4]])


@pytest.mark.parametrize("situation", ["text", "images", "images_all"])
def test_snens_tune_starts_from_the_librarys_defaults_and_every_run_selects_on_validation(
    fresh, situation, tmp_path
):
    from snens.engine.tune import RECIPES, plan_tune

    runs = plan_tune(fresh.base_config(situation), tmp_path, ["seed=0"])
    assert [r.name for r in runs] == list(RECIPES)  # four distinct recipes
    base = runs[0].config.method
    assert (base.input_policy, base.temperature, base.diversity_weight) == ("repeat", 1.0, 0.1)
    assert base.gamma_lr_multiplier == 30.0 and base.num_members == 4
    for r in runs:
        assert r.config.optim.select == "nll" and r.config.data.validation_examples > 0
        assert r.config.model.backbone.startswith("fresh_") and r.config.threads == 1
    items = [item for item in fresh.baselines() if item[0] == situation]
    assert sorted((v.name, r.config.seed) for _, v, r in items) == [
        ("deep_ensemble", 0),
        ("deep_ensemble", 1),
        ("single", 0),
        ("single", 1),
    ]
    for _, _, run in items:  # the baselines see the data, model and schedule σN-Ens sees
        assert run.config.data == runs[0].config.data
        assert run.config.model == runs[0].config.model
        assert run.config.optim == runs[0].config.optim


def test_the_study_runs_and_reports_end_to_end(fresh, tmp_path, monkeypatch):
    """A tiny images situation, one seed: one model, snens tune's probe and choice, the deep
    ensemble, and the report that compares them."""
    name, overrides, ood = fresh.SITUATIONS["images"]
    tiny = (
        *overrides,
        "data.train_examples=256",
        "data.validation_examples=128",
        "data.test_examples=128",
        "data.ood_examples=64",
        "data.batch_size=64",
        "model.options={width=8}",
        "optim.epochs=2",
    )
    monkeypatch.setattr(fresh, "SITUATIONS", {"images": (name, tiny, ood)})
    monkeypatch.setattr(fresh, "SEEDS", (0,))
    monkeypatch.setitem(fresh.WHERE, "out", tmp_path / "fresh")
    assert fresh.train_all((0,)) == 0
    record = json.loads((fresh.tune_dir("images", 0) / "tune.json").read_text())
    assert record["probe_epochs"] == 1 and record["epochs"] == 2
    values = {n: r["value"] for n, r in record["recipes"].items()}
    assert record["chosen"] == min(values, key=values.__getitem__)
    [(path, name)] = fresh.study.chosen_runs(tmp_path / "fresh" / "images" / "tune")
    assert name == record["chosen"] and path == fresh.tune_dir("images", 0) / name
    report = fresh.report().read_text(encoding="utf-8")
    assert f"| snens tune ({record['chosen']}) | 1 |" in report
    assert "| snens tune | single | " in report and "| snens tune | deep_ensemble | " in report
    assert fresh.train_all((0,)) == 0  # finished: nothing trains again
    assert json.loads((fresh.tune_dir("images", 0) / "tune.json").read_text()) == record


def test_every_committed_run_is_the_run_its_plan_makes(fresh):
    from snens.engine.sweep import config_differences
    from snens.engine.tune import plan_tune

    compared = 0
    for stage, variant, run in fresh.baselines():
        if (run.path() / "config.toml").is_file():
            assert run.path().relative_to(ROOT).parts[:3] == ("results", "fresh", stage)
            assert config_differences(run.path(), run.config) == [], (stage, variant.name)
            compared += 1
    for situation in fresh.SITUATIONS:
        for seed in fresh.SEEDS:
            out = fresh.tune_dir(situation, seed)
            for run in plan_tune(fresh.base_config(situation), out, [f"seed={seed}"]):
                if (run.path() / "config.toml").is_file():
                    assert config_differences(run.path(), run.config) == [], run.path()
                    compared += 1
    assert compared >= 2


@pytest.mark.pins_text
def test_the_committed_report_is_the_committed_runs_report(fresh, tmp_path, monkeypatch):
    if not (ROOT / "results" / "fresh.md").is_file():
        pytest.skip("no report committed yet")
    (tmp_path / "fresh").symlink_to(ROOT / "results" / "fresh")
    monkeypatch.setitem(fresh.WHERE, "out", tmp_path / "fresh")
    assert fresh.report() == tmp_path / "fresh.md"
    written = (ROOT / "results" / "fresh.md").read_text(encoding="utf-8")
    assert (tmp_path / "fresh.md").read_text(encoding="utf-8") == written, (
        "results/fresh.md is not the committed runs' report: python experiments/fresh.py report"
    )
