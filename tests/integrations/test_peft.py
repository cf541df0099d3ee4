"""σN-Ens over PEFT (LoRA) models: conversion, save and load into a fresh base, members."""

import json
from pathlib import Path

import pytest
import torch

import snens
from snens.integrations.peft import from_pretrained, save_pretrained

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = dict(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=0,
    num_labels=3,
)


def _base(kind: str = "seq_cls", seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**CONFIG)
    cls = {
        "seq_cls": transformers.LlamaForSequenceClassification,
        "causal_lm": transformers.LlamaForCausalLM,
    }[kind]
    return cls(config).eval()


def _lora(kind: str = "seq_cls"):
    task = {"seq_cls": "SEQ_CLS", "causal_lm": "CAUSAL_LM"}[kind]
    return peft.LoraConfig(task_type=task, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 100, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _trained(kind: str = "seq_cls", **convert_options):
    """A converted PEFT model after two optimizer steps: LoRA, norms and heads all moved."""
    ens = snens.convert(peft.get_peft_model(_base(kind), _lora(kind)), 4, **convert_options)
    optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-2))
    x = _batch()
    for _ in range(2):
        logits = ens.train()(**x)
        if logits.dim() == 4:  # a causal LM: (M, B, T, V), the next token of each position
            logits = logits[:, :, -1]
        loss = snens.ensemble_loss(logits, torch.tensor([0, 1, 2]))
        loss = loss + snens.diversity_loss(ens, 1.0, 0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ens.eval()


def test_a_peft_model_converts_exactly_with_its_head_in_modules_to_save():
    model = peft.get_peft_model(_base(), _lora())
    ens = snens.convert(model, 4).eval()
    assert ens.report.head == "base_model.model.score.modules_to_save.default"
    assert len(ens.report.converted) == 5  # 2 norms per layer and the final norm
    trainable = [n for n, p in ens.named_parameters() if p.requires_grad]
    assert any("lora_A" in n for n in trainable) and any(n.endswith(".gamma") for n in trainable)
    with torch.no_grad():
        out = ens(**_batch())
        expected = model(**_batch()).logits
    assert out.shape == (4, 3, 3)
    for m in range(4):
        torch.testing.assert_close(out[m], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["seq_cls", "causal_lm"])
def test_save_and_load_into_a_fresh_base_reproduces_the_trained_ensemble(tmp_path, kind):
    options = {"head": None} if kind == "causal_lm" else {}  # one LM head for all members
    ens = _trained(kind, **options)
    with torch.no_grad():
        expected = ens(**_batch())
    save_pretrained(ens, tmp_path)
    assert json.loads((tmp_path / "snens.json").read_text())["num_members"] == 4
    # a few kB: the adapters and member layers, not the base model
    assert (tmp_path / "snens_state.safetensors").stat().st_size < 60_000
    loaded = from_pretrained(_base(kind), tmp_path).eval()
    with torch.no_grad():
        got = loaded(**_batch())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert (got[0] - got[1]).abs().max() > 1e-4  # the members differ, and each was restored


def test_a_save_keeps_the_snens_config(tmp_path):
    config = snens.SnensConfig(
        num_members=2, temperature=5.0, diversity_weight=0.01, input_policy="split", gamma_std=0.5
    )
    ens = snens.convert(peft.get_peft_model(_base(), _lora()), config)
    save_pretrained(ens, tmp_path)
    assert json.loads((tmp_path / "snens.json").read_text())["config"] == config.to_dict()
    assert from_pretrained(_base(), tmp_path).snens_config == config


def test_a_member_is_a_plain_peft_model_and_merges_into_a_plain_hf_model():
    ens = _trained()
    with torch.no_grad():
        expected = ens(**_batch())[2]
        member = snens.extract_member(ens, 2).eval()
        assert isinstance(member, peft.PeftModel)
        torch.testing.assert_close(member(**_batch()).logits, expected, rtol=1e-5, atol=1e-6)
        merged = member.merge_and_unload()
        assert type(merged) is transformers.LlamaForSequenceClassification
        torch.testing.assert_close(merged(**_batch()).logits, expected, rtol=1e-4, atol=1e-5)


def test_a_save_short_of_a_tensor_or_with_one_more_names_it(tmp_path):
    from safetensors.torch import load_file, save_file

    save_pretrained(_trained(), tmp_path)
    state = load_file(str(tmp_path / "snens_state.safetensors"))
    dropped = sorted(state)[0]
    extra = {"not.a.tensor.of.this.model": torch.zeros(2)}
    save_file(
        {k: v for k, v in state.items() if k != dropped} | extra,
        str(tmp_path / "snens_state.safetensors"),
    )
    with pytest.raises(ValueError) as info:
        from_pretrained(_base(), tmp_path)
    assert f"(1 missing: {dropped}; 1 unexpected: not.a.tensor.of.this.model); load it into" in str(
        info.value
    )


def test_the_weights_check_names_every_kind_of_misfit():
    from snens.integrations._saves import check_weights

    reference = {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(1, dtype=torch.long)}
    state = {"a": [0.0, 0.0], "b": torch.zeros(4), "c": torch.zeros(1), "x": torch.zeros(1)}
    with pytest.raises(ValueError) as info:
        check_weights(state, reference, ["d"], "the save does not fit", "save it again")
    assert str(info.value) == (
        "the save does not fit (1 missing: d; 1 unexpected: x; 3 of another shape or kind: "
        "a list saved, (2,) torch.float32 here, b (4,) torch.float32 saved, (3,) torch.float32 "
        "here, c (1,) torch.float32 saved, (1,) torch.int64 here); save it again"
    )
    check_weights({"a": torch.ones(2)}, reference, [], "unused", "unused")  # fits: no error


def test_loading_into_another_base_or_an_incomplete_save_is_refused(tmp_path):
    ens = _trained()
    save_pretrained(ens, tmp_path)
    wider = transformers.LlamaForSequenceClassification(
        transformers.LlamaConfig(**{**CONFIG, "hidden_size": 48})
    )
    with pytest.raises(ValueError, match=r"does not fit this base model \(.*saved"):
        from_pretrained(wider, tmp_path)
    (tmp_path / "snens.json").unlink()
    with pytest.raises(FileNotFoundError, match="snens.json is missing"):
        from_pretrained(_base(), tmp_path)
    with pytest.raises(TypeError, match="an Ensemble over a peft.PeftModel; got Sequential"):
        save_pretrained(snens.convert(torch.nn.Sequential(torch.nn.LayerNorm(4)), 2), tmp_path)


FAMILIES = {  # (model class, config class, LoRA targets): RMS norms of four kinds, LayerNorm
    "qwen3 (q/k norms)": ("Qwen3ForSequenceClassification", "Qwen3Config", ["q_proj", "v_proj"]),
    "gemma (1 + w)": ("GemmaForSequenceClassification", "GemmaConfig", ["q_proj", "v_proj"]),
    "phi3 (fused qkv)": ("Phi3ForSequenceClassification", "Phi3Config", ["qkv_proj"]),
    "olmo2 (post-norms)": ("Olmo2ForCausalLM", "Olmo2Config", ["q_proj", "v_proj"]),
    "bert (LayerNorm)": ("BertForSequenceClassification", "BertConfig", ["query", "value"]),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_families_convert_train_reload_and_extract_exactly(tmp_path, family):
    """Beyond Llama: each family's PEFT model converts with every member equal to it, and a
    trained ensemble saved and loaded into a fresh base, and its extracted member, give the
    trained ensemble's outputs."""
    model_class, config_class, targets = FAMILIES[family]
    causal = model_class.endswith("CausalLM")
    # a config keeps keys its model does not use (BERT: head_dim, num_key_value_heads)
    config = getattr(transformers, config_class)(**CONFIG, head_dim=8)

    def base():
        torch.manual_seed(0)
        model = getattr(transformers, model_class)(config).eval()
        with torch.no_grad():  # norm weights away from their init, so an identity cannot pass
            for name, p in model.named_parameters():
                if "norm" in name.lower() and p.dim() == 1:
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.1)
        return model

    task = "CAUSAL_LM" if causal else "SEQ_CLS"
    lora = peft.LoraConfig(task_type=task, r=4, lora_alpha=8, target_modules=targets)
    model = peft.get_peft_model(base(), lora)
    x = _batch()
    with torch.no_grad():
        plain = model(**x).logits
    ens = snens.convert(model, 3, head=None if causal else "auto").eval()
    with torch.no_grad():
        for member_logits in ens(**x):
            torch.testing.assert_close(member_logits, plain, rtol=1e-5, atol=1e-6)

    optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-2))
    logits = ens.train()(**x)
    logits = logits[:, :, -1] if causal else logits  # a causal LM: the last position's token
    (
        snens.ensemble_loss(logits, torch.tensor([0, 1, 2])) + snens.diversity_loss(ens, 5.0, 0.01)
    ).backward()
    optimizer.step()
    with torch.no_grad():
        trained = ens.eval()(**x)
        assert (trained[0] - trained[1]).abs().max() > 1e-4
        save_pretrained(ens, tmp_path)
        torch.testing.assert_close(
            from_pretrained(base(), tmp_path).eval()(**x), trained, rtol=0, atol=0
        )
        member = snens.extract_member(ens, 1).eval()
        torch.testing.assert_close(member(**x).logits, trained[1], rtol=1e-5, atol=1e-6)


