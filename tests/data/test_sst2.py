"""SST-2 from a zip fixture laid out as GLUE's ``SST-2.zip``."""

from __future__ import annotations

import hashlib
import re
import zipfile

import pytest

from snens.data import SST2_CLASSES, ChecksumError, load_sst2
from snens.data import sst2 as sst2_module

TRAIN_TSV = (
    "sentence\tlabel\n"
    "hide new secretions from the parental units \t0\n"
    'the "greatest" film of the year , or so they say \t1\n'
    "that loves its characters and communicates something rather beautiful \t1\n"
)
DEV_TSV = "sentence\tlabel\nit 's a charming and often affecting journey . \t1\n"
TEST_TSV = "index\tsentence\n0\tuneasy mishmash of styles and genres .\n"


@pytest.fixture
def sst2_zip(tmp_path):
    path = tmp_path / "fixture" / "SST-2.zip"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in (("train", TRAIN_TSV), ("dev", DEV_TSV), ("test", TEST_TSV)):
            zf.writestr(f"SST-2/{name}.tsv", text)
    return path


def test_load_sst2_from_zip_keeps_quotes(tmp_path, sst2_zip):
    (tmp_path / "sst-2").mkdir()
    (tmp_path / "sst-2" / "SST-2.zip").write_bytes(sst2_zip.read_bytes())
    texts, labels = load_sst2("train", root=tmp_path)
    assert texts == [
        "hide new secretions from the parental units",
        'the "greatest" film of the year , or so they say',  # QUOTE_NONE: quotes are text
        "that loves its characters and communicates something rather beautiful",
    ]
    assert labels == [0, 1, 1]
    assert load_sst2("validation", root=tmp_path) == (
        ["it 's a charming and often affecting journey ."],
        [1],
    )
    assert SST2_CLASSES == ("negative", "positive")


def test_load_sst2_downloads_with_checksum(monkeypatch, tmp_path, sst2_zip):
    monkeypatch.setattr(sst2_module, "SST2_URL", sst2_zip.as_uri())
    monkeypatch.setattr(sst2_module, "SST2_MD5", hashlib.md5(sst2_zip.read_bytes()).hexdigest())
    root = tmp_path / "root"
    assert load_sst2("validation", root=root, download=True)[1] == [1]
    assert sorted(p.name for p in (root / "sst-2").iterdir()) == ["SST-2.zip"]


def test_sst2_checksum_mismatch_leaves_nothing(monkeypatch, tmp_path, sst2_zip):
    monkeypatch.setattr(sst2_module, "SST2_URL", sst2_zip.as_uri())
    root = tmp_path / "root"
    with pytest.raises(ChecksumError, match="9f81648d4199384278b86e315dac217c"):
        load_sst2("train", root=root, download=True)  # fixture bytes != official zip
    assert list((root / "sst-2").iterdir()) == []


def test_sst2_extracted_folder(tmp_path):
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "dev.tsv").write_text(DEV_TSV, encoding="utf-8")
    assert load_sst2("validation", root=tmp_path)[1] == [1]


