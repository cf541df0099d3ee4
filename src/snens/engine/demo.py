"""``snens demo``: σN-Ens against a single model, a deep ensemble and Packed-Ensembles.

On the bundled Fashion-MNIST (MNIST-5k as the OOD set) the demo sweeps the preset
``fashion_mnist_small_cnn`` (ordinary run directories under ``OUT/runs``), by default on
2,000 images without augmentation, where one model overfits (``--full``: all images, crop and
flip): a single SmallCNN, a deep ensemble, Packed-Ensembles (α=2, γ=2) and σN-Ens at the
default τ (also with ``split`` inputs). Every run is evaluated at its best epoch on a validation
split held out of the training images (deep-ensemble members each at its own) and again after
temperature scaling fitted there; each σN-Ens run is compared with every baseline by paired
bootstrap intervals. It writes ``report.md`` (the table, the comparisons and the budget it ran),
``results.json`` and the figures (with matplotlib). Running it again resumes.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from snens import files
from snens.baselines import METHOD_RECORDS
from snens.engine.runs import read_final, read_metrics
from snens.method.regularizer import DEFAULT_DIVERSITY_WEIGHT, DEFAULT_TEMPERATURE

__all__ = ["FULL_DEMO", "DemoConfig", "run"]

EVAL_BATCH = 250  # images per forward pass when scoring


@dataclass(frozen=True)
class DemoConfig:
    """Settings of ``snens demo``: by default few images and no augmentation, so that one
    model overfits within a demo's budget; :data:`FULL_DEMO` uses all of them."""

    train_examples: int = 2_000  # Fashion-MNIST training images used (of 60,000)
    # the last N training images, held out: each run's epoch is selected on them (NLL) and its
    # temperature fitted there
    validation_examples: int = 5_000
    test_examples: int = 10_000  # Fashion-MNIST test images (of 10,000)
    epochs: int = 20
    batch_size: int = 128  # examples per step, every member sees all of them
    lr: float = 3e-3  # AdamW base learning rate; gamma gets 30x
    width: int = 32  # SmallCNN first-stage channels
    augment: tuple[str, ...] = ()  # training augmentation: "crop", "flip"
    num_members: int = 4
    # σN-Ens is trained at each τ (the default τ is the row users get)
    temperatures: tuple[float, ...] = (DEFAULT_TEMPERATURE,)
    # also σN-Ens at the default τ with split inputs: about one model's training compute
    split: bool = True
    diversity_weight: float = DEFAULT_DIVERSITY_WEIGHT  # λ, on the sum over features
    corruptions: tuple[str, ...] = ("gaussian_noise", "defocus_blur", "contrast", "pixelate")
    corruption_examples: int = 1000  # first N test images corrupted at each severity 1..5
    seed: int = 0


FULL_DEMO = DemoConfig(
    train_examples=55_000,
    epochs=10,
    augment=("crop", "flip"),
    temperatures=(0.5, DEFAULT_TEMPERATURE, 5.0),
    corruptions=(),  # all 15
    corruption_examples=10_000,
)

_LABELS = {"single": "single", "deep_ensemble": "deep ensemble", "packed": "Packed-Ensembles"}
#: How a verdict names each baseline, by its label.
_AGAINST = {
    "single": "the single model",
    "deep ensemble": "the deep ensemble",
    "Packed-Ensembles": "Packed-Ensembles",
}


def _overrides(config: DemoConfig) -> list[str]:
    """The demo's settings as ``--set`` values over the preset ``fashion_mnist_small_cnn``."""
    return [
        f"seed={config.seed}",
        f"data.train_examples={config.train_examples}",
        f"data.validation_examples={config.validation_examples}",
        f'optim.select="{"nll" if config.validation_examples else ""}"',
        f"data.test_examples={config.test_examples}",
        f"data.batch_size={config.batch_size}",
        f"data.augment={json.dumps(list(config.augment))}",
        f"data.eval_batch_size={EVAL_BATCH}",
        f"data.corruption_names={json.dumps(list(config.corruptions))}",
        f"data.corruption_examples={config.corruption_examples}",
        f"optim.epochs={config.epochs}",
        f"optim.lr={config.lr}",
        f"model.options={{width={config.width}}}",
        f"method.num_members={config.num_members}",
        f"method.diversity_weight={config.diversity_weight}",
    ]


def _grid(config: DemoConfig) -> list[str]:
    taus = ",".join(repr(float(t)) for t in config.temperatures)
    return ["method.name=single,deep_ensemble,packed,snens", f"method.temperature={taus}"]