def test_the_last_layers_norms_only_save_load_and_extract_exactly(tmp_path):
    """A partition of the last layer's norms and the final norm (the rest shared, plain)
    round-trips: the save records which norms are member norms, loading converts those."""
    ens = _trained(norms=r".*layers\.1\..*|.*model\.norm")
    assert [name for name, _, _ in ens.report.converted] == [
        "base_model.model.model.layers.1.input_layernorm",
        "base_model.model.model.layers.1.post_attention_layernorm",
        "base_model.model.model.norm",
    ]
    assert len(ens.report.unselected) == 2
    with torch.no_grad():
        expected = ens(**_batch())
    assert (expected[0] - expected[1]).abs().max() > 1e-4
    save_pretrained(ens, tmp_path)
    meta = json.loads((tmp_path / "snens.json").read_text())
    assert meta["norms"] == [name for name, _, _ in ens.report.converted]
    loaded = from_pretrained(_base(), tmp_path).eval()
    assert loaded.report.converted == ens.report.converted
    with torch.no_grad():
        torch.testing.assert_close(loaded(**_batch()), expected, rtol=0, atol=0)
        member = snens.extract_member(loaded, 1).eval()
        torch.testing.assert_close(member(**_batch()).logits, expected[1], rtol=1e-5, atol=1e-6)


