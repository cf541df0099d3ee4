"""Each plot writes a PNG a person can look at; the reliability bins reproduce the ECE."""

import sys
import warnings
from pathlib import Path

import pytest
import torch

import snens
from snens import metrics
from snens.evaluation.plots import (
    allocation_heatmap,
    curve_styles,
    ood_histograms,
    pareto_plot,
    reliability_bins,
    reliability_diagram,
    shift_plot,
)

image = pytest.importorskip("matplotlib.image")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    pixels = torch.from_numpy(image.imread(path))  # (H, W, 4) floats in [0, 1]
    colours = torch.unique(pixels.reshape(-1, pixels.shape[-1]), dim=0)
    assert len(colours) > 10  # not a blank canvas


@pytest.fixture
def predictions():
    g = torch.Generator().manual_seed(0)
    member_logits = 2 * torch.randn(3, 400, 10, generator=g)
    labels = torch.randint(0, 10, (400,), generator=g)
    labels[:250] = member_logits.mean(0)[:250].argmax(-1)  # better than chance
    return member_logits.softmax(-1), labels


def _flat_result(accuracy: float, ece: float) -> dict[str, float]:
    result = {"test/accuracy": accuracy, "test/ece": ece}
    for s in range(1, 6):
        for name, spread in (("gaussian_noise", 0.02), ("contrast", -0.02)):
            result[f"shift/{name}/{s}/accuracy"] = accuracy - 0.1 * s + spread
            result[f"shift/{name}/{s}/ece"] = ece + 0.02 * s + spread / 2
        result[f"shift/severity/{s}/accuracy"] = accuracy - 0.1 * s
        result[f"shift/severity/{s}/ece"] = ece + 0.02 * s
    return result


def test_reliability_bins_reproduce_the_ece(predictions):
    member_probs, labels = predictions
    probs = member_probs.mean(0)
    bins = reliability_bins(probs, labels, num_bins=15)
    count = bins["count"]
    filled = count > 0
    gap = (bins["accuracy"] - bins["confidence"]).abs()[filled]
    ece = (count[filled] / count.sum() * gap).sum().item()
    assert ece == pytest.approx(metrics.ece(probs, labels, num_bins=15), abs=1e-12)
    assert count.sum() == 400
    assert bins["accuracy"][~filled].isnan().all()


def test_reliability_diagram(tmp_path, predictions):
    member_probs, labels = predictions
    path = reliability_diagram(member_probs, labels, tmp_path / "sub" / "reliability.png")
    assert path == tmp_path / "sub" / "reliability.png"
    _assert_png(path)


def test_shift_plot(tmp_path):
    results = {"σN-Ens": _flat_result(0.9, 0.02), "single": _flat_result(0.88, 0.05)}
    _assert_png(shift_plot(results, tmp_path / "shift.png"))
    _assert_png(shift_plot(results, tmp_path / "shift_acc.png", metric="accuracy"))


