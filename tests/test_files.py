"""One way to write a file and one way to read a user's: ``snens.files``.

Every write site of the package is listed here (found in the source's syntax tree): a new
``open(..., "w")``, ``write_text``, ``savefig``, ``torch.save``, ``save_file``, ``np.save``,
``.tmp`` name, ``os.open`` with ``O_CREAT``, … that does not go through :mod:`snens.files`
fails :func:`test_every_write_site_goes_through_snens_files` until it does, or is listed
with the reason it is safe."""

import ast
import errno
import io
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest

from snens import files

SRC = Path(__file__).resolve().parents[1] / "src" / "snens"

# Calls by attribute name that write a file (or a directory of files), or name one.
_WRITERS = {
    "write_text",
    "write_bytes",
    "savefig",
    "save",
    "save_file",
    "save_pretrained",
    "save_model",
    "savez",
    "savez_compressed",
    "savetxt",
    "tofile",
    "to_csv",
    "dump",
    "extract",
    "extractall",
    "mkstemp",
    "mkdtemp",
    "NamedTemporaryFile",
    "TemporaryDirectory",
    "rename",
    "link",
    "symlink",
    "touch",
}
# shutil's writers; ``copy`` and ``move`` elsewhere (``array.copy()``) write nothing.
_SHUTIL = {"copy", "copy2", "copyfile", "copytree", "move"}
_OPENERS = {"open", "fdopen"}
_CREATE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_APPEND", "O_TRUNC"}

#: The write sites outside snens.files, each with the reason it is safe. Keyed by (file,
#: function, the call as written): moving a line keeps its entry, changing the call does not.
ALLOWED = {
    ("engine/checkpoint.py", "save_checkpoint", "torch.save"): "into a BytesIO",
    ("engine/checkpoint.py", "_keep_previous", "'.tmp'"): (
        "the suffix of a unique temporary name (a random part before it)"
    ),
    ("engine/checkpoint.py", "_keep_previous", "os.link"): (
        "prev.pt's second name at a unique temporary name; link() fails where anything is"
    ),
    ("engine/checkpoint.py", "_keep_previous", "os.replace"): (
        "renames that temporary over prev.pt; rename replaces a link, never follows it"
    ),
    ("engine/memory.py", "_reset_resident_peak", "_CLEAR_REFS.write_text"): (
        "/proc/self/clear_refs: a kernel interface, not a file"
    ),
    ("engine/train.py", "_train", "selection.save"): (
        "Selection.save: best.pt by save_checkpoint, through files.write_bytes"
    ),
    ("evaluation/plots.py", "_save", "figure.savefig"): "into a BytesIO, then files.write_bytes",
    ("integrations/huggingface.py", "SnensTrainer._save", "torch.save"): "into a BytesIO",
    ("integrations/huggingface.py", "SnensTrainer._save", "save"): "safetensors' bytes",
    ("integrations/peft.py", "save_pretrained", "save"): "safetensors' bytes",
    ("integrations/huggingface.py", "SnensTrainer._save", "tokenizer.save_pretrained"): (
        "into files.staged_directory, a private directory"
    ),
    (
        "integrations/peft.py",
        "save_pretrained",
        "peft_model.peft_config[peft_model.active_adapter].save_pretrained",
    ): ("PEFT's config into files.staged_directory, a private directory"),
    ("models/llm.py", "_convert_smollm2", "model.save_pretrained"): (
        "into the private (mkdtemp, 0o700) directory smollm2_path made"
    ),
    ("models/llm.py", "_convert_smollm2", "tokenizer.save_pretrained"): (
        "into the private (mkdtemp, 0o700) directory smollm2_path made"
    ),
    ("models/llm.py", "smollm2_path", "tempfile.mkdtemp"): (
        "a private directory (0o700) for the cache, renamed into place under the build lock"
    ),
    ("models/llm.py", "smollm2_path", "os.replace"): (
        "whole directories renamed under the build lock; rename never follows a link"
    ),
    ("data/cifar.py", "_extract", "tempfile.mkdtemp"): (
        "a private staging directory; the archive's members are checked before extracting"
    ),
    ("data/cifar.py", "_extract_members", "tar.extractall"): (
        "into that staging directory, members checked (no links, no traversal)"
    ),
    ("data/cifar.py", "_extract", "os.replace"): (
        "the extracted directory renamed into place; rename never follows a link"
    ),
    (
        "data/corruptions.py",
        "_jpeg_compression",
        "Image.fromarray(image.squeeze(-1) if mode == 'L' else image).save",
    ): "into a BytesIO",
    ("data/download.py", "download_url", "'.part'"): (
        "a download resumes from its fixed .part, opened only by files.open_append"
    ),
    ("data/download.py", "download_url", "os.replace"): (
        "the finished .part (opened by files.open_append) renamed into place"
    ),
    ("data/download.py", "_keep_complete_part", "os.replace"): (
        "the finished .part renamed into place; rename never follows a link"
    ),
}


