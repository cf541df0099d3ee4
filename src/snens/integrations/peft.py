"""σN-Ens over a PEFT (LoRA) model: save what fine-tuning trained, load it into a fresh base.

    snens.integrations.peft.save_pretrained(ens, "my-adapter")  # ens over a peft.PeftModel
    ens = snens.integrations.peft.from_pretrained(fresh_base, "my-adapter")  # same outputs

The directory holds PEFT's ``adapter_config.json``, ``snens.json`` (the ensemble's
:class:`~snens.SnensConfig`, M, the input policy, the head's and the adapter's names, the
format's version) and ``snens_state.safetensors`` (the trainable tensors, every member layer's
state and every persistent buffer). ``snens.json`` is moved in last: a directory without it
holds no complete save.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from snens import files
from snens.integrations._saves import (
    check_meta,
    check_weights,
    load_safetensors,
    meta_copy,
    not_written_by,
    write_meta,
)
from snens.method.convert import convert
from snens.method.ensemble import Ensemble
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm
from snens.nn.surgery import only_named

__all__ = ["FORMAT_VERSION", "from_pretrained", "save_pretrained"]

#: The version of ``snens.json`` and the state file's layout.
FORMAT_VERSION = 1
_CONFIG = "snens.json"
_STATE = "snens_state.safetensors"
_MAX_JSON_BYTES = 1 << 20


def _peft():
    try:
        import peft
    except ImportError as error:  # pragma: no cover - exercised without the extra
        raise ImportError("PEFT models need peft: pip install 'snens[llm]'") from error
    return peft


def _peft_model(ensemble: Ensemble):
    peft = _peft()
    if not isinstance(ensemble, Ensemble) or not isinstance(ensemble.model, peft.PeftModel):
        got = type(ensemble.model if isinstance(ensemble, Ensemble) else ensemble).__name__
        raise TypeError(
            "save_pretrained takes snens.convert(peft_model, M), an Ensemble over a "
            f"peft.PeftModel; got {got}. Save other ensembles with torch.save(ens.state_dict())"
        )
    return ensemble.model


def _saved_names(ensemble: Ensemble) -> set[str]:
    """State-dict names of what fine-tuning changes: trainable tensors, member layers' state
    and every persistent buffer (a plain batch norm's running statistics)."""
    names = {name for name, p in ensemble.named_parameters() if p.requires_grad}
    for prefix, module in ensemble.named_modules():
        if isinstance(module, MemberNorm | MemberLinear):
            names.update(f"{prefix}.{name}" for name in module.state_dict())
    buffers = {name for name, _ in ensemble.named_buffers(remove_duplicate=False)}
    return names | (buffers & ensemble.state_dict().keys())


def save_pretrained(ensemble: Ensemble, directory: str | os.PathLike) -> Path:
    """Write a σN-Ens PEFT model's adapter, member layers and buffers to ``directory`` (created
    if missing); an earlier save there is replaced only once all three files were written.

    Returns:
        The directory.

    Raises:
        TypeError: ``ensemble`` is not an ensemble over a ``peft.PeftModel``.
        OSError: ``directory`` cannot be written (a full disk): an earlier save there is left
            as it was.
    """
    from safetensors.torch import save

    peft_model = _peft_model(ensemble)
    path = Path(directory)
    names = _saved_names(ensemble)
    state = {k: v.detach().contiguous() for k, v in ensemble.state_dict().items() if k in names}
    report = ensemble.report
    head = report.head if report is not None else "auto"
    # all three written into a private directory, then moved in, snens.json last (its old
    # namesake removed first): a full disk changes nothing, a kill leaves no snens.json
    with files.staged_directory(path, last=_CONFIG) as staging:
        peft_model.peft_config[peft_model.active_adapter].save_pretrained(str(staging))
        files.write_bytes(staging / _STATE, save(state), mode=files.plain_mode(path / _STATE))
        write_meta(
            staging / _CONFIG,
            ensemble,
            FORMAT_VERSION,
            head=head,
            adapter_name=peft_model.active_adapter,  # the state's keys carry it
        )
    return path


def from_pretrained(base_model: nn.Module, directory: str | os.PathLike) -> Ensemble:
    """The σN-Ens PEFT model saved in ``directory`` by :func:`save_pretrained`, over ``base_model``
    (freshly loaded, the one the adapters were trained on), wrapped in place once the save was
    found to fit it.

    Returns:
        An :class:`~snens.Ensemble` over a ``peft.PeftModel`` of ``base_model``, with the saved M,
        input policy, head, adapter (under its saved name), member layers and buffers.

    Raises:
        FileNotFoundError: ``directory`` holds no complete save (the missing file named; an
            interrupted save leaves no ``snens.json``).
        ValueError: another format version, a damaged ``snens.json``, state or adapter config, or
            tensors that do not fit the model or are missing (named).
        ImportError: ``peft`` is not installed.
        snens.files.FileRefusedError: a file of the save that is a FIFO, device or directory.
    """
    peft = _peft()
    path = Path(directory)
    for name in ("adapter_config.json", _CONFIG, _STATE):
        if os.path.lexists(path / name):  # a FIFO or directory there is named as what it is
            os.close(files.open_regular(path / name, follow_links=True))
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{path / name} is missing: {path} is not a snens.integrations.peft."
                "save_pretrained directory (or the save was interrupted; save again)"
            )
    meta = _read_meta(path / _CONFIG)
    state = load_safetensors(path / _STATE)
    try:
        config = peft.PeftConfig.from_pretrained(str(path))
    except Exception as error:  # noqa: BLE001 - PEFT fails in many ways on a damaged file
        raise ValueError(
            f"{path / 'adapter_config.json'} is not a PEFT adapter config PEFT can read "
            f"({type(error).__name__}: {error}); save the model again"
        ) from None
    # checked on a copy without values first: the base model is wrapped only if the save fits
    skeleton = meta_copy(base_model)
    if skeleton is not None:
        _check_state(_wrap(skeleton, copy.deepcopy(config), meta), state, path / _STATE)
    ensemble = _wrap(base_model, config, meta)
    _check_state(ensemble, state, path / _STATE)
    ensemble.load_state_dict(state, strict=False)
    return ensemble


