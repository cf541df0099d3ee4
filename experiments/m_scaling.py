"""Claim: σN-Ens quality improves or saturates as the number of members M grows, at ~1× the
parameters, where Packed-Ensembles (fixed total width α·C split M ways) collapse; a deep ensemble
pays M× the parameters.

Fashion-MNIST, SmallCNN, M ∈ {2, 4, 8, 16}: σN-Ens (τ=1, λ=0.1), Packed-Ensembles (α=2, γ=2)
and a deep ensemble, each trained with `snens.train.fit` and scored with `snens.evaluate`
(MNIST-5k as OOD). Width 8 by default so that M=16 fits the CPU budget. Writes one CSV row per
run, a mean ± std table and a figure (each metric against M).

    python experiments/m_scaling.py                      # CPU scale: 1159 s measured, 1 thread
    python experiments/m_scaling.py --members 2 4 8 16 --width 32 --train-examples 60000
"""

from __future__ import annotations

from collections.abc import Sequence

import common

COLUMNS = (
    "accuracy",
    "nll",
    "ece",
    "ood_msp_auroc",
    "disagreement",
    "params",
    "train_seconds",
)
LABELS = {
    "num_members": "M",
    "ood_msp_auroc": "OOD AUROC (MSP)",
    "train_seconds": "train s",
    "params": "params",
}
METHODS = ("snens", "packed", "deep_ensemble")


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = common.parser(__doc__, width=8, out="m_scaling")
    p.add_argument("--members", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--diversity-weight", type=float, default=0.1)
    args = p.parse_args(argv)
    started = common.start(args)
    data = common.load_data(args)
    rows = []
    for seed in args.seeds:
        single, _ = common.run("single", seed, data, args)
        rows.append(single)
        common.log_row(single, "single")
        for M in args.members:
            for method in args.methods:
                row, _ = common.run(
                    method,
                    seed,
                    data,
                    args,
                    num_members=M,
                    temperature=args.temperature,
                    diversity_weight=args.diversity_weight,
                )
                rows.append(row)
                common.log_row(row, f"{method} M={M}")
    out = args.out_dir / args.name
    common.write_csv(rows, out.with_suffix(".csv"))
    ensembles = [r for r in rows if r["method"] != "single"]
    common.line_panels(
        ensembles,
        out.with_suffix(".png"),
        x="num_members",
        panels=("accuracy", "nll", "ece", "ood_msp_auroc", "params"),
        logx=True,
        labels=LABELS,
        decorate=_single_line(rows),
    )
    order = {m: i for i, m in enumerate(("single", *args.methods))}
    ranked = sorted(rows, key=lambda r: (order[r["method"]], r["num_members"]))
    text = common.table(
        ranked,
        ("method", "num_members"),
        COLUMNS,
        headers=LABELS,
        digits={"params": 0, "train_seconds": 1},
    )
    common.write_markdown(
        out.with_suffix(".md"),
        "Scaling with M: σN-Ens vs Packed-Ensembles vs deep ensemble",
        [text, f"![metrics against M]({out.name}.png)"],
        common.provenance(
            args,
            started,
            f"σN-Ens τ={args.temperature}, λ={args.diversity_weight}; Packed α=2, γ=2",
        ),
    )
    return rows


def _single_line(rows: Sequence[dict]):
    """Draw the single model's mean as a horizontal reference line on every panel."""
    single = [r for r in rows if r["method"] == "single"]

    def decorate(ax, metric: str) -> None:
        mean, _ = common.mean_std([r[metric] for r in single])
        ax.axhline(mean, color="gray", linestyle=":", label="single model")
        if metric == "params":
            ax.set_yscale("log")

    return decorate


if __name__ == "__main__":
    main()
