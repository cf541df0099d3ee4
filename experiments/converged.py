"""Claim under test: trained to a converged budget, σN-Ens beats a single model and approaches
a deep ensemble (NLL, accuracy, calibration under corruption) at ≈ 1× its parameters.

Every run trains through the engine (:func:`snens.engine.sweep.plan` /
:func:`snens.engine.sweep.run_sweep`, so :func:`snens.engine.train.train`): preset
``fashion_mnist_small_cnn`` on all of Fashion-MNIST, the last 5,000 training images held out as
the validation split (``data.validation_examples``) and evaluated after every epoch (the
learning curves in ``metrics.jsonl``), the 10,000 test images, MNIST-5k as OOD, 4 corruptions ×
5 severities on the first 1,000 test images, one torch thread per process. Choices are made on
the validation split only, never the test set.

Stages (each run's directory: ``results/converged/<stage>/<variant>/seed=<s>/``):

* ``budget``  — the single model at 5, 10, 20, 40 and 80 epochs (cosine schedule to the end);
  the converged budget is the fewest epochs whose validation NLL is within 0.005 of the best.
* ``ablation`` — σN-Ens variants at 10 epochs, seed 0: λ, τ up to 50, head initialization, a
  ramp of the regularizer, γ's learning-rate multiplier and initial spread, weight decay on
  the member norms' affine, the regularizer on one stage only, M=2, ``split`` inputs at
  the compute of one model (4× the epochs); with the single model and the deep ensemble at
  the same budget for reference (the single model's is ``budget/single_e10``).
* ``overfit`` — where ensembles pay: 10,000 training images, no augmentation, width 32, 20
  epochs (the single model's validation NLL bottoms at epoch 5 and rises after); single, deep
  ensemble, BatchEnsemble, Packed-Ensembles, MC-dropout and σN-Ens (τ=1 and τ=5 at λ=0.1,
  repeat and split) over seeds 0, 1, 2, the other σN-Ens variants at seed 0.
* ``text``, ``vision`` — two more domains, pretrained and fine-tuned with the library's
  defaults (nothing chosen there): MiniLM-L6 on Rotten Tomatoes, MobileNetV2 (ImageNet) on
  Fashion-MNIST at 48 px RGB; single, deep ensemble, σN-Ens, MC-dropout, seeds 0, 1, 2.
* ``vision_tune`` — the pretrained CNN's σN-Ens recipe, chosen on a validation split (the
  last 1,000 Fashion-MNIST training images; the 5,000 training images are ``vision``'s): γ's
  learning-rate multiplier (1, 3, the preset's 10), λ (0, 0.01, 0.1) and τ=5, seed 0, with the
  single model for reference; its winner (lowest validation NLL) joins ``vision`` as
  ``<its name>_chosen`` over seeds 0, 1, 2, trained and tested like the others.
* ``text_tune`` — the same for the pretrained transformer (1,000 of the training texts held
  out; the 2,000 trained on are drawn from the rest): γ's multiplier (10, the preset's 50,
  150), λ (0, 0.01, 0.1) and τ=5, seed 0, with the single model; a winner other than the
  defaults joins ``text`` as ``<its name>_chosen`` over seeds 0, 1, 2.
* ``width`` — widths 32 and 64 on all the data at 10 epochs: single, deep ensemble, σN-Ens;
  seed 0, and at width 64 (where the gap to one model is narrowest) seeds 1 and 2 after it.
* ``final`` — single, deep ensemble, BatchEnsemble, Packed-Ensembles, MC-dropout, σN-Ens at
  the defaults and the ablation's σN-Ens winner (lowest validation NLL) at the converged
  budget (at most 40 epochs), seeds 0, 1, 2, seed by seed; its runs exist once ``ablation``
  has finished and the budget runs have decided its length.
* ``posthoc`` — σN-Ens converted from ``final``'s trained single model and fine-tuned 4 more
  epochs (learning rate 3e-4 / 1e-3, τ=5 λ=0.01, fresh member heads, γ at ×3; chosen on validation,
  seed 0), the winner over seeds 0, 1, 2 from each seed's single model, next to the single
  model trained the same 4 epochs more.

Resumable and parallel: run the same command in two processes; each takes the next run
nobody trains (the engine's ``run.lock``, an ``flock`` the kernel drops when its process
ends, however it ends); a finished run (``final.json``) is skipped; an interrupted one resumes
from its ``last.pt``. Checkpoints and locks are not committed (``.gitignore``), the rest of
each run directory is.

    OMP_NUM_THREADS=1 python experiments/converged.py run &      # every stage, in order
    OMP_NUM_THREADS=1 python experiments/converged.py run &      # a second process
    python experiments/converged.py report      # results/converged.md and figures
    python experiments/converged.py plan        # the runs and their status, nothing trains
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import study
from study import Variant, plan_variant

from snens import files
from snens.engine.report import summarize, write_report
from snens.engine.runs import FINAL, read_metrics
from snens.engine.sweep import SweepRun

ROOT = Path(__file__).resolve().parent.parent
#: Where the study lives, and ``--set`` values over every run (``--out``, ``--set``: a smaller
#: copy of the study, e.g. for the smoke test).
WHERE = {"out": ROOT / "results" / "converged", "extra": ()}

#: What every run of the study shares (``--set`` syntax, over the preset).
BASE = (
    "data.train_examples=0",
    "data.validation_examples=5000",
    "data.test_examples=0",
    "threads=1",
    # τ and λ pinned: they change nothing outside σN-Ens, whose variants all set their own,
    # and keep the runs' configs whatever the library's defaults become
    "method.temperature=1.0",
    "method.diversity_weight=0.1",
    # and the rest of the recipe and what is measured, likewise
    "method.input_policy=repeat",
    "method.gamma_lr_multiplier=30.0",
    'data.ood_scores=["max_logit", "energy"]',
)
ABLATION_EPOCHS = 10
BUDGET_EPOCHS = (5, 10, 20, 40, 80)
#: The final comparison's budget at most: σN-Ens and the deep ensemble at 80 epochs of the full
#: set take ~1 h each on one core, ×3 seeds ×6 methods; where the single model still improves
#: past 40, the report says so.
FINAL_MAX_EPOCHS = 40
#: Validation NLL within this of the best counts as converged (one seed's noise is ~0.005).
CONVERGED_WITHIN = 0.005

SINGLE = ("method.name=single", "method.num_members=1")

#: The evaluation protocol of the stages with test tables (:data:`TEST_STAGES`): every method
#: evaluated at its best validation epoch (a deep ensemble's members each at their own), the
#: same selection for all.
PROTOCOL = ("optim.select=nll",)
#: σN-Ens with each member on its own quarter of every batch (one model's training compute),
#: τ=5 and λ=0.01: the LLM study's recipe, tried as the one default in every regime.
SPLIT_RECIPE = ("method.input_policy=split",)


def _snens(tau: float, lam: float, *extra: str) -> tuple[str, ...]:
    return (
        "method.name=snens",
        f"method.temperature={tau}",
        f"method.diversity_weight={lam}",
        *extra,
    )


#: What the fine-tunes of pretrained models share: 3 epochs, τ and λ pinned as in BASE.
FINETUNE = (
    "threads=1",
    "optim.epochs=3",
    "method.temperature=1.0",
    "method.diversity_weight=0.1",
    "method.input_policy=repeat",
    'data.ood_scores=["max_logit", "energy"]',
)
#: A second domain, so the recipe is not tuned to one data set: pretrained MiniLM-L6 fine-tuned
#: (every weight) on 2,000 Rotten Tomatoes reviews for 3 epochs, the preset's recipe (AdamW
#: 1e-4, M=4); test on 1,000 reviews, OOD the corpus' plot descriptions. No validation split
#: here (``text_tune`` has one): the 2,000 reviews are drawn from all the training texts.
TEXT = "rotten_tomatoes_minilm"
TEXT_BASE = (
    *FINETUNE,
    # 1,000 training texts held out (as text_tune's): every run is selected on them
    "data.validation_examples=1000",
    # γ pinned at the ×50 these runs were made with, whatever the preset's default becomes
    "method.gamma_lr_multiplier=50.0",
)

#: ... and a pretrained CNN: MobileNetV2 with ImageNet weights fine-tuned (every weight) on
#: 5,000 Fashion-MNIST images at 48 px RGB for 3 epochs, the preset's recipe (AdamW 5e-4, γ at
#: ×10, M=4); test on 1,000 images, OOD 1,000 MNIST-5k digits, 4 corruptions × 5 severities
#: on 500 test images. No validation split either: the defaults are tested.
VISION = "fashion_mnist_mobilenet_v2"
VISION_BASE = (
    *FINETUNE,
    # 1,000 training images held out (as vision_tune's): every run is selected on them
    "data.validation_examples=1000",
    # γ pinned at the ×10 these runs were made with, whatever the preset's default becomes
    "method.gamma_lr_multiplier=10.0",
    "data.corruptions=true",
    'data.corruption_names=["gaussian_noise", "defocus_blur", "contrast", "pixelate"]',
    "data.corruption_examples=500",
)


#: SmallCNN's member norms by stage, as the ensemble names them (``--set`` list syntax).
_STAGE1 = '["model.stage1.0.1", "model.stage1.1.1"]'
_STAGE3 = '["model.stage3.0.1", "model.stage3.1.1"]'


def _tune_stage(preset_name: str, gamma_multipliers: Sequence[float]) -> list[Variant]:
    """One model and σN-Ens at the preset's recipe, at other γ multipliers, at λ 0.01 and 0,
    and at τ=5 λ=0.01, seed 0, with 1,000 training examples held out as validation."""
    held = "data.validation_examples=1000"
    snens = ("method.name=snens",)
    recipes = [
        ("single", SINGLE),
        ("snens_default", snens),
        *(
            (f"snens_glr{g}", (*snens, f"method.gamma_lr_multiplier={g}"))
            for g in gamma_multipliers
        ),
        ("snens_lam0.01", _snens(1, 0.01)),
        ("snens_tau5_lam0.01", _snens(5, 0.01)),
        ("snens_lam0", _snens(1, 0)),
    ]
    return [Variant(name, (held, *overrides), preset=preset_name) for name, overrides in recipes]


def _stages() -> dict[str, list[Variant]]:
    epochs = f"optim.epochs={ABLATION_EPOCHS}"
    ablation = [
        Variant("deep_ensemble", ("method.name=deep_ensemble", epochs)),
        Variant("snens_tau1_lam0.1", (*_snens(1, 0.1), epochs)),  # today's defaults
        Variant("snens_lam0", (*_snens(1, 0), epochs)),
        Variant("snens_tau5_lam0.01", (*_snens(5, 0.01), epochs)),
        Variant("snens_tau5_lam0.1", (*_snens(5, 0.1), epochs)),
        Variant("snens_lam0_reset", (*_snens(1, 0, 'method.options={head_init="reset"}'), epochs)),
        Variant(
            "snens_tau5_lam0.01_reset",
            (*_snens(5, 0.01, 'method.options={head_init="reset"}'), epochs),
        ),
        # split inputs: each member sees B/M examples, so a step costs one model's; at the same
        # epochs σN-Ens costs what one model costs, at 4× the epochs what repeat costs
        Variant(
            "snens_tau1_lam0.1_split_e10",
            (*_snens(1, 0.1, "method.input_policy=split"), epochs),
        ),
        Variant(
            "snens_tau1_lam0.1_split_e40",
            (*_snens(1, 0.1, "method.input_policy=split"), f"optim.epochs={4 * ABLATION_EPOCHS}"),
        ),
        Variant(
            "snens_tau5_lam0.01_split_e40",
            (*_snens(5, 0.01, "method.input_policy=split"), f"optim.epochs={4 * ABLATION_EPOCHS}"),
        ),
        # γ at the base learning rate (×1) instead of ×30: slower, quieter importances
        Variant("snens_lam0_glr1", (*_snens(1, 0, "method.gamma_lr_multiplier=1"), epochs)),
        Variant(
            "snens_tau5_lam0.1_glr1", (*_snens(5, 0.1, "method.gamma_lr_multiplier=1"), epochs)
        ),
        Variant(
            "snens_tau1_lam0.1_glr1", (*_snens(1, 0.1, "method.gamma_lr_multiplier=1"), epochs)
        ),
        Variant("snens_tau50_lam0.1", (*_snens(50, 0.1), epochs)),
        Variant("snens_tau1_lam0.01", (*_snens(1, 0.01), epochs)),
        Variant(
            "snens_tau5_lam0.1_ramp5", (*_snens(5, 0.1, "method.diversity_ramp_epochs=5"), epochs)
        ),
        Variant(
            "snens_tau5_lam0.01_glr3", (*_snens(5, 0.01, "method.gamma_lr_multiplier=3"), epochs)
        ),
        Variant(
            "snens_tau5_lam0.01_gstd0.1",
            (*_snens(5, 0.01, "method.options={gamma_std=0.1}"), epochs),
        ),
        Variant("snens_tau50_lam0.01", (*_snens(50, 0.01), epochs)),
        # the regularizer on one stage only (the others' γ move by the task loss alone):
        # members that differ in the last stage's features share the first stages' whole
        # width, or the other way round
        Variant(
            "snens_tau1_lam0.1_stage3",
            (*_snens(1, 0.1, f"method.diversity_layers={_STAGE3}"), epochs),
        ),
        Variant(
            "snens_tau1_lam0.1_stage1",
            (*_snens(1, 0.1, f"method.diversity_layers={_STAGE1}"), epochs),
        ),
        # capacity per member: two members share the same features between them
        Variant("snens_tau1_lam0.1_m2", (*_snens(1, 0.1, "method.num_members=2"), epochs)),
        # weight decay on each member's own norm scale and shift (AdamW, decoupled)
        Variant(
            "snens_tau5_lam0.01_awd0.05",
            (*_snens(5, 0.01, "optim.affine_weight_decay=0.05"), epochs),
        ),
    ]
    # width 32 (≈ 4× the compute of width 16), same data and budget
    w32 = (epochs, "model.options={width=32}")
    width = [
        Variant("single_w32", (*SINGLE, *w32)),
        Variant("deep_ensemble_w32", ("method.name=deep_ensemble", *w32)),
        Variant("snens_lam0_w32", (*_snens(1, 0), *w32)),
        Variant("snens_tau5_lam0.01_w32", (*_snens(5, 0.01), *w32)),
        # the defaults: does their gap to the single model (0.052 val NLL at width 16) close
        # with capacity to spare?
        Variant("snens_tau1_lam0.1_w32", (*_snens(1, 0.1), *w32)),
    ]
    # width 64 (≈ 16× width 16's compute: 12–30 min per single run on one core, 45–95 min per
    # ensemble): where the gap closes, if it does; σN-Ens at the defaults first after one model,
    # over 3 seeds, since seed 0 left it 0.01 of validation NLL behind one model
    w64 = (epochs, "model.options={width=64}")
    width += [
        Variant(name, (*overrides, *w64), (0, 1, 2))
        for name, overrides in (
            ("single_w64", SINGLE),
            ("snens_tau1_lam0.1_w64", _snens(1, 0.1)),
            ("deep_ensemble_w64", ("method.name=deep_ensemble",)),
        )
    ]
    # the weaker partition at width 64 (at width 32 it was 0.013 of validation NLL closer to
    # one model than the defaults): does it reach one model once the backbone is this wide?
    width.append(Variant("snens_tau5_lam0.01_w64", (*_snens(5, 0.01), *w64)))
    # where a single model overfits its NLL: 10,000 training images, no augmentation, width 32,
    # 20 epochs (the validation curve shows where the single model's NLL turns up)
    few = (
        "data.train_examples=10000",
        "data.augment=[]",
        "model.options={width=32}",
        "optim.epochs=20",
    )
    seeds = (0, 1, 2)
    overfit = [
        Variant("single", (*SINGLE, *few), seeds),
        Variant("deep_ensemble", ("method.name=deep_ensemble", *few), seeds),
        Variant("snens_tau5_lam0.1", (*_snens(5, 0.1), *few), seeds),
        Variant("snens_lam0", (*_snens(1, 0), *few)),
        Variant("snens_tau5_lam0.01", (*_snens(5, 0.01), *few)),
        Variant("snens_tau1_lam0.1", (*_snens(1, 0.1), *few), seeds),
        Variant("snens_tau50_lam0.1", (*_snens(50, 0.1), *few)),
        Variant("snens_tau5_lam1", (*_snens(5, 1), *few)),
        Variant("snens_tau5_lam0.1_glr1", (*_snens(5, 0.1, "method.gamma_lr_multiplier=1"), *few)),
        # no partition of the features: one of snens tune's recipes, on every seed
        Variant("snens_lam0_glr1", (*_snens(1, 0, "method.gamma_lr_multiplier=1"), *few), seeds),
        Variant("snens_tau1_lam0.1_glr1", (*_snens(1, 0.1, "method.gamma_lr_multiplier=1"), *few)),
        # split inputs at one model's compute: each member trains on its own quarter of every
        # batch of B, so a step costs one model's; the stretch target of the science issue
        Variant(
            "snens_tau1_lam0.1_split", (*_snens(1, 0.1, "method.input_policy=split"), *few), seeds
        ),
        Variant("snens_tau5_lam0.01_split", (*_snens(5, 0.01, *SPLIT_RECIPE), *few), seeds),
        Variant("batch_ensemble", ("method.name=batch_ensemble", *few), seeds),
        Variant("packed", ("method.name=packed", *few), seeds),
        Variant("mc_dropout", ("method.name=mc_dropout", *few), seeds),
        Variant("snens_lam0_reset", (*_snens(1, 0, 'method.options={head_init="reset"}'), *few)),
    ]
    budget = [Variant(f"single_e{e}", (*SINGLE, f"optim.epochs={e}")) for e in BUDGET_EPOCHS]
    text = [
        Variant("single", SINGLE, seeds, TEXT),
        Variant("deep_ensemble", ("method.name=deep_ensemble",), seeds, TEXT),
        Variant("snens_default", ("method.name=snens",), seeds, TEXT),
        Variant("mc_dropout", ("method.name=mc_dropout",), seeds, TEXT),
        Variant("snens_tau5_lam0.01_split", _snens(5, 0.01, *SPLIT_RECIPE), seeds, TEXT),
        # split inputs at the library's τ and λ: the overfit regime's choice on validation
        Variant("snens_tau1_lam0.1_split", _snens(1, 0.1, *SPLIT_RECIPE), seeds, TEXT),
    ]
    vision = [Variant(v.name, v.overrides, v.seeds, VISION) for v in text]
    # snens tune's split recipes at the MobileNetV2 preset's γ multiplier (×3; the split runs
    # above were made at its earlier ×10) and its recipe without a partition, so that the probe
    # is replayed there with all four
    glr3 = "method.gamma_lr_multiplier=3"
    vision += [
        Variant("snens_tau1_lam0.1_split_glr3", _snens(1, 0.1, *SPLIT_RECIPE, glr3), seeds, VISION),
        Variant(
            "snens_tau5_lam0.01_split_glr3", _snens(5, 0.01, *SPLIT_RECIPE, glr3), seeds, VISION
        ),
        Variant("snens_lam0_glr1", _snens(1, 0, "method.gamma_lr_multiplier=1"), seeds, VISION),
    ]
    # no partition of the features (λ=0, γ at the base rate): one of the recipes snens tune
    # tries, so that its probe is replayed on this situation's runs with all four
    text.append(
        Variant("snens_lam0_glr1", _snens(1, 0, "method.gamma_lr_multiplier=1"), seeds, TEXT)
    )
    # the pretrained CNN's and the pretrained transformer's recipes on a validation split:
    # 1,000 training images / texts held out, the 5,000 / 2,000 trained on drawn from the rest;
    # γ's multiplier around the preset's (×10; ×50 for MiniLM, from the earlier one-epoch
    # study, which compared ×50 with ×500 on its test texts), λ and τ
    vision_tune = _tune_stage(VISION, (1, 3))
    text_tune = _tune_stage(TEXT, (10, 150))
    return {
        "budget": budget,
        "ablation": ablation,
        "overfit": overfit,
        "text": text,
        "vision": vision,
        "vision_tune": vision_tune,
        "text_tune": text_tune,
        "width": width,
        "final": [],
        "posthoc": [],
    }


STAGES = _stages()
#: The methods of the final comparison (σN-Ens: the ablation's winner on validation).
FINAL_METHODS = ("single", "deep_ensemble", "batch_ensemble", "packed", "mc_dropout")
FINAL_SEEDS = (0, 1, 2)


def chosen_recipe(stage: str = "ablation", variants: Sequence[Variant] = ()) -> Variant | None:
    """The σN-Ens variant of ``stage`` (``ablation``: width 16, repeated inputs at one budget;
    ``vision_tune``, ``text_tune``; or of ``variants``, those of the stage to choose among) with
    the lowest validation NLL; None until all of them finished. Never looks at the test set."""
    best, best_nll = None, math.inf
    for variant in variants or STAGES[stage]:
        if not variant.name.startswith("snens") or variant.name.endswith("_e40"):
            continue
        path = WHERE["out"] / stage / variant.name / "seed=0"
        final = _final(path)
        if final is None:
            return None
        # its best epoch's, as every run is now evaluated (the ablation and tune stages ran
        # before selection and keep the curve of every epoch)
        curve = [v for v in _curve(_records(path), "val/nll") if math.isfinite(v)]
        nll = min(curve) if curve else final["metrics"]["val/nll"]
        if nll < best_nll:
            best, best_nll = variant, nll
    return best


def final_epochs(nll: Mapping[int, float]) -> int | None:
    """The final comparison's epochs, min(converged, :data:`FINAL_MAX_EPOCHS`), from the
    single-model validation NLL of the budget runs finished so far (epochs → NLL); None while
    a run yet to finish could change it. A longer run can only lower the best NLL, so once no
    run shorter than the cap comes within :data:`CONVERGED_WITHIN` of the best so far, the
    cap is the answer whatever the longer runs show."""
    cap = FINAL_MAX_EPOCHS
    if len(nll) == len(BUDGET_EPOCHS):
        return min(cap, _converged(nll))
    if any(e not in nll for e in BUDGET_EPOCHS if e <= cap):
        return None
    best_so_far = min(nll.values())
    if all(v > best_so_far + CONVERGED_WITHIN for e, v in nll.items() if e < cap):
        return cap
    return None


def final_variants() -> list[Variant]:
    """The final comparison at the converged budget, 3 seeds; empty until the budget runs
    decide its length and the ablation its recipe (its configs depend on what they chose)."""
    epochs = final_epochs(_budget_nll())
    recipe = chosen_recipe()
    if epochs is None or recipe is None:
        return []
    length = f"optim.epochs={epochs}"
    out = [
        Variant(m, (*(SINGLE if m == "single" else (f"method.name={m}",)), length), FINAL_SEEDS)
        for m in FINAL_METHODS
    ]
    # the library's defaults (what users get), the split recipe, and the ablation's winner on
    # validation
    out.append(Variant("snens_default", ("method.name=snens", length), FINAL_SEEDS))
    out.append(
        Variant("snens_tau5_lam0.01_split", (*_snens(5, 0.01, *SPLIT_RECIPE), length), FINAL_SEEDS)
    )
    out.append(
        Variant("snens_tau1_lam0.1_split", (*_snens(1, 0.1, *SPLIT_RECIPE), length), FINAL_SEEDS)
    )
    kept = _without(recipe.overrides, "optim.epochs")
    out.append(Variant(f"{recipe.name}_chosen", (*kept, length), FINAL_SEEDS))
    return out


def vision_variants() -> list[Variant]:
    """The ``vision`` stage, with ``vision_tune``'s winner over its seeds once it is chosen
    (trained on the same 5,000 images as the others: no validation split)."""
    recipe = chosen_recipe("vision_tune")
    if recipe is None:
        return STAGES["vision"]
    kept = _without(recipe.overrides, "data.validation_examples")
    seeds = STAGES["vision"][0].seeds
    return [*STAGES["vision"], Variant(f"{recipe.name}_chosen", kept, seeds, VISION)]


#: Epochs of the fine-tune after conversion: a tenth of the final stage's 40.
POSTHOC_EPOCHS = 4


def _single_source() -> str:
    """The final stage's single model of a run's seed, as ``model.init_from`` names it: relative
    to the repository root when the study is inside it (the study runs there: :func:`main`
    changes to it), so the runs' configs hold no machine's absolute path."""
    where = WHERE["out"] / "final" / "single" / "seed={seed}"
    return str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else str(where)


def _posthoc_tune() -> list[Variant]:
    start = (
        f"model.init_from={json.dumps(_single_source())}",
        f"optim.epochs={POSTHOC_EPOCHS}",
    )
    reset = 'method.options={head_init="reset"}'
    return [
        Variant(name, (*start, f"optim.lr={lr}", *method))
        for name, lr, method in (
            ("snens_lr3e-4", 3e-4, _snens(1, 0.1)),
            ("snens_lr1e-3", 1e-3, _snens(1, 0.1)),
            ("snens_tau5_lam0.01_lr3e-4", 3e-4, _snens(5, 0.01)),
            ("snens_reset_lr3e-4", 3e-4, _snens(1, 0.1, reset)),
            # γ slower (×3, as the pretrained CNN's recipe): the partition forms while the
            # shared weights adapt to it
            ("snens_glr3_lr3e-4", 3e-4, _snens(1, 0.1, "method.gamma_lr_multiplier=3")),
        )
    ]


def posthoc_variants() -> list[Variant]:
    """σN-Ens converted from the final stage's trained single model (``model.init_from``) and
    fine-tuned :data:`POSTHOC_EPOCHS` more epochs on the same data: learning rate, τ and λ,
    fresh member heads and γ's multiplier chosen on validation (seed 0); the winner then over
    the seeds whose single model has finished, each from its own, next to that single model
    trained the same epochs more (``single_continued``) and γ ×3 over those seeds too. Empty
    until the single model of seed 0 finished."""
    sources = [s for s in FINAL_SEEDS if _final(WHERE["out"] / "final" / "single" / f"seed={s}")]
    if 0 not in sources:
        return []
    tune = _posthoc_tune()
    start = tune[0].overrides[:2]  # init_from and the epochs
    out = [Variant("single_continued", (*SINGLE, *start, "optim.lr=0.0003"), tuple(sources))]
    # γ ×3 (the pretrained CNN's recipe, chosen on its validation split) over every seed too:
    # not the lowest validation NLL here, but it separates OOD and calibrates under shift best
    # of the seed-0 runs (measured after the fact, so it is reported, not chosen)
    out += [replace(v, seeds=tuple(sources)) if v.name == "snens_glr3_lr3e-4" else v for v in tune]
    recipe = chosen_recipe("posthoc", tune)
    if recipe is not None:
        out.append(Variant(f"{recipe.name}_chosen", recipe.overrides, tuple(sources)))
    return out


def text_variants() -> list[Variant]:
    """The ``text`` stage, with ``text_tune``'s winner over its seeds once it is chosen, unless
    the winner is the defaults the stage trains already (its ``snens_default``)."""
    recipe = chosen_recipe("text_tune")
    if recipe is None or recipe.name == "snens_default":
        return STAGES["text"]
    kept = _without(recipe.overrides, "data.validation_examples")
    seeds = STAGES["text"][0].seeds
    return [*STAGES["text"], Variant(f"{recipe.name}_chosen", kept, seeds, TEXT)]


def _without(overrides: tuple[str, ...], key: str) -> tuple[str, ...]:
    """``overrides`` less the ones that set ``key``."""
    return tuple(o for o in overrides if not o.startswith(f"{key}="))


def _variants(stage: str) -> list[Variant]:
    """A stage's variants; ``final`` and ``vision`` depend on what earlier stages chose."""
    if stage == "final":
        return final_variants()
    if stage == "vision":
        return vision_variants()
    if stage == "text":
        return text_variants()
    if stage == "posthoc":
        return posthoc_variants()
    return STAGES[stage]


