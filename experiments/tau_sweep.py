"""Claim: τ selects the sharing — lower τ gives fewer effective members per feature and more
disagreement, tracing the accuracy–calibration frontier; what training realizes is measured
next to the regularizer's optimum k*(τ), never assumed.

Fashion-MNIST (CPU stand-in for CIFAR-10), SmallCNN, σN-Ens M=4, λ=0.1, γ at 30× the learning
rate, a grid of τ and seeds; each run trains through the engine (`snens.engine.train.train`) and is
scored with `snens.evaluate` (MNIST-5k as OOD). Writes one CSV row per run, a mean ± std table
and a figure (accuracy vs NLL and vs ECE over τ; effective members vs k*(τ)).

Every run is also scored on the validation split (the last 5 000 Fashion-MNIST training images,
disjoint from the training subset); τ* is the τ of the lowest mean validation NLL over seeds,
chosen without the test set, for the method comparisons to use.

    python experiments/tau_sweep.py                      # CPU scale: 340 s measured, 1 thread
    python experiments/tau_sweep.py --train-examples 55000 --epochs 10 --width 32
"""

from __future__ import annotations

from collections.abc import Sequence

import common
import numpy as np

import snens

COLUMNS = (
    "k_star",
    "effective_members",
    "disagreement",
    "mutual_information",
    "accuracy",
    "nll",
    "ece",
    "ood_msp_auroc",
    "val_accuracy",
    "val_nll",
    "val_ece",
)
LABELS = {
    "temperature": "τ",
    "k_star": "k*(τ)",
    "effective_members": "effective members",
    "mutual_information": "MI",
    "ood_msp_auroc": "OOD AUROC (MSP)",
    "val_accuracy": "val accuracy",
    "val_nll": "val NLL",
    "val_ece": "val ECE",
}


def figure(rows: Sequence[dict], path, num_members: int):
    """Accuracy vs NLL and vs ECE (one point per run, coloured by τ); effective members vs τ."""
    fig, axes = common.figure(3)
    temperatures = list(dict.fromkeys(r["temperature"] for r in rows))
    for i, tau in enumerate(temperatures):
        group = [r for r in rows if r["temperature"] == tau]
        for ax, x in zip(axes[:2], ("nll", "ece")):
            ax.scatter(
                [r[x] for r in group],
                [r["accuracy"] for r in group],
                color=f"C{i}",
                edgecolor="black",
                linewidth=0.5,
                label=f"τ={tau:g}",
            )
    for ax, x in zip(axes[:2], ("NLL", "ECE")):
        ax.set(xlabel=f"{x} (lower is better)", ylabel="accuracy")
        ax.set_title(f"accuracy vs {x} over τ (each point: one seed)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[2]
    stats = [
        common.mean_std([r["effective_members"] for r in rows if r["temperature"] == t])
        for t in temperatures
    ]
    ax.errorbar(
        temperatures,
        [m for m, _ in stats],
        yerr=[s for _, s in stats],
        fmt="o-",
        capsize=3,
        label="measured (mean ± std over seeds)",
    )
    grid = np.geomspace(min(temperatures) / 2, max(temperatures) * 2, 200)
    ax.plot(grid, [snens.optimal_k(t, num_members) for t in grid], "--", label="k*(τ) optimum")
    ax.axhline(num_members, color="gray", linewidth=0.8)
    ax.axhline(1, color="gray", linewidth=0.8)
    ax.set_xscale("log")
    ax.set(xlabel="τ", ylabel="effective members per feature", ylim=(0, num_members + 0.3))
    ax.set_title(f"realized sharing vs k*(τ), M={num_members}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return common.save(fig, path)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = common.parser(__doc__, out="tau_sweep")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.05, 0.2, 0.5, 1, 5])
    p.add_argument("--num-members", type=int, default=4)
    p.add_argument("--diversity-weight", type=float, default=0.1)
    args = p.parse_args(argv)
    started = common.start(args)
    data = common.load_data(args)
    rows = []
    for seed in args.seeds:
        for tau in args.temperatures:
            row, _ = common.run(
                "snens",
                seed,
                data,
                args,
                num_members=args.num_members,
                temperature=tau,
                diversity_weight=args.diversity_weight,
            )
            rows.append(row)
            common.log_row(row, f"τ={tau:g}")
    out = args.out_dir / args.name
    common.write_csv(rows, out.with_suffix(".csv"))
    figure(rows, out.with_suffix(".png"), args.num_members)
    text = common.table(rows, ("temperature",), COLUMNS, headers=LABELS)
    sections = [text]
    if args.val_examples:
        tau_star = common.select_temperature(rows)
        print(f"τ selected on the validation split: τ*={tau_star:g}", flush=True)
        sections.append(
            f"**τ selected on the validation split: τ*={tau_star:g}** (lowest mean validation NLL "
            f"over seeds; validation = the last {args.val_examples} Fashion-MNIST training "
            "images, disjoint from the training subset; the test set plays no part in the choice)."
        )
    sections.append(f"![accuracy vs NLL / ECE over τ; effective members vs k*(τ)]({out.name}.png)")
    common.write_markdown(
        out.with_suffix(".md"),
        f"τ sweep: σN-Ens M={args.num_members}, λ={args.diversity_weight}",
        sections,
        common.provenance(args, started),
    )
    return rows


if __name__ == "__main__":
    main()
