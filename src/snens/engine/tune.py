"""Choose σN-Ens's recipe on validation at a fraction of a sweep's cost: a probe.

    snens tune --preset fashion_mnist_small_cnn --set data.validation_examples=5000 \\
        --out runs/tune

Each recipe of :data:`RECIPES` (the input policy, τ, λ and γ's learning-rate multiplier) trains
for the first epochs of the config's schedule (half by default, the learning-rate schedule
of the full run), into ``OUT/<recipe>``; the recipe of the best validation metric so far (the
config's ``optim.select``, NLL where it is empty, at its best probed epoch) is then trained to
the end, its epoch selected on validation as ``optim.select`` does, and is the result. The
others stay paused, resumable. The probe costs ``1 + (recipes − 1) · probe / epochs``
trainings of one run. ``OUT/tune.json`` records every recipe's probe value and the choice;
running the command again skips what is done and resumes the rest.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snens import files
from snens.engine.config import RunConfig, load_config
from snens.engine.runs import read_metrics, to_json
from snens.engine.selection import SELECT_METRICS, choose_on_validation
from snens.engine.sweep import SweepRun, _finished, _status, run_sweep

__all__ = [
    "DEFAULT_SELECT",
    "RECIPES",
    "TUNE_FILE",
    "TuneResult",
    "default_probe_epochs",
    "plan_tune",
    "tune",
]

#: The recipes a probe tries, by name: the config's method values each sets. ``base`` is the
#: config as given (the library's defaults, or a preset's own recipe).
RECIPES: dict[str, tuple[str, ...]] = {
    "base": (),
    "split": (
        'method.input_policy="split"',
        "method.temperature=1.0",
        "method.diversity_weight=0.1",
    ),
    "split_soft": (
        'method.input_policy="split"',
        "method.temperature=5.0",
        "method.diversity_weight=0.01",
    ),
    "no_diversity": (
        'method.input_policy="repeat"',
        "method.diversity_weight=0.0",
        "method.gamma_lr_multiplier=1.0",
    ),
}
#: The validation metric a probe chooses by where the config's ``optim.select`` is empty.
DEFAULT_SELECT = "nll"
#: The record of a probe, in its directory.
TUNE_FILE = "tune.json"


@dataclass(frozen=True)
class TuneResult:
    """A finished probe: its runs, the epochs each was probed for, every recipe's best probed
    validation value (None where it has none), the chosen recipe's name and run directory."""

    runs: list[SweepRun]
    probe_epochs: int
    values: dict[str, float | None]
    chosen: str
    path: Path


def default_probe_epochs(epochs: int) -> int:
    """Half of ``epochs``, rounded up: the shortest probe whose choice was behind one model
    in none of the situations the studies replayed it on (a quarter was, once)."""
    return math.ceil(epochs / 2)


def plan_tune(
    base: str | os.PathLike | RunConfig | Mapping[str, Any],
    out: str | os.PathLike,
    overrides: Sequence[str] = (),
    recipes: Sequence[str] | None = None,
) -> list[SweepRun]:
    """One run per recipe (default every one of :data:`RECIPES`) over ``base`` and its
    ``overrides``, into ``out/<recipe>``; a recipe that gives the same config as an earlier
    one (e.g. ``base`` of a preset whose recipe is ``split_soft``) is left out. Nothing is
    written.

    Returns:
        The runs, in the order of ``recipes``, each with its status ("new", "resume", "done").

    Raises:
        ValueError: an unknown recipe, a config that is not σN-Ens or has no validation
            split, ``--set`` of a key a recipe sets, or a directory holding a run of another
            config.
    """
    names = list(RECIPES) if recipes is None else list(recipes)
    unknown = [n for n in names if n not in RECIPES]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(
            f"recipes {names!r}: give distinct names among {', '.join(RECIPES)}"
            + (f" ({unknown[0]!r} is not one)" if unknown else "")
        )
    overrides = list(overrides)
    set_keys = {item.split("=", 1)[0].strip() for item in overrides}
    recipe_keys = {item.split("=", 1)[0] for name in names for item in RECIPES[name]}
    if set_keys & recipe_keys:
        key = sorted(set_keys & recipe_keys)[0]
        setting = [n for n in names if any(i.split("=", 1)[0] == key for i in RECIPES[n])]
        raise ValueError(
            f"--set {key}: the recipes {', '.join(setting)} set it; to change the base recipe's "
            "value write it in the --config file, or train that value with snens train"
        )
    config = load_config(base, overrides)
    if config.method.name != "snens":
        raise ValueError(
            f"method.name is {config.method.name!r}: a probe chooses σN-Ens recipes; "
            'set method.name="snens"'
        )
    if not config.data.validation_examples:
        raise ValueError(
            "data.validation_examples is 0: a probe chooses on a validation split; hold one "
            "out, e.g. --set data.validation_examples=5000"
        )
    if not config.optim.select:  # the command chooses on validation: NLL unless told
        overrides.append(f'optim.select="{DEFAULT_SELECT}"')
    out = Path(out)
    runs: list[SweepRun] = []
    for name in names:
        recipe = load_config(base, [*overrides, *RECIPES[name]])
        if any(recipe.method == run.config.method for run in runs):
            continue  # the same recipe as an earlier name
        recipe = dataclasses.replace(recipe, out_dir=str(out), name=name)
        runs.append(SweepRun(name, {"recipe": name}, recipe, _status(out / name, recipe)))
    return runs


