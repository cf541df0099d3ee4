"""Claim: results are insensitive to the diversity weight λ once training has converged; τ is the
knob (the paper's finding).

Fashion-MNIST, SmallCNN, σN-Ens M=4 at a fixed τ, λ over two orders of magnitude, with the
unregularized model (λ=0) as a reference; each run trains through the engine
(`snens.engine.train.train`) and is scored
with `snens.evaluate` (MNIST-5k as OOD). Writes one CSV row per run, a mean ± std table and a
figure (each metric against λ).

    python experiments/lambda_sensitivity.py            # CPU scale: 446 s measured, 1 thread
    python experiments/lambda_sensitivity.py --weights 0.01 0.03 0.1 0.3 1 --epochs 10
"""

from __future__ import annotations

from collections.abc import Sequence

import common

COLUMNS = (
    "effective_members",
    "disagreement",
    "accuracy",
    "nll",
    "ece",
    "ood_msp_auroc",
)
LABELS = {
    "diversity_weight": "λ",
    "effective_members": "effective members",
    "ood_msp_auroc": "OOD AUROC (MSP)",
}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = common.parser(__doc__, out="lambda_sensitivity")
    p.add_argument("--weights", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--num-members", type=int, default=4)
    p.add_argument("--no-reference", action="store_true", help="skip the λ=0 runs")
    args = p.parse_args(argv)
    started = common.start(args)
    data = common.load_data(args)
    weights = ([] if args.no_reference else [0.0]) + list(args.weights)
    rows = []
    for seed in args.seeds:
        for weight in weights:
            row, _ = common.run(
                "snens",
                seed,
                data,
                args,
                num_members=args.num_members,
                temperature=args.temperature,
                diversity_weight=weight,
            )
            rows.append(row)
            common.log_row(row, f"λ={weight:g}")
    out = args.out_dir / args.name
    common.write_csv(rows, out.with_suffix(".csv"))
    swept = [r for r in rows if r["diversity_weight"] > 0]
    reference = [r for r in rows if r["diversity_weight"] == 0]

    def decorate(ax, metric: str) -> None:
        if reference:
            mean, _ = common.mean_std([r[metric] for r in reference])
            ax.axhline(mean, color="gray", linestyle=":", label="λ=0 (no regularizer)")

    common.line_panels(
        swept,
        out.with_suffix(".png"),
        x="diversity_weight",
        panels=("accuracy", "nll", "ece", "effective_members", "disagreement"),
        group=None,
        logx=True,
        labels=LABELS,
        decorate=decorate,
    )
    text = common.table(rows, ("diversity_weight",), COLUMNS, headers=LABELS)
    common.write_markdown(
        out.with_suffix(".md"),
        f"λ sensitivity: σN-Ens M={args.num_members}, τ={args.temperature}",
        [text, f"![metrics against λ]({out.name}.png)"],
        common.provenance(args, started, f"τ={args.temperature}; λ=0 is the reference row"),
    )
    return rows


if __name__ == "__main__":
    main()
