"""Cost of σN-Ens against its floor and its peers, measured as ratios in one process.

The floor for an implicit ensemble that runs every member on every example is one plain model
on a batch of M·B; everything snens adds (member norms, replication, member heads) is overhead
over it. A deep ensemble pays the same compute plus M× the parameters. Timings on a shared CPU
are noisy, so every measure interleaves its variants, repeats them, and reports the median of
the per-repeat ratios; absolute times are printed for reference only.

    python -m snens.benchmark            # or: snens bench, python benchmarks/bench.py
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import snens
from snens.models import create

__all__ = ["Measure", "main", "run"]


@dataclass(frozen=True)
class Measure:
    """One row of the table: a ratio, its spread over repeats, and the target it answers."""

    name: str
    ratio: float
    spread: tuple[float, float]  # min, max of the per-repeat ratios
    target: str
    baseline_ms: float

    def verdict(self) -> str:
        if not self.target.startswith("≤"):
            return "report"
        return "met" if self.ratio <= float(self.target[1:].split("×")[0]) else "NOT met"


def _median_time(fn: Callable[[], None], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def compare(
    variant: Callable[[], None],
    baseline: Callable[[], None],
    *,
    repeats: int,
    inner: int = 1,
    warmup: int = 2,
) -> tuple[float, tuple[float, float], float]:
    """Median of per-repeat time ratios variant/baseline, alternating which runs first."""
    for _ in range(warmup):
        variant(), baseline()
    ratios, base_times = [], []
    for r in range(repeats):
        if r % 2:
            t_var, t_base = _median_time(variant, inner), _median_time(baseline, inner)
        else:
            t_base, t_var = _median_time(baseline, inner), _median_time(variant, inner)
        ratios.append(t_var / t_base)
        base_times.append(t_base)
    return statistics.median(ratios), (min(ratios), max(ratios)), statistics.median(base_times)


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()

    def step() -> None:
        logits = model(x)
        if logits.dim() == 2:  # a plain model
            logits = logits.unsqueeze(0)
        loss = snens.ensemble_loss(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


class _DeepEnsemble(nn.Module):
    """M independent models run in turn on the same batch: (B, …) -> (M, B, K)."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members])


def _norm_measures(M: int, B: int, repeats: int) -> list[Measure]:
    cases = [
        ("BatchNorm2d", nn.BatchNorm2d(64), (M * B, 64, 16, 16)),
        ("LayerNorm", nn.LayerNorm(192), (M * B, 64, 192)),
        ("GroupNorm", nn.GroupNorm(8, 64), (M * B, 64, 16, 16)),
    ]
    rows = []
    for name, plain, shape in cases:
        member = snens.nn.MEMBER_NORMS[type(plain)].from_plain(plain, M)
        x = torch.randn(shape, requires_grad=True)
        grad = torch.randn(shape)

        def run_member(member=member, x=x, grad=grad):
            member(x).backward(grad)

        def run_plain(plain=plain, x=x, grad=grad):
            plain(x).backward(grad)

        ratio, spread, base = compare(run_member, run_plain, repeats=repeats, inner=5)
        rows.append(
            Measure(
                f"member {name} fwd+bwd vs plain, same (M·B, …)", ratio, spread, "≤1.2×", base * 1e3
            )
        )
    return rows


def _model_measures(backbone: str, M: int, B: int, repeats: int, image: tuple[int, ...]):
    torch.manual_seed(0)
    plain = create(backbone, num_classes=10)
    x_b, y_b = torch.randn(B, *image), torch.randint(0, 10, (B,))
    x_mb, y_mb = torch.randn(M * B, *image), torch.randint(0, 10, (M * B,))
    ens = snens.convert(plain, M)
    ens(x_b[:2])  # settle replication="auto"
    single = copy.deepcopy(plain)
    deep = _DeepEnsemble([create(backbone, num_classes=10) for _ in range(M)])
    split = copy.deepcopy(ens)
    split.input_policy = "split"
    eager = copy.deepcopy(ens)
    eager.replication = "eager"

    ens_step = _train_step(ens, x_b, y_b)
    rows = []
    ratio, spread, base = compare(ens_step, _train_step(single, x_mb, y_mb), repeats=repeats)
    rows.append(
        Measure(
            f"{backbone}: σN-Ens step (B={B}) vs single at M·B", ratio, spread, "≤1.05×", base * 1e3
        )
    )
    ratio, spread, base = compare(ens_step, _train_step(deep, x_b, y_b), repeats=repeats)
    rows.append(
        Measure(
            f"{backbone}: σN-Ens step vs deep ensemble, B={B}", ratio, spread, "≤1.0×", base * 1e3
        )
    )
    ratio, spread, base = compare(
        _train_step(split, x_b, y_b), _train_step(single, x_b, y_b), repeats=repeats
    )
    rows.append(
        Measure(f"{backbone}: split step vs single at B", ratio, spread, "≤1.1×", base * 1e3)
    )
    if ens.replication == "lazy":
        ratio, spread, base = compare(ens_step, _train_step(eager, x_b, y_b), repeats=repeats)
        rows.append(
            Measure(
                f"{backbone}: lazy vs eager replication step", ratio, spread, "report", base * 1e3
            )
        )

    def infer(model):
        model.eval()

        def run():
            with torch.no_grad():
                model(x_b)

        return run

    ratio, spread, base = compare(infer(ens), infer(deep), repeats=repeats)
    rows.append(
        Measure(
            f"{backbone}: σN-Ens inference vs deep ensemble", ratio, spread, "report", base * 1e3
        )
    )
    params = sum(p.numel() for p in ens.parameters()) / sum(p.numel() for p in plain.parameters())
    rows.append(
        Measure(
            f"{backbone}: parameters vs single (M={M})", params, (params, params), "≤1.01×", 0.0
        )
    )
    return rows


def run(
    num_members: int = 4, batch: int = 8, repeats: int = 7, quick: bool = False
) -> list[Measure]:
    """All measures, as :class:`Measure` rows."""
    rows = _norm_measures(num_members, 32, repeats)
    backbones = [("resnet18", (3, 32, 32))] + ([] if quick else [("vit_small", (3, 32, 32))])
    for backbone, image in backbones:
        rows += _model_measures(backbone, num_members, batch, repeats, image)
    return rows


def format_table(rows: list[Measure]) -> str:
    lines = [
        "| measure | ratio (median) | min–max | target | verdict | baseline ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.ratio:.3f}× | {r.spread[0]:.2f}–{r.spread[1]:.2f} | {r.target} "
            f"| {r.verdict()} | {r.baseline_ms:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="snens bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-members", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="examples per member step (B)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--quick", action="store_true", help="ResNet-18 only")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args.num_members, args.batch, args.repeats, args.quick)
    print(format_table(rows))
    print(
        f"\n{platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, M={args.num_members}, B={args.batch}, "
        f"median of {args.repeats} interleaved repeats"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
