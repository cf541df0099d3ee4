"""What a norm computes, found by running it: whether a member class reproduces a module.

:mod:`snens.nn.registry` recognizes norms from outside torch by what they compute, not by their
source: :func:`match` runs the module and a member norm built from it side by side and says
whether, and how closely, the member computes what the module does.

The module is never run itself: a shallow copy holding random tensors in place of its
parameters and buffers runs (hooks aside), and the member norm is built from it with one member
and σ(γ) = 1 exactly. The draws have their own seeded generator; the global random state is
restored. Inputs (never 2-D, which is both layouts) normalize over the trailing feature shape S
or, for S = (C,), over the channels; a small-scale one pins the eps. A gated norm gets a gate.

1. **float32**, eval and train mode: within rtol = atol = 1e-5 (and batch norms' running
   statistics): what the module computes. A member does not compute a module that runs on
   none of the 3-D inputs the member takes but on one it refuses.
2. **half precision** (:data:`PRECISIONS`), the first two inputs: the same output dtype,
   within :data:`HALF_ULPS` of the input dtype's epsilon relative to 1 + |output|: which
   member version (the formulas of one kind differ by where they round).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import warnings
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from snens.nn.norms import MemberNorm
from snens.nn.plain_conversion import feature_shape, from_plain_as, norm_eps

__all__ = [
    "Comparison",
    "ProbedFromPlain",
    "compare",
    "extra_inputs",
    "match",
    "probe_shape",
    "takes_gate",
    "unprobeable",
]

#: Eps values tried, after the module's own, for modules that keep none.
COMMON_EPS = (1e-5, 1e-6, 1e-12, 1e-8)
STATISTICS = frozenset({"running_mean", "running_var", "num_batches_tracked"})
FLOAT32_TOLERANCE = 1e-5
HALF_ULPS = 2
PRECISIONS = (
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.bfloat16),
    (torch.float16, torch.float16),
    (torch.float64, torch.float32),
)
_GAMMA_FOR_SIGMA_ONE = 100.0  # sigmoid(100) is 1.0 in float16, float32 and float64


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How ``member_type`` (built with ``eps``) compares with a module.

    Attributes:
        computes: it computes what the module does in float32 (step 1).
        error: the sum over the half-precision settings of each one's largest difference over
            its tolerance (0: equal bit for bit); inf where it does not compute it.
        worst, worst_setting: the largest of those and its setting.
        reason: why it does not compute it, or ``""``.
    """

    member_type: type[MemberNorm]
    eps: float | None
    computes: bool
    error: float = math.inf
    worst: float = math.inf
    worst_setting: str = ""
    reason: str = ""

    @property
    def reproduces(self) -> bool:
        return self.computes and self.worst <= 1.0


class ProbedFromPlain:
    """``from_plain`` for member classes of norms from outside torch: checked by the probe."""

    @classmethod
    def _expects(cls) -> str:
        raise NotImplementedError

    @classmethod
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberNorm:
        """A member norm whose every member reproduces ``plain`` (checked by the probe).

        Raises:
            TypeError: if ``plain`` does not compute what this class computes.
        """
        found = match(plain, [cls])
        if found is None or not found.reproduces:
            why = unprobeable(plain) or (
                "it computes something else"
                if found is None
                else f"{found.worst_setting} differs by {found.worst:.3g}× the tolerance"
            )
            raise TypeError(
                f"{cls.__name__}.from_plain expects {cls._expects()}; {type(plain).__name__} "
                f"is not one (it does not compute one on probe inputs: {why})"
            )
        return from_plain_as(cls, plain, num_members, eps=found.eps, generator=generator, **kw)


def unprobeable(module: nn.Module) -> str | None:
    """Why the probe cannot run ``module`` as a norm (it holds more than a weight, a bias and
    running statistics, or takes more than ``x`` and a ``gate``), or None."""
    children = [name for name, _ in module.named_children()]
    if children:
        return f"holds submodules ({', '.join(children)}), more than a norm"
    extra = sorted(n for n, p in module._parameters.items() if p is not None)
    extra = [name for name in extra if name not in ("weight", "bias")]
    if extra:
        return f"holds parameters beyond a weight and a bias ({', '.join(extra)})"
    weight, bias = module._parameters.get("weight"), module._parameters.get("bias")
    if weight is not None and (
        weight.dim() == 0 or (bias is not None and bias.shape != weight.shape)
    ):
        return f"holds a weight of shape {tuple(weight.shape)} and a bias that do not match"
    buffers = {name for name, b in module._buffers.items() if b is not None}
    allowed = STATISTICS if isinstance(module, nn.modules.batchnorm._NormBase) else set()
    if "weight" in module._non_persistent_buffers_set and module._parameters.get("weight") is None:
        allowed = allowed | {"weight"}  # FalconMamba's unused stand-in for a weight
    if not buffers <= allowed:
        return f"holds buffers ({', '.join(sorted(buffers - allowed))}), more than a norm"
    inputs = extra_inputs(type(module))
    if inputs and inputs != [GATE]:
        return (
            f"takes more than one input ({', '.join(inputs)}); a member norm takes one tensor "
            f"(or a second named {GATE!r}, a gated RMS norm's)"
        )
    return None


