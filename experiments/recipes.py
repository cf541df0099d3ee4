"""Which σN-Ens recipe to use where: every recipe each study trained, per situation, with the
one chosen on validation — the table a user with a new model and data reads to set
``input_policy``, τ and λ.

For each situation (a regime of the converged study, a cell of the holdout study), every σN-Ens
variant with finished runs: its input policy, τ and λ (read from the run's config), the
validation NLL at its selected epoch (the number a user can see too, and what chooses), and on
test its NLL and ECE raw and after temperature scaling and the OOD AUROC by the energy score;
one model and the deep ensemble beside them. The recipe with the lowest validation NLL (over
the seeds every recipe of the situation has finished) is marked, and compared with one model
and the deep ensemble on test NLL with paired bootstrap 95 % intervals. The chosen recipe had
as many tries as the situation has σN-Ens rows, one model and the deep ensemble one each (the
same optimizer, learning rate and epochs for all): its comparisons carry that advantage, the
defaults' comparisons do not. Seeds are averaged; a situation's rows say how many seeds each
rests on. The summary measures the chosen recipe, and σN-Ens at the library's defaults
(repeat inputs, τ=1, λ=0.1, or a preset's own recipe), against one model after temperature
scaling, the bar a user can trust them to clear (the same choice, on a user's own runs:
``snens report``); and each situation decomposes the validation NLL at the selected epoch
into what the members lose or gain alone against one model and what their disagreement wins
back.

    python experiments/recipes.py            # print results/recipes.md
    python experiments/recipes.py --write    # write it
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import study

from snens import SnensConfig, files
from snens.engine.config import load_config
from snens.engine.runs import (
    EXAMPLES,
    FINAL,
    read_examples,
    read_final,
    read_metrics,
    read_selected_epoch,
)
from snens.engine.selection import choose_on_validation

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "recipes.md"
SELECTED = ROOT / "results" / "converged" / "selected"
HOLDOUT = ROOT / "results" / "holdout"

#: (label, directory holding <variant>/seed=<s>/), in the order of the page.
SITUATIONS = (
    ("SmallCNN (BatchNorm), 10,000 images: one model overfits", SELECTED / "overfit"),
    ("SmallCNN (BatchNorm), all 55,000 images, converged", SELECTED / "final"),
    ("MiniLM fine-tuned on 2,000 reviews", SELECTED / "text"),
    ("MobileNetV2 (ImageNet weights) fine-tuned", SELECTED / "vision"),
    ("MLP (LayerNorm), 10,000 images: no study tuned it", HOLDOUT / "few_mlp"),
    ("CNN (GroupNorm), 10,000 images: no study tuned it", HOLDOUT / "few_gncnn"),
    ("small ViT (LayerNorm), 10,000 images: no study tuned it", HOLDOUT / "few_vit"),
    ("MLP (LayerNorm), all 55,000 images: no study tuned it", HOLDOUT / "all_mlp"),
)
BASELINES = (("single", "one model"), ("deep_ensemble", "deep ensemble of 4"))
#: How the pages name the other methods a situation trained beside them.
OTHERS = {
    "mc_dropout": "MC dropout",
    "batch_ensemble": "BatchEnsemble",
    "packed": "Packed-Ensembles",
}
LABELS = {**dict(BASELINES), **OTHERS}
OOD_SCORE = "energy"
#: The recipe fields that make σN-Ens "at the library's defaults", or at a preset's.
DEFAULT_FIELDS = ("input_policy", "temperature", "diversity_weight", "gamma_lr_multiplier")
#: The situations trained from a preset, by stage: σN-Ens at the defaults is the preset's own
#: recipe as the preset reads today (a stage may pin another value its runs were made with).
PRESET_OF = {"vision": "fashion_mnist_mobilenet_v2", "text": "rotten_tomatoes_minilm"}
#: Validation metrics of the decomposition, read at the selected epoch from metrics.jsonl.
DECOMPOSITION = ("val/nll", "val/member_nll_mean", "val/disagreement")
#: The parts of the schedule a probe trains every recipe for before choosing one to finish.
PROBE_PARTS = ((1, 4), (1, 2))


def _finished(variant: Path) -> list[Path]:
    return sorted(
        p for p in variant.glob("seed=*") if (p / FINAL).is_file() and (p / EXAMPLES).is_file()
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _epochs(selection: dict) -> str:
    if "epoch" in selection:
        return str(selection["epoch"])
    return "members " + "/".join(str(e) for e in selection["member_epochs"])


def default_recipe(stage: Path) -> tuple:
    """The :data:`DEFAULT_FIELDS` of σN-Ens at the defaults a user gets in ``stage``: its
    preset's method where it was trained from one, the library's otherwise."""
    from snens.engine.presets import preset

    name = PRESET_OF.get(stage.name) if stage.parent == SELECTED else None
    defaults = preset(name).method if name else SnensConfig()
    return tuple(getattr(defaults, field) for field in DEFAULT_FIELDS)


def _row(variant: Path, runs: list[Path]) -> dict:
    """The recipe and its numbers, averaged over the finished seeds."""
    finals = [read_final(p) for p in runs]
    metrics = [f["metrics"] for f in finals]
    config = load_config(runs[0] / "config.toml")
    parts = [read_selected_epoch(p) for p in runs]
    ood = sorted(
        k
        for k in metrics[0]
        if k.startswith("ood/") and k.endswith(f"/{OOD_SCORE}/auroc") and "/corrupt" not in k
    )
    method = config.method
    recipe = (
        f"{method.input_policy}, τ={method.temperature:g}, λ={method.diversity_weight:g}"
        if method.name == "snens"
        else LABELS.get(variant.name, variant.name)
    )
    # σN-Ens at the library's defaults, or at its preset's; γ's multiplier named where it differs
    defaults = default_recipe(variant.parent)
    is_default = method.name == "snens" and defaults == tuple(
        getattr(method, field) for field in DEFAULT_FIELDS
    )
    if method.name == "snens" and method.gamma_lr_multiplier != defaults[3]:
        recipe += f", γ's lr ×{method.gamma_lr_multiplier:g}"
    return {
        "name": variant.name,
        "snens": method.name == "snens",
        "default": is_default,
        "fields": tuple(getattr(method, field) for field in DEFAULT_FIELDS),
        "recipe": recipe,
        "parts": None
        if None in parts
        else {key: _mean([part[key] for part in parts]) for key in DECOMPOSITION},
        "seeds": len(runs),
        "selections": {
            int(p.name.removeprefix("seed=")): f["selection"]
            for p, f in zip(runs, finals, strict=True)
        },
        "epochs": "; ".join(_epochs(f["selection"]) for f in finals),
        # a deep ensemble's members are each selected on their own: no one ensemble value
        "val": _mean(values)
        if (values := [f["selection"].get("value") for f in finals]) and None not in values
        else None,
        "nll": _mean([m["test/nll"] for m in metrics]),
        "ece": _mean([m["test/ece"] for m in metrics]),
        "nll_ts": _mean([m["test_ts/nll"] for m in metrics]),
        "ece_ts": _mean([m["test_ts/ece"] for m in metrics]),
        "ood": _mean([m[ood[0]] for m in metrics]) if ood else None,
        "arrays": [read_examples(p) for p in runs],
        "curves": {int(p.name.removeprefix("seed=")): _curve(p) for p in runs},
        "epochs_planned": config.optim.epochs,
    }


def _curve(run: Path) -> list[float]:
    """The validation NLL of each epoch of ``run``, from its metrics.jsonl."""
    values = {r["epoch"]: r["val/nll"] for r in read_metrics(run) if "val/nll" in r}
    return [values[epoch] for epoch in sorted(values)]


@functools.cache
def _rows(stage: Path) -> tuple[dict, ...]:
    """Every variant of ``stage`` with finished runs, as :func:`_row` reads it."""
    return tuple(_row(v, runs) for v in sorted(stage.glob("*")) if (runs := _finished(v)))


def situation(label: str, stage: Path) -> tuple[list[str], str | None]:
    """The section of one situation and its row of the summary table, or ([], None) where
    none of its σN-Ens runs has finished."""
    from snens.engine.compare import compare_arrays

    rows = list(_rows(stage))
    recipes = [r for r in rows if r["snens"]]
    if not recipes:
        return [], None
    chosen = _choose(recipes)
    rows.sort(key=lambda r: (r["snens"], r["val"] if r["val"] is not None else -1.0))
    lines = [
        f"## {label}",
        "",
        f"`{stage.relative_to(ROOT)}`. Chosen on validation: **{chosen['recipe']}**.",
        "",
        "| recipe | seeds | selected epochs | val NLL | test NLL | ECE | NLL +TS | ECE +TS "
        f"| OOD AUROC ({OOD_SCORE}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " ← chosen" if r is chosen else ""
        ood = "—" if r["ood"] is None else f"{r['ood']:.4f}"
        val = "—" if r["val"] is None else f"{r['val']:.4f}"
        lines.append(
            f"| {_name(r)}{mark} | {r['seeds']} | {r['epochs']} | {val} | "
            f"{r['nll']:.4f} | {r['ece']:.4f} | {r['nll_ts']:.4f} | {r['ece_ts']:.4f} | {ood} |"
        )
    against = [(r, label) for name, label in BASELINES for r in rows if r["name"] == name]
    if against:
        lines.append("")
    for baseline, name in against:
        (nll,) = compare_arrays(
            chosen["arrays"], baseline["arrays"], sets=("test",), metrics=("nll",)
        )
        lines.append(
            f"* chosen − {name}, test NLL: {study.difference_cell(nll)} "
            f"({chosen['seeds']} and {baseline['seeds']} seeds)"
        )
    single = next((r for r in rows if r["name"] == "single"), None)
    lines += ["", *decomposition(rows, single)]
    cells = _summary_cells(chosen, recipes, single)
    # the seeds the chosen recipe's comparison rests on, and one model's
    seeds = f"{chosen['seeds']} and {single['seeds']}" if single else str(chosen["seeds"])
    summary = f"| {label} | {chosen['recipe']} | {seeds} | {cells} |"
    return [*lines, ""], summary


def _choose(recipes: list[dict]) -> dict:
    """The recipe of lowest validation NLL over the seeds every recipe has finished (so that a
    recipe with more seeds is not judged on other draws than the rest): the library's choice,
    :func:`snens.engine.selection.choose_on_validation`, as ``snens report`` makes it."""
    choice = choose_on_validation([r["selections"] for r in recipes])
    if choice.index is None:
        raise ValueError(f"no σN-Ens recipe to choose from: {choice.left_out}")
    return recipes[choice.index]


def _name(row: dict) -> str:
    return f"{row['recipe']} (defaults)" if row["default"] else row["recipe"]


def decomposition(rows: list[dict], single: dict | None) -> list[str]:
    """The validation NLL at the selected epoch, taken apart: the members' mean NLL, how far it
    is from one model's (what a member loses or gains alone), and how much lower the ensemble
    is than its members (what their disagreement wins back; 0 for one model)."""
    lines = [
        "Validation NLL at the selected epoch, taken apart: members' mean NLL, its difference "
        "from one model's, and the gain of averaging them (members' mean − ensemble).",
        "",
        "| recipe | val NLL | members' mean | members − one model | gain of averaging "
        "| disagreement |",
        "|---|---|---|---|---|---|",
    ]
    base = single["parts"]["val/nll"] if single and single["parts"] else None
    for r in rows:
        if r["parts"] is None:
            continue
        nll, members, disagreement = (r["parts"][key] for key in DECOMPOSITION)
        alone = "—" if base is None else f"{members - base:+.4f}"
        lines.append(
            f"| {_name(r)} | {nll:.4f} | {members:.4f} | {alone} | {members - nll:.4f} "
            f"| {disagreement:.4f} |"
        )
    return lines


def _summary_cells(chosen: dict, recipes: list[dict], single: dict | None) -> str:
    """The summary's cells after temperature scaling, with intervals: the recipe chosen on
    validation − one model on test NLL, and σN-Ens at the defaults − one model on test NLL
    and ECE; what is missing, said."""
    from snens.engine.compare import compare_arrays

    if single is None:
        return "no one model yet | not trained yet | not trained yet"

    def against_single(row: dict, metrics: tuple[str, ...]) -> list:
        return compare_arrays(row["arrays"], single["arrays"], sets=("test_ts",), metrics=metrics)

    default = next((r for r in recipes if r["default"]), None)
    found = against_single(default, ("nll", "ece")) if default is not None else []
    # the defaults chosen: their NLL comparison is the chosen recipe's (drawn once)
    (nll,) = found[:1] if chosen is default else against_single(chosen, ("nll",))
    if default is None:
        return f"{study.difference_cell(nll)} | not trained yet | not trained yet"
    return " | ".join(study.difference_cell(c) for c in (nll, *found))


def probe_choice(recipes: Sequence[dict], epochs: int) -> dict:
    """The recipe a probe chooses: lowest validation NLL after the first ``epochs`` epochs of
    the schedule (its best epoch among them, mean over the seeds every recipe has), by
    :func:`snens.engine.selection.choose_on_validation` as for the full runs. The chosen
    recipe's full run is then the probe's result: it is the same run continued."""
    selections = [
        {
            seed: {"metric": "nll", "value": min(curve[:epochs])}
            for seed, curve in r["curves"].items()
        }
        for r in recipes
    ]
    choice = choose_on_validation(selections)
    if choice.index is None:
        raise ValueError(f"no recipe to choose after {epochs} epochs: {choice.left_out}")
    return recipes[choice.index]


def tune_recipes(stage: Path) -> dict[str, tuple]:
    """``snens tune``'s recipes in ``stage``, by name: :data:`DEFAULT_FIELDS` of each, its
    :data:`snens.engine.tune.RECIPES` values set on σN-Ens at the stage's defaults."""
    from snens.engine.config import apply_overrides
    from snens.engine.tune import RECIPES

    base = {"method": dict(zip(DEFAULT_FIELDS, default_recipe(stage), strict=True))}
    out = {}
    for name, settings in RECIPES.items():
        fields = apply_overrides(base, settings)["method"]
        out[name] = tuple(fields[field] for field in DEFAULT_FIELDS)
    return out


