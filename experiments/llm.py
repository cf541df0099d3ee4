"""Claim under test: fine-tuning a pretrained LLM through LoRA, σN-Ens over its RMSNorms gives
better NLL and calibration than one LoRA fine-tune and than a LoRA ensemble, at ~1× the memory
of one LoRA model — and with ``split`` inputs at one fine-tune's training compute.

Every run trains through the engine (:func:`snens.sweep.plan` / :func:`snens.sweep.run_sweep`):
preset ``rotten_tomatoes_smollm2`` — SmolLM2-135M-Instruct read after the prompt
"Review: {text}\\nSentiment:", its next-token scores of " negative" / " positive" as the class
scores, LoRA r=8, α=16 on q_proj/v_proj, 1,000 Rotten Tomatoes reviews of ≤ 64 tokens, 2
epochs of AdamW 3e-4 (cosine), batch 16 — with 500 further training reviews held out as the
validation split (choices and temperature scaling are read there, never on the test set),
1,000 test reviews, 500 plot descriptions of the same corpus as OOD, one torch thread.

Fair baselines: σN-Ens trains every RMSNorm's member scale, which one LoRA model does not;
tuning norm scales alone is a known fine-tuning method, so the single model and the LoRA
ensemble are run both ways — ``*_fair`` with the RMSNorm scales trainable at the same learning
rate (``model.options.train_norms``), and plain. The LoRA ensemble is the field's deep-ensemble
baseline: M independent adapters (and heads) over the same frozen base, each under its own seed.

Stages (each run's directory: ``results/llm/<stage>/<variant>/seed=<s>/``):

* ``final`` — one LoRA model (plain and fair), σN-Ens at the preset's recipe (``repeat`` and
  ``split``), the LoRA ensemble (fair), seed by seed (0, 1, 2). Every run's ``final.json``
  holds the test metrics after temperature scaling fitted on the validation split
  (``test_ts/…``), and ``outputs.npz`` the member logits.
* ``tune`` — σN-Ens recipes on the validation split, seed 0: the library's defaults (τ=1,
  λ=0.1), γ at ×1, λ=0 (member norms without the regularizer), and the regularizer on the last
  ten blocks' norms only.

Resumable and parallel, as the converged study: run the same command in two processes; each
takes the next run nobody trains (``run.lock``); a finished run is skipped, an interrupted one
resumes from its ``last.pt``. Checkpoints (a copy of the 135 M base each) are not committed.

    OMP_NUM_THREADS=1 python experiments/llm.py run &     # two of these share the queue
    python experiments/llm.py zeroshot                    # the prompted base model, untrained
    python experiments/llm.py report                      # results/llm.md
    python experiments/llm.py plan                        # the runs and their status
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from snens.presets import preset
from snens.runs import FINAL
from snens.sweep import SweepRun, plan, run_sweep

ROOT = Path(__file__).resolve().parent.parent
WHERE = {"out": ROOT / "results" / "llm", "extra": ()}
PRESET = "rotten_tomatoes_smollm2"

#: What every run shares (``--set`` syntax, over the preset).
BASE = ("data.validation_examples=500", "threads=1")
SINGLE = ("method.name=single", "method.num_members=1")
FAIR = ("model.options.train_norms=true",)
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]
    seeds: tuple[int, ...] = SEEDS


STAGES: dict[str, list[Variant]] = {
    "final": [
        Variant("single_fair", (*SINGLE, *FAIR)),
        Variant("snens", ()),
        Variant("snens_split", ("method.input_policy=split",)),
        Variant("single", SINGLE),
        Variant("lora_ensemble_fair", ("method.name=deep_ensemble", *FAIR)),
    ],
    "tune": [
        Variant("snens_defaults", ("method.temperature=1.0", "method.diversity_weight=0.1"), (0,)),
        Variant("snens_gamma1", ("method.gamma_lr_multiplier=1.0",), (0,)),
        Variant("snens_lambda0", ("method.diversity_weight=0.0",), (0,)),
    ],
}


def runs_of(stage: str) -> list[tuple[Variant, SweepRun]]:
    """Every run of a stage, its config built and checked (nothing is written)."""
    out = []
    for variant in STAGES[stage]:
        grid = [f"seed={','.join(str(s) for s in variant.seeds)}"]
        for run in plan(
            preset(PRESET),
            grid,
            WHERE["out"] / stage / variant.name,
            overrides=(*BASE, *variant.overrides, *WHERE["extra"]),
        ):
            out.append((variant, run))
    order = [v.name for v in STAGES[stage]]
    # seed by seed: a whole seed's table before the next seed's
    out.sort(key=lambda item: (item[1].config.seed, order.index(item[0].name)))
    return out


def run(stages: Sequence[str]) -> int:
    """Train every unfinished run of ``stages``, seed by seed (seed 0 of every stage first);
    two processes share the queue."""
    queue = [(stage, v, r) for stage in stages for v, r in runs_of(stage)]
    queue.sort(key=lambda item: (item[2].config.seed, stages.index(item[0])))
    seeds: dict[tuple[str, str], list[SweepRun]] = {}
    for stage, variant, sweep_run in queue:
        seeds.setdefault((stage, variant.name), []).append(sweep_run)
    failed = 0
    for stage, variant, sweep_run in queue:
        path = sweep_run.path()
        if (path / FINAL).is_file():
            continue
        print(f"== {stage}/{variant.name}/{sweep_run.name}", flush=True)
        table = seeds[(stage, variant.name)]
        result = run_sweep([sweep_run], path.parent, keys=("seed",), table=table)
        failed += len(result.failed)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=WHERE["out"], help="the study's directory")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="over every run"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="train the stages' runs not yet done")
    run_parser.add_argument("--stage", nargs="+", choices=list(STAGES), default=list(STAGES))
    sub.add_parser("plan", help="list the runs and their status")
    args = parser.parse_args(argv)
    WHERE.update(out=args.out.resolve(), extra=tuple(args.set))
    os.chdir(ROOT)
    if args.command == "run":
        return run(args.stage)
    for stage in STAGES:
        for variant, sweep_run in runs_of(stage):
            path = sweep_run.path()
            status = "done" if (path / FINAL).is_file() else "started" if path.is_dir() else "todo"
            print(f"{stage:6s} {variant.name:22s} {sweep_run.name:8s} {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