def runs_of(stage: str) -> list[tuple[Variant, SweepRun]]:
    """Every run of a stage, its config built and checked (nothing is written)."""
    out = []
    for variant in _variants(stage):
        base = {TEXT: TEXT_BASE, VISION: VISION_BASE}.get(variant.preset, BASE)
        protocol = PROTOCOL if stage in TEST_STAGES else ()
        overrides = (*base, *protocol, *WHERE["extra"])
        out += [(variant, run) for run in plan_variant(variant, WHERE["out"] / stage, overrides)]
    if stage in TEST_STAGES:
        # seed by seed, a whole first seed's table before the second seed (variants of one
        # seed only, the diagnosis, after every seed); within a seed the rows the targets
        # compare (one model, the deep ensemble, σN-Ens) before the other baselines
        out.sort(
            key=lambda item: (
                len(item[0].seeds) == 1,
                item[1].config.seed,
                _queue_rank(item[0].name),
            )
        )
    return out


def _queue_rank(name: str) -> float:
    order = (
        "single",
        "snens_tau5_lam0.01_split",
        "snens_tau1_lam0.1_split",
        "deep_ensemble",
        "snens_default",
        "packed",
    )
    return order.index(name) if name in order else 2.5 if name.endswith("_chosen") else 9


#: The stages whose test tables score OOD detection by every score of :data:`OOD_SCORES`.
TEST_STAGES = ("overfit", "text", "vision", "final", "posthoc")