def _call_name(node: ast.Call) -> str:
    return ast.unparse(node.func)


def _writes(node: ast.Call) -> bool:
    """Whether the call writes a file: by its name, an open mode or os.open's flags."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if _call_name(node).startswith("files."):
        return False  # the one writer itself
    if name in _SHUTIL:
        return _call_name(node).startswith("shutil.")
    if _call_name(node) == "os.replace":
        return True
    if _call_name(node) == "os.open":
        flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
        return any(flag in flags for flag in _CREATE_FLAGS)
    if name in _OPENERS:
        mode = node.args[1] if len(node.args) > 1 else None
        mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
        if mode is None:
            return False
        if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
            return True  # a mode computed at run time may write
        return bool(set(mode.value) & set("wax+"))
    return name in _WRITERS


def _sites(path: Path) -> list[tuple[str, str, str, int]]:
    """(file, function, call, line) of every write site in ``path``, and every ``.tmp`` or
    ``.part`` name made from a string (a fixed temporary name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    relative = path.relative_to(SRC).as_posix()
    found = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = [*scope, child.name]
            if isinstance(child, ast.Call) and _writes(child):
                found.append((relative, ".".join(scope), _call_name(child), child.lineno))
            if (
                isinstance(child, ast.Constant)
                and isinstance(child.value, str)
                and child.value.endswith((".tmp", ".part"))
            ):
                found.append((relative, ".".join(scope), repr(child.value), child.lineno))
            visit(child, inner)

    visit(tree, [])
    return found


def test_every_write_site_goes_through_snens_files():
    sites = [
        site
        for path in sorted(SRC.rglob("*.py"))
        if path.name not in ("files.py", "locks.py") or path.parent != SRC
        for site in _sites(path)
    ]
    assert len(sites) >= 15  # the scan sees the sites listed, not nothing
    unlisted = [
        f"{file}:{line} {function}: {call}"
        for file, function, call, line in sites
        if (file, function, call) not in ALLOWED
    ]
    assert not unlisted, (
        "write sites that bypass snens.files (use files.write_bytes / write_text / open_atomic /"
        " open_append / staged_directory, or list the site in ALLOWED with the reason it is "
        f"safe): {unlisted}"
    )
    stale = set(ALLOWED) - {site[:3] for site in sites}
    assert not stale, f"ALLOWED lists write sites that are gone: {sorted(stale)}"


def test_the_scan_finds_each_kind_of_write_site(tmp_path):
    source = tmp_path / "snens_example.py"
    source.write_text(
        "def f(path, fig, x):\n"
        "    open(path, 'w')\n"
        "    open(path, mode='ab')\n"
        "    open(path)\n"
        "    path.write_text('a')\n"
        "    fig.savefig(path)\n"
        "    torch.save(x, path)\n"
        "    np.savez(path, x=x)\n"
        "    os.open(path, os.O_WRONLY | os.O_CREAT)\n"
        "    os.open(path, os.O_RDONLY)\n"
        "    name = str(path) + '.tmp'\n"
        "    'a'.replace('b', 'c')\n"
    )
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        calls = [call for _, _, call, _ in _sites(source)]
    finally:
        SRC = saved
    assert calls == [
        "open",
        "open",
        "path.write_text",
        "fig.savefig",
        "torch.save",
        "np.savez",
        "os.open",
        "'.tmp'",
    ]


# -- writing ------------------------------------------------------------------------------


def test_a_link_at_the_destination_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "out.txt").symlink_to(victim)
    files.write_bytes(tmp_path / "out.txt", b"new")
    assert victim.read_bytes() == b"keep"
    assert not (tmp_path / "out.txt").is_symlink()
    assert (tmp_path / "out.txt").read_bytes() == b"new"


