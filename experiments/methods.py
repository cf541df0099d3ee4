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

σN-Ens can run at several τ (``--snens-temperatures 1 5``), each a row of its own
("σN-Ens τ=5"); ``--tau-from-sweep results/tau_sweep.csv`` runs the τ* chosen there on the
validation split (lowest mean validation NLL, never the test set). ``--methods`` with a subset
of the methods merges into the existing results/corruption.csv: a run (method, τ, M, seed)
made again replaces its row, every other row is kept, and the tables and figures are redrawn
from the whole CSV (``--merge`` / ``--no-merge`` to choose explicitly).

    python experiments/methods.py                       # CPU scale: 767 s measured, 1 thread
    python experiments/methods.py --train-examples 55000 --epochs 10 --width 32
    python experiments/methods.py --methods snens --tau-from-sweep results/tau_sweep.csv
                                                       # σN-Ens at τ* only, merged into the CSV
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import common

from snens.data import CORRUPTIONS, SEVERITIES

METHODS = ("single", "deep_ensemble", "batch_ensemble", "packed", "mc_dropout", "snens")
SCORES = ("msp", "entropy", "mutual_information")


def _order(row: dict) -> tuple:
    """Methods in :data:`METHODS` order, σN-Ens rows by τ."""
    tau = row.get("temperature", math.nan)
    return (METHODS.index(row["method"]), 0.0 if math.isnan(float(tau)) else float(tau))


def labelled(rows: Sequence[dict]) -> list[dict]:
    """The rows in table order, each with its display ``label`` ("σN-Ens τ=5")."""
    return [{**r, "label": common.label(r)} for r in sorted(rows, key=_order)]


def corruption_tables(rows: Sequence[dict]) -> list[str]:
    sections = []
    for metric, title in (("accuracy", "Accuracy"), ("ece", "ECE (15 bins)")):
        columns = [metric, *(f"shift{s}_{metric}" for s in SEVERITIES), f"shift_mean_{metric}"]
        headers = {"label": "method", metric: "clean", f"shift_mean_{metric}": "mean 1–5"}
        headers.update({f"shift{s}_{metric}": f"severity {s}" for s in SEVERITIES})
        sections.append(
            f"**{title}** under corruption\n\n"
            + common.table(labelled(rows), ("label",), columns, headers=headers)
        )
    return sections


