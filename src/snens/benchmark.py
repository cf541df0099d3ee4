"""Cost of σN-Ens against its floor and its peers, measured as ratios in one process.

The floor for an implicit ensemble that runs every member on every example is one plain model
on a batch of M·B; everything snens adds (member norms, replication, member heads) is overhead
over it. A deep ensemble pays the same compute plus M× the parameters. Timings on a shared CPU
are noisy, so every measure interleaves its variants, repeats them, and reports the median of
the per-repeat ratios; absolute times are printed for reference only.

Peak memory is the parameters and buffers plus the peak of the bytes allocated and not yet
freed during one no-grad forward: ``torch.cuda.max_memory_allocated`` on a GPU, the profiler's
allocation events (``profile_memory=True``) on a CPU. ``torch.compile`` rows are opt-in
(``--compile``): inductor compiles ResNet-18's training step in minutes on one CPU thread.

    python -m snens.benchmark            # or: snens bench, python benchmarks/bench.py
"""

from __future__ import annotations

import argparse
import copy
import itertools
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import snens
from snens.baselines import DeepEnsemble
from snens.models import create

__all__ = ["Measure", "Throughput", "main", "peak_memory_bytes", "run", "throughput"]


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


def _sync() -> None:
    """Wait for queued GPU work, so that wall-clock times measure it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _median_time(fn: Callable[[], None], inner: int) -> float:
    _sync()
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    _sync()
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


def _train_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool = False
) -> Callable[[], None]:
    """One timed step: forward, the ensemble loss, backward, an SGD update. The model's cost
    alone: the engine's step (:func:`snens.epoch.run_epoch`) adds the same host sync and
    gradient-norm work to every method, which would blur the ratios."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()

    def step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        if logits.dim() == 2:  # a plain model
            logits = logits.unsqueeze(0)
        loss = snens.ensemble_loss(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _norm_measures(M: int, B: int, repeats: int) -> list[Measure]:
    """Member norm vs the plain norm on the same (M·B, …) tensor, in three modes.

    ``train``: forward + backward, float32. ``bf16``: forward + backward of a bfloat16 input
    under CPU autocast (norms keep their input's dtype there). ``eval``: forward without grad.
    """
    cases = [
        ("BatchNorm2d", nn.BatchNorm2d(64), (M * B, 64, 16, 16)),
        ("LayerNorm", nn.LayerNorm(192), (M * B, 64, 192)),
        ("GroupNorm", nn.GroupNorm(8, 64), (M * B, 64, 16, 16)),
        ("RMSNorm", nn.RMSNorm(192), (M * B, 64, 192)),
    ]
    rows = []
    for mode in ("train", "bf16", "eval"):
        for name, plain, shape in cases:
            member = snens.nn.MEMBER_NORMS[type(plain)].from_plain(plain, M)
            training = mode != "eval"
            plain.train(training), member.train(training)
            dtype = torch.bfloat16 if mode == "bf16" else torch.float32
            x = torch.randn(shape, dtype=dtype, requires_grad=training)
            grad = torch.randn(shape, dtype=dtype)

            def run(layer, x=x, grad=grad, mode=mode):
                if mode == "eval":
                    with torch.no_grad():
                        layer(x)
                    return
                with warnings.catch_warnings():
                    # plain and member RMSNorm alike: a bf16 input with float32 weights
                    warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
                        y = layer(x)
                y.backward(grad)

            ratio, spread, base = compare(
                lambda run=run, member=member: run(member),
                lambda run=run, plain=plain: run(plain),
                repeats=3 * repeats,  # a norm call is milliseconds: more repeats cost little
                inner=5,
            )
            what = {"train": "fwd+bwd", "bf16": "fwd+bwd bf16 autocast", "eval": "eval fwd"}[mode]
            rows.append(
                Measure(
                    f"member {name} {what} vs plain, same (M·B, …)",
                    ratio,
                    spread,
                    "≤1.2×",
                    base * 1e3,
                )
            )
    return rows


def peak_memory_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Parameters and buffers plus the peak of live allocations during one no-grad forward.

    On CUDA: ``torch.cuda.max_memory_allocated`` over the forward, minus what was allocated
    before it. On CPU: the running sum of the profiler's allocation and free events, in time
    order (``torch.profiler`` with ``profile_memory=True``).
    """
    resident = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    model.eval()
    if x.is_cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            model(x)
        torch.cuda.synchronize()
        return resident + torch.cuda.max_memory_allocated() - before
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


def _with_plain_norms(ens: snens.Ensemble) -> snens.Ensemble:
    """A copy of ``ens`` whose member norms are plain norms (member 0's).

    Everything else snens adds over one plain model at M·B stays: the input replication, the
    member heads, the (M, B, K) loss. Timing it against the floor and against ``ens`` splits the
    overhead between the member norms and the rest.
    """
    ens = copy.deepcopy(ens)
    for module in list(ens.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, snens.nn.MemberNorm):
                setattr(module, name, child.to_plain(0))
    return ens


def _model_measures(
    backbone: str,
    M: int,
    B: int,
    repeats: int,
    image: tuple[int, ...],
    compile_model: bool = False,
    steps_only: bool = False,
) -> list[Measure]:
    torch.manual_seed(0)
    plain = create(backbone, num_classes=10)
    x_b, y_b = torch.randn(B, *image), torch.randint(0, 10, (B,))
    x_mb, y_mb = torch.randn(M * B, *image), torch.randint(0, 10, (M * B,))
    ens = snens.convert(plain, M)
    single = copy.deepcopy(plain)
    deep = DeepEnsemble([create(backbone, num_classes=10) for _ in range(M)])
    split = copy.deepcopy(ens)
    split.input_policy = "split"

    ens_step = _train_step(ens, x_b, y_b)
    rows = []
    ratio, spread, base = compare(ens_step, _train_step(single, x_mb, y_mb), repeats=repeats)
    rows.append(
        Measure(
            f"{backbone}: σN-Ens step (B={B}) vs single at M·B", ratio, spread, "≤1.05×", base * 1e3
        )
    )
    # where the overhead over the floor lies: the same ensemble with every member norm swapped
    # for member 0's plain norm keeps the replication, the member heads and the loss
    ratio, spread, base = compare(
        _train_step(_with_plain_norms(ens), x_b, y_b),
        _train_step(single, x_mb, y_mb),
        repeats=repeats,
    )
    rows.append(
        Measure(
            f"{backbone}: σN-Ens step with plain norms (heads, replication) vs single at M·B",
            ratio,
            spread,
            "report",
            base * 1e3,
        )
    )
    ratio, spread, base = compare(ens_step, _train_step(deep, x_b, y_b), repeats=repeats)
    rows.append(
        Measure(
            f"{backbone}: σN-Ens step vs deep ensemble, B={B}", ratio, spread, "≤1.0×", base * 1e3
        )
    )
    if steps_only:
        return rows
    if len(image) == 3:  # images: the same step with model and input in channels-last
        last = copy.deepcopy(ens).to(memory_format=torch.channels_last)
        x_last = x_b.contiguous(memory_format=torch.channels_last)
        ratio, spread, base = compare(
            _train_step(last, x_last, y_b),
            _train_step(copy.deepcopy(ens), x_b, y_b),
            repeats=repeats,
        )
        rows.append(
            Measure(
                f"{backbone}: σN-Ens step channels-last vs contiguous",
                ratio,
                spread,
                "report",
                base * 1e3,
            )
        )
    if compile_model:
        compiled = copy.deepcopy(ens)
        compiled_step = _train_step(torch.compile(compiled), x_b, y_b)
        start = time.perf_counter()
        compiled_step()
        warmup_s = time.perf_counter() - start
        ratio, spread, base = compare(
            compiled_step, _train_step(copy.deepcopy(ens), x_b, y_b), repeats=repeats
        )
        rows.append(
            Measure(
                f"{backbone}: σN-Ens step torch.compile vs eager (compile {warmup_s:.0f} s)",
                ratio,
                spread,
                "report",
                base * 1e3,
            )
        )
    ratio, spread, base = compare(
        _train_step(split, x_b, y_b), _train_step(single, x_b, y_b), repeats=repeats
    )
    rows.append(
        Measure(f"{backbone}: split step vs single at B", ratio, spread, "≤1.1×", base * 1e3)
    )

    def infer(model):
        model.eval()

        def run():
            with torch.no_grad():
                model(x_b)

        return run

    ratio, (low, high), base = compare(infer(deep), infer(ens), repeats=repeats)
    rows.append(  # deep time / σN-Ens time = σN-Ens images/s / deep ensemble images/s
        Measure(
            f"{backbone}: σN-Ens inference images/s vs deep ensemble (σN-Ens {B / base:.0f}/s)",
            ratio,
            (low, high),
            "report",
            base * 1e3,
        )
    )
    ens_bytes, deep_bytes = peak_memory_bytes(ens, x_b), peak_memory_bytes(deep, x_b)
    ratio = ens_bytes / deep_bytes
    rows.append(
        Measure(
            f"{backbone}: σN-Ens inference peak memory vs deep ensemble "
            f"({ens_bytes / 2**20:.1f} vs {deep_bytes / 2**20:.1f} MiB)",
            ratio,
            (ratio, ratio),
            "report",
            0.0,
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
    num_members: int = 4,
    batch: int = 8,
    repeats: int = 7,
    quick: bool = False,
    compile_model: bool = False,
    norms_only: bool = False,
    steps_only: bool = False,
) -> list[Measure]:
    """All measures, as :class:`Measure` rows.

    Args:
        num_members: M.
        batch: B, examples per step.
        repeats: interleaved repeats per ratio.
        quick: ResNet-18 only.
        compile_model: add the ``torch.compile`` rows (minutes of compilation on a CPU).
        norms_only: the member-norm rows alone (about a minute).
        steps_only: the training-step rows alone (σN-Ens against a single model at M·B, the
            same with plain norms, a deep ensemble), e.g. for more repeats of them.
    """
    if norms_only and steps_only:
        raise ValueError("norms_only and steps_only exclude each other: choose one")
    rows = [] if steps_only else _norm_measures(num_members, 32, repeats)
    if norms_only:
        return rows
    backbones = [("resnet18", (3, 32, 32))] + ([] if quick else [("vit_small", (3, 32, 32))])
    for backbone, image in backbones:
        rows += _model_measures(
            backbone, num_members, batch, repeats, image, compile_model, steps_only
        )
    return rows


@dataclass(frozen=True)
class Throughput:
    """Absolute cost of one method: images per second and peak memory."""

    method: str
    params: int
    train_images_per_s: float  # input images per second of training steps at batch B
    infer_images_per_s: float  # input images per second of no-grad forwards at batch B
    train_peak_mib: float | None  # peak allocated memory of a training step (GPU only)
    infer_peak_mib: float  # parameters, buffers and the peak live allocations of a forward


def throughput(
    backbone: str = "resnet18",
    *,
    num_members: int = 4,
    batch: int = 128,
    repeats: int = 20,
    device: str = "cpu",
    bf16: bool = False,
    image: tuple[int, ...] = (3, 32, 32),
    num_classes: int = 10,
) -> list[Throughput]:
    """Images/s and peak memory of a single model, σN-Ens and a deep ensemble at batch B.

    Every ensemble processes each image with all M members, so their images/s answer "how
    fast does the whole ensemble train (predict)". A step is timed after two warm-up steps,
    with the device synchronized; the value is B over the median of ``repeats`` steps.
    """
    dev = torch.device(device)
    torch.manual_seed(0)
    x = torch.randn(batch, *image, device=dev)
    y = torch.randint(0, num_classes, (batch,), device=dev)
    plain = create(backbone, num_classes=num_classes).to(dev)
    models = {
        "single": copy.deepcopy(plain),
        "σN-Ens": snens.convert(plain, num_members),
        "deep ensemble": DeepEnsemble(
            [create(backbone, num_classes=num_classes) for _ in range(num_members)]
        ).to(dev),
    }
    rows = []
    for name, model in models.items():
        step = _train_step(model, x, y, bf16=bf16)
        for _ in range(2):
            step()
        train_peak = None
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
            step()
            train_peak = torch.cuda.max_memory_allocated(dev) / 2**20
        train_s = statistics.median(_median_time(step, 1) for _ in range(repeats))
        model.eval()

        def infer(model=model) -> None:
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                model(x)

        infer()
        infer_s = statistics.median(_median_time(infer, 1) for _ in range(repeats))
        rows.append(
            Throughput(
                name,
                sum(p.numel() for p in model.parameters()),
                batch / train_s,
                batch / infer_s,
                train_peak,
                peak_memory_bytes(model, x) / 2**20,
            )
        )
    return rows


def format_throughput(rows: list[Throughput]) -> str:
    lines = [
        "| method | params | train images/s | inference images/s | train peak MiB (GPU) "
        "| inference peak MiB (float32) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = "–" if r.train_peak_mib is None else f"{r.train_peak_mib:.0f}"
        lines.append(
            f"| {r.method} | {r.params:,} | {r.train_images_per_s:,.0f} "
            f"| {r.infer_images_per_s:,.0f} | {peak} | {r.infer_peak_mib:.0f} |"
        )
    return "\n".join(lines)


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
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--norms-only", action="store_true", help="the member-norm rows alone")
    only.add_argument(
        "--steps-only",
        action="store_true",
        help="the training-step rows alone (vs single at M·B, with plain norms, vs deep ensemble)",
    )
    parser.add_argument(
        "--compile", action="store_true", help="add torch.compile rows (slow to warm up on CPU)"
    )
    parser.add_argument(
        "--absolute",
        action="store_true",
        help="instead of the ratios: images/s and peak memory of single, σN-Ens and deep "
        "ensemble (ResNet-18, CIFAR-sized inputs); use with --device cuda --bf16 --batch 128",
    )
    parser.add_argument("--device", default="cpu", help="device of --absolute, e.g. cuda")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast for --absolute")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.absolute:
        rows = throughput(
            num_members=args.num_members,
            batch=args.batch,
            repeats=args.repeats,
            device=args.device,
            bf16=args.bf16,
        )
        name = torch.cuda.get_device_name(args.device) if "cuda" in args.device else "CPU"
        print(format_throughput(rows))
        print(
            f"\nresnet18, M={args.num_members}, B={args.batch}, {name}, "
            f"{'bf16 autocast' if args.bf16 else 'float32'}, torch {torch.__version__}, "
            f"median of {args.repeats} steps"
        )
        return 0
    rows = run(
        args.num_members,
        args.batch,
        args.repeats,
        args.quick,
        args.compile,
        args.norms_only,
        args.steps_only,
    )
    print(format_table(rows))
    print(
        f"\n{platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, M={args.num_members}, B={args.batch}, "
        f"median of {args.repeats} interleaved repeats"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