GATE = "gate"
#: Features of the probe inputs of a norm that records no size (a weightless RMS norm).
SIZELESS_FEATURES = 16


def takes_gate(module: nn.Module) -> bool:
    return extra_inputs(type(module)) == [GATE]


def probe_shape(module: nn.Module) -> tuple[int, ...]:
    """The feature shape of the probe inputs: the module's, else its 1-D weight buffer's, else
    :data:`SIZELESS_FEATURES`."""
    shape = feature_shape(module)
    if shape is not None:
        return shape
    unused = module._buffers.get("weight")
    if unused is not None and unused.dim() == 1 and unused.numel() > 0:
        return tuple(unused.shape)
    return (SIZELESS_FEATURES,)


def extra_inputs(cls: type) -> list[str]:
    """The inputs of ``cls.forward`` beyond its first (keyword-only ones all)."""
    try:
        signature = inspect.signature(cls.forward)
    except (TypeError, ValueError):
        return []
    named = [
        p
        for p in list(signature.parameters.values())[1:]  # without self
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if named and named[0].kind is inspect.Parameter.KEYWORD_ONLY:
        return [p.name for p in named]
    return [p.name for p in named[1:]]


def eps_candidates(module: nn.Module) -> list[float | None]:
    """The module's own eps, then :data:`COMMON_EPS` (None alone for nn.RMSNorm's default)."""
    own = norm_eps(module)
    if own is None and isinstance(module, nn.RMSNorm):
        return [None]
    return list(dict.fromkeys([own, *COMMON_EPS] if own is not None else COMMON_EPS))


def match(module: nn.Module, member_types: Sequence[type[MemberNorm]]) -> Comparison | None:
    """The closest of ``member_types`` (with its eps) among those that compute what ``module``
    does in float32, the first among equally close ones; None where none does."""
    if unprobeable(module) is not None:
        return None
    best = None
    for member_type in member_types:
        for eps in eps_candidates(module):
            comparison = compare(module, member_type, eps=eps)
            if comparison.computes:
                if best is None or comparison.error < best.error:
                    best = comparison
                break
    return best


def compare(module: nn.Module, member_type: type[MemberNorm], *, eps: float | None) -> Comparison:
    """Run ``module`` and a one-member ``member_type`` built from it side by side."""
    device = _probe_device(module)
    forks = [] if device.type != "cuda" else [device.index or 0]
    with (
        torch.random.fork_rng(devices=forks),
        torch.no_grad(),
        torch.autocast(device.type, enabled=False),
        warnings.catch_warnings(),
    ):
        # the probe's own mixed dtypes make torch warn; nothing a user did
        warnings.simplefilter("ignore")
        generator = torch.Generator().manual_seed(0)
        values = _random_state(module, generator)
        gated = getattr(member_type, "takes_gate", False)
        inputs, unit = [], []
        for shape, scale in _input_shapes(probe_shape(module)):
            x = torch.randn(shape, generator=generator, dtype=torch.float64)
            x = scale * (x + 0.5)  # a mean ≠ 0 sets layer norms apart from RMS norms
            gate = None
            if gated:  # a gate of x's shape, around 0 (where SiLU and sigmoid differ most)
                gate = 2 * torch.randn(shape, generator=generator, dtype=torch.float64)
            inputs.append(_Input(x, gate))
            if scale == 1.0:
                unit.append(inputs[-1])
        if gated:  # and without a gate, where the module takes none
            inputs += [_Input(x.x, None) for x in inputs[-2:]]
        reason = _float32(module, member_type, eps, values, inputs, device)
        if reason:
            return Comparison(member_type, eps, computes=False, reason=reason)
        errors = {}
        for param_dtype, input_dtype in PRECISIONS:
            setting = f"{_name(param_dtype)} / {_name(input_dtype)}"
            errors[setting] = _precision(
                module, member_type, eps, values, unit, param_dtype, input_dtype, device
            )
    worst = max(errors, key=errors.get)
    return Comparison(member_type, eps, True, sum(errors.values()), errors[worst], worst)


def _float32(module, member_type, eps, values, inputs, device) -> str:
    """Step 1: "" where the member computes what the module does in float32, else why not."""
    try:
        plain = _copy_holding(module, values, torch.float32, device)
        member = _member(member_type, plain, eps)
    except (TypeError, ValueError) as err:
        return str(err)
    compared = 0
    for training in (False, True):
        plain.train(training)
        member.train(training)
        for x in inputs:
            x = x.to(device, torch.float32)
            expected, got = _both(plain, member, x)
            if expected is None:
                continue
            if isinstance(got, str):
                return got
            if not _close(got, expected, FLOAT32_TOLERANCE):
                mode = "train mode" if training else "eval mode"
                return f"differs on an input of shape {tuple(x.shape)} ({mode})"
            if training and not _same_statistics(plain, member):
                return "updates its running statistics otherwise"
            compared += 1
    if not compared:
        return "runs on none of the inputs its member version takes"
    return _three_d_layout(plain, member, inputs, device)


def _three_d_layout(plain, member, inputs, device) -> str:
    """Step 1's rule for 3-D inputs: "" unless the module runs on none of the 3-D inputs the
    member takes but on one it refuses (a layer norm inside ``x.transpose(1, 2)``)."""
    plain.eval()
    three = [x for x in inputs if len(x.shape) == 3]
    taken = [x for x in three if _takes(member, x)]
    if not taken or any(_runs(plain, x, device) for x in taken):
        return ""
    other = next((x for x in three if not _takes(member, x) and _runs(plain, x, device)), None)
    if other is None:
        return ""
    return (
        f"runs on 3-D inputs of shape {tuple(other.shape)}, which its member version refuses, "
        f"and on none of shape {tuple(taken[-1].shape)}, which it takes"
    )


def _precision(module, member_type, eps, values, inputs, param_dtype, input_dtype, device):
    """Step 2 in one setting: the largest difference over the tolerance (0: bit for bit)."""
    half = HALF_ULPS * torch.finfo(input_dtype).eps
    tolerance = FLOAT32_TOLERANCE if input_dtype == torch.float32 else half
    try:
        plain = _copy_holding(module, values, param_dtype, device)
        member = _member(member_type, plain, eps)
    except (TypeError, ValueError):
        return math.inf
    error = 0.0
    for training in (False, True):
        plain.train(training)
        member.train(training)
        taken = [x for x in inputs if _takes(member, x)][:2]
        for x in taken:
            if _undefined_for_base(plain, x, device, param_dtype, input_dtype):
                continue
            expected, got = _both(plain, member, x.to(device, input_dtype))
            if expected is None:
                continue
            if isinstance(got, str) or got.dtype != expected.dtype:
                return math.inf
            error = max(error, _relative_error(got, expected, tolerance))
    return error


def _undefined_for_base(plain, x, device, param_dtype, input_dtype) -> bool:
    """Whether the torch norm class a subclass ``plain`` extends refuses this setting's dtypes
    but not its shape: the setting is outside that family (nn.LayerNorm takes no float32 input
    to float64 weights), so what the subclass does there (fairseq's Fp32LayerNorm computes in
    float32) is not held against its member version."""
    base = next((c for c in type(plain).__mro__ if c.__module__.startswith("torch.nn.")), None)
    if base is None or base is type(plain) or base is nn.Module:
        return False
    runs = [_runs_as(base, plain, x.to(device, dtype)) for dtype in (input_dtype, param_dtype)]
    return runs == [False, True]


def _runs_as(cls: type, plain: nn.Module, x: _Input) -> bool:
    try:
        cls.forward(plain, *x.args())
    except Exception:  # noqa: BLE001 - any failure means it does not take this input
        return False
    return True


@dataclasses.dataclass(frozen=True)
class _Input:
    """A probe input: x, and a gated norm's gate (None: the forward is called without)."""

    x: Tensor
    gate: Tensor | None

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    def to(self, device: torch.device, dtype: torch.dtype) -> _Input:
        gate = None if self.gate is None else self.gate.to(device, dtype)
        return _Input(self.x.to(device, dtype), gate)

    def args(self) -> tuple[Tensor, ...]:
        return (self.x,) if self.gate is None else (self.x, self.gate)


def _both(plain: nn.Module, member: MemberNorm, x: _Input) -> tuple[Tensor | None, Tensor | str]:
    if not _takes(member, x):
        return None, ""
    args = x.args()
    try:
        expected = type(plain).forward(plain, *args)  # hooks aside
    except Exception:  # noqa: BLE001 - any failure means it does not take this input
        return None, ""
    if not isinstance(expected, Tensor):
        return expected, f"returns a {type(expected).__name__}, not a tensor"
    try:
        got = member(*args)
    except (RuntimeError, ValueError, TypeError) as err:
        return expected, f"its member version fails where it runs ({err})"
    if got.shape != expected.shape:
        return (
            expected,
            f"gives shape {tuple(expected.shape)} where its member gives {tuple(got.shape)}",
        )
    return expected, got


def _runs(plain: nn.Module, x: _Input, device: torch.device) -> bool:
    return _runs_as(type(plain), plain, x.to(device, torch.float32))


def _takes(member: MemberNorm, x: _Input) -> bool:
    try:
        member._check_input(x.x)
    except ValueError:
        return False
    return True


def _probe_device(module: nn.Module) -> torch.device:
    tensors = [*module._parameters.values(), *module._buffers.values()]
    devices = [t.device for t in tensors if t is not None and t.device.type != "meta"]
    return devices[0] if devices else torch.device("cpu")


def _random_state(module: nn.Module, generator: torch.Generator) -> dict[str, Tensor]:
    """float64 values such that neither an identity affine nor a unit variance hides a formula."""
    values = {}
    named = [*module._parameters.items(), *module._buffers.items()]
    for name, tensor in named:
        if tensor is None:
            continue
        noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64)
        if name == "weight":
            values[name] = 1 + 0.5 * noise
        elif name == "running_var":
            values[name] = 0.5 + torch.rand(tensor.shape, generator=generator, dtype=torch.float64)
        elif name == "num_batches_tracked":
            values[name] = torch.tensor(3)
        else:
            values[name] = 0.5 * noise
    return values