def test_sst2_missing_bad_split_and_bad_rows(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_sst2("train", root=tmp_path)
    message = str(err.value)
    assert "download=True" in message and "SNENS_DATA" in message
    assert "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip" in message
    with pytest.raises(ValueError, match=r"\['train', 'validation'\].*'test'"):
        load_sst2("test", root=tmp_path)
    folder = tmp_path / "sst-2" / "SST-2"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("sentence\tlabel\ngood\t2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        load_sst2("train", root=tmp_path)


def _zip_in_root(root, data: bytes):
    (root / "sst-2").mkdir(exist_ok=True)
    path = root / "sst-2" / "SST-2.zip"
    path.write_bytes(data)
    return path


def test_a_member_declaring_too_many_bytes_is_refused_before_reading(tmp_path, monkeypatch):
    """A zip bomb (or a damaged header) would be inflated into memory by the TSV reader."""
    monkeypatch.setattr(sst2_module, "MAX_TSV_BYTES", 100)
    buffer = tmp_path / "big.zip"
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("SST-2/train.tsv", "sentence\tlabel\n" + "a fine film .\t1\n" * 50)
    path = _zip_in_root(tmp_path, buffer.read_bytes())
    with pytest.raises(ValueError) as err:
        load_sst2("train", root=tmp_path)
    assert str(err.value) == (
        f"{path}:SST-2/train.tsv declares 815 bytes, above the 100 an SST-2 file may hold; it "
        f"is not GLUE's SST-2.zip (delete {path} and download it again "
        "(--set data.download=true))"
    )


@pytest.mark.parametrize("damage", ["not_a_zip", "truncated", "flipped"])
def test_a_damaged_zip_is_a_clear_error(tmp_path, sst2_zip, damage):
    data = sst2_zip.read_bytes()
    if damage == "not_a_zip":
        data = b"<html>rate limited</html>"
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # a byte of train.tsv's stored text: the CRC check fails while reading
        at = data.index(b"secretions")
        data = data[:at] + b"X" + data[at + 1 :]
    path = _zip_in_root(tmp_path, data)
    with pytest.raises(ValueError, match=r"is damaged \(BadZipFile: ") as err:
        load_sst2("train", root=tmp_path)
    assert str(path) in str(err.value) and "download it again" in str(err.value)


def test_missing_sst2_names_the_engine_switch(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--set data\.download=true"):
        load_sst2("train", root=tmp_path)


def _one_member_zip(tmp_path, text: str) -> bytes:
    buffer = tmp_path / "one.zip"
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("SST-2/train.tsv", text)
    return buffer.read_bytes()


def _patched(data: bytes, local: int, central: int, value: int) -> bytes:
    """``data`` with the 2-byte field at ``local`` / ``central`` of the local and the central
    directory header set to ``value`` (one member)."""
    out = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", local), (b"PK\x01\x02", central)):
        at = out.index(signature) + offset
        out[at : at + 2] = value.to_bytes(2, "little")
    return bytes(out)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            "compression",
            "is stored with a compression method Python's zipfile cannot read (That "
            "compression method is not supported); GLUE's SST-2.zip is deflated, so this is "
            "another file",
        ),
        ("encrypted", "is encrypted, and GLUE's SST-2.zip is not; it is another file"),
    ],
)
def test_a_zip_member_zipfile_cannot_read_names_the_zip_and_member(tmp_path, damage, reason):
    """An unsupported compression method (here 6, implode) raised zipfile's bare
    NotImplementedError, the encrypted flag its RuntimeError; neither named the file."""
    data = _one_member_zip(tmp_path, TRAIN_TSV)
    if damage == "compression":
        data = _patched(data, local=8, central=10, value=6)
    else:
        data = _patched(data, local=6, central=8, value=0x1)
    path = _zip_in_root(tmp_path, data)
    with pytest.raises(ValueError) as err:
        load_sst2("train", root=tmp_path)
    assert str(err.value) == (
        f"{path}:SST-2/train.tsv {reason} (delete {path} and download it again "
        "(--set data.download=true))"
    )


def test_a_field_over_the_csv_limit_names_the_zip_member_and_line(tmp_path):
    """A sentence over csv's field limit (131,072 characters) raised a bare _csv.Error."""
    text = TRAIN_TSV + "a" * 140_000 + "\t1\n"
    path = _zip_in_root(tmp_path, _one_member_zip(tmp_path, text))
    with pytest.raises(ValueError) as err:
        load_sst2("train", root=tmp_path)
    assert str(err.value) == (
        f"{path}:SST-2/train.tsv line 5: field larger than field limit (131072); SST-2's "
        "sentences are at most a few hundred characters, so the file is damaged or not SST-2 "
        f"(delete {path} and download it again (--set data.download=true))"
    )


def test_invalid_utf8_names_the_file_it_is_in(tmp_path):
    """Invalid UTF-8 in an extracted SST-2/train.tsv raised a UnicodeDecodeError naming no
    file; in the zip it named the zip only."""
    bad = TRAIN_TSV.encode() + b"caf\xe9 au lait\t1\n"  # Latin-1, not UTF-8
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "train.tsv").write_bytes(bad)
    with pytest.raises(ValueError) as err:
        load_sst2("train", root=tmp_path)
    assert str(err.value) == (
        f"{folder / 'train.tsv'} is not UTF-8 text (byte 0xe9: invalid continuation byte); "
        "the file is damaged or not SST-2 (replace "
        f"{folder} with the SST-2 folder of GLUE's SST-2.zip, or delete it and download the "
        "zip again (--set data.download=true))"
    )
    (folder / "train.tsv").unlink()
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("SST-2/train.tsv", bad)
    path = _zip_in_root(tmp_path, archive.read_bytes())
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}:SST-2/train.tsv is not UTF-8")):
        load_sst2("train", root=tmp_path)
