"""experiments/llm.py's plan and report: the report's cells are the runs' numbers, mean ± std
over seeds, and its OOD table is computed from the kept member logits (near and far OOD)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "llm.py"


@pytest.fixture()
def study(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the studies import their sibling `study`
    spec = importlib.util.spec_from_file_location("llm_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "llm_study", module)
    spec.loader.exec_module(module)
    return module


def _finished(
    path: Path, nll: float, members: int, far: np.ndarray | None, seconds=100.0, peak=None
):
    """A finished run: final.json, and member logits where the test reviews are confident
    (logit gap 4) and the OOD texts are not (gap 0 for all but the first)."""
    path.mkdir(parents=True)
    metrics = {"test/nll": nll, "test/accuracy": 0.8, "val/nll": nll - 0.05}
    final = {
        "metrics": metrics,
        "model": {"trainable_params": 1_000 * members},
        "train": {"seconds": seconds} | ({} if peak is None else {"peak_rss_mib": peak}),
    }
    (path / "final.json").write_text(json.dumps(final))
    test = np.zeros((members, 4, 2), np.float32)
    test[:, :, 1] = 4.0
    near = np.zeros((members, 3, 2), np.float32)
    near[:, 0, 1] = 8.0  # one plot text more confident than any review: AUROC 2/3
    val = np.zeros((members, 20, 2), np.float32)
    val[:, :, 1] = 3.0  # calibration: less confident than the test reviews, every label right
    np.savez(
        path / "outputs.npz",
        test=test,
        test_labels=np.ones(4, np.int64),
        val=val,
        val_labels=np.ones(20, np.int64),
        **{"ood/rt_plots": near},
    )
    if far is not None:
        np.savez(path / "ood_tweets.npz", logits=far, seconds=np.float64(12.5))


def test_report_means_seeds_and_scores_both_ood_sets(study, tmp_path):
    out = tmp_path / "llm"
    study.WHERE["out"] = out
    far = np.zeros((4, 2, 2), np.float32)
    far[1:, :, 1] = 3.0  # members disagree on the tweets: mutual information > 0 there
    _finished(out / "final" / "snens_split" / "seed=0", 0.40, 4, far)  # before peaks were kept
    _finished(out / "final" / "snens_split" / "seed=1", 0.44, 4, far, seconds=300.0, peak=4608)
    _finished(out / "final" / "single_fair" / "seed=0", 0.50, 1, None)
    (out / "final" / "single_fair" / "seed=1").mkdir()  # unfinished: not a row's seed
    _finished(out / "final" / "single" / "seed=0", 0.50, 1, np.zeros((1, 2, 2), np.float32))
    _finished(out / "final" / "single" / "seed=1", 0.50, 1, None)  # never scored on tweets
    _finished(out / "zeroshot", 0.60, 1, None)  # the untrained reference: no training record
    untrained = json.loads((out / "zeroshot" / "final.json").read_text())
    del untrained["train"]
    (out / "zeroshot" / "final.json").write_text(json.dumps(untrained))

    text = study.report().read_text()
    split = next(
        line
        for line in text.splitlines()
        if line.startswith("| σN-Ens-LoRA, τ=5 λ=0.01, split (preset)")
    )
    cells = [c.strip() for c in split.strip("|").split("|")]
    assert cells[1] == "0 1"
    assert cells[2] == "0.370 ± 0.028"  # val NLL: 0.35 and 0.39
    assert cells[4] == "0.420 ± 0.028"  # NLL
    # train s (mean), infer s, peak GiB (the one seed that recorded it), trainable
    assert cells[-4:] == ["200", "12", "4.5", "4,000"]
    single = next(line for line in text.splitlines() if line.startswith("| one LoRA model, n"))
    assert single.split("|")[-3].strip() == "—"  # no peak recorded
    zero = next(line for line in text.splitlines() if line.startswith("| prompted base model"))
    assert [c.strip() for c in zero.strip("|").split("|")][-4:] == ["0", "—", "—", "1,000"]

    single, split_ood = (
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.split("OOD detection")[1].split("Split-conformal")[0].splitlines()
        if line.startswith(("| one LoRA model, norms", "| σN-Ens-LoRA, τ=5 λ=0.01, split (preset)"))
    )
    # plots MSP, MI, max-logit, energy; tweets the same. The plot texts with logits (0, 0)
    # have a lower top logit (0 < 4) and a higher energy than any review: 2 of 3 ranked OOD
    assert single[1:] == ["0", "0.667", "0.500", "0.667", "0.667", "—", "—", "—", "—"]
    plain = next(
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.split("OOD detection")[1].splitlines()
        if line.startswith("| one LoRA model |")
    )
    assert plain[2] == "0.667 ± 0.000"  # plots MSP: both seeds
    assert plain[6] == "1.000 (1 of 2)"  # tweets MSP: one seed of two scored, and said so
    assert split_ood[2] == "0.667 ± 0.000"  # plots MSP, both seeds
    assert split_ood[3] == "0.500 ± 0.000"  # plots MI: the members agree everywhere
    assert split_ood[4:6] == ["0.667 ± 0.000"] * 2  # plots max-logit, energy
    assert split_ood[6] == "1.000 ± 0.000"  # tweets MSP: every tweet less sure than any review
    assert split_ood[7] == "1.000 ± 0.000"  # tweets MI: members disagree on tweets only
    # tweets max-logit, energy: the mean logit (0, 2.25) tops out below a review's (0, 4)
    assert split_ood[8:] == ["1.000 ± 0.000"] * 2

    # conformal sets at α = 0.1 from the validation logits: THR's threshold is 1 − σ(3), so
    # each test set holds the label (1 − σ(4) below it) and nothing else
    conformal = text.split("Split-conformal")[1]
    split_sets = next(
        [c.strip() for c in line.strip("|").split("|")]
        for line in conformal.splitlines()
        if line.startswith("| σN-Ens-LoRA, τ=5 λ=0.01, split (preset)")
    )
    assert split_sets[2:4] == ["1.000 ± 0.000", "1.000 ± 0.000"]  # THR coverage, size
    assert all(cell != "—" for cell in split_sets[4:6])  # APS measured too
    assert split_sets[6:] == ["—"] * 3  # halves of 2 test reviews: too few to calibrate on


def test_lora_ensemble_of_fine_tunes_run_apart_pools_four_seeds(study, tmp_path):
    """The field's LoRA ensemble is four fair single runs of seeds 4g..4g+3, their logits
    stacked: the report's row has a seed group only once all four have finished, its NLL is
    the NLL of the mean of the four runs' probabilities, and its costs are summed."""
    import torch

    from snens import metrics

    out = tmp_path / "llm"
    study.WHERE["out"] = out
    for seed in range(6):  # seeds 4 and 5 of the second group: unfinished
        _finished(out / "final" / "single_fair" / f"seed={seed}", 0.5, 1, None, seconds=10.0 + seed)
        kept = dict(np.load(out / "final" / "single_fair" / f"seed={seed}" / "outputs.npz"))
        kept["test"] = kept["test"] * (1 - seed / 8)  # four runs of four confidences
        kept["test"][:, 0] = kept["test"][:, 0][..., ::-1] if seed % 2 else kept["test"][:, 0]
        np.savez(out / "final" / "single_fair" / f"seed={seed}" / "outputs.npz", **kept)
    assert [len(u) for u in study._units("final", "single_fair", study.POOL)] == [4]

    pooled = study.pooled_metrics([out / "final" / "single_fair" / f"seed={s}" for s in range(4)])
    logits = torch.cat(
        [
            torch.from_numpy(
                np.load(out / "final" / "single_fair" / f"seed={s}" / "outputs.npz")["test"]
            )
            for s in range(4)
        ]
    )  # (4, 4, 2)
    labels = torch.ones(4, dtype=torch.long)
    assert pooled["test/nll"] == pytest.approx(metrics.nll(logits.softmax(-1).mean(0), labels))
    assert pooled["test/num_members"] == 4.0
    # text 0: runs 0 and 2 say positive, 1 and 3 negative, 4 of 6 pairs differ; the rest agree
    assert pooled["test/disagreement"] == pytest.approx(4 / 6 / 4)
    assert {"test_ts/nll", "val/member_nll_mean", "ood/rt_plots/msp/auroc"} <= pooled.keys()
    assert not any(key.startswith("ood/tweets") for key in pooled)  # no run scored on tweets

    text = study.report().read_text()
    row = next(line for line in text.splitlines() if line.startswith("| LoRA ensemble, M=4 fine-"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "0–3"
    assert cells[4] == f"{pooled['test/nll']:.3f}"
    # train s: 10 + 11 + 12 + 13; infer s: none scored on tweets; peak: none recorded;
    # trainable: four runs of 1,000
    assert cells[-4:] == ["46", "—", "—", "4,000"]
    single = next(line for line in text.splitlines() if line.startswith("| one LoRA model, n"))
    assert single.split("|")[2].strip() == "0 1 2 3 4 5"
    diagnosis = text.split("Diagnosis")[1].split("OOD detection")[0]
    row = next(line for line in diagnosis.splitlines() if line.startswith("| LoRA ensemble, M=4 f"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    gain = pooled["val/member_nll_mean"] - pooled["val/nll"]
    assert cells[6] == f"{gain:.3f}" and cells[-2:] == ["—", "—"]

    mismatched = dict(np.load(out / "final" / "single_fair" / "seed=3" / "outputs.npz"))
    mismatched["test_labels"] = np.zeros(4, np.int64)
    np.savez(out / "final" / "single_fair" / "seed=3" / "outputs.npz", **mismatched)
    with pytest.raises(ValueError, match="evaluated on different test examples"):
        study.pooled_metrics([out / "final" / "single_fair" / f"seed={s}" for s in range(4)])


def test_plan_lists_every_run_of_every_stage(study, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # main() moves to the repository root
    assert study.main(["--out", str(tmp_path / "llm"), "plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # final: 5 variants × 3 seeds and the fair single model's 12 (three LoRA ensembles of
    # four fine-tunes run apart); tune 2, tune_split 16; selected: σN-Ens and MC-dropout × 3
    # and the fair single model's 12 again, σN-Ens at the library's τ and λ × 3
    assert len(lines) == 5 * 3 + 12 + 2 + 16 + 2 * 3 + 12 + 3
    single_fair = [
        line.split()[2] for line in lines if line.split()[:2] == ["final", "single_fair"]
    ]
    assert single_fair == [f"seed={s}" for s in range(12)]
    assert lines[0].split() == ["final", "single_fair", "seed=0", "todo"]
    tune_split = [line.split() for line in lines if line.startswith("tune_split")]
    assert tune_split[-1] == ["tune_split", "split_head_reset", "seed=0", "todo"]
    assert tune_split[-2] == ["tune_split", "split_gamma100", "seed=0", "todo"]
    # selected: σN-Ens seed s, then the four fine-tunes of the s-th LoRA ensemble, MC-dropout
    # last (a comparison is complete after each group)
    selected = [line.split()[1:3] for line in lines if line.startswith("selected")]
    assert selected[:6] == [
        ["snens_split", "seed=0"],
        *(["single_fair", f"seed={s}"] for s in range(4)),
        ["snens_split", "seed=1"],
    ]
    assert selected[-6:-3] == [["mc_dropout_fair", f"seed={s}"] for s in range(3)]
    assert selected[-3:] == [["snens_split_tau1_lam0.1", f"seed={s}"] for s in range(3)]
    configs = {(v.name, r.config.seed): r.config for _, v, r in study.runs_of("selected")}
    tau1 = configs[("snens_split_tau1_lam0.1", 0)].method
    assert (tau1.input_policy, tau1.temperature, tau1.diversity_weight) == ("split", 1.0, 0.1)
    config = configs[("snens_split", 0)]
    assert config.optim.select == "nll" and config.data.test_examples == 0
    assert config.data.domains == ("tweets",) and config.data.ood == ("rt_plots", "tweets")
    # every split tune run trains on split inputs, one change from the preset's recipe each
    configs = {v.name: r.config for _, v, r in study.runs_of("tune_split")}
    assert {c.method.input_policy for c in configs.values()} == {"split"}
    assert configs["split_lambda0"].method.diversity_weight == 0.0
    assert configs["split_tau1"].method.temperature == 1.0
    assert configs["split_tau1"].method.diversity_weight == 0.01
    assert configs["split_epochs3"].optim.epochs == 3
    assert configs["split_gamma_std3"].method.options == {"gamma_std": 3.0}
    assert configs["split_lr1e3"].optim.lr == 1e-3
    assert configs["split_lr1e3"].method.gamma_lr_multiplier == 30.0  # γ's lr follows: 3e-2
    assert configs["split_final"].method.options == {"norms": ["model.norm"]}
    assert configs["split_final"].model.options["train_norms"] is True  # every norm trains
    assert configs["split_mlp"].method.options == {
        "norms": ["post_attention_layernorm", "model.norm"]
    }
    assert configs["split_last8"].method.options == {
        "norms": r".*\.layers\.(2[2-9])\..*|.*\.model\.norm"
    }
    final = {v.name: r.config for _, v, r in study.runs_of("final") if r.config.seed == 0}
    assert final["snens"].method.input_policy == "repeat"
    assert final["snens_split"].method.input_policy == "split"  # the preset's
    tune = {v.name: r.config for _, v, r in study.runs_of("tune")}
    assert tune["snens_own"].method.input_policy == "own"
    assert list(tune) == ["snens_own", "snens_own_epochs1"]
    assert tune["snens_own_epochs1"].method.input_policy == "own"
    assert tune["snens_own_epochs1"].optim.epochs == 1
    assert configs["split_epochs1"].optim.epochs == 1
    assert configs["split_defaults"].method.temperature == 1.0
    assert configs["split_defaults"].method.diversity_weight == 0.1
    assert configs["split_gamma1"].method.gamma_lr_multiplier == 1.0
    assert configs["split_r16"].model.options["lora_r"] == 16
    assert configs["split_r16"].model.options["lora_alpha"] == 32.0
    assert configs["split_lora_all"].model.options["lora_targets"] == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    assert configs["split_head_reset"].method.options == {"head_init": "reset"}
    assert configs["split_gamma100"].method.gamma_lr_multiplier == 100.0


def test_every_committed_run_is_the_run_its_variant_plans(study):
    """The study's definitions (the preset and each variant's overrides) still plan, for every
    run whose config is committed under results/llm, exactly the config it ran with: a change
    to the preset that silently moved a finished run to another recipe fails here."""
    from snens.engine.runs import read_config
    from snens.engine.sweep import config_differences

    compared = 0
    for stage in study.STAGES:
        for _, variant, run in study.runs_of(stage):
            if (run.path() / "config.toml").is_file():
                # the output folder is recorded as an absolute path, which depends on where the
                # checkout lives: compare its place under the repository instead; a key added
                # to the config after the run was made is not in its file and not compared
                recorded_out = Path(read_config(run.path()).out_dir).parts[-4:]
                planned_out = Path(run.config.out_dir).parts[-4:]
                assert recorded_out == planned_out == ("results", "llm", stage, variant.name)
                assert config_differences(run.path(), run.config) == [], (stage, variant.name)
                assert read_config(run.path()).name == run.config.name
                compared += 1
    assert compared >= 13  # 12 final runs of seeds 0-1 and the finished tune runs


def test_runs_are_listed_in_seed_order_not_as_text(study, tmp_path, monkeypatch):
    for seed in (10, 2, 1):
        run = tmp_path / "final" / "single_fair" / f"seed={seed}"
        run.mkdir(parents=True)
        (run / "final.json").write_text("{}")
    monkeypatch.setitem(study.WHERE, "out", tmp_path)
    assert [p.name for p in study._runs("final", "single_fair")] == ["seed=1", "seed=2", "seed=10"]


def test_recipe_questions_are_paired_on_the_validation_reviews(study, tmp_path):
    """A recipe's validation NLL against the preset's seed 0, review by review: validation
    logits (0, 3) give each right label −log σ(3); a recipe at (0, 2) on half of the reviews
    loses log σ(3) − log σ(2) on those, so its mean difference is half that and its standard
    error the std of a two-valued 0/d column over √20."""
    import math

    out = tmp_path / "llm"
    study.WHERE["out"] = out
    _finished(out / "final" / "snens_split" / "seed=0", 0.40, 4, None)
    _finished(out / "final" / "snens_split" / "seed=1", 0.40, 4, None)
    _finished(out / "tune_split" / "split_tau1" / "seed=0", 0.40, 4, None)
    recipe = dict(np.load(out / "tune_split" / "split_tau1" / "seed=0" / "outputs.npz"))
    recipe["val"][:, :10, 1] = 2.0
    np.savez(out / "tune_split" / "split_tau1" / "seed=0" / "outputs.npz", **recipe)

    def log_sigmoid(x):
        return -math.log1p(math.exp(-x))

    d = log_sigmoid(3.0) - log_sigmoid(2.0)  # the loss on each changed review
    mean, error = study.paired_val_nll(
        out / "tune_split" / "split_tau1" / "seed=0", out / "final" / "snens_split" / "seed=0"
    )
    assert mean == pytest.approx(d / 2, rel=1e-6)
    assert error == pytest.approx(math.sqrt(20 / 19 * (d / 2) ** 2) / math.sqrt(20), rel=1e-6)

    rows = study.recipe_rows()
    preset = "σN-Ens-LoRA, τ=5 λ=0.01, split (preset)"
    unscored = ["—"] * 4  # not yet scored on the further validation reviews
    assert rows == [
        [f"{preset}, seed 1", "+0.0000", "0.0000", *unscored],
        ["σN-Ens-LoRA split, τ=1", f"{d / 2:+.4f}", f"{error:.4f}", *unscored],
    ]

    # The further reviews: 10 more, the recipe losing d on the first 2 (a fifth of them); of
    # all 30 reviews, 12 changed
    for run in (
        "final/snens_split/seed=0",
        "final/snens_split/seed=1",
        "tune_split/split_tau1/seed=0",
    ):
        logits = np.zeros((4, 10, 2), np.float32)
        logits[..., 1] = 3.0
        if "tau1" in run:
            logits[:, :2, 1] = 2.0
        np.savez(
            out / run / study.MORE_VALIDATION_FILE,
            logits=logits,
            labels=np.ones(10, np.int64),
            seconds=1.0,
        )
    more_error = math.sqrt(10 / 9 * 0.2 * 0.8) * d / math.sqrt(10)
    both_error = math.sqrt(30 / 29 * 0.4 * 0.6) * d / math.sqrt(30)
    rows = study.recipe_rows()
    assert rows[0][3:] == ["+0.0000", "0.0000", "+0.0000", "0.0000"]
    assert rows[1][3:] == [
        f"{d / 5:+.4f}",
        f"{more_error:.4f}",
        f"{0.4 * d:+.4f}",
        f"{both_error:.4f}",
    ]

    other = dict(recipe, val_labels=np.zeros(20, np.int64))
    np.savez(out / "tune_split" / "split_tau1" / "seed=0" / "outputs.npz", **other)
    with pytest.raises(ValueError, match="validated on different reviews"):
        study.recipe_rows()


def test_further_validation_reviews_are_neither_trained_nor_validated_on(study, monkeypatch):
    """The further validation reviews are 1,000 reviews of the corpus that the engine puts in
    none of a study run's sets: what it tokenizes for training, validation and test is
    captured (a stand-in tokenizer: the texts are what matters) and compared."""
    import torch

    from snens import data
    from snens.engine.datasets import build_data

    tokenized = []

    def capture(tokenizer, texts, *, max_length, padding):
        tokenized.append(list(texts))
        return torch.ones(len(texts), 1, dtype=torch.long), torch.ones(len(texts), 1).long()

    monkeypatch.setattr(data, "tokenize", capture)
    monkeypatch.setattr("snens.models.text.tokenizer", lambda encoder=None: None)
    config = study.runs_of("final")[0][2].config
    build_data(config.data, seed=0, encoder=None)
    train, validation, test = map(set, tokenized[:3])
    assert (len(train), len(validation), len(test)) == (1000, 500, 1000)

    texts, labels = study.more_validation_texts(config)
    assert len(set(texts)) == study.MORE_VALIDATION == 1000
    assert not set(texts) & (train | validation | test)
    assert sum(labels) == 578  # fresh reviews; the corpus is 57.8 % fresh
    assert study.more_validation_texts(config) == (texts, labels)  # the same draw every time


# ------------------------------------------------------------------------------------------------
# The committed report is the committed runs' numbers
# ------------------------------------------------------------------------------------------------

ROOT = SCRIPT.parents[1]
REPORT = ROOT / "results" / "llm.md"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _within_last_digit(written: str, remade: str) -> bool:
    """The same text, a metric's value (3 or more decimals) equal up to one unit of its last
    printed digit, every other number exactly: the report recomputes some cells from float32
    logits, whose last bits may differ on another CPU and so round a value lying on a
    boundary the other way."""
    words, numbers = NUMBER.split(written), NUMBER.findall(written)
    if words != NUMBER.split(remade):
        return False
    for a, b in zip(numbers, NUMBER.findall(remade), strict=True):
        decimals = len(a.partition(".")[2])
        if decimals < 3 or len(b.partition(".")[2]) != decimals:
            if a != b:
                return False
        elif abs(float(a) - float(b)) > 1.5 * 10**-decimals:
            return False
    return True


@pytest.mark.pins_text
def test_the_committed_report_is_the_committed_runs_report(study, tmp_path, monkeypatch):
    """results/llm.md is what ``llm.py report`` writes from the committed run directories: a
    run committed without regenerating the report, or a report edited by hand, fails here
    (regenerate: ``python experiments/llm.py report``)."""
    (tmp_path / "llm").symlink_to(ROOT / "results" / "llm")
    monkeypatch.setitem(study.WHERE, "out", tmp_path / "llm")
    assert study.report() == tmp_path / "llm.md"  # written beside the runs, not over the report
    remade = (tmp_path / "llm.md").read_text(encoding="utf-8").splitlines()
    written = REPORT.read_text(encoding="utf-8").splitlines()
    assert len(remade) == len(written)
    for line, (a, b) in enumerate(zip(written, remade, strict=True), 1):
        assert _within_last_digit(a, b), f"results/llm.md line {line}: {a!r}, remade {b!r}"


def test_numbers_may_differ_by_their_last_digit_and_nothing_else():
    assert _within_last_digit("| 0.396 ± 0.004 | 1,203 |", "| 0.397 ± 0.004 | 1,203 |")
    assert _within_last_digit("| +0.0102 | 0.0096 |", "| +0.0101 | 0.0096 |")
    assert not _within_last_digit("| 0.396 ± 0.004 |", "| 0.398 ± 0.004 |")
    assert not _within_last_digit("| 0.396 | 1,203 |", "| 0.396 | 1,204 |")
    assert not _within_last_digit("| split, λ=0 | 0.396 |", "| split, λ=1 | 0.396 |")
    assert not _within_last_digit("| 0.396 |", "| 0.396 | 0.401 |")


def test_conformal_sets_calibrated_on_test_halves_cover_as_promised(study):
    """Sets calibrated on one half of the test examples and measured on the other: confident,
    right members give the one right class every time (coverage and size exactly 1); on
    random logits the mean coverage over the halvings lies within the guarantee's bounds,
    1 − α ≤ coverage ≤ 1 − α + 1/(n + 1) for n calibration examples."""
    import torch

    labels = torch.arange(40) % 2
    confident = torch.zeros(3, 40, 2)
    confident[:, torch.arange(40), labels] = 4.0
    assert study.halved_test_conformal(confident, labels) == {
        "test/conformal_thr_halves_coverage": 1.0,
        "test/conformal_thr_halves_coverage_std": 0.0,
        "test/conformal_thr_halves_size": 1.0,
    }

    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 400, 5, generator=generator)
    labels = torch.randint(0, 5, (400,), generator=generator)
    halves = study.halved_test_conformal(logits, labels, alpha=0.2)
    assert 0.8 - 0.01 <= halves["test/conformal_thr_halves_coverage"] <= 0.8 + 1 / 201 + 0.01
    assert 1.0 < halves["test/conformal_thr_halves_size"] < 5.0
    # one calibration sample of 200 moves the coverage by ~√(α(1 − α)/200) = 0.028, and so
    # does measuring it on 200 examples
    assert 0.02 < halves["test/conformal_thr_halves_coverage_std"] < 0.06
    # 16 examples: halves of 8, too few for the quantile at α = 0.1 (9 at least)
    assert study.halved_test_conformal(confident[:, :16], torch.arange(16) % 2) == {}
