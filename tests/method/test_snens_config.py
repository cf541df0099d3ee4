"""snens.SnensConfig: the one configuration of σN-Ens that convert takes, training reads, the
engine's [method] table embeds, and every save writes beside the weights and reads back."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import snens
from snens.engine.build import build_model
from snens.engine.config import SNENS_CONVERT_OPTIONS, MethodConfig, load_config
from snens.method.optim import GAMMA_LR_MULTIPLIER
from snens.method.regularizer import DEFAULT_DIVERSITY_WEIGHT, DEFAULT_TEMPERATURE

from conftest import TinyResNet, TinyTransformer

TUNED = snens.SnensConfig(
    num_members=3,
    temperature=5.0,
    diversity_weight=0.01,
    input_policy="split",
    gamma_lr_multiplier=10.0,
    gamma_std=0.5,
)


def test_the_defaults_are_the_librarys_and_the_engines():
    config = snens.SnensConfig()
    assert (config.num_members, config.temperature, config.diversity_weight) == (4, 1.0, 0.1)
    assert config.temperature == DEFAULT_TEMPERATURE
    assert config.diversity_weight == DEFAULT_DIVERSITY_WEIGHT
    assert config.gamma_lr_multiplier == GAMMA_LR_MULTIPLIER == 30.0
    assert MethodConfig().snens_config() == config


def test_the_engines_method_table_holds_every_field():
    """Each field is a key of [method] itself or one of its options: nothing of σN-Ens is
    configured outside the one object."""
    method_keys = {f.name for f in dataclasses.fields(MethodConfig)}
    for field in dataclasses.fields(snens.SnensConfig):
        assert field.name in method_keys or field.name in SNENS_CONVERT_OPTIONS, field.name
    run = load_config(
        None,
        [
            "method.num_members=3",
            "method.temperature=5",
            "method.diversity_weight=0.01",
            'method.input_policy="split"',
            "method.gamma_lr_multiplier=10",
            "method.options={gamma_std=0.5}",
            "model.options={width=4}",
            "data.batch_size=96",
        ],
    )
    assert run.method.snens_config() == TUNED
    model = build_model(run, num_classes=10, channels=1)
    assert model.snens_config == TUNED
    own = load_config(None, ['method.input_policy="own"']).method.snens_config()
    assert own.input_policy == "split"  # own batches train as split inputs


def test_convert_builds_what_the_config_says_and_keeps_it():
    torch.manual_seed(0)
    ens = snens.convert(TinyResNet(), TUNED)
    assert ens.snens_config == TUNED
    assert ens.num_members == 3 and ens.input_policy == "split"
    gamma = ens.model.stem[1].gamma  # (M, C), drawn with gamma_std=0.5
    assert gamma.shape[0] == 3 and 0.3 < gamma.std().item() < 0.7
    flat = snens.convert(TinyResNet(), TUNED.replace(gamma_std=0.0))
    assert torch.equal(flat.model.stem[1].gamma, torch.zeros_like(gamma))
    # the input policy set later is the config's too
    ens.input_policy = "repeat"
    assert ens.snens_config == TUNED.replace(input_policy="repeat")


def test_convert_with_an_int_keeps_a_config_of_its_arguments():
    ens = snens.convert(TinyResNet(), 2, head_init="reset", input_policy="split")
    assert ens.snens_config == snens.SnensConfig(
        num_members=2, head_init="reset", input_policy="split"
    )


def test_a_config_and_an_option_it_holds_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"SnensConfig and head_init= as well; set it in the"):
        snens.convert(TinyResNet(), TUNED, head_init="reset")
    # a function choosing the norms is not plain data: it goes beside the config
    ens = snens.convert(TinyTransformer(), TUNED, norms=lambda name, _: name.endswith("norm"))
    assert ens.report.unselected


def test_training_and_parameter_groups_read_tau_lambda_and_the_multiplier_from_it():
    torch.manual_seed(0)
    ens = snens.convert(TinyResNet(), TUNED.replace(input_policy="repeat"))
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    logits = ens.train()(x)
    from_config = snens.training_loss(ens, logits, y)
    given = snens.training_loss(ens, logits, y, temperature=5.0, weight=0.01)
    defaults = snens.training_loss(ens, logits, y, temperature=1.0, weight=0.1)
    assert from_config.total.item() == given.total.item()
    assert from_config.total.item() != defaults.total.item()
    groups = {g["name"]: g for g in snens.param_groups(ens, lr=1e-3)}
    assert groups["gamma"]["lr"] == pytest.approx(1e-3 * 10.0)
    plain = {g["name"]: g for g in snens.param_groups(TinyResNet(), lr=1e-3)}
    assert "gamma" not in plain  # a plain model: no member norms, the library's multiplier


def test_dict_and_json_round_trip_and_unknown_keys_are_named():
    config = TUNED.replace(norms=("model.norm", "layers.0.norm1"))
    data = json.loads(json.dumps(config.to_dict()))
    assert data["norms"] == ["model.norm", "layers.0.norm1"]
    assert snens.SnensConfig.from_dict(data) == config
    with pytest.raises(ValueError, match="no field 'temprature'; did you mean 'temperature'"):
        snens.SnensConfig.from_dict({"temprature": 5.0})


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"num_members": 0}, ValueError, "num_members"),
        ({"num_members": 2.0}, TypeError, "num_members must be an int"),
        ({"temperature": 0.0}, ValueError, "temperature must be finite and > 0, got 0.0"),
        ({"temperature": "5"}, TypeError, "temperature must be a real number"),
        ({"diversity_weight": -1.0}, ValueError, "weight must be finite and >= 0"),
        ({"gamma_lr_multiplier": float("nan")}, ValueError, "gamma_lr_multiplier must be"),
        ({"gamma_std": -0.1}, ValueError, "gamma_std=-0.1 must be finite, gamma_std >= 0"),
        (
            {"input_policy": "own"},
            ValueError,
            "input_policy must be 'repeat' or 'split', got 'own'",
        ),
        ({"head_init": "zeros"}, ValueError, "head_init must be 'copy' or 'reset', got 'zeros'"),
        ({"norms": print}, TypeError, "plain data: pass a function choosing the norms"),
        # a damaged snens.json loaded these and failed only at the next convert
        ({"head": 5}, TypeError, "head must be 'auto', a module name or None, got 5"),
        ({"norms": 5}, TypeError, "norms must be None .all., a regular expression or a list"),
        ({"norms": ["1", 2]}, TypeError, r"list of module names, got \('1', 2\)"),
        ({"skip_unsupported": "no"}, TypeError, "skip_unsupported must be None, True or False"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_the_value(change, error, message):
    with pytest.raises(error, match=message):
        snens.SnensConfig(**change)


def test_an_ensemble_keeps_a_config_of_its_own_m_only():
    ens = snens.convert(TinyResNet(), 2)
    with pytest.raises(ValueError, match=r"config.num_members=3, the ensemble has 2 members"):
        ens.snens_config = TUNED
    with pytest.raises(ValueError, match="give the same values"):
        snens.Ensemble(ens.model, 2, config=TUNED)
