"""σN-Ens over a PEFT (LoRA) model: save what fine-tuning trained, load it into a fresh base.

A σN-Ens PEFT model is one frozen base, one set of LoRA adapters shared by the members, and
per member its norms and head. Fine-tuning changes only the adapters and the member layers,
so that is what is saved — a few MB beside the base model's hundreds::

    peft_model = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=8,
                                                           target_modules=["q_proj", "v_proj"]))
    ens = snens.convert(peft_model, num_members=4)
    ...                                                   # fine-tune
    snens.integrations.peft.save_pretrained(ens, "my-adapter")
    ens = snens.integrations.peft.from_pretrained(fresh_base, "my-adapter")  # same outputs

The directory holds PEFT's ``adapter_config.json``, ``snens.json`` (M, the input policy, the
head's name, the format's version) and ``snens_state.safetensors``: every trainable tensor
(LoRA weights, member norms' scales and γ, member heads) and every member layer's buffers.
:func:`snens.extract_member` of such an ensemble gives member m as a plain PEFT model, whose
``merge_and_unload()`` gives a plain Hugging Face model.

A causal LM's ``lm_head`` is its vocabulary (49,152 × 576 for SmolLM2): convert it with
``head=None`` to keep one LM head for all members (the member norms, the final one included,
still make them differ), or classify through :class:`snens.models.LLMClassifier`, whose
label-word head is K rows of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

from snens.method.ensemble import Ensemble, convert
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm
from snens.nn.surgery import only_named

__all__ = ["FORMAT_VERSION", "from_pretrained", "save_pretrained"]

#: The version of ``snens.json`` and the state file's layout.
FORMAT_VERSION = 1
_CONFIG = "snens.json"
_STATE = "snens_state.safetensors"


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
    """State-dict names of what fine-tuning changes: trainable tensors, member layers' state."""
    names = {name for name, p in ensemble.named_parameters() if p.requires_grad}
    for prefix, module in ensemble.named_modules():
        if isinstance(module, MemberNorm | MemberLinear):
            names.update(f"{prefix}.{name}" for name in module.state_dict())
    return names


def save_pretrained(ensemble: Ensemble, directory: str | os.PathLike) -> Path:
    """Write a σN-Ens PEFT model's adapters and member layers to ``directory``.

    Args:
        ensemble: ``snens.convert(peft_model, M)``, trained or not.
        directory: created if missing; files of an earlier save there are replaced.

    Returns:
        The directory.

    Raises:
        TypeError: ``ensemble`` is not an ensemble over a ``peft.PeftModel``.
    """
    from safetensors.torch import save_file

    peft_model = _peft_model(ensemble)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    peft_model.peft_config[peft_model.active_adapter].save_pretrained(str(path))
    names = _saved_names(ensemble)
    state = {k: v.detach().contiguous() for k, v in ensemble.state_dict().items() if k in names}
    save_file(state, str(path / (_STATE + ".tmp")))
    os.replace(path / (_STATE + ".tmp"), path / _STATE)
    report = ensemble.report
    meta = {
        "format": FORMAT_VERSION,
        "num_members": ensemble.num_members,
        "input_policy": ensemble.input_policy,
        "head": report.head if report is not None else "auto",
    }
    if report is not None and report.unselected:  # converted with norms=: which ones
        meta["norms"] = [name for name, _, _ in report.converted]
    (path / (_CONFIG + ".tmp")).write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(path / (_CONFIG + ".tmp"), path / _CONFIG)  # last: a complete save has it
    return path


def from_pretrained(base_model: nn.Module, directory: str | os.PathLike) -> Ensemble:
    """The σN-Ens PEFT model saved in ``directory``, over ``base_model``.

    ``base_model`` must be the model the adapters were trained on, freshly loaded (the same
    class, configuration and weights); it is wrapped in place.

    Args:
        base_model: the base model, freshly loaded.
        directory: a directory :func:`save_pretrained` wrote.

    Returns:
        An :class:`~snens.Ensemble` over a ``peft.PeftModel`` of ``base_model``, with the saved
        M, input policy and head, and the saved adapters and member layers loaded.

    Raises:
        FileNotFoundError: ``directory`` holds no complete save (the missing file named).
        ValueError: a save of another format version, or tensors that do not fit the model
            (the names given: a different base model, or another M).
        ImportError: ``peft`` is not installed.
    """
    from safetensors.torch import load_file

    peft = _peft()
    path = Path(directory)
    for name in ("adapter_config.json", _CONFIG, _STATE):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{path / name} is missing: {path} is not a snens.integrations.peft."
                "save_pretrained directory (or the save was interrupted; save again)"
            )
    meta = json.loads((path / _CONFIG).read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"{path / _CONFIG}: format {meta.get('format')!r}, this snens reads format "
            f"{FORMAT_VERSION}; save it again with this version"
        )
    config = peft.PeftConfig.from_pretrained(str(path))
    peft_model = peft.get_peft_model(base_model, config)
    ensemble = convert(
        peft_model,
        meta["num_members"],
        head=meta["head"],
        norms=only_named(meta.get("norms")),
        input_policy=meta["input_policy"],
        inplace=True,
    )
    state = load_file(str(path / _STATE))
    expected = _saved_names(ensemble)
    shapes = dict(ensemble.state_dict())
    wrong = [
        f"{k} {tuple(v.shape)} saved, {tuple(shapes[k].shape)} here"
        for k, v in state.items()
        if k in shapes and v.shape != shapes[k].shape
    ]
    unknown = sorted(set(state) - set(shapes))
    missing = sorted(expected - set(state))
    if wrong or unknown or missing:
        problems = wrong[:3] + [f"unknown {k}" for k in unknown[:3]]
        problems += [f"missing {k}" for k in missing[:3]]
        raise ValueError(
            f"{path / _STATE} does not fit this base model: "
            + "; ".join(problems)
            + "; load it into the base model it was trained on"
        )
    ensemble.load_state_dict(state, strict=False)
    return ensemble