def test_a_link_planted_at_the_temporary_name_is_never_opened(tmp_path, monkeypatch):
    """The temporary's name is unique; one taken (here a link planted at the name the first
    draw gives) is passed over, and its target untouched."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    draws = iter(["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(draws))
    planted = tmp_path / ".out.txt.aaaaaaaaaaaaaaaa.tmp"
    planted.symlink_to(victim)
    files.write_bytes(tmp_path / "out.txt", b"new")
    assert victim.read_bytes() == b"keep"
    assert (tmp_path / "out.txt").read_bytes() == b"new"
    assert planted.is_symlink()  # left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == [planted.name, "out.txt", "victim"]


def test_a_destination_of_a_long_name_gets_a_temporary_beside_it(tmp_path):
    name = "x" * 250 + ".json"  # 255 bytes: NAME_MAX
    files.write_text(tmp_path / name, "{}")
    assert (tmp_path / name).read_text() == "{}"


def test_exclusive_refuses_a_link_at_the_destination(tmp_path):
    (tmp_path / "config.toml").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        files.write_bytes(tmp_path / "config.toml", b"x", exclusive=True)
    assert not (tmp_path / "nowhere").exists()


def test_a_failed_write_leaves_the_file_and_no_temporary(tmp_path):
    (tmp_path / "a.png").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="drawing failed"):
        with files.open_atomic(tmp_path / "a.png") as file:
            file.write(b"half")
            raise RuntimeError("drawing failed")
    assert (tmp_path / "a.png").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]


def test_plain_mode_is_the_present_files_or_the_umasks(tmp_path):
    old = os.umask(0o027)
    try:
        assert files.plain_mode(tmp_path / "new") == 0o640
    finally:
        os.umask(old)
    (tmp_path / "a").write_bytes(b"")
    os.chmod(tmp_path / "a", 0o604)
    files.write_bytes(tmp_path / "a", b"x", mode=files.plain_mode(tmp_path / "a"))
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o604


def test_open_append_refuses_a_link_a_fifo_and_a_second_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "link.jsonl").symlink_to(victim)
    with pytest.raises(files.FileRefusedError, match="link.jsonl is a symbolic link") as caught:
        files.open_append(tmp_path / "link.jsonl")
    assert caught.value.errno == errno.ELOOP
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "made")
    with pytest.raises(files.FileRefusedError):
        files.open_append(tmp_path / "dangling.jsonl")
    assert not (tmp_path / "made").exists()
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(files.FileRefusedError, match="a FIFO"):
        files.open_append(tmp_path / "fifo.jsonl")
    os.link(victim, tmp_path / "hard.jsonl")
    with pytest.raises(files.FileRefusedError, match="2 names"):
        files.open_append(tmp_path / "hard.jsonl")
    assert victim.read_bytes() == b"keep"
    with files.open_append(tmp_path / "ok.jsonl") as file:
        file.write(b"1\n")
    with files.open_append(tmp_path / "ok.jsonl") as file:
        file.write(b"2\n")
    assert (tmp_path / "ok.jsonl").read_bytes() == b"1\n2\n"


def test_staged_directory_moves_the_files_in_and_refuses_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    out = tmp_path / "save"
    out.mkdir()
    (out / "adapter_config.json").symlink_to(victim)
    with files.staged_directory(out) as staging:
        assert stat.S_IMODE(staging.stat().st_mode) == 0o700
        (staging / "adapter_config.json").write_text("{}")
        (staging / "sub").mkdir()
        (staging / "sub" / "a.txt").write_text("a")
    assert victim.read_bytes() == b"keep"
    assert (out / "adapter_config.json").read_text() == "{}"
    assert (out / "sub" / "a.txt").read_text() == "a"
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "sub"]
    with pytest.raises(files.FileRefusedError, match="a symbolic link"):
        with files.staged_directory(out) as staging:
            (staging / "evil").symlink_to(victim)
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "sub"]


def test_staged_directory_moves_the_marker_last_and_removes_the_old_one_first(
    tmp_path, monkeypatch
):
    """A save of several files (PEFT's: adapter config, state, snens.json) moved in one by one:
    a kill mid-move must not leave the old save's marker beside the new save's other files."""
    out = tmp_path / "save"
    out.mkdir()
    for name in ("a.json", "marker.json", "z.bin"):
        (out / name).write_text("old")
    moved = []
    replace = os.replace

    def replace_then_die(source, target):
        moved.append(Path(target).name)
        if Path(target).name == "z.bin":
            raise KeyboardInterrupt  # a kill after a.json moved, before z.bin
        replace(source, target)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        with files.staged_directory(out, last="marker.json") as staging:
            for name in ("a.json", "marker.json", "z.bin"):
                (staging / name).write_text("new")
    assert moved == ["a.json", "z.bin"]
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "z.bin"]  # no marker: incomplete
    monkeypatch.setattr(os, "replace", replace)
    with files.staged_directory(out, last="marker.json") as staging:
        for name in ("a.json", "marker.json", "z.bin"):
            (staging / name).write_text("newer")
    assert {p.name: p.read_text() for p in out.iterdir()} == dict.fromkeys(
        ("a.json", "marker.json", "z.bin"), "newer"
    )


def test_staged_directory_on_a_full_disk_leaves_the_old_save_whole(tmp_path):
    out = tmp_path / "save"
    out.mkdir()
    (out / "state.bin").write_text("old")
    (out / "marker.json").write_text("old")
    with pytest.raises(OSError, match="No space"):
        with files.staged_directory(out, last="marker.json") as staging:
            (staging / "state.bin").write_text("new")
            raise OSError(errno.ENOSPC, "No space left on device")  # writing the marker
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        "state.bin": "old",
        "marker.json": "old",
    }


# -- reading ------------------------------------------------------------------------------


def test_read_bytes_refuses_links_fifos_and_large_files_before_reading(tmp_path):
    (tmp_path / "a").write_bytes(b"12345")
    assert files.read_bytes(tmp_path / "a", limit=5) == b"12345"
    with pytest.raises(files.FileRefusedError, match="5 bytes, above the limit of 4") as caught:
        files.read_bytes(tmp_path / "a", limit=4)
    assert caught.value.errno == errno.EFBIG
    (tmp_path / "l").symlink_to(tmp_path / "a")
    with pytest.raises(files.FileRefusedError, match="a symbolic link"):
        files.read_bytes(tmp_path / "l", limit=5)
    assert files.read_bytes(tmp_path / "l", limit=5, follow_links=True) == b"12345"
    os.mkfifo(tmp_path / "f")
    with pytest.raises(files.FileRefusedError, match="a FIFO"):
        files.read_bytes(tmp_path / "f", limit=5, follow_links=True)
    with pytest.raises(FileNotFoundError, match="no file at"):
        files.read_bytes(tmp_path / "missing", limit=5)


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", "", "sub/../../x"])
def test_inside_refuses_names_leading_out_of_the_directory(tmp_path, name):
    with pytest.raises(ValueError, match="names a file outside"):
        files.inside(tmp_path, name)


def test_inside_refuses_a_folder_linked_out_and_keeps_plain_names(tmp_path):
    (tmp_path / "out").symlink_to("/etc")
    with pytest.raises(ValueError, match="names a file outside"):
        files.inside(tmp_path, "out/passwd")
    assert files.inside(tmp_path, "model-00001-of-00002.safetensors") == (
        tmp_path / "model-00001-of-00002.safetensors"
    )
    # a Hub snapshot's file is a link to its blob, outside the snapshot folder: kept
    (tmp_path / "blob").write_bytes(b"x")
    (tmp_path / "snapshot").mkdir()
    (tmp_path / "snapshot" / "model.safetensors").symlink_to(tmp_path / "blob")
    assert files.inside(tmp_path / "snapshot", "model.safetensors").read_bytes() == b"x"


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def test_load_npz_checks_the_declared_sizes_before_inflating():
    data = _npz(test=np.zeros((4, 1000, 10), np.float32), labels=np.zeros(1000, np.int64))
    assert len(data) < 10_000  # zeros: 168 kB inflated from a few kB
    arrays = files.load_npz(data, name="o.npz", limit=168_256)
    assert arrays["test"].shape == (4, 1000, 10)
    with pytest.raises(ValueError, match=r"o\.npz declares 168,\d+ bytes once inflated"):
        files.load_npz(data, name="o.npz", limit=100_000)


def test_load_npz_refuses_a_header_promising_more_than_its_member_holds():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f4", "fortran_order": False, "shape": (10**9,)}
        )
        archive.writestr("test.npy", header.getvalue() + b"\0" * 16)
    with pytest.raises(ValueError, match="promises 4,000,000,000 bytes"):
        files.load_npz(buffer.getvalue(), name="o.npz", limit=10**6)


def test_load_npz_refuses_pickles_and_damage():
    with pytest.raises(ValueError, match="not a readable npz"):
        files.load_npz(b"not a zip", name="o.npz", limit=10**6)
    objects = _npz(test=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="Python objects"):
        files.load_npz(objects, name="o.npz", limit=10**6)


def test_a_directory_at_the_destination_is_named_not_the_temporary(tmp_path):
    """The error had named the temporary: "'.out.<random>.tmp' -> 'out'"."""
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError) as err:
        files.write_bytes(tmp_path / "out", b"x")
    assert str(err.value) == f"[Errno 21] cannot write {tmp_path / 'out'}: Is a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
