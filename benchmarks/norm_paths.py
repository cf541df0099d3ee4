"""Each hand-written path of the member norms, eager, against the plain norm and the reference.

Whether a path is still needed: for each member norm family with more than one path, the
forward + backward (``train``) and the no-grad forward (``eval``) of every path it has, each
forced, against the plain norm on the same (M·B, …) tensor, all interleaved in one process
(medians of ``--repeats`` repeats of ``--inner`` calls). Paths, as the families' ``_normalize``
docstrings list them:

* ``fused``: the C++ CPU kernels (:mod:`snens.nn.fused`; batch and layer norms, float32);
* ``native``: the dispatch with ``SNENS_FUSED=0`` (batch norms: the native kernel per member
  into one output; layer norm: the reference);
* ``vectorized``: the plain-op path over the whole tensor (batch and layer norms; for RMS norm
  its broadcast path, the only one it takes in float32 with M > 1);
* ``reference``: the per-member loop of plain functional norms, the definition.

    python benchmarks/norm_paths.py            # CPU, one thread, float32, M=4, B=8
    python benchmarks/norm_paths.py --repeats 15 --inner 20

A path stays where it is faster than the path the dispatch would fall back to without it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

import snens.nn as snn
from snens.nn import fused
from snens.nn.norms import force_path

M = 4


def _layers(batch: int) -> dict[str, tuple[nn.Module, nn.Module, tuple[int, ...], tuple]]:
    """name -> (plain, member, input shape at M·B, the member's paths)."""
    rows = M * batch
    torch.manual_seed(0)
    bn, ln, rms = nn.BatchNorm2d(64), nn.LayerNorm(384), nn.RMSNorm(384)
    return {
        "BatchNorm2d (M·B, 64, 16, 16)": (
            bn,
            snn.MemberBatchNorm2d.from_plain(bn, M),
            (rows, 64, 16, 16),
            ("fused", "native", "vectorized", "reference"),
        ),
        "LayerNorm (M·B·64, 384)": (
            ln,
            snn.MemberLayerNorm.from_plain(ln, M),
            (rows * 64, 384),
            ("fused", "vectorized", "reference"),
        ),
        "RMSNorm (M·B·64, 384)": (
            rms,
            snn.MemberRMSNorm.from_plain(rms, M),
            (rows * 64, 384),
            ("vectorized", "reference"),
        ),
    }


@contextlib.contextmanager
def _path(name: str, layer: nn.Module):
    """Force ``name`` on ``layer`` for the block."""
    if name == "fused":
        assert fused.available(), fused.build_error()
        yield
    elif name == "native":
        previous = os.environ.get(fused.ENV)
        os.environ[fused.ENV] = "0"
        try:
            yield
        finally:
            if previous is None:
                del os.environ[fused.ENV]
            else:
                os.environ[fused.ENV] = previous
    elif isinstance(layer, snn.MemberRMSNorm):
        if name == "reference":
            layer._normalize = layer._reference
            try:
                yield
            finally:
                del layer._normalize
        else:  # its broadcast path is the dispatch's choice in float32
            yield
    else:
        with force_path(name):
            yield


def _runner(layer: nn.Module, x: torch.Tensor, mode: str, path: str | None) -> Callable:
    grad = torch.randn_like(x)

    def run() -> None:
        with _path(path, layer) if path else contextlib.nullcontext():
            if mode == "train":
                xi = x.detach().requires_grad_(True)
                layer(xi).backward(grad)
            else:
                with torch.no_grad():
                    layer(x)

    return run


def _time(fn: Callable, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--inner", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"command: python benchmarks/norm_paths.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, CPU "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} thread(s), "
        f"float32, M={M}, B={args.batch}, medians of {args.repeats} × {args.inner} calls, "
        "all paths interleaved"
    )
    print("\n| norm | mode | plain (ms) | " + " | ".join(("path", "× plain")) + " |")
    print("|---|---|---|---|---|")
    for name, (plain, member, shape, paths) in _layers(args.batch).items():
        x = torch.randn(shape)
        for mode in ("train", "eval"):
            plain.train(), member.train()
            runners = {"plain": _runner(plain, x, mode, None)}
            runners |= {p: _runner(member, x, mode, p) for p in paths}
            for run in runners.values():  # warm-up (and the fused kernels' build)
                run(), run()
            times: dict[str, list[float]] = {k: [] for k in runners}
            for r in range(args.repeats):
                order = list(runners) if r % 2 == 0 else list(reversed(runners))
                for key in order:
                    times[key].append(_time(runners[key], args.inner))
            base = statistics.median(times["plain"])
            for p in paths:
                ratio = statistics.median(t / b for t, b in zip(times[p], times["plain"]))
                print(f"| {name} | {mode} | {base * 1e3:.3f} | {p} | {ratio:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
