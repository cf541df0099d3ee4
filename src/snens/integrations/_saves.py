"""What the Hugging Face and PEFT saves share: ``snens.json``, checked, the weights, and a copy
of the model without its values to try a load on before the model itself is changed."""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from snens import files
from snens.method.config import saved_config
from snens.nn.norms import MAX_MEMBERS


def not_written_by(path: Path, writer: str, saved: str) -> Callable[[str], ValueError]:
    """The error of a ``snens.json`` that ``writer`` did not write (``what`` is wrong with it)."""

    def bad(what: str) -> ValueError:
        return ValueError(
            f"{path}: {what}, so it was not written by {writer} (or was changed); save {saved} "
            "again"
        )

    return bad


def check_meta(
    meta: Any, path: Path, *, version: int, kinds: dict[str, type], writer: str, saved: str
) -> dict[str, Any]:
    """``meta`` with its ``SnensConfig`` under ``"config"``, once its keys, types and format
    ``version`` were checked; an error names ``writer`` and what to save again."""
    bad = not_written_by(path, writer, saved)
    if not isinstance(meta, dict):
        raise bad(f"it holds a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != version:
        raise ValueError(
            f"{path}: format {meta.get('format')!r}, this snens reads format {version}; save "
            "it again with this version"
        )
    for key, kind in kinds.items():
        value = meta.get(key)
        if key not in meta:
            raise bad(f"{key!r} is missing")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            article = "an" if kind is int else "a"
            raise bad(f"{key} = {value!r:.40} is not {article} {kind.__name__}")
    if not 1 <= meta["num_members"] <= MAX_MEMBERS:
        raise bad(f"num_members = {meta['num_members']} is outside 1..{MAX_MEMBERS}")
    if meta["input_policy"] not in ("repeat", "split"):
        raise bad(f"input_policy = {meta['input_policy']!r:.40} is not 'repeat' or 'split'")
    if meta.get("head") is not None and not isinstance(meta.get("head"), str):
        raise bad(f"head = {meta.get('head')!r:.40} is not a module name (or null)")
    norms = meta.get("norms")
    if norms is not None and not (
        isinstance(norms, list) and all(isinstance(n, str) for n in norms)
    ):
        raise bad(f"norms = {norms!r:.40} is not a list of module names")
    try:
        meta["config"] = saved_config(meta)
    except ValueError as error:
        raise bad(str(error)) from None
    return meta


def load_safetensors(path: Path) -> dict[str, Tensor]:
    """The tensors of the safetensors file ``path`` (a link is followed), or a ValueError."""
    from safetensors.torch import load_file

    os.close(files.open_regular(path, follow_links=True))  # never a FIFO or a directory
    try:
        return load_file(str(path))
    except Exception as error:  # noqa: BLE001 - SafetensorError, OSError, …: a damaged file
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); save it again"
        ) from None


def check_weights(
    state: dict[str, Any], reference: dict[str, Tensor], missing: list[str], what: str, fix: str
) -> None:
    """Raise a ValueError, ``what`` then ``fix``, naming the tensors of ``state`` that do not fit
    ``reference`` (a ``state_dict``: not in it; not a dense tensor, of another shape, or
    floating where it is not) and the ``missing`` names; return where all fit."""

    def kind(v: Any) -> str:
        return f"{tuple(v.shape)} {v.dtype}" if isinstance(v, Tensor) else type(v).__name__

    wrong = [
        f"{k} {kind(v)} saved, {kind(reference[k])} here"
        for k, v in state.items()
        if k in reference
        and (
            not isinstance(v, Tensor)
            or v.layout != torch.strided
            or v.shape != reference[k].shape
            or v.is_floating_point() != reference[k].is_floating_point()
        )
    ]
    problems = [
        f"{len(items)} {kind}: {', '.join(items[:3])}{', …' if len(items) > 3 else ''}"
        for kind, items in (
            ("missing", missing),
            ("unexpected", [k for k in state if k not in reference]),
            ("of another shape or kind", wrong),
        )
        if items
    ]
    if problems:
        raise ValueError(f"{what} ({'; '.join(problems)}); {fix}")


def write_meta(path: Path, ensemble: Any, version: int, **keys: Any) -> None:
    """Write ``snens.json``: the format ``version``, the ensemble's ``SnensConfig``, M, its
    input policy, the norms ``norms=`` chose, and ``keys``."""
    meta = {
        "format": version,
        "config": ensemble.snens_config.to_dict(),
        "num_members": ensemble.num_members,
        "input_policy": ensemble.input_policy,
        **keys,
    }
    report = ensemble.report
    if report is not None and report.unselected:  # converted with norms=: which ones
        meta["norms"] = [name for name, _, _ in report.converted]
    files.write_text(path, json.dumps(meta, indent=2) + "\n", mode=files.plain_mode(path))


def meta_copy(model: nn.Module) -> nn.Module | None:
    """``model`` deep-copied with every parameter and buffer on the meta device (tied tensors
    stay tied); None where the model cannot be deep-copied (legacy weight-norm hooks)."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        empty = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = empty
    try:
        return copy.deepcopy(model, memo)
    except (TypeError, RuntimeError, AttributeError, copy.Error):
        return None
