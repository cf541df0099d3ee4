"""Fused Triton member norms for CUDA: RMS and layer norms in one launch forward, two backward.

On a GPU the other paths of a member norm are launch-bound: the folding σ(γ)·weight, the
normalization, the member-broadcast affine and its per-member reduction are each a kernel.
:mod:`snens.nn.triton_kernels` computes the whole member norm from gamma, weight and bias: one
kernel forward (the member taken from the row index, σ(γ) folded in), one for the input
gradient with per-member partial sums of the affine gradients, one that turns those into the
gradients of gamma, weight and bias. Statistics and sums are float32.

The member norms that take it are the classes that declare their own ``triton_variant``
(:class:`Variant`), not their subclasses; :func:`applies` lists for which inputs.
``SNENS_TRITON=0`` turns the path off; :func:`snens.nn.norms.force_path` ``("triton")`` sends
inputs on any device to it (CPU tensors run in Triton's interpreter, how the tests check the
kernels without a GPU).
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
#: The widest normalized size a kernel takes (one row of float32 values stays in registers).
MAX_FEATURES = 8192
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class Variant:
    """Which member norm a kernel computes.

    Attributes:
        center: layer norm (subtract the row mean); else RMS norm.
        round_first: in half precision, x̂ is rounded to the input's dtype before the affine
            (``F.rms_norm``, Llama's, T5's, DeBERTa's); else the affine is applied in float32
            and the result rounded once (``F.layer_norm``, OLMo-2's, Gemma's, Cohere's).
        last_dim: the formula normalizes over the last dimension only (Hugging Face's), so a
            layer with a 2-D feature shape (Cohere's per-head norms) is not taken; else over all
            of the feature shape (torch's).
        output: the output's dtype, as the formula gives it. ``"autocast"`` (torch's
            ``layer_norm`` and ``rms_norm``): x's, for x and parameters of one dtype; under
            CUDA autocast float32. ``"promoted"`` (Llama's, DeBERTa's): the promotion of x's
            and the parameters' dtypes. ``"input"``: x's. ``"same"`` (T5's): x and parameters
            of one dtype only.
    """

    center: bool
    round_first: bool
    last_dim: bool = True
    output: str = "same"


def _output(variant: Variant, x: Tensor, params: torch.dtype) -> tuple[torch.dtype, bool] | None:
    """(output dtype, round first) for x and parameters of dtype ``params``, or None where the
    kernels do not take that combination."""
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
    """Whether the Triton path may run: ``triton`` installed, ``SNENS_TRITON`` ≠ 0, and no
    failed first call in this process (:func:`forward`)."""
    return _failure is None and os.environ.get(ENV, "1").strip() != "0" and _triton_installed()


def applies(layer: norms.MemberNorm, x: Tensor) -> bool:
    """Whether ``layer``'s forward on ``x`` takes the Triton kernels.

    All of: the layer's class declares a ``triton_variant``; :func:`available`; x on a CUDA
    device, or ``force_path("triton")``; x non-empty, of float32, bfloat16 or float16, the
    parameters of one of those dtypes and on x's device; dtypes the variant's ``output`` takes;
    at most :data:`MAX_FEATURES` features; not traced nor inside a ``torch.func`` transform.

    Raises:
        RuntimeError: if ``force_path("triton")`` sends a CPU tensor here while the kernels
            are compiled for the GPU (``TRITON_INTERPRET=1`` was not set before triton's
            import).
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
    """(BLOCK_D, forward tile rows, backward tile rows): tiles of ~4,096 values forward and
    ~2,048 backward."""
    block_d = 1 << (features - 1).bit_length()  # the smallest power of 2 >= features
    return block_d, max(1, min(64, 4096 // block_d)), max(1, min(32, 2048 // block_d))


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def _warps(values: int) -> int:
    return 4 if values <= 2048 else 8


def _programs_per_member(x: Tensor, rows_per_member: int, block_r: int, members: int) -> int:
    """Backward programs per member: about four per streaming multiprocessor over all members,
    at most one per tile of rows; 2 on the CPU, where the interpreter runs them serially."""
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
    grid = (_cdiv(rows, block_r),)
    kernels().forward[grid](
        x2,
        y,
        gamma,
        weight,
        weight if bias is None else bias,
        mean,
        rstd,
        rows,
        rows // members,
        features,
        eps,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
        CENTER=variant.center,
        HAS_BIAS=bias is not None,
        ROUND_FIRST=round_first,
        num_warps=_warps(block_r * block_d),
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
        partial = torch.empty(
            (2 if has_bias else 1, members, programs, features),
            device=x2.device,
            dtype=torch.float32,
        )
        run.backward[(members, programs)](
            grad.contiguous(),
            x2,
            dx,
            gamma,
            weight,
            mean,
            rstd,
            partial[0],
            partial[-1],
            per_member,
            features,
            programs,
            chunk,
            BLOCK_R=block_r,
            BLOCK_D=block_d,
            CENTER=variant.center,
            HAS_BIAS=has_bias,
            ROUND_FIRST=ctx.round_first,
            num_warps=_warps(block_r * block_d),
        )
        d_gamma, d_weight = torch.empty_like(gamma), torch.empty_like(weight)
        d_bias = torch.empty_like(bias) if has_bias else d_weight
        affine_block = min(block_d, 1024)
        run.affine_backward[(members, _cdiv(features, affine_block))](
            partial[0],
            partial[-1],
            gamma,
            weight,
            bias if has_bias else weight,
            d_gamma,
            d_weight,
            d_bias,
            features,
            programs,
            BLOCK_D=affine_block,
            HAS_BIAS=has_bias,
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
    each row over its last ``gamma[0].numel()`` values, in the fused kernels, where
    :func:`applies` holds.

    Args:
        x: the member-major input.
        gamma, weight, bias: the member parameters (bias None: no bias).
        num_members: M.
        eps: added to the variance.
        variant: which formula (:class:`Variant`).
        out_dtype: the output's dtype (default: x's).
        round_first: round x̂ to x's dtype before the affine (default: the variant's).
        programs: backward programs per member (default: sized to the device); for tests.

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


#: Why the kernels failed on a device's first call (then they are off for this process).
_failure: str | None = None
#: CUDA devices whose first call ran: later errors there are errors, not an unsupported GPU.
_working: set[torch.device] = set()


def forward(layer: norms.MemberNorm, x: Tensor, eps: float) -> Tensor | None:
    """``layer``'s forward through the kernels (where :func:`applies` holds), or None where
    the first call on a CUDA device fails (a GPU or driver Triton cannot compile for): then the
    kernels are off for the process, after one warning, and the layer takes its other paths.

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
