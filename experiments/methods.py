"""Claims: (experiment 3) σN-Ens keeps its calibration (ECE) nearly flat as corruption severity
rises; (experiment 4) its OOD detection is weaker than a deep ensemble's.

Every method is trained once per seed and scored twice from the same model, so the two
experiments share their training runs: single model, deep ensemble, BatchEnsemble,
Packed-Ensembles, MC-dropout (p=0.1 before the head, trained as one model, M samples at test)
and σN-Ens (τ=1, λ=0.1), all with M=4 over SmallCNN on Fashion-MNIST.

* Corruption: accuracy and ECE per severity 1..5, each the mean over the corruption types
  (all 15 CIFAR-C types by default) on the first 1 000 test images, corruption seed 0.
* OOD: Fashion-MNIST test (10 000) vs MNIST-5k, AUROC / AUPR / FPR95 with OOD positive, with the
  max-softmax score (MSP), the entropy of the mean prediction, and the mutual information
  (members' disagreement; zero for a single model, so not reported there).

Writes results/corruption.{csv,md,png} and results/ood.{csv,md,png} (one CSV row per run).

    python experiments/methods.py                       # CPU scale: 767 s measured, 1 thread
    python experiments/methods.py --train-examples 60000 --epochs 10 --width 32
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import common

from snens.data import CORRUPTIONS, SEVERITIES
from snens.plots import shift_plot

METHODS = ("single", "deep_ensemble", "batch_ensemble", "packed", "mc_dropout", "snens")
SCORES = ("msp", "entropy", "mutual_information")


def corruption_tables(rows: Sequence[dict], methods: Sequence[str]) -> list[str]:
    sections = []
    for metric, title in (("accuracy", "Accuracy"), ("ece", "ECE (15 bins)")):
        columns = [metric, *(f"shift{s}_{metric}" for s in SEVERITIES), f"shift_mean_{metric}"]
        headers = {metric: "clean", f"shift_mean_{metric}": "mean 1–5"}
        headers.update({f"shift{s}_{metric}": f"severity {s}" for s in SEVERITIES})
        ranked = sorted(rows, key=lambda r: methods.index(r["method"]))
        sections.append(
            f"**{title}** under corruption\n\n"
            + common.table(ranked, ("method",), columns, headers=headers)
        )
    return sections


def ood_rows(rows: Sequence[dict]) -> list[dict]:
    """One row per (method, score, seed), for the long OOD table and its figure."""
    out = []
    for row in rows:
        for score in SCORES:
            if score == "mutual_information" and row["num_members"] == 1:
                continue  # one member: MI is 0 for every input
            entry = {"method": row["method"], "score": score, "seed": row["seed"]}
            entry.update({m: row[f"ood_{score}_{m}"] for m in common.OOD_METRICS})
            out.append(entry)
    return out


def ood_figure(rows: Sequence[dict], methods: Sequence[str], path):
    """AUROC, AUPR and FPR95 per method, one bar per score (mean ± std over seeds)."""
    fig, axes = common.figure(3, width=5.0)
    width = 0.8 / len(SCORES)
    for ax, metric in zip(axes, common.OOD_METRICS):
        for j, score in enumerate(SCORES):
            xs, means, stds = [], [], []
            for i, method in enumerate(methods):
                group = [r[metric] for r in rows if r["method"] == method and r["score"] == score]
                if group:
                    mean, std = common.mean_std(group)
                    xs.append(i + (j - 1) * width)
                    means.append(mean)
                    stds.append(std)
            ax.bar(xs, means, width, yerr=stds, capsize=2, label=score, color=f"C{j}")
        ax.set_xticks(range(len(methods)), [common.NAMES[m] for m in methods], rotation=30)
        ax.set(ylabel=metric.upper(), title=f"{metric.upper()}, Fashion-MNIST vs MNIST-5k")
        if metric == "auroc":
            ax.axhline(0.5, color="gray", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    return common.save(fig, path)


def mean_report(reports: Sequence[dict]) -> dict:
    """Key-wise mean of several ``snens.evaluate`` dicts (NaN-valued keys dropped)."""
    keys = [k for k in reports[0] if not math.isnan(reports[0][k])]
    return {k: sum(r[k] for r in reports) / len(reports) for k in keys}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = common.parser(__doc__, out="methods")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--num-members", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--diversity-weight", type=float, default=0.1)
    p.add_argument("--corruptions", nargs="+", default=list(CORRUPTIONS), choices=CORRUPTIONS)
    p.add_argument("--corruption-examples", type=int, default=1000)
    p.add_argument("--corruption-seed", type=int, default=0)
    args = p.parse_args(argv)
    started = common.start(args)
    data = common.load_data(args)
    shifted = common.corruption_loaders(
        data, args.corruptions, args.corruption_examples, args.corruption_seed
    )
    rows, reports = [], {m: [] for m in args.methods}
    for seed in args.seeds:
        for method in args.methods:
            row, report = common.run(
                method,
                seed,
                data,
                args,
                num_members=args.num_members,
                temperature=args.temperature,
                diversity_weight=args.diversity_weight,
                corruptions=shifted,
                extra_scores=SCORES,
            )
            rows.append(row)
            reports[method].append(report)
            common.log_row(row, method)

    settings = (
        f"M={args.num_members}; σN-Ens τ={args.temperature}, λ={args.diversity_weight}; "
        f"corruptions: {len(args.corruptions)} types × severities 1–5 on the first "
        f"{args.corruption_examples} test images, corruption seed {args.corruption_seed}"
    )
    footer = common.provenance(args, started, settings)
    methods = list(args.methods)

    corruption = args.out_dir / "corruption"
    common.write_csv(rows, corruption.with_suffix(".csv"))
    shift_plot(
        {common.NAMES[m]: mean_report(r) for m, r in reports.items()},
        corruption.with_suffix(".png"),
        metric="ece",
    )
    common.write_markdown(
        corruption.with_suffix(".md"),
        "Calibration under corruption (mean over corruption types per severity)",
        [
            *corruption_tables(rows, methods),
            f"Corruption types: {', '.join(args.corruptions)}.",
            "![accuracy and ECE vs severity](corruption.png)",
        ],
        footer,
    )

    long = ood_rows(rows)
    ood = args.out_dir / "ood"
    common.write_csv(long, ood.with_suffix(".csv"))
    ood_figure(long, methods, ood.with_suffix(".png"))
    ranked = sorted(long, key=lambda r: (methods.index(r["method"]), SCORES.index(r["score"])))
    common.write_markdown(
        ood.with_suffix(".md"),
        "OOD detection: Fashion-MNIST (in) vs MNIST-5k (out, positive)",
        [
            common.table(
                ranked,
                ("method", "score"),
                common.OOD_METRICS,
                headers={"auroc": "AUROC ↑", "aupr": "AUPR ↑", "fpr95": "FPR95 ↓"},
            ),
            "![AUROC / AUPR / FPR95 per method and score](ood.png)",
        ],
        footer,
    )
    return rows


if __name__ == "__main__":
    main()
