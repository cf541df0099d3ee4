"""Fused Triton member norms for CUDA: RMS and layer norms in one launch forward, two backward.

:mod:`snens.nn.triton_kernels` computes the whole member norm from gamma, weight and bias
(statistics and sums in float32). The classes that declare their own ``triton_variant`` take
it (:func:`applies`); ``SNENS_TRITON=0`` turns it off; ``force_path("triton")`` sends CPU
tensors to it too (through Triton's interpreter).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import warnings

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from snens.nn import norms

__all__ = ["ENV", "MAX_FEATURES", "Variant", "applies", "available", "forward", "member_norm"]

#: Environment variable: "0" turns the Triton path off.
ENV = "SNENS_TRITON"
#: The widest normalized size a kernel takes.
MAX_FEATURES = 8192
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class Variant:
    """Which member norm a kernel computes.

    Attributes:
        center: layer norm (subtract the row mean); else RMS norm.
        round_first: in half precision, x̂ is rounded to the input's dtype before the affine;
            else the affine is applied in float32 and the result rounded once.
        last_dim: the formula normalizes over the last dimension only (not a 2-D feature shape).
        output: the output's dtype: ``"autocast"`` (x's for x and parameters of one dtype,
            float32 under CUDA autocast), ``"promoted"``, ``"input"`` (x's) or ``"same"`` (x
            and parameters of one dtype only).
    """

    center: bool
    round_first: bool
    last_dim: bool = True
    output: str = "same"


def _output(variant: Variant, x: Tensor, params: torch.dtype) -> tuple[torch.dtype, bool] | None:
    """(output dtype, round first) for x and parameters of dtype ``params``, or None."""
    same = x.dtype == params
    if variant.output == "autocast" and torch.is_autocast_enabled(x.device.type):
        if x.device.type == "cuda":
            return torch.float32, False
        return (x.dtype, variant.round_first) if same and x.dtype == torch.float32 else None
    if variant.output in ("autocast", "same"):
        return (x.dtype, variant.round_first) if same else None
    if variant.output == "promoted":
        return torch.promote_types(x.dtype, params), variant.round_first
    return x.dtype, variant.round_first


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def available() -> bool:
    """Whether the Triton path may run: installed, not turned off, no failed first call."""
    return _failure is None and os.environ.get(ENV, "1").strip() != "0" and _triton_installed()


def applies(layer: norms.MemberNorm, x: Tensor) -> bool:
    """Whether ``layer``'s forward on ``x`` takes the Triton kernels.

    Raises:
        RuntimeError: if ``force_path("triton")`` sends a CPU tensor while ``TRITON_INTERPRET=1``
            was not set before triton's import.
    """
    variant = type(layer).__dict__.get("triton_variant")
    forced = norms.forced_path()
    if variant is None or forced in ("vectorized", "reference"):
        return False
    if norms.custom_functions_unavailable(x) or not available():  # traced: decided first
        return False
    if x.device.type != "cuda":
        if forced != "triton":
            return False
        if not _interpreted():
            raise RuntimeError(
                "force_path('triton') on a CPU tensor runs the kernels in Triton's interpreter: "
                "set TRITON_INTERPRET=1 before triton is imported"
            )
    features = layer.feature_shape
    params = [p for p in (layer.gamma, layer.weight, layer.bias) if p is not None]
    return (
        x.numel() > 0
        and x.dtype in _DTYPES
        and params[0].dtype in _DTYPES
        and all(p.dtype == params[0].dtype and p.device == x.device for p in params)
        and math.prod(features) <= MAX_FEATURES
        and not (variant.last_dim and len(features) > 1)
        and _output(variant, x, params[0].dtype) is not None
    )


def _interpreted() -> bool:
    from snens.nn.triton_kernels import kernels

    return kernels().interpreted


def _blocks(features: int) -> tuple[int, int, int]:
    """(BLOCK_D, forward tile rows, backward tile rows)."""
    block_d = 1 << (features - 1).bit_length()  # the smallest power of 2 >= features
    return block_d, max(1, min(64, 4096 // block_d)), max(1, min(32, 2048 // block_d))


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def _tiles(block_r: int, block_d: int) -> dict[str, int]:
    warps = 4 if block_r * block_d <= 2048 else 8
    return {"BLOCK_R": block_r, "BLOCK_D": block_d, "num_warps": warps}


def _programs_per_member(x: Tensor, rows_per_member: int, block_r: int, members: int) -> int:
    """Backward programs per member: about four per multiprocessor, at most one per tile."""
    tiles = max(1, _cdiv(rows_per_member, block_r))
    if x.device.type != "cuda":
        return min(2, tiles)
    return max(1, min(tiles, _cdiv(4 * _multiprocessors(x.device.index), members)))


@functools.cache
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _launch_forward(x2, gamma, weight, bias, members, eps, variant, out_dtype, round_first):
    from snens.nn.triton_kernels import kernels

    rows, features = x2.shape
    block_d, block_r, _ = _blocks(features)
    y = torch.empty_like(x2, dtype=out_dtype)
    stats = torch.empty((2 if variant.center else 1, rows), device=x2.device, dtype=torch.float32)
    rstd, mean = stats[-1], stats[0]
    tensors = (x2, y, gamma, weight, weight if bias is None else bias, mean, rstd)
    flags = {"CENTER": variant.center, "HAS_BIAS": bias is not None, "ROUND_FIRST": round_first}
    grid = (_cdiv(rows, block_r),)
    kernels().forward[grid](
        *tensors, rows, rows // members, features, eps, **_tiles(block_r, block_d), **flags
    )
    return y, mean, rstd


class _TritonMemberNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x2, gamma, weight, bias, members, eps, variant, out_dtype, round_first, programs
    ):
        # x2: (N, D) contiguous; gamma, weight, bias: (M, D)
        y, mean, rstd = _launch_forward(
            x2, gamma, weight, bias, members, eps, variant, out_dtype, round_first
        )
        ctx.save_for_backward(x2, gamma, weight, bias, mean, rstd)
        ctx.members, ctx.variant, ctx.programs = members, variant, programs
        ctx.round_first = round_first
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        from snens.nn.triton_kernels import kernels

        x2, gamma, weight, bias, mean, rstd = ctx.saved_tensors
        variant, members = ctx.variant, ctx.members
        rows, features = x2.shape
        per_member = rows // members
        block_d, _, block_r = _blocks(features)
        programs = ctx.programs or _programs_per_member(x2, per_member, block_r, members)
        chunk = _cdiv(_cdiv(per_member, programs), block_r) * block_r  # whole tiles
        programs = _cdiv(per_member, chunk)
        has_bias = bias is not None
        run = kernels()
        dx = torch.empty_like(x2)
        shape = (2 if has_bias else 1, members, programs, features)
        partial = torch.empty(shape, device=x2.device, dtype=torch.float32)
        tensors = (grad.contiguous(), x2, dx, gamma, weight, mean, rstd, partial[0], partial[-1])
        sizes = (per_member, features, programs, chunk)
        flags = {"CENTER": variant.center, "HAS_BIAS": has_bias, "ROUND_FIRST": ctx.round_first}
        run.backward[(members, programs)](*tensors, *sizes, **_tiles(block_r, block_d), **flags)
        d_gamma, d_weight = torch.empty_like(gamma), torch.empty_like(weight)
        d_bias = torch.empty_like(bias) if has_bias else d_weight
        affine_block = min(block_d, 1024)
        tensors = (partial[0], partial[-1], gamma, weight, bias if has_bias else weight)
        tensors += (d_gamma, d_weight, d_bias)
        grid = (members, _cdiv(features, affine_block))
        run.affine_backward[grid](
            *tensors, features, programs, BLOCK_D=affine_block, HAS_BIAS=has_bias
        )
        return dx, d_gamma, d_weight, d_bias if has_bias else None, *(None,) * 6


def member_norm(
    x: Tensor,
    gamma: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    num_members: int,
    eps: float,
    variant: Variant,
    *,
    out_dtype: torch.dtype | None = None,
    round_first: bool | None = None,
    programs: int | None = None,
) -> Tensor:
    """σ(γ_m) ⊙ (weight_m ⊙ x̂ + bias_m) over each member's rows, x̂ the RMS or layer norm of
    each row over its last ``gamma[0].numel()`` values, in the fused kernels.

    ``out_dtype`` defaults to x's, ``round_first`` to the variant's; ``programs`` (backward
    programs per member) is for tests.

    Shape:
        x: (M·B, *, *feature_shape). gamma, weight, bias: (M, *feature_shape). Output: like x.
    """
    features = gamma[0].numel()
    x2 = x.reshape(-1, features).contiguous()
    params = [p.reshape(num_members, features).contiguous() for p in (gamma, weight)]
    bias = None if bias is None else bias.reshape(num_members, features).contiguous()
    out_dtype = x.dtype if out_dtype is None else out_dtype
    round_first = variant.round_first if round_first is None else round_first
    args = (x2, *params, bias, num_members, eps, variant, out_dtype, round_first)
    if norms.needs_grad(x, gamma, weight, bias):
        y = _TritonMemberNorm.apply(*args, programs)
    else:
        y = _launch_forward(*args)[0]
    return y.view(x.shape)


_failure: str | None = None
#: CUDA devices whose first call ran: later errors there are errors.
_working: set[torch.device] = set()


def forward(layer: norms.MemberNorm, x: Tensor, eps: float) -> Tensor | None:
    """``layer``'s forward through the kernels, or None where the first call on a CUDA device
    fails: then the kernels are off for the process, after one warning.

    Shape:
        x: (M·B, *, *feature_shape), member-major. Output: like x.
    """
    global _failure
    variant = type(layer).__dict__["triton_variant"]
    out_dtype, round_first = _output(variant, x, layer.weight.dtype)
    args = (x, layer.gamma, layer.weight, layer.bias, layer.num_members, eps, variant)
    try:
        y = member_norm(*args, out_dtype=out_dtype, round_first=round_first)
    except Exception as error:
        if x.device.type != "cuda" or x.device in _working:
            raise
        lines = str(error).strip().splitlines() or [""]
        _failure = f"{type(error).__name__}: {lines[0][:200]}"
        warnings.warn(
            f"snens: the Triton member-norm kernels failed on {x.device} ({_failure}); member "
            f"norms take their other paths in this process ({ENV}=0 skips the attempt)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    if x.device.type == "cuda":
        _working.add(x.device)
    return y
