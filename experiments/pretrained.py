"""Claim: converting a pretrained network and fine-tuning it briefly gives an ensemble at ~1× the
parameters; measured here against fine-tuning one model, a deep ensemble of fine-tunes,
MC-dropout and BatchEnsemble — accuracy, calibration, OOD detection, cost.

Two tasks, each with the same short recipe (one epoch of AdamW, cosine schedule, every
parameter trained):

* ``text``: MiniLM-L6 (pretrained sentence encoder, 13 LayerNorm) on Rotten Tomatoes review
  snippets (fresh vs rotten); OOD = movie plot descriptions from the same corpus.
* ``vision``: MobileNetV2 with ImageNet weights (52 BatchNorm2d) on Fashion-MNIST, grey images
  resized and repeated to 3 channels; OOD = MNIST-5k.

Methods, M = 4 where there are members. ``single``: one fine-tune. ``deep_ensemble``: four
fine-tunes under four seeds (head init, data order, dropout); the single model is member 0
of the ensemble of its seed. ``mc_dropout``: the single fine-tune with dropout kept on at test
time, 4 samples (no extra training). ``batch_ensemble``: rank-1 fast weights on every linear /
conv layer, r, s ~ N(1, 0.1²) so the pretrained function is only mildly perturbed at the start;
run on the vision task only by default (on MiniLM a training step measured ~7× a single
model's, 5.5 s vs 0.8 s at batch 32, which the CPU budget does not hold; ``--methods`` adds it).
``snens``: ``snens.convert(pretrained, 4)`` (heads copied: right after conversion every member
computes the pretrained model, checked on a test batch and logged as ``conversion_error``),
then the same fine-tune plus the diversity loss (τ = 1, λ = 0.1). γ's learning rate is set
absolute, 0.05 per step on both tasks (500× the text lr, 100× the vision lr; the sst2
preset's 1000× a base lr of 2e-5 is 0.02, over thousands of steps): a one-epoch fine-tune has
only ~60 steps, and with Adam γ moves about its lr per step. Packed-Ensembles are not run:
they build their own widened ResNet and cannot hold pretrained weights.

Data subsets are fixed (seed 0) and the same for every run; the seed changes the head
initialization, data order, dropout and γ. Each run is scored from the members' probabilities
(:func:`snens.evaluate.collect`) with :mod:`snens.metrics`; OOD scores are MSP and, where
there are members, mutual information. Timing (``train_seconds``) excludes evaluation.

    python experiments/pretrained.py    # CPU scale, 1 thread: see results/pretrained.md
    python experiments/pretrained.py --tasks text --methods single snens --seeds 0
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import snens
from snens import metrics
from snens.baselines import DeepEnsemble, MCDropout, SingleModel, batch_ensemble
from snens.data import TensorLoader, load_fashion_mnist, load_mnist_5k
from snens.data.text import load_rotten_tomatoes, split_texts
from snens.evaluate import collect
from snens.fit import fit
from snens.models import IMAGENET_MEAN, IMAGENET_STD, mobilenet_v2

TASKS = ("text", "vision")
METHODS = ("single", "deep_ensemble", "mc_dropout", "batch_ensemble", "snens")
DEFAULT_METHODS = {"text": tuple(m for m in METHODS if m != "batch_ensemble"), "vision": METHODS}
# Absolute learning rate of γ (lr × multiplier): with Adam γ moves about this much per step,
# so ~60 steps can carry σ(γ) from 0.5 to either end.
GAMMA_LR = 0.05
COLUMNS = (
    "task",
    "method",
    "seed",
    "num_members",
    "accuracy",
    "nll",
    "ece",
    "brier",
    "ood_auroc_msp",
    "ood_aupr_msp",
    "ood_fpr95_msp",
    "ood_auroc_mi",
    "ood_aupr_mi",
    "ood_fpr95_mi",
    "disagreement",
    "mutual_information",
    "effective_members",
    "conversion_error",
    "params",
    "trainable_params",
    "train_seconds",
    "eval_seconds",
)


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------


class TokenBatches:
    """``(x, y)`` batches of pre-tokenized texts, x = {"input_ids", "attention_mask"}.

    Each batch is cut to its longest text (padding is masked, so the result is the same as with
    the full padded length). Shuffled batches draw a fresh permutation per pass from
    ``(seed, pass)``; unshuffled ones go shortest first, to pad as little as possible.

    Shape:
        x: input_ids, attention_mask (B, T_batch) int64; y: (B,) int64.
    """

    def __init__(
        self,
        ids: Tensor,
        mask: Tensor,
        labels: Tensor,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        self.ids, self.mask, self.labels = ids, mask, labels
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.passes = 0

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[dict[str, Tensor], Tensor]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 10_007 + self.passes)
            order = torch.randperm(len(self.labels), generator=generator)
        else:
            order = torch.argsort(self.mask.sum(1), stable=True)
        self.passes += 1
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            length = int(self.mask[idx].sum(1).max())
            x = {"input_ids": self.ids[idx, :length], "attention_mask": self.mask[idx, :length]}
            yield x, self.labels[idx]


def _subset(n: int, total: int, generator: torch.Generator) -> Tensor:
    return torch.randperm(total, generator=generator)[: min(n, total)]


def _to_imagenet_rgb(images: Tensor, size: int) -> Tensor:
    """uint8 grey (N, 1, 28, 28) -> ImageNet-normalized RGB (N, 3, size, size) float32."""
    x = F.interpolate(images.float() / 255, size=(size, size), mode="bilinear", align_corners=False)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x.expand(-1, 3, -1, -1) - mean) / std


@dataclass
class Task:
    """A pretrained model with a fresh head, data and the fine-tune's learning rate."""

    name: str
    build: Callable[[], nn.Module]  # the pretrained model, head initialized from the global RNG
    train: Callable[[int], Iterable]  # seed -> re-iterable training batches
    test: Iterable
    ood: Iterable
    lr: float
    description: str
    gamma_lr: float = GAMMA_LR  # absolute learning rate of σN-Ens' γ

    @property
    def gamma_lr_multiplier(self) -> float:
        return self.gamma_lr / self.lr