def corruption_figure(rows: Sequence[dict], path):
    """Accuracy and ECE against severity (0 = clean), one line per method, mean ± std over
    seeds of the mean over corruption types."""
    fig, axes = common.figure(2, width=5.0, height=4.0)
    for i, (key, group) in enumerate(common.groups(labelled(rows), ("label",)).items()):
        for ax, metric in zip(axes, ("accuracy", "ece")):
            columns = [metric, *(f"shift{s}_{metric}" for s in SEVERITIES)]
            stats = [common.mean_std([r[c] for r in group]) for c in columns]
            ax.errorbar(
                range(len(columns)),
                [m for m, _ in stats],
                yerr=[sd for _, sd in stats],
                fmt="o-",
                color=f"C{i % 10}",
                capsize=3,
                label=key[0],
            )
    for ax, name in zip(axes, ("accuracy", "ECE (15 bins)")):
        ax.set_xticks(range(6), ["clean", "1", "2", "3", "4", "5"])
        ax.set(xlabel="corruption severity", ylabel=name)
        ax.set_title(f"{name} vs severity (mean over types; ± std over seeds)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return common.save(fig, path)


def ood_rows(rows: Sequence[dict]) -> list[dict]:
    """One row per (method, τ, score, seed), in table order, for the long OOD table and its
    figure; ``label`` names the method as the tables do."""
    out = []
    for row in labelled(rows):
        for score in SCORES:
            if score == "mutual_information" and row["num_members"] == 1:
                continue  # one member: MI is 0 for every input
            entry = {
                "method": row["method"],
                "temperature": row["temperature"],
                "label": row["label"],
                "score": score,
                "seed": row["seed"],
            }
            entry.update({m: row[f"ood_{score}_{m}"] for m in common.OOD_METRICS})
            out.append(entry)
    return out


def ood_figure(rows: Sequence[dict], path):
    """AUROC, AUPR and FPR95 per method, one bar per score (mean ± std over seeds)."""
    methods = list(dict.fromkeys(r["label"] for r in rows))
    fig, axes = common.figure(3, width=5.0)
    width = 0.8 / len(SCORES)
    for ax, metric in zip(axes, common.OOD_METRICS):
        for j, score in enumerate(SCORES):
            xs, means, stds = [], [], []
            for i, method in enumerate(methods):
                group = [r[metric] for r in rows if r["label"] == method and r["score"] == score]
                if group:
                    mean, std = common.mean_std(group)
                    xs.append(i + (j - 1) * width)
                    means.append(mean)
                    stds.append(std)
            ax.bar(xs, means, width, yerr=stds, capsize=2, label=score, color=f"C{j}")
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax.set(ylabel=metric.upper(), title=f"{metric.upper()}, Fashion-MNIST vs MNIST-5k")
        if metric == "auroc":
            ax.axhline(0.5, color="gray", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    return common.save(fig, path)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = common.parser(__doc__, out="methods")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--num-members", type=int, default=4)
    common.add_snens_flags(p)
    p.add_argument("--diversity-weight", type=float, default=0.1)
    p.add_argument("--corruptions", nargs="+", default=list(CORRUPTIONS), choices=CORRUPTIONS)
    p.add_argument("--corruption-examples", type=int, default=1000)
    p.add_argument("--corruption-seed", type=int, default=0)
    args = p.parse_args(argv)
    started = common.start(args)
    temperatures, selection = common.snens_temperatures(args)
    merge = common.merging(args, METHODS)
    data = common.load_data(args)
    shifted = common.corruption_loaders(
        data, args.corruptions, args.corruption_examples, args.corruption_seed
    )
    new = []
    for seed in args.seeds:
        for method in args.methods:
            for tau in temperatures if method == "snens" else [args.temperature]:
                row, _ = common.run(
                    method,
                    seed,
                    data,
                    args,
                    num_members=args.num_members,
                    temperature=tau,
                    diversity_weight=args.diversity_weight,
                    corruptions=shifted,
                    extra_scores=SCORES,
                )
                new.append(row)
                common.log_row(row, common.label(row))

    corruption = args.out_dir / "corruption"
    rows, kept = common.merged(new, corruption.with_suffix(".csv"), merge)
    taus = ", ".join(f"{t:g}" for t in temperatures)
    settings = (
        f"M={args.num_members}; σN-Ens τ ∈ {{{taus}}}, λ={args.diversity_weight}; "
        f"corruptions: {len(args.corruptions)} types × severities 1–5 on the first "
        f"{args.corruption_examples} test images, corruption seed {args.corruption_seed}"
        + (f". {selection}" if selection else "")
        + (f". {kept}" if kept else "")
    )
    footer = common.provenance(args, started, settings)

    common.write_csv(rows, corruption.with_suffix(".csv"))
    corruption_figure(rows, corruption.with_suffix(".png"))
    common.write_markdown(
        corruption.with_suffix(".md"),
        "Calibration under corruption (mean over corruption types per severity)",
        [
            *corruption_tables(rows),
            f"Corruption types: {', '.join(args.corruptions)}.",
            "![accuracy and ECE vs severity](corruption.png)",
        ],
        footer,
    )

    long = ood_rows(rows)
    ood = args.out_dir / "ood"
    common.write_csv(long, ood.with_suffix(".csv"))
    ood_figure(long, ood.with_suffix(".png"))
    common.write_markdown(
        ood.with_suffix(".md"),
        "OOD detection: Fashion-MNIST (in) vs MNIST-5k (out, positive)",
        [
            common.table(
                long,
                ("label", "score"),
                common.OOD_METRICS,
                headers={
                    "label": "method",
                    "auroc": "AUROC ↑",
                    "aupr": "AUPR ↑",
                    "fpr95": "FPR95 ↓",
                },
            ),
            "![AUROC / AUPR / FPR95 per method and score](ood.png)",
        ],
        footer,
    )
    return rows


if __name__ == "__main__":
    main()
