"""Faults of disks, files and names under an ImageFolder: links, special files, bad images.

Each tree holds tiny PNGs whose pixel value is ``50 · (label + 1)``, so a test can check that an
image read under a label belongs to that label's class. A test builds a fault, then checks that
it ends in correct samples and labels, or in an error that names the path and the fix.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from snens.data import (
    BadImageError,
    FolderLoader,
    ImageFolder,
    ImageFolderWarning,
    imagenet_folder,
    read_image,
)
from snens.data import imagenet as imagenet_module

Image = pytest.importorskip("PIL.Image", reason="the image folder decodes files with Pillow")


def _value(label: int) -> int:
    return 50 * (label + 1)


def _png(path, label: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 5, 3), _value(label), dtype=np.uint8)).save(path)


def _tree(root, classes=("a", "b"), per_class: int = 3):
    for label, name in enumerate(classes):
        for index in range(per_class):
            _png(root / name / f"{index}.png", label)
    return root


def _png_bytes(label: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), _value(label), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _assert_labels_follow_folders(dataset: ImageFolder) -> None:
    """Every sample lies under its label's class folder and its pixels are that class's."""
    for index, (path, label) in enumerate(dataset.samples):
        assert path.relative_to(dataset.root).parts[0] == dataset.classes[label]
        image, got = dataset[index]
        assert got == label
        assert int(image[0, 0, 0]) == _value(label), path


def _quiet(**kwargs):
    """An ImageFolder built with its construction warning recorded, not shown."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = ImageFolder(**kwargs)
    return dataset, [w for w in caught if issubclass(w.category, ImageFolderWarning)]


# 1. A symlink loop, and links into another class.


def test_symlink_loop_and_links_into_other_classes_are_not_followed(tmp_path):
    root = _tree(tmp_path / "train")
    os.symlink("..", root / "a" / "loop")  # train/a/loop -> train: the whole tree again
    os.symlink("../b", root / "a" / "into_b")  # class b's images under class a
    os.symlink("../b/0.png", root / "a" / "alias.png")  # one of b's files under a
    os.symlink(".", root / "b" / "self")  # a folder that holds itself
    with pytest.warns(ImageFolderWarning, match=r"4 symlink back into the tree"):
        dataset = ImageFolder(root)
    assert len(dataset) == 6 and dataset.targets == [0, 0, 0, 1, 1, 1]
    names = sorted(p.name for p in dataset.skipped[imagenet_module.SKIP_LINK_INTO_TREE])
    assert names == ["alias.png", "into_b", "loop", "self"]
    _assert_labels_follow_folders(dataset)


def test_links_out_of_the_tree_are_followed_and_each_folder_read_once(tmp_path):
    root = _tree(tmp_path / "train")
    outside = tmp_path / "disk2"
    _png(outside / "c" / "0.png", 2)
    _png(outside / "extra" / "0.png", 0)
    _png(outside / "file.png", 0)
    os.symlink(outside / "c", root / "c")  # a class folder on another disk
    os.symlink(outside / "extra", root / "a" / "extra")  # a sub-folder on another disk
    os.symlink(outside / "extra", root / "a" / "extra_again")  # the same folder twice
    os.symlink(outside / "file.png", root / "a" / "linked.png")  # a file on another disk
    os.symlink(outside / "file.png", root / "a" / "linked_again.png")  # the same file twice
    # disk2/extra/up -> disk2, which holds class c's folder: out of the tree and back into it.
    os.symlink("..", outside / "extra" / "up")
    dataset, caught = _quiet(root=root)
    assert dataset.classes == ["a", "b", "c"]
    paths = [str(p.relative_to(root)) for p, _ in dataset.samples]
    assert paths == [
        "a/0.png",
        "a/1.png",
        "a/2.png",
        "a/linked.png",
        "a/extra/0.png",
        "b/0.png",
        "b/1.png",
        "b/2.png",
        "c/0.png",
    ]
    assert dataset.targets == [0, 0, 0, 0, 0, 1, 1, 1, 2]
    relative = {
        reason: [str(p.relative_to(root)) for p in paths]
        for reason, paths in dataset.skipped.items()
    }
    assert relative == {
        imagenet_module.SKIP_FILE_SEEN: ["a/linked_again.png", "a/extra/up/file.png"],
        imagenet_module.SKIP_FOLDER_SEEN: ["a/extra_again", "a/extra/up/extra"],
        imagenet_module.SKIP_LINK_INTO_TREE: ["a/extra/up/c"],
    }
    assert len(caught) == 1
    _assert_labels_follow_folders(dataset)


