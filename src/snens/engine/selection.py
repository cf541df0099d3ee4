"""Model selection on the validation split: which epoch's weights a run evaluates.

With ``optim.select = "nll"`` (or ``"brier"``, ``"ece"``, ``"accuracy"``) the engine scores the
validation split after every epoch and keeps the weights of the best epoch so far for the
final evaluation. A deep ensemble keeps each member at its own best epoch; every other method
is selected as a whole. ``optim.patience = P`` stops training once nothing improved for P
epochs.

``best.pt`` holds the kept weights, written after ``last.pt`` (which records the selection,
with a SHA-256 of each group's kept weights), so a kill between the two writes loses nothing,
and a ``best.pt`` of another run is refused. :func:`choose_on_validation` chooses among
finished runs the same way, the test set unread.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from snens import files
from snens.baselines import DeepEnsemble
from snens.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from snens.engine.config import SELECT_METRICS, SELECT_NAMES, from_dict, to_dict
from snens.metrics import predictive

__all__ = [
    "BEST",
    "SELECT_METRICS",
    "SELECT_NAMES",
    "Choice",
    "Selection",
    "choose_on_validation",
    "selected_state",
    "weights_digest",
]

#: The file of the kept weights, beside ``last.pt``.
BEST = "best.pt"

_SCORES = {name: getattr(predictive, name) for name in SELECT_METRICS}


@dataclass
class Selection:
    """The best epoch so far of each selected group, and its weights (CPU copies)."""

    metric: str  # a key of SELECT_METRICS
    groups: tuple[str, ...]  # state-dict prefixes selected apart (("",): the model as a whole)
    epochs: list[int] = field(default_factory=list)  # per group, the kept epoch (0: none yet)
    values: list[float] = field(default_factory=list)  # per group, the metric at that epoch
    # per group, the validation logits (M_g, N, K) at that epoch, while this process saw it
    logits: list[Tensor | None] = field(default_factory=list)
    latest: list[float] = field(default_factory=list)  # per group, the last epoch's metric
    # per group, the SHA-256 of the kept weights (:func:`weights_digest`; None: none kept)
    digests: list[str | None] = field(default_factory=list)
    _state: dict[str, Tensor] = field(default_factory=dict, repr=False)
    _keys: list[list[str]] = field(default_factory=list, repr=False)
    _labels: Tensor | None = field(default=None, repr=False)

    @classmethod
    def for_model(cls, model: nn.Module, metric: str) -> Selection:
        """A selection of ``model`` on ``metric``, nothing kept yet.

        Raises:
            ValueError: ``metric`` is not one of :data:`SELECT_METRICS`.
        """
        if metric not in SELECT_METRICS:
            raise ValueError(
                f"cannot select on {metric!r}; choose one of {', '.join(SELECT_METRICS)}"
            )
        # selected apart: each deep-ensemble member, else the whole
        groups: tuple[str, ...] = ("",)
        if isinstance(model, DeepEnsemble) and model.num_members > 1:
            groups = tuple(f"members.{m}." for m in range(model.num_members))
        # what training can change: trainable parameters and every buffer
        frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
        keys = [name for name in model.state_dict() if name not in frozen]
        by_group = [[k for k in keys if k.startswith(g)] for g in groups]
        if sum(map(len, by_group)) != len(keys):  # a shared tensor: select the whole
            groups, by_group = ("",), [keys]
        n = len(groups)
        return cls(
            metric,
            groups,
            epochs=[0] * n,
            values=[math.nan] * n,
            logits=[None] * n,
            digests=[None] * n,
            _keys=by_group,
        )

    @property
    def epoch(self) -> int:
        """The latest kept epoch of any group (early stopping counts from it)."""
        return max(self.epochs)

    def _better(self, value: float, best: float, epoch: int) -> bool:
        if epoch == 0 or not math.isfinite(best):
            return epoch == 0 or math.isfinite(value)
        if not math.isfinite(value):
            return False
        return value > best if SELECT_METRICS[self.metric] else value < best

    def scores(self, member_logits: Tensor, labels: Tensor) -> list[float]:
        """Each group's validation metric from the ensemble's member logits ``(M, N, K)``:
        member m's own for a deep ensemble's groups, the ensemble's mean prediction else."""
        probs = member_logits.float().softmax(-1)
        rows = [probs] if self.groups == ("",) else [probs[m : m + 1] for m in range(len(probs))]
        score = _SCORES[self.metric]
        # a member that diverged scores NaN (never kept), not an error from the metric
        return [score(p.mean(0), labels) if p.isfinite().all() else math.nan for p in rows]

    def update(
        self, epoch: int, member_logits: Tensor, labels: Tensor, model: nn.Module
    ) -> list[int]:
        """Score ``epoch`` and keep the weights of each group it improves; return those groups
        (a non-finite score never replaces a finite one)."""
        improved, state = [], None
        self.latest = self.scores(member_logits, labels)
        for g, value in enumerate(self.latest):
            if not self._better(value, self.values[g], self.epochs[g]):
                continue
            state = model.state_dict() if state is None else state
            for key in self._keys[g]:
                self._state[key] = state[key].detach().to("cpu", copy=True)
            self.epochs[g], self.values[g] = epoch, value
            self.digests[g] = weights_digest(self._state, self._keys[g])
            rows = slice(None) if self.groups == ("",) else slice(g, g + 1)
            self.logits[g] = member_logits[rows].detach().cpu()
            improved.append(g)
        self._labels = labels.detach().cpu()
        return improved

    def kept_validation(self) -> dict[str, Tensor] | None:
        """The validation logits of the kept weights (``"val"``: ``(M, N, K)``) and labels
        (``"val_labels"``), or None if this process did not see every group's kept epoch."""
        if any(t is None for t in self.logits) or self._labels is None:
            return None
        return {"val": torch.cat(self.logits), "val_labels": self._labels}  # type: ignore[arg-type]

    def record(self) -> dict[str, Any]:
        """What ``last.pt`` and ``best.pt`` record of the selection: the metric, and per group
        the kept epoch, its value and the SHA-256 of its weights."""
        return {
            "metric": self.metric,
            "epochs": list(self.epochs),
            "values": list(self.values),
            "digests": list(self.digests),
        }

    def summary(self, epochs_trained: int, patience: int) -> dict[str, Any]:
        """``final.json``'s ``selection``: the metric, the kept epoch(s) and their values."""
        out: dict[str, Any] = {"metric": self.metric}
        if self.groups == ("",):
            out.update(epoch=self.epochs[0], value=self.values[0])
        else:
            out.update(member_epochs=list(self.epochs), member_values=list(self.values))
        out.update(epochs_trained=epochs_trained, patience=patience)
        return out

    def save(self, path: Path, config: Mapping[str, Any]) -> None:
        """Write the kept weights and the record to ``path`` (``best.pt``), atomically."""
        state = {"model": dict(self._state), "selection": self.record(), "config": dict(config)}
        save_checkpoint(path, state, keep_previous=False)

    def weights(self) -> dict[str, Tensor]:
        """The kept tensors (a subset of the model's state dict)."""
        return dict(self._state)

    def restore(
        self,
        record: Mapping[str, Any],
        last_epoch: int,
        last_model: Mapping[str, Tensor],
        best: Path,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        """Take up the selection a checkpoint recorded: each group's weights from ``last.pt``
        (``last_model``) where its kept epoch is ``last_epoch``, else from ``best``, whose config
        must be ``config`` (the run's, as dicts; None: not checked) and whose weights must have
        the digests the record holds (a record written before digests were kept: not checked).

        Raises:
            CheckpointError: the record does not fit this run, or ``best.pt`` is missing, not a
                file, or of another run (another config, other weights).
        """
        epochs, values = record.get("epochs"), record.get("values")
        digests = record.get("digests", [None] * len(self.groups))
        if (
            record.get("metric") != self.metric
            or not isinstance(epochs, list)
            or not isinstance(values, list)
            or not isinstance(digests, list)
            or len(epochs) != len(self.groups)
            or len(values) != len(self.groups)
            or len(digests) != len(self.groups)
            or not all(isinstance(e, int) and 0 <= e <= last_epoch for e in epochs)
            or not all(d is None or isinstance(d, str) for d in digests)
        ):
            raise CheckpointError(
                f"{best.parent / 'last.pt'}: its selection record {dict(record)!r} does not fit "
                f"this run ({len(self.groups)} group(s) selected on {self.metric!r}); resume "
                "from prev.pt (copy it over last.pt) or start the run again"
            )
        stored: Mapping[str, Tensor] = {}
        stored_epochs: list[int] = []
        if any(0 < e < last_epoch for e in epochs):
            _check_best_file(best, epochs)
            saved = load_checkpoint(best, required=("model", "selection", "config"))
            if config is not None:
                _check_best_config(best, saved["config"], config)
            stored, stored_epochs = saved["model"], saved["selection"].get("epochs", [])
        for g, epoch in enumerate(epochs):
            if epoch == 0:
                continue
            source = last_model if epoch == last_epoch else stored
            if epoch != last_epoch and not (g < len(stored_epochs) and stored_epochs[g] == epoch):
                raise CheckpointError(
                    f"{best} holds epochs {stored_epochs}, but last.pt selected {epochs}: the "
                    "files are of different runs or were edited; start the run again"
                )
            missing = [k for k in self._keys[g] if k not in source]
            if missing:
                raise CheckpointError(
                    f"{best}: the kept weights lack {missing[:3]}; start the run again"
                )
            if source is stored and digests[g] is not None:
                found = weights_digest(stored, self._keys[g])
                if found != digests[g]:
                    of = f" of member {g}" if len(self.groups) > 1 else ""
                    raise CheckpointError(
                        f"{best}: the weights{of} are not those this run kept at epoch {epoch} "
                        f"(SHA-256 {found[:12]}…, last.pt recorded {digests[g][:12]}…): it is "
                        "another run's best.pt or was edited. Put the run's own best.pt back "
                        "(from a backup of the run), or start the run again"
                    )
            for key in self._keys[g]:
                self._state[key] = source[key].detach().to("cpu", copy=True)
        self.epochs, self.values = list(epochs), [float(v) for v in values]
        # a record without digests (written before they were kept) gets them from the weights
        self.digests = [
            None if e == 0 else d or weights_digest(self._state, self._keys[g])
            for g, (e, d) in enumerate(zip(epochs, digests, strict=True))
        ]
        self.logits = [None] * len(self.groups)


def weights_digest(state: Mapping[str, Tensor], keys: Sequence[str]) -> str:
    """The SHA-256 of the tensors ``state[key]`` of ``keys`` (names, dtypes, shapes and values,
    whatever their memory layout or device)."""
    digest = hashlib.sha256()
    for key in sorted(keys):
        tensor = state[key].detach().cpu()
        digest.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _check_best_file(best: Path, epochs: list[int]) -> None:
    """Refuse a ``best.pt`` that is missing or not a regular file, naming what is there."""
    selected = f"the weights of the epochs the run selected ({epochs})"
    lost = (
        "the selected model is lost: start the run again, or evaluate its last epoch with "
        'optim.select = ""'
    )
    try:
        mode = os.stat(best).st_mode
    except FileNotFoundError:
        if not os.path.islink(best):
            raise CheckpointError(
                f"{best} is missing, and it holds {selected}; without it {lost}"
            ) from None
        kind = "a symbolic link to nothing"
    except OSError:
        return  # load_checkpoint names what fails
    else:
        if stat.S_ISREG(mode):
            return
        kind = files.file_kind(mode)
    raise CheckpointError(
        f"{best} is {kind}, not a checkpoint file, so {selected} cannot be read from it; move "
        f"it away and put the run's own best.pt there (from a backup of the run), else {lost}"
    )


def _check_best_config(best: Path, saved: Any, config: Mapping[str, Any]) -> None:
    """Refuse a ``best.pt`` saved under another config than the run's ``config`` (as dicts)."""

    try:
        theirs = to_dict(from_dict(saved))
    except (ValueError, TypeError, AttributeError) as error:
        raise CheckpointError(
            f"{best} holds a config this version of snens cannot read ({error}); it is not "
            "this run's best.pt: put the run's own back (from a backup of the run), or start "
            "the run again"
        ) from error
    changed = _differences(dict(config), theirs)
    if changed:
        raise CheckpointError(
            f"{best} was saved by another run: its config differs from the run's "
            f"({'; '.join(changed[:5])}{'; …' if len(changed) > 5 else ''}), so its weights "
            "are not this run's kept weights. Put the run's own best.pt back (from a backup of "
            "the run), or start the run again"
        )


def _differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``"key: the run's A, best.pt's B"`` for every key whose values differ."""
    out = []
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key), theirs.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: the run's {a!r}, best.pt's {b!r}")
    return out


def selected_state(
    model: nn.Module, run_dir: Path, state: Mapping[str, Any], metric: str
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The state dict a finished run evaluates (``last.pt``'s ``state`` with the selection's kept
    weights laid over it), and the selection's record.

    Raises:
        CheckpointError: no selection record, or see :meth:`Selection.restore`.
    """
    selection = Selection.for_model(model, metric)
    fix = "it was saved by another version or edited: start the run again"
    _restore_checkpoint(selection, state, run_dir, fix)
    return {**state["model"], **selection.weights()}, selection.record()


def _restore_checkpoint(
    selection: Selection, state: Mapping[str, Any], run_dir: Path, fix: str
) -> None:
    """:meth:`Selection.restore` of the record in ``last.pt``'s ``state``; ``fix`` says what to
    do where it holds none."""
    record = state.get("selection")
    if not isinstance(record, Mapping):
        raise CheckpointError(
            f"{run_dir / 'last.pt'} holds no selection record, but the run selects on "
            f"{selection.metric!r}; {fix}"
        )
    selection.restore(record, state["epoch"], state["model"], run_dir / BEST, _config(state))


def _config(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """``last.pt``'s config as dicts, a key added since at its default (None: unreadable; the
    callers refuse it before)."""

    try:
        return to_dict(from_dict(state["config"]))
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Choice:
    """A choice among configurations by their validation metric at the selected epochs."""

    index: int | None  # the chosen candidate (None: none could be chosen)
    metric: str | None  # the validation metric every candidate was selected on
    # the seeds compared, those every candidate has (empty: each candidate's own were averaged)
    seeds: tuple[int, ...]
    values: tuple[float | None, ...]  # per candidate, the mean over those seeds (None: left out)
    left_out: tuple[str | None, ...]  # per candidate, why it is not one (None: it is one)


def _why_left_out(runs: Mapping[int, Any]) -> str | None:
    records = list(runs.values())
    if not records or not all(isinstance(r, Mapping) for r in records):
        return "trained without optim.select (evaluated at its last epoch)"
    if any("member_values" in r for r in records):
        return "its members were each selected on their own: no one validation value"
    if any(
        not isinstance(r.get("metric"), str)
        or r["metric"] not in SELECT_METRICS
        or "value" not in r
        for r in records
    ):
        return "its selection record names no metric and value"
    return None


def choose_on_validation(candidates: Sequence[Mapping[int, Any]]) -> Choice:
    """The candidate of the best validation metric at its selected epochs, mean over seeds.

    Each candidate is a configuration's finished runs, ``{seed: final.json's "selection"}``,
    compared over the seeds they all have (else each over its own). A candidate that selected
    no epoch, or each member apart, is left out with the reason; a non-finite value never
    wins; ties go to the earlier candidate.

    Returns:
        The choice; ``index`` None where none remains, every value is non-finite, or the
        metrics differ (``metric`` None).
    """
    left_out = [_why_left_out(runs) for runs in candidates]
    kept = [i for i, why in enumerate(left_out) if why is None]
    metrics = {r["metric"] for i in kept for r in candidates[i].values()}
    if len(metrics) != 1:
        return Choice(None, None, (), (None,) * len(candidates), tuple(left_out))
    metric = metrics.pop()
    common = set.intersection(*(set(candidates[i]) for i in kept))
    values: list[float | None] = [None] * len(candidates)
    for i in kept:
        seeds = sorted(common) if common else sorted(candidates[i])
        found = [candidates[i][s]["value"] for s in seeds]
        finite = all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in found
        )
        values[i] = sum(found) / len(found) if finite else math.nan
    sign = -1.0 if SELECT_METRICS[metric] else 1.0
    ranked = [i for i in kept if math.isfinite(values[i])]  # type: ignore[arg-type]
    index = min(ranked, key=lambda i: sign * values[i]) if ranked else None  # type: ignore[operator]
    return Choice(index, metric, tuple(sorted(common)), tuple(values), tuple(left_out))
