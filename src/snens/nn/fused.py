"""Fused CPU kernels for the member norm no native kernel covers: LayerNorm, built on first use.

ATen's layer norm applies one affine to every row, so the member loop runs the native kernel
once per member and concatenates the outputs (and, in backward, the input gradients): 1.3–1.7×
a plain LayerNorm for forward + backward, ~2× for an eval forward. The kernel in
``csrc/member_layer_norm.cpp`` writes every row with its member's affine straight into one
output, and its backward computes the input gradient and the members' affine gradients in one
pass over the rows (measured 0.5–0.8× a plain LayerNorm forward + backward, 0.8–0.9× its eval
forward, on the x86 CPU of ``results/bench_cpu.md``).

It is compiled once per machine by ``torch.utils.cpp_extension`` (a C++ compiler and ninja are
needed; about 10 s) into ``$XDG_CACHE_HOME/snens/kernels`` (default ``~/.cache``), under a name
carrying a digest of the source, the flags, the torch version and the CPU's instruction-set
flags — it is built with ``-march=native``, so another CPU gets its own build. Where it cannot
be built, or with ``SNENS_FUSED=0``, member LayerNorms take the member loop, after one warning
that names the reason. float32 and float64 on the CPU; other dtypes and devices, and code traced by
``torch.compile``, take the loop.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["ENV", "available", "build_error", "member_layer_norm", "applies"]

#: Environment variable: "0" turns the fused kernels off (no build is attempted).
ENV = "SNENS_FUSED"

_SOURCE = Path(__file__).with_name("csrc") / "member_layer_norm.cpp"
_FLAGS = ("-O3", "-fopenmp-simd", "-march=native")
_STALE_LOCK_S = 600  # a build takes ~10 s; a lock this old was left by a killed build

_lock = threading.Lock()
_built: bool | None = None  # None: not tried in this process
_error: str | None = None


def available() -> bool:
    """Whether the fused kernels can run here; builds (or loads the cached build) on first call."""
    global _built, _error
    if os.environ.get(ENV, "1").strip() == "0":
        return False
    if _built is None:
        with _lock:
            if _built is None:
                _built, _error = _build()
                if not _built:
                    warnings.warn(
                        f"snens: the fused member LayerNorm kernel is unavailable ({_error}); "
                        "member LayerNorms run one native kernel per member and concatenate "
                        "(1.3–1.7× a plain LayerNorm). A C++ compiler and ninja (pip install "
                        f"ninja) let it build; {ENV}=0 skips the attempt.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    return _built


def build_error() -> str | None:
    """Why the last build attempt failed, or None."""
    return _error


def _build_directory(name: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = cache / "snens" / "kernels" / name
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / "lock"
    # torch's build lock is a file that a killed build leaves behind; every later build would
    # wait on it forever
    if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
        lock.unlink(missing_ok=True)
    return directory


def _cpu() -> str:
    """What -march=native compiles for: the instruction-set flags (Linux), else the CPU's name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, ARM
                    return platform.machine() + ":" + " ".join(sorted(line.split(":")[1].split()))
    except OSError:
        pass
    return ":".join(
        [platform.machine(), platform.processor(), torch.backends.cpu.get_cpu_capability()]
    )


def _build() -> tuple[bool, str | None]:
    try:
        from torch.utils.cpp_extension import load

        fingerprint = "\n".join([_SOURCE.read_text(), *_FLAGS, torch.__version__, _cpu()])
        name = "snens_fused_" + hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
        load(
            name=name,
            sources=[str(_SOURCE)],
            extra_cflags=list(_FLAGS),
            build_directory=str(_build_directory(name)),
            is_python_module=False,
            verbose=False,
        )
        torch.ops.snens_fused.member_layer_norm_forward  # noqa: B018 - registered?
        return True, None
    except Exception as err:  # no compiler, no ninja, a failed build: the loop still works
        lines = str(err).strip().splitlines() or [""]
        return False, f"{type(err).__name__}: {lines[0][:200]}"


def applies(x: Tensor, scale: Tensor) -> bool:
    """Whether the fused member LayerNorm takes this input (building the kernel if needed)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and x.dtype == scale.dtype
        and x.numel() > 0
        and not torch.compiler.is_compiling()
        and available()
    )


class _MemberLayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, shift, M, eps):
        # x: (M·B, …, D) contiguous; scale, shift: (M, D)
        y, mean, rstd = torch.ops.snens_fused.member_layer_norm_forward(x, scale, shift, M, eps)
        ctx.save_for_backward(x, scale, mean, rstd)
        ctx.M, ctx.has_shift = M, shift is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, scale, mean, rstd = ctx.saved_tensors
        grad_x, grad_scale, grad_shift = torch.ops.snens_fused.member_layer_norm_backward(
            grad.contiguous(), x, mean, rstd, scale, ctx.M
        )
        return grad_x, grad_scale, grad_shift if ctx.has_shift else None, None, None


def member_layer_norm(
    x: Tensor,
    scale: Tensor,
    shift: Tensor | None,
    normalized_shape: Sequence[int],
    eps: float,
    num_members: int,
) -> Tensor:
    """Layer norm of each member's rows with that member's affine, in one fused kernel.

    Call only where :func:`applies` holds.

    Shape:
        x: (M·B, *, *normalized_shape), member-major. scale, shift: (M, *normalized_shape).
        Output: like x.
    """
    M, D = num_members, math.prod(normalized_shape)
    x = x.contiguous()
    scale = scale.reshape(M, D)
    shift = None if shift is None else shift.reshape(M, D)
    tracked = [x, scale] + ([] if shift is None else [shift])
    if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
        return _MemberLayerNormFunction.apply(x, scale, shift, M, eps)
    return torch.ops.snens_fused.member_layer_norm_forward(x, scale, shift, M, eps)[0]