# 2. A class folder that is a link back into the tree, or a link that cannot be followed.


@pytest.mark.parametrize(
    ("target", "pattern"),
    [
        ("c", r"train/c is a symlink that cannot be followed \(Too many levels"),
        (".", r"class folder .*train/c is a symlink to .*train, the tree itself"),
        ("..", r"class folder .*train/c is a symlink to .*, the tree itself or a folder above"),
        ("b", r"class folder .*train/c is a symlink to .*train/b, inside the tree"),
        ("missing", r"train/c is a symlink that cannot be followed \(No such file"),
    ],
)
def test_class_folder_linked_into_the_tree_is_a_clear_error(tmp_path, target, pattern):
    root = _tree(tmp_path / "train")
    os.symlink(target, root / "c")
    with pytest.raises(ValueError, match=pattern) as err:
        ImageFolder(root)
    assert "remove it" in str(err.value)


def test_two_class_folders_linked_to_one_folder_is_an_error(tmp_path):
    root = _tree(tmp_path / "train")
    _png(tmp_path / "disk2" / "x" / "0.png", 2)
    os.symlink(tmp_path / "disk2" / "x", root / "c")
    os.symlink(tmp_path / "disk2" / "x", root / "d")
    with pytest.raises(ValueError, match=r"class folders 'c' and 'd' .* are the same folder"):
        ImageFolder(root)


# 3. FIFOs, sockets and devices named like images.


@pytest.mark.timeout(30)
def test_fifo_socket_and_device_are_not_samples(tmp_path, monkeypatch):
    root = _tree(tmp_path / "train")
    os.mkfifo(root / "b" / "fifo.png")
    monkeypatch.chdir(root / "b")  # a relative name: socket paths are limited to 107 bytes
    server = socket.socket(socket.AF_UNIX)
    server.bind("socket.png")
    os.symlink(os.devnull, root / "b" / "device.png")  # a character device
    (root / "a" / "folder.png").mkdir()  # a folder named like an image is a folder
    _png(root / "a" / "folder.png" / "inner.png", 0)
    try:
        dataset, _ = _quiet(root=root)
    finally:
        server.close()
    special = sorted(p.name for p in dataset.skipped[imagenet_module.SKIP_NOT_REGULAR])
    assert special == ["device.png", "fifo.png", "socket.png"]
    assert len(dataset) == 7 and dataset.targets == [0, 0, 0, 0, 1, 1, 1]
    _assert_labels_follow_folders(dataset)
    # read_image itself refuses them at once instead of blocking on the FIFO.
    for name in ("fifo.png", "device.png"):
        with pytest.raises(BadImageError, match=f"{name}: not a regular file but a FIFO"):
            read_image(root / "b" / name)
    with pytest.raises(BadImageError, match=r"folder.png: not a regular file but a folder"):
        read_image(root / "a" / "folder.png")


# 4. Zero-byte, corrupt and truncated images.


_BAD = ("bad_garbage.png", "bad_header.png", "bad_truncated.png")  # sorted after 0…2.png