def text_task(args: argparse.Namespace) -> Task:
    """MiniLM-L6 on Rotten Tomatoes snippets; plot descriptions as OOD. Tokenized once."""
    from snens.models.text import minilm, tokenizer

    corpus = load_rotten_tomatoes()
    split = split_texts(corpus.texts, corpus.labels, test_fraction=0.2, seed=0)
    g = torch.Generator().manual_seed(0)
    train_idx = _subset(args.text_train, len(split.train_texts), g).tolist()
    test_idx = _subset(args.text_test, len(split.test_texts), g).tolist()
    ood_idx = _subset(args.text_ood, len(corpus.ood_texts), g).tolist()
    tok = tokenizer()

    def encode(texts: list[str]) -> tuple[Tensor, Tensor]:
        batch = tok(
            texts,
            padding="max_length",
            truncation=True,
            max_length=args.max_length,
            return_tensors="pt",
        )
        return batch["input_ids"], batch["attention_mask"]

    train_ids, train_mask = encode([split.train_texts[i] for i in train_idx])
    train_y = torch.tensor([split.train_labels[i] for i in train_idx])
    test = TokenBatches(
        *encode([split.test_texts[i] for i in test_idx]),
        torch.tensor([split.test_labels[i] for i in test_idx]),
        args.eval_batch_size,
    )
    ood_ids, ood_mask = encode([corpus.ood_texts[i] for i in ood_idx])
    ood = TokenBatches(ood_ids, ood_mask, torch.zeros(len(ood_idx), dtype=torch.long), 256)
    return Task(
        name="text",
        build=lambda: minilm(num_classes=2),
        train=lambda seed: TokenBatches(
            train_ids, train_mask, train_y, args.text_batch_size, shuffle=True, seed=seed
        ),
        test=test,
        ood=ood,
        lr=args.text_lr,
        description=(
            f"MiniLM-L6, Rotten Tomatoes: {len(train_idx)} train / {len(test_idx)} test reviews, "
            f"{len(ood_idx)} plot texts (OOD), max_length {args.max_length}, batch "
            f"{args.text_batch_size}, lr {args.text_lr:g}"
        ),
    )


