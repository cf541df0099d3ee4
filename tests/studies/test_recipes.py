"""experiments/recipes.py: the σN-Ens recipe chosen on validation in each situation."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def recipes(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    import recipes

    yield recipes
    sys.modules.pop("recipes", None)


def test_the_chosen_recipe_is_the_lowest_validation_nll_and_never_a_test_number(recipes):
    import json

    stage = recipes.SELECTED / "overfit"
    section, _ = recipes.situation("overfit", stage)
    assert section, "the overfit regime's σN-Ens runs are committed"
    rows = [line.split(" | ") for line in _table(section, "| recipe | seeds |") if "τ=" in line]
    chosen = next(row[0] for row in rows if row[0].endswith("← chosen"))
    assert len(rows) >= 4  # every σN-Ens variant the regime trained
    # from the runs' files: each σN-Ens variant's selected validation NLL by seed, compared
    # over the seeds every variant has finished
    by_variant = {}
    for final in stage.glob("snens*/seed=*/final.json"):
        if (final.parent / "examples.npz").is_file():
            value = json.loads(final.read_text())["selection"]["value"]
            by_variant.setdefault(final.parent.parent.name, {})[final.parent.name] = value
    common = sorted(set.intersection(*(set(v) for v in by_variant.values())))
    assert common, "every σN-Ens variant of the regime has seed 0"
    best = min(by_variant, key=lambda v: sum(by_variant[v][s] for s in common))
    assert (
        chosen.lstrip("| ").removesuffix(" ← chosen").removesuffix(" (defaults)")
        == (recipes._row(stage / best, recipes._finished(stage / best))["recipe"])
    )


def _table(section: list[str], header: str) -> list[str]:
    """The rows of the section's table that starts with ``header``."""
    start = next(i for i, line in enumerate(section) if line.startswith(header)) + 2
    end = next(i for i in range(start, len(section)) if not section[i].startswith("|"))
    return section[start:end]


def test_the_decomposition_adds_up_and_marks_the_library_defaults(recipes):
    section, summary = recipes.situation("overfit", recipes.SELECTED / "overfit")
    rows = {
        cells[0]: [float(c) for c in cells[1:6]]
        for line in _table(section, "| recipe | val NLL | members' mean |")
        for cells in [line.strip("| ").split(" | ")]
    }
    # the ensemble's NLL is its members' mean less the gain of averaging; one model gains 0
    for name, (nll, members, _, gain, _) in rows.items():
        assert members - gain == pytest.approx(nll, abs=2e-4), name
    assert rows["one model"][1:4] == [rows["one model"][0], 0.0, 0.0]
    # members − one model: each row's members' mean against one model's validation NLL
    single = rows["one model"][0]
    for name, (_, members, alone, _, _) in rows.items():
        assert alone == pytest.approx(members - single, abs=2e-4), name
    # the defaults are read from the run's config, not its name: repeat, τ=1, λ=0.1, γ ×30
    assert [n for n in rows if n.endswith("(defaults)")] == ["repeat, τ=1, λ=0.1 (defaults)"]
    # the summary measures the chosen recipe and the defaults against one model after
    # temperature scaling: the two NLL cells agree exactly where the defaults are the choice
    assert summary.count(" [") == 3 and "not trained" not in summary
    cells = summary.strip("| ").split(" | ")
    chosen = next(n for n in _table(section, "| recipe | seeds |") if "← chosen" in n)
    assert (cells[3] == cells[4]) == ("(defaults) ← chosen" in chosen)
    assert cells[1] in chosen


def test_a_situation_without_the_defaults_says_so(recipes, tmp_path, monkeypatch):
    import shutil

    source = recipes.SELECTED / "overfit"
    for name in ("single", "snens_tau5_lam0.01_split"):
        shutil.copytree(source / name, tmp_path / name, ignore=shutil.ignore_patterns("*.pt"))
    monkeypatch.setattr(recipes, "ROOT", tmp_path.parent)
    _, summary = recipes.situation("copy", tmp_path)
    assert summary.endswith("| not trained yet | not trained yet |")


