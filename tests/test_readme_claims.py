"""The README's comparisons are the committed runs' comparisons: the block between its
markers is exactly what ``experiments/claims.py`` writes from the runs under ``results/``, and
no comparative word stands outside it."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
    cells = re.findall(r"([+-]\d\.\d{4}) \[([+-]\d\.\d{4}), ([+-]\d\.\d{4})\] (\w+)", generated)
    assert len(cells) >= 8  # the overfit regime's and the earlier LLM runs' rows at least
    for estimate, low, high, word in cells:
        low, high = float(low), float(high)
        assert low <= float(estimate) <= high
        assert word == ("better" if high < 0 else "worse" if low > 0 else "level")
    # each sentence's verdicts are its row's: the rows' words, counted, are the sentences'
    table_words = [word for *_, word in cells]
    lines = [line for line in generated.splitlines() if line.startswith("* ")]
    said = " ".join(lines)
    for word, phrase in (("better", "beats"), ("worse", "is behind"), ("level", "is level with")):
        if word in table_words:
            assert phrase in said


def test_a_sentence_lists_each_column_under_the_word_of_its_interval():
    said = [("a regime", "one model", ["better", "level", "worse", "level"])]
    assert claims.sentences(said) == [
        "* a regime: σN-Ens beats one model on NLL, is behind one model on ECE, "
        "is level with one model on NLL +TS and ECE +TS."
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
