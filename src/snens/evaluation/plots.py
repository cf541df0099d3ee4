"""Figures of the evaluation, written as PNG files: reliability diagram, metrics under shift,
OOD score histograms, the σN-Ens importance allocation, and accuracy–NLL Pareto plots.

matplotlib is optional (``pip install snens[plot]``; without it each figure raises ImportError).
Figures are drawn on the Agg canvas without pyplot (no window, no backend change); each function
writes the PNG file ``path`` (parent folders created) and returns it as a ``pathlib.Path``.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from snens import files, metrics
from snens.method.allocation import LayerAllocation, allocation
from snens.metrics.predictive import inner_edges

__all__ = [
    "allocation_heatmap",
    "curve_styles",
    "ood_histograms",
    "pareto_plot",
    "reliability_bins",
    "reliability_diagram",
    "shift_plot",
]

_DPI = 120
_SEVERITIES = range(1, 6)
_HEATMAP = dict(aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=1.0)
_GAP_BARS = dict(color="#DD4444", alpha=0.45, edgecolor="#AA0000", linewidth=0.5, hatch="//")


def curve_styles(n: int, markers: bool = False) -> list[dict[str, str]]:
    """``Axes.plot`` keyword dicts telling ``n`` curves apart: the ten default colours solid, then
    dashed, then dotted; with ``markers``, ``o``, ``s``, ``^`` likewise."""
    out = []
    for i in range(n):
        kind = i // 10 % 3
        style = {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[kind]}
        if markers:
            style["marker"] = ("o", "s", "^")[kind]
        out.append(style)
    return out


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "snens.evaluation.plots needs matplotlib: `pip install matplotlib` or "
            "`pip install snens[plot]`"
        ) from error
    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()
    figure.savefig(image, format="png")
    # atomic, never through a link at the name
    return files.write_bytes(path, image.getvalue(), mode=files.plain_mode(path))


def _as_tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach().cpu()
    try:
        return torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{name} must be a tensor or array, got {type(x).__name__}") from error


def _ensemble_mean(probs: Any) -> Tensor:
    p = _as_tensor(probs, "probs")
    return p.mean(0) if p.dim() == 3 else p  # (M, B, K) -> (B, K)


def reliability_bins(probs: Any, labels: Any, *, num_bins: int = 15) -> dict[str, Tensor]:
    """The count, accuracy and mean confidence of ``probs`` (B, K) (member probabilities
    (M, B, K) are averaged) against ``labels`` (B,) in each bin of :func:`snens.metrics.ece`.

    Returns:
        ``{"count", "accuracy", "confidence"}``, (num_bins,) each; NaN in empty bins.

    Raises:
        ValueError, TypeError: as :func:`snens.metrics.ece`.
    """
    p = _ensemble_mean(probs)
    metrics.ece(p, labels, num_bins=num_bins)  # validates probs, labels and num_bins
    p = p.double()
    y = _as_tensor(labels, "labels").long().to(p.device)
    confidence, prediction = p.max(-1)
    bins = torch.bucketize(confidence, inner_edges(num_bins), right=False)
    count = torch.bincount(bins, minlength=num_bins).double()
    hits = torch.bincount(bins, weights=(prediction == y).double(), minlength=num_bins)
    conf = torch.bincount(bins, weights=confidence, minlength=num_bins)
    return {"count": count, "accuracy": hits / count, "confidence": conf / count}


def reliability_diagram(
    probs: Any, labels: Any, path: str | os.PathLike, num_bins: int = 15, title: str | None = None
) -> Path:
    """Accuracy against confidence per equal-width bin, the gap to the diagonal, and the ECE,
    above the fraction of examples per bin; ``probs``, ``labels`` and ``num_bins`` as
    :func:`reliability_bins`, ``title`` before the ECE (default "Reliability").

    Raises:
        ValueError, TypeError: as :func:`snens.metrics.ece`.
    """
    p = _ensemble_mean(probs)
    ece = metrics.ece(p, labels, num_bins=num_bins)
    acc = metrics.accuracy(p, labels)
    bins = reliability_bins(p, labels, num_bins=num_bins)
    count, accuracy, confidence = (bins[k].numpy() for k in ("count", "accuracy", "confidence"))
    filled = count > 0
    width = 1 / num_bins
    centers = (torch.arange(num_bins, dtype=torch.float64).numpy() + 0.5) * width

    figure = _figure(5.0, 6.0)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    x, y = centers[filled], accuracy[filled]
    top.bar(x, y, width=width, color="#4C72B0", edgecolor="black", linewidth=0.5, label="accuracy")
    gap = confidence[filled] - y
    top.bar(x, gap, bottom=y, width=width, label="gap: confidence − accuracy", **_GAP_BARS)
    top.plot([0, 1], [0, 1], "--", color="gray", linewidth=1, label="perfect calibration")
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
    top.set_title(
        f"{title or 'Reliability'}\nECE {ece:.4f} ({num_bins} bins), accuracy {acc:.4f}, "
        f"N = {int(count.sum())}",
        fontsize=10,
    )
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(centers, count / count.sum(), width=width, color="gray", edgecolor="black")
    bottom.set(xlim=(0, 1), xlabel="confidence (max probability)", ylabel="fraction")
    return _save(figure, path)


def _severity_curve(
    result: Mapping[str, float], metric: str, method: str
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Severities, the mean metric, and its min and max over corruption names."""
    clean = result.get(f"test/{metric}")
    points = [] if clean is None else [(0, clean, clean, clean)]
    for s in _SEVERITIES:
        key = f"shift/severity/{s}/{metric}"
        if key not in result:
            continue
        per_name = [
            v
            for k, v in result.items()
            if k.startswith("shift/")
            and k.endswith(f"/{s}/{metric}")
            and k.count("/") == 3
            and not k.startswith("shift/severity/")
        ]
        value = result[key]
        points.append((s, value, min(per_name, default=value), max(per_name, default=value)))
    if not points or points[-1][0] == 0:
        raise ValueError(
            f"method {method!r} has no 'shift/severity/<s>/{metric}' keys; pass the dict "
            "snens.evaluate(..., corruptions=...) returned"
        )
    severities, mean, low, high = (list(column) for column in zip(*points))
    return severities, mean, low, high


