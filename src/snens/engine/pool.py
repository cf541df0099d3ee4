"""An ensemble of runs trained apart: the deep ensemble as the field runs it.

:func:`pool_runs` stacks the member logits (``outputs.npz``) of finished runs of one data
configuration and measures them as the engine measures an ensemble it trained, with no pass
over any data (runs keep no logits of corruptions: those are not pooled).

    snens pool runs/seed-0 runs/seed-1 runs/seed-2 runs/seed-3 --out runs/deep-ensemble
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snens.engine import runs
from snens.engine.checkpoint import atomic_savez, atomic_write
from snens.engine.config import to_dict, with_evaluation_settings
from snens.engine.runs import OUTPUTS

__all__ = ["pool_runs"]

# config keys that say where and how a run ran, not what it learned
_WHERE = ("out_dir", "name", "device", "threads", "deterministic", "checkpoint_every")
# data keys that say how the kept logits are measured, not which examples they are of
_MEASURE = ("ood_scores", "conformal_alpha", "calibrators")
# data keys that say where the data lay and how it was read, not what it is
_DATA_WHERE = ("root", "download", "num_workers", "scan_images", "eval_batch_size")


def _data(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict's data section less the keys that do not change the examples."""
    return {k: v for k, v in config["data"].items() if k not in (*_MEASURE, *_DATA_WHERE)}


