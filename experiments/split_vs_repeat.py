"""Claim: training σN-Ens with `split` inputs (member m sees its own B/M slice of the batch) costs
about one model's compute per step instead of M×; whether quality holds is the open question
 — the regularizer acts on parameters, so it still applies.

Fashion-MNIST, SmallCNN, σN-Ens M=4 (τ=1, λ=0.1), trained with `input_policy="repeat"` and
`"split"` at the same batch size, epochs and learning rate (so split gives each member 1/M of the
examples), scored with `snens.evaluate` (evaluation always repeats). Cost: train seconds per
epoch of each run, and the median time of one training step (forward, loss, backward, AdamW) of
repeat, split and a single model at the same batch, interleaved. Writes one CSV row per run, a
mean ± std table and a figure.

    python experiments/split_vs_repeat.py               # CPU scale: 156 s measured, 1 thread
    python experiments/split_vs_repeat.py --train-examples 60000 --epochs 10 --width 32
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import common
import torch

import snens
from snens.baselines import SingleModel
from snens.method.optim import param_groups

POLICIES = ("repeat", "split")
COLUMNS = (
    "accuracy",
    "nll",
    "ece",
    "ood_msp_auroc",
    "effective_members",
    "disagreement",
    "seconds_per_epoch",
)
LABELS = {
    "input_policy": "inputs",
    "ood_msp_auroc": "OOD AUROC (MSP)",
    "effective_members": "effective members",
    "seconds_per_epoch": "train s / epoch",
}


def step_times(args, data: common.Data, steps: int, warmup: int = 3) -> dict[str, list[float]]:
    """Seconds of each training step for single, repeat and split, interleaved step by step so
    that other load on the machine hits all three alike."""
    x, y = next(iter(common.train_loader(data, args, seed=0)))
    models = {"single": common.build("single", num_members=1, width=args.width, seed=0)}
    for policy in POLICIES:
        models[policy] = common.build(
            "snens", num_members=args.num_members, width=args.width, seed=0, input_policy=policy
        )
    optimizers = {k: torch.optim.AdamW(param_groups(m, args.lr)) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    for i in range(warmup + steps):
        for name, model in models.items():
            model.train()
            t = time.perf_counter()
            loss = snens.ensemble_loss(model(x), y)
            if not isinstance(model, SingleModel):
                loss = loss + snens.diversity_loss(model, temperature=1.0, weight=0.1)
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            optimizers[name].step()
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    return times


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = common.parser(__doc__, out="split_vs_repeat")
    p.add_argument("--num-members", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--diversity-weight", type=float, default=0.1)
    p.add_argument("--timing-steps", type=int, default=20)
    args = p.parse_args(argv)
    started = common.start(args)
    data = common.load_data(args)
    rows = []
    for seed in args.seeds:
        for policy in POLICIES:
            row, _ = common.run(
                "snens",
                seed,
                data,
                args,
                num_members=args.num_members,
                temperature=args.temperature,
                diversity_weight=args.diversity_weight,
                input_policy=policy,
            )
            row["input_policy"] = policy
            rows.append(row)
            common.log_row(row, policy)
    times = step_times(args, data, args.timing_steps)
    median = {k: statistics.median(v) for k, v in times.items()}
    for row in rows:
        row["step_ms_median"] = 1000 * median[row["input_policy"]]
        row["step_ratio_to_repeat"] = median[row["input_policy"]] / median["repeat"]
        row["step_ratio_to_single"] = median[row["input_policy"]] / median["single"]

    out = args.out_dir / args.name
    common.write_csv(rows, out.with_suffix(".csv"))
    common.line_panels(
        rows,
        out.with_suffix(".png"),
        x="input_policy",
        panels=("accuracy", "nll", "ece", "ood_msp_auroc", "seconds_per_epoch"),
        group=None,
        labels=LABELS,
    )
    spread = {k: (1000 * min(v), 1000 * max(v)) for k, v in times.items()}
    cost = "\n".join(
        [
            f"| step at batch {args.batch_size} | median ms | min–max ms | vs repeat | vs single |",
            "|---|---|---|---|---|",
            *(
                f"| {k} | {1000 * median[k]:.1f} | {spread[k][0]:.1f}–{spread[k][1]:.1f} | "
                f"{median[k] / median['repeat']:.2f}× | {median[k] / median['single']:.2f}× |"
                for k in ("single", *POLICIES)
            ),
        ]
    )
    common.write_markdown(
        out.with_suffix(".md"),
        f"split vs repeat training inputs: σN-Ens M={args.num_members}",
        [
            common.table(rows, ("input_policy",), COLUMNS, headers=LABELS),
            f"Step time ({args.timing_steps} steps after 3 warm-up, the three interleaved):\n\n"
            + cost,
            f"![quality and cost of split vs repeat]({out.name}.png)",
        ],
        common.provenance(args, started, f"τ={args.temperature}, λ={args.diversity_weight}"),
    )
    return rows


if __name__ == "__main__":
    main()