def _split_run(config: DemoConfig) -> list[str]:
    """The grid of the σN-Ens run on split inputs, at the default τ."""
    if not config.split:
        return []
    tau = repr(float(DEFAULT_TEMPERATURE))
    return ["method.name=snens", f"method.temperature={tau}", "method.input_policy=split"]


def _label(run_config) -> str:
    method = run_config.method
    if method.name in _LABELS:
        return _LABELS[method.name]
    label = f"σN-Ens τ={method.temperature:g}"
    if method.input_policy == "split":
        return label + ", split"
    default = (
        method.temperature == DEFAULT_TEMPERATURE
        and method.diversity_weight == DEFAULT_DIVERSITY_WEIGHT
    )
    return label + (" (default)" if default else "")


def run(
    *, full: bool = False, out: str | os.PathLike = "runs/demo", config: DemoConfig | None = None
) -> int:
    """Train the demo's runs, print their table and write the report, figures and runs to
    ``out``; ``full`` uses :data:`FULL_DEMO`, ``config`` other settings (overriding ``full``).

    Returns:
        0 (the process exit code), 1 when a run failed (named on stderr).
    """
    import sys

    import snens
    from snens.engine.presets import preset
    from snens.engine.reload import load_run_model
    from snens.engine.sweep import plan, run_sweep

    config = config or (FULL_DEMO if full else DemoConfig())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    base = preset("fashion_mnist_small_cnn")
    runs = plan(base, _grid(config), out_dir / "runs", _overrides(config))
    if config.split:
        runs += plan(base, _split_run(config), out_dir / "runs", _overrides(config))
    from snens.data import CORRUPTIONS

    names = config.corruptions or CORRUPTIONS
    print(
        f"snens demo: Fashion-MNIST ({config.train_examples:,} train, "
        f"{config.test_examples:,} test), MNIST-5k as OOD, {len(names)} corruptions × 5 "
        f"severities of {config.corruption_examples:,} test images, M={config.num_members}, "
        f"{config.epochs} epochs per run, {len(runs)} runs in {out_dir / 'runs'}"
    )
    keys = ("method.name", "method.temperature", "method.input_policy")
    result = run_sweep(runs, out_dir / "runs", keys=keys)
    if result.failed:
        for name, error in result.failed.items():
            print(f"snens demo: run {name} failed: {error}", file=sys.stderr)
        return 1

    rows, results, nets, steps, paths, selections = [], {}, {}, 0, {}, {}
    for sweep_run in runs:
        label, path = _label(sweep_run.config), sweep_run.path()
        paths[label] = path
        final = read_final(path)
        selections[label] = {sweep_run.config.seed: final.get("selection")}
        steps = max(steps, final["train"]["steps"])  # every method takes the same steps
        report = final["metrics"]
        net = load_run_model(path)[0].eval()  # with the weights it was evaluated with
        method = sweep_run.config.method
        tau = method.temperature if METHOD_RECORDS[method.name].regularized else None
        results[label] = report
        nets[label] = (net, sweep_run.config)
        rows.append(
            {
                "method": label,
                "tau": tau,
                "params": final["model"]["params"],
                "accuracy": report["test/accuracy"],
                "nll": report["test/nll"],
                "ece": report["test/ece"],
                "nll_ts": report.get("test_ts/nll"),
                "ece_ts": report.get("test_ts/ece"),
                "epoch": _selected(final),
                "brier": report["test/brier"],
                "ood_auroc": report["ood/mnist_5k/auroc"],
                "ood_auroc_energy": report.get("ood/mnist_5k/energy/auroc"),
                "corrupted_accuracy": report["shift/mean/accuracy"],
                "corrupted_ece": report["shift/mean/ece"],
                "disagreement": report.get("test/disagreement", 0.0),
                "effective_members": snens.mean_effective_members(net) if tau else None,
                "k_star": snens.optimal_k(tau, config.num_members) if tau else None,
                "train_seconds": final["train"]["seconds"],
                "train_loss": read_metrics(path)[-1]["task_loss"],
            }
        )

    table, reference = _markdown(rows), _reference(config, steps, rows)
    said = (_verdict(paths), _chosen(selections), _load_note())
    verdict = "\n".join(line for line in said if line)
    figures = _plots(out_dir, rows, results, nets)
    seconds = time.perf_counter() - start
    print("\n" + table + "\n\n" + verdict + "\n\n" + reference)
    report_md = ["# snens demo", "", table, "", verdict, "", _provenance(config, seconds), ""]
    report_md += [reference, ""]
    if figures:
        report_md += [f"![{path.stem}]({path.name})" for path in figures] + [""]
    else:
        report_md += ["(plots skipped: matplotlib is missing; `pip install snens[plot]`)", ""]
    saved = {"config": asdict(config), "rows": rows, "metrics": results}
    texts = {"report.md": "\n".join(report_md), "results.json": json.dumps(saved, indent=2)}
    for name, text in texts.items():
        files.write_text(out_dir / name, text, mode=files.plain_mode(out_dir / name))
    print(f"\nwrote {out_dir / 'report.md'}, results.json and {len(figures)} figures")
    print(f"{seconds:.0f} s in all")
    return 0