def _score_ood(stage: str, path: Path) -> None:
    """Once a run finished: its OOD scores (:func:`ood_scores`) from its checkpoint and its
    conformal sets over test halvings (:func:`conformal_halves`) from its kept logits, neither
    of which is committed, into ``ood_scores.json`` and ``conformal_halves.json``, which are,
    so the report needs neither."""
    if stage in TEST_STAGES:
        ood_scores(path)
        conformal_halves(path)
        examples(path)


def run(stages: Sequence[str], seeds: Sequence[int] = (), variants: Sequence[str] = ()) -> int:
    """Train every unfinished run of ``stages`` in order (a stage's variants may depend on the
    previous stage's results, so each stage is planned when its turn comes); of the ``seeds``
    and the ``variants`` only, where given (a first seed of every stage before the next seeds
    of any)."""
    failed = 0
    for stage in stages:
        queue = [(stage, variant, run) for variant, run in runs_of(stage)]

        # every run of the stage in its variant's sweep.csv, the chosen ones trained (a run's
        # directory is <variant>/seed=<s>)
        def only(run: SweepRun) -> bool:
            return (not seeds or run.config.seed in seeds) and (
                not variants or run.path().parent.name in variants
            )

        failed |= study.train(queue, after=_score_ood, only=only)
    return failed