def _same_recipe(a: tuple, b: tuple) -> bool:
    """Whether two recipes' fields train alike: τ plays no part where λ is 0 in both."""
    tau = DEFAULT_FIELDS.index("temperature")
    lam = DEFAULT_FIELDS.index("diversity_weight")
    if a[lam] == b[lam] == 0:
        return all(x == y for i, (x, y) in enumerate(zip(a, b, strict=True)) if i != tau)
    return a == b


def probe_row(label: str, stage: Path) -> str | None:
    """One situation's row of the probe table: among the situation's runs of ``snens tune``'s
    recipes, for each of :data:`PROBE_PARTS`, the recipe chosen after that part of the
    schedule and its test NLL +TS − one model's, with the interval; None where fewer than two
    of those recipes or no one model were trained."""
    from snens.engine.compare import compare_arrays

    rows = _rows(stage)
    wanted = tune_recipes(stage)
    found = {
        name: row
        for name, fields in wanted.items()
        if (
            row := next((r for r in rows if r["snens"] and _same_recipe(r["fields"], fields)), None)
        )
    }
    recipes: list[dict] = []  # the base recipe may be another of them: trained once
    for row in found.values():
        if not any(row is kept for kept in recipes):
            recipes.append(row)
    single = next((r for r in rows if r["name"] == "single"), None)
    if len(recipes) < 2 or single is None:
        return None
    planned = {r["epochs_planned"] for r in recipes}
    if len(planned) != 1:
        raise ValueError(f"{stage}: the recipes were trained for different epochs {planned}")
    epochs = planned.pop()
    cells = []
    for numerator, denominator in PROBE_PARTS:
        k = math.ceil(epochs * numerator / denominator)
        chosen = probe_choice(recipes, k)
        (nll,) = compare_arrays(
            chosen["arrays"], single["arrays"], sets=("test_ts",), metrics=("nll",)
        )
        cost = 1 + (len(recipes) - 1) * k / epochs
        cells.append(
            f"{k} of {epochs}: {chosen['recipe']}, {cost:.2f}× | {study.difference_cell(nll)}"
        )
    missing = [name for name in wanted if name not in found]
    trained = f"{len(found)} of {len(wanted)}" + (f" (not {', '.join(missing)})" if missing else "")
    return f"| {label} | {trained} | " + " | ".join(cells) + " |"


