"""The measuring core of the cost benchmarks: interleaved timing ratios, a training step,
peak memory, the device and table lines.

Timings on a shared CPU are noisy, so :func:`compare` interleaves a variant and its baseline
and returns the median of the per-repeat ratios. ``harness.py`` and the scripts beside it
measure with these; ``snens bench`` runs the harness from a checkout.
"""

from __future__ import annotations

import itertools
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from snens.engine.build import resolve_device
from snens.method.loss import ensemble_loss


@dataclass(frozen=True)
class Measure:
    """One row of the table: a ratio, its spread over repeats, and the target it answers."""

    name: str
    ratio: float
    spread: tuple[float, float]  # min, max of the per-repeat ratios
    target: str  # "≤1.05×", or "report" where there is none
    baseline_ms: float

    def verdict(self) -> str:
        """``"met"`` or ``"NOT met"`` against a ``"≤…×"`` target, else ``"report"``."""
        if not self.target.startswith("≤"):
            return "report"
        return "met" if self.ratio <= float(self.target[1:].split("×")[0]) else "NOT met"


def measure_device(name: str | torch.device) -> torch.device:
    """``name`` as a device the bench measures on: the CPU or a CUDA device this process sees
    (``"auto"``: CUDA when available).

    Raises:
        ValueError: ``name`` is not a device, neither ``cpu`` nor ``cuda``, or not there.
    """
    device = resolve_device(name)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the bench measures on cpu or cuda, got {str(name)!r}")
    return device


def sync() -> None:
    """Wait for queued GPU work, so that wall-clock times measure it (a no-op until CUDA is
    initialized)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_call(fn: Callable[[], None], inner: int) -> float:
    """Wall-clock seconds per call of ``fn``, over ``inner`` calls, the device synchronized
    around them."""
    sync()
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    sync()
    return (time.perf_counter() - start) / inner


def compare(
    variant: Callable[[], None],
    baseline: Callable[[], None],
    *,
    repeats: int,
    inner: int = 1,
    warmup: int = 2,
) -> tuple[float, tuple[float, float], float]:
    """Median of per-repeat time ratios variant/baseline, alternating which runs first.

    Returns:
        ``(median ratio, (min ratio, max ratio), median baseline seconds per call)``.
    """
    for _ in range(warmup):
        variant(), baseline()
    ratios, base_times = [], []
    for r in range(repeats):
        if r % 2:
            t_var, t_base = time_call(variant, inner), time_call(baseline, inner)
        else:
            t_base, t_var = time_call(baseline, inner), time_call(variant, inner)
        ratios.append(t_var / t_base)
        base_times.append(t_base)
    return statistics.median(ratios), (min(ratios), max(ratios)), statistics.median(base_times)


def train_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool = False
) -> Callable[[], None]:
    """A function of no arguments that takes one step of ``model`` on ``(x, y)``: forward,
    the ensemble loss, backward, an SGD update (a plain model's (B, K) logits: one member)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()

    def step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        if logits.dim() == 2:  # a plain model
            logits = logits.unsqueeze(0)
        loss = ensemble_loss(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def peak_memory_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of parameters and buffers plus the peak of live allocations during one no-grad
    forward (on CPU from the profiler's allocation and free events)."""
    resident = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    model.eval()
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
        before = torch.cuda.memory_allocated(x.device)
        torch.cuda.reset_peak_memory_stats(x.device)
        with torch.no_grad():
            model(x)
        torch.cuda.synchronize(x.device)
        return resident + torch.cuda.max_memory_allocated(x.device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.no_grad():
            model(x)
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    live = itertools.accumulate(n for _, n in events)
    return resident + max(live, default=0)


def format_table(rows: list[Measure]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| measure | ratio (median) | min–max | target | verdict | baseline ms |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.name} | {r.ratio:.3f}× | {r.spread[0]:.2f}–{r.spread[1]:.2f} | {r.target} "
            f"| {r.verdict()} | {r.baseline_ms:.1f} |"
            for r in rows
        ),
    ]
    return "\n".join(lines)


def device_line(device: torch.device) -> str:
    """One line naming the hardware a run measured (the CPU and its threads, or the CUDA
    device) and the versions of CUDA and torch."""
    if device.type == "cuda":
        return (
            f"{torch.cuda.get_device_name(device)} ({device}), CUDA {torch.version.cuda}, "
            f"torch {torch.__version__}"
        )
    return (
        f"{platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