def test_a_save_never_writes_through_a_link_planted_in_its_directory(tmp_path):
    """snens.json and the state had been written to fixed *.tmp names, and PEFT's config by
    its own open, each following a link planted there."""
    ens = _trained()
    victims = {}
    names = ("snens.json.tmp", "snens_state.safetensors.tmp", "snens.json", "adapter_config.json")
    for name in names:
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("keep")
    save = tmp_path / "save"
    save.mkdir()
    for name in names:
        (save / name).symlink_to(victims[name])
    save_pretrained(ens, save)
    assert all(victim.read_text() == "keep" for victim in victims.values())
    assert sorted(p.name for p in save.iterdir() if p.is_symlink()) == [
        "snens.json.tmp",
        "snens_state.safetensors.tmp",
    ]
    again = from_pretrained(_base(), save)
    torch.testing.assert_close(again(**_batch()), ens(**_batch()), rtol=0, atol=0)


def _layers(model):
    return {name: type(module).__name__ for name, module in model.named_modules()}


def test_a_save_that_does_not_fit_leaves_the_base_model_as_it_was(tmp_path):
    """from_pretrained had wrapped the base model in place before finding the save did not
    fit: the model stayed wrapped, and loading the right save into it then failed."""
    ens = _trained()
    save_pretrained(ens, tmp_path / "right")
    wider = transformers.LlamaForSequenceClassification(
        transformers.LlamaConfig(**{**CONFIG, "hidden_size": 48})
    )
    save_pretrained(snens.convert(peft.get_peft_model(wider, _lora()), 4), tmp_path / "wrong")
    base = _base()
    layers, weights = _layers(base), {k: v.clone() for k, v in base.state_dict().items()}
    with pytest.raises(ValueError, match=r"does not fit this base model \(.*left as it was"):
        from_pretrained(base, tmp_path / "wrong")
    assert _layers(base) == layers
    assert all(torch.equal(v, weights[k]) for k, v in base.state_dict().items())
    again = from_pretrained(base, tmp_path / "right")
    torch.testing.assert_close(again(**_batch()), ens(**_batch()), rtol=0, atol=0)


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda p: (p / "snens.json").write_text("{not json"), r"snens\.json: not valid JSON"),
        (lambda p: (p / "snens.json").write_text("[1, 2]"), "holds a JSON list, not an object"),
        (
            lambda p: (p / "snens.json").write_text('{"format": 1, "input_policy": "repeat"}'),
            "'num_members' is missing",
        ),
        (
            lambda p: (p / "snens.json").write_text(
                '{"format": 1, "num_members": 4, "input_policy": "sideways"}'
            ),
            "input_policy = 'sideways' is not 'repeat' or 'split'",
        ),
        (
            lambda p: (p / "snens.json").write_text(
                '{"format": 1, "num_members": 4, "input_policy": "repeat", "adapter_name": 7}'
            ),
            "adapter_name = 7 is not a name",
        ),
        (
            lambda p: (p / "snens_state.safetensors").write_bytes(b"garbage" * 10),
            r"snens_state\.safetensors is not a readable safetensors file",
        ),
        (
            lambda p: (p / "adapter_config.json").write_text('{"peft_type": 7}'),
            r"adapter_config\.json is not a PEFT adapter config PEFT can read",
        ),
    ],
)
def test_a_damaged_save_is_named_and_the_base_model_left_as_it_was(tmp_path, damage, named):
    """A snens.json missing num_members or holding garbage had raised a KeyError, an
    AttributeError or a SafetensorError."""
    save_pretrained(_trained(), tmp_path)
    damage(tmp_path)
    base = _base()
    layers = _layers(base)
    with pytest.raises(ValueError, match=named):
        from_pretrained(base, tmp_path)
    assert _layers(base) == layers