def _read_meta(path: Path) -> dict[str, Any]:
    writer = {"writer": "snens.integrations.peft.save_pretrained", "saved": "the model"}
    try:
        meta = json.loads(files.read_bytes(path, limit=_MAX_JSON_BYTES, follow_links=True))
    except (ValueError, RecursionError) as error:
        raise not_written_by(path, **writer)(f"not valid JSON ({error})") from None
    kinds = {"num_members": int, "input_policy": str}
    meta = check_meta(meta, path, version=FORMAT_VERSION, kinds=kinds, **writer)
    adapter = meta.setdefault("adapter_name", "default")  # a save without it: PEFT's default
    if not isinstance(adapter, str) or not adapter:
        raise not_written_by(path, **writer)(f"adapter_name = {adapter!r:.40} is not a name")
    return meta


def _wrap(base_model: nn.Module, config: Any, meta: dict[str, Any]) -> Ensemble:
    peft_model = _peft().get_peft_model(base_model, config, adapter_name=meta["adapter_name"])
    ensemble = convert(
        peft_model,
        meta["num_members"],
        head=meta.get("head", "auto"),
        norms=only_named(meta.get("norms")),
        input_policy=meta["input_policy"],
        inplace=True,
    )
    ensemble.snens_config = meta["config"]  # τ, λ, γ's multiplier and init as trained
    return ensemble


def _check_state(ensemble: Ensemble, state: dict[str, Tensor], path: Path) -> None:
    """Every saved tensor fits the ensemble (name, shape, floating or not) and every tensor
    the save should hold is there."""
    check_weights(
        state,
        ensemble.state_dict(),
        sorted(_saved_names(ensemble) - set(state)),
        f"{path} does not fit this base model",
        "load it into the base model it was trained on (the model given was left as it was)",
    )
