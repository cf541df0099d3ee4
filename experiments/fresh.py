"""Claim under test: ``snens tune`` — run end to end as a user runs it, after its recipes and its
probe length were fixed — is never behind one early-stopped, temperature-scaled model beyond
the interval, on networks and settings written after that choice: a transformer trained from
scratch on reviews (RMSNorm, none of the studies' kind) and a ConvNeXt-style CNN (LayerNorm over
channels) on 5,000 images and, at a third of its width, on 55,000.

Every run trains through the engine (the studies' runner and ``snens.engine.tune.tune``, so
``snens.engine.train.train``), every method selected at its best validation epoch
(``optim.select = "nll"``; a deep ensemble's members each at their own), one torch thread.
σN-Ens starts from the library's defaults (repeat inputs, τ=1, λ=0.1, γ's learning rate ×30) and
``snens tune`` probes its four recipes for half the schedule, then finishes the one of lowest
validation NLL (seeds 0 and 1, each probed on its own). Beside it: one model and a deep ensemble
of four. ``train s`` is the training time in wall seconds, the sum of each epoch's in the runs'
metrics.jsonl (for ``snens tune`` every recipe's, the paused ones too), one torch thread while
another study process ran on the machine's other core. Three situations: ``text`` — Rotten
Tomatoes, every training review but 1,000 held out for validation, all 2,551 test reviews, the
plot descriptions as OOD, a 2-block transformer of width 64 over MiniLM's tokenizer, AdamW 1e-3,
8 epochs; ``images`` — Fashion-MNIST, 5,000 training images without augmentation, 5,000 for
validation, the 10,000 test images, MNIST-5k as OOD, a 3-stage ConvNeXt-style CNN of width 24,
AdamW 3e-3, 20 epochs; ``images_all`` — the same CNN at width 8 on the other 55,000 images with
crop and flip, 8 epochs (a network small for its data, where the studies saw the defaults behind
one model; added after the first two, where the probe chose the defaults every time). Runs live
in ``results/fresh/<situation>/<method>/seed=<s>/`` and ``snens tune``'s in
``results/fresh/<situation>/tune/seed=<s>/<recipe>/``.

    OMP_NUM_THREADS=1 python experiments/fresh.py run --seeds 0   # resumable; --seeds 1 beside it
    python experiments/fresh.py report                            # results/fresh.md
    python experiments/fresh.py plan                              # the runs and their status
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import study
import torch
from study import Variant, plan_variant
from torch import nn

import snens.models
from snens import files
from snens.engine.config import RunConfig, load_config
from snens.engine.presets import preset
from snens.engine.report import markdown_table
from snens.engine.runs import EXAMPLES, FINAL, read_examples
from snens.engine.tune import TUNE_FILE, plan_tune, tune

ROOT = Path(__file__).resolve().parent.parent
WHERE = {"out": ROOT / "results" / "fresh"}


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(RMSNorm(x)), then x + MLP(RMSNorm(x))."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ReviewTransformer(nn.Module):
    """Token and position embeddings, pre-RMSNorm blocks, a final RMSNorm, the mean over the
    text's tokens, a linear head: a transformer trained from scratch (no study trained one)."""

    def __init__(
        self, num_classes: int, vocab: int, dim: int, depth: int, heads: int, length: int
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Parameter(torch.zeros(length, dim))
        nn.init.normal_(self.positions, std=0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.tokens(input_ids) + self.positions[: input_ids.shape[1]]
        padding = attention_mask == 0
        for block in self.blocks:
            x = block(x, padding)
        weights = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (self.norm(x) * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        return self.head(pooled)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7×7 convolution, LayerNorm over channels (channels last), an inverted
    bottleneck (×4, GELU), a residual connection."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(x).permute(0, 2, 3, 1)  # (B, H, W, C)
        return x + self.mlp(self.norm(h)).permute(0, 3, 1, 2)


class SmallConvNeXt(nn.Module):
    """A 2×2 patch stem, then three stages of one block each at widths w, 2w, 4w (a LayerNorm
    and a strided 2×2 convolution between them), global pooling, LayerNorm, a linear head."""

    def __init__(self, num_classes: int, in_channels: int, width: int) -> None:
        super().__init__()
        widths = (width, 2 * width, 4 * width)
        self.stem = nn.Conv2d(in_channels, width, 2, stride=2)
        self.stages = nn.ModuleList(ConvNeXtBlock(w) for w in widths)
        self.downs = nn.ModuleList(
            nn.ModuleList((nn.LayerNorm(a), nn.Conv2d(a, b, 2, stride=2)))
            for a, b in zip(widths, widths[1:], strict=False)
        )
        self.norm = nn.LayerNorm(widths[-1])
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i < len(self.downs):
                norm, down = self.downs[i]
                x = down(norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        return self.head(self.norm(x.mean(dim=(2, 3))))


@snens.models.register("fresh_review_transformer")
def fresh_review_transformer(
    num_classes: int = 2, vocab: int = 30522, dim: int = 64, depth: int = 2, heads: int = 4
) -> nn.Module:
    """:class:`ReviewTransformer` over MiniLM's tokenizer (30,522 tokens), texts of ≤ 64."""
    return ReviewTransformer(num_classes, vocab, dim, depth, heads, length=64)


@snens.models.register("fresh_convnext")
def fresh_convnext(num_classes: int = 10, in_channels: int = 1, width: int = 24) -> nn.Module:
    """:class:`SmallConvNeXt`."""
    return SmallConvNeXt(num_classes, in_channels, width)


#: What every run shares (``--set`` syntax).
BASE = ("threads=1", "optim.select=nll")
#: situation → (its preset, ``--set`` overrides, the OOD set and score of the AUROC row).
SITUATIONS = {
    "text": (
        "rotten_tomatoes_minilm",
        (
            "model.backbone=fresh_review_transformer",
            "model.options={}",
            "data.train_examples=0",
            "data.validation_examples=1000",
            "data.test_examples=0",
            "optim.lr=1e-3",
            "optim.epochs=8",
            # the preset's γ rate is MiniLM's; a network of one's own starts from the library's
            "method.gamma_lr_multiplier=30.0",
        ),
        ("rt_plots", "energy"),
    ),
    "images": (
        "fashion_mnist_small_cnn",
        (
            "model.backbone=fresh_convnext",
            "model.options={width=24}",
            "data.train_examples=5000",
            "data.validation_examples=5000",
            "data.test_examples=0",
            "data.augment=[]",
            "data.corruptions=false",
            'data.ood_scores=["max_logit", "energy"]',
            "optim.epochs=20",
        ),
        ("mnist_5k", "energy"),
    ),
    # a network small for its data (where the studies saw the defaults' partition starve the
    # members): does the probe leave the defaults when they lose?
    "images_all": (
        "fashion_mnist_small_cnn",
        (
            "model.backbone=fresh_convnext",
            "model.options={width=8}",
            "data.train_examples=0",
            "data.validation_examples=5000",
            "data.test_examples=0",
            "data.corruptions=false",
            'data.ood_scores=["max_logit", "energy"]',
            "optim.epochs=8",
        ),
        ("mnist_5k", "energy"),
    ),
}
METHODS = {
    "single": ("method.name=single", "method.num_members=1"),
    "deep_ensemble": ("method.name=deep_ensemble",),
}
SEEDS = (0, 1)


def baselines() -> list[study.Item]:
    """One model and the deep ensemble, every situation and seed, the cheaper first."""
    out = []
    for seed in SEEDS:
        for situation, (name, overrides, _) in SITUATIONS.items():
            for method, sets in METHODS.items():
                variant = Variant(method, sets, (seed,), preset=name)
                out += [
                    (situation, variant, run)
                    for run in plan_variant(variant, WHERE["out"] / situation, (*BASE, *overrides))
                ]
    return out


def tune_dir(situation: str, seed: int) -> Path:
    return WHERE["out"] / situation / "tune" / f"seed={seed}"


def base_config(situation: str) -> RunConfig:
    """The situation's config, σN-Ens at the library's defaults: what ``snens tune --config``
    reads (its recipes then set the input policy, τ, λ and γ's rate over it)."""
    name, overrides, _ = SITUATIONS[situation]
    return load_config(preset(name), [*BASE, *overrides])


def run_tune(situation: str, seed: int) -> None:
    """``snens tune`` over the situation's config at ``seed``: its four recipes probed for
    half the schedule, the chosen one trained to the end."""
    out = tune_dir(situation, seed)
    runs = plan_tune(base_config(situation), out, [f"seed={seed}"])
    print(f"== {situation}/tune/seed={seed}", flush=True)
    tune(runs, out)


def train_all(seeds: Sequence[int] = SEEDS) -> int:
    """Seed by seed and situation by situation: one model, ``snens tune``, the deep ensemble."""
    failed, planned = 0, baselines()
    for seed in seeds:
        for situation in SITUATIONS:
            items = [
                item for item in planned if (item[0], item[2].config.seed) == (situation, seed)
            ]
            failed |= study.train([item for item in items if item[1].name == "single"])
            if not (tune_dir(situation, seed) / TUNE_FILE).is_file():
                run_tune(situation, seed)
            failed |= study.train(items)
    return failed


def report() -> Path:
    """``results/fresh.md``: per situation, each method raw and after temperature scaling,
    what ``snens tune`` chose, and its differences from one model and the deep ensemble with
    paired bootstrap intervals."""
    sections = [
        "# `snens tune` on networks written after it was fixed (`python experiments/fresh.py "
        "report`)",
        "",
        (__doc__ or "").split("\n\n")[0].replace("\n", " "),
        "",
        (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "",
    ]
    for situation, (_, _, ood) in SITUATIONS.items():
        groups = {
            method: sorted((WHERE["out"] / situation / method).glob("seed=*")) for method in METHODS
        }
        tuned = study.chosen_runs(WHERE["out"] / situation / "tune")
        groups["snens tune"] = [path for path, _ in tuned]
        chosen = [name for _, name in tuned]
        rows, parts, arrays = [], [], {}
        for method, paths in groups.items():
            done = [p for p in paths if (p / FINAL).is_file() and (p / EXAMPLES).is_file()]
            if not done:
                continue
            finals = [json.loads((p / FINAL).read_text()) for p in done]
            arrays[method] = [read_examples(p) for p in done]
            metrics = [f["metrics"] for f in finals]
            cells = [
                study.mean_cell(metrics, key)
                for key in ("test/accuracy", "test/nll", "test/ece", "test_ts/nll", "test_ts/ece")
            ]
            what = method if method != "snens tune" else f"snens tune ({', '.join(chosen)})"
            # the probe's cost: every recipe's epochs, the paused ones too
            trained = [sorted(p.parent.iterdir()) if method == "snens tune" else [p] for p in done]
            seconds = sum(_train_seconds(runs) for runs in trained) / len(done)
            params = f"{finals[0]['model']['params']:,}"
            rows.append([what, str(len(done)), params, *cells, f"{seconds:,.0f}"])
            parts.append((what, *(_mean(metrics, f"val/{key}") for key in DECOMPOSITION)))
        if not rows:
            continue
        sections += [
            f"## {situation}",
            "",
            markdown_table(
                ["method", "n", "params", "acc", "NLL", "ECE", "NLL +TS", "ECE +TS", "train s"],
                rows,
            ),
            "",
            *_probes(situation),
            *_decomposition(parts),
            "",
        ]
        pairs = [("snens tune", "single"), ("snens tune", "deep_ensemble")]
        differences = study.difference_table(arrays, pairs, ood=ood)
        if len(differences) > 2:  # a header alone: no pair has both its methods finished
            sections += [*differences, ""]
    path = WHERE["out"].parent / "fresh.md"
    files.write_text(path, "\n".join(sections), mode=files.plain_mode(path))
    return path


#: What the validation NLL is taken apart into (``final.json``'s, at the selected weights).
DECOMPOSITION = ("nll", "member_nll_mean", "disagreement")


def _mean(metrics: Sequence[dict], key: str) -> float:
    return sum(m[key] for m in metrics) / len(metrics)


def _decomposition(parts: Sequence[tuple[str, float, float, float]]) -> list[str]:
    """The validation NLL at the selected weights taken apart: the members' mean NLL, its
    difference from one model's (what a member loses or gains alone), what averaging them wins
    back (members' mean − ensemble), and how often two members disagree."""
    single = next((members for what, _, members, _ in parts if what == "single"), None)
    rows = [
        [
            what,
            f"{nll:.4f}",
            f"{members:.4f}",
            "—" if single is None else f"{members - single:+.4f}",
            f"{members - nll:.4f}",
            f"{disagreement:.4f}",
        ]
        for what, nll, members, disagreement in parts
    ]
    header = ["method", "val NLL", "members' mean", "members − one model", "gain of averaging"]
    return [
        "Validation, at the selected weights (means over the seeds):",
        "",
        markdown_table([*header, "disagreement"], rows),
    ]


def _probes(situation: str) -> list[str]:
    """Each seed's probe: every recipe's best validation NLL in the probed epochs."""
    rows = []
    for seed in SEEDS:
        record = tune_dir(situation, seed) / TUNE_FILE
        if not record.is_file():
            continue
        probe = json.loads(record.read_text())
        values = [
            f"{name} {r['value']:.4f} (epoch {r['epoch']})" for name, r in probe["recipes"].items()
        ]
        single = _best_of_first(WHERE["out"] / situation / "single" / f"seed={seed}", probe)
        rows.append(
            [
                str(seed),
                f"{probe['probe_epochs']} of {probe['epochs']}",
                "; ".join(values),
                probe["chosen"],
                single,
            ]
        )
    if not rows:
        return []
    header = ["seed", "probed epochs", "validation NLL by recipe", "chosen"]
    header.append("one model in the same epochs")
    return ["The probe:", "", markdown_table(header, rows), ""]


def _train_seconds(runs: Sequence[Path]) -> float:
    """The training seconds of every epoch of ``runs`` (directories; files among them are
    skipped), from their metrics.jsonl."""
    from snens.engine.runs import read_metrics

    return sum(r.get("seconds", 0.0) for run in runs if run.is_dir() for r in read_metrics(run))


def _best_of_first(run: Path, probe: dict) -> str:
    """One model's best validation NLL in the epochs the probe trained (its run to the end
    under the same schedule), from its metrics.jsonl; "—" where it has none."""
    from snens.engine.runs import read_metrics

    values = {
        r["epoch"]: r["val/nll"]
        for r in read_metrics(run)
        if isinstance(r.get("epoch"), int)
        and r["epoch"] <= probe["probe_epochs"]
        and "val/nll" in r
    }
    if not values:
        return "—"
    epoch = min(values, key=values.__getitem__)
    return f"{values[epoch]:.4f} (epoch {epoch})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=WHERE["out"], help="the study's directory")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the runs not yet done")
    run.add_argument("--seeds", type=int, nargs="+", default=SEEDS, choices=SEEDS)
    sub.add_parser("report", help="write results/fresh.md from the finished runs")
    sub.add_parser("plan", help="list the baselines' runs and their status")
    args = parser.parse_args(argv)
    WHERE.update(out=args.out.resolve())
    os.chdir(ROOT)
    if args.command == "run":
        return train_all(args.seeds)
    if args.command == "report":
        print(report())
        return 0
    study.print_plan(baselines())
    for situation in SITUATIONS:
        for seed in SEEDS:
            done = (tune_dir(situation, seed) / TUNE_FILE).is_file()
            print(f"{situation:11s} snens tune  seed={seed}   {'done' if done else 'todo'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