def _probed(run: SweepRun, epochs: int) -> tuple[int, float | None, int | None]:
    """The epochs of ``run`` done (up to ``epochs``, from its metrics.jsonl), its best
    validation value among them and that epoch (None where none is finite)."""
    metric = run.config.optim.select
    key = f"val/{metric}"
    values = {
        r["epoch"]: r[key]
        for r in read_metrics(run.path())
        if isinstance(r.get("epoch"), int) and r["epoch"] <= epochs and key in r
    }
    finite = {e: v for e, v in values.items() if isinstance(v, int | float) and math.isfinite(v)}
    if not finite:
        return len(values), None, None
    pick = max if SELECT_METRICS[metric] else min
    epoch = pick(finite, key=finite.__getitem__)
    return len(values), finite[epoch], epoch


def tune(
    runs: Sequence[SweepRun],
    out: str | os.PathLike,
    *,
    probe_epochs: int | None = None,
    progress: bool = False,
    train: Callable[..., Path] | None = None,
    log: Callable[[str], None] = print,
) -> TuneResult:
    """Probe the runs of :func:`plan_tune` for ``probe_epochs`` (default
    :func:`default_probe_epochs`), choose on validation and train the chosen one to the end.

    Returns:
        The probe's record, also written to ``out/tune.json``.

    Raises:
        ValueError: ``probe_epochs`` outside 1..optim.epochs, or no runs.
        RuntimeError: a run failed, or no recipe has a finite validation value.
        RunDirError: ``out`` is not writable.
    """
    if not runs:
        raise ValueError("no recipe to probe; plan them with plan_tune")
    if train is None:
        from snens.engine.train import train
    epochs = runs[0].config.optim.epochs
    k = default_probe_epochs(epochs) if probe_epochs is None else probe_epochs
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= epochs:
        raise ValueError(f"probe_epochs must be an int in 1..{epochs} (optim.epochs), got {k!r}")

    def probe(config: RunConfig, **kwargs: Any) -> Path:
        return train(config, until_epoch=k, **kwargs)

    pending = [r for r in runs if not _finished(r.path()) and _probed(r, k)[0] < k]
    log(f"probing {len(runs)} recipes for {k} of {epochs} epochs ({len(pending)} to train)")
    keys = ["recipe"]
    result = run_sweep(
        pending,
        out,
        keys=keys,
        table=runs,
        progress=progress,
        train=probe,
        log=lambda line: log(line.replace(": finished in ", ": probed in ", 1)),
    )
    _raise_failed(result.failed, result.busy)
    probed = {r.name: _probed(r, k)[1:] for r in runs}
    values = {name: value for name, (value, _) in probed.items()}
    metric = runs[0].config.optim.select
    choice = choose_on_validation(
        [{0: {"metric": metric, "value": v}} if v is not None else {} for v in values.values()]
    )
    if choice.index is None:
        raise RuntimeError(f"no recipe has a finite validation {metric} after {k} epochs")
    chosen = runs[choice.index]
    for name, value in values.items():
        shown = "none" if value is None else f"{value:.4f}"
        log(f"  {name}: best validation {metric} after {k} of {epochs} epochs: {shown}")
    log(f"chosen: {chosen.name}; training it to epoch {epochs}")
    result = run_sweep(
        [chosen], out, keys=keys, table=runs, progress=progress, train=train, log=log
    )
    _raise_failed(result.failed, result.busy)
    record = {
        "metric": metric,
        "probe_epochs": k,
        "epochs": epochs,
        "recipes": {
            r.name: {
                "set": list(RECIPES[r.name]),
                "value": values[r.name],
                "epoch": probed[r.name][1],
            }
            for r in runs
        },
        "chosen": chosen.name,
    }
    files.write_text(Path(out) / TUNE_FILE, to_json(record, indent=2) + "\n")
    return TuneResult(list(runs), k, values, chosen.name, chosen.path())


def _raise_failed(failed: Mapping[str, str], busy: Mapping[str, str]) -> None:
    if failed:
        name, error = next(iter(failed.items()))
        raise RuntimeError(f"the recipe {name} failed ({error}); fix it and run again to resume")
    if busy:
        name, holder = next(iter(busy.items()))
        raise RuntimeError(
            f"the recipe {name} is being trained by {holder}; run again when it is done"
        )
