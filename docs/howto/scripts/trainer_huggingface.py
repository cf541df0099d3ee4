"""σN-Ens trained by the Hugging Face Trainer (SnensTrainer), saved and loaded again.

Needs `pip install '.[huggingface]'`. A small BERT built from its configuration stands
in for a pretrained model (with one:
`AutoModelForSequenceClassification.from_pretrained(name, num_labels=2)`), on token
sequences whose class is set by their first token.
"""

import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForSequenceClassification, TrainingArguments

import snens
from snens.integrations.huggingface import SnensTrainer, load_ensemble

transformers.logging.set_verbosity_error()
config = transformers.BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    num_labels=2,
)


class Texts(torch.utils.data.Dataset):
    """Tokenized texts as a Trainer takes them: the model's inputs and the labels."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 100, (n, 12), generator=g)
        self.labels = (self.ids[:, 0] > 50).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        mask = torch.ones(12, dtype=torch.long)
        return {
            "input_ids": self.ids[i],
            "attention_mask": mask,
            "labels": self.labels[i],
        }


def metrics(prediction):  # the (N, K) mean probabilities of the members, and the labels
    return {
        "accuracy": float(
            (prediction.predictions.argmax(-1) == prediction.label_ids).mean()
        )
    }


train, test = Texts(512, seed=0), Texts(128, seed=1)
directory = Path(tempfile.mkdtemp())
torch.manual_seed(0)
model = AutoModelForSequenceClassification.from_config(config)

# [train]
ens = snens.convert(model, num_members=4)
trainer = SnensTrainer(
    model=ens,
    args=TrainingArguments(
        output_dir=directory, num_train_epochs=3, learning_rate=1e-3, report_to="none"
    ),
    train_dataset=train,
    eval_dataset=test,
    compute_metrics=metrics,
    temperature=1.0,
    diversity_weight=0.1,
    gamma_lr_multiplier=30.0,
)
trainer.train()  # logs loss (the task loss, ~ln K at the start) and diversity_gain
# [train end]
evaluation = trainer.evaluate()
print(
    f"eval_loss (NLL of the members' mean) {evaluation['eval_loss']:.3f}, "
    f"accuracy {evaluation['eval_accuracy']:.3f}"
)
assert evaluation["eval_accuracy"] > 0.7

# [save]
trainer.save_model(directory / "my-ensemble")

# every weight comes from the save: from_config, or from_pretrained(name, num_labels=2)
fresh = AutoModelForSequenceClassification.from_config(config)
again = load_ensemble(fresh, directory / "my-ensemble")  # or (build_model, directory)
# [save end]
batch = {
    k: torch.stack([test[i][k] for i in range(8)])
    for k in ("input_ids", "attention_mask")
}
with torch.no_grad():
    assert torch.equal(again(**batch), ens.eval()(**batch))
print("saved and loaded: the same (M, B, K) outputs", tuple(again(**batch).shape))