@pytest.mark.pins_text
def test_the_committed_page_is_the_committed_runs_page(recipes):
    written = (ROOT / "results" / "recipes.md").read_text(encoding="utf-8")
    assert recipes.page() == written, (
        "results/recipes.md is stale: python experiments/recipes.py --write"
    )


def test_the_summary_gives_the_seeds_of_the_chosen_recipe_and_of_one_model(recipes):
    stage = recipes.SELECTED / "final"  # where one model converges on all the data
    section, summary = recipes.situation("converged", stage)
    chosen = next(
        line.split(" | ")
        for line in _table(section, "| recipe | seeds |")
        if line.split(" | ")[0].endswith("← chosen")
    )
    single = next(
        line.split(" | ") for line in _table(section, "| recipe | seeds |") if "one model" in line
    )
    # the cell the intervals rest on: the chosen recipe's seeds and one model's, not the most
    # seeds any recipe of the situation has
    assert summary.split(" | ")[2] == f"{chosen[1]} and {single[1]}"
    assert single[1] == str(len(recipes._finished(stage / "single")))


def test_a_probe_chooses_by_the_first_epochs_of_each_run_and_the_whole_run_as_the_full_choice(
    recipes,
):
    import json

    stage = recipes.SELECTED / "overfit"
    rows = [r for r in recipes._rows(stage) if r["snens"]]
    # over the whole schedule the probe is the full runs' choice
    assert recipes.probe_choice(rows, 20) is recipes._choose(rows)
    # after 5 of 20 epochs: from the runs' metrics.jsonl, the best validation NLL of each
    # seed's first five epochs, mean over the seeds every recipe has
    curves = {}
    for metrics in stage.glob("snens*/seed=*/metrics.jsonl"):
        if (metrics.parent / "final.json").is_file():
            records = [json.loads(line) for line in metrics.read_text().splitlines()]
            first = [r["val/nll"] for r in records if r["epoch"] <= 5]
            curves.setdefault(metrics.parent.parent.name, {})[metrics.parent.name] = min(first)
    common = sorted(set.intersection(*(set(v) for v in curves.values())))
    best = min(curves, key=lambda v: sum(curves[v][s] for s in common))
    assert recipes.probe_choice(rows, 5)["name"] == best


def test_the_probe_table_replays_snens_tunes_recipes_with_their_cost(recipes):
    from snens.engine.tune import RECIPES

    stage = recipes.SELECTED / "overfit"
    wanted = recipes.tune_recipes(stage)
    assert list(wanted) == list(RECIPES)
    # (input policy, τ, λ, γ's multiplier) at the library's defaults, each recipe's set on them
    assert wanted["base"] == ("repeat", 1.0, 0.1, 30.0)
    assert wanted["split_soft"] == ("split", 5.0, 0.01, 30.0)
    assert wanted["no_diversity"] == ("repeat", 1.0, 0.0, 1.0)
    trained = [
        name
        for name, fields in wanted.items()
        if any(
            r["snens"] and recipes._same_recipe(r["fields"], fields) for r in recipes._rows(stage)
        )
    ]
    cells = recipes.probe_row("overfit", stage).strip("| ").split(" | ")
    assert cells[0] == "overfit" and cells[1].startswith(f"{len(trained)} of 4")
    # n recipes, 5 of 20 epochs: 1 + (n − 1) · 5/20 trainings; 10 of 20: 1 + (n − 1) · 10/20
    n = len(trained)
    assert cells[2].startswith("5 of 20: ") and cells[2].endswith(f", {1 + (n - 1) / 4:.2f}×")
    assert cells[4].startswith("10 of 20: ") and cells[4].endswith(f", {1 + (n - 1) / 2:.2f}×")
    assert cells[3].endswith(("better", "level", "worse"))
    # λ = 0: τ plays no part in training, so it does not tell two recipes apart
    assert recipes._same_recipe(("repeat", 5.0, 0.0, 1.0), ("repeat", 1.0, 0.0, 1.0))
    assert not recipes._same_recipe(("repeat", 5.0, 0.1, 1.0), ("repeat", 1.0, 0.1, 1.0))
