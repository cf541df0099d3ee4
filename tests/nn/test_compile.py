"""``torch.compile(fullgraph=True)`` of whole converted models, in training and in eval.

Three families, each converted by ``snens.convert``: a CNN of batch norms (SmallCNN), a ViT of
layer norms, and a Hugging Face Llama wrapped with PEFT LoRA (RMS norms; a tiny random config,
offline). Each compiles with ``fullgraph=True``, which refuses any graph break (the
``aot_eager`` backend: dynamo's graph and AOT autograd's backward graph, without inductor's
minutes of C++ compilation on a CPU), and computes what the eager model computes: the logits,
the gradients of every parameter, and the running statistics. Inductor's speed is
``benchmarks/compile_step.py``'s, reported in ``docs/performance.md``. The engine's compile
option (``optim.compile``) compiles with ``fullgraph=True`` and falls back to a graph in
pieces for a model that breaks.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

import snens
from snens.engine.train import _CompiledOrEager

pytestmark = [
    pytest.mark.skipif(
        not torch._dynamo.is_dynamo_supported(), reason="torch.compile is not supported here"
    ),
    pytest.mark.usefixtures("one_thread"),
]
HAS_PEFT = all(importlib.util.find_spec(m) is not None for m in ("transformers", "peft"))
M = 2
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _cnn():
    from snens.models.small_cnn import small_cnn

    return small_cnn(width=8), (torch.randn(3, 1, 28, 28),)


def _vit():
    from snens.models.vit import VisionTransformer

    model = VisionTransformer(dim=32, depth=2, num_heads=2, image_size=16, patch_size=4)
    return model, (torch.randn(3, 3, 16, 16),)


def _llama_lora():
    if not HAS_PEFT:
        pytest.skip("needs transformers and peft")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = get_peft_model(
        LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    return model, (torch.randint(0, 64, (3, 8)),)


def _llm_classifier():
    """snens.models.llm's LLMClassifier (LoRA on a causal LM, a head on the last token), the
    LLM study's model, on right-padded texts."""
    if not HAS_PEFT:
        pytest.skip("needs transformers and peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    from snens.models.llm import LLMClassifier

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )
    # no adapter dropout: compiled and eager draw different masks
    model = LLMClassifier(
        LlamaForCausalLM(config), None, 2, head="linear", prompt="{text}", lora_dropout=0.0
    )
    ids = torch.randint(3, 64, (3, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return model, {"input_ids": ids, "attention_mask": mask}


MODELS = {"cnn": _cnn, "vit": _vit, "llama_lora": _llama_lora, "llm_classifier": _llm_classifier}


def _converted(name: str, training: bool):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    ens = snens.convert(model, num_members=M, head=None if name == "llama_lora" else "auto")
    return ens.train(training), inputs


def _call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _rows(inputs) -> int:
    return next(iter(inputs.values() if isinstance(inputs, dict) else inputs)).shape[0]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", MODELS)
def test_fullgraph_compilation_computes_the_eager_model(name, training):
    """One graph, no break (``fullgraph=True`` raises on a break, naming its cause), and the
    eager model's logits, gradients and running statistics."""
    ens, inputs = _converted(name, training)
    eager = copy.deepcopy(ens)
    torch._dynamo.reset()
    compiled = torch.compile(ens, fullgraph=True, backend="aot_eager")
    with torch.set_grad_enabled(training):
        got, want = _call(compiled, inputs), _call(eager, inputs)
    assert got.shape[:2] == (M, _rows(inputs))
    torch.testing.assert_close(got, want, **TOL)
    if not training:
        return
    got.square().mean().backward()
    want.square().mean().backward()
    for (label, a), b in zip(ens.named_parameters(), eager.parameters(), strict=True):
        if b.grad is None:
            assert a.grad is None, label
            continue
        torch.testing.assert_close(a.grad, b.grad, **TOL, msg=label)
    for (label, a), b in zip(ens.named_buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=label)


def test_a_compiled_llm_classifier_still_refuses_left_padding():
    """The right-padding check, a data-dependent bool eagerly (a graph break), is a device
    assertion in the compiled graph: the same message, as a RuntimeError."""
    ens, inputs = _converted("llm_classifier", False)
    torch._dynamo.reset()
    compiled = torch.compile(ens, fullgraph=True, backend="aot_eager")
    left = inputs["attention_mask"].clone()
    left[0, 0] = 0
    with pytest.raises(ValueError, match="padded on the right"):
        ens(input_ids=inputs["input_ids"], attention_mask=left)
    with pytest.raises(RuntimeError, match="padded on the right"):
        compiled(input_ids=inputs["input_ids"], attention_mask=left)


class _Breaking(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1


def test_the_engine_compiles_whole_graphs_and_pieces_where_a_model_breaks(monkeypatch):
    calls = []
    real = torch.compile

    def recording(model, **kwargs):
        calls.append(kwargs.get("fullgraph", False))
        return real(model, **kwargs, backend="eager")

    monkeypatch.setattr(torch, "compile", recording)
    torch._dynamo.reset()
    ens, inputs = _converted("cnn", True)
    want = copy.deepcopy(ens)(*inputs)
    whole = _CompiledOrEager(ens)
    torch.testing.assert_close(whole(*inputs), want, **TOL)
    assert calls == [True]

    calls.clear()
    pieces = _CompiledOrEager(_Breaking())
    x = torch.randn(3)
    torch.testing.assert_close(pieces(x), 2 * x + 1)  # no warning: compiled in two graphs
    assert calls == [True, False]
