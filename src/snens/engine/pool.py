"""An ensemble of runs trained apart: the deep ensemble as the field runs it.

M models trained one by one — under their own seeds, on one machine or several — are one
ensemble of all their members: :func:`pool_runs` stacks the member logits the runs kept
(``outputs.npz``) on the member dimension and measures them as the engine measures an
ensemble it trained (:func:`snens.evaluation.protocol.logit_metrics`: test and validation
metrics, temperature scaling fitted on validation, OOD detection and conformal sets), with no
pass over any data. Any finished runs of one data configuration pool: four single models
(a deep ensemble), two σN-Ens runs (an ensemble of ensembles), a mix. Corruption metrics are
not pooled: runs keep no logits of corrupted sets.

    snens pool runs/seed-0 runs/seed-1 runs/seed-2 runs/seed-3 --out runs/deep-ensemble

writes ``final.json`` (the metrics; parameters and training seconds summed over the runs,
peak memory the largest run's; the runs pooled, each with the SHA-256 of its logits) and
``outputs.npz`` (the stacked logits) to ``--out``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snens.engine.checkpoint import atomic_savez, atomic_write
from snens.engine.config import to_dict
from snens.engine.runs import (
    CONFIG,
    FINAL,
    OUTPUTS,
    OUTPUTS_MAX_BYTES,
    config_differences,
    parse_outputs,
    read_config,
    read_final,
    read_run_file,
    to_json,
)

__all__ = ["pool_runs"]

#: Config keys that say where a run went and how it was run, not what it learned: two runs
#: equal in every other key, the seed included, train the same members.
_WHERE = ("out_dir", "name", "device", "threads", "deterministic", "checkpoint_every")


def pool_runs(
    run_dirs: Sequence[str | os.PathLike], out: str | os.PathLike | None = None
) -> dict[str, Any]:
    """The ensemble of finished runs trained apart, measured from their kept logits.

    Args:
        run_dirs: two or more run directories ``snens train`` finished (``final.json`` and
            ``outputs.npz``), of one data configuration.
        out: where to write the ensemble's ``outputs.npz`` and ``final.json`` (created; an
            earlier ensemble's there is replaced; a run directory is refused); None writes
            nothing.

    Returns:
        ``final.json``'s content: ``"metrics"`` (the keys of a run's final metrics, less the
        corruption ones), ``"model"`` (``params``, ``trainable_params``: sums, and
        ``members``), ``"train"`` (``seconds``: the sum; ``peak_rss_mib``: the largest,
        where the runs recorded it) and ``"runs"`` (each run's path and the SHA-256 of its
        ``outputs.npz``).

    Raises:
        ValueError: fewer than two runs, a run given twice, ``out`` a run directory, runs
            of different data
            configurations (the keys named) or of one configuration and seed (their members
            would be copies), kept logits that do not stack (different examples).
        FileNotFoundError: a run that has not finished, or kept no ``outputs.npz``.
        RunDirError: a run file that is not a regular file, or too large.
    """
    from snens.evaluation.protocol import logit_metrics, stack_members

    paths = _check_paths(run_dirs)
    if out is not None and os.path.lexists(Path(out) / CONFIG):
        raise ValueError(
            f"{out} holds a config.toml: it is a run directory, whose final.json and "
            f"{OUTPUTS} the ensemble's would replace; write the ensemble elsewhere"
        )
    configs = [read_config(path) for path in paths]
    _check_configs(paths, configs)
    finals = [read_final(path) for path in paths]
    outputs, digests = [], []
    for path in paths:
        if not os.path.lexists(path / OUTPUTS):
            raise FileNotFoundError(
                f"{path} kept no {OUTPUTS} (member logits): it finished before runs kept "
                "them; train it again to pool it"
            )
        data = read_run_file(path / OUTPUTS, limit=OUTPUTS_MAX_BYTES)
        digests.append(hashlib.sha256(data).hexdigest())
        outputs.append(parse_outputs(path / OUTPUTS, data))
    try:
        stacked = stack_members(outputs)
    except ValueError as error:
        raise ValueError(f"cannot pool {', '.join(map(str, paths))}: {error}") from None
    data = configs[0].data
    metrics = logit_metrics(
        stacked,
        ood_scores=data.ood_scores,
        conformal_alpha=data.conformal_alpha,
        calibrators=data.calibrators,
    )
    result = {
        "metrics": metrics,
        "model": {
            "params": _total(finals, "model", "params"),
            "trainable_params": _total(finals, "model", "trainable_params"),
            "members": int(stacked["test"].shape[0]),
        },
        "train": {
            "seconds": _total(finals, "train", "seconds"),
            "peak_rss_mib": _largest(finals, "train", "peak_rss_mib"),
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
        differ = config_differences(dicts[0]["data"], dicts[i]["data"], "data.")
        if differ:
            raise ValueError(
                f"{paths[0]} and {paths[i]} differ in {', '.join(differ[:4])}: pool runs "
                "evaluated on the same data"
            )
    learned = [{k: v for k, v in d.items() if k not in _WHERE} for d in dicts]
    for i in range(len(learned)):
        for j in range(i):
            if learned[i] == learned[j]:
                raise ValueError(
                    f"{paths[j]} and {paths[i]} are the same configuration and seed "
                    f"({dicts[i]['seed']}): their members would be copies of each other; pool "
                    "runs of different seeds"
                )


def _total(finals: list[dict], section: str, key: str) -> float | int | None:
    values = [final.get(section, {}).get(key) for final in finals]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
        return None
    return sum(values)


def _largest(finals: list[dict], section: str, key: str) -> float | None:
    values = [final.get(section, {}).get(key) for final in finals]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(numbers) if numbers and len(numbers) == len(values) else None


def _write(out: Path, stacked: dict, result: dict) -> None:
    """``outputs.npz`` first, ``final.json`` last (each atomic): a complete ensemble has both."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_savez(out / OUTPUTS, stacked)
    atomic_write(out / FINAL, (to_json(result, indent=2) + "\n").encode())
