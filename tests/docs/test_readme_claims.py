"""The README's comparisons are the committed runs' comparisons: the block between its
markers is exactly what ``experiments/claims.py`` writes from the runs under ``results/``, and
no comparative word stands outside it."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import claims  # noqa: E402

README = ROOT / "README.md"


@pytest.fixture(scope="module")
def generated() -> str:
    return claims.block()


def test_the_readme_holds_the_generated_comparisons(generated):
    text = README.read_text(encoding="utf-8")
    assert claims.readme_with(text, generated) == text, (
        "README.md's comparisons are not the committed runs': python experiments/claims.py --write"
    )


def test_the_generated_block_says_beats_only_where_its_interval_excludes_zero(generated):
    cell = re.compile(r"([+-]\d\.\d{4}) \[([+-]\d\.\d{4}), ([+-]\d\.\d{4})\] (\w+)")
    rows = [line.strip("|").split("|") for line in generated.splitlines() if line.startswith("| ")]
    checked, words = 0, []
    for row in rows[1:]:
        for (set_name, _, _), text in zip(claims.COLUMNS, row[2:], strict=False):
            found = cell.fullmatch(text.strip())
            if found is None and text.strip() == "—":
                # a set scored without an OOD set (the tweets as another domain) has no AUROC
                assert set_name == "ood" and row[2 + len(claims.COLUMNS)].strip() == "—", row
                continue
            if found is None:
                assert text.strip() == "not measured yet"
                continue
            estimate, low, high = map(float, found.groups()[:3])
            assert low <= estimate <= high
            higher_is_better = set_name == "ood"  # AUROC; NLL and ECE: lower is better
            better, worse = (low > 0, high < 0) if higher_is_better else (high < 0, low > 0)
            assert found[4] == ("better" if better else "worse" if worse else "level"), text
            words.append(found[4])
            checked += 1
    assert checked >= 12  # the overfit regime's and the earlier LLM runs' rows at least
    # each word of the table is said in the sentences below it
    said = " ".join(line for line in generated.splitlines() if line.startswith("* "))
    for word, phrase in (("better", "beats"), ("worse", "is behind"), ("level", "is level with")):
        assert (word in words) == (phrase in said)


def test_a_sentence_lists_each_column_under_the_word_of_its_interval_with_the_interval():
    from types import SimpleNamespace

    from snens.evaluation.bootstrap import Interval

    def found(verdict, estimate, low, high):
        interval = Interval("nll", estimate, low, high, 0.95, 2000)
        return SimpleNamespace(verdict=verdict, interval=interval)

    level = found("level", 0.001, -0.002, 0.004)
    said = [
        (
            "a regime",
            "one model",
            [
                found("better", -0.05, -0.07, -0.04),
                level,
                found("worse", 0.01, 0.003, 0.02),
                level,
                found("better", 0.05, 0.04, 0.06),
                level,
            ],
        )
    ]
    assert claims.sentences(said) == [
        "* a regime: σN-Ens beats one model on NLL (Δ -0.0500 [-0.0700, -0.0400]) and OOD AUROC "
        "(energy) (Δ +0.0500 [+0.0400, +0.0600]), is behind one model on ECE (Δ +0.0100 "
        "[+0.0030, +0.0200]), is level with one model on NLL +TS (Δ +0.0010 [-0.0020, +0.0040]), "
        "ECE +TS (Δ +0.0010 [-0.0020, +0.0040]) and OOD AUROC (max. probability) (Δ +0.0010 "
        "[-0.0020, +0.0040])."
    ]


def test_no_comparative_word_stands_outside_the_generated_block():
    text = README.read_text(encoding="utf-8")
    start, end = text.index(claims.BEGIN), text.index(claims.END)
    outside = text[:start] + text[end:]
    for word in ("beats", "beat ", "outperform", "level with", "is behind", "better than"):
        assert word not in outside, f"README.md says {word!r} outside the generated comparisons"


def test_the_block_replaces_only_what_lies_between_the_markers():
    text = f"before\n{claims.BEGIN}\nold\n{claims.END}\nafter\n"
    assert claims.readme_with(text, f"{claims.BEGIN}\nnew\n{claims.END}") == (
        f"before\n{claims.BEGIN}\nnew\n{claims.END}\nafter\n"
    )
    with pytest.raises(ValueError, match="holds no"):
        claims.readme_with("no markers", "x")


def test_each_regime_measures_snens_at_the_library_defaults_or_its_presets():
    import recipes

    from snens import SnensConfig
    from snens.engine.config import load_config
    from snens.engine.presets import preset

    defaults, checked = SnensConfig(), 0
    library = (defaults.input_policy, defaults.temperature)
    library += (defaults.diversity_weight, defaults.gamma_lr_multiplier)
    presets = {"vision": "fashion_mnist_mobilenet_v2", "text": "rotten_tomatoes_minilm"}
    assert recipes.PRESET_OF == presets
    for regime in claims.REGIMES:
        if regime.tuned:  # snens tune's choice: its probe's base recipe is the library's
            for probe in sorted((regime.stage / regime.snens).glob("seed=*/tune.json")):
                base = load_config(probe.with_name("base") / "config.toml").method
                recipe = (base.input_policy, base.temperature)
                recipe += (base.diversity_weight, base.gamma_lr_multiplier)
                assert recipe == library, probe
            continue
        # a preset's defaults as the preset reads today, the library's elsewhere
        name = presets.get(regime.stage.name)
        wanted = library
        if name:
            method = preset(name).method
            wanted = (method.input_policy, method.temperature)
            wanted += (method.diversity_weight, method.gamma_lr_multiplier)
        assert recipes.default_recipe(regime.stage) == wanted, regime.label
        for run in sorted((regime.stage / regime.snens).glob("seed=*/final.json")):
            method = load_config(run.with_name("config.toml")).method
            assert method.name == "snens", run
            recipe = (method.input_policy, method.temperature)
            recipe += (method.diversity_weight, method.gamma_lr_multiplier)
            assert recipe == wanted, run
            checked += 1
    assert checked >= 8  # the overfit regime's, MobileNetV2's and the holdout cells' runs


def test_the_llm_rows_under_shift_compare_the_other_domain_s_examples():
    """``shifted`` reads the sets of the labelled set of another domain (``domain/tweets``,
    ``domain_ts/tweets``): arrays whose in-domain sets are relabelled as that domain's give the
    in-domain comparisons exactly; the OOD columns stay empty, and the sentences skip them."""
    from snens.engine.compare import run_arrays

    cell = claims.HOLDOUT / "few_gncnn"
    a = run_arrays([cell / "snens_tau1_lam0.1" / "seed=0"])
    b = run_arrays([cell / "single" / "seed=0"])

    def as_shifted(arrays):
        out = []
        for x in arrays:
            moved = {}
            for key, value in x.items():
                for s, shift in claims.SHIFT_SETS.items():
                    if key.startswith(f"{s}/"):
                        moved[shift + key.removeprefix(s)] = value
            out.append(moved)
        return out

    found = claims.shifted(as_shifted(a), as_shifted(b))
    in_domain = claims.comparisons(a, b)
    assert [c is None for c in found] == [s == "ood" for s, _, _ in claims.COLUMNS]
    for c, d in zip(found, in_domain, strict=True):
        if c is not None:
            assert c.interval == d.interval and c.verdict == d.verdict
    (sentence,) = claims.sentences([("shifted", "one model", found)])
    assert "OOD" not in sentence and sentence.count("(Δ ") == 4