def shift_plot(
    results: Mapping[str, Mapping[str, float]],
    path: str | os.PathLike,
    metric: str = "ece",
    *,
    std: Mapping[str, Mapping[str, float]] | None = None,
) -> Path:
    """Accuracy and ``metric`` (of :data:`~snens.evaluation.protocol.SHIFT_METRICS`) against
    corruption severity, 0 (clean) to 5, one line per method of ``results``
    (``{method: snens.evaluate(..., corruptions=...) dict}``): the mean over corruption names in a
    band from their min to max; ``std`` (``{method: {key: standard deviation}}``) draws error bars
    where finite.

    Raises:
        ValueError: no methods, or a method without shift results for a panel's metric.
    """
    if not isinstance(results, Mapping) or not results:
        raise ValueError("results must be a non-empty mapping {method: snens.evaluate(...) dict}")
    panels = list(dict.fromkeys(("accuracy", metric)))
    curves = {
        panel: {method: _severity_curve(r, panel, method) for method, r in results.items()}
        for panel in panels
    }
    columns = 1 if len(results) <= 4 else 2
    rows = -(-len(results) // columns)
    figure = _figure(5.0 * len(panels), 4.0 + 0.2 * rows)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    styles = curve_styles(len(results), markers=True)
    for ax, panel in zip(axes, panels):
        bars = False
        for style, (method, (sev, mean, low, high)) in zip(styles, curves[panel].items()):
            ax.plot(sev, mean, label=method, **style)
            ax.fill_between(sev, low, high, color=style["color"], alpha=0.15, linewidth=0)
            spread = (std or {}).get(method, {})
            keys = [f"test/{panel}" if s == 0 else f"shift/severity/{s}/{panel}" for s in sev]
            errors = [float(spread.get(k, math.nan)) for k in keys]
            if any(math.isfinite(e) for e in errors):
                ax.errorbar(sev, mean, yerr=errors, fmt="none", ecolor=style["color"], capsize=3)
                bars = True
        ax.set_xticks(range(0, 6), ["clean", "1", "2", "3", "4", "5"])
        ax.set(xlabel="corruption severity", ylabel=panel.replace("_", " "))
        bars_note = "\n(bars: ± std over seeds)" if bars else ""
        ax.set_title(
            f"{panel.replace('_', ' ')} under shift\n(band: min–max over corruptions){bars_note}"
        )
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=columns, fontsize=7)
    return _save(figure, path)


