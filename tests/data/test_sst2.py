"""SST-2 from a zip fixture laid out as GLUE's ``SST-2.zip``."""

from __future__ import annotations

import hashlib
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
