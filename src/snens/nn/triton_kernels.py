"""Triton kernels of the member RMS and layer norms: forward, backward, affine gradients.

Launched by :mod:`snens.nn.triton_norms`; imported only where ``triton`` is installed. The
forward folds each row's member affine (member = row // rows per member) in the kernel; the
backward writes the input gradient and per-program partial rows of Σ dy·x̂ and Σ dy, which
``member_affine_backward`` sums into d weight = s·A, d bias = s·Bs and
d γ = s(1 − s)·(weight·A + bias·Bs), s = σ(γ_m).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton
import triton.language as tl

__all__ = ["Kernels", "kernels"]


def member_norm_forward(
    X,  # (N, D) input, contiguous
    Y,  # (N, D) output
    GAMMA,  # (M, D) importance logits
    W,  # (M, D) member weights
    B,  # (M, D) member biases (unused without HAS_BIAS)
    MEAN,  # (N,) float32 row means (written with CENTER)
    RSTD,  # (N,) float32 inverse standard deviations
    N,  # rows
    R,  # rows per member
    D,  # features
    eps,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CENTER: tl.constexpr,  # layer norm (subtract the mean) rather than RMS norm
    HAS_BIAS: tl.constexpr,
    ROUND_FIRST: tl.constexpr,  # x̂ rounded to the input's dtype before the affine
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    row_mask = rows < N
    mask = row_mask[:, None] & (cols < D)[None, :]
    offsets = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    if CENTER:
        mean = tl.sum(x, axis=1) / D
        x = tl.where(mask, x - mean[:, None], 0.0)
        tl.store(MEAN + rows, mean, mask=row_mask)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    tl.store(RSTD + rows, rstd, mask=row_mask)
    x_hat = x * rstd[:, None]

    # the member's folded affine, rounded to the parameters' dtype as torch's folding rounds it
    params = (rows // R).to(tl.int64)[:, None] * D + cols[None, :]
    p_dtype = W.dtype.element_ty
    s = tl.sigmoid(tl.load(GAMMA + params, mask=mask, other=0.0).to(tl.float32))
    s = s.to(p_dtype).to(tl.float32)
    scale = (s * tl.load(W + params, mask=mask, other=0.0).to(tl.float32)).to(p_dtype)
    y_dtype = Y.dtype.element_ty
    if ROUND_FIRST:
        y = x_hat.to(y_dtype).to(tl.float32) * scale.to(tl.float32)
    else:
        y = x_hat * scale.to(tl.float32)
    if HAS_BIAS:
        shift = (s * tl.load(B + params, mask=mask, other=0.0).to(tl.float32)).to(p_dtype)
        if ROUND_FIRST:
            y = y.to(y_dtype).to(tl.float32)
        y = y + shift.to(tl.float32)
    tl.store(Y + offsets, y.to(y_dtype), mask=mask)


def member_norm_backward(
    DY,  # (N, D) output gradient, contiguous
    X,  # (N, D) input
    DX,  # (N, D) input gradient
    GAMMA,  # (M, D)
    W,  # (M, D)
    MEAN,  # (N,) float32 (read with CENTER)
    RSTD,  # (N,) float32
    PART_A,  # (M, P, D) float32: Σ dy·x̂ over each program's rows
    PART_B,  # (M, P, D) float32: Σ dy (written with HAS_BIAS)
    R,  # rows per member
    D,
    P,  # programs per member
    CHUNK,  # rows per program, a multiple of BLOCK_R
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CENTER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROUND_FIRST: tl.constexpr,
):
    member = tl.program_id(0)
    program = tl.program_id(1)
    start = member * R + program * CHUNK
    end = tl.minimum(start + CHUNK, (member + 1) * R)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < D
    params = member.to(tl.int64) * D + cols
    p_dtype = W.dtype.element_ty
    s = tl.sigmoid(tl.load(GAMMA + params, mask=col_mask, other=0.0).to(tl.float32))
    s = s.to(p_dtype).to(tl.float32)
    scale = (s * tl.load(W + params, mask=col_mask, other=0.0).to(tl.float32)).to(p_dtype)
    scale = scale.to(tl.float32)

    sum_a = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    sum_b = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    for first in range(start, end, BLOCK_R):
        rows = first + tl.arange(0, BLOCK_R)
        row_mask = rows < end
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows.to(tl.int64)[:, None] * D + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        if CENTER:
            x = x - tl.load(MEAN + rows, mask=row_mask, other=0.0)[:, None]
        x_hat = tl.where(mask, x * rstd[:, None], 0.0)
        if ROUND_FIRST:
            sum_a += dy * x_hat.to(X.dtype.element_ty).to(tl.float32)
        else:
            sum_a += dy * x_hat
        if HAS_BIAS:
            sum_b += dy
        # dx = rstd · (g − mean(g) − x̂ · mean(g·x̂)), g = dy · scale (no mean(g) for RMS norm)
        g = dy * scale[None, :]
        dx = g - x_hat * (tl.sum(g * x_hat, axis=1) / D)[:, None]
        if CENTER:
            dx = dx - (tl.sum(g, axis=1) / D)[:, None]
        tl.store(DX + offsets, (dx * rstd[:, None]).to(DX.dtype.element_ty), mask=mask)
    partial = (member.to(tl.int64) * P + program) * D + cols
    tl.store(PART_A + partial, tl.sum(sum_a, axis=0), mask=col_mask)
    if HAS_BIAS:
        tl.store(PART_B + partial, tl.sum(sum_b, axis=0), mask=col_mask)


def member_affine_backward(
    PART_A,  # (M, P, D) float32
    PART_B,  # (M, P, D) float32 (read with HAS_BIAS)
    GAMMA,  # (M, D)
    W,  # (M, D)
    B,  # (M, D) (read with HAS_BIAS)
    DGAMMA,  # (M, D) outputs, in the parameters' dtype
    DW,
    DB,
    D,
    P,
    BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    member = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_mask = cols < D
    a = tl.zeros((BLOCK_D,), dtype=tl.float32)
    b = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for program in range(0, P):
        partial = (member.to(tl.int64) * P + program) * D + cols
        a += tl.load(PART_A + partial, mask=col_mask, other=0.0)
        if HAS_BIAS:
            b += tl.load(PART_B + partial, mask=col_mask, other=0.0)
    params = member.to(tl.int64) * D + cols
    s = tl.sigmoid(tl.load(GAMMA + params, mask=col_mask, other=0.0).to(tl.float32))
    s_p = s.to(W.dtype.element_ty).to(tl.float32)
    w = tl.load(W + params, mask=col_mask, other=0.0).to(tl.float32)
    d_s = a * w
    tl.store(DW + params, (a * s_p).to(DW.dtype.element_ty), mask=col_mask)
    if HAS_BIAS:
        bias = tl.load(B + params, mask=col_mask, other=0.0).to(tl.float32)
        d_s += b * bias
        tl.store(DB + params, (b * s_p).to(DB.dtype.element_ty), mask=col_mask)
    tl.store(DGAMMA + params, (d_s * s * (1.0 - s)).to(DGAMMA.dtype.element_ty), mask=col_mask)


class Kernels(NamedTuple):
    """The three kernels; ``interpreted``: run by Triton's interpreter on CPU tensors."""

    forward: object
    backward: object
    affine_backward: object
    interpreted: bool


@functools.cache
def kernels() -> Kernels:
    """The kernels, decorated once (interpreted where ``TRITON_INTERPRET=1`` was set before
    ``triton`` was imported)."""
    from triton.runtime.interpreter import InterpretedFunction

    sources = (member_norm_forward, member_norm_backward, member_affine_backward)
    jitted = [triton.jit(fn) for fn in sources]
    return Kernels(*jitted, interpreted=isinstance(jitted[0], InterpretedFunction))
