"""What every experiment script shares: data, one run as a flat row (trained and scored by the
engine, :func:`snens.engine.train.train`, like ``snens train``), CSV files, mean ± std tables,
figures and the provenance line.

The CPU scale, used by default everywhere: SmallCNN on the first 5 000 Fashion-MNIST training
images (crop + flip), 3 epochs of AdamW (lr 3e-3, cosine, batch 128; γ at 30× the learning rate),
scored on the full 10 000-image test set with MNIST-5k as the OOD set; corrupted sets are the
first 1 000 test images under a fixed corruption seed. σN-Ens uses τ = 1, λ = 0.1 (the library's
defaults) unless a script sweeps them.

Every run is also scored on a validation split disjoint from the training images: the LAST
5 000 of the 60 000 Fashion-MNIST training images (``val_accuracy``, ``val_nll``, ``val_ece``), so
that a hyperparameter such as τ can be chosen without looking at the test set. Training uses
the first N images, and N must leave the validation images out (N ≤ 55 000 by default).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

import snens
from snens import baselines
from snens.data import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    TensorLoader,
    load_fashion_mnist,
    load_mnist_5k,
)
from snens.engine import sweep
from snens.engine.config import RunConfig, load_config, to_dict
from snens.engine.presets import preset
from snens.engine.reload import load_run_model
from snens.engine.report import markdown_table, summarize
from snens.engine.runs import read_metrics
from snens.engine.train import train
from snens.evaluation.protocol import collect, ood_detection

NORM = {"mean": FASHION_MNIST_MEAN, "std": FASHION_MNIST_STD}
OOD_METRICS = ("auroc", "aupr", "fpr95")
VAL_METRICS = ("accuracy", "nll", "ece")
#: Batch of evaluation: 250 inputs (1 000 rows at M=4) ran σN-Ens 2.4× faster than 1 000 on
#: this CPU (3.5 s against 8.3 s for the 10k test set, width 16, 1 thread).
EVAL_BATCH = 250
#: Display names of the methods in tables and figures.
NAMES = {
    "single": "single",
    "deep_ensemble": "deep ensemble",
    "batch_ensemble": "BatchEnsemble",
    "packed": "Packed-Ensembles",
    "film": "FiLM-Ensemble",
    "mc_dropout": "MC-dropout",
    "snens": "σN-Ens",
}


# ------------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------------


def parser(doc: str, *, seeds=(0, 1, 2), width: int = 16, out: str) -> argparse.ArgumentParser:
    """The flags every script has, with the CPU scale as defaults; ``out`` names the results."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=list(seeds))
    p.add_argument("--train-examples", type=int, default=5_000, help="Fashion-MNIST train images")
    p.add_argument(
        "--val-examples",
        type=int,
        default=5_000,
        help="validation images: the last ones of the 60 000 training images (0: none)",
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--width", type=int, default=width, help="SmallCNN width w (w, 2w, 4w)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--test-examples", type=int, default=10_000, help="test images (of 10 000)")
    p.add_argument("--ood-examples", type=int, default=5_000, help="MNIST-5k images (of 5 000)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--out-dir", type=Path, default=Path("results"))
    p.add_argument("--name", default=out, help="file stem of the CSV, table and figure")
    return p


def start(args: argparse.Namespace) -> float:
    """Set the threads; return the start time of the wall clock."""
    torch.set_num_threads(args.threads)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return time.perf_counter()


def add_snens_flags(p: argparse.ArgumentParser) -> None:
    """``--temperature``, ``--snens-temperatures``, ``--tau-from-sweep`` and ``--merge``."""
    p.add_argument(
        "--temperature", type=float, default=1.0, help="σN-Ens τ without the two flags below"
    )
    p.add_argument(
        "--snens-temperatures",
        type=float,
        nargs="+",
        default=None,
        help="σN-Ens at each τ, one row each",
    )
    p.add_argument(
        "--tau-from-sweep",
        type=Path,
        default=None,
        help="a tau_sweep.csv: run σN-Ens at its τ* (lowest mean validation NLL) too",
    )
    p.add_argument(
        "--merge",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="merge into the existing CSV (default: when --methods names a subset)",
    )


def merging(args: argparse.Namespace, methods: Sequence[str]) -> bool:
    """``--merge`` as given, else whether ``--methods`` names only some of ``methods``."""
    return set(args.methods) != set(methods) if args.merge is None else args.merge


def snens_temperatures(args: argparse.Namespace) -> tuple[list[float], str]:
    """The σN-Ens τ to run (``--snens-temperatures``, and/or τ* of ``--tau-from-sweep``;
    ``--temperature`` without either), and a sentence on how τ* was selected (or empty)."""
    temperatures = list(args.snens_temperatures or [])
    if args.tau_from_sweep is None:
        return temperatures or [args.temperature], ""
    sweep = read_csv(args.tau_from_sweep)
    tau_star = select_temperature(sweep)
    if tau_star not in temperatures:
        temperatures.append(tau_star)
    sizes = {r.get("val_examples") for r in sweep}
    if None in sizes and args.tau_from_sweep.with_suffix(".md").exists():
        # a sweep CSV without the column: its provenance line names the split
        found = re.search(
            r"validation: the last (\d+) of", args.tau_from_sweep.with_suffix(".md").read_text()
        )
        sizes = {int(found.group(1))} if found else sizes
    split = (
        f"the last {sizes.pop()} of the 60 000 Fashion-MNIST training images"
        if len(sizes) == 1 and None not in sizes
        else "held-out Fashion-MNIST training images, as the sweep's .md states"
    )
    return temperatures, (
        f"σN-Ens τ*={tau_star:g} was selected on the validation split ({split}, disjoint from "
        f"the training subset) as the τ of lowest mean validation NLL over seeds in "
        f"{args.tau_from_sweep.as_posix()}, never on the test set"
    )


def merged(new: list[dict], path: Path, merge: bool) -> tuple[list[dict], str]:
    """The rows to write: ``new`` alone, or merged into the CSV at ``path`` (a run made again
    replaces its row); and a sentence naming the rows kept from the CSV (empty if none)."""
    if not merge or not path.exists():
        return new, ""
    old = read_csv(path)
    rows = merge_rows(old, new)
    kept = list(dict.fromkeys(label(r) for r in rows[: len(rows) - len(new)]))
    if not kept:
        return rows, ""
    ran = ", ".join(dict.fromkeys(label(r) for r in new))
    return rows, (
        f"This command ran only {ran} and merged them into {path.name}; the wall time below is "
        f"its own. Rows kept from the CSV (earlier runs at the same settings): {', '.join(kept)}"
    )


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------


class Data(NamedTuple):
    """Training tensors, the test and OOD loaders, the raw test images for corruption, and the
    validation loader (``None`` without a validation split)."""

    x: Tensor
    y: Tensor
    test: TensorLoader
    ood: TensorLoader
    test_images: Tensor
    test_labels: Tensor
    val: TensorLoader | None = None


def validation_range(train_examples: int, val_examples: int, total: int) -> range:
    """Indices of the validation images: the last ``val_examples`` of ``total`` training images.

    Raises:
        ValueError: the validation split would overlap the first ``train_examples`` images.
    """
    if train_examples < 1 or val_examples < 0:
        raise ValueError(
            f"need train examples ≥ 1 and val examples ≥ 0, got {train_examples}, {val_examples}"
        )
    if train_examples + val_examples > total:
        raise ValueError(
            f"the validation split (the last {val_examples} of {total} training images) would "
            f"overlap the training subset (the first {train_examples}): use "
            f"--train-examples ≤ {total - val_examples} or a smaller --val-examples"
        )
    return range(total - val_examples, total)


def load_data(args: argparse.Namespace) -> Data:
    """Fashion-MNIST train head, validation tail and test set, MNIST-5k (a fixed random subset
    if smaller)."""
    x, y = load_fashion_mnist("train")
    val_examples = getattr(args, "val_examples", 0)
    val_idx = validation_range(args.train_examples, val_examples, len(x))
    xt, yt = load_fashion_mnist("test")
    xo, yo = load_mnist_5k()
    if args.ood_examples < len(xo):  # MNIST-5k is sorted by class: take a random subset
        keep = torch.randperm(len(xo), generator=torch.Generator().manual_seed(0))
        xo, yo = xo[keep[: args.ood_examples]], yo[keep[: args.ood_examples]]
    xt, yt = xt[: args.test_examples], yt[: args.test_examples]
    return Data(
        x[: args.train_examples],
        y[: args.train_examples],
        TensorLoader(xt, yt, EVAL_BATCH, **NORM),
        TensorLoader(xo, yo, EVAL_BATCH, **NORM),
        xt,
        yt,
        TensorLoader(x[val_idx.start :], y[val_idx.start :], EVAL_BATCH, **NORM)
        if val_examples
        else None,
    )


def train_loader(data: Data, args: argparse.Namespace, seed: int) -> TensorLoader:
    return TensorLoader(
        data.x,
        data.y,
        args.batch_size,
        shuffle=True,
        drop_last=True,
        augment=("crop", "flip"),
        seed=seed,
        **NORM,
    )


class Corruptions(NamedTuple):
    """Which corrupted test sets a run is scored on (the engine generates them per run): every
    ``name`` at severities 1..5 of the first ``examples`` test images, corruption seed ``seed``."""

    names: tuple[str, ...]
    examples: int
    seed: int = 0


def corruption_loaders(
    data: Data, names: Sequence[str], examples: int, seed: int = 0
) -> Corruptions:
    """The corrupted test sets of :func:`run`: ``names`` × severities 1..5 of the first
    ``examples`` test images (at most the test set), corruption seed ``seed``."""
    return Corruptions(tuple(names), min(examples, len(data.test_images)), seed)


# ------------------------------------------------------------------------------------------------
# One run
# ------------------------------------------------------------------------------------------------


def ood_scores(model: nn.Module, data: Data, scores: Sequence[str]) -> dict[str, float]:
    """AUROC, AUPR, FPR95 (OOD positive) of each score, from one pass over test and OOD sets."""
    member_in, _ = collect(model, data.test)
    member_out, _ = collect(model, data.ood)
    return {
        f"ood_{score}_{key}": value
        for score in scores
        for key, value in ood_detection(member_in, member_out, score).items()
    }


def build(method: str, *, num_members: int, width: int, seed: int, **options: Any) -> nn.Module:
    """``snens.baselines.create`` over SmallCNN, seeded; every member of a deep ensemble of
    seed s is initialized from seed 1000·s + m, so no two seeds share a member."""
    torch.manual_seed(seed)
    backbone = {"in_channels": 1, "width": width}
    if method == "snens":
        options.setdefault("generator", torch.Generator().manual_seed(seed))
    if method == "deep_ensemble":
        options.setdefault("seed", 1000 * seed)
    return baselines.create(
        method,
        "small_cnn",
        num_classes=10,
        num_members=None if method == "single" else num_members,
        backbone_options=backbone,
        **options,
    )


def engine_config(
    method: str,
    seed: int,
    args: argparse.Namespace,
    *,
    num_members: int,
    width: int,
    temperature: float,
    diversity_weight: float,
    corruptions: Corruptions | None,
    **options: Any,
) -> RunConfig:
    """The engine config of one run at this module's CPU scale (the preset
    ``fashion_mnist_small_cnn`` with the script's settings)."""
    input_policy = options.pop("input_policy", "repeat")
    if method == "deep_ensemble":
        options.setdefault("seed", 1000 * seed)  # no two seeds share a member
    values = {
        "seed": seed,
        "threads": args.threads,
        "data": {
            "train_examples": args.train_examples,
            "validation_examples": getattr(args, "val_examples", 0),
            "test_examples": args.test_examples,
            "ood_examples": args.ood_examples,
            "batch_size": args.batch_size,
            "eval_batch_size": EVAL_BATCH,
            "corruptions": corruptions is not None,
            "corruption_names": list(corruptions.names) if corruptions else [],
            "corruption_examples": corruptions.examples if corruptions else 1000,
            "corruption_seed": corruptions.seed if corruptions else 0,
        },
        "model": {"options": {"width": width}},
        "method": {
            "name": method,
            "num_members": 1 if method == "single" else num_members,
            "temperature": temperature,
            "diversity_weight": diversity_weight,
            "input_policy": input_policy,
            "options": options,
        },
        "optim": {"epochs": args.epochs, "lr": args.lr},
    }
    return load_config(_merge(to_dict(preset("fashion_mnist_small_cnn")), values))


def _merge(base: dict, values: Mapping) -> dict:
    out = dict(base)
    for key, value in values.items():
        out[key] = (
            _merge(base.get(key, {}), value)
            if isinstance(value, Mapping) and key != "options"
            else value
        )
    return out


def run(
    method: str,
    seed: int,
    data: Data,
    args: argparse.Namespace,
    *,
    num_members: int = 4,
    width: int | None = None,
    temperature: float = 1.0,
    diversity_weight: float = 0.1,
    corruptions: Corruptions | None = None,
    extra_scores: Sequence[str] = (),
    **options: Any,
) -> tuple[dict[str, Any], dict[str, float]]:
    """Train and score one model through the engine (:func:`snens.engine.train.train`, in a
    temporary run directory) and return the flat CSV row and the full ``snens.evaluate`` dict.

    OOD metrics use the MSP score (``ood_msp_*``); ``extra_scores`` (``entropy``,
    ``mutual_information``) add their own, from the run's trained model.
    """
    width = args.width if width is None else width
    config = engine_config(
        method,
        seed,
        args,
        num_members=num_members,
        width=width,
        temperature=temperature,
        diversity_weight=diversity_weight,
        corruptions=corruptions,
        **options,
    )
    with tempfile.TemporaryDirectory(prefix="snens-experiment-") as tmp:
        run_dir = train(config, progress=False, run_dir=Path(tmp) / "run", log=None)
        final = json.loads((run_dir / "final.json").read_text(encoding="utf-8"))
        history = read_metrics(run_dir)
        model = load_run_model(run_dir)[0].eval() if extra_scores else None
    report = final["metrics"]
    members = 1 if method == "single" else num_members
    has_norms = method == "snens"
    seconds = final["train"]["seconds"]
    row: dict[str, Any] = {
        "method": method,
        "seed": seed,
        "num_members": members,
        "width": width,
        "temperature": temperature if has_norms else math.nan,
        "diversity_weight": diversity_weight if has_norms else math.nan,
        "params": final["model"]["params"],
        "train_seconds": seconds,
        "seconds_per_epoch": seconds / args.epochs,
        "final_train_loss": history[-1]["task_loss"],
        "k_star": snens.optimal_k(temperature, members) if has_norms else math.nan,
        "effective_members": history[-1]["effective_members"] if has_norms else math.nan,
    }
    for key in (
        "accuracy",
        "nll",
        "ece",
        "brier",
        "disagreement",
        "mutual_information",
        "member_accuracy_mean",
        "member_nll_mean",
    ):
        row[key] = report[f"test/{key}"]
    for key in OOD_METRICS:
        row[f"ood_msp_{key}"] = report[f"ood/mnist_5k/{key}"]
    if extra_scores:
        torch.manual_seed(seed)
        row.update(ood_scores(model, data, extra_scores))
    if corruptions:
        for s in sorted({int(k.split("/")[2]) for k in report if k.startswith("shift/severity/")}):
            for key in ("accuracy", "nll", "ece", "brier"):
                row[f"shift{s}_{key}"] = report[f"shift/severity/{s}/{key}"]
        for key in ("accuracy", "nll", "ece", "brier"):
            row[f"shift_mean_{key}"] = report[f"shift/mean/{key}"]
    for key in VAL_METRICS:
        row[f"val_{key}"] = report.get(f"val/{key}", math.nan)
    row["val_examples"] = 0 if data.val is None else getattr(args, "val_examples", 0)
    return row, report


def log_row(row: Mapping[str, Any], label: str) -> None:
    eff = row.get("effective_members", math.nan)
    print(
        f"{label} seed={row['seed']}: acc {row['accuracy']:.4f}  NLL {row['nll']:.4f}  "
        f"ECE {row['ece']:.4f}  AUROC {row['ood_msp_auroc']:.4f}"
        + ("" if math.isnan(eff) else f"  eff. members {eff:.2f}")
        + f"  params {row['params']}  train {row['train_seconds']:.1f}s"
        + f"  val NLL {float(row.get('val_nll', math.nan)):.4f}",
        flush=True,
    )


# ------------------------------------------------------------------------------------------------
# Files: CSV, tables, provenance
# ------------------------------------------------------------------------------------------------


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """One row per run, as the engine's sweeps write them (:func:`snens.engine.sweep.write_csv`:
    the union of the rows' keys in first-seen order, a missing cell empty, written atomically)."""
    return sweep.write_csv(path, rows)


def _parse(value: str) -> Any:
    if value == "":  # a cell the row did not have
        return math.nan
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV written by :func:`write_csv`, numbers parsed (``nan`` as float NaN)."""
    with path.open(newline="", encoding="utf-8") as f:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(f)]


#: What names one run in a CSV: re-running it replaces the old row, every other row is kept.
RUN_KEY = ("method", "temperature", "num_members", "seed")


def run_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """:data:`RUN_KEY` of a row as strings (``1`` and ``1.0`` alike, NaN equal to NaN)."""
    return tuple(
        f"{float(row[k]):g}" if isinstance(row[k], (int, float)) else str(row[k]) for k in RUN_KEY
    )


def merge_rows(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """``old`` without the runs that ``new`` repeats (same :data:`RUN_KEY`), then ``new``.

    Raises:
        ValueError: the rows were made at different widths (another scale, not mergeable).
    """
    widths = {float(r["width"]) for r in (*old, *new) if "width" in r}
    if len(widths) > 1:
        raise ValueError(f"cannot merge runs of different widths {sorted(widths)}")
    replaced = {run_key(r) for r in new}
    return [r for r in old if run_key(r) not in replaced] + list(new)


def select_temperature(rows: Sequence[Mapping[str, Any]], metric: str = "val_nll") -> float:
    """τ* = the τ of the lowest mean validation ``metric`` over seeds (the first τ on a tie),
    among the σN-Ens rows.

    Raises:
        ValueError: a τ without the metric (runs made without a validation split).
    """
    by_tau = groups([r for r in rows if r.get("method", "snens") == "snens"], ("temperature",))
    means = {float(k[0]): mean_std([r[metric] for r in g])[0] for k, g in by_tau.items()}
    if not means or any(math.isnan(m) for m in means.values()):
        raise ValueError(f"no {metric} to select τ on: run with a validation split")
    return min(means, key=means.get)


def label(row: Mapping[str, Any]) -> str:
    """Display name of a row's method, with its τ for σN-Ens (``σN-Ens τ=5``)."""
    name = NAMES.get(row["method"], str(row["method"]))
    tau = row.get("temperature", math.nan)
    if row["method"] == "snens" and isinstance(tau, (int, float)) and not math.isnan(tau):
        return f"{name} τ={float(tau):g}"
    return name


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (:func:`snens.engine.report.summarize`; 0 for one
    value, where the report shows none)."""
    mean, std, n = summarize([float(v) for v in values])
    return mean, std if n > 1 else 0.0


def groups(rows: Sequence[Mapping[str, Any]], by: Sequence[str]) -> dict[tuple, list[Mapping]]:
    """Rows grouped by the values of ``by``, groups in first-seen order."""
    out: dict[tuple, list[Mapping]] = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in by), []).append(row)
    return out


def _cell(values: Sequence[float], digits: int) -> str:
    if any(isinstance(v, float) and math.isnan(v) for v in values):
        return "—"
    mean, std = mean_std(values)
    if digits == 0:
        return f"{mean:,.0f}" if std == 0 else f"{mean:,.0f} ± {std:,.0f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def table(
    rows: Sequence[Mapping[str, Any]],
    by: Sequence[str],
    columns: Sequence[str],
    *,
    headers: Mapping[str, str] | None = None,
    digits: Mapping[str, int] | None = None,
) -> str:
    """A markdown table: one line per group of ``by``, each column's mean ± std over its runs.

    Args:
        by: keys naming a group (e.g. ``("method", "num_members")``); shown as they are, with
            method names spelled as in :data:`NAMES`.
        columns: keys averaged over the group's runs (the seeds).
        headers: display names of keys.
        digits: decimals per key (default 4; 0 for counts such as params).
    """
    headers = dict(headers or {})
    digits = dict(digits or {})
    names = [headers.get(k, k) for k in (*by, *columns)] + ["seeds"]
    table_rows = []
    for key, group in groups(rows, by).items():
        shown = [NAMES.get(v, v) if isinstance(v, str) else f"{v:g}" for v in key]
        cells = [_cell([r[c] for r in group], digits.get(c, 4)) for c in columns]
        table_rows.append([*shown, *cells, str(len(group))])
    return markdown_table(names, table_rows)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(args: argparse.Namespace, started: float, extra: str = "") -> str:
    """Seeds, scale, versions, hardware, wall time and the command that made the results."""
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    return (
        f"Seeds {args.seeds}; SmallCNN width {args.width}, {args.train_examples} Fashion-MNIST "
        f"train images, {args.epochs} epochs (AdamW lr {args.lr}, cosine, batch "
        f"{args.batch_size}); test {args.test_examples} images, OOD MNIST-5k "
        f"({args.ood_examples} images)"
        + (
            f"; validation: the last {args.val_examples} of the 60 000 training images"
            if getattr(args, "val_examples", 0)
            else ""
        )
        + f"{'; ' + extra if extra else ''}. "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {cpu_name()} "
        f"(2 cores shared with other work); wall time {time.perf_counter() - started:.0f} s. "
        f"Command: `{command}`"
    )


def write_markdown(path: Path, title: str, sections: Sequence[str], footer: str) -> Path:
    text = f"# {title}\n\n" + "\n\n".join(sections) + "\n\n" + footer + "\n"
    path.write_text(text, encoding="utf-8")
    print("\n" + text, flush=True)
    return path


# ------------------------------------------------------------------------------------------------
# Figures (matplotlib on the Agg canvas, as snens.evaluation.plots draws them)
# ------------------------------------------------------------------------------------------------


def figure(panels: int, *, width: float = 4.2, height: float = 3.6) -> tuple[Any, list[Any]]:
    """A Figure with ``panels`` axes, at most 3 per row (unused grid cells hidden)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(panels, 3)
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(width * cols, height * rows), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def save(fig: Any, path: Path) -> Path:
    fig.savefig(path, format="png")
    print(f"wrote {path}", flush=True)
    return path


def line_panels(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    x: str,
    panels: Sequence[str],
    group: str | None = "method",
    logx: bool = False,
    labels: Mapping[str, str] | None = None,
    decorate: Callable[[Any, str], None] | None = None,
) -> Path:
    """One panel per metric: its mean ± std over seeds against ``x``, one line per ``group``."""
    labels = dict(labels or {})
    fig, axes = figure(len(panels))
    by_group = groups(rows, (group,)) if group else {("",): list(rows)}
    for i, (key, members) in enumerate(by_group.items()):
        name = NAMES.get(key[0], str(key[0]))
        for ax, metric in zip(axes, panels):
            points = groups(members, (x,))
            xs = [k[0] for k in points]
            stats = [mean_std([r[metric] for r in g]) for g in points.values()]
            ax.errorbar(
                xs,
                [m for m, _ in stats],
                yerr=[s for _, s in stats],
                fmt="o-",
                color=f"C{i}",
                capsize=3,
                label=name or None,
            )
    ticks = list(dict.fromkeys(r[x] for r in rows))
    for ax, metric in zip(axes, panels):
        ax.set(xlabel=labels.get(x, x), ylabel=labels.get(metric, metric))
        if logx:
            ax.set_xscale("log")
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
        if decorate is not None:
            decorate(ax, metric)
        ax.grid(alpha=0.3)
        if group or decorate is not None:
            ax.legend(fontsize=8)
    return save(fig, path)
