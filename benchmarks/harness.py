"""Cost of σN-Ens against its floor and its peers, measured as ratios in one process.

The floor for an implicit ensemble that runs every member on every example is one plain model
on a batch of M·B; everything snens adds (member norms, replication, member heads) is overhead
over it. A deep ensemble pays the same compute plus M× the parameters. Timings on a shared CPU
are noisy, so every measure interleaves its variants, repeats them, and reports the median of
the per-repeat ratios; absolute times are printed for reference only.

Peak memory is the parameters and buffers plus the peak of the bytes allocated and not yet
freed during one no-grad forward: ``torch.cuda.max_memory_allocated`` on a GPU, the profiler's
allocation events (``profile_memory=True``) on a CPU. ``torch.compile`` rows are opt-in
(``--compile``, or ``--compile-only`` for them alone): inductor compiles ResNet-18's training
step in minutes on one CPU thread.

Every mode runs on ``--device`` (default ``cpu``): models and inputs live there, bf16 rows use
autocast of that device type, and on CUDA the clock is read only after
``torch.cuda.synchronize()``, before and after each timed repeat, past two warm-up calls.

    python benchmarks/bench.py            # or: snens bench (from this checkout)
    snens bench --device cuda --steps-only

The measuring core (:func:`measure.compare`, ``train_step``, ``peak_memory_bytes``) is
``measure.py``; the rows, their targets and the command line are here, the LLM rows in
``harness_llm.py``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from measure import (
    Measure,
    compare,
    device_line,
    format_table,
    measure_device,
    peak_memory_bytes,
    sync,
    time_call,
    train_step,
)
from torch import nn

import snens
from snens.baselines import DeepEnsemble
from snens.engine.config import MAX_THREADS
from snens.models import create
from snens.nn.norms import MAX_MEMBERS

__all__ = [
    "BACKBONE_IMAGES",
    "Throughput",
    "compile_measure",
    "format_throughput",
    "main",
    "model_measures",
    "norm_measures",
    "run",
    "throughput",
    "with_plain_norms",
]

# Input (C, H, W) of each image backbone for --absolute: the dataset it is built for.
BACKBONE_IMAGES: dict[str, tuple[int, int, int]] = {
    "small_cnn": (1, 28, 28),  # Fashion-MNIST
    "mobilenet_v2": (3, 224, 224),  # ImageNet, its pretrained resolution
    **{name: (3, 32, 32) for name in ("resnet18", "resnet50", "vit_small", "wrn28_10")},  # CIFAR
}


def norm_measures(
    M: int, B: int, repeats: int, device: str | torch.device = "cpu"
) -> list[Measure]:
    """Member norm vs the plain norm on the same (M·B, …) tensor, in three modes.

    ``train``: forward + backward, float32. ``bf16``: forward + backward of a bfloat16 input
    under autocast of ``device``'s type (CPU autocast leaves norms in their input's dtype; CUDA
    autocast runs ``layer_norm`` and ``group_norm`` in float32). ``eval``: forward without grad.
    """
    device = torch.device(device)
    cases = [
        ("BatchNorm2d", nn.BatchNorm2d(64, device=device), (M * B, 64, 16, 16)),
        ("LayerNorm", nn.LayerNorm(192, device=device), (M * B, 64, 192)),
        ("GroupNorm", nn.GroupNorm(8, 64, device=device), (M * B, 64, 16, 16)),
        ("RMSNorm", nn.RMSNorm(192, device=device), (M * B, 64, 192)),
    ]
    rows = []
    for mode in ("train", "bf16", "eval"):
        for name, plain, shape in cases:
            member = snens.nn.MEMBER_NORMS[type(plain)].from_plain(plain, M)
            training = mode != "eval"
            plain.train(training), member.train(training)
            dtype = torch.bfloat16 if mode == "bf16" else torch.float32
            x = torch.randn(shape, dtype=dtype, device=device, requires_grad=training)
            grad = torch.randn(shape, dtype=dtype, device=device)

            def run(layer, x=x, grad=grad, mode=mode):
                if mode == "eval":
                    with torch.no_grad():
                        layer(x)
                    return
                with warnings.catch_warnings():
                    # plain and member RMSNorm alike: a bf16 input with float32 weights
                    warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")
                    bf16 = mode == "bf16"
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
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


def with_plain_norms(ens: snens.Ensemble) -> snens.Ensemble:
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


def compile_measure(
    backbone: str, ens: snens.Ensemble, x: torch.Tensor, y: torch.Tensor, repeats: int
) -> Measure:
    """σN-Ens's training step through ``torch.compile`` against the same step eager; the first
    compiled call (the compilation) is timed apart and named in the row."""
    compiled_step = train_step(torch.compile(copy.deepcopy(ens)), x, y)
    sync()
    start = time.perf_counter()
    compiled_step()
    sync()
    warmup_s = time.perf_counter() - start
    ratio, spread, base = compare(
        compiled_step, train_step(copy.deepcopy(ens), x, y), repeats=repeats
    )
    return Measure(
        f"{backbone}: σN-Ens step torch.compile vs eager (compile {warmup_s:.0f} s)",
        ratio,
        spread,
        "report",
        base * 1e3,
    )


def model_measures(
    backbone: str,
    M: int,
    B: int,
    repeats: int,
    image: tuple[int, ...],
    compile_model: bool = False,
    steps_only: bool = False,
    *,
    compile_only: bool = False,
    device: str | torch.device = "cpu",
    bf16: bool = False,
) -> list[Measure]:
    """The rows of one backbone; ``bf16``: its training steps under bfloat16 autocast, named
    "<backbone> (bf16)"."""

    step = functools.partial(train_step, bf16=bf16)
    torch.manual_seed(0)
    plain = create(backbone, num_classes=10).to(device)
    x_b = torch.randn(B, *image, device=device)
    y_b = torch.randint(0, 10, (B,), device=device)
    x_mb = torch.randn(M * B, *image, device=device)
    y_mb = torch.randint(0, 10, (M * B,), device=device)
    ens = snens.convert(plain, M)
    label = f"{backbone} (bf16)" if bf16 else backbone
    if compile_only:
        return [compile_measure(backbone, ens, x_b, y_b, repeats)]
    single = copy.deepcopy(plain)
    deep = DeepEnsemble([create(backbone, num_classes=10) for _ in range(M)]).to(device)
    split = copy.deepcopy(ens)
    split.input_policy = "split"

    ens_step = step(ens, x_b, y_b)
    rows = []
    ratio, spread, base = compare(ens_step, step(single, x_mb, y_mb), repeats=repeats)
    rows.append(
        Measure(
            f"{label}: σN-Ens step (B={B}) vs single at M·B", ratio, spread, "≤1.05×", base * 1e3
        )
    )
    # where the overhead over the floor lies: the same ensemble with every member norm swapped
    # for member 0's plain norm keeps the replication, the member heads and the loss
    ratio, spread, base = compare(
        step(with_plain_norms(ens), x_b, y_b),
        step(single, x_mb, y_mb),
        repeats=repeats,
    )
    rows.append(
        Measure(
            f"{label}: σN-Ens step with plain norms (heads, replication) vs single at M·B",
            ratio,
            spread,
            "report",
            base * 1e3,
        )
    )
    ratio, spread, base = compare(ens_step, step(deep, x_b, y_b), repeats=repeats)
    rows.append(
        Measure(f"{label}: σN-Ens step vs deep ensemble, B={B}", ratio, spread, "≤1.0×", base * 1e3)
    )
    if steps_only:
        return rows
    if len(image) == 3:  # images: the same step with model and input in channels-last
        last = copy.deepcopy(ens).to(memory_format=torch.channels_last)
        x_last = x_b.contiguous(memory_format=torch.channels_last)
        ratio, spread, base = compare(
            step(last, x_last, y_b),
            step(copy.deepcopy(ens), x_b, y_b),
            repeats=repeats,
        )
        rows.append(
            Measure(
                f"{label}: σN-Ens step channels-last vs contiguous",
                ratio,
                spread,
                "report",
                base * 1e3,
            )
        )
    if compile_model:
        rows.append(compile_measure(backbone, ens, x_b, y_b, repeats))
    ratio, spread, base = compare(step(split, x_b, y_b), step(single, x_b, y_b), repeats=repeats)
    rows.append(Measure(f"{label}: split step vs single at B", ratio, spread, "≤1.1×", base * 1e3))

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
    compile_only: bool = False,
    device: str | torch.device = "cpu",
    bf16: bool = False,
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
        compile_only: the ``torch.compile`` rows alone, one per backbone.
        device: where models and inputs live, e.g. ``"cuda"``.
        bf16: the backbones' training steps under bfloat16 autocast (the norm rows have their
            own bf16 rows).

    Raises:
        ValueError: if more than one of ``norms_only``, ``steps_only``, ``compile_only`` is
            set, or ``device`` is not there (see :func:`measure.measure_device`).
    """
    if norms_only + steps_only + compile_only > 1:
        raise ValueError("norms_only, steps_only and compile_only exclude each other: choose one")
    device = measure_device(device)
    rows = [] if steps_only or compile_only else norm_measures(num_members, 32, repeats, device)
    if norms_only:
        return rows
    backbones = [("resnet18", (3, 32, 32))] + ([] if quick else [("vit_small", (3, 32, 32))])
    for backbone, image in backbones:
        rows += model_measures(
            backbone,
            num_members,
            batch,
            repeats,
            image,
            compile_model,
            steps_only,
            compile_only=compile_only,
            device=device,
            bf16=bf16,
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
    device: str | torch.device = "cpu",
    bf16: bool = False,
    image: tuple[int, ...] | None = None,
    num_classes: int = 10,
) -> list[Throughput]:
    """Images/s and peak memory of a single model, σN-Ens and a deep ensemble at batch B.

    Every ensemble processes each image with all M members, so their images/s answer "how
    fast does the whole ensemble train (predict)". A step is timed after two warm-up steps,
    with the device synchronized; the value is B over the median of ``repeats`` steps.

    Args:
        image: input (C, H, W); ``None`` takes the backbone's from :data:`BACKBONE_IMAGES`.

    Raises:
        ValueError: if ``image`` is ``None`` for a backbone without a known input, or
            ``device`` is not there (see :func:`measure.measure_device`).
    """
    if image is None:
        if backbone not in BACKBONE_IMAGES:
            raise ValueError(
                f"no known input shape for {backbone!r}: pass image=(C, H, W); known: "
                f"{', '.join(BACKBONE_IMAGES)}"
            )
        image = BACKBONE_IMAGES[backbone]
    dev = measure_device(device)
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
        step = train_step(model, x, y, bf16=bf16)
        for _ in range(2):
            step()
        train_peak = None
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
            step()
            train_peak = torch.cuda.max_memory_allocated(dev) / 2**20
        train_s = statistics.median(time_call(step, 1) for _ in range(repeats))
        model.eval()

        def infer(model=model) -> None:
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                model(x)

        infer()
        infer_s = statistics.median(time_call(infer, 1) for _ in range(repeats))
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