def pool_runs(
    run_dirs: Sequence[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    ood_scores: Sequence[str] | None = None,
    conformal_alpha: float | None = None,
    calibrators: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ensemble of two or more finished runs of one data configuration, trained apart,
    measured from their kept logits; written to ``out`` (not a run directory) unless None.

    ``ood_scores``, ``conformal_alpha`` and ``calibrators`` replace the runs' settings; None
    keeps the runs' (which must then agree).

    Returns:
        ``final.json``'s content: ``"metrics"``, ``"model"``, ``"train"`` and ``"runs"``.

    Raises:
        ValueError: runs that cannot be pooled (too few, given twice, copies, other data,
            settings that differ), ``out`` a run directory, or logits that do not stack.
        FileNotFoundError: a run that has not finished, or kept no ``outputs.npz``.
        RunDirError: a run file that is not a regular file, or too large.
    """
    from snens.evaluation.protocol import logit_metrics, stack_members

    paths = _check_paths(run_dirs)
    if out is not None and os.path.lexists(Path(out) / runs.CONFIG):
        raise ValueError(
            f"{out} holds a config.toml: it is a run directory, whose final.json and "
            f"{OUTPUTS} the ensemble's would replace; write the ensemble elsewhere"
        )
    configs = [runs.read_config(path) for path in paths]
    _check_configs(paths, configs)
    measure = _measuring(
        paths,
        configs,
        ood_scores=ood_scores,
        conformal_alpha=conformal_alpha,
        calibrators=calibrators,
    )
    # one data configuration: the first run's validation split is every run's
    if (conformal_alpha is not None or calibrators) and measure.validation_examples == 0:
        raise ValueError(
            "conformal sets and calibrators are fitted on the runs' validation split, and "
            f"{paths[0]} kept none (data.validation_examples = 0); pool runs trained with "
            "data.validation_examples > 0 to measure them"
        )
    finals = [runs.read_final(path) for path in paths]
    outputs, digests = [], []
    for path in paths:
        if not os.path.lexists(path / OUTPUTS):
            raise FileNotFoundError(
                f"{path} kept no {OUTPUTS} (member logits): it finished before runs kept "
                "them; train it again to pool it"
            )
        data = runs.read_run_file(path / OUTPUTS, limit=runs.OUTPUTS_MAX_BYTES)
        digests.append(hashlib.sha256(data).hexdigest())
        outputs.append(_finite(path / OUTPUTS, runs.parse_outputs(path / OUTPUTS, data)))
    _refuse_copies(paths, outputs, digests)
    try:
        stacked = stack_members(outputs)
    except ValueError as error:
        raise ValueError(f"cannot pool {', '.join(map(str, paths))}: {error}") from None
    settings = {key: getattr(measure, key) for key in _FLAGS}
    result = {
        "metrics": logit_metrics(stacked, **settings),
        "model": {
            "params": _combine(finals, "model", "params"),
            "trainable_params": _combine(finals, "model", "trainable_params"),
            "members": int(stacked["test"].shape[0]),
        },
        "train": {
            "seconds": _combine(finals, "train", "seconds"),
            "peak_rss_mib": _combine(finals, "train", "peak_rss_mib", max),
        },
        "runs": [
            {"path": str(path), "outputs_sha256": digest}
            for path, digest in zip(paths, digests, strict=True)
        ],
    }
    if out is not None:
        _write(Path(out), stacked, result)
    return result


def _check_paths(run_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(run_dirs, (str, os.PathLike)) or len(run_dirs) < 2:
        raise ValueError(
            "pool two or more run directories (one ensemble of the runs trained apart); got "
            f"{run_dirs!r}"
        )
    paths = [Path(d) for d in run_dirs]
    seen: dict[Path, Path] = {}
    for path in paths:
        real = path.resolve()
        if real in seen:
            raise ValueError(
                f"{path} is given twice (as {seen[real]} too): its members would count twice"
            )
        seen[real] = path
    return paths


def _check_configs(paths: list[Path], configs: list) -> None:
    """One data configuration, and no two runs of one configuration and seed."""
    dicts = [to_dict(config) for config in configs]
    for i in range(1, len(dicts)):
        differ = runs.config_differences(_data(dicts[0]), _data(dicts[i]), "data.")
        if differ:
            raise ValueError(
                f"{paths[0]} and {paths[i]} differ in {', '.join(differ[:4])}: pool runs "
                "evaluated on the same data"
            )
    learned = [_learned(d) for d in dicts]
    for i in range(len(learned)):
        for j in range(i):
            if learned[i] == learned[j]:
                raise ValueError(
                    f"{paths[j]} and {paths[i]} are the same configuration and seed "
                    f"({dicts[i]['seed']}): their members would be copies of each other; pool "
                    "runs of different seeds"
                )


def _learned(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict less what does not change the members."""
    out = {k: v for k, v in config.items() if k not in _WHERE}
    out["data"] = _data(config)
    return out


_FLAGS = {"ood_scores": "ood-scores", "conformal_alpha": "alpha", "calibrators": "calibrators"}


def _measuring(paths: list[Path], configs: list, **given: Any) -> Any:
    """The data config the pooled logits are measured with: the first run's, with the
    settings given in place of its own; a setting not given must be the same in every run."""
    for key, value in given.items():
        if value is not None:
            continue
        values = [getattr(config.data, key) for config in configs]
        for path, v in zip(paths[1:], values[1:], strict=True):
            if v != values[0]:
                raise ValueError(
                    f"{paths[0]} and {path} measure with data.{key} {values[0]!r} and {v!r}: "
                    f"give the one to pool with ({key}=..., snens pool --{_FLAGS[key]})"
                )
    return with_evaluation_settings(configs[0].data, **given)


def _finite(path: Path, outputs: dict[str, Any]) -> dict[str, Any]:
    """``outputs`` when every logit is finite (a diverged run is refused by name)."""
    import torch

    for key, value in outputs.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            count = int((~torch.isfinite(value)).sum())
            raise ValueError(
                f"{path}: {key} holds {count:,} logits that are NaN or infinite (the run "
                "diverged, or the file was changed), so it cannot be pooled; leave that run out, "
                "or train it again"
            )
    return outputs


def _refuse_copies(paths: list[Path], outputs: list[dict], digests: list[str]) -> None:
    """No two runs with the same kept logits (a copy whose config.toml says another seed)."""
    import torch

    for i in range(len(paths)):
        for j in range(i):
            if digests[i] == digests[j]:
                how = f"the same {OUTPUTS}, SHA-256 {digests[i][:16]}…"
            elif torch.equal(outputs[i]["test"], outputs[j]["test"]):
                how = f"equal test logits in their {OUTPUTS}"
            else:
                continue
            raise ValueError(
                f"{paths[j]} and {paths[i]} kept {how}: one is a copy of the other, whatever "
                "their configs say (a seed edited in a copy's config.toml trains nothing); "
                "pool runs trained apart"
            )


def _combine(finals: list[dict], section: str, key: str, reduce: Any = sum) -> Any:
    """``reduce`` of the runs' ``final[section][key]``; None where one run lacks a number."""
    values = [final.get(section, {}).get(key) for final in finals]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
        return None
    return reduce(values)


def _write(out: Path, stacked: dict, result: dict) -> None:
    """``outputs.npz`` first, ``final.json`` last (each atomic): a complete ensemble has both."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_savez(out / OUTPUTS, stacked)
    atomic_write(out / runs.FINAL, (runs.to_json(result, indent=2) + "\n").encode())