def ood_histograms(
    in_scores: Any, out_scores: Any, path: str | os.PathLike, score_name: str
) -> Path:
    """Overlaid density histograms of an OOD score (``score_name``, higher = more likely OOD) on
    in-distribution data, ``in_scores`` (N_in,), and OOD data, ``out_scores`` (N_out,) or
    ``{name: scores}`` of several, each OOD set's AUROC in the legend.

    Raises:
        ValueError, TypeError: as :func:`snens.metrics.auroc`.
    """
    out_sets = dict(out_scores) if isinstance(out_scores, Mapping) else {"OOD": out_scores}
    if not out_sets:
        raise ValueError("out_scores is an empty mapping; pass at least one OOD set's scores")
    aurocs = {name: metrics.auroc(in_scores, s) for name, s in out_sets.items()}
    s_in = _as_tensor(in_scores, "in_scores").double()
    s_out = {name: _as_tensor(s, name).double() for name, s in out_sets.items()}
    everything = torch.cat([s_in, *s_out.values()])
    low, high = everything.min().item(), everything.max().item()
    if low == high:
        low, high = low - 0.5, high + 0.5
    edges = torch.linspace(low, high, 41).numpy()

    figure = _figure(6.0, 4.0)
    ax = figure.subplots()
    hists = [(s_in, 0.5, "#4C72B0", f"in-distribution (N = {s_in.numel()})")]
    for i, (name, scores) in enumerate(s_out.items()):
        label = f"{name} (N = {scores.numel()}), AUROC {aurocs[name]:.3f}"
        hists.append((scores, 0.45, f"C{(i + 1) % 10}", label))
    for scores, alpha, color, label in hists:
        ax.hist(scores.numpy(), bins=edges, density=True, alpha=alpha, color=color, label=label)
    ax.set(xlabel=f"{score_name} (higher = more likely OOD)", ylabel="density")
    ax.set_title(f"OOD detection by {score_name}")
    ax.legend(fontsize=8)
    return _save(figure, path)


def _by_owner(importances: Tensor, max_features: int) -> Tensor:
    """Feature order for display: grouped by owner (argmax member), strongest first; at most
    ``max_features``, taken evenly."""
    owner = importances.argmax(0)
    strength = importances.max(0).values
    # sort by owner, then by decreasing strength; owner dominates since strength is in (0, 1)
    order = torch.argsort(owner.double() * 2 - strength.double(), stable=True)
    if order.numel() > max_features:
        keep = torch.linspace(0, order.numel() - 1, max_features).round().long()
        order = order[keep]
    return order