def test_a_shift_plot_of_many_long_named_methods_keeps_its_axes(tmp_path):
    # one legend per panel of 19 long names squeezed the axes to nothing (matplotlib warned
    # "axes sizes collapsed to zero"); the one legend below the panels leaves them their room
    results = {
        f"snens, τ={i}, λ=0.01, method.diversity_ramp_epochs=0.0, method.input_policy=repeat, "
        f"method.gamma_lr_multiplier=30.0, optim.epochs=10": _flat_result(0.9 - 0.01 * i, 0.02)
        for i in range(19)
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _assert_png(shift_plot(results, tmp_path / "shift.png"))


def test_shift_plot_needs_shift_results(tmp_path):
    with pytest.raises(ValueError, match="'single' has no 'shift/severity"):
        shift_plot({"single": {"test/accuracy": 0.9, "test/ece": 0.1}}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="non-empty"):
        shift_plot({}, tmp_path / "x.png")


def test_ood_histograms(tmp_path, predictions):
    member_probs, _ = predictions
    in_scores = metrics.OOD_SCORES["msp"](member_probs)
    out_scores = in_scores + 0.2
    _assert_png(ood_histograms(in_scores, out_scores, tmp_path / "ood.png", "msp"))
    several = {"mnist": out_scores, "noise": in_scores.flip(0)}
    _assert_png(ood_histograms(in_scores, several, tmp_path / "ood2.png", "msp"))
    with pytest.raises(ValueError, match="empty"):
        ood_histograms(in_scores, torch.empty(0), tmp_path / "bad.png", "msp")


def test_allocation_heatmap_of_a_converted_model(tmp_path, resnet):
    ens = snens.convert(resnet, num_members=4, generator=torch.Generator().manual_seed(0))
    _assert_png(allocation_heatmap(ens, tmp_path / "allocation.png", max_features=8))
    _assert_png(
        allocation_heatmap(snens.allocation(ens), tmp_path / "allocation2.png", title="seed 0")
    )
    with pytest.raises(ValueError, match="max_features"):
        allocation_heatmap(ens, tmp_path / "bad.png", max_features=0)
    with pytest.raises(ValueError, match="no member norm"):
        allocation_heatmap(resnet, tmp_path / "bad.png")


def test_pareto_plot(tmp_path):
    rows = [
        {"method": "σN-Ens", "nll": 0.30, "accuracy": 0.90, "tau": 0.05},
        {"method": "σN-Ens", "nll": 0.25, "accuracy": 0.91, "tau": 0.5},
        {"method": "single", "nll": 0.35, "accuracy": 0.89, "tau": "-"},
        {"method": "deep ensemble", "nll": 0.22, "accuracy": 0.92, "tau": "-"},
    ]
    _assert_png(pareto_plot(rows, tmp_path / "pareto.png", annotate="tau"))
    with pytest.raises(ValueError, match=r"row 0 lacks \['ece'\]"):
        pareto_plot(rows, tmp_path / "bad.png", x="ece")


def _errorbars(monkeypatch):
    """The figures the plots write, by file name, and a function listing an axis's error
    bars as (x half-lengths, y half-lengths), the empty ones (no bar) left out."""
    from matplotlib.container import ErrorbarContainer

    from snens.evaluation import plots

    figures, save = {}, plots._save

    def keep(figure, path):
        figures[Path(path).name] = figure
        return save(figure, path)

    def half_lengths(ax, axis):
        lengths = []
        for bars in (c for c in ax.containers if isinstance(c, ErrorbarContainer)):
            for collection in bars.lines[2]:
                for seg in collection.get_segments():
                    if len(seg) and seg[0, 1 - axis] == seg[1, 1 - axis]:  # along this axis
                        lengths.append(round(float(seg[1, axis] - seg[0, axis]) / 2, 9))
        return sorted(lengths)

    monkeypatch.setattr(plots, "_save", keep)
    return figures, half_lengths


def test_pareto_plot_draws_the_given_std_as_error_bars(tmp_path, monkeypatch):
    figures, half_lengths = _errorbars(monkeypatch)
    rows = [
        {"method": "σN-Ens", "nll": 0.30, "accuracy": 0.90, "nll std": 0.02, "acc std": 0.01},
        {"method": "σN-Ens", "nll": 0.25, "accuracy": 0.91, "nll std": None, "acc std": 0.005},
        {"method": "single", "nll": 0.35, "accuracy": 0.89},  # one run: no std, no bar
    ]
    path = pareto_plot(rows, tmp_path / "pareto.png", x_err="nll std", y_err="acc std")
    _assert_png(path)
    (ax,) = figures["pareto.png"].axes
    assert half_lengths(ax, 0) == [0.02]
    assert half_lengths(ax, 1) == [0.005, 0.01]
    assert "bars: ± std over seeds" in ax.get_title()
    pareto_plot(rows, tmp_path / "plain.png")
    (ax,) = figures["plain.png"].axes
    assert half_lengths(ax, 0) == half_lengths(ax, 1) == []
    assert "bars" not in ax.get_title()


def test_shift_plot_draws_the_given_std_as_error_bars(tmp_path, monkeypatch):
    figures, half_lengths = _errorbars(monkeypatch)
    results = {"σN-Ens": _flat_result(0.9, 0.02), "single": _flat_result(0.88, 0.05)}
    std = {"σN-Ens": {"test/accuracy": 0.01, "shift/severity/3/accuracy": 0.03}}
    _assert_png(shift_plot(results, tmp_path / "shift.png", metric="ece", std=std))
    accuracy, ece = figures["shift.png"].axes[:2]
    assert half_lengths(accuracy, 1) == [0.01, 0.03]
    assert half_lengths(ece, 1) == []
    assert "bars: ± std over seeds" in accuracy.get_title()
    assert "bars" not in ece.get_title()


def test_pareto_front():
    from snens.evaluation.plots import _pareto_front

    points = [(0.3, 0.90), (0.25, 0.91), (0.35, 0.89), (0.22, 0.92), (0.2, 0.80)]
    assert _pareto_front(points, lower_x=True, higher_y=True) == [(0.2, 0.80), (0.22, 0.92)]


def test_missing_matplotlib_says_how_to_install(tmp_path, predictions, monkeypatch):
    member_probs, labels = predictions
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r"pip install snens\[plot\]"):
        reliability_diagram(member_probs, labels, tmp_path / "r.png")


def test_curve_styles_tell_thirty_curves_apart():
    styles = curve_styles(31, markers=True)
    assert styles[0] == {"color": "C0", "linestyle": "-", "marker": "o"}
    assert styles[13] == {"color": "C3", "linestyle": "--", "marker": "s"}
    assert styles[29] == {"color": "C9", "linestyle": ":", "marker": "^"}
    assert styles[30] == styles[0]  # the 31st repeats the first
    assert len({tuple(s.items()) for s in styles[:30]}) == 30
    assert curve_styles(2) == [{"color": "C0", "linestyle": "-"}, {"color": "C1", "linestyle": "-"}]