#: The comparisons of each σN-Ens run with each baseline: test NLL and ECE, raw and after
#: temperature scaling (where the runs kept a validation split to fit it on).
VERDICT = (("test", "nll"), ("test_ts", "nll"), ("test", "ece"), ("test_ts", "ece"))


def _chosen(selections: dict[str, dict[int, Any]]) -> str:
    """The line naming the run of lowest validation NLL at its selected epoch, as
    ``snens report`` chooses (the test set unread), and the runs it could not rank."""
    from snens.engine.selection import SELECT_NAMES, choose_on_validation

    labels = list(selections)
    choice = choose_on_validation([selections[label] for label in labels])
    if choice.index is None or choice.metric is None:
        return ""
    line = (
        f"Chosen on validation: {labels[choice.index]} (validation {SELECT_NAMES[choice.metric]} "
        f"{choice.values[choice.index]:.4f} at its selected epoch, the lowest; the test set "
        "played no part)"
    )
    out = [f"{label} ({why})" for label, why in zip(labels, choice.left_out) if why]
    return line + (f"; not ranked: {'; '.join(out)}" if out else "")


def _verdict(paths: dict[str, Path]) -> str:
    """One line per σN-Ens run and baseline: σN-Ens − the baseline on :data:`VERDICT`, each
    with its paired bootstrap 95 % interval and the word it supports."""
    from snens.engine.compare import compare_arrays, describe
    from snens.engine.runs import read_examples

    kept = {label: read_examples(path) for label, path in paths.items()}  # each run read once
    lines = []
    for label, mine in kept.items():
        if not label.startswith("σN-Ens"):
            continue
        sets = tuple(s for s in dict.fromkeys(s for s, _ in VERDICT) if f"{s}/nll" in mine)
        for name, against in _AGAINST.items():
            if name not in kept:
                continue
            found = compare_arrays([mine], [kept[name]], sets=sets, metrics=("nll", "ece"))
            by = {(c.set, c.metric): c for c in found}
            said = [describe(by[k], label, against) for k in VERDICT if k in by]
            # the subject once: "σN-Ens … beats X on test nll (…); is level with X on …"
            said[1:] = [clause.removeprefix(label + " ") for clause in said[1:]]
            lines.append("Verdict: " + "; ".join(said))
    return "\n".join(lines)


def _load_note() -> str:
    """A line saying the training times were taken under load, where the 5-minute load
    average exceeds the cores."""
    try:
        load = os.getloadavg()[1]
    except (AttributeError, OSError):
        return ""
    cores = os.cpu_count() or 1
    if load <= cores:
        return ""
    return (
        f"The train s column was measured under load (5-minute load average {load:.1f} on "
        f"{cores} cores): a run that trained while other work ran took longer than it would "
        "alone, so compare the times with care."
    )


