"""experiments/converged.py at a tiny scale: two processes share one queue (each run trains
once), a killed worker's run is taken over, and the report picks the budget from validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "converged.py"
TINY = [
    "--set", "data.train_examples=200",
    "--set", "data.validation_examples=200",
    "--set", "data.test_examples=200",
    "--set", "data.ood_examples=200",
    "--set", "data.corruption_examples=100",
    "--set", "data.batch_size=100",
    "--set", "model.options={width=4}",
]  # fmt: skip


def _study(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(out), *TINY, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


EPOCHS = (5, 10, 20, 40, 80)


def test_two_workers_share_the_budget_stage_and_the_report_picks_the_budget(tmp_path):
    out = tmp_path / "converged"
    # the run lock a killed worker left (naming a process that is gone) holds nothing back
    stale = out / "budget" / "single_e5" / "seed=0" / "run.lock"
    stale.parent.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    stale.write_text(f"{os.uname().nodename} {dead}")

    workers = [_study(out, "run", "--stage", "budget") for _ in range(2)]
    logs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], logs
    lines = [line for log in logs for line in log.splitlines()]
    assert sum(": finished in" in line for line in lines) == len(EPOCHS), logs  # once each
    assert not any("FAILED" in line for line in lines), logs
    assert not list(out.rglob("*.lock"))

    finals = {}
    for e in EPOCHS:
        run = out / "budget" / f"single_e{e}" / "seed=0"
        final = json.loads((run / "final.json").read_text())
        curve = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert len(curve) == e and final["train"]["epochs"] == e
        assert final["metrics"]["val/nll"] == pytest.approx(curve[-1]["val/nll"], rel=1e-12)
        finals[e] = final["metrics"]["val/nll"]

    report = _study(out, "report")
    text = report.communicate(timeout=300)[0]
    assert report.returncode == 0, text
    md = (tmp_path / "converged.md").read_text()
    best = min(finals.values())
    chosen = min(e for e, v in finals.items() if v <= best + 0.005)
    assert f"Converged budget: {chosen} epochs." in md
    assert (tmp_path / "converged_budget_curves.png").stat().st_size > 10_000
    # nothing is trained twice: a second pass finds every run done
    again = _study(out, "run", "--stage", "budget")
    assert "== " not in again.communicate(timeout=300)[0]


def _converged_module():
    import importlib.util

    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))  # the studies import their sibling `study`
    spec = importlib.util.spec_from_file_location("converged_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_final_length_is_decided_as_soon_as_a_longer_run_cannot_change_it():
    study = _converged_module()
    assert study.FINAL_MAX_EPOCHS == 40 and study.CONVERGED_WITHIN == 0.005
    still_improving = {5: 0.264, 10: 0.224, 20: 0.199, 40: 0.186}  # 80 not finished
    assert study.final_epochs(still_improving) == 40  # nothing under 40 within 0.005 of 0.186
    # 20 is within 0.005 of the best so far: an 80-epoch run far lower could still push it out
    flat = {5: 0.264, 10: 0.224, 20: 0.189, 40: 0.186}
    assert study.final_epochs(flat) is None
    assert study.final_epochs({**flat, 80: 0.190}) == 20
    assert study.final_epochs({**flat, 80: 0.150}) == 40  # capped: converged is 80
    assert study.final_epochs({5: 0.264, 10: 0.224, 40: 0.186}) is None  # 20 unknown
    assert study.final_epochs({}) is None


def test_the_vision_winner_is_chosen_on_validation_and_trained_without_it(tmp_path):
    study = _converged_module()
    study.WHERE["out"] = tmp_path
    names = [v.name for v in study.STAGES["vision_tune"]]
    assert study.vision_variants() == study.STAGES["vision"]  # nothing finished: no winner
    val_nll = dict(zip(names, (0.25, 0.30, 0.27, 0.26, 0.28, 0.29, 0.31), strict=True))
    # the single model's 0.25 is lowest, but only σN-Ens variants compete; the test NLL is
    # a decoy that would pick another one, and so is the last epoch's validation NLL: the
    # best epoch's counts (every run is evaluated at its best epoch)
    for i, (name, nll) in enumerate(val_nll.items()):
        run = tmp_path / "vision_tune" / name / "seed=0"
        run.mkdir(parents=True)
        metrics = {"val/nll": 0.4 - 0.01 * i, "test/nll": 0.1 + 0.01 * (6 - i)}
        curve = [nll + 0.05, nll, 0.4 - 0.01 * i]
        if name == "snens_lam0":
            assert study.chosen_recipe("vision_tune") is None  # one still to finish
        (run / "metrics.jsonl").write_text(
            "".join(json.dumps({"epoch": e + 1, "val/nll": v}) + "\n" for e, v in enumerate(curve))
        )
        (run / study.FINAL).write_text(json.dumps({"metrics": metrics}))
    chosen = study.chosen_recipe("vision_tune")
    assert chosen.name == "snens_glr3"
    variants = study.vision_variants()
    assert [v.name for v in variants[:-1]] == [v.name for v in study.STAGES["vision"]]
    assert variants[-1].name == "snens_glr3_chosen"
    assert variants[-1].overrides == ("method.name=snens", "method.gamma_lr_multiplier=3")
    assert variants[-1].seeds == (0, 1, 2) and variants[-1].preset == study.VISION


def test_training_seconds_read_past_an_epoch_the_process_was_stopped_in(tmp_path):
    study = _converged_module()
    seconds = [50.0, 52.0, 512.0, 51.0]  # the third epoch spans a SIGSTOP of 460 s
    records = [{"epoch": i + 1, "seconds": s, "val/nll": 0.3} for i, s in enumerate(seconds)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert study._median_epochs_seconds(tmp_path) == pytest.approx(4 * 51.5)
    assert sum(seconds) == 665.0  # what the wall clock (train/seconds) says


def test_the_learning_curves_draw_finished_runs_and_count_the_rest(tmp_path):
    study = _converged_module()
    study.WHERE["out"] = tmp_path
    names = [v.name for v in study.STAGES["text_tune"]]
    record = json.dumps({"epoch": 1, "seconds": 9.0, "val/nll": 0.5}) + "\n"
    for i, name in enumerate(names[:4]):
        run = tmp_path / "text_tune" / name / "seed=0"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(record)
        if i % 2 == 0:  # the others are still training: a curve, no final.json
            (run / study.FINAL).write_text(json.dumps({"metrics": {"val/nll": 0.5}}))
    curves, training = study.curve_runs("text_tune")
    assert curves == {n: [tmp_path / "text_tune" / n / "seed=0"] for n in names[:4:2]}
    assert training == 2


def test_the_text_winner_joins_the_text_stage_unless_it_is_the_defaults(tmp_path):
    study = _converged_module()
    study.WHERE["out"] = tmp_path
    names = [v.name for v in study.STAGES["text_tune"]]
    assert names[:2] == ["single", "snens_default"]

    def finish(val_nll):
        for name, nll in zip(names, val_nll, strict=True):
            run = tmp_path / "text_tune" / name / "seed=0"
            run.mkdir(parents=True, exist_ok=True)
            (run / study.FINAL).write_text(json.dumps({"metrics": {"val/nll": nll}}))

    assert study.text_variants() == study.STAGES["text"]  # nothing finished
    finish((0.40, 0.45, 0.50, 0.47, 0.46, 0.48, 0.49))  # the defaults lowest of σN-Ens
    assert study.chosen_recipe("text_tune").name == "snens_default"
    assert study.text_variants() == study.STAGES["text"]  # the stage trains them already
    finish((0.40, 0.45, 0.43, 0.47, 0.46, 0.48, 0.49))  # γ ×10 lowest
    variants = study.text_variants()
    assert variants[:-1] == study.STAGES["text"]
    assert variants[-1].name == "snens_glr10_chosen" and variants[-1].preset == study.TEXT
    assert variants[-1].overrides == ("method.name=snens", "method.gamma_lr_multiplier=10")
    assert variants[-1].seeds == (0, 1, 2)
    # every text run pins γ at the ×50 the stage was made with, and text_tune holds texts out
    runs = study.runs_of("text_tune")
    assert {
        r.config.method.gamma_lr_multiplier for _, r in runs if r.config.method.name == "snens"
    } == {
        10.0,
        50.0,
        150.0,
    }
    assert {r.config.data.validation_examples for _, r in runs} == {1000}


def test_posthoc_starts_each_seed_from_its_single_model_and_chooses_on_validation(tmp_path):
    study = _converged_module()
    study.WHERE["out"] = tmp_path
    assert study.posthoc_variants() == []  # no single model of the final stage yet

    def finish(stage, name, seed, val_nll):
        run = tmp_path / stage / name / f"seed={seed}"
        run.mkdir(parents=True, exist_ok=True)
        (run / study.FINAL).write_text(json.dumps({"metrics": {"val/nll": val_nll}}))

    finish("final", "single", 0, 0.19)
    finish("final", "single", 1, 0.19)
    variants = study.posthoc_variants()
    names = [v.name for v in variants]
    assert names == [
        "single_continued",
        "snens_lr3e-4",
        "snens_lr1e-3",
        "snens_tau5_lam0.01_lr3e-4",
        "snens_reset_lr3e-4",
        "snens_glr3_lr3e-4",
    ]
    assert variants[0].seeds == (0, 1)  # the seeds whose single model has finished
    assert [v.seeds for v in variants[1:]] == [(0,), (0,), (0,), (0,), (0, 1)]
    # one template for every seed, outside the repository an absolute path
    source = str(tmp_path / "final" / "single" / "seed={seed}")
    for v in variants:
        assert (
            f"model.init_from={json.dumps(source)}" in v.overrides
            and "optim.epochs=4" in v.overrides
        )
    for name, nll in zip(names[1:], (0.185, 0.181, 0.188, 0.183, 0.184), strict=True):
        finish("posthoc", name, 0, nll)
    chosen = study.posthoc_variants()[-1]
    assert chosen.name == "snens_lr1e-3_chosen" and chosen.seeds == (0, 1)
    assert "optim.lr=0.001" in chosen.overrides
    runs = [r for v, r in study.runs_of("posthoc") if v.name == chosen.name]
    assert [r.config.model.init_from for r in runs] == [source, source]
    assert [r.config.seed for r in runs] == [0, 1]


def test_the_sharing_figure_takes_the_runs_that_partition_every_norm(tmp_path):
    study = _converged_module()
    study.WHERE["out"] = tmp_path
    values = {  # variant: (effective members, member NLL, ensemble NLL)
        "snens_tau1_lam0.1": (1.93, 0.297, 0.276),
        "snens_lam0": (3.78, 0.233, 0.232),
        "snens_tau1_lam0.1_m2": (1.0, 0.291, 0.275),  # M=2: k/M = 0.5
        "snens_tau1_lam0.1_stage3": (3.0, 0.244, 0.240),  # one stage only: left out
        "snens_tau1_lam0.1_split_e10": (1.93, 0.363, 0.342),  # split inputs: left out
        "snens_tau1_lam0.1_split_e40": (1.93, 0.25, 0.19),  # 40 epochs: left out
        "deep_ensemble": (None, 0.19, 0.17),  # not σN-Ens
    }
    for name, (k, member, ensemble) in values.items():
        run = tmp_path / "ablation" / name / "seed=0"
        run.mkdir(parents=True)
        final = {
            "metrics": {"val/member_nll_mean": member, "val/nll": ensemble},
            "model": {"effective_members": k},
        }
        (run / study.FINAL).write_text(json.dumps(final))
    assert study.sharing_points("ablation") == [
        ("snens_tau1_lam0.1", pytest.approx(1.93 / 4), 0.297, 0.276),
        ("snens_tau1_lam0.1_m2", 0.5, 0.291, 0.275),
        ("snens_lam0", pytest.approx(3.78 / 4), 0.233, 0.232),
    ]
    single = tmp_path / "budget" / "single_e10" / "seed=0"
    single.mkdir(parents=True)
    (single / study.FINAL).write_text(json.dumps({"metrics": {"val/nll": 0.224}}))
    shares = study.sharing()
    table = study.sharing_table(shares)
    assert "| ablation | snens_tau1_lam0.1_m2 | 0.50 | 0.291 | 0.275 | 0.224 |" in table
    assert study._plot_sharing(shares, tmp_path).stat().st_size > 10_000


def test_the_width_table_averages_the_finished_seeds_and_gives_the_defaults_gap(tmp_path):
    study = _converged_module()
    study.WHERE["out"] = tmp_path
    finished = {  # (stage, variant): validation NLL by seed
        ("budget", "single_e10"): [0.224],
        ("ablation", "snens_tau1_lam0.1"): [0.276],
        ("width", "single_w64"): [0.182, 0.188, 0.186],
        ("width", "deep_ensemble_w64"): [0.180, 0.180],
        ("width", "snens_tau1_lam0.1_w64"): [0.195, 0.194, 0.196],
    }
    for (stage, variant), values in finished.items():
        for seed, nll in enumerate(values):
            run = tmp_path / stage / variant / f"seed={seed}"
            run.mkdir(parents=True)
            (run / study.FINAL).write_text(json.dumps({"metrics": {"val/nll": nll}}))
    unfinished = tmp_path / "width" / "deep_ensemble_w64" / "seed=2"
    unfinished.mkdir()  # started, no final.json: not counted
    table = study.width_table()
    assert table[0].startswith("| width | single | deep ensemble | σN-Ens λ=0 |")
    assert table[2] == "| 16 | 0.224 (n=1) | – | – | – | 0.276 (n=1) | +0.052 |"
    assert table[3] == "| 32 | – | – | – | – | – | – |"
    assert table[4] == (
        "| 64 | 0.185 ± 0.003 (n=3) | 0.180 ± 0.000 (n=2) | – | – | 0.195 ± 0.001 (n=3) | +0.010 |"
    )


def test_the_posthoc_table_reads_logit_scores_and_conformal_sets_where_runs_recorded_them(
    tmp_path,
):
    """Runs that kept their logits record max-logit and energy AUROC and the conformal sets in
    final.json; the table means them over seeds. Runs that predate them get a note, not a
    table of dashes."""
    study = _converged_module()
    study.WHERE["out"] = tmp_path
    single, snens_run = (v.name for v in study.STAGES["overfit"][:2])
    runs = ((single, 0, 0.90), (single, 1, 0.92), (snens_run, 0, 0.91))
    for name, seed, _ in runs:
        run = tmp_path / "overfit" / name / f"seed={seed}"
        run.mkdir(parents=True)
        (run / study.FINAL).write_text(json.dumps({"metrics": {"test/accuracy": 0.9}}))
    assert study.posthoc_table("overfit")[0].startswith("Logit OOD scores and conformal sets: not")

    for name, seed, coverage in runs:
        metrics = {
            "ood/mnist_5k/max_logit/auroc": 0.7 + seed / 10,
            "ood/mnist_5k/energy/auroc": 0.75,
            "test/conformal_thr_coverage": coverage,
            "test/conformal_thr_size": 1.2,
        }
        final = tmp_path / "overfit" / name / f"seed={seed}" / study.FINAL
        final.write_text(json.dumps({"metrics": metrics}))
    # a seed that finished before the runs kept their logits counts in no cell, nor in n
    older = tmp_path / "overfit" / single / "seed=2"
    older.mkdir()
    (older / study.FINAL).write_text(json.dumps({"metrics": {"test/accuracy": 0.9}}))
    header, _, *lines = study.posthoc_table("overfit")
    assert [c.strip() for c in header.strip("|").split("|")][2:4] == [
        "OOD AUROC max-logit",
        "energy",
    ]
    rows = {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    }
    # max-logit 0.7 and 0.8; energy 0.75 twice; THR coverage 0.90 and 0.92; APS never
    # recorded; no sets over test halvings (no conformal_halves.json, no outputs.npz)
    assert rows[single] == ["2", "0.7500 ± 0.0707", "0.7500 ± 0.0000", "0.9100 ± 0.0141",
                            "1.2000 ± 0.0000", "–", "–", "–", "–", "–"]  # fmt: skip
    assert rows[snens_run][:4] == ["1", "0.7000", "0.7500", "0.9100"]
    # the sets over test halvings, where a run recorded them
    halves = {"thr/coverage": 0.9, "thr/coverage_std": 0.005, "aps/coverage": 0.901}
    run = tmp_path / "overfit" / snens_run / "seed=0"
    (run / study.CONFORMAL_HALVES).write_text(json.dumps(halves))
    header, _, *lines = study.posthoc_table("overfit")
    assert [c.strip() for c in header.strip("|").split("|")][-3:] == [
        "THR coverage, test halves",
        "its std over the halvings",
        "APS coverage, test halves",
    ]
    row = next(line for line in lines if line.startswith(f"| {snens_run} |"))
    assert row.endswith("| 0.9000 | 0.0050 | 0.9010 |")


def test_a_finished_test_stage_run_keeps_its_ood_scores_before_its_checkpoint_goes(tmp_path):
    """Checkpoints and kept logits are not committed: the OOD scores the test tables read from
    one (``ood_scores.json``) and the conformal sets over test halvings from the other
    (``conformal_halves.json``) are written as soon as the run finishes, in the process that
    trained it, so a report on a fresh clone has them."""
    module = _converged_module()
    import study  # the sibling module, on sys.path since _converged_module

    tiny = [a for a in TINY if a != "--set"]
    variant = study.Variant("single", (*module.SINGLE, "optim.epochs=1", "data.ood=['mnist_5k']"))
    (run,) = study.plan_variant(variant, tmp_path / "final", ("threads=1", *tiny))
    called = []

    def after(stage, path):
        called.append((stage, path))
        module._score_ood(stage, path)

    assert study.train([("final", variant, run)], after=after) == 0
    path = run.path()
    assert called == [("final", path)]
    scores = json.loads((path / "ood_scores.json").read_text())
    final = json.loads((path / "final.json").read_text())["metrics"]
    for score in module.OOD_SCORES:
        assert 0 <= scores[f"mnist_5k/{score}/auroc"] <= 1
    # the engine's own MSP AUROC and the checkpoint's agree: the same model, the same sets
    assert scores["mnist_5k/msp/auroc"] == pytest.approx(final["ood/mnist_5k/auroc"], abs=1e-6)
    # and its sets calibrated on random test halves, from the logits it kept
    from snens.engine.runs import read_outputs
    from snens.evaluation.conformal import resampled_coverage

    halves = json.loads((path / "conformal_halves.json").read_text())
    outputs = read_outputs(path)
    for score in ("thr", "aps"):
        check = resampled_coverage(outputs["test"], outputs["test_labels"], 0.1, score)
        assert halves[f"{score}/coverage"] == check.coverage
        assert halves[f"{score}/coverage_std"] == check.coverage_std
        assert halves[f"{score}/size"] == check.size
    (path / "last.pt").unlink()
    (path / "outputs.npz").unlink()
    assert module.ood_scores(path) == scores  # read back, no checkpoint needed
    assert module.conformal_halves(path) == halves
    # a stage without test tables keeps nothing
    budget = tmp_path / "budget_run"
    budget.mkdir()
    module._score_ood("budget", budget)
    assert not (budget / "ood_scores.json").exists()
    assert not (budget / "conformal_halves.json").exists()
    # nothing more is called for a run that is already done
    assert study.train([("final", variant, run)], after=after) == 0 and len(called) == 1


def test_training_some_seeds_lists_every_seed_in_the_sweep_csv(tmp_path):
    """``converged.py run --seeds 1`` trains seed 1 only; the variant's ``sweep.csv`` still
    lists seeds 0 and 1 (it had been rewritten with seed 1 alone)."""
    _converged_module()
    import csv

    import study

    tiny = [a for a in TINY if a != "--set"]
    variant = study.Variant("single", ("method.name=single", "optim.epochs=1"), (0, 1))
    runs = study.plan_variant(variant, tmp_path / "final", ("threads=1", *tiny))
    queue = [("final", variant, run) for run in runs]
    assert study.train(queue, only=lambda run: run.config.seed == 1) == 0
    assert [(run.path() / "final.json").is_file() for run in runs] == [False, True]
    with open(runs[0].path().parent / "sweep.csv", newline="") as file:
        rows = [(r["seed"], r["status"]) for r in csv.DictReader(file)]
    assert rows == [("0", "pending"), ("1", "done")]


def test_run_trains_only_the_variants_and_seeds_asked_for(tmp_path, monkeypatch):
    """``converged.py run --only snens --seeds 1`` trains that variant's seed 1 alone; the
    other variant and seed are left as they were."""
    module = _converged_module()
    import study

    tiny = [a for a in TINY if a != "--set"]
    planned = {
        name: study.plan_variant(
            study.Variant(name, (f"method.name={name}", "optim.epochs=1"), (0, 1)),
            tmp_path / "final",
            ("threads=1", *tiny),
        )
        for name in ("single", "snens")
    }
    variants = {name: study.Variant(name, (), (0, 1)) for name in planned}
    monkeypatch.setattr(
        module,
        "runs_of",
        lambda stage: [(variants[name], run) for name, runs in planned.items() for run in runs],
    )
    assert module.run(["final"], seeds=[1], variants=["snens"]) == 0
    done = {
        (name, run.config.seed): (run.path() / "final.json").is_file()
        for name, runs in planned.items()
        for run in runs
    }
    assert done == {
        ("single", 0): False,
        ("single", 1): False,
        ("snens", 0): False,
        ("snens", 1): True,
    }