# ------------------------------------------------------------------------------------------------
# Reading the results
# ------------------------------------------------------------------------------------------------


def _final(path: Path) -> dict | None:
    try:
        return json.loads((path / FINAL).read_text())
    except FileNotFoundError:
        return None


def _records(path: Path) -> list[dict]:
    """A run's ``metrics.jsonl`` records, none if it has no such file."""
    return read_metrics(path) if (path / "metrics.jsonl").is_file() else []


def _curve(records: Sequence[Mapping], key: str) -> list[float]:
    """``key`` per epoch; NaN where a record has no such value."""
    return [record.get(key, math.nan) for record in records]


def _budget_nll() -> dict[int, float]:
    """Epochs → single-model validation NLL of the budget runs finished so far."""
    out = {}
    for _, sweep_run in runs_of("budget"):
        final = _final(sweep_run.path())
        if final is not None:
            out[int(final["train"]["epochs"])] = final["metrics"]["val/nll"]
    return out


def converged_budget() -> tuple[int | None, list[str]]:
    """The fewest epochs of :data:`BUDGET_EPOCHS` whose single-model validation NLL is within
    :data:`CONVERGED_WITHIN` of the best (None until every budget run finished), and a table."""
    rows = ["| epochs | val acc | val NLL | val ECE | test acc | test NLL |", "|" + "---|" * 6]
    nll: dict[int, float] = {}
    for _, sweep_run in runs_of("budget"):
        final = _final(sweep_run.path())
        if final is None:
            continue
        m = final["metrics"]
        e = int(final["train"]["epochs"])
        nll[e] = m["val/nll"]
        rows.append(
            f"| {e} | {m['val/accuracy']:.4f} | {m['val/nll']:.4f} | {m['val/ece']:.4f} | "
            f"{m['test/accuracy']:.4f} | {m['test/nll']:.4f} |"
        )
    if len(nll) < len(BUDGET_EPOCHS):
        return None, rows
    return _converged(nll), rows


