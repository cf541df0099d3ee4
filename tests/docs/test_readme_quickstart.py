"""The README's first Python block runs as a user would paste it (given a model and a batch),
and what its comments promise holds: the shapes, the printed values, the plain member."""

import re
from pathlib import Path

import pytest
import torch

import snens

README = Path(__file__).resolve().parents[2] / "README.md"


def _quickstart() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README shows how to use the library in a Python block"
    return blocks[0]


@pytest.fixture
def ran(capsys):
    torch.manual_seed(0)
    model = snens.models.SmallCNN(num_classes=10, in_channels=1, width=8)
    x, y = torch.randn(6, 1, 28, 28), torch.tensor([0, 1, 2, 3, 4, 5])
    names = {"torch": torch, "model": model, "x": x, "y": y}
    exec(compile(_quickstart(), str(README), "exec"), names)
    names["printed"] = capsys.readouterr().out
    return names


def test_the_quickstart_runs_and_its_shapes_are_those_it_says(ran):
    assert ran["logits"].shape == (4, 6, 10)  # (M, B, K)
    assert ran["probs"].shape == (6, 10)
    torch.testing.assert_close(ran["probs"].sum(-1), torch.ones(6))
    torch.testing.assert_close(ran["probs"], ran["logits"].softmax(-1).mean(0))
    assert ran["loss"].shape == () and torch.isfinite(ran["loss"])


def test_the_quickstart_values_are_those_its_comments_give():
    code = _quickstart()
    said = float(re.search(r"tau_for_k\(1\.5, num_members=4\)\s+# ([0-9.]+)", code).group(1))
    assert said == 0.641
    assert round(snens.tau_for_k(1.5, num_members=4), 3) == said


def test_the_quickstart_groups_gamma_at_thirty_times_the_rate_without_decay(ran):
    groups = ran["optimizer"].param_groups
    assert {g["lr"] for g in groups} == {3e-3, 3e-3 * 30}
    fast = [g for g in groups if g["lr"] == 3e-3 * 30]
    assert all(g["weight_decay"] == 0 for g in fast)
    assert sum(len(g["params"]) for g in fast) == 6  # the six member norms' gamma


def test_the_quickstart_loss_is_the_task_loss_plus_the_regularizer(ran):
    ens, logits, y = ran["ens"], ran["logits"], ran["y"]
    task = snens.ensemble_loss(logits, y)
    regularizer = snens.diversity_loss(ens, temperature=1.0, weight=0.1)
    torch.testing.assert_close(ran["loss"], task + regularizer)
    assert regularizer.item() < 0  # members start apart: a gain over equal sharing, subtracted


def test_the_quickstart_extracts_a_plain_model_of_the_input_class_that_is_member_0(ran):
    plain, ens, x = ran["plain"], ran["ens"], ran["x"]
    assert type(plain) is snens.models.SmallCNN
    assert sum(p.numel() for p in plain.parameters()) == 18_482  # one SmallCNN of width 8
    ens.eval()
    plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(x), ens(x)[0], rtol=1e-4, atol=1e-5)


def test_the_quickstart_prints_what_was_converted_and_reports_sharing(ran):
    assert "6 × BatchNorm2d -> MemberBatchNorm2d" in ran["printed"]
    assert "parameters: 18,482 -> 20,592" in ran["printed"]
    assert len(snens.allocation(ran["ens"])) == 6  # one entry per converted norm
    assert 1.0 <= snens.mean_effective_members(ran["ens"]) <= 4.0


def test_the_quickstart_config_is_kept_and_sets_the_loss(ran):
    tuned, config, step = ran["tuned"], ran["config"], ran["step"]
    assert tuned.snens_config == config
    logits = tuned(ran["x"])
    expected = snens.ensemble_loss(logits, ran["y"]) + snens.diversity_loss(tuned, 5.0, 0.01)
    torch.testing.assert_close(step.total, expected)
