"""Where a σN-Ens training step spends its time, against the step it must not exceed.

Two pairs, each step profiled by ``torch.profiler`` over ``--steps`` steps after two warm-ups:

* SmolLM2's architecture (random weights, LoRA r=8 on q/v, a linear head on the last token):
  σN-Ens-LoRA at B texts against one LoRA model at M·B texts, its floor;
* CIFAR ResNet-18: σN-Ens at B images against one model at M·B images.

For each step: its wall-clock time per step, its time on the device (the CUDA kernels' total;
on a CPU, the operators' self time), its kernel launches per step — a step whose wall time far
exceeds its kernels' waits on the host's launches — and its most expensive kernels; then,
per pair, the operators whose time per step differs most between the two steps — where an
overhead sits, or where σN-Ens runs a kernel its floor does not.

    python benchmarks/profile_steps.py --device cuda --bf16          # the GPU check's profile
    python benchmarks/profile_steps.py --llm-layers 1 --tokens 8 --batch 2 --num-members 2
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable

import torch
from harness_llm import llm_step, lora_model, texts
from measure import measure_device, sync, train_step

import snens
from snens.models import create

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
COUNTS = ("(launches)", "(wall)")  # the entries of profile()'s result that are not times


def profile(step: Callable[[], None], steps: int, device: torch.device) -> dict[str, float]:
    """Time per step in microseconds of every kernel (on a GPU: kernels, copies and memsets)
    or operator (on a CPU: its self time) that ``step`` runs, by name; ``"(launches)"`` holds
    the kernel launches per step and ``"(wall)"`` the wall-clock µs per step, timed apart
    from the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for _ in range(2):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    wall = (time.perf_counter() - start) / steps * 1e6
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    times: dict[str, float] = {}
    launches = 0
    for event in prof.key_averages():
        if event.key in LAUNCHES:
            launches += event.count
        if cuda:  # the device's own events only: an operator's device time repeats its kernels'
            own = event.self_device_time_total if event.device_type == DeviceType.CUDA else 0
        else:
            own = event.self_cpu_time_total
        if own > 0:
            times[event.key] = own / steps
    times["(launches)"] = launches / steps
    times["(wall)"] = wall
    return times


def _total(times: dict[str, float]) -> float:
    return sum(t for name, t in times.items() if name not in COUNTS)


def _short(name: str, width: int = 72) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def report(
    title: str, variant: dict[str, float], floor: dict[str, float], top: int, unit: str
) -> str:
    """The pair's Markdown: totals, each step's top operators, the largest differences."""
    lines = [
        f"### {title}",
        "",
        f"| step | wall ms per step | {unit.split()[0]} ms per step | kernel launches per step |",
        "|---|---|---|---|",
    ]
    for label, times in (("σN-Ens", variant), ("floor", floor)):
        lines.append(
            f"| {label} | {times['(wall)'] / 1e3:.2f} | {_total(times) / 1e3:.2f} "
            f"| {times['(launches)']:.0f} |"
        )
    lines += [
        "",
        f"ratio σN-Ens / floor: {variant['(wall)'] / max(floor['(wall)'], 1e-9):.3f} "
        f"(wall), {_total(variant) / max(_total(floor), 1e-9):.3f} ({unit.split()[0]})",
    ]
    for label, times in (("σN-Ens", variant), ("floor", floor)):
        ranked = sorted(((t, n) for n, t in times.items() if n not in COUNTS), reverse=True)
        lines += ["", f"{label}: top {top} by self {unit} per step", "", "| op | µs | share |"]
        lines.append("|---|---|---|")
        total = max(_total(times), 1e-9)
        for t, name in ranked[:top]:
            lines.append(f"| `{_short(name)}` | {t:.1f} | {t / total:.1%} |")
    names = (set(variant) | set(floor)) - set(COUNTS)
    diffs = sorted(((variant.get(n, 0.0) - floor.get(n, 0.0), n) for n in names), reverse=True)
    lines += ["", f"largest differences, σN-Ens − floor ({unit} per step)", ""]
    lines += ["| op | σN-Ens | floor | difference |", "|---|---|---|---|"]
    for d, name in [*diffs[:top], *[x for x in diffs[-3:] if x[0] < 0]]:
        lines.append(
            f"| `{_short(name)}` | {variant.get(name, 0.0):.1f} | {floor.get(name, 0.0):.1f} "
            f"| {d:+.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-members", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="texts or images per member (B)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--llm-layers", type=int, default=30)
    parser.add_argument("--steps", type=int, default=3, help="timed and profiled steps per model")
    parser.add_argument("--top", type=int, default=12, help="operators listed per table")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    args = parser.parse_args(argv)
    try:
        device = measure_device(args.device)
    except ValueError as err:
        parser.error(f"argument --device: {err}")
    M, B, T = args.num_members, args.batch, args.tokens
    unit = "device µs" if device.type == "cuda" else "CPU µs"

    single = lora_model(args.llm_layers, 0, device)
    ens = snens.convert(copy.deepcopy(single), M)
    ids_b, y_b, ids_mb, y_mb = texts(M, B, T, device)
    llm = report(
        f"SmolLM2 ({args.llm_layers} layers, T={T}): σN-Ens-LoRA at B={B} vs one LoRA model "
        f"at M·B={M * B}",
        profile(llm_step(ens, ids_b, y_b, args.bf16), args.steps, device),
        profile(llm_step(single, ids_mb, y_mb, args.bf16), args.steps, device),
        args.top,
        unit,
    )
    del single, ens

    torch.manual_seed(0)
    plain = create("resnet18", num_classes=10).to(device)
    floor = copy.deepcopy(plain)
    x_b = torch.randn(B, 3, 32, 32, device=device)
    x_mb = torch.randn(M * B, 3, 32, 32, device=device)
    c_b = torch.randint(0, 10, (B,), device=device)
    c_mb = torch.randint(0, 10, (M * B,), device=device)
    cnn = report(
        f"ResNet-18 (CIFAR): σN-Ens at B={B} vs one model at M·B={M * B}",
        profile(train_step(snens.convert(plain, M), x_b, c_b, args.bf16), args.steps, device),
        profile(train_step(floor, x_mb, c_mb, args.bf16), args.steps, device),
        args.top,
        unit,
    )
    what = "bf16 autocast" if args.bf16 else "float32"
    print(f"## Profile: {device}, M={M}, {what}, torch {torch.__version__}\n\n{llm}\n\n{cnn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