def _bad_files(root) -> dict[str, bytes]:
    good = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(good, "PNG")  # large enough that half of it cuts the pixels
    good = good.getvalue()
    files = {
        "bad_garbage.png": b"this is not an image" * 5,
        "bad_header.png": good[:20],
        "bad_truncated.png": good[: len(good) // 2],
    }
    for name, data in files.items():
        (root / "a" / name).write_bytes(data)
    return files


def test_zero_byte_files_are_left_out_at_construction_or_refused(tmp_path):
    root = _tree(tmp_path / "train")
    (root / "a" / "empty.png").write_bytes(b"")
    with pytest.warns(ImageFolderWarning, match=r"1 empty file \(0 bytes\) \(.*empty.png\)"):
        dataset = ImageFolder(root)
    assert len(dataset) == 6
    with pytest.raises(BadImageError, match=r"1 empty \(0-byte\) image files: .*empty.png"):
        ImageFolder(root, on_bad_image="raise")


def test_bad_image_mid_epoch_is_replaced_by_its_class_and_counted(tmp_path):
    root = _tree(tmp_path / "train")
    _bad_files(root)
    dataset = ImageFolder(root)  # construction does not decode: the files are listed
    assert len(dataset) == 9 and dataset.targets == [0] * 6 + [1] * 3
    with pytest.warns(ImageFolderWarning) as caught:
        batches = list(torch.utils.data.DataLoader(dataset, batch_size=4))
    labels = torch.cat([y for _, y in batches])
    images = torch.cat([x for x, _ in batches])
    assert labels.tolist() == dataset.targets  # every batch full, no label changed
    expected = torch.tensor([_value(label) for label in dataset.targets], dtype=torch.uint8)
    assert torch.equal(images[:, 0, 0, 0], expected)  # each replacement is of the same class
    # One warning per read that found new bad files: bad_garbage's found all three, as its
    # replacement was searched through the rest of class a.
    assert len(caught) == 1
    message = str(caught[-1].message)
    assert "3 bad files found so far" in message
    assert "bad_garbage.png" in message and "bad_truncated.png" in message
    assert "the label is unchanged" in message and "scan=True" in message
    assert sorted(p.name for p in dataset.bad_images) == sorted(_BAD)
    # The replacement is the next good image of the class, cyclically: bad_header -> 0.png.
    assert dataset.samples[4][0].name == "bad_header.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # known bad files do not warn again
        torch.testing.assert_close(dataset[4][0], read_image(root / "a" / "0.png"))


def test_bad_images_through_worker_processes_keep_labels(tmp_path):
    root = _tree(tmp_path / "train")
    _bad_files(root)
    dataset = ImageFolder(root)
    loader = FolderLoader(dataset, 3, shuffle=True, seed=1, num_workers=2)
    seen = []
    for x, y in loader:
        assert torch.equal(x[:, 0, 0, 0], (50 * (y + 1)).to(torch.uint8))
        seen += y.tolist()
    assert sorted(seen) == dataset.targets
    # the workers' finds reach the main process (they had been lost with the workers)
    assert sorted(p.name for p in dataset.bad_images) == sorted(_BAD)
    assert set(dataset.bad_images.values()) == {"found bad by a DataLoader worker"}


def test_spawned_workers_share_the_bad_image_flags(tmp_path):
    """Spawned (not forked) workers get the data set through torch's pickler, which passes the
    shared-memory flags by reference, so their finds are counted too."""
    root = _tree(tmp_path / "train")
    _bad_files(root)
    dataset = ImageFolder(root)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=9, num_workers=1, multiprocessing_context="spawn"
    )
    ((x, y),) = list(loader)
    assert y.tolist() == dataset.targets
    assert sorted(p.name for p in dataset.bad_images) == sorted(_BAD)
    # the main process now skips them without decoding: no warning, the replacement read
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(dataset[4][0], read_image(root / "a" / "0.png"))


def test_on_bad_image_raise_names_the_file_and_the_way_on(tmp_path):
    root = _tree(tmp_path / "train")
    _bad_files(root)
    dataset = ImageFolder(root, on_bad_image="raise")
    with pytest.raises(BadImageError) as err:
        dataset[5]
    message = str(err.value)
    assert str(root / "a" / "bad_truncated.png") in message and "class 'a'" in message
    assert "cannot be decoded (OSError: image file is truncated)" in message
    assert "on_bad_image='skip'" in message
    assert isinstance(err.value, OSError) and err.value.path == root / "a" / "bad_truncated.png"
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=1)
    with pytest.raises(BadImageError, match="bad_garbage.png"):  # the same type from a worker
        next(iter(loader))