def vision_task(args: argparse.Namespace) -> Task:
    """MobileNetV2 (ImageNet) on Fashion-MNIST resized to RGB; MNIST-5k as OOD."""
    x, y = load_fashion_mnist("train")
    xt, yt = load_fashion_mnist("test")
    xo, yo = load_mnist_5k()  # sorted by class: take a random subset
    g = torch.Generator().manual_seed(0)
    train_idx = _subset(args.image_train, len(x), g)
    test_idx = _subset(args.image_test, len(xt), g)
    ood_idx = _subset(args.image_ood, len(xo), g)
    size = args.image_size
    train_x, train_y = _to_imagenet_rgb(x[train_idx], size), y[train_idx]
    test = TensorLoader(_to_imagenet_rgb(xt[test_idx], size), yt[test_idx], args.eval_batch_size)
    ood = TensorLoader(_to_imagenet_rgb(xo[ood_idx], size), yo[ood_idx], args.eval_batch_size)
    return Task(
        name="vision",
        build=lambda: mobilenet_v2(num_classes=10, pretrained=True),
        train=lambda seed: TensorLoader(
            train_x, train_y, args.image_batch_size, shuffle=True, seed=seed
        ),
        test=test,
        ood=ood,
        lr=args.image_lr,
        description=(
            f"MobileNetV2 (ImageNet), Fashion-MNIST at {size}×{size} RGB: {len(train_idx)} train "
            f"/ {len(test_idx)} test, {len(ood_idx)} MNIST-5k (OOD), batch "
            f"{args.image_batch_size}, lr {args.image_lr:g}"
        ),
    )


# ------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------


def _call(model: nn.Module, x: Any) -> Tensor:
    return model(**x) if isinstance(x, dict) else model(x)


@torch.no_grad()
def conversion_error(plain: nn.Module, ensemble: nn.Module, batches: Iterable) -> float:
    """Max |member_m(x) − plain(x)| over members and logits of the first batch, in eval mode.

    Both models keep their training flags afterwards (they are set to eval here).
    """
    x, _ = next(iter(batches))
    reference = _call(plain.eval(), x)  # (B, K)
    members = _call(ensemble.eval(), x)  # (M, B, K)
    return float((members - reference).abs().max())


def score(model: nn.Module, task: Task, seed: int) -> dict[str, float]:
    """Test and OOD metrics from the members' probabilities, one pass per data set."""
    torch.manual_seed(seed)  # MC-dropout masks
    start = time.perf_counter()
    probs, labels = collect(model, task.test)  # (M, N, K), (N,)
    ood_probs, _ = collect(model, task.ood)
    mean = probs.mean(0)
    row = {
        "num_members": probs.shape[0],
        "accuracy": metrics.accuracy(mean, labels),
        "nll": metrics.nll(mean, labels),
        "ece": metrics.ece(mean, labels, num_bins=15),
        "brier": metrics.brier(mean, labels),
        "disagreement": metrics.disagreement(probs).mean().item(),
        "mutual_information": metrics.mutual_information(probs).mean().item(),
    }
    ood_scores = {"msp": "msp"} | ({"mi": "mutual_information"} if probs.shape[0] > 1 else {})
    for key, name in ood_scores.items():
        s_in, s_out = metrics.OOD_SCORES[name](probs), metrics.OOD_SCORES[name](ood_probs)
        row[f"ood_auroc_{key}"] = metrics.auroc(s_in, s_out)
        row[f"ood_aupr_{key}"] = metrics.aupr(s_in, s_out)
        row[f"ood_fpr95_{key}"] = metrics.fpr_at_95_tpr(s_in, s_out)
    row["eval_seconds"] = time.perf_counter() - start
    return row


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _finetune(model: nn.Module, task: Task, seed: int, args: argparse.Namespace) -> float:
    result = fit(
        model,
        task.train(seed),
        epochs=args.epochs,
        lr=task.lr,
        weight_decay=args.weight_decay,
        temperature=args.temperature,
        diversity_weight=args.diversity_weight,
        gamma_lr_multiplier=task.gamma_lr_multiplier,
        log=None,
    )
    return result.seconds


