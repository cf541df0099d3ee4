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
    stage = recipes.SELECTED / "overfit"
    section, _ = recipes.situation("overfit", stage)
    assert section, "the overfit regime's σN-Ens runs are committed"
    rows = [line.split(" | ") for line in section if line.startswith("| ") and "τ=" in line]
    val = {row[0].lstrip("| ").removesuffix(" ← chosen"): float(row[3]) for row in rows}
    chosen = next(row[0] for row in rows if row[0].endswith("← chosen"))
    assert chosen.removesuffix(" ← chosen").lstrip("| ") == min(val, key=val.get)
    assert len(val) >= 4  # every σN-Ens variant the regime trained


@pytest.mark.pins_text
def test_the_committed_page_is_the_committed_runs_page(recipes):
    written = (ROOT / "results" / "recipes.md").read_text(encoding="utf-8")
    assert recipes.page() == written, (
        "results/recipes.md is stale: python experiments/recipes.py --write"
    )
