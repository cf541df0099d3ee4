from snens.benchmark import Measure, compare, format_table


def test_verdicts_compare_the_median_with_the_target():
    assert Measure("a", 1.04, (1.0, 1.1), "≤1.05×", 10.0).verdict() == "met"
    assert Measure("b", 1.06, (1.0, 1.1), "≤1.05×", 10.0).verdict() == "NOT met"
    assert Measure("c", 0.9, (0.8, 1.0), "report", 10.0).verdict() == "report"
    table = format_table([Measure("a", 1.04, (1.0, 1.1), "≤1.05×", 10.0)])
    assert "| a | 1.040× | 1.00–1.10 | ≤1.05× | met | 10.0 |" in table


def test_compare_counts_calls_and_returns_the_ratio_of_work():
    calls = {"variant": 0, "baseline": 0}

    def variant():
        calls["variant"] += 1

    def baseline():
        calls["baseline"] += 1

    ratio, (low, high), _ = compare(variant, baseline, repeats=3, inner=4, warmup=1)
    assert calls == {"variant": 13, "baseline": 13}
    assert low <= ratio <= high