def test_a_fifo_in_place_of_the_state_is_named_not_missing(tmp_path):
    import os

    from snens.files import FileRefusedError

    save_pretrained(_trained(), tmp_path)
    (tmp_path / "snens_state.safetensors").unlink()
    os.mkfifo(tmp_path / "snens_state.safetensors")
    with pytest.raises(FileRefusedError, match=r"snens_state\.safetensors is a FIFO, not a"):
        from_pretrained(_base(), tmp_path)


def _second_save():
    """An ensemble whose adapter config differs from _trained's (r 8, not 4)."""
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=8, target_modules=["q_proj"])
    return snens.convert(peft.get_peft_model(_base(), lora), 4)


SAVED = ("adapter_config.json", "snens.json", "snens_state.safetensors")


@pytest.mark.parametrize("full_at", ["snens_state.safetensors", "snens.json"])
def test_a_save_onto_a_full_disk_leaves_the_earlier_save_whole(tmp_path, monkeypatch, full_at):
    """adapter_config.json had been moved in before the state was written: a full disk then
    left the earlier save with the new adapter config (r 8 where its tensors are r 4), so it
    reloaded with other outputs, or not at all."""
    import errno

    from snens import files

    ens = _trained()
    with torch.no_grad():
        expected = ens(**_batch())
    save_pretrained(ens, tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in SAVED}
    write_bytes = files.write_bytes

    def full(path, data, **options):
        if Path(path).name == full_at:
            raise OSError(errno.ENOSPC, f"cannot write {path}: No space left on device")
        return write_bytes(path, data, **options)

    monkeypatch.setattr(files, "write_bytes", full)
    with pytest.raises(OSError, match="No space left on device"):
        save_pretrained(_second_save(), tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SAVED)  # no staging left
    assert {name: (tmp_path / name).read_bytes() for name in SAVED} == before
    with torch.no_grad():
        got = from_pretrained(_base(), tmp_path).eval()(**_batch())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_save_killed_while_moving_in_leaves_no_snens_json_and_is_refused(tmp_path, monkeypatch):
    """The earlier save's snens.json had stayed beside the new adapter config: the directory
    looked complete and loaded a mix of two saves."""
    import os

    save_pretrained(_trained(), tmp_path)
    replace, moved = os.replace, []

    def replace_then_die(source, target):
        if Path(target).parent == tmp_path:  # moving in, not a write inside the staging
            if moved:
                raise KeyboardInterrupt  # a kill after the first file moved
            moved.append(Path(target).name)
        replace(source, target)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_pretrained(_second_save(), tmp_path)
    monkeypatch.undo()
    assert moved == ["adapter_config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter_config.json",
        "snens_state.safetensors",
    ]
    with pytest.raises(FileNotFoundError, match=r"snens\.json is missing: .*interrupted"):
        from_pretrained(_base(), tmp_path)
    ens = _second_save().eval()
    save_pretrained(ens, tmp_path)  # saving again repairs it
    with torch.no_grad():
        torch.testing.assert_close(
            from_pretrained(_base(), tmp_path).eval()(**_batch()), ens(**_batch()), rtol=0, atol=0
        )