def _plots(out_dir: Path, rows, results, nets) -> list[Path]:
    """Every figure of the report; none when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return []
    import dataclasses

    from snens.engine.datasets import build_data
    from snens.engine.fit import predict
    from snens.evaluation import plots

    # every run scores the same test set: build it once, without OOD and corrupted sets
    first = next(iter(nets.values()))[1]
    test = build_data(
        dataclasses.replace(first.data, ood=(), corruptions=False), seed=first.seed
    ).test

    figures = [
        plots.pareto_plot(rows, out_dir / "pareto_nll.png", x="nll", y="accuracy"),
        plots.pareto_plot(rows, out_dir / "pareto_ece.png", x="ece", y="accuracy"),
        plots.shift_plot(results, out_dir / "corruption_severity.png", metric="ece"),
    ]
    for i, (label, (net, _)) in enumerate(nets.items()):
        probs, labels = predict(net, test)
        figures.append(
            plots.reliability_diagram(
                probs, labels, out_dir / f"reliability_{i}_{_slug(label)}.png", title=label
            )
        )
    for row in rows:
        if row["tau"] is not None:
            path = out_dir / f"allocation_{_slug(row['method'])}.png"
            figures.append(plots.allocation_heatmap(nets[row["method"]][0], path))
    return figures


def _slug(label: str) -> str:
    label = label.replace("σN-Ens", "snens").replace("τ=", "tau")
    slug = "".join(c if c.isascii() and (c.isalnum() or c in ".-") else "_" for c in label)
    return "_".join(part for part in slug.split("_") if part)


def _selected(final: dict) -> str:
    """The epoch the run was evaluated at: the selected one, each member's for a deep ensemble
    trained apart, or the last."""
    selection = final.get("selection") or {}
    if "member_epochs" in selection:
        return "/".join(str(e) for e in selection["member_epochs"])
    return str(selection.get("epoch", final["train"]["epochs"]))


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _markdown(rows: list[dict]) -> str:
    header = (
        "| method | params | epoch | acc | NLL | ECE | NLL +TS | ECE +TS | Brier "
        "| OOD AUROC (MSP) | OOD AUROC (energy) | corrupted acc | corrupted ECE | disagreement "
        "| effective members | k*(τ) | train s |"
    )
    lines = [header, "|" + "---|" * 17]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['params']:,} | {r['epoch']} | {r['accuracy']:.4f} "
            f"| {r['nll']:.4f} | {r['ece']:.4f} | {_fmt(r['nll_ts'], '.4f')} "
            f"| {_fmt(r['ece_ts'], '.4f')} | {r['brier']:.4f} | {r['ood_auroc']:.4f} "
            f"| {_fmt(r['ood_auroc_energy'], '.4f')} "
            f"| {r['corrupted_accuracy']:.4f} | {r['corrupted_ece']:.4f} "
            f"| {r['disagreement']:.4f} | {_fmt(r['effective_members'], '.2f')} "
            f"| {_fmt(r['k_star'], '.2f')} | {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines)


def _provenance(config: DemoConfig, seconds: float) -> str:
    import torch

    selection = (
        f"each run at its best validation epoch by NLL ({config.validation_examples:,} held-out "
        "training images; deep-ensemble members each at its own), +TS: temperature fitted there"
        if config.validation_examples
        else "each run at its last epoch"
    )
    return (
        f"seed {config.seed}; {config.train_examples:,} training images "
        f"({', '.join(config.augment) or 'no augmentation'}), {config.epochs} epochs, "
        f"{selection}, "
        f"SmallCNN width {config.width}, M={config.num_members}, λ={config.diversity_weight}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; "
        f"{seconds:.0f} s in all; {time.strftime('%Y-%m-%d %H:%M')}"
    )


#: One model overfits where its test NLL is this many times its last epoch's training loss.
OVERFIT_RATIO = 3.0


def _reference(config: DemoConfig, steps: int, rows: list[dict]) -> str:
    """The budget the demo ran, whether its single model overfit, and where the studies are."""
    augment = " and ".join(config.augment) if config.augment else "no augmentation"
    single = next((r for r in rows if r["method"] == _LABELS["single"]), None)
    fit = ""
    if single is not None:
        ratio = single["nll"] / max(single["train_loss"], 1e-12)
        fit = (
            f"The single model ends with a training loss of {single['train_loss']:.3f} and a "
            f"test NLL of {single['nll']:.3f} at the epoch it is evaluated at: "
            + (
                "it overfits, the regime where σN-Ens pays (one seed here). "
                if ratio >= OVERFIT_RATIO
                else "it does not overfit, a regime where σN-Ens has little to gain. "
            )
        )
    lines = [
        "## This budget",
        "",
        f"This demo trained every run on {config.train_examples:,} images for {config.epochs} "
        f"epoch{'s' * (config.epochs != 1)} ({steps:,} steps, SmallCNN width {config.width}, "
        f"{augment}). " + fit + "The project's README compares σN-Ens with one model and a "
        "deep ensemble in both regimes and on backbones no study tuned, every method at its "
        "best validation epoch, with paired bootstrap intervals over seeds and test examples; "
        "its recipes page gives the recipe chosen on validation in each situation.",
    ]
    return "\n".join(lines)
