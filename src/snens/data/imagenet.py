"""ImageNet as a class-folder tree: listing, reading and decoding the images safely.

ImageNet's licence forbids redistribution, so nothing downloads: lay ILSVRC-2012 out as
``<data root>/imagenet/{train,val}/<wnid>/*.JPEG`` (val sorted into class folders, e.g. with
``valprep.sh``). Images decode with Pillow to uint8 RGB ``(3, H, W)``.

A sample is a regular, non-empty, non-hidden file with an image extension under a class
folder. Links back into the tree, special files, broken links and empty files are skipped,
counted in :attr:`ImageFolder.skipped` and named in one :class:`ImageFolderWarning`; a class
folder that cannot be read as one is an error (skipping it would shift every later label).
An undecodable image met while reading is replaced by the next image of its class under
``on_bad_image="skip"``, or raises :class:`BadImageError` under ``"raise"``.
"""

from __future__ import annotations

import bisect
import os
import stat
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .download import check_split, data_root
from .images import image_to_rgb
from .transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    EvalTransform,
    TrainTransform,
    center_crop,
    normalize,
    resize_shorter,
)

__all__ = [
    "BAD_IMAGE_POLICIES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "BadImageError",
    "EvalTransform",
    "ImageFolder",
    "ImageFolderWarning",
    "TrainTransform",
    "center_crop",
    "imagenet_folder",
    "normalize",
    "read_image",
    "resize_shorter",
]

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_SPLITS = ("train", "val")
BAD_IMAGE_POLICIES = ("skip", "raise")
# Reasons an entry is not a sample, the keys of ImageFolder.skipped.
SKIP_LINK_INTO_TREE = "symlink back into the tree"
SKIP_FOLDER_SEEN = "folder already read through another path"
SKIP_FILE_SEEN = "file already listed under another name"
SKIP_NOT_REGULAR = "not a regular file (FIFO, socket or device)"
SKIP_BROKEN = "broken symlink or unreadable entry"
SKIP_EMPTY = "empty file (0 bytes)"
SKIP_UNDECODABLE = "undecodable image (found by scan=True)"
_NAMED = 5  # paths named in a message; the rest are counted
_WARN_EACH = 10  # per process: warn on each of the first 10 bad files, then at powers of 2
# Pillow releases the GIL while it decodes: a scan runs in threads
_SCAN_THREADS = min(32, os.cpu_count() or 1)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO must not wait for a writer


