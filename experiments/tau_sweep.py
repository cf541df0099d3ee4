"""Claim: τ selects the sharing — lower τ gives fewer effective members per feature and more
disagreement, tracing the accuracy–calibration frontier; what training realizes is measured
next to the regularizer's optimum k*(τ), never assumed.

Fashion-MNIST (CPU stand-in for CIFAR-10), SmallCNN, σN-Ens M=4, λ=0.1, γ at 30× the learning
rate, a grid of τ and seeds; each run trains with `snens.train.fit` and is scored with
`snens.evaluate` (MNIST-5k as OOD). Writes one CSV row per run and a mean ± std table.

    python experiments/tau_sweep.py                      # CPU scale, ~5 min on 2 cores
    python experiments/tau_sweep.py --train-examples 60000 --epochs 10 --width 32
"""

from __future__ import annotations

import argparse
import csv
import platform
import statistics
import time
from pathlib import Path

import torch

import snens
from snens.data import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    TensorLoader,
    load_fashion_mnist,
    load_mnist_5k,
)
from snens.models import create
from snens.train import fit

COLUMNS = (
    "temperature",
    "seed",
    "k_star",
    "effective_members",
    "disagreement",
    "mutual_information",
    "accuracy",
    "nll",
    "ece",
    "brier",
    "ood_auroc",
    "train_seconds",
)


def run(args: argparse.Namespace) -> list[dict]:
    x, y = load_fashion_mnist("train")
    xt, yt = load_fashion_mnist("test")
    xo, yo = load_mnist_5k()
    norm = {"mean": FASHION_MNIST_MEAN, "std": FASHION_MNIST_STD}
    n = args.train_examples
    test = TensorLoader(xt, yt, 1000, **norm)
    ood = TensorLoader(xo, yo, 1000, **norm)
    rows = []
    for seed in args.seeds:
        for tau in args.temperatures:
            torch.manual_seed(seed)
            train = TensorLoader(
                x[:n],
                y[:n],
                args.batch_size,
                shuffle=True,
                drop_last=True,
                augment=("crop", "flip"),
                seed=seed,
                **norm,
            )
            model = create("small_cnn", num_classes=10, in_channels=1, width=args.width)
            ens = snens.convert(
                model, args.num_members, generator=torch.Generator().manual_seed(seed)
            )
            result = fit(
                ens,
                train,
                epochs=args.epochs,
                lr=args.lr,
                temperature=tau,
                diversity_weight=args.diversity_weight,
                log=None,
            )
            report = snens.evaluate(ens, test, ood={"mnist": ood})
            row = {
                "temperature": tau,
                "seed": seed,
                "k_star": snens.optimal_k(tau, args.num_members),
                "effective_members": snens.mean_effective_members(ens),
                "disagreement": report["test/disagreement"],
                "mutual_information": report["test/mutual_information"],
                "accuracy": report["test/accuracy"],
                "nll": report["test/nll"],
                "ece": report["test/ece"],
                "brier": report["test/brier"],
                "ood_auroc": report["ood/mnist/auroc"],
                "train_seconds": result.seconds,
            }
            rows.append(row)
            print(
                f"τ={tau:g} seed={seed}: effective members {row['effective_members']:.2f} "
                f"(k* {row['k_star']:.2f}), acc {row['accuracy']:.4f}, NLL {row['nll']:.4f}, "
                f"ECE {row['ece']:.4f}, {row['train_seconds']:.0f}s",
                flush=True,
            )
    return rows


def summary(rows: list[dict], temperatures: list[float]) -> str:
    shown = ("k_star", "effective_members", "disagreement", "accuracy", "nll", "ece", "ood_auroc")
    lines = ["| τ | " + " | ".join(shown) + " |", "|---|" + "---|" * len(shown)]
    for tau in temperatures:
        group = [r for r in rows if r["temperature"] == tau]
        cells = []
        for key in shown:
            values = [r[key] for r in group]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.4f} ± {spread:.4f}")
        lines.append(f"| {tau:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.05, 0.2, 0.5, 1, 5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--train-examples", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--num-members", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--diversity-weight", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--out", type=Path, default=Path("results/tau_sweep.csv"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    table = summary(rows, args.temperatures)
    provenance = (
        f"seeds {args.seeds}; {args.train_examples} train images, {args.epochs} epochs, width "
        f"{args.width}, M={args.num_members}, λ={args.diversity_weight}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}; "
        f"{time.perf_counter() - start:.0f} s"
    )
    args.out.with_suffix(".md").write_text(table + "\n\n" + provenance + "\n", encoding="utf-8")
    print("\n" + table + "\n\n" + provenance)


if __name__ == "__main__":
    main()
