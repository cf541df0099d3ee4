"""Claim: σN-Ens quality improves or saturates as the number of members M grows, at ~1× the
parameters, where Packed-Ensembles (fixed total width α·C split M ways) collapse; a deep ensemble
pays M× the parameters.

Fashion-MNIST, SmallCNN, M ∈ {2, 4, 8, 16}: σN-Ens (τ=1, λ=0.1), Packed-Ensembles (α=2, γ=2)
and a deep ensemble, each trained through the engine (`snens.engine.train.train`) and scored with
`snens.evaluate`
(MNIST-5k as OOD). Width 8 by default so that M=16 fits the CPU budget. Writes one CSV row per
run, a mean ± std table and a figure (each metric against M).

As in methods.py, ``--snens-temperatures`` / ``--tau-from-sweep`` run σN-Ens at several τ (one
row each, "σN-Ens τ=…"), and ``--methods`` with a subset merges into the existing CSV (a run
(method, τ, M, seed) made again replaces its row; the single reference is run only where the CSV
lacks it).

    python experiments/m_scaling.py                      # CPU scale: 1159 s measured, 1 thread
    python experiments/m_scaling.py --members 2 4 8 16 --width 32 --train-examples 55000
    python experiments/m_scaling.py --methods snens --tau-from-sweep results/tau_sweep.csv
"""

from __future__ import annotations

import math
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
    "label": "method",
}
METHODS = ("snens", "packed", "deep_ensemble")


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = common.parser(__doc__, width=8, out="m_scaling")
    p.add_argument("--members", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    common.add_snens_flags(p)
    p.add_argument("--diversity-weight", type=float, default=0.1)
    args = p.parse_args(argv)
    started = common.start(args)
    temperatures, selection = common.snens_temperatures(args)
    merge = common.merging(args, METHODS)
    out = args.out_dir / args.name
    old = (
        common.read_csv(out.with_suffix(".csv"))
        if merge and out.with_suffix(".csv").exists()
        else []
    )
    have_single = {r["seed"] for r in old if r["method"] == "single"}
    data = common.load_data(args)
    new = []
    for seed in args.seeds:
        if seed not in have_single:
            single, _ = common.run("single", seed, data, args)
            new.append(single)
            common.log_row(single, "single")
        for M in args.members:
            for method in args.methods:
                for tau in temperatures if method == "snens" else [args.temperature]:
                    row, _ = common.run(
                        method,
                        seed,
                        data,
                        args,
                        num_members=M,
                        temperature=tau,
                        diversity_weight=args.diversity_weight,
                    )
                    new.append(row)
                    common.log_row(row, f"{common.label(row)} M={M}")
    rows, kept = common.merged(new, out.with_suffix(".csv"), merge)
    common.write_csv(rows, out.with_suffix(".csv"))
    order = {m: i for i, m in enumerate(("single", *METHODS))}

    def rank(r: dict) -> tuple:
        tau = float(r.get("temperature", math.nan))
        return (order[r["method"]], 0.0 if math.isnan(tau) else tau, r["num_members"])

    ranked = [{**r, "label": common.label(r)} for r in sorted(rows, key=rank)]
    ensembles = [r for r in ranked if r["method"] != "single"]
    common.line_panels(
        ensembles,
        out.with_suffix(".png"),
        x="num_members",
        panels=("accuracy", "nll", "ece", "ood_msp_auroc", "params"),
        group="label",
        logx=True,
        labels=LABELS,
        decorate=_single_line(rows),
    )
    text = common.table(
        ranked,
        ("label", "num_members"),
        COLUMNS,
        headers=LABELS,
        digits={"params": 0, "train_seconds": 1},
    )
    taus = ", ".join(f"{t:g}" for t in temperatures)
    common.write_markdown(
        out.with_suffix(".md"),
        "Scaling with M: σN-Ens vs Packed-Ensembles vs deep ensemble",
        [text, f"![metrics against M]({out.name}.png)"],
        common.provenance(
            args,
            started,
            f"σN-Ens τ ∈ {{{taus}}}, λ={args.diversity_weight}; Packed α=2, γ=2"
            + (f". {selection}" if selection else "")
            + (f". {kept}" if kept else ""),
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