def _device_arg(name: str) -> torch.device:
    try:
        return measure_device(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _bounded(flag: str, low: int, high: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an int in ``low..high``, or an error naming the value and the range
    (argparse names ``flag`` before it and exits with status 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an int in {low}..{high}{why}, got {value}")
        return value

    return parse


#: Most repeats of one measure: the median of 1,000 is as stable as it gets.
_MAX_REPEATS = 1000
#: Largest batch per member step: 2**16 images of 3×224×224 are 39 GB as float32.
_MAX_BATCH = 2**16
#: SmolLM2-135M has 30 decoder layers and a context of 8,192 tokens.
_LLM_LAYERS, _LLM_TOKENS = 30, 8192


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="snens bench",
        description=__doc__.split("\n\n")[0],
        epilog="examples: snens bench --quick; snens bench --device cuda --steps-only; "
        "snens bench --device cuda --compile-only --quick; "
        "snens bench --absolute --device cuda --bf16 --batch 128 --backbone wrn28_10",
    )
    parser.add_argument("--num-members", type=_bounded("--num-members", 1, MAX_MEMBERS), default=4)
    parser.add_argument(
        "--batch",
        type=_bounded("--batch", 1, _MAX_BATCH),
        default=8,
        help="examples per member step (B)",
    )
    parser.add_argument("--repeats", type=_bounded("--repeats", 1, _MAX_REPEATS), default=7)
    parser.add_argument(
        "--device",
        type=_device_arg,
        default="cpu",
        help="where models and inputs live, for every mode: cpu (default), cuda, cuda:N; "
        "bf16 rows autocast on it, CUDA timings synchronize around each repeat",
    )
    parser.add_argument(
        "--threads",
        type=_bounded("--threads", 0, MAX_THREADS, " (0 = all)"),
        default=None,
        help="torch CPU threads (default: all); they set the speed of --device cpu, not of GPU "
        "kernels",
    )
    parser.add_argument("--quick", action="store_true", help="ResNet-18 only")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--norms-only", action="store_true", help="the member-norm rows alone")
    only.add_argument(
        "--steps-only",
        action="store_true",
        help="the training-step rows alone (vs single at M·B, with plain norms, vs deep ensemble)",
    )
    only.add_argument(
        "--compile-only",
        action="store_true",
        help="the torch.compile rows alone (σN-Ens step compiled vs eager, one per backbone)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="add the torch.compile rows (slow to warm up on CPU); --compile-only: them alone",
    )
    parser.add_argument(
        "--absolute",
        action="store_true",
        help="instead of the ratios: images/s and peak memory of single, σN-Ens and deep "
        "ensemble (--backbone, its dataset's input size); use with --device cuda --bf16 "
        "--batch 128",
    )
    parser.add_argument(
        "--backbone",
        choices=sorted(BACKBONE_IMAGES),
        default="resnet18",
        help="model of --absolute, as snens.models.create names it (default: resnet18); "
        "inputs 1×28×28 for small_cnn, 3×224×224 for mobilenet_v2, else 3×32×32",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="bfloat16 autocast for the training steps, --absolute and --llm",
    )
    parser.add_argument(
        "--llm",
        action="store_true",
        help="instead: the LLM rows (SmolLM2's architecture, random weights, LoRA r=8): member "
        "RMSNorm, σN-Ens-LoRA step vs one LoRA model at M·B and vs a LoRA ensemble, split step",
    )
    parser.add_argument(
        "--llm-layers",
        type=_bounded("--llm-layers", 1, _LLM_LAYERS, " (SmolLM2's decoder layers)"),
        default=30,
        help="decoder layers of --llm (SmolLM2 has 30)",
    )
    parser.add_argument(
        "--tokens",
        type=_bounded("--tokens", 1, _LLM_TOKENS, " (SmolLM2's context)"),
        default=64,
        help="tokens per text of --llm",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.llm:
        from harness_llm import llm_measures

        rows = llm_measures(
            args.num_members,
            args.batch,
            args.tokens,
            args.repeats,
            args.llm_layers,
            args.device,
            args.bf16,
        )
        print(format_table(rows))
        print(
            f"\n{device_line(args.device)}, M={args.num_members}, B={args.batch}, "
            f"{'bf16 autocast' if args.bf16 else 'float32'}, median of {args.repeats} "
            "interleaved repeats"
        )
        return 0
    if args.absolute:
        rows = throughput(
            args.backbone,
            num_members=args.num_members,
            batch=args.batch,
            repeats=args.repeats,
            device=args.device,
            bf16=args.bf16,
        )
        name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU"
        print(format_throughput(rows))
        print(
            f"\n{args.backbone}, M={args.num_members}, B={args.batch}, {name}, "
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
        args.compile_only,
        args.device,
        args.bf16,
    )
    print(format_table(rows))
    print(
        f"\n{device_line(args.device)}, M={args.num_members}, B={args.batch}, "
        f"median of {args.repeats} interleaved repeats"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