def test_scan_lists_every_bad_file_up_front(tmp_path):
    root = _tree(tmp_path / "train")
    files = _bad_files(root)
    with pytest.warns(ImageFolderWarning, match=r"3 undecodable image"):
        dataset = ImageFolder(root, scan=True)
    assert sorted(p.name for p in dataset.skipped[imagenet_module.SKIP_UNDECODABLE]) == sorted(
        files
    )
    assert len(dataset) == 6 and dataset.targets == [0, 0, 0, 1, 1, 1]
    _assert_labels_follow_folders(dataset)
    with pytest.raises(BadImageError, match=r"3 of 9 images cannot be decoded") as err:
        ImageFolder(root, scan=True, on_bad_image="raise")
    assert all(name in str(err.value) for name in files)


def test_class_without_a_decodable_image_is_an_error(tmp_path):
    root = _tree(tmp_path / "train", per_class=1)
    (root / "a" / "0.png").write_bytes(b"junk")
    (root / "a" / "1.png").write_bytes(b"more junk")
    dataset = ImageFolder(root)
    with pytest.raises(BadImageError, match=r"none of the 2 images of class 'a' decodes"):
        dataset[0]
    with pytest.raises(BadImageError, match=r"no image of class folders \['a'\] decodes"):
        ImageFolder(root, scan=True)


def test_unknown_bad_image_policy_is_refused(tmp_path):
    root = _tree(tmp_path / "train")
    with pytest.raises(ValueError, match=r"on_bad_image must be one of \['skip', 'raise'\]"):
        ImageFolder(root, on_bad_image="ignore")
    imagenet_root = tmp_path / "data" / "imagenet"
    _tree(imagenet_root / "val")
    _bad_files(imagenet_root / "val")
    with pytest.raises(BadImageError, match="3 of 9 images"):
        imagenet_folder(tmp_path / "data", "val", on_bad_image="raise", scan=True)


def test_read_image_errors_name_the_file(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "text.png").write_bytes(b"plain text")
    cases = {
        "missing.png": r"missing.png: cannot open it \(No such file or directory\)",
        "empty.png": r"empty.png: an empty file \(0 bytes\); delete or replace the file",
        "text.png": r"text.png: not an image format Pillow reads",
    }
    for name, pattern in cases.items():
        with pytest.raises(BadImageError, match=pattern):
            read_image(tmp_path / name)


# More faults of disks, files and names.


def test_file_deleted_or_replaced_by_a_folder_after_listing(tmp_path):
    root = _tree(tmp_path / "train")
    dataset = ImageFolder(root)
    (root / "a" / "0.png").unlink()
    (root / "a" / "1.png").unlink()
    (root / "a" / "1.png").mkdir()
    with pytest.warns(ImageFolderWarning, match=r"0.png: cannot open it \(No such file"):
        image, label = dataset[0]
    assert label == 0 and int(image[0, 0, 0]) == _value(0)  # a/2.png in their place
    assert dataset.bad_images[root / "a" / "1.png"] == "not a regular file but a folder"


def test_non_utf8_names_are_read_and_shown_escaped(tmp_path):
    root = _tree(tmp_path / "train")
    raw_class = os.fsencode(root) + b"/caf\xe9"
    os.mkdir(raw_class)
    with open(raw_class + b"/\xff.png", "wb") as f:
        f.write(_png_bytes(2))
    with open(raw_class + b"/\xfe.png", "wb") as f:
        f.write(b"broken")
    dataset = ImageFolder(root)
    assert dataset.classes == ["a", "b", os.fsdecode(b"caf\xe9")]
    with pytest.warns(ImageFolderWarning) as caught:
        _assert_labels_follow_folders(dataset)
    message = str(caught[0].message)
    message.encode("utf-8")  # a log that encodes strictly can write it
    assert "caf\\xe9/\\xfe.png" in message


