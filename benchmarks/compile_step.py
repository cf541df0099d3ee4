"""The compiled σN-Ens training step against the compiled single model at M·B.

Both models go through ``torch.compile(fullgraph=True)`` (inductor by default): the σN-Ens
ensemble on B inputs (every member on every input: M·B rows inside), one plain model on M·B
inputs, the floor σN-Ens is measured against. A step is forward, the ensemble loss, backward and
an SGD update. The first call of each (the compilation) is timed apart; then the two steps run
interleaved, and the row is the median of the per-repeat time ratios with their spread.

Families (``--models``): ``cnn``, SmallCNN with batch norms (1×28×28 inputs); ``vit``, a
4-block ViT of width 192 with layer norms (3×32×32); ``llama``, SmolLM2-135M's architecture
(random weights, ``--llm-layers`` decoder layers, RMS norms) with LoRA r=8 on q_proj/v_proj
through ``snens.models.llm.LLMClassifier``, ``--tokens`` tokens per text.

    python benchmarks/compile_step.py                       # CPU, one thread, all three
    python benchmarks/compile_step.py --models cnn --repeats 3
    python benchmarks/compile_step.py --device cuda --bf16  # on a GPU (scripts/gpu_check.sh)

Prints a Markdown table (ratio, spread, the single model's step in ms, compile seconds) and the
machine, the versions and the command.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import platform
import sys
import time
from collections.abc import Callable

import torch
from measure import compare
from torch import nn

import snens
from snens.nn.norms import FORCEABLE_PATHS, force_path

FAMILIES = ("cnn", "vit", "llama")


def _vision(family: str) -> tuple[nn.Module, tuple[int, ...]]:
    if family == "cnn":
        from snens.models.small_cnn import small_cnn

        return small_cnn(width=32), (1, 28, 28)
    from snens.models.vit import VisionTransformer

    return VisionTransformer(dim=192, depth=4, num_heads=3, image_size=32), (3, 32, 32)


def _llama(layers: int, train_norms: bool = False) -> nn.Module:
    import transformers
    from harness_llm import smollm2_config

    from snens.models.llm import LLMClassifier

    lm = transformers.LlamaForCausalLM(smollm2_config(layers))
    return LLMClassifier(lm, None, 2, head="linear", prompt="{text}", train_norms=train_norms)


def _step(model: Callable, inputs: dict, y: torch.Tensor, params, bf16: bool) -> Callable:
    """forward, the ensemble loss, backward, an SGD update; the model's cost alone."""
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    device = y.device.type

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(**inputs)
        if logits.dim() == 2:  # the single model: one member of M·B rows
            logits = logits.unsqueeze(0)
        loss = snens.ensemble_loss(logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _timed_first_call(step: Callable[[], None]) -> float:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(
    family: str,
    num_members: int,
    batch: int,
    repeats: int,
    *,
    device: str = "cpu",
    backend: str = "inductor",
    tokens: int = 32,
    llm_layers: int = 2,
    bf16: bool = False,
    floor_trains_norms: bool = False,
) -> dict:
    """One row: the compiled σN-Ens step on ``batch`` inputs against the compiled single model
    on ``num_members · batch`` inputs (``family`` one of :data:`FAMILIES`); with
    ``floor_trains_norms`` (llama) the single model trains its RMSNorm scales as σN-Ens trains
    its member norms, so its backward too runs down to the first norm."""
    M, B = num_members, batch
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if family == "llama":
        single = _llama(llm_layers)
        floor = _llama(llm_layers, train_norms=True) if floor_trains_norms else single
        floor.load_state_dict(single.state_dict())
        ids = torch.randint(3, 49152, (M * B, tokens), generator=g)
        x_mb = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        classes = 2
    else:
        single, image = _vision(family)
        floor = single
        x_mb = {"x": torch.randn(M * B, *image, generator=g)}
        classes = 10
    y_mb = torch.randint(0, classes, (M * B,), generator=g)
    ens = snens.convert(copy.deepcopy(single), M).to(device)
    single = floor.to(device).train()
    ens.train()
    x_mb = {k: v.to(device) for k, v in x_mb.items()}
    x_b = {k: v[:B] for k, v in x_mb.items()}
    y_mb, y_b = y_mb.to(device), y_mb[:B].to(device)

    def trainable(model):
        return [p for p in model.parameters() if p.requires_grad]

    torch._dynamo.reset()
    compiled_ens = torch.compile(ens, fullgraph=True, backend=backend)
    compiled_single = torch.compile(single, fullgraph=True, backend=backend)
    ens_step = _step(compiled_ens, x_b, y_b, trainable(ens), bf16)
    single_step = _step(compiled_single, x_mb, y_mb, trainable(single), bf16)
    compile_s = (_timed_first_call(ens_step), _timed_first_call(single_step))
    ratio, spread, base = compare(ens_step, single_step, repeats=repeats)
    trains = " training its norms" if floor_trains_norms else ""
    return {
        "name": f"{family}: compiled σN-Ens step (B={B}) vs compiled single{trains} at M·B={M * B}",
        "ratio": ratio,
        "spread": spread,
        "single_ms": base * 1e3,
        "compile_s": compile_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--num-members", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per text (llama)")
    parser.add_argument("--llm-layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    parser.add_argument(
        "--floor-trains-norms",
        action="store_true",
        help="llama: the single model trains its RMSNorm scales too (train_norms=True)",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch)")
    parser.add_argument(
        "--force-path",
        choices=FORCEABLE_PATHS,
        help="trace the member batch and layer norms' path (snens.nn.norms.force_path)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"command: python benchmarks/compile_step.py {' '.join(sys.argv[1:] or [])}".rstrip())
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, device {args.device}, "
        f"{torch.get_num_threads()} thread(s), backend {args.backend}, "
        f"M={args.num_members}, B={args.batch}, {args.repeats} repeats"
        + (", bf16 autocast" if args.bf16 else "")
        + (f", force_path({args.force_path!r})" if args.force_path else "")
    )
    print("\n| step | ratio | spread | single step (ms) | compile σN-Ens / single (s) |")
    print("|---|---|---|---|---|")
    for family in args.models:
        forcing = force_path(args.force_path) if args.force_path else contextlib.nullcontext()
        with forcing:
            row = measure(
                family,
                args.num_members,
                args.batch,
                args.repeats,
                device=args.device,
                backend=args.backend,
                tokens=args.tokens,
                llm_layers=args.llm_layers,
                bf16=args.bf16,
                floor_trains_norms=args.floor_trains_norms,
            )
        low, high = row["spread"]
        print(
            f"| {row['name']} | {row['ratio']:.3f}× | {low:.3f}–{high:.3f} | "
            f"{row['single_ms']:.1f} | {row['compile_s'][0]:.0f} / {row['compile_s'][1]:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