class _CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        x = torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))
        return self.head(x.mean((2, 3)))


def _cnn():
    torch.manual_seed(0)
    return _CNN().eval()


def test_a_plain_batch_norms_running_statistics_are_saved(tmp_path):
    """Only trainable tensors and member layers' state were saved: bn1, left plain by
    norms=["bn2"], reloaded with running_mean 0 and the outputs differed (by 0.05)."""
    lora = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["conv1", "conv2"])
    ens = snens.convert(peft.get_peft_model(_cnn(), lora), 2, norms=["bn2"])
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, 6, 6, generator=g) * 3 + 1, torch.randint(0, 3, (8,), generator=g)
    optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-2))
    for _ in range(3):
        loss = snens.ensemble_loss(ens.train()(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        expected = ens.eval()(x)
    save_pretrained(ens, tmp_path)
    loaded = from_pretrained(_cnn(), tmp_path).eval()
    bn1 = "model.base_model.model.bn1."
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(loaded.state_dict()[bn1 + name], ens.state_dict()[bn1 + name])
    assert ens.state_dict()[bn1 + "num_batches_tracked"] == 3
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)


def test_an_adapter_with_its_own_name_saves_and_reloads_under_it(tmp_path):
    """The state's keys and the head carried .sentiment. while the load built the adapter as
    "default": the save could never be reloaded, and the error blamed the head."""
    model = peft.get_peft_model(_base(), _lora(), adapter_name="sentiment")
    ens = snens.convert(model, 3).eval()
    with torch.no_grad():
        for p in ens.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
        expected = ens(**_batch())
    save_pretrained(ens, tmp_path)
    meta = json.loads((tmp_path / "snens.json").read_text())
    assert meta["adapter_name"] == "sentiment"
    assert meta["head"] == "base_model.model.score.modules_to_save.sentiment"
    loaded = from_pretrained(_base(), tmp_path).eval()
    assert loaded.model.active_adapter == "sentiment"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**_batch()), expected, rtol=0, atol=0)


def test_a_save_without_an_adapter_name_loads_as_default(tmp_path):
    """Saves made before the adapter's name was recorded hold PEFT's "default" adapter."""
    ens = _trained()
    with torch.no_grad():
        expected = ens(**_batch())
    save_pretrained(ens, tmp_path)
    meta = json.loads((tmp_path / "snens.json").read_text())
    assert meta.pop("adapter_name") == "default"
    (tmp_path / "snens.json").write_text(json.dumps(meta))
    loaded = from_pretrained(_base(), tmp_path).eval()
    assert loaded.model.active_adapter == "default"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**_batch()), expected, rtol=0, atol=0)
