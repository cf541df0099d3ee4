"""Calibrated LLM fine-tuning: σN-Ens over a LoRA-adapted Llama-family model, saved and loaded.

A tiny randomly initialized Llama stands in for a pretrained one here; with a real model, load
it with ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)``.
"""

import tempfile

import peft
import torch
import transformers

import snens
from snens.integrations.peft import from_pretrained, save_pretrained


def base_model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        num_labels=2,
    )
    return transformers.LlamaForSequenceClassification(config)


lora = peft.LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
ens = snens.convert(peft.get_peft_model(base_model(), lora), num_members=4)
print(ens.report)
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=3e-4))
inputs = {"input_ids": torch.randint(1, 100, (8, 12)), "attention_mask": torch.ones(8, 12)}
labels = torch.randint(0, 2, (8,))
for step in range(3):
    logits = ens(**inputs)  # (M, B, K)
    loss = snens.ensemble_loss(logits, labels) + snens.diversity_loss(ens, 5.0, 0.01)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

directory = tempfile.mkdtemp()
save_pretrained(ens, directory)  # the adapters and the member layers, not the base model
again = from_pretrained(base_model(), directory)
with torch.no_grad():
    assert torch.equal(again.eval()(**inputs), ens.eval()(**inputs))
print("saved and loaded: the same outputs")