def _copy_holding(
    module: nn.Module, values: dict[str, Tensor], dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """A shallow copy of ``module`` holding ``values`` in ``dtype``; the module is untouched."""
    probe = copy.copy(module)

    def cast(value: Tensor) -> Tensor:
        return value.to(device, dtype if value.is_floating_point() else value.dtype)

    probe.__dict__["_parameters"] = {
        name: None if p is None else nn.Parameter(cast(values[name]), requires_grad=False)
        for name, p in module._parameters.items()
    }
    probe.__dict__["_buffers"] = {
        name: None if b is None else cast(values[name]) for name, b in module._buffers.items()
    }
    return probe


def _member(member_type: type[MemberNorm], plain: nn.Module, eps: float | None) -> MemberNorm:
    reason = member_type.refusal(plain) if isinstance(plain, member_type.plain_type or ()) else None
    if reason:
        raise ValueError(reason)
    return from_plain_as(
        member_type, plain, 1, eps=eps, gamma_mean=_GAMMA_FOR_SIGMA_ONE, gamma_std=0.0
    )


def _same_statistics(plain: nn.Module, member: MemberNorm) -> bool:
    for name in ("running_mean", "running_var"):
        ours = plain._buffers.get(name)
        if ours is not None and not _close(member._buffers[name][0], ours, FLOAT32_TOLERANCE):
            return False
    return True


def _input_shapes(shape: tuple[int, ...]) -> Iterable[tuple[tuple[int, ...], float]]:
    """(shape, scale) of every probe input, the small-scale ones first."""
    a, b, c = [n for n in (2, 3, 5, 7, 11, 13) if n not in shape][:3]
    trailing = [(a, b, *shape), (a, a, b, *shape)] + ([(c, *shape)] if len(shape) > 1 else [])
    channels = []
    if len(shape) == 1:
        (C,) = shape
        channels = [(a, C, b), (a, C, b, c), (a, C, a, b, a)]
    small = [(s, 1e-3) for s in trailing[:1] + channels[:1]]
    return small + [(s, 1.0) for s in trailing + channels]


def _close(got: Tensor, expected: Tensor, tolerance: float) -> bool:
    return _relative_error(got, expected, tolerance) <= 1.0


def _relative_error(got: Tensor, expected: Tensor, tolerance: float) -> float:
    """max |got − expected| / (tolerance · (1 + |expected|)); 0 where equal (NaN included)."""
    got, expected = got.double(), expected.double()
    same = (got == expected) | (got.isnan() & expected.isnan())
    if bool(same.all()):
        return 0.0
    ratio = (got - expected).abs() / (tolerance * (1 + expected.abs()))
    ratio = torch.where(same, 0.0, ratio.nan_to_num(nan=math.inf))
    return float(ratio.max())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