def test_empty_class_and_class_of_other_files_are_named(tmp_path):
    root = _tree(tmp_path / "train")
    (root / "empty").mkdir()
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("no images here")
    (root / "notes" / "._0.png").write_bytes(b"AppleDouble metadata")  # hidden: not a sample
    (root / "zeros").mkdir()
    (root / "zeros" / "0.png").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageFolderWarning)
        ImageFolder(root)
    message = str(err.value)
    assert "without images ['empty', 'notes', 'zeros']" in message
    assert "1 empty file (0 bytes)" in message and "put images in them or remove them" in message


def test_hidden_files_and_folders_are_not_samples(tmp_path):
    root = _tree(tmp_path / "train")
    (root / "a" / "._0.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    _png(root / "a" / ".thumbs" / "0.png", 1)
    _png(root / ".trash" / "0.png", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # hidden entries are not read, so nothing to warn about
        dataset = ImageFolder(root)
    assert dataset.classes == ["a", "b"] and len(dataset) == 6
    _assert_labels_follow_folders(dataset)


def test_thousands_of_classes_and_a_deep_tree(tmp_path):
    root = tmp_path / "train"
    names = [f"n{i:05d}" for i in range(3000)]
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "0.png").write_bytes(_png_bytes(0))
    chain = [str(root / names[0])]
    for _ in range(1200):  # deeper than Python's recursion limit (os.walk recurses)
        chain.append(chain[-1] + "/d")
        os.mkdir(chain[-1])
    deep = Path(chain[-1])
    (deep / "0.png").write_bytes(_png_bytes(0))
    try:
        dataset = ImageFolder(root)
    finally:
        # shutil.rmtree recurses too: take the chain down here, or pytest's cleanup fails.
        (deep / "0.png").unlink()
        for folder in reversed(chain[1:]):
            os.rmdir(folder)
    assert dataset.classes == names and len(dataset) == 3001
    assert dataset.targets == [0] + list(range(3000))
    assert dataset.samples[1][0] == deep / "0.png"


def _unreadable_in_a_child(file_tree: Path, folder_tree: Path) -> dict:
    """Read the trees in a child process as ``nobody`` (as root) or as this user."""
    script = f"""
import json, warnings
from snens.data import ImageFolder
out = {{}}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    image, label = ImageFolder({str(file_tree)!r})[0]
out["label"], out["value"] = label, int(image[0, 0, 0])
out["warning"] = str(caught[-1].message)
try:
    ImageFolder({str(folder_tree)!r})
except OSError as err:
    out["error"] = f"{{type(err).__name__}}: {{err}}"
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["HOME"] = str(file_tree.parent)
    user = 65534 if os.geteuid() == 0 else None
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        user=user,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _unreadable_simulated(file_tree: Path, folder_tree: Path, monkeypatch) -> dict:
    """The kernel's answers to an unprivileged reader, given by patched os.open/os.scandir."""
    real_open, real_scandir = os.open, os.scandir
    denied = {str(file_tree / "a" / "0.png"), str(folder_tree / "b")}

    def refuse(path):
        if not isinstance(path, int) and os.fspath(path) in denied:
            raise PermissionError(13, "Permission denied", os.fspath(path))

    def fake_open(path, *args, **kwargs):
        refuse(path)
        return real_open(path, *args, **kwargs)

    def fake_scandir(path="."):
        refuse(path)
        return real_scandir(path)

    out = {}
    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr(os, "open", fake_open)
        patch.setattr(os, "scandir", fake_scandir)
        warnings.simplefilter("always")
        image, label = ImageFolder(file_tree)[0]
        out["label"], out["value"] = label, int(image[0, 0, 0])
        out["warning"] = str(caught[-1].message)
        with pytest.raises(OSError) as err:
            ImageFolder(folder_tree)
    out["error"] = f"{type(err.value).__name__}: {err.value}"
    return out


def test_unreadable_file_and_folder(monkeypatch):
    """chmod 000 on a file and on a folder. Root reads everything, so as root a child process
    reads them as ``nobody``; where this interpreter is out of nobody's reach (under /root),
    the permission errors are simulated instead."""
    base = Path(tempfile.mkdtemp(prefix="snens-perm-"))  # outside pytest's private folder
    try:
        base.chmod(0o755)
        file_tree = _tree(base / "files")
        folder_tree = _tree(base / "folders")
        (file_tree / "a" / "0.png").chmod(0o000)
        (folder_tree / "b").chmod(0o000)
        try:
            out = _unreadable_in_a_child(file_tree, folder_tree)
        except PermissionError:  # nobody may not run this interpreter
            out = _unreadable_simulated(file_tree, folder_tree, monkeypatch)
    finally:
        (base / "files" / "a" / "0.png").chmod(0o644)
        (base / "folders" / "b").chmod(0o755)
        shutil.rmtree(base)
    assert out["label"] == 0 and out["value"] == _value(0)  # a/1.png in a/0.png's place
    assert "0.png: cannot open it (Permission denied)" in out["warning"]
    assert out["error"].startswith("PermissionError: [Errno 13] cannot list the folder")
    assert f"{folder_tree / 'b'} (Permission denied); make it readable (chmod a+rx)" in out["error"]


@pytest.mark.filterwarnings("ignore::UserWarning:PIL.*")  # Pillow's notes on damaged tags
def test_damaged_bytes_of_every_format_end_in_an_image_or_a_bad_image_error(tmp_path):
    """Truncations and byte flips of PNG, JPEG, BMP, TIFF and WebP files: read_image returns
    an RGB image or raises BadImageError, never another exception from inside Pillow."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    outcomes = {"image": 0, "bad": 0}
    for fmt in ("PNG", "JPEG", "BMP", "TIFF", "WEBP"):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, fmt)
        good = buffer.getvalue()
        for trial in range(40):
            data = bytearray(good)
            if trial % 2:
                data = data[: rng.integers(1, len(data))]
            else:
                for at in rng.integers(0, len(data), 1 + trial % 7):
                    data[at] = rng.integers(0, 256)
            path = tmp_path / f"{fmt}_{trial}.img"
            path.write_bytes(bytes(data))
            try:
                image = read_image(path)
            except BadImageError as err:
                assert str(path) in str(err) and err.reason
                outcomes["bad"] += 1
            else:
                assert image.dtype == torch.uint8 and image.shape[0] == 3
                outcomes["image"] += 1
    assert outcomes["bad"] > 50 and outcomes["image"] > 10  # both outcomes were exercised


def test_decompression_bomb_is_a_bad_image(tmp_path, monkeypatch):
    _png(tmp_path / "big.png", 0)  # 20 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5)  # Pillow refuses more than twice that
    with pytest.raises(BadImageError, match=r"big.png: cannot be decoded \(DecompressionBomb"):
        read_image(tmp_path / "big.png")


def test_hard_links_are_one_sample_per_class(tmp_path):
    root = _tree(tmp_path / "train")
    os.link(root / "a" / "0.png", root / "a" / "copy.png")  # one file, twice in class a
    os.link(root / "b" / "0.png", root / "a" / "from_b.png")  # one file in classes a and b
    dataset, _ = _quiet(root=root)
    assert [p.name for p in dataset.skipped[imagenet_module.SKIP_FILE_SEEN]] == ["copy.png"]
    assert [str(p.relative_to(root)) for p, _ in dataset.samples] == [
        "a/0.png",
        "a/1.png",
        "a/2.png",
        "a/from_b.png",
        "b/0.png",
        "b/1.png",
        "b/2.png",
    ]
    assert dataset.targets == [0, 0, 0, 0, 1, 1, 1]  # a sample of each class, as the folders say