def _converged(nll: Mapping[int, float]) -> int:
    """The fewest epochs whose validation NLL is within :data:`CONVERGED_WITHIN` of the best."""
    best = min(nll.values())
    return min(e for e, v in nll.items() if v <= best + CONVERGED_WITHIN)


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None without matplotlib (figures are skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def curve_runs(stage: str) -> tuple[dict[str, list[Path]], int]:
    """The finished runs of ``stage`` by variant (the learning curves drawn), and how many of
    its runs are still training (started, no ``final.json``: not drawn, a partial curve would
    read as a finished one)."""
    curves: dict[str, list[Path]] = {}
    training = 0
    for variant, sweep_run in runs_of(stage):
        path = sweep_run.path()
        if (path / FINAL).is_file():
            curves.setdefault(variant.name, []).append(path)
        elif (path / "metrics.jsonl").is_file():
            training += 1
    return curves, training


def _plot_curves(stage: str, out: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    from snens.evaluation.plots import curve_styles

    # validation NLL, accuracy and disagreement and σN-Ens' effective members per epoch; one
    # style per variant (its seeds alike: snens.evaluation.plots.curve_styles), one legend entry per
    # variant below the panels; finished runs only
    curves, training = curve_runs(stage)
    if not curves:
        return None
    styles = curve_styles(len(curves))
    panels = (
        ("val/nll", "validation NLL"),
        ("val/accuracy", "validation accuracy"),
        ("val/disagreement", "validation disagreement"),
        ("effective_members", "effective members (σN-Ens)"),
    )
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    axes = axes.ravel()
    for style, (name, paths) in zip(styles, curves.items(), strict=True):
        for j, path in enumerate(paths):
            label = f"{name} ({len(paths)} seed{'s' * (len(paths) > 1)})" if j == 0 else None
            records = read_metrics(path)
            for ax, (key, _) in zip(axes, panels):
                values = _curve(records, key)  # NaN is not drawn
                ax.plot(range(1, len(values) + 1), values, label=label, linewidth=1, **style)
    for ax, (_, title) in zip(axes, panels):
        ax.set_xlabel("epoch")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    if training:
        fig.suptitle(f"finished runs; {training} still training, not drawn", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    columns = min(4, max(1, len(labels)))
    fig.tight_layout(rect=(0, 0.025 * math.ceil(len(labels) / columns) + 0.025, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=7, frameon=False)
    target = out / f"converged_{stage}_curves.png"
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


OOD_SCORES = ("msp", "entropy", "mutual_information")


def ood_scores(path: Path) -> dict[str, float] | None:
    """AUROC, AUPR and FPR95 of each OOD score (OOD positive) of a finished run, keyed
    ``<set>/<score>/<metric>``, from its last.pt, cached in ``ood_scores.json`` beside it (None
    without either); a run of a test stage writes it once it finishes (:func:`_score_ood`).
    ``final.json`` holds MSP and the logit scores of ``data.ood_scores``, not the entropy and
    mutual information of the member softmaxes."""
    import torch

    from snens.engine.checkpoint import atomic_write
    from snens.engine.config import load_config
    from snens.engine.reload import evaluate_run

    cache = path / "ood_scores.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    if not (path / "last.pt").is_file():
        return None
    torch.manual_seed(load_config(path / "config.toml").seed)  # MC-dropout masks
    metrics, _ = evaluate_run(path, ood_score=list(OOD_SCORES), corruptions=False, validation=False)
    values = {k.removeprefix("ood/"): v for k, v in metrics.items() if k.startswith("ood/")}
    atomic_write(cache, (json.dumps(values, indent=2) + "\n").encode(), mode=0o644)
    return values


def examples(path: Path) -> bool:
    """A finished run's ``examples.npz`` (what its confidence intervals need, a few bytes per
    example), which the engine writes; for a run finished before it did, made from its kept
    logits (``outputs.npz``, not committed: 2-7 MB a run here). Whether the file is there."""
    from snens.engine.checkpoint import atomic_savez
    from snens.engine.config import load_config
    from snens.engine.runs import EXAMPLES, OUTPUTS, read_outputs
    from snens.evaluation.bootstrap import run_examples

    if (path / EXAMPLES).is_file():
        return True
    if not (path / OUTPUTS).is_file():
        return False
    calibrators = load_config(path / "config.toml").data.calibrators
    atomic_savez(path / EXAMPLES, run_examples(read_outputs(path), calibrators=calibrators))
    return True


#: Conformal sets calibrated on a random half of the test set and measured on the other half,
#: over this many halvings: calibration and test data exchangeable by construction.
HALVINGS = 200
CONFORMAL_HALVES = "conformal_halves.json"


def conformal_halves(path: Path) -> dict[str, float] | None:
    """THR and APS sets (the engine's :data:`~snens.evaluation.protocol.CONFORMAL_SCORES`) at
    the run's α calibrated on a random half of its test set and measured on the other half,
    over :data:`HALVINGS` halvings (:func:`snens.evaluation.conformal.resampled_coverage`, a
    generator seeded 0): keyed
    ``<score>/coverage``, ``<score>/coverage_std`` (from one halving to the next) and
    ``<score>/size``, from the run's kept logits (``outputs.npz``), cached in
    ``conformal_halves.json`` beside them (None without either). The run's own sets are
    calibrated on its validation split, one fixed draw; this says where their coverage may fall
    by chance."""
    from snens.engine.checkpoint import atomic_write
    from snens.engine.config import load_config
    from snens.engine.runs import OUTPUTS, read_outputs
    from snens.evaluation.conformal import resampled_coverage
    from snens.evaluation.protocol import CONFORMAL_SCORES

    cache = path / CONFORMAL_HALVES
    if cache.is_file():
        return json.loads(cache.read_text())
    if not (path / OUTPUTS).is_file():
        return None
    outputs = read_outputs(path)
    alpha = load_config(path / "config.toml").data.conformal_alpha
    values = {}
    for score in CONFORMAL_SCORES:  # the engine's own sets' scores
        check = resampled_coverage(
            outputs["test"], outputs["test_labels"], alpha, score, splits=HALVINGS
        )
        values |= {
            f"{score}/coverage": check.coverage,
            f"{score}/coverage_std": check.coverage_std,
            f"{score}/size": check.size,
        }
    atomic_write(cache, (json.dumps(values, indent=2) + "\n").encode(), mode=0o644)
    return values


def _median_epochs_seconds(path: Path) -> float:
    """A run's training seconds as its epochs × its median epoch's: ``train/seconds`` counts the
    wall clock, so a stretch the process was stopped or shared its core (another job beside the
    two study processes) inflates it; the median epoch does not feel a few such epochs."""
    import numpy as np

    seconds = [r["seconds"] for r in read_metrics(path) if "seconds" in r]
    return float(np.median(seconds)) * len(seconds)


def cell(rows: list[dict], key: str) -> str:
    """A table cell: ``key``'s mean ± std over the rows that have it ("–" where none do)."""
    import numpy as np

    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}"


def test_tables(stage: str) -> list[str]:
    """The test set, read after every choice was made on validation: clean and corrupted
    accuracy and ECE per severity, and OOD detection by MSP, entropy and mutual information
    (AUROC), and the training seconds robust to stretches a run was paused or shared its core
    (:func:`_median_epochs_seconds`), mean ± std over the seeds of each variant."""
    import numpy as np

    by_variant: dict[str, list[dict]] = {}
    for variant, sweep_run in runs_of(stage):
        final = _final(sweep_run.path())
        if final is None:
            continue
        row = dict(final["metrics"], params=final["model"]["params"])
        row["train/median_seconds"] = _median_epochs_seconds(sweep_run.path())
        ood = ood_scores(sweep_run.path()) or {}
        # one OOD set per stage (MNIST-5k, or the plot descriptions for text): keyed by score
        row.update({f"ood/{k.split('/', 1)[1]}": v for k, v in ood.items()})
        by_variant.setdefault(variant.name, []).append(row)

    sev = [f"shift/severity/{s}" for s in range(1, 6)]
    head = (
        "| variant | n | params | test acc | test NLL | test ECE | "
        + " | ".join(f"acc s{s}" for s in range(1, 6))
        + " | "
        + " | ".join(f"ECE s{s}" for s in range(1, 6))
        + " | OOD AUROC MSP | entropy | MI | train s (epochs × median epoch) |"
    )
    lines = [head, "|" + "---|" * (6 + 10 + 3 + 1)]
    for name, rows in by_variant.items():
        cells = [name, str(len(rows)), f"{rows[0]['params']:,}"]
        cells += [cell(rows, f"test/{k}") for k in ("accuracy", "nll", "ece")]
        cells += [cell(rows, f"{s}/accuracy") for s in sev]
        cells += [cell(rows, f"{s}/ece") for s in sev]
        one_member = rows[0].get("test/num_members") == 1.0  # MI is 0 for one member
        cells += [
            "–"
            if one_member and score == "mutual_information"
            else cell(rows, f"ood/{score}/auroc")
            for score in OOD_SCORES
        ]
        seconds = [r["train/median_seconds"] for r in rows]
        spread = f" ± {np.std(seconds, ddof=1):.0f}" if len(seconds) > 1 else ""
        cells.append(f"{np.mean(seconds):.0f}{spread}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


#: OOD scores in the order the protocol tables show them: the logit scores first (the
#: members' mean logit keeps the evidence that averaging softmaxes flattens), then the member
#: disagreement, then the softmax-based ones.
PROTOCOL_OOD = ("energy", "max_logit", "mutual_information", "entropy", "msp")


def protocol_rows(stage: str) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """The finished runs of ``stage`` that kept their examples: per variant, their final.json
    metrics with each OOD score's AUROC (``ood_auroc/<score>``, from the kept scores) and the
    kept epoch(s), and their ``examples.npz`` arrays, in seed order."""
    import torch

    from snens.engine.runs import EXAMPLES, read_examples
    from snens.evaluation.bootstrap import Examples
    from snens.metrics import auroc

    rows: dict[str, list[dict]] = {}
    arrays: dict[str, list[dict]] = {}
    for variant, sweep_run in runs_of(stage):
        path = sweep_run.path()
        final = _final(path)
        if final is None or not (path / EXAMPLES).is_file():
            continue
        kept = read_examples(path)
        row = dict(final["metrics"])
        selection = final.get("selection", {})
        epochs = selection.get("member_epochs") or [selection.get("epoch", math.nan)]
        row["kept_epoch"] = sum(epochs) / len(epochs)
        # ECE at severity 5, the mean over the corruptions, raw and after temperature scaling,
        # from the kept examples (runs finished before final.json had shift_ts keep them too)
        for head in ("shift", "shift_ts"):
            names = sorted({k.split("/")[1] for k in kept if k.startswith(f"{head}/")})
            values = [
                Examples.from_arrays(kept, f"{head}/{n}/5/").metric("ece")
                for n in names
                if f"{head}/{n}/5/nll" in kept
            ]
            if values:
                row[f"{head}/severity/5/ece"] = sum(values) / len(values)
        ood_sets = sorted({k.split("/")[1] for k in kept if k.startswith("ood/")})
        for score in PROTOCOL_OOD:
            if ood_sets and f"test/ood/{score}" in kept:
                inside = torch.from_numpy(kept[f"test/ood/{score}"])
                outside = torch.from_numpy(kept[f"ood/{ood_sets[0]}/{score}"])
                row[f"ood_auroc/{score}"] = auroc(inside, outside)
        rows.setdefault(variant.name, []).append(row)
        arrays.setdefault(variant.name, []).append(kept)
    return rows, arrays


def protocol_tables(stage: str) -> list[str]:
    """Every method at its best validation epoch: test accuracy, NLL and ECE raw and after
    temperature scaling (fitted on each run's validation split), ECE at corruption severity 5
    raw and after it, and OOD AUROC by every score, mean ± std over seeds; then σN-Ens against
    one model and the deep ensemble, each difference with its paired bootstrap 95 % interval
    and the word it supports."""
    rows, arrays = protocol_rows(stage)
    if not rows:
        return []
    columns = (
        ("kept epoch", "kept_epoch"),
        ("test acc", "test/accuracy"),
        ("NLL", "test/nll"),
        ("ECE", "test/ece"),
        ("NLL +TS", "test_ts/nll"),
        ("ECE +TS", "test_ts/ece"),
        ("ECE s5", "shift/severity/5/ece"),
        ("ECE s5 +TS", "shift_ts/severity/5/ece"),
        *((f"OOD {score}", f"ood_auroc/{score}") for score in PROTOCOL_OOD),
    )
    shown = [(h, k) for h, k in columns if any(k in r for group in rows.values() for r in group)]
    lines = [
        "| variant | n | " + " | ".join(h for h, _ in shown) + " |",
        "|" + "---|" * (2 + len(shown)),
    ]
    for name, group in rows.items():
        one_member = group[0].get("test/num_members") == 1.0  # MI is 0 for one member
        cells = [
            "–" if one_member and key == "ood_auroc/mutual_information" else cell(group, key)
            for _, key in shown
        ]
        lines.append(f"| {name} | {len(group)} | " + " | ".join(cells) + " |")
    snens = [name for name in rows if name.startswith("snens")]
    pairs = [(v, b) for b in ("single", "deep_ensemble") for v in snens]
    first = arrays[next(iter(arrays))][0]
    sets = sorted({k.split("/")[1] for k in first if k.startswith("ood/")})
    ood = (sets[0], "energy") if sets else None
    lines += ["", *study.difference_table(arrays, pairs, ood=ood)]
    return lines


#: The test metrics a run's kept logits give without another pass (the engine writes them to
#: ``final.json`` since it keeps ``outputs.npz``): (header, key under ``test/`` or the OOD set).
POSTHOC_COLUMNS = (
    ("OOD AUROC max-logit", "max_logit/auroc"),
    ("energy", "energy/auroc"),
    ("THR coverage", "test/conformal_thr_coverage"),
    ("THR size", "test/conformal_thr_size"),
    ("APS coverage", "test/conformal_aps_coverage"),
    ("APS size", "test/conformal_aps_size"),
    ("THR coverage, test halves", "halves/thr/coverage"),
    ("its std over the halvings", "halves/thr/coverage_std"),
    ("APS coverage, test halves", "halves/aps/coverage"),
)


def posthoc_table(stage: str) -> list[str]:
    """OOD detection by the logit scores (max logit and energy of the members' mean logit) and
    split-conformal prediction sets at the runs' α (calibrated on the validation split,
    measured on the test set: coverage and mean set size) and the coverage of sets calibrated
    on random test halves (:func:`conformal_halves`), mean ± std over the seeds of each
    variant that recorded them (``n``); a note instead when no run of the stage recorded them
    (it finished before the engine kept its logits: retrain it into a fresh ``--out``)."""
    by_variant: dict[str, list[dict]] = {}
    for variant, sweep_run in runs_of(stage):
        final = _final(sweep_run.path())
        if final is None:
            continue
        metrics = final["metrics"]
        row = {k: v for k, v in metrics.items() if k.startswith("test/conformal_")}
        # one OOD set per stage: keyed by score
        row.update({k.split("/", 2)[2]: v for k, v in metrics.items() if k.startswith("ood/")})
        halves = conformal_halves(sweep_run.path()) or {}
        row.update({f"halves/{k}": v for k, v in halves.items()})
        by_variant.setdefault(variant.name, []).append(row)
    if not any(
        key in row for rows in by_variant.values() for row in rows for _, key in POSTHOC_COLUMNS
    ):
        return [
            "Logit OOD scores and conformal sets: not recorded by these runs (they finished "
            "before the engine kept their member logits); a retrain into a fresh `--out` adds "
            "them."
        ]

    lines = [
        "| variant | n | " + " | ".join(h for h, _ in POSTHOC_COLUMNS) + " |",
        "|" + "---|" * (2 + len(POSTHOC_COLUMNS)),
    ]
    for name, rows in by_variant.items():
        recorded = sum(any(key in row for _, key in POSTHOC_COLUMNS) for row in rows)
        cells = [name, str(recorded), *(cell(rows, key) for _, key in POSTHOC_COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def diagnosis(stage: str) -> list[str]:
    """Where σN-Ens gains or loses, per run (validation split only): the ensemble against its
    members, how much they disagree, and how many members share each feature at the end
    (effective members; k*(τ) is the regularizer's optimum), next to the best epoch of the
    validation NLL (a learning curve that turns up overfits)."""
    from snens.method.regularizer import optimal_k

    rows = [
        "| run | val acc | val NLL | member acc | member NLL | disagreement | effective "
        "members | k*(τ) | best epoch (val NLL) |",
        "|" + "---|" * 9,
    ]
    for variant, sweep_run in runs_of(stage):
        path = sweep_run.path()
        final = _final(path)
        if final is None:
            continue
        m, config = final["metrics"], sweep_run.config
        if "val/nll" not in m:  # a stage without a validation split
            continue
        records = read_metrics(path)
        curve = _curve(records, "val/nll")
        best = min(range(len(curve)), key=curve.__getitem__) + 1
        last = records[-1]
        snens_run = config.method.name == "snens"
        members = f"{last['effective_members']:.2f}" if snens_run else "–"
        k = (
            f"{optimal_k(config.method.temperature, config.method.num_members):.2f}"
            if snens_run and config.method.diversity_weight > 0
            else "–"
        )
        rows.append(
            f"| {variant.name} {sweep_run.name} | {m['val/accuracy']:.4f} | {m['val/nll']:.4f} "
            f"| {m['val/member_accuracy_mean']:.4f} | {m['val/member_nll_mean']:.4f} "
            f"| {m['val/disagreement']:.4f} | {members} | {k} | {best} of {len(curve)} |"
        )
    return rows


#: The stages whose σN-Ens runs the sharing figure draws: where one model overfits, and all the
#: data on the small backbone.
SHARING_STAGES = (("overfit", "single"), ("ablation", None))


def sharing_points(stage: str) -> list[tuple[str, float, float, float]]:
    """(variant, k/M, member NLL, ensemble NLL) on the validation split of each finished σN-Ens
    run of ``stage`` (seed 0) that partitions every member norm with repeated inputs at the
    stage's budget: the share of the features a member keeps against what it costs the member
    and what the ensemble gains back."""
    out = []
    for variant, sweep_run in runs_of(stage):
        config, final = sweep_run.config, _final(sweep_run.path())
        method = config.method
        if (
            final is None
            or config.seed != 0
            or method.name != "snens"
            or method.input_policy != "repeat"
            or method.diversity_layers
            or (stage == "ablation" and config.optim.epochs != ABLATION_EPOCHS)
        ):
            continue
        m = final["metrics"]
        share = final["model"]["effective_members"] / method.num_members
        out.append((variant.name, share, m["val/member_nll_mean"], m["val/nll"]))
    return sorted(out, key=lambda point: point[1])


def _single_nll(stage: str, variant: str | None) -> float | None:
    path = (
        WHERE["out"] / stage / variant / "seed=0"
        if variant
        else WHERE["out"] / "budget" / f"single_e{ABLATION_EPOCHS}" / "seed=0"
    )
    final = _final(path)
    return None if final is None else final["metrics"]["val/nll"]


Sharing = dict[str, tuple[list[tuple[str, float, float, float]], float | None]]


def sharing() -> Sharing:
    """Stage → (:func:`sharing_points`, the single model's validation NLL or None) for each
    stage of :data:`SHARING_STAGES`."""
    return {
        stage: (sharing_points(stage), _single_nll(stage, single))
        for stage, single in SHARING_STAGES
    }


def _plot_sharing(shares: Sharing, out: Path) -> Path | None:
    """Member and ensemble validation NLL against the share of features a member keeps, one
    panel per stage of :func:`sharing`, the single model as a line."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(shares), figsize=(11, 4.2))
    titles = {
        "overfit": "10,000 images, width 32, 20 epochs: one model overfits",
        "ablation": "all 55,000 images, width 16, 10 epochs: one model underfits",
    }
    drawn = []
    for ax, (stage, (points, reference)) in zip(axes, shares.items(), strict=True):
        if not points:
            continue
        drawn.append(ax)
        _, share, member, ensemble = zip(*points, strict=True)
        ax.vlines(share, ensemble, member, color="0.7", linewidth=1)
        ax.plot(share, member, "o", mfc="none", color="C0", label="a member (mean)")
        ax.plot(share, ensemble, "o", color="C1", label="the ensemble of 4")
        if reference is not None:
            ax.axhline(reference, color="k", linestyle="--", linewidth=1, label="one model")
        ax.set_xlabel("share of the features a member keeps (effective members / M)")
        ax.set_ylabel("validation NLL")
        ax.set_title(titles[stage], fontsize=9)
        ax.grid(alpha=0.3)
    if not drawn:
        plt.close(fig)
        return None
    drawn[0].legend(fontsize=8)
    fig.tight_layout()
    target = out / "converged_sharing.png"
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def sharing_table(shares: Sharing) -> list[str]:
    """:func:`sharing` as a table."""
    rows = [
        "| stage | variant | k/M | member NLL | ensemble NLL | one model |",
        "|---|---|---|---|---|---|",
    ]
    for stage, (points, reference) in shares.items():
        shown = "–" if reference is None else f"{reference:.3f}"
        for name, share, member, ensemble in points:
            rows.append(
                f"| {stage} | {name} | {share:.2f} | {member:.3f} | {ensemble:.3f} | {shown} |"
            )
    return rows


#: One model, the deep ensemble and σN-Ens at each backbone width, all 55,000 images, 10
#: epochs: width → column → (stage, variant). Width 16's single model is the budget stage's.
WIDTHS = {
    16: {
        "single": ("budget", f"single_e{ABLATION_EPOCHS}"),
        "deep ensemble": ("ablation", "deep_ensemble"),
        "σN-Ens λ=0": ("ablation", "snens_lam0"),
        "σN-Ens τ=5 λ=0.01": ("ablation", "snens_tau5_lam0.01"),
        "σN-Ens defaults (τ=1 λ=0.1)": ("ablation", "snens_tau1_lam0.1"),
    },
    **{
        width: {
            "single": ("width", f"single_w{width}"),
            "deep ensemble": ("width", f"deep_ensemble_w{width}"),
            "σN-Ens λ=0": ("width", f"snens_lam0_w{width}"),
            "σN-Ens τ=5 λ=0.01": ("width", f"snens_tau5_lam0.01_w{width}"),
            "σN-Ens defaults (τ=1 λ=0.1)": ("width", f"snens_tau1_lam0.1_w{width}"),
        }
        for width in (32, 64)
    },
}


def _val_nll(stage: str, variant: str) -> list[float]:
    """The validation NLL of each finished seed of ``variant``, by seed."""
    runs = sorted((WHERE["out"] / stage / variant).glob("seed=*"))
    return [final["metrics"]["val/nll"] for run in runs if (final := _final(run)) is not None]


def _mean_cell(values: Sequence[float]) -> str:
    if not values:
        return "–"
    mean, std, n = summarize(values)
    return f"{mean:.3f} (n=1)" if n == 1 else f"{mean:.3f} ± {std:.3f} (n={n})"


def width_table() -> list[str]:
    """Validation NLL of each method of :data:`WIDTHS` by backbone width (mean ± sample std
    over the finished seeds), and the defaults' gap to one model (a positive gap: behind)."""
    columns = list(WIDTHS[16])
    rows = [
        "| width | " + " | ".join(columns) + " | defaults − single |",
        "|" + "---|" * (len(columns) + 2),
    ]
    for width, runs in WIDTHS.items():
        nll = {column: _val_nll(*runs[column]) for column in columns}
        single, defaults = nll["single"], nll[columns[-1]]
        gap = (
            f"{summarize(defaults)[0] - summarize(single)[0]:+.3f}" if single and defaults else "–"
        )
        cells = " | ".join(_mean_cell(nll[column]) for column in columns)
        rows.append(f"| {width} | {cells} | {gap} |")
    return rows


def report() -> Path:
    """``results/converged.md``: the budget table, a report table per stage, the curves."""
    sections = ["# Converged-budget study (`python experiments/converged.py report`)", ""]
    epochs, rows = converged_budget()
    sections += [
        "## Budget: the single model's validation NLL against the epochs (seed 0)",
        "",
        *rows,
        "",
        f"Converged budget: {epochs if epochs else 'not yet (budget runs unfinished)'} epochs.",
        f"Final comparison: {final_epochs(_budget_nll()) or 'not yet decided'} epochs "
        f"(the converged budget, at most {FINAL_MAX_EPOCHS}).",
        "",
    ]
    for stage in STAGES:
        stage_dir = WHERE["out"] / stage
        if not any(stage_dir.rglob(FINAL)):
            continue
        # the single model at the ablation budget is the budget stage's run of that length
        reference = WHERE["out"] / "budget" / f"single_e{ABLATION_EPOCHS}"
        dirs = [stage_dir, reference] if stage == "ablation" and reference.is_dir() else [stage_dir]
        table = write_report(dirs, WHERE["out"] / f"{stage}_report")
        sections += [f"## Stage `{stage}`", "", table.table, ""]
        if stage not in ("text", "vision"):
            sections += ["Diagnosis (validation split):", "", *diagnosis(stage), ""]
        protocol = protocol_tables(stage) if stage in TEST_STAGES else []
        if protocol:
            sections += [
                "Every method at its best validation epoch (its kept epoch; a deep ensemble's "
                "members each at their own), raw and after temperature scaling fitted on the "
                "validation split (+TS); OOD AUROC by each score, the logit scores first; then "
                "σN-Ens against one model and the deep ensemble, A − B with the paired "
                "bootstrap 95 % interval over test examples and seeds and the word it supports "
                "(better or worse only where the interval excludes 0):",
                "",
                *protocol,
                "",
            ]
        if stage in TEST_STAGES:
            sections += ["Test set, corruption and OOD:", "", *test_tables(stage), ""]
            sections += [
                "Logit OOD scores and split-conformal sets (α of the runs' config, calibrated "
                "on the validation split):",
                "",
                *posthoc_table(stage),
                "",
            ]
        plot = _plot_curves(stage, WHERE["out"].parent) if stage not in ("text", "vision") else None
        if plot:
            sections += [f"![{stage} learning curves]({plot.name})", ""]
    sections += [
        "## Validation NLL by backbone width (all 55,000 images, 10 epochs)",
        "",
        *width_table(),
        "",
    ]
    shares = sharing()
    sections += [
        "## Sharing against member quality (validation, seed 0)",
        "",
        "Each σN-Ens run that partitions every member norm with repeated inputs: the share of",
        "the features a member keeps (effective members / M), its members' mean NLL and the",
        "ensemble's.",
        "",
        *sharing_table(shares),
        "",
    ]
    plot = _plot_sharing(shares, WHERE["out"].parent)
    if plot:
        sections += [f"![sharing against member quality]({plot.name})", ""]
    path = WHERE["out"].parent / f"{WHERE['out'].name}.md"
    files.write_text(path, "\n".join(sections), mode=files.plain_mode(path))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=WHERE["out"], help="the study's directory")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="over every run"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="train the stages' runs not yet done")
    run_parser.add_argument("--stage", nargs="+", choices=list(STAGES), default=list(STAGES))
    run_parser.add_argument(
        "--seeds", nargs="+", type=int, default=[], help="these seeds only (default: all)"
    )
    run_parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="VARIANT",
        help="these variants only (default: all)",
    )
    sub.add_parser("report", help="write results/converged.md from the finished runs")
    sub.add_parser(
        "score",
        help="write the OOD scores, conformal halves and examples.npz a finished run of a test "
        "stage lacks (from its checkpoint and kept logits, while they are there)",
    )
    sub.add_parser("plan", help="list the runs and their status")
    args = parser.parse_args(argv)
    WHERE.update(out=args.out.resolve(), extra=tuple(args.set))
    os.chdir(ROOT)  # where the runs' relative paths (model.init_from) start
    if args.command == "run":
        return run(args.stage, args.seeds, args.only)
    if args.command == "report":
        print(report())
        return 0
    if args.command == "score":
        for stage in TEST_STAGES:
            for _, sweep_run in runs_of(stage):
                if (sweep_run.path() / FINAL).is_file():
                    _score_ood(stage, sweep_run.path())
        return 0
    study.print_plan([(stage, v, r) for stage in STAGES for v, r in runs_of(stage)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