def allocation_heatmap(
    model_or_allocation: nn.Module | Mapping[str, LayerAllocation],
    path: str | os.PathLike,
    max_features: int = 64,
    title: str | None = None,
) -> Path:
    """Importance σ(γ) of every feature (at most ``max_features`` per layer) for every member of a
    model or of ``snens.allocation(model)``, one heatmap row per member norm, features grouped by
    their owner; ``title`` says what the allocation is of.

    Raises:
        ValueError: no member norms, or ``max_features < 1``.
    """
    if isinstance(max_features, bool) or not isinstance(max_features, int) or max_features < 1:
        raise ValueError(f"max_features must be an int >= 1, got {max_features!r}")
    if isinstance(model_or_allocation, nn.Module):
        layers = allocation(model_or_allocation)
    elif isinstance(model_or_allocation, Mapping):
        layers = dict(model_or_allocation)
    else:
        raise TypeError(
            "allocation_heatmap takes a model or the dict from snens.allocation(model), got "
            f"{type(model_or_allocation).__name__}"
        )
    if not layers:
        raise ValueError("the allocation is empty: it holds no member norm layers")
    M = max(a.num_members for a in layers.values())
    row_height = 0.35 + 0.22 * M
    figure = _figure(8.0, 0.6 + row_height * len(layers))
    axes = figure.subplots(len(layers), 1, squeeze=False)[:, 0]
    image = None
    for ax, (name, layer) in zip(axes, layers.items()):
        s = layer.importances.float().reshape(layer.num_members, -1)  # (M, C)
        order = _by_owner(s, max_features)
        image = ax.imshow(s[:, order].numpy(), **_HEATMAP)
        shown = f"{order.numel()} of {s.shape[1]}" if order.numel() < s.shape[1] else s.shape[1]
        ax.set_title(
            f"{name or '(root)'}: {shown} features, "
            f"{layer.mean_effective_members:.2f} effective members of {layer.num_members}",
            fontsize=8,
            loc="left",
        )
        ax.set_yticks(range(layer.num_members))
        ax.set_ylabel("member", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel("feature (grouped by owner, strongest first)")
    figure.colorbar(image, ax=list(axes), label="importance σ(γ)", shrink=min(1.0, 6 / len(axes)))
    heading = "Importance allocation of members to features"
    figure.suptitle(f"{heading}: {title}" if title else heading, fontsize=10)
    return _save(figure, path)


def _pareto_front(
    points: list[tuple[float, float]], lower_x: bool, higher_y: bool
) -> list[tuple[float, float]]:
    """The points no other point beats on both axes, ordered by x."""
    sx, sy = (1 if lower_x else -1), (-1 if higher_y else 1)
    ranked = sorted(points, key=lambda p: (sx * p[0], sy * p[1]))  # best x first
    front, best_y = [], math.inf
    for x, y in ranked:
        if sy * y < best_y:
            front.append((x, y))
            best_y = sy * y
    return sorted(front)


_AXIS_LABELS = {
    "accuracy": "accuracy",
    "nll": "NLL (negative log-likelihood)",
    "ece": "ECE (15 bins)",
    "brier": "Brier score",
}


def axis_label(key: str) -> str:
    """``"test/nll"`` -> ``"test NLL (negative log-likelihood)"``; unknown keys as they are."""
    split, _, metric = key.rpartition("/")
    label = _AXIS_LABELS.get(metric, metric.replace("_", " "))
    prefix = {"test": "test", "val": "validation", "shift/mean": "corrupted"}.get(split, split)
    return f"{prefix} {label}".strip()


def pareto_plot(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    x: str = "nll",
    y: str = "accuracy",
    label: str = "method",
    *,
    annotate: str | None = None,
    annotate_with_key: bool = True,
    lower_x_is_better: bool = True,
    higher_y_is_better: bool = True,
    x_err: str | None = None,
    y_err: str | None = None,
) -> Path:
    """Scatter of metric ``y`` against metric ``x`` of ``rows`` (one mapping per run, e.g.
    ``{"method": "σN-Ens", "nll": 0.21, "accuracy": 0.93}``), one colour per ``label``, with the
    Pareto front (by ``lower_x_is_better``, ``higher_y_is_better``). ``annotate`` writes a key's
    value beside each point (as ``tau=0.5``, or alone without ``annotate_with_key``; empty: none);
    ``x_err``, ``y_err`` name the standard deviations drawn as bars where finite.

    Raises:
        ValueError: no rows, or a row missing a key (the keys it has are listed).
    """
    if not rows:
        raise ValueError("rows is empty; pass one mapping per run")
    needed = [x, y, label] + ([annotate] if annotate else [])
    for i, row in enumerate(rows):
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"row {i} lacks {missing}; it has keys {sorted(row)}")
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row[label]), []).append(row)

    figure = _figure(6.0, 4.5)
    ax = figure.subplots()
    bars = False
    for i, (name, group) in enumerate(groups.items()):
        xs, ys = [float(r[x]) for r in group], [float(r[y]) for r in group]
        color = f"C{i % 10}"
        ax.scatter(xs, ys, s=40, color=color, edgecolor="black", linewidth=0.5, label=name)
        errors = {"xerr": _errors(group, x_err), "yerr": _errors(group, y_err)}
        if any(math.isfinite(e) for e in errors["xerr"] + errors["yerr"]):
            style = {"fmt": "none", "ecolor": color, "elinewidth": 1, "capsize": 2, "zorder": 1}
            ax.errorbar(xs, ys, **errors, **style)
            bars = True
        for r, px, py in zip(group, xs, ys) if annotate else ():
            if r[annotate] != "":
                text = f"{annotate}={r[annotate]}" if annotate_with_key else str(r[annotate])
                ax.annotate(text, (px, py), textcoords="offset points", xytext=(4, 4), fontsize=7)
    points = [(float(r[x]), float(r[y])) for r in rows]
    front = _pareto_front(points, lower_x_is_better, higher_y_is_better)
    if len(front) > 1:
        fx, fy = zip(*front)
        ax.plot(fx, fy, "--", color="gray", linewidth=1, label="Pareto front", zorder=0)
    better = (
        f"{'←' if lower_x_is_better else '→'} {x} better, "
        f"{'↑' if higher_y_is_better else '↓'} {y} better"
    )
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y))
    bars_note = "; bars: ± std over seeds" if bars else ""
    ax.set_title(f"{axis_label(y)} vs {axis_label(x)}\n({better}{bars_note})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(figure, path)


def _errors(rows: Sequence[Mapping[str, Any]], key: str | None) -> list[float]:
    """Each row's value of ``key``; NaN (no bar) where a row lacks it or it is None."""
    if key is None:
        return [math.nan] * len(rows)
    return [math.nan if r.get(key) is None else float(r[key]) for r in rows]