def _built(task: Task, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # the fresh head's initialization
    return task.build()


def run_seed(
    task: Task, seed: int, methods: Sequence[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every method on one task under one seed; one row per method."""
    M = args.num_members
    rows: list[dict[str, Any]] = []

    def add(method: str, model: nn.Module, seconds: float, **extra: float) -> None:
        row = {"task": task.name, "method": method, "seed": seed}
        row |= score(model, task, seed)
        row |= {
            "params": _params(model),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "train_seconds": seconds,
            **extra,
        }
        rows.append(row)
        print(
            f"[{task.name}] {method:>14} seed {seed}: acc {row['accuracy']:.4f}  NLL "
            f"{row['nll']:.4f}  ECE {row['ece']:.4f}  AUROC {row['ood_auroc_msp']:.3f}  "
            f"train {seconds:.0f}s  eval {row['eval_seconds']:.0f}s",
            flush=True,
        )

    # Fine-tunes of the plain model: member m under seed (seed·1000 + m). Member 0 is the
    # single model (and MC-dropout's); all M of them form the deep ensemble.
    wanted = 0
    if {"single", "mc_dropout"} & set(methods):
        wanted = 1
    if "deep_ensemble" in methods:
        wanted = M
    tuned, seconds = [], []
    for m in range(wanted):
        model = _built(task, seed * 1000 + m)
        seconds.append(_finetune(SingleModel(model), task, seed * 1000 + m, args))
        tuned.append(model)
    if "single" in methods:
        add("single", SingleModel(tuned[0]), seconds[0])
    if "mc_dropout" in methods:
        add("mc_dropout", MCDropout(tuned[0], M), seconds[0])
    if "deep_ensemble" in methods:
        add("deep_ensemble", DeepEnsemble(tuned), sum(seconds))
    del tuned

    if "batch_ensemble" in methods:
        generator = torch.Generator().manual_seed(seed)
        model = batch_ensemble(
            _built(task, seed * 1000), M, init_std=args.be_init_std, generator=generator
        )
        add("batch_ensemble", model, _finetune(model, task, seed * 1000, args))

    if "snens" in methods:
        plain = _built(task, seed * 1000)  # the single model's head and data order
        ens = snens.convert(plain, M, generator=torch.Generator().manual_seed(seed))
        error = conversion_error(plain, ens, task.test)
        seconds_snens = _finetune(ens, task, seed * 1000, args)
        add(
            "snens",
            ens,
            seconds_snens,
            conversion_error=error,
            effective_members=snens.mean_effective_members(ens),
        )
    return rows


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------

_IN_DISTRIBUTION = (
    ("accuracy", "acc", 4),
    ("nll", "NLL", 4),
    ("ece", "ECE", 4),
    ("brier", "Brier", 4),
    ("disagreement", "disagreement", 4),
    ("params", "params (M)", 2),
    ("train_seconds", "train s", 0),
)
_OOD = (
    ("ood_auroc_msp", "AUROC MSP", 3),
    ("ood_aupr_msp", "AUPR MSP", 3),
    ("ood_fpr95_msp", "FPR95 MSP", 3),
    ("ood_auroc_mi", "AUROC MI", 3),
    ("ood_aupr_mi", "AUPR MI", 3),
    ("ood_fpr95_mi", "FPR95 MI", 3),
)


def _mean_std(values: list[float], digits: int) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def summary(rows: list[dict[str, Any]]) -> str:
    """Markdown tables, mean ± std over seeds, per task: in-distribution, then OOD."""
    parts = []
    for task in TASKS:
        methods = [m for m in METHODS if any(r["task"] == task and r["method"] == m for r in rows)]
        if not methods:
            continue
        for title, shown in (("in distribution", _IN_DISTRIBUTION), ("OOD", _OOD)):
            lines = [
                f"**{task}, {title}**",
                "",
                "| method | " + " | ".join(label for _, label, _ in shown) + " |",
                "|---|" + "---|" * len(shown),
            ]
            for method in methods:
                group = [r for r in rows if r["task"] == task and r["method"] == method]
                cells = []
                for key, _, digits in shown:
                    values = [float(r.get(key, math.nan)) for r in group]
                    if key == "params":
                        values = [v / 1e6 for v in values]
                    cells.append(_mean_std(values, digits))
                lines.append(f"| {method} | " + " | ".join(cells) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts)


def figure(rows: list[dict[str, Any]], path: Path) -> Path:
    """Bars of NLL, ECE and OOD AUROC (MSP) per method, one row of panels per task."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)]
    panels = (("nll", "NLL ↓"), ("ece", "ECE ↓"), ("ood_auroc_msp", "OOD AUROC (MSP) ↑"))
    fig = Figure(figsize=(11, 3.2 * len(tasks)), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(tasks), len(panels), squeeze=False)
    for i, task in enumerate(tasks):
        methods = [m for m in METHODS if any(r["task"] == task and r["method"] == m for r in rows)]
        for j, (key, label) in enumerate(panels):
            ax = axes[i][j]
            means, stds = [], []
            for method in methods:
                values = [r[key] for r in rows if r["task"] == task and r["method"] == method]
                means.append(statistics.mean(values))
                stds.append(statistics.stdev(values) if len(values) > 1 else 0.0)
            colors = ["tab:red" if m == "snens" else "tab:gray" for m in methods]
            ax.bar(range(len(methods)), means, yerr=stds, color=colors, capsize=3)
            ax.set_xticks(range(len(methods)))
            ax.set_xticklabels([m.replace("_", "\n") for m in methods], fontsize=8)
            ax.set_title(f"{task}: {label}", fontsize=10)
            if key == "ood_auroc_msp":
                ax.set_ylim(min(0.5, min(means) - 0.05), 1.0)
    fig.savefig(path, dpi=120)
    return path


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, restval="nan")
        writer.writeheader()
        writer.writerows(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=None,
        help="methods on every task (default: all; text without batch_ensemble)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-members", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--temperature", type=float, default=1.0, help="τ of σN-Ens")
    parser.add_argument("--diversity-weight", type=float, default=0.1, help="λ of σN-Ens")
    parser.add_argument(
        "--gamma-lr", type=float, default=GAMMA_LR, help="absolute learning rate of σN-Ens' γ"
    )
    parser.add_argument("--be-init-std", type=float, default=0.1, help="BatchEnsemble r, s std")
    parser.add_argument("--eval-batch-size", type=int, default=250)
    text = parser.add_argument_group("text task")
    text.add_argument("--text-train", type=int, default=1000)
    text.add_argument("--text-test", type=int, default=600)
    text.add_argument("--text-ood", type=int, default=300)
    text.add_argument("--max-length", type=int, default=32, help="tokens per text")
    text.add_argument("--text-batch-size", type=int, default=16)
    text.add_argument("--text-lr", type=float, default=1e-4)
    vision = parser.add_argument_group("vision task")
    vision.add_argument("--image-train", type=int, default=2000)
    vision.add_argument("--image-test", type=int, default=1000)
    vision.add_argument("--image-ood", type=int, default=1000)
    vision.add_argument("--image-size", type=int, default=48, help="pixels per side")
    vision.add_argument("--image-batch-size", type=int, default=32)
    vision.add_argument("--image-lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("results/pretrained.csv"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    builders = {"text": text_task, "vision": vision_task}
    rows, descriptions = [], []
    for name in args.tasks:
        task = builders[name](args)
        task.gamma_lr = args.gamma_lr
        descriptions.append(
            f"* {name}: {task.description}, γ lr {task.gamma_lr:g} "
            f"({task.gamma_lr_multiplier:g}× lr)"
        )
        methods = args.methods or DEFAULT_METHODS[name]
        for seed in args.seeds:
            rows += run_seed(task, seed, methods, args)
            _write_csv(rows, args.out)  # keep what is done if a later run fails
    _write_csv(rows, args.out)
    wall = time.perf_counter() - start
    table = summary(rows)
    command = "python experiments/pretrained.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    provenance = "\n".join(
        [
            f"`{command.strip()}`",
            "",
            *descriptions,
            f"* seeds {args.seeds}; M = {args.num_members}; {args.epochs} epoch(s) of AdamW "
            f"(weight decay {args.weight_decay:g}, cosine); σN-Ens τ = {args.temperature:g}, "
            f"λ = {args.diversity_weight:g}; BatchEnsemble init std {args.be_init_std:g}",
            f"* torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
            f"{platform.machine()} ({os.cpu_count()} cores, shared); wall time {wall:.0f} s",
        ]
    )
    md = args.out.with_suffix(".md")
    md.write_text(table + "\n\n" + provenance + "\n", encoding="utf-8")
    figure(rows, args.out.with_suffix(".png"))
    print("\n" + table + "\n\n" + provenance)
    return rows


if __name__ == "__main__":
    main()