PROBE_INTRO = (
    "**A choice on a probe** (what ``snens tune`` does, by default after half the schedule): "
    "train each recipe for the first part of its schedule (the learning-rate schedule of the "
    "full run), choose the one of lowest validation NLL so far, and finish only that one. "
    "The runs above replay it exactly: a probe of k epochs is the first k epochs of each full "
    "run, and the chosen recipe's full run is its result. The recipes are ``snens tune``'s "
    "four (the defaults or a preset's own recipe; split, τ=1, λ=0.1; split, τ=5, λ=0.01; λ=0 "
    "with γ's lr ×1, the preset's multiplier kept in the others), those of them the situation "
    "trained (the second column). Cost, in trainings of one σN-Ens run: "
    "1 + (recipes − 1) · k / epochs (training only; a run with repeat inputs computes M·B "
    "rows a step, about what a deep ensemble of M computes, one with split inputs B). The "
    "comparison with one model is after temperature scaling, as above."
)


def page() -> str:
    intro = (__doc__ or "").split("\n\n")[1].replace("\n", " ")
    lines = ["# σN-Ens recipes by situation (`python experiments/recipes.py --write`)", "", intro]
    lines.append("")
    summary = [
        "| situation | chosen on validation | seeds (chosen and one model) "
        "| chosen − one model, NLL +TS | defaults − one model, NLL +TS "
        "| defaults − one model, ECE +TS |",
        "|---|---|---|---|---|---|",
    ]
    probe = [
        "",
        PROBE_INTRO,
        "",
        "| situation | snens tune's recipes trained | after 1/4 of the schedule: chosen, cost "
        "| chosen − one model, NLL +TS | after 1/2: chosen, cost | chosen − one model, NLL +TS |",
        "|---|---|---|---|---|---|",
    ]
    sections: list[str] = []
    unreplayed: list[str] = []
    for label, stage in SITUATIONS:
        section, row = situation(label, stage)
        if row is not None:
            summary.append(row)
        if (row := probe_row(label, stage)) is not None:
            probe.append(row)
        else:
            unreplayed.append(label)
        sections += section
    if unreplayed:
        probe += [
            "",
            f"Not replayed (fewer than two of the recipes trained): {'; '.join(unreplayed)}.",
        ]
    return "\n".join([*lines, *summary, *probe, "", *sections]).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text = page()
    if args.write:
        files.write_text(OUT, text)
        print(f"wrote {OUT.relative_to(ROOT)}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
