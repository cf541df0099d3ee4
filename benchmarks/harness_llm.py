"""Cost of σN-Ens over a LoRA-fine-tuned LLM: the step against its floor and a LoRA ensemble.

The model is SmolLM2-135M's architecture (Llama: hidden 576, 9 heads of 64, 3 key-value
heads, MLP 1,536, vocabulary 49,152), randomly initialized — no weights file is needed, and
the cost does not depend on the weights — with ``layers`` of its 30 decoder layers (fewer for
a quick CPU measure: the ratios are per layer), LoRA r=8 on q_proj/v_proj, a linear head on
the last token. Rows, as :func:`harness.run`'s:

* member ``LlamaRMSNorm`` forward + backward at LLM shapes (M·B·T, 576) vs a plain one;
* σN-Ens-LoRA step (B texts, every member on every text) vs one LoRA model at M·B texts —
  the floor — and vs a LoRA ensemble (M adapters over M copies of the base, B texts each);
* the ``split`` step (member m on its B/M texts) vs one LoRA model at B.

    snens bench --llm --llm-layers 4          # about a minute on one CPU core
    snens bench --llm --device cuda --bf16    # all 30 layers in bfloat16 autocast
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from measure import Measure, compare
from torch import nn

import snens
from snens.baselines import DeepEnsemble
from snens.nn.registry import member_converter

__all__ = ["llm_measures", "llm_step", "lora_model", "smollm2_config", "texts"]


def smollm2_config(layers: int = 30):
    """SmolLM2-135M's configuration with ``layers`` decoder layers (``transformers``)."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=2,
    )


def lora_model(layers: int, seed: int, device: torch.device) -> nn.Module:
    import transformers

    from snens.models.llm import LLMClassifier

    torch.manual_seed(seed)
    lm = transformers.LlamaForCausalLM(smollm2_config(layers))
    return LLMClassifier(lm, None, 2, head="linear", prompt="{text}").to(device)


def texts(M: int, B: int, T: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Random token ids and labels, the same on every call: (B, T) ids and (B,) labels for an
    ensemble's step, then (M·B, T) and (M·B,) for one model's step at M·B."""
    g = torch.Generator().manual_seed(0)
    ids_b = torch.randint(3, 49152, (B, T), generator=g).to(device)
    ids_mb = torch.randint(3, 49152, (M * B, T), generator=g).to(device)
    y_b = torch.randint(0, 2, (B,), generator=g).to(device)
    y_mb = torch.randint(0, 2, (M * B,), generator=g).to(device)
    return ids_b, y_b, ids_mb, y_mb


def llm_step(
    model: nn.Module, ids: torch.Tensor, y: torch.Tensor, bf16: bool
) -> Callable[[], None]:
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    mask = torch.ones_like(ids)
    model.train()

    def step() -> None:
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, attention_mask=mask)
        if logits.dim() == 2:  # a plain model
            logits = logits.unsqueeze(0)
        loss = snens.ensemble_loss(logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def llm_measures(
    num_members: int = 4,
    batch: int = 4,
    tokens: int = 64,
    repeats: int = 3,
    layers: int = 30,
    device: str | torch.device = "cpu",
    bf16: bool = False,
) -> list[Measure]:
    """The rows of the module docstring; ``batch`` texts of ``tokens`` tokens per step."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    device = torch.device(device)
    M, B, T = num_members, batch, tokens
    rows = []
    plain_norm = LlamaRMSNorm(576).to(device)
    member_norm = member_converter(plain_norm)(plain_norm, M)
    dtype = torch.bfloat16 if bf16 else torch.float32
    x = torch.randn(M * B * T, 576, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    def norm_step(layer):
        def run():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = layer(x)
            out.backward(grad)

        return run

    ratio, spread, base = compare(
        norm_step(member_norm), norm_step(plain_norm), repeats=3 * repeats, inner=5
    )
    what = "bf16 autocast" if bf16 else "float32"
    rows.append(
        Measure(
            f"member LlamaRMSNorm fwd+bwd {what}, (M·B·T, 576)", ratio, spread, "≤1.2×", base * 1e3
        )
    )

    single = lora_model(layers, 0, device)
    ens = snens.convert(copy.deepcopy(single), M)
    lora_ensemble = DeepEnsemble([lora_model(layers, s, device) for s in range(M)])
    ids_b, y_b, ids_mb, y_mb = texts(M, B, T, device)
    where = f"{layers} layers, T={T}"
    ens_step = llm_step(ens, ids_b, y_b, bf16)
    ratio, spread, base = compare(ens_step, llm_step(single, ids_mb, y_mb, bf16), repeats=repeats)
    rows.append(
        Measure(
            f"SmolLM2 ({where}): σN-Ens-LoRA step (B={B}) vs one LoRA model at M·B",
            ratio,
            spread,
            "≤1.05×",
            base * 1e3,
        )
    )
    ratio, spread, base = compare(
        ens_step, llm_step(lora_ensemble, ids_b, y_b, bf16), repeats=repeats
    )
    rows.append(
        Measure(
            f"SmolLM2 ({where}): σN-Ens-LoRA step vs LoRA ensemble, B={B}",
            ratio,
            spread,
            "≤1.0×",
            base * 1e3,
        )
    )
    split = copy.deepcopy(ens)
    split.input_policy = "split"
    ratio, spread, base = compare(
        llm_step(split, ids_b, y_b, bf16), llm_step(single, ids_b, y_b, bf16), repeats=repeats
    )
    rows.append(
        Measure(
            f"SmolLM2 ({where}): split step vs one LoRA model at B",
            ratio,
            spread,
            "≤1.1×",
            base * 1e3,
        )
    )
    return rows
