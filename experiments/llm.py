"""Claim under test: fine-tuning a pretrained LLM through LoRA, σN-Ens over its RMSNorms gives
better NLL and calibration than one LoRA fine-tune and than a LoRA ensemble, at ~1× the memory
of one LoRA model — and with ``split`` inputs at one fine-tune's training compute.

Every run trains through the engine (:func:`snens.engine.sweep.plan` /
:func:`snens.engine.sweep.run_sweep`):
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
  ``split``), the LoRA ensemble (fair), MC-dropout on the LoRA path (fair), seed by seed
  (0, 1, 2). Every run's ``final.json``
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
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from snens.engine.presets import preset
from snens.engine.report import summarize
from snens.engine.runs import FINAL
from snens.engine.sweep import SweepRun, plan, run_sweep

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
        # MC-dropout on the LoRA path: the adapters' dropout (p = 0.05) left on in evaluation,
        # 4 samples; trained as one LoRA model
        Variant("mc_dropout_fair", ("method.name=mc_dropout", *FAIR)),
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


# ------------------------------------------------------------------------------------------------
# The prompted base model, untrained, and the report
# ------------------------------------------------------------------------------------------------


def zeroshot() -> Path:
    """Evaluate the prompted SmolLM2 before any fine-tuning (its label-word scores), on the
    study's test, validation and OOD sets: ``<out>/zeroshot/final.json`` and ``outputs.npz``."""
    import torch

    from snens.baselines import SingleModel
    from snens.engine.build import text_encoder
    from snens.engine.config import to_toml
    from snens.engine.datasets import build_data
    from snens.engine.reload import validation_metrics
    from snens.engine.runs import Run
    from snens.evaluation.protocol import evaluate, temperature_scaled_metrics
    from snens.models import create

    config = runs_of("final")[0][1].config  # the study's data; the model is never trained
    torch.set_num_threads(1)
    loaded = build_data(config.data, seed=0, device="cpu", encoder=text_encoder(config))
    model = SingleModel(create("smollm2", num_classes=2, lora=False)).eval()
    outputs: dict = {}
    metrics = evaluate(model, loaded.test, ood=loaded.ood, keep_logits=outputs)
    metrics.update(validation_metrics(model, loaded.validation, keep_logits=outputs))
    metrics.update(temperature_scaled_metrics(outputs))
    path = WHERE["out"] / "zeroshot"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(to_toml(config))
    run = Run(path, config)
    run.write_outputs(outputs)
    run.write_final(
        {"metrics": metrics, "model": {"params": sum(p.numel() for p in model.parameters())}}
    )
    return path


#: The report's rows: (label, stage, variant); and its columns: (header, metric key).
ROWS = (
    ("prompted base model, untrained (zero-shot)", None, "zeroshot"),
    ("one LoRA model", "final", "single"),
    ("one LoRA model, norms trainable (fair)", "final", "single_fair"),
    ("LoRA ensemble, M=4, norms trainable (fair)", "final", "lora_ensemble_fair"),
    ("MC-dropout on LoRA, 4 samples, norms trainable (fair)", "final", "mc_dropout_fair"),
    ("σN-Ens-LoRA, τ=5 λ=0.01 (preset)", "final", "snens"),
    ("σN-Ens-LoRA, τ=5 λ=0.01, split", "final", "snens_split"),
    ("σN-Ens-LoRA, τ=1 λ=0.1 (library defaults)", "tune", "snens_defaults"),
    ("σN-Ens-LoRA, γ ×1", "tune", "snens_gamma1"),
    ("σN-Ens-LoRA, λ=0", "tune", "snens_lambda0"),
)
COLUMNS = (
    ("val NLL", "val/nll"),
    ("acc", "test/accuracy"),
    ("NLL", "test/nll"),
    ("ECE", "test/ece"),
    ("Brier", "test/brier"),
    ("NLL +TS", "test_ts/nll"),
    ("ECE +TS", "test_ts/ece"),
    ("OOD AUROC (MSP)", "ood/rt_plots/auroc"),
    ("disagr.", "test/disagreement"),
)


def _runs(stage: str | None, variant: str) -> list[Path]:
    if stage is None:
        where = WHERE["out"] / variant
        return [where] if (where / FINAL).is_file() else []
    return sorted(p.parent for p in (WHERE["out"] / stage / variant).glob(f"seed=*/{FINAL}"))


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    mean, std, n = summarize(values)
    return f"{mean:.3f}" if n == 1 else f"{mean:.3f} ± {std:.3f}"


def report() -> Path:
    """``results/llm.md``: the study's table from the finished runs (mean ± std over seeds)."""
    header = ["run", "seeds", *(c for c, _ in COLUMNS), "train s", "trainable params"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, stage, variant in ROWS:
        paths = _runs(stage, variant)
        if not paths:
            continue
        finals = [json.loads((p / FINAL).read_text()) for p in paths]
        seeds = " ".join(p.name.removeprefix("seed=") for p in paths) if stage else "—"
        values = {
            key: [f["metrics"][key] for f in finals if key in f["metrics"]] for _, key in COLUMNS
        }
        cells = [_cell(values[key]) for _, key in COLUMNS]

        seconds = [f["train"]["seconds"] for f in finals if "train" in f]
        params = {f["model"].get("trainable_params") for f in finals}
        trained = f"{params.pop():,}" if len(params) == 1 and None not in params else "—"
        train_s = f"{summarize(seconds)[0]:,.0f}" if seconds else "0"
        lines.append(f"| {label} | {seeds} | " + " | ".join(cells) + f" | {train_s} | {trained} |")
    text = "\n".join(
        [
            "# σN-Ens on a pretrained LLM: SmolLM2-135M-Instruct + LoRA on Rotten Tomatoes",
            "",
            "Made by `python experiments/llm.py report` from the run directories under",
            "`results/llm/` (each holds its config, provenance, per-epoch metrics, `final.json`",
            "and the member logits `outputs.npz`). Mean ± std over the seeds listed; test set",
            "1,000 reviews, validation 500 held-out training reviews (temperature scaling, +TS,",
            "is fitted there), OOD 500 plot descriptions of the same corpus. One torch thread.",
            "",
            *lines,
            "",
        ]
    )
    out = WHERE["out"].parent / "llm.md"
    out.write_text(text)
    return out


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
    sub.add_parser("zeroshot", help="evaluate the prompted base model, untrained")
    sub.add_parser("report", help="write results/llm.md from the finished runs")
    args = parser.parse_args(argv)
    WHERE.update(out=args.out.resolve(), extra=tuple(args.set))
    os.chdir(ROOT)
    if args.command == "run":
        return run(args.stage)
    if args.command == "zeroshot":
        print(zeroshot())
        return 0
    if args.command == "report":
        print(report().read_text())
        return 0
    for stage in STAGES:
        for variant, sweep_run in runs_of(stage):
            path = sweep_run.path()
            status = "done" if (path / FINAL).is_file() else "started" if path.is_dir() else "todo"
            print(f"{stage:6s} {variant.name:22s} {sweep_run.name:8s} {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