class BadImageError(OSError):
    """An image file that cannot be read or decoded; ``path``, and ``reason`` (what is wrong)."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, reason: str = ""):
        # one positional argument, so that a DataLoader re-raises it from a worker as itself
        super().__init__(message)
        self.path = path
        self.reason = reason or message


class ImageFolderWarning(UserWarning):
    """Entries an :class:`ImageFolder` skipped, or bad images it replaced while reading."""


def _shown(path: str | os.PathLike) -> str:
    """``path`` for a message, non-UTF-8 bytes written as ``\\xNN`` escapes."""
    return os.fsdecode(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _named(paths: Sequence[str | os.PathLike]) -> str:
    listed = ", ".join(_shown(p) for p in paths[:_NAMED])
    return listed + (f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else "")


def _pillow_image():
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("reading image files needs Pillow: pip install pillow") from err
    return Image


def read_image(path: str | os.PathLike) -> torch.Tensor:
    """Decode an image file to RGB (grey, palette and CMYK images are converted).

    Returns:
        uint8 tensor ``(3, H, W)``.

    Raises:
        ImportError: Pillow is not installed.
        BadImageError: the file is missing, unreadable, not a regular file, empty or undecodable.
    """
    image_module = _pillow_image()
    try:
        fd = os.open(path, os.O_RDONLY | _O_NONBLOCK)
    except OSError as err:
        reason = f"cannot open it ({err.strerror or err})"
        raise BadImageError(f"{_shown(path)}: {reason}", path, reason) from err
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO, socket or device"
        reason = f"not a regular file but {kind}"
    elif info.st_size == 0:
        os.close(fd)
        reason = "an empty file (0 bytes)"
    else:
        with open(fd, "rb") as file:
            try:
                with image_module.open(file) as image:
                    array = image_to_rgb(image)  # by value; its size checked before decoding
                return torch.from_numpy(array.copy()).permute(2, 0, 1)  # (H, W, 3) -> (3, H, W)
            except MemoryError:
                raise
            except Exception as err:
                # a parser of untrusted bytes raises many kinds; each means "not usable"
                if isinstance(err, image_module.UnidentifiedImageError):
                    reason = "not an image format Pillow reads (a truncated header or no image)"
                else:
                    reason = f"cannot be decoded ({type(err).__name__}: {err})"
                raise BadImageError(
                    f"{_shown(path)}: {reason}; delete or replace the file", path, reason
                ) from err
    raise BadImageError(f"{_shown(path)}: {reason}; delete or replace the file", path, reason)


class ImageFolder(Dataset):
    """Images in class folders: ``root/<class>/**/<image>``, labelled by sorted class name.

    Args:
        root: folder whose non-hidden sub-folders are the classes; images are found
            recursively by extension (:data:`IMAGE_EXTENSIONS`, case-insensitive), sorted.
        transform: called on each uint8 ``(3, H, W)`` image.
        on_bad_image: ``"skip"`` replaces an undecodable file by the next image of its class
            and warns; ``"raise"`` raises :class:`BadImageError` (also on empty files).
        scan: decode every image once at construction, in threads, and leave out (or with
            ``"raise"`` list) the bad ones.

    Attributes:
        classes: class names, sorted; ``class_to_idx`` maps them to labels.
        samples: ``(path, label)`` pairs; ``targets`` the labels alone.
        skipped: entries left out at construction, ``{reason: [path, …]}``.

    Raises:
        FileNotFoundError: ``root`` missing, no class folders, or a class without images.
        ValueError: images but no class folders; a class folder that cannot be read as one; an
            unknown ``on_bad_image``.
        OSError: a folder of the tree cannot be listed.
        BadImageError: with ``on_bad_image="raise"``, bad files found at construction.
        ImportError: Pillow is not installed.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        *,
        on_bad_image: str = "skip",
        scan: bool = False,
    ) -> None:
        if on_bad_image not in BAD_IMAGE_POLICIES:
            raise ValueError(
                f"on_bad_image must be one of {list(BAD_IMAGE_POLICIES)}, got {on_bad_image!r}"
            )
        _pillow_image()  # fail at construction, not in a DataLoader worker
        self.root = Path(root)
        self.transform = transform
        self.on_bad_image = on_bad_image
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder {_shown(self.root)} does not exist")
        self.classes, class_dirs = _class_folders(self.root)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.samples: list[tuple[Path, int]] = []
        self.skipped: dict[str, list[Path]] = {}
        root_real, reals = os.path.realpath(self.root), set(class_dirs.values())
        empty = []
        for label, name in enumerate(self.classes):
            folder = os.path.join(self.root, name)
            paths = list(_class_images(folder, class_dirs[name], root_real, reals, self.skipped))
            self.samples += [(path, label) for path in paths]
            if not paths:
                empty.append(name)
        if on_bad_image == "raise" and SKIP_EMPTY in self.skipped:
            files = self.skipped[SKIP_EMPTY]
            raise BadImageError(
                f"{_shown(self.root)}: {len(files)} empty (0-byte) image files: {_named(files)}; "
                "delete or replace them, or pass on_bad_image='skip' to leave them out"
            )
        if empty:
            left_out = f"; left out of the tree: {_summary(self.skipped)}" if self.skipped else ""
            raise FileNotFoundError(
                f"{_shown(self.root)}: class folders without images {empty[:10]}"
                f"{' …' if len(empty) > 10 else ''} (extensions {IMAGE_EXTENSIONS}{left_out}); "
                "put images in them or remove them"
            )
        if scan:
            self._scan()
        self.targets = [label for _, label in self.samples]
        self._bad: dict[int, str] = {}
        # shared with DataLoader workers: any process that finds a file bad flags it for all
        self._bad_flags = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()
        self._by_class: dict[int, list[int]] | None = None
        if self.skipped:
            warnings.warn(
                f"ImageFolder {_shown(self.root)}: left out {_summary(self.skipped)}; "
                "they are not samples (listed in .skipped)",
                ImageFolderWarning,
                stacklevel=2,
            )

    def _scan(self) -> None:
        paths = [path for path, _ in self.samples]
        with ThreadPoolExecutor(_SCAN_THREADS) as pool:
            errors = list(pool.map(_decode_error, paths))
        bad = [(path, error) for path, error in zip(paths, errors, strict=True) if error]
        if not bad:
            return
        if self.on_bad_image == "raise":
            listed = "; ".join(f"{_shown(p)} ({e})" for p, e in bad[:20])
            raise BadImageError(
                f"{_shown(self.root)}: {len(bad)} of {len(paths)} images cannot be decoded: "
                f"{listed}{f' and {len(bad) - 20} more' if len(bad) > 20 else ''}. Delete or "
                "replace them, or pass on_bad_image='skip' to leave them out"
            )
        dropped = {path for path, _ in bad}
        self.samples = [sample for sample in self.samples if sample[0] not in dropped]
        self.skipped[SKIP_UNDECODABLE] = [path for path, _ in bad]
        left = {label for _, label in self.samples}
        lost = [name for name, label in self.class_to_idx.items() if label not in left]
        if lost:
            raise BadImageError(
                f"{_shown(self.root)}: no image of class folders {lost[:10]} decodes; restore "
                "them from the original data, or remove the folders"
            )

    @property
    def bad_images(self) -> dict[Path, str]:
        """Files found bad while reading, by this process or any DataLoader worker."""
        # a copy first: torch.nonzero breaks on a write by a worker between its two passes
        flags = self._bad_flags.clone()
        flagged = flags.nonzero().flatten().tolist() if len(flags) else []
        out = {self.samples[i][0]: "found bad by a DataLoader worker" for i in flagged}
        out.update({self.samples[i][0]: reason for i, reason in self._bad.items()})
        return out

    def _mark_bad(self, index: int, reason: str) -> None:
        self._bad[index] = reason
        if index < len(self._bad_flags):
            self._bad_flags[index] = 1

    def _known_bad(self, index: int) -> bool:
        return index in self._bad or (index < len(self._bad_flags) and bool(self._bad_flags[index]))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        _, label = self.samples[index]
        image = self._read(index)
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    def _read(self, index: int) -> torch.Tensor:
        path, label = self.samples[index]
        found = len(self._bad)
        if not self._known_bad(index):
            try:
                return read_image(path)
            except BadImageError as err:
                if self.on_bad_image == "raise":
                    raise BadImageError(
                        f"{_shown(path)} (sample {index} of {_shown(self.root)}, class "
                        f"{self.classes[label]!r}): {err.reason}; delete or replace the file, "
                        "or pass on_bad_image='skip' to go on with another image of its class "
                        "in its place",
                        path,
                        err.reason,
                    ) from err
                self._mark_bad(index, err.reason)
        for other in self._same_class(index):
            try:
                image = read_image(self.samples[other][0])
            except BadImageError as err:
                self._mark_bad(other, err.reason)
                continue
            if any(_worth_warning(count) for count in range(found + 1, len(self._bad) + 1)):
                self._warn(index, other)
            return image
        members = [self.samples[i][0] for i in (self._by_class or {}).get(label, [index])]
        raise BadImageError(
            f"{_shown(self.root)}: none of the {len(members)} images of class "
            f"{self.classes[label]!r} decodes ({_named(members)}); restore the folder from the "
            "original data, or remove it",
            path,
            self._bad.get(index, "found bad by a DataLoader worker"),
        )

    def _same_class(self, index: int) -> Iterator[int]:
        """The other samples of ``index``'s class not known bad, from the next on."""
        if self._by_class is None:
            self._by_class = {}
            for i, (_, label) in enumerate(self.samples):
                self._by_class.setdefault(label, []).append(i)
        label = self.samples[index][1]
        members = self._by_class.get(label, [])
        start = bisect.bisect_right(members, index)
        for other in members[start:] + members[:start]:
            # the label check keeps a replacement in the class even if samples were edited
            if other != index and not self._known_bad(other) and self.samples[other][1] == label:
                yield other

    def _warn(self, index: int, other: int) -> None:
        path, label = self.samples[index]
        bad = list(self.bad_images)
        warnings.warn(
            f"ImageFolder {_shown(self.root)}: {_shown(path)}: {self.bad_images[path]}; read "
            f"{_shown(self.samples[other][0])}, the next image of class "
            f"{self.classes[label]!r}, in its place (the label is unchanged). {len(bad)} bad "
            f"files found so far: {_named(bad)}. Delete or replace them; "
            "ImageFolder(..., scan=True) lists every bad file up front and "
            "on_bad_image='raise' stops at the first",
            ImageFolderWarning,
            stacklevel=4,  # the caller of dataset[i]
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(root={str(self.root)!r}, classes={len(self.classes)}, "
            f"samples={len(self.samples)}, transform={self.transform!r}, "
            f"on_bad_image={self.on_bad_image!r})"
        )


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _worth_warning(count: int) -> bool:
    return count <= _WARN_EACH or count & (count - 1) == 0  # 1…10, then 16, 32, 64, …


def _summary(skipped: dict[str, list[Path]]) -> str:
    return "; ".join(
        f"{len(paths)} {reason} ({_named(paths)})" for reason, paths in skipped.items()
    )


def _decode_error(path: Path) -> str:
    try:
        read_image(path)
    except BadImageError as err:
        return err.reason
    return ""


def _list_dir(path: str | os.PathLike) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError as err:
        raise type(err)(
            err.errno,
            f"cannot list the folder {_shown(path)} ({err.strerror}); make it readable "
            "(chmod a+rx) or move it out of the tree",
        ) from err


def _contains(folder: str, path: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _class_folders(root: Path) -> tuple[list[str], dict[str, str]]:
    root_real = os.path.realpath(root)
    real, owner = {}, {}
    loose = 0
    for entry in _list_dir(root):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            try:
                is_dir = stat.S_ISDIR(os.stat(entry.path).st_mode)
            except OSError as err:
                raise ValueError(
                    f"{_shown(entry.path)} is a symlink that cannot be followed "
                    f"({err.strerror}); point it at an existing folder or remove it (class "
                    "folders are the sorted sub-folders, so leaving one out would shift every "
                    "later label)"
                ) from err
            if not is_dir:
                loose += _is_image(entry.name)
                continue
            target = os.path.realpath(entry.path)
            if _contains(target, root_real) or _contains(root_real, target):
                above = _contains(target, root_real)
                where = "the tree itself or a folder above it" if above else "inside the tree"
                raise ValueError(
                    f"class folder {_shown(entry.path)} is a symlink to {_shown(target)}, "
                    f"{where}; a class folder must be a folder of its own: replace the link by "
                    "the folder it stands for, or remove it"
                )
        elif entry.is_dir(follow_symlinks=False):
            target = os.path.join(root_real, entry.name)
        else:
            loose += _is_image(entry.name)
            continue
        if target in owner:
            raise ValueError(
                f"class folders {owner[target]!r} and {entry.name!r} of {_shown(root)} are the "
                f"same folder {_shown(target)}; remove one of them"
            )
        owner[target] = entry.name
        real[entry.name] = target
    if not real:
        if loose:
            raise ValueError(
                f"{_shown(root)} holds {loose} images but no class folders; sort them into one "
                "folder per class (for ImageNet's val set, e.g. with valprep.sh)"
            )
        raise FileNotFoundError(f"{_shown(root)} has no class folders")
    return list(real), real


def _leads_back(target: str, root_real: str, class_dirs: set[str]) -> bool:
    """Whether real path ``target`` is the root, above it, or in a class folder."""
    return _contains(target, root_real) or any(_contains(d, target) for d in class_dirs)


def _class_images(
    folder: str, folder_real: str, root_real: str, class_dirs: set[str], skipped: dict
) -> Iterator[Path]:
    """The sample files of one class folder, depth first, sorted; what is left out goes to
    ``skipped``. Files that may have another name are keyed by inode, so each is listed once.
    """

    def skip(reason: str, path: str) -> None:
        skipped.setdefault(reason, []).append(Path(path))

    info = os.stat(folder_real)
    seen_dirs = {(info.st_dev, info.st_ino)}
    read_dirs: set[str] = set()  # real paths
    linked: set[int] = set()  # st_dev << 64 | st_ino of files that may have another name
    stack = [(folder, folder_real)]
    while stack:
        directory, directory_real = stack.pop()
        read_dirs.add(directory_real)
        parent = Path(directory)  # parent / name parses only the name, not the whole path
        subdirs = []
        for entry in _list_dir(directory):
            if entry.name.startswith("."):
                continue
            path = entry.path
            link = entry.is_symlink()
            real = os.path.realpath(path) if link else ""
            if link and _leads_back(real, root_real, class_dirs):
                skip(SKIP_LINK_INTO_TREE, path)
                continue
            try:
                is_dir = entry.is_dir()  # a broken or looping link raises or says False
                info = entry.stat() if is_dir or _is_image(entry.name) else None
            except OSError:
                skip(SKIP_BROKEN, path)
                continue
            if info is None:
                continue  # not an image by its name
            if is_dir:
                key = (info.st_dev, info.st_ino)
                real = real or os.path.join(directory_real, entry.name)
                if real in class_dirs:  # another class, reached through a link out and back
                    skip(SKIP_LINK_INTO_TREE, path)
                elif key in seen_dirs:
                    skip(SKIP_FOLDER_SEEN, path)
                else:
                    seen_dirs.add(key)
                    subdirs.append((path, real))
            elif not stat.S_ISREG(info.st_mode):
                skip(SKIP_NOT_REGULAR, path)
            elif info.st_size == 0:
                skip(SKIP_EMPTY, path)
            else:
                key = info.st_dev << 64 | info.st_ino
                if key in linked or (link and os.path.dirname(real) in read_dirs):
                    skip(SKIP_FILE_SEEN, path)
                    continue
                if link or info.st_nlink > 1:
                    linked.add(key)
                yield parent / entry.name
        stack.extend(reversed(subdirs))


def imagenet_folder(
    root: str | os.PathLike | None = None,
    split: str = "train",
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    on_bad_image: str = "skip",
    scan: bool = False,
) -> ImageFolder:
    """ImageNet (ILSVRC-2012) train or val as an :class:`ImageFolder`; nothing downloads.

    Looks in ``<data root>/imagenet/<split>/``, then ``<root>/<split>/`` when ``root`` is given.
    Labels index the sorted WordNet ids (``n01440764`` = 0).

    Returns:
        An :class:`ImageFolder`.

    Raises:
        ValueError: unknown ``split``; a flat split folder; class folders linking into the tree.
        FileNotFoundError: the split folder is missing; the message says where to put it.
        BadImageError: with ``on_bad_image="raise"``, bad files found at construction.
        ImportError: Pillow is not installed.
    """
    check_split(split, IMAGENET_SPLITS)
    candidates = [data_root(root) / "imagenet" / split]
    if root is not None:
        candidates.append(Path(root).expanduser() / split)
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is None:
        raise FileNotFoundError(
            f"ImageNet {split} not found at {' or '.join(str(c) for c in candidates)}. Its "
            "licence forbids redistribution, so it cannot be downloaded for you: get ILSVRC-2012 "
            f"from https://image-net.org and put it at {candidates[0]}/<wnid>/*.JPEG (val "
            "sorted into class folders too), or set SNENS_DATA (or root=) to the folder that "
            "holds imagenet/."
        )
    return ImageFolder(folder, transform=transform, on_bad_image=on_bad_image, scan=scan)
