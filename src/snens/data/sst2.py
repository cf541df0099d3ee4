"""SST-2, the binary Stanford Sentiment Treebank task of GLUE (Socher et al. 2013).

GLUE's ``SST-2.zip`` holds ``train.tsv`` and ``dev.tsv`` (``test.tsv``'s labels are hidden),
``sentence<TAB>label`` unquoted, read straight from the zip in ``<data root>/sst-2/`` or from
an extracted ``SST-2/`` folder there or in the data root.
"""

from __future__ import annotations

import csv
import io
import os
import zipfile
import zlib
from pathlib import Path

from .download import check_split, data_root, download_url, not_found

__all__ = ["SST2_CLASSES", "load_sst2"]

SST2_URL = "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"
# The MD5 that torchtext and other GLUE loaders pin for this URL.
SST2_MD5 = "9f81648d4199384278b86e315dac217c"
SST2_CLASSES = ("negative", "positive")
_SPLIT_FILES = {"train": "train.tsv", "validation": "dev.tsv"}
_HEADER = ["sentence", "label"]
# what one TSV of the zip may hold; checked before any of it is decompressed
MAX_TSV_BYTES = 256 * 2**20


def _parse_tsv(stream: io.TextIOBase, source: str, fix: str) -> tuple[list[str], list[int]]:
    """The sentences and labels of one TSV; ``source`` and ``fix`` go into errors."""
    reader = csv.reader(stream, delimiter="\t", quoting=csv.QUOTE_NONE)
    texts, labels = [], []
    try:
        header = next(reader, None)
        if header != _HEADER:
            raise ValueError(f"{source}: expected the header {_HEADER}, got {header}")
        for line, row in enumerate(reader, start=2):
            if len(row) != 2 or row[1] not in ("0", "1"):
                raise ValueError(f"{source} line {line}: expected 'sentence<TAB>0|1', got {row!r}")
            texts.append(row[0].strip())
            labels.append(int(row[1]))
    except csv.Error as err:  # a field over csv.field_size_limit() (131,072 characters)
        raise ValueError(
            f"{source} line {reader.line_num}: {err}; SST-2's sentences are at most a few "
            f"hundred characters, so the file is damaged or not SST-2 ({fix})"
        ) from err
    except UnicodeDecodeError as err:  # (its position counts from a decoded chunk, not the file)
        byte = err.object[err.start : err.start + 1].hex()
        raise ValueError(
            f"{source} is not UTF-8 text (byte 0x{byte}: {err.reason}); the file is damaged or "
            f"not SST-2 ({fix})"
        ) from err
    return texts, labels


def load_sst2(
    split: str = "train", root: str | os.PathLike | None = None, download: bool = False
) -> tuple[list[str], list[int]]:
    """Load the SST-2 sentences and their sentiment labels (1 = positive).

    ``split`` is ``"train"`` or ``"validation"`` (GLUE's ``dev.tsv``, the usual test set);
    ``download`` fetches ``SST-2.zip`` (MD5 checked) when no local copy exists.

    Returns:
        ``(texts, labels)``, sentences stripped, in file order.

    Raises:
        ValueError: unknown ``split``; a file without the ``sentence/label`` layout.
        FileNotFoundError: no local copy and ``download=False``; the message says how to get it.
        ChecksumError: the downloaded zip differs from the official one (nothing is kept).
    """
    check_split(split, _SPLIT_FILES)
    tsv = _SPLIT_FILES[split]
    base = data_root(root)
    archive = base / "sst-2" / "SST-2.zip"
    folders = (base / "sst-2" / "SST-2", base / "SST-2")
    for folder in folders:
        if (folder / tsv).is_file():
            fix = (
                f"replace {folder} with the SST-2 folder of GLUE's SST-2.zip, or delete it and "
                "download the zip again (--set data.download=true)"
            )
            with open(folder / tsv, encoding="utf-8", newline="") as f:
                return _parse_tsv(f, str(folder / tsv), fix)
    if download:
        download_url(SST2_URL, archive, md5=SST2_MD5)
    if not archive.is_file():
        looked = f"looked for {archive} and for {tsv} in {' and '.join(map(str, folders))}"
        raise not_found("SST-2", looked, SST2_URL, archive)
    return _read_zip(archive, f"SST-2/{tsv}")


def _read_zip(archive: Path, member: str) -> tuple[list[str], list[int]]:
    again = f"delete {archive} and download it again (--set data.download=true)"
    where = f"{archive}:{member}"
    try:
        with zipfile.ZipFile(archive) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError as err:
                raise ValueError(
                    f"{archive} has no {member}; it is not GLUE's SST-2.zip ({again})"
                ) from err
            # zipfile never inflates past the declared size, so this bounds what is read
            if info.file_size > MAX_TSV_BYTES:
                raise ValueError(
                    f"{where} declares {info.file_size:,} bytes, above the "
                    f"{MAX_TSV_BYTES:,} an SST-2 file may hold; it is not GLUE's SST-2.zip "
                    f"({again})"
                )
            if info.flag_bits & 0x1:  # zipfile would ask for a password (RuntimeError)
                raise ValueError(
                    f"{where} is encrypted, and GLUE's SST-2.zip is not; it is another file "
                    f"({again})"
                )
            try:
                raw = zf.open(info)
            except (NotImplementedError, RuntimeError) as err:  # e.g. compression type 6
                raise ValueError(
                    f"{where} is stored with a compression method Python's zipfile cannot read "
                    f"({err}); GLUE's SST-2.zip is deflated, so this is another file ({again})"
                ) from err
            with raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as text:
                return _parse_tsv(text, where, again)
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:
        raise ValueError(f"{archive} is damaged ({type(err).__name__}: {err}); {again}") from err
