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
