"""Fused CPU kernels for the member norms, built on first use: LayerNorm and batch norms.

``csrc/member_layer_norm.cpp`` writes every row with its member's affine into one output (ATen
takes one affine for all rows); ``csrc/member_batch_norm.cpp`` runs every (member, channel) of a
member batch norm in one call. Both are compiled once per environment (a C++ compiler and ninja
are needed) into ``$XDG_CACHE_HOME/snens/kernels``, under a digest of everything they depend
on. Where they cannot be built, or with ``SNENS_FUSED=0``, member norms take their
native-kernel paths, after one warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from snens.locks import hold
from snens.nn.norms import custom_functions_unavailable, needs_grad

__all__ = [
    "ENV",
    "applies",
    "applies_batch_norm",
    "available",
    "build",
    "build_error",
    "member_batch_norm",
    "member_layer_norm",
]

#: Environment variable: "0" turns the fused kernels off (no build is attempted).
ENV = "SNENS_FUSED"

_SOURCES = tuple(
    Path(__file__).with_name("csrc") / name
    for name in ("member_layer_norm.cpp", "member_batch_norm.cpp")
)
# no fused multiply-add contraction: x·a + b rounds twice, as in ATen's vectorized kernels
_FLAGS = ("-O3", "-fopenmp-simd", "-march=native", "-ffp-contract=off")
_WAIT_S = 1200  # the longest another process's build is waited for

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
                        f"snens: the fused member-norm kernels are unavailable ({_error}); "
                        "member norms run one native kernel per member (slower; the docs' "
                        "performance page measures both). A C++ compiler and ninja (pip install "
                        f"ninja) let them build; {ENV}=0 skips the attempt.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    return _built


def build_error() -> str | None:
    """Why the last build attempt failed, or None."""
    return _error


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory/snens.lock`` for this process's build; a torch ``lock`` beside it was
    left by a killed build, which torch would wait on forever: it is removed."""
    with hold(directory / "snens.lock", f"the kernel build in {directory}", wait_s=_WAIT_S):
        (directory / "lock").unlink(missing_ok=True)
        yield


def _notice(line: str) -> None:
    print(f"snens: {line}", file=sys.stderr, flush=True)


def build(*, verbose: bool = False) -> tuple[bool, str | None, Path | None]:
    """Build (or find) the kernels now, as ``snens build-kernels`` does: ``(ok, error, path)``
    with ``path`` the built library."""
    global _built, _error
    with _lock:
        _built, _error = _build(verbose=verbose)
        return _built, _error, _library if _built else None


def _cpu() -> str:
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


_library: Path | None = None


def _build_name() -> str:
    sources = [path.read_text() for path in _SOURCES]
    where = [str(path.resolve()) for path in _SOURCES]
    fingerprint = "\n".join([*sources, *where, *_FLAGS, torch.__version__, sys.prefix, _cpu()])
    return "snens_fused_" + hashlib.sha256(fingerprint.encode()).hexdigest()[:12]


def _build(*, verbose: bool = False) -> tuple[bool, str | None]:
    global _library
    try:
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        name = _build_name()
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        directory = cache / "snens" / "kernels" / name
        directory.mkdir(parents=True, exist_ok=True)
        library = directory / f"{name}.so"
        fresh = not library.is_file()
        if fresh or verbose:
            _notice(
                f"building the fused member-norm kernels for this environment into {directory} "
                "(once; 15 s to ~2 min)"
                if fresh
                else f"kernels cached in {directory}"
            )
        start = time.perf_counter()
        sources = [str(path.resolve()) for path in _SOURCES]
        options = {"build_directory": str(directory), "is_python_module": False, "verbose": False}
        with _build_lock(directory):
            load(name=name, sources=sources, extra_cflags=list(_FLAGS), **options)
        if fresh:
            _notice(f"built the fused kernels in {time.perf_counter() - start:.0f} s")
        torch.ops.snens_fused.member_layer_norm_forward  # noqa: B018 - registered?
        torch.ops.snens_fused.member_batch_norm_forward  # noqa: B018
        _library = library
        return True, None
    except Exception as err:  # no compiler, no ninja, a failed build: the loop still works
        lines = str(err).strip().splitlines() or [""]
        return False, f"{type(err).__name__}: {lines[0][:200]}"


def _ninja_on_path() -> None:
    """Put the ``ninja`` package's binary on PATH, where torch looks for it."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    path = os.environ.get("PATH", "")
    if bin_dir and bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + path


def applies(x: Tensor, scale: Tensor) -> bool:
    """Whether a fused member-norm kernel takes this input (building the kernels if needed)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and x.dtype == scale.dtype
        and x.numel() > 0
        and not custom_functions_unavailable(x)
        and available()
    )


class _FusedMemberLayerNorm(torch.autograd.Function):
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
    """Layer norm of each member's rows with its affine, in one fused kernel.

    Shape:
        x: (M·B, *, *normalized_shape), member-major. scale, shift: (M, *normalized_shape).
        Output: like x.
    """
    M, D = num_members, math.prod(normalized_shape)
    x = x.contiguous()
    scale = scale.reshape(M, D)
    shift = None if shift is None else shift.reshape(M, D)
    if needs_grad(x, scale, shift):
        return _FusedMemberLayerNorm.apply(x, scale, shift, M, eps)
    return torch.ops.snens_fused.member_layer_norm_forward(x, scale, shift, M, eps)[0]


def applies_batch_norm(x: Tensor, scale: Tensor) -> bool:
    """Whether the fused member batch norm takes this input (contiguous, not channels-last)."""
    return x.is_contiguous() and applies(x, scale)


class _FusedMemberBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, shift, running_mean, running_var, training, momentum, eps, M):
        # x: (M·B, C, *) contiguous; scale, shift, running statistics: (M, C)
        y, save_mean, save_invstd = torch.ops.snens_fused.member_batch_norm_forward(
            x, scale, shift, running_mean, running_var, training, momentum, eps, M
        )
        ctx.save_for_backward(x, scale, save_mean, save_invstd)
        ctx.training, ctx.M = training, M
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        wants_x = ctx.needs_input_grad[0]
        grad_x, grad_scale, grad_shift = torch.ops.snens_fused.member_batch_norm_backward(
            grad.contiguous(), *ctx.saved_tensors, ctx.training, wants_x, ctx.M
        )
        return grad_x if wants_x else None, grad_scale, grad_shift, *[None] * 6


def member_batch_norm(
    x: Tensor,
    scale: Tensor,
    shift: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    num_members: int,
) -> Tensor:
    """Batch norm of each member's rows with its statistics and affine, in one fused kernel
    (``training``: with the batch statistics, updating the running ones).

    Shape:
        x: (M·B, C, *), member-major, contiguous. scale, shift, running_mean, running_var:
        (M, C). Output: like x.
    """
    args = (x, scale, shift, running_mean, running_var, training, momentum, eps, num_members)
    if needs_grad(x, scale, shift):
        return _FusedMemberBatchNorm.apply(*args)
    return torch.ops.snens_fused.member_batch_norm_forward(*args)[0]
