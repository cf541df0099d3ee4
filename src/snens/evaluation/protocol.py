"""The field's evaluation protocol for any model honouring (B, …) -> logits (M, B, K).

One pass per data set: :func:`collect` keeps the members' outputs (M, N, K) on the CPU and every
number is computed from them by :mod:`snens.metrics`: ``test/…``, ``ood/<name>/…`` (OOD
positive) and ``shift/<name>/<severity>/…`` with their means. :func:`posthoc_metrics` adds
more OOD scores and split-conformal sets from the kept logits, without another pass.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from snens import metrics
from snens.evaluation import conformal
from snens.evaluation._checks import _is_int
from snens.evaluation.calibration import fit_calibrator, fit_temperature
from snens.evaluation.predictions import _collect, collect

__all__ = [
    "CALIBRATED_PREFIXES",
    "CONFORMAL_SCORES",
    "SHIFT_METRICS",
    "calibrated_metrics",
    "collect",
    "ensemble_metrics",
    "evaluate",
    "held_out_metrics",
    "logit_metrics",
    "ood_detection",
    "posthoc_metrics",
    "stack_members",
    "temperature_scaled_metrics",
]

SHIFT_METRICS = ("accuracy", "nll", "ece", "brier")
"""The metrics reported per corruption, per severity and on average."""

CONFORMAL_SCORES = ("thr", "aps")
"""The conformal scores :func:`posthoc_metrics` reports (THR and randomized APS)."""

CALIBRATED_PREFIXES = {
    "temperature": "test_ts",
    "vector": "test_vs",
    "matrix": "test_ms",
    "histogram": "test_hb",
}
"""Each post-hoc calibrator's prefix in a run's metrics, ``<prefix>/<metric>``."""

_DETECTION = {"auroc": metrics.auroc, "aupr": metrics.aupr, "fpr95": metrics.fpr_at_95_tpr}
_CALIBRATED_KEEP = ("accuracy", "nll", "brier", "ece", "adaptive_ece")
_SEVERITIES = range(1, 6)
_SCORE_NAMES = sorted([*metrics.OOD_SCORES, *metrics.LOGIT_OOD_SCORES])
_KEPT_SETS = ("domain", "shift")  # the labelled sets beside the test set
# "shift/severity/…" and "shift/mean/…" hold the averages
_RESERVED_SHIFT_NAMES = ("severity", "mean")


def ensemble_metrics(member_probs: Any, labels: Any, num_bins: int = 15) -> dict[str, float]:
    """The test metrics of :func:`evaluate`, without the ``test/`` prefix, from member
    probabilities (M, N, K) and labels (N,).

    Returns:
        A flat ``{metric: float}``: the ensemble prediction's metrics, its diversity (means over
        examples; ``member_correlation`` NaN for one member), the members' mean accuracy, NLL and
        ECE, and ``num_members``.

    Raises:
        TypeError, ValueError: bad probabilities or labels; ``num_bins`` not an int >= 1.
    """
    member_probs = torch.as_tensor(member_probs)
    if member_probs.dim() != 3:
        raise ValueError(
            f"member_probs must be (M, N, K), got shape {tuple(member_probs.shape)}; "
            "stack the members' probabilities on a first dimension"
        )
    _check_num_bins(num_bins)
    probs = member_probs.mean(0)  # (N, K): the ensemble's prediction
    M = member_probs.shape[0]
    members = metrics.per_member(member_probs, labels)
    member_ece = [metrics.ece(p, labels, num_bins=num_bins) for p in member_probs]
    return {
        "accuracy": metrics.accuracy(probs, labels),
        "nll": metrics.nll(probs, labels),
        "brier": metrics.brier(probs, labels),
        "ece": metrics.ece(probs, labels, num_bins=num_bins),
        "adaptive_ece": metrics.adaptive_ece(probs, labels, num_bins=num_bins),
        "classwise_ece": metrics.classwise_ece(probs, labels, num_bins=num_bins),
        "aurc": metrics.aurc(probs, labels),
        "disagreement": metrics.disagreement(member_probs).mean().item(),
        "predictive_entropy": metrics.predictive_entropy(member_probs).mean().item(),
        "expected_entropy": metrics.expected_entropy(member_probs).mean().item(),
        "mutual_information": metrics.mutual_information(member_probs).mean().item(),
        "member_correlation": math.nan if M < 2 else metrics.member_correlation(member_probs),
        "member_accuracy_mean": members["accuracy"].mean().item(),
        "member_nll_mean": members["nll"].mean().item(),
        "member_ece_mean": sum(member_ece) / M,
        "num_members": float(M),
    }


def _shift_metrics(member_logits: Tensor, labels: Tensor, num_bins: int) -> dict[str, float]:
    probs = member_logits.softmax(dim=-1).mean(0)
    return {
        "accuracy": metrics.accuracy(probs, labels),
        "nll": metrics.nll(probs, labels),
        "ece": metrics.ece(probs, labels, num_bins=num_bins),
        "brier": metrics.brier(probs, labels),
    }


def _check_num_bins(num_bins: Any) -> None:
    if not _is_int(num_bins) or num_bins < 1:
        raise ValueError(f"num_bins must be an int >= 1, got {num_bins!r}; use e.g. num_bins=15")


def _check_loaders(loaders: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """``{name: loader}`` of OOD or domain sets, each name usable in a key."""
    if loaders is None:
        return {}
    if not isinstance(loaders, Mapping):
        raise TypeError(
            f"{what} must be a mapping {{name: loader}}, got {type(loaders).__name__}; e.g. "
            f"{what}={{'mnist': mnist_loader}}"
        )
    for name in loaders:
        _check_name(name, "OOD set")
    return dict(loaders)


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(
            f"{what} names must be non-empty strings without '/', got {name!r} (they become "
            "parts of keys such as 'ood/<name>/auroc')"
        )
    return name


def _check_corruptions(
    corruptions: Mapping[tuple[str, int], Any] | None,
) -> dict[tuple[str, int], Any]:
    if corruptions is None:
        return {}
    if not isinstance(corruptions, Mapping):
        raise TypeError(
            "corruptions must be a mapping {(name, severity): loader}, got "
            f"{type(corruptions).__name__}"
        )
    checked = {}
    for key, loader in corruptions.items():
        if not isinstance(key, tuple) or len(key) != 2:
            raise ValueError(
                f"corruptions keys must be (name, severity) pairs, got {key!r}; e.g. "
                "{('gaussian_noise', 3): loader}"
            )
        name, severity = key
        if _check_name(name, "corruption") in _RESERVED_SHIFT_NAMES:
            raise ValueError(
                f"corruption name {name!r} is reserved for the averages 'shift/severity/…' and "
                "'shift/mean/…'; rename it"
            )
        if not _is_int(severity) or severity not in _SEVERITIES:
            raise ValueError(
                f"corruption {name!r}: severity must be an int in 1..5, got {severity!r}"
            )
        checked[(name, int(severity))] = loader
    return checked


def _check_ood_scores(ood_score: str | Sequence[str]) -> list[str]:
    scores = [ood_score] if isinstance(ood_score, str) else list(ood_score)
    for score in scores:
        if not isinstance(score, str) or score not in _SCORE_NAMES:
            raise ValueError(f"unknown ood_score {score!r}; choose one of {_SCORE_NAMES}")
    if not scores:
        raise ValueError("ood_score is an empty list; give at least one, e.g. 'msp'")
    return scores


def ood_detection(
    in_outputs: Tensor, out_outputs: Tensor, score: str = "msp", *, logits: bool = False
) -> dict[str, float]:
    """AUROC, AUPR and FPR at 95% TPR of one OOD score (high = OOD, OOD positive) of member
    probabilities (M, N, K) and (M, N', K), or of member logits with ``logits=True``.

    Returns:
        ``{"auroc": …, "aupr": …, "fpr95": …}``.

    Raises:
        ValueError: an unknown score; a logit score without ``logits=True``.
    """
    if score not in _SCORE_NAMES:
        raise ValueError(f"unknown OOD score {score!r}; choose one of {_SCORE_NAMES}")
    if score in metrics.LOGIT_OOD_SCORES and not logits:
        raise ValueError(
            f"OOD score {score!r} reads logits, which softmax has removed from probabilities; "
            "pass member logits and logits=True"
        )
    if logits:
        return _detection(_score(score, in_outputs), _score(score, out_outputs))
    return _detection(metrics.OOD_SCORES[score](in_outputs), metrics.OOD_SCORES[score](out_outputs))


def _score(score: str, member_logits: Tensor) -> Tensor:
    """Per-example OOD scores (N,) of any known score of member logits (M, N, K)."""
    if score in metrics.LOGIT_OOD_SCORES:
        return metrics.LOGIT_OOD_SCORES[score](member_logits)
    return metrics.OOD_SCORES[score](member_logits.softmax(dim=-1))


def _detection(s_in: Tensor, s_out: Tensor) -> dict[str, float]:
    return {key: detect(s_in, s_out) for key, detect in _DETECTION.items()}


def evaluate(
    model: nn.Module,
    test_loader: Iterable[Any],
    *,
    ood: Mapping[str, Iterable[Any]] | None = None,
    corruptions: Mapping[tuple[str, int], Iterable[Any]] | None = None,
    ood_score: str | Sequence[str] = "msp",
    num_bins: int = 15,
    device: torch.device | str | None = None,
    keep_logits: dict[str, Tensor] | None = None,
    domains: Mapping[str, Iterable[Any]] | None = None,
) -> dict[str, float]:
    """Evaluate an ensemble (or any model under the (M, B, K) contract) on the full protocol: each
    data set run once through the model in eval mode, the metrics those of the ensemble mean
    p̄ = (1/M) Σ_m softmax(z_m).

    Args:
        model: returns logits (M, B, K) from inputs (B, …); wrap a plain classifier in
            ``snens.baselines.SingleModel``.
        test_loader: in-distribution ``(x, y)`` batches.
        ood: ``{name: loader}`` of OOD sets; their labels are ignored.
        corruptions: ``{(name, severity): loader}`` of corrupted test sets, severity in 1..5.
        ood_score: a name of ``snens.metrics.OOD_SCORES`` or ``LOGIT_OOD_SCORES``, or a list of
            them (keys ``ood/<name>/<score>/…``).
        keep_logits: a dict that receives the member logits of each set and their labels
            (``"test"``, ``"test_labels"``, ``"ood/<name>"``, …), for :func:`posthoc_metrics`.
        domains: ``{name: loader}`` of labelled test sets of another domain, same classes.

    Returns:
        A flat ``{key: float}``: ``test/<metric>``, ``ood/<name>/[<score>/]{auroc,aupr,fpr95}``,
        ``shift/<name>/<severity>/<metric>`` with ``shift/severity/<s>/…`` and ``shift/mean/…``,
        ``domain/<name>/<metric>``.

    Raises:
        ValueError: an unknown ``ood_score``; a bad corruption key; an empty data set; a model not
            returning (M, B, K); M or K differing between data sets.
        TypeError: ``ood`` or ``corruptions`` not a mapping.
    """
    scores = _check_ood_scores(ood_score)
    _check_num_bins(num_bins)
    ood_sets = _check_loaders(ood, "ood")
    shifted = _check_corruptions(corruptions)

    def run(loader: Any, what: str, key: str, shape: tuple | None, labelled: bool = True):
        """One set's member logits and labels, checked against the test set's (M, K), kept."""
        logits, labels = _collect(model, loader, device, what=what, logits=True)
        if labelled and labels is None:
            raise ValueError(f"{what}: the loader yielded batches without labels; yield (x, y)")
        if shape is not None and (logits.shape[0], logits.shape[2]) != shape:
            raise ValueError(
                f"{what}: the model returned (M, K) = ({logits.shape[0]}, {logits.shape[2]}) "
                f"but {shape} on the test set"
            )
        if keep_logits is not None:
            keep_logits[key] = logits
            if labelled:
                keep_logits[f"{key}_labels"] = labels
        return logits, labels

    test_logits, labels = run(test_loader, "test set", "test", None)
    shape = (test_logits.shape[0], test_logits.shape[2])
    values = ensemble_metrics(test_logits.softmax(dim=-1), labels, num_bins)
    results = {f"test/{k}": v for k, v in values.items()}
    ood_logits = {
        name: run(loader, f"OOD set {name!r}", f"ood/{name}", shape, labelled=False)[0]
        for name, loader in ood_sets.items()
    }
    results.update(_ood_keys(test_logits, ood_logits, scores, ood_score))
    per_set = {}
    for (name, severity), loader in shifted.items():
        what = f"corruption {name!r} at severity {severity}"
        logits, shift_labels = run(loader, what, f"shift/{name}/{severity}", shape)
        per_set[(name, severity)] = _shift_metrics(logits, shift_labels, num_bins)
    results.update(_shift_summary(per_set, "shift"))
    for name, loader in _check_loaders(domains, "domains").items():
        logits, domain_labels = run(loader, f"domain set {name!r}", f"domain/{name}", shape)
        for metric, value in _shift_metrics(logits, domain_labels, num_bins).items():
            results[f"domain/{name}/{metric}"] = value
    return results


def _ood_keys(test_logits, ood_logits, scores, ood_score) -> dict[str, float]:
    """``ood/<name>/[<score>/]{auroc,aupr,fpr95}``, the score named if ``ood_score`` is a list."""
    in_scores = {s: _score(s, test_logits) for s in scores} if ood_logits else {}
    results = {}
    for name, out_logits in ood_logits.items():
        for score in scores:
            prefix = f"ood/{name}/" if isinstance(ood_score, str) else f"ood/{name}/{score}/"
            found = _detection(in_scores[score], _score(score, out_logits))
            results.update({prefix + key: value for key, value in found.items()})
    return results


def _kept_ood_keys(outputs, scores, ood_score) -> dict[str, float]:
    ood_logits = {k.removeprefix("ood/"): v for k, v in outputs.items() if k.startswith("ood/")}
    return _ood_keys(outputs["test"], ood_logits, scores, ood_score)


def posthoc_metrics(
    outputs: Mapping[str, Tensor],
    *,
    ood_scores: str | Sequence[str] = ("max_logit", "energy"),
    conformal_alpha: float = 0.1,
) -> dict[str, float]:
    """From the logits :func:`evaluate` kept: ``ood/<name>/<score>/…`` for each of ``ood_scores``
    (``()`` for none) and, with a validation split, ``test/conformal_<score>_{coverage,size}`` of
    split-conformal sets at α = ``conformal_alpha`` for each of :data:`CONFORMAL_SCORES`.

    Args:
        outputs: what ``evaluate(..., keep_logits=outputs)`` filled: ``"test"``, ``"test_labels"``,
            ``"ood/<name>"``, and ``"val"``, ``"val_labels"`` if any.

    Returns:
        A flat ``{key: float}``.

    Raises:
        ValueError: an unknown score; α outside (0, 1); a validation split too small for α; logits
            of another M or K than the test set's, or labels not of their N.
        KeyError: ``outputs`` without ``"test"`` or ``"test_labels"``.
    """
    scores = _check_ood_scores(ood_scores) if len(ood_scores) else []
    _check_outputs(outputs)
    test_labels = outputs["test_labels"]
    results = _kept_ood_keys(outputs, scores, scores)
    if "val" in outputs:
        generator = torch.Generator().manual_seed(0)
        for score in CONFORMAL_SCORES:
            fit = conformal.calibrate(
                outputs["val"], outputs["val_labels"], conformal_alpha, score, generator=generator
            )
            sets = fit.predict(outputs["test"], generator=generator)  # (N, K)
            results[f"test/conformal_{score}_coverage"] = conformal.coverage(sets, test_labels)
            results[f"test/conformal_{score}_size"] = conformal.mean_set_size(sets)
    return results


def _check_outputs(outputs: Mapping[str, Tensor]) -> None:
    """Kept logits of one model: every set's (M, N, K) floats of the test set's M and K, none NaN
    or +inf, each but the OOD sets with labels of their N."""
    test, _ = outputs["test"], outputs["test_labels"]
    if not _is_logits(test):
        raise ValueError(
            f"outputs['test'] must be (M, N, K) floating member logits, got {_describe(test)}"
        )
    M, _, K = test.shape
    for key, value in outputs.items():
        name = key.removesuffix("_labels")
        if name != key:
            logits = outputs.get(name)
            if not isinstance(value, Tensor) or logits is None or value.shape != logits.shape[1:2]:
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(
                    f"outputs[{key!r}] must be the (N,) labels of outputs[{name!r}], got {got}"
                )
        elif not key.startswith("ood/") and f"{key}_labels" not in outputs:
            raise ValueError(
                f"outputs[{key!r}] has no labels: give outputs[{key + '_labels'!r}] beside it"
            )
        elif not _is_logits(value) or (value.shape[0], value.shape[2]) != (M, K):
            raise ValueError(
                f"outputs[{key!r}] holds logits of shape {_describe(value)}, the test set's are "
                f"{tuple(test.shape)} {test.dtype}: every set's logits must be (M, N, K) floats "
                f"of the test set's M = {M} and K = {K} (the same model's, on the same classes)"
            )
        else:
            bad = torch.isnan(value) | (value == math.inf)  # −inf: a probability of 0, allowed
            if bool(bad.any()):
                raise ValueError(
                    f"outputs[{key!r}] holds {int(bad.sum()):,} logits that are NaN or +inf: the "
                    "model diverged, or the logits were changed; nothing can be measured from them"
                )


def _is_logits(value: Any) -> bool:
    return isinstance(value, Tensor) and value.is_floating_point() and value.dim() == 3


def _describe(value: Any) -> str:
    return (
        f"{tuple(value.shape)} {value.dtype}" if isinstance(value, Tensor) else type(value).__name__
    )


def _kept_set_metrics(
    outputs: Mapping[str, Tensor], apply: Any = None, tail: str = "", num_bins: int = 15
) -> dict[str, float]:
    """``domain<tail>/…`` and ``shift<tail>/…`` of the kept domain and corrupted sets' logits,
    mapped by ``apply`` (a calibrator; None: as kept)."""
    results: dict[str, float] = {}
    per_set: dict[tuple[str, int], dict[str, float]] = {}
    for key in sorted(outputs):
        head, _, rest = key.partition("/")
        if key.endswith("_labels") or f"{key}_labels" not in outputs or head not in _KEPT_SETS:
            continue
        logits = outputs[key] if apply is None else apply(outputs[key])
        values = _shift_metrics(logits, outputs[f"{key}_labels"], num_bins)
        if head == "domain":
            results.update({f"domain{tail}/{rest}/{m}": v for m, v in values.items()})
        else:
            name, severity = rest.rsplit("/", 1)
            per_set[(name, int(severity))] = values
    results.update(_shift_summary(per_set, f"shift{tail}"))
    return results


def _shift_summary(per_set: Mapping[tuple[str, int], Mapping[str, float]], head: str) -> dict:
    """``<head>/<name>/<s>/<metric>`` and the means ``<head>/severity/<s>/…``, ``<head>/mean/…``."""
    results = {}
    for (name, severity), values in sorted(per_set.items()):
        for metric, value in values.items():
            results[f"{head}/{name}/{severity}/{metric}"] = value
    for severity in sorted({s for _, s in per_set}):
        at_severity = [v for (_, s), v in per_set.items() if s == severity]
        for metric in SHIFT_METRICS:
            results[f"{head}/severity/{severity}/{metric}"] = _mean(at_severity, metric)
    if per_set:
        for metric in SHIFT_METRICS:
            results[f"{head}/mean/{metric}"] = _mean(list(per_set.values()), metric)
    return results


def _mean(rows: list[dict[str, float]], metric: str) -> float:
    return sum(row[metric] for row in rows) / len(rows)


def _calibrated(
    outputs: Mapping[str, Tensor], prefix: str, apply: Callable, num_bins: int
) -> dict[str, float]:
    """``<prefix>/<metric>`` of the test set and the kept sets' metrics after ``apply``."""
    probs = apply(outputs["test"]).softmax(dim=-1)
    values = ensemble_metrics(probs, outputs["test_labels"], num_bins)
    return {
        **{f"{prefix}/{k}": values[k] for k in _CALIBRATED_KEEP},
        **_kept_set_metrics(outputs, apply, prefix.removeprefix("test"), num_bins),
    }


def _calibration_map(name: str, outputs: Mapping[str, Tensor]) -> Callable[[Tensor], Tensor]:
    """The calibrator ``name`` fitted on the kept validation logits, as a map of logits."""
    if name != "temperature":
        return fit_calibrator(name, outputs["val"], outputs["val_labels"]).apply
    T = _temperature(outputs)
    return lambda z: z / T


def _temperature(outputs: Mapping[str, Tensor]) -> float:
    with warnings.catch_warnings():  # a T at the search's bound is reported, not warned
        warnings.simplefilter("ignore")
        return fit_temperature(outputs["val"], outputs["val_labels"])


def temperature_scaled_metrics(
    outputs: Mapping[str, Tensor], num_bins: int = 15
) -> dict[str, float]:
    """``test_ts/<metric>`` after temperature scaling fitted on ``outputs["val"]``, and
    ``test_ts/temperature``; calibration errors over ``num_bins`` bins.

    Returns:
        A flat ``{key: float}``.

    Raises:
        KeyError: ``outputs`` without ``val``, ``val_labels``, ``test`` or ``test_labels``.
        TypeError, ValueError: validation logits or labels :func:`fit_temperature` refuses.
    """
    T = _temperature(outputs)
    calibrated = _calibrated(outputs, "test_ts", lambda z: z / T, num_bins)
    return {"test_ts/temperature": T, **calibrated}


def calibrated_metrics(
    outputs: Mapping[str, Tensor],
    calibrators: str | Sequence[str] = ("temperature",),
    num_bins: int = 15,
) -> dict[str, float]:
    """The test metrics after each of ``calibrators`` (names of :data:`CALIBRATED_PREFIXES`, each
    once) fitted on ``outputs["val"]``, keyed ``<prefix>/<metric>``; calibration errors over
    ``num_bins`` bins, as the uncalibrated ones.

    Returns:
        A flat ``{key: float}``.

    Raises:
        ValueError: an unknown calibrator, or one listed twice; logits the calibrator refuses.
        KeyError: ``outputs`` without ``val``, ``val_labels``, ``test`` or ``test_labels``.
    """
    results: dict[str, float] = {}
    for name in _check_calibrators(calibrators):
        if name == "temperature":
            results.update(temperature_scaled_metrics(outputs, num_bins))
        else:
            apply = _calibration_map(name, outputs)
            results.update(_calibrated(outputs, CALIBRATED_PREFIXES[name], apply, num_bins))
    return results


def _check_calibrators(calibrators: str | Sequence[str]) -> list[str]:
    names = [calibrators] if isinstance(calibrators, str) else list(calibrators)
    for name in names:
        if name not in CALIBRATED_PREFIXES:
            raise ValueError(
                f"unknown calibrator {name!r}; choose among {list(CALIBRATED_PREFIXES)}"
            )
        if names.count(name) > 1:
            raise ValueError(f"calibrator {name!r} is listed twice; list each once")
    return names


def stack_members(outputs: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """One ensemble's kept logits from the ``keep_logits`` dicts of two or more models trained
    apart: each set's member logits concatenated, its labels checked equal.

    Returns:
        The same keys: logits (ΣM, N, K), labels (N,).

    Raises:
        ValueError: fewer than two dicts, or dicts of different sets, labels or shapes.
        KeyError: no ``"test"`` or ``"test_labels"``.
    """
    if isinstance(outputs, Mapping) or len(outputs) < 2:
        raise ValueError(
            "stack_members takes a list of two or more keep_logits dicts, one per model "
            f"trained apart; got {type(outputs).__name__}"
            + ("" if isinstance(outputs, Mapping) else f" of {len(outputs)}")
        )
    keys = set(outputs[0])
    for key in ("test", "test_labels"):
        if key not in keys:
            raise KeyError(f"the first outputs hold no {key!r}; give what evaluate kept")
    for i, other in enumerate(outputs[1:], 1):
        if set(other) != keys:
            raise ValueError(
                f"outputs 0 and {i} hold different sets ({', '.join(sorted(keys ^ set(other)))} "
                "in one only); stack models evaluated on the same data"
            )
    stacked: dict[str, Tensor] = {}
    for key in sorted(keys):
        values = [o[key] for o in outputs]
        if key.endswith("_labels"):
            for i, labels in enumerate(values[1:], 1):
                if labels.shape != values[0].shape or not torch.equal(labels, values[0]):
                    raise ValueError(
                        f"{key}: outputs 0 and {i} hold different labels; the models were "
                        f"evaluated on different {key.removesuffix('_labels')} examples"
                    )
            stacked[key] = values[0]
        elif len({tuple(v.shape[1:]) for v in values}) != 1 or any(v.dim() != 3 for v in values):
            raise ValueError(
                f"{key}: member logits of shapes {[tuple(v.shape) for v in values]}; each must "
                "be (M_i, N, K) with one N and K"
            )
        else:
            stacked[key] = torch.cat(values)
    return stacked


def logit_metrics(
    outputs: Mapping[str, Tensor],
    *,
    ood_score: str | Sequence[str] = "msp",
    ood_scores: str | Sequence[str] = ("max_logit", "energy"),
    conformal_alpha: float = 0.1,
    calibrators: str | Sequence[str] = ("temperature",),
    num_bins: int = 15,
) -> dict[str, float]:
    """A run's final metrics from kept logits alone (e.g. of :func:`stack_members`):
    :func:`evaluate`'s, ``ood_score`` as there, and :func:`held_out_metrics`'s.

    Returns:
        A flat ``{key: float}``.

    Raises:
        ValueError: as :func:`evaluate` and :func:`posthoc_metrics` raise.
        KeyError: ``outputs`` without ``"test"`` or ``"test_labels"``.
    """
    scores = _check_ood_scores(ood_score)
    _check_num_bins(num_bins)
    _check_outputs(outputs)
    values = ensemble_metrics(outputs["test"].softmax(dim=-1), outputs["test_labels"], num_bins)
    return {
        **{f"test/{k}": v for k, v in values.items()},
        **_kept_ood_keys(outputs, scores, ood_score),
        **_kept_set_metrics(outputs, num_bins=num_bins),
        **held_out_metrics(
            outputs,
            ood_scores=ood_scores,
            conformal_alpha=conformal_alpha,
            calibrators=calibrators,
            num_bins=num_bins,
        ),
    }


def held_out_metrics(
    outputs: Mapping[str, Tensor],
    *,
    ood_scores: str | Sequence[str] = ("max_logit", "energy"),
    conformal_alpha: float = 0.1,
    calibrators: str | Sequence[str] = ("temperature",),
    num_bins: int = 15,
) -> dict[str, float]:
    """From kept logits, ``val/<metric>`` and :func:`calibrated_metrics` where there is a
    validation split, and :func:`posthoc_metrics` (``ood_scores``, ``conformal_alpha`` as there).

    Returns:
        A flat ``{key: float}``.

    Raises:
        ValueError, KeyError, TypeError: as :func:`calibrated_metrics` and
            :func:`posthoc_metrics` raise.
    """
    _check_calibrators(calibrators)
    _check_outputs(outputs)
    results = {}
    if "val" in outputs:
        values = ensemble_metrics(outputs["val"].softmax(dim=-1), outputs["val_labels"], num_bins)
        results.update({f"val/{k}": v for k, v in values.items()})
        results.update(calibrated_metrics(outputs, calibrators, num_bins))
    results.update(posthoc_metrics(outputs, ood_scores=ood_scores, conformal_alpha=conformal_alpha))
    return results
