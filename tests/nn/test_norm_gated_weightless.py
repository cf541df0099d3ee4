"""Gated RMS norms, weightless RMS norms and the layer norm with the scale 1 + w convert exactly.

For each family, a hand-written module computing the formula of the Hugging Face classes (and,
where transformers is installed, the classes themselves, built tiny), inside a small model,
converted with M = 2, 3, 4: every member equals the plain model at conversion (max abs diff
≤ 1e-6), the members part once one member's γ changes, a state_dict saves and loads back to
the same outputs, and ``extract_member`` gives a plain module computing member m. A gated
norm's member takes the gate as the module does, positional or keyword.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens
import snens.nn as snn
from snens.nn.registry import member_converter, refusal

C, B = 8, 5
TOL = {"rtol": 0.0, "atol": 1e-6}

pytestmark = pytest.mark.usefixtures("one_thread")


# -- hand-written modules, one per formula -------------------------------------------------------
class _Weighted(nn.Module):
    def __init__(self, size=C, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps


class NormThenGateRMSNorm(_Weighted):
    """Qwen3-Next / Qwen3.5 / OLMo-hybrid: ((w ⊙ x̂.to(dtype)) ⊙ silu(g_f32)).to(dtype)."""

    activation = "silu"

    def forward(self, hidden_states, gate):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        h = self.weight * h.to(dtype)
        return (h * F.silu(gate.to(torch.float32))).to(dtype)


class SigmoidGatedRMSNorm(_Weighted):
    """Kimi-Linear: (w_f32 ⊙ x̂ ⊙ sigmoid(g_f32)).to(dtype)."""

    activation = "sigmoid"

    def forward(self, hidden_states, gate=None):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        h = self.weight.to(torch.float32) * h
        return (h * torch.sigmoid(gate.to(torch.float32))).to(dtype)


class GateFirstGroupedRMSNorm(_Weighted):
    """Mamba-2 / Bamba / Zamba2 / Nemotron-H: gate, then an RMS norm per group of 4."""

    def __init__(self, size=C, group_size=4, eps=1e-6):
        super().__init__(size, eps)
        self.group_size = group_size

    def forward(self, hidden_states, gate=None):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        if gate is not None:
            h = h * F.silu(gate.to(torch.float32))
        *prefix, last = h.shape
        groups = h.view(*prefix, last // self.group_size, self.group_size)
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * groups.view(*prefix, last).to(dtype)


class WeightlessQKNorm(nn.Module):
    """Llama 4's L2Norm / NanoChat's RMS norm: no weight, no size, x̂.type_as(x)."""

    def __init__(self, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


class UnweightedFactorNorm(WeightlessQKNorm):
    """DeepSeek-V4's unweighted RMS norm: x ⊙ rsqrt(mean(x_f32²) + eps).to(x.dtype)."""

    def forward(self, x):
        return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps).to(x.dtype)


class LayerNorm1P(nn.LayerNorm):
    """Nemotron: F.layer_norm with the scale weight + 1."""

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)


# -- the real classes, where transformers is installed -------------------------------------------
def _hf(module_path: str, name: str, *args, **kw):
    """``name`` of ``module_path`` built; ``name`` may list the class's name in each release
    ("A|B")."""

    def build():
        module = pytest.importorskip(f"transformers.models.{module_path}")
        found = [getattr(module, n) for n in name.split("|") if hasattr(module, n)]
        assert found, f"transformers.models.{module_path} has none of {name}"
        return found[0](*args, **kw)

    return build


#: case -> (builder, the member class, takes a gate, the gate by keyword)
CASES = {
    "norm_then_gate": (NormThenGateRMSNorm, snn.MemberGatedRMSNorm, True, False),
    "sigmoid_gate": (SigmoidGatedRMSNorm, snn.MemberGatedRMSNormF32, True, True),
    "gate_first_grouped": (GateFirstGroupedRMSNorm, snn.MemberGateFirstRMSNorm, True, True),
    "weightless": (WeightlessQKNorm, snn.MemberUnweightedRMSNorm, False, False),
    "unweighted_factor": (UnweightedFactorNorm, snn.MemberDeepseekUnweightedRMSNorm, False, False),
    "layer_norm_1p": (lambda: LayerNorm1P(C), snn.MemberLayerNorm1P, False, False),
    "hf_qwen3_next": (
        _hf("qwen3_next.modeling_qwen3_next", "Qwen3NextRMSNormGated", C),
        snn.MemberGatedRMSNorm,
        True,
        False,
    ),
    "hf_qwen3_5": (
        _hf("qwen3_5.modeling_qwen3_5", "Qwen3_5RMSNormGated", C),
        snn.MemberGatedRMSNorm,
        True,
        True,
    ),
    "hf_kimi_linear": (
        _hf("kimi_linear.modeling_kimi_linear", "KimiLinearRMSNormGated", C),
        snn.MemberGatedRMSNormF32,
        True,
        False,
    ),
    "hf_mamba2": (
        _hf("mamba2.modeling_mamba2", "MambaRMSNormGated|Mamba2RMSNormGated", C, group_size=4),
        snn.MemberGateFirstRMSNorm,
        True,
        True,
    ),
    "hf_nemotron_h": (
        _hf("nemotron_h.modeling_nemotron_h", "NemotronHRMSNormGated", C, group_size=C),
        snn.MemberGateFirstRMSNorm,
        True,
        False,
    ),
    "hf_falcon_h1_norm_first": (
        _hf("falcon_h1.modeling_falcon_h1", "FalconH1RMSNormGated", C, n_groups=2),
        snn.MemberGatedRMSNormF32,
        True,
        False,
    ),
    "hf_falcon_h1_gate_first": (
        _hf(
            "falcon_h1.modeling_falcon_h1",
            "FalconH1RMSNormGated",
            C,
            n_groups=2,
            norm_before_gate=False,
        ),
        snn.MemberGateFirstRMSNormF32,
        True,
        True,
    ),
    "hf_llama4_qk_norm": (
        _hf("llama4.modeling_llama4", "Llama4TextL2Norm"),
        snn.MemberUnweightedRMSNorm,
        False,
        False,
    ),
    "hf_deepseek_v4": (
        _hf("deepseek_v4.modeling_deepseek_v4", "DeepseekV4UnweightedRMSNorm"),
        snn.MemberDeepseekUnweightedRMSNorm,
        False,
        False,
    ),
    "hf_falcon_mamba": (
        _hf("falcon_mamba.modeling_falcon_mamba", "FalconMambaWeightlessRMSNorm", C),
        snn.MemberUnweightedRMSNorm,
        False,
        False,
    ),
    "hf_dory_l2": (
        _hf("dory.modeling_dory", "DoryL2Norm"),
        snn.MemberUnweightedL2Norm,
        False,
        False,
    ),
    "hf_nemotron_1p": (
        _hf("nemotron.modeling_nemotron", "NemotronLayerNorm1P", C),
        snn.MemberLayerNorm1P,
        False,
        False,
    ),
}


class Block(nn.Module):
    """Linear → the norm (given a gate computed from the input, where it takes one) → head."""

    def __init__(self, norm: nn.Module, gated: bool, by_keyword: bool):
        super().__init__()
        self.inp = nn.Linear(4, C)
        self.gate = nn.Linear(4, C) if gated else None
        self.norm = norm
        self.head = nn.Linear(C, 3)
        self.by_keyword = by_keyword

    def forward(self, x):
        h = self.inp(x)
        if self.gate is None:
            h = self.norm(h)
        elif self.by_keyword:
            h = self.norm(h, gate=self.gate(x))
        else:
            h = self.norm(h, self.gate(x))
        return self.head(h)


def _model(case: str) -> Block:
    make, _, gated, by_keyword = CASES[case]
    torch.manual_seed(0)
    model = Block(make(), gated, by_keyword)
    with torch.no_grad():
        for p in model.norm.parameters():
            p.add_(0.3 * torch.randn(p.shape))  # off 1 and 0, as trained
    return model.eval()


def _x() -> torch.Tensor:
    return 2 * torch.randn(B, 3, 4, generator=torch.Generator().manual_seed(1))


def _convert(model: nn.Module, M: int, seed: int = 0) -> snens.Ensemble:
    return snens.convert(
        model, M, skip_unsupported=False, generator=torch.Generator().manual_seed(seed)
    ).eval()


@pytest.mark.parametrize("M", [2, 3, 4])
@pytest.mark.parametrize("case", CASES)
def test_every_member_equals_the_plain_module_at_conversion(case, M):
    model = _model(case)
    assert member_converter(model.norm) is not None, refusal(model.norm)
    x = _x()
    ens = _convert(model, M)
    assert type(ens.model.norm) is CASES[case][1]
    assert ens.report.skipped == ()
    with torch.no_grad():
        ref, out = model(x), ens(x)
    assert out.shape == (M, *ref.shape)
    for m in range(M):
        torch.testing.assert_close(out[m], ref, **TOL)


@pytest.mark.parametrize("case", CASES)
def test_members_part_save_load_and_extract(case):
    M = 3
    model, x = _model(case), _x()
    ens = _convert(model, M)
    norm = ens.model.norm
    with torch.no_grad():
        norm.gamma[1].add_(1.5)  # member 1 only
        out = ens(x)
        ref = model(x)
    torch.testing.assert_close(out[0], ref, **TOL)
    torch.testing.assert_close(out[2], ref, **TOL)
    assert float((out[1] - ref).abs().max()) > 1e-3  # member 1 parts

    # state_dict round trip: another conversion (other γ) given these weights computes these
    other = _convert(_model(case), M, seed=7)
    other.load_state_dict(ens.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(other(x), out, rtol=0.0, atol=0.0)

    # extract_member: a plain module computing member m
    for m in range(M):
        plain = snens.extract_member(ens, m).eval()
        assert not isinstance(plain.norm, snn.MemberNorm)
        with torch.no_grad():
            torch.testing.assert_close(plain(x), out[m], **TOL)


def test_extracted_members_are_the_classes_converted_or_a_weighted_stand_in():
    ens = _convert(_model("gate_first_grouped"), 2)
    norm = snens.extract_member(ens, 1).norm
    assert type(norm) is GateFirstGroupedRMSNorm and norm.group_size == 4
    ens = _convert(_model("layer_norm_1p"), 2)
    assert type(snens.extract_member(ens, 0).norm) is LayerNorm1P
    ens = _convert(_model("weightless"), 2)
    assert type(snens.extract_member(ens, 0).norm) is snn.ScaledRMSNorm  # no weight to hold it


def test_a_gated_member_takes_no_gate_where_the_module_takes_none():
    """Mamba-2's norm without a gate is an RMS norm; its member computes the same."""
    torch.manual_seed(0)
    plain = GateFirstGroupedRMSNorm().eval()
    member = member_converter(plain)(plain, 2)
    x = torch.randn(2 * B, C)
    with torch.no_grad():
        out = member(torch.cat([x[:B], x[:B]]))
        torch.testing.assert_close(out[:B], plain(x[:B]), **TOL)
        torch.testing.assert_close(out[B:], plain(x[:B]), **TOL)
    with pytest.raises(ValueError, match="member-major gate"):
        member(x, torch.randn(B, C))


def test_a_weightless_norm_without_a_size_gets_one_scale_per_member():
    plain = WeightlessQKNorm()
    member = member_converter(plain)(plain, 4)
    assert member.gamma.shape == (4, 1) and member.broadcast
    for width in (3, 16):  # any last dimension
        x = torch.randn(4 * 2, width)
        torch.testing.assert_close(member(x), plain(x), **TOL)


@pytest.mark.parametrize("case", ["norm_then_gate", "gate_first_grouped", "weightless"])
def test_half_precision_members_reproduce_the_module(case):
    """bfloat16 parameters and inputs: within 2 units of bfloat16's epsilon."""
    model = _model(case).to(torch.bfloat16)
    x = _x().to(torch.bfloat16)
    ens = _convert(model, 2)
    with torch.no_grad():
        ref, out = model(x), ens(x)
    assert out.dtype == ref.dtype
    tol = 2 * 2**-7
    for m in range(2):
        torch.testing.assert_close(out[m], ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("cuda_autocast", [False, True])
def test_layer_norm_1p_member_follows_its_autocast_casts(cuda_autocast, monkeypatch):
    """NemotronLayerNorm1P turns autocast off and, under CUDA's autocast (its
    ``torch.is_autocast_enabled()``), casts its input and affine to the autocast dtype; the
    member does the same (CUDA's case simulated on the CPU)."""
    torch.manual_seed(0)
    plain = _model("hf_nemotron_1p").norm
    member = member_converter(plain)(plain, 2)
    if cuda_autocast:
        enabled = torch.is_autocast_enabled
        monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: True if not a else enabled(*a))
    x = torch.randn(3, C)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = plain(x), member(x.repeat(2, 1))
    assert out.dtype == ref.dtype == (torch.bfloat16 if cuda_autocast else torch.float32)
    torch.testing.assert_close(out[:3], ref, **TOL)
    torch.testing.assert_close(out[3:], ref, **TOL)


@pytest.mark.parametrize(
    "case", ["weightless", "unweighted_factor", "hf_falcon_mamba", "hf_dory_l2"]
)
def test_an_extracted_weightless_member_converts_back_exactly(case):
    """extract_member gives a ScaledRMSNorm holding the member's scale; converting that model
    again gives the same member class (one scale per member again where the module records no
    size), every member computing the extracted one."""
    model, x = _model(case), _x()
    ens = _convert(model, 3)
    with torch.no_grad():
        ens.model.norm.gamma.add_(torch.randn(ens.model.norm.gamma.shape))
        plain = snens.extract_member(ens, 2).eval()
        again = _convert(plain, 2, seed=3)
        ref, out = plain(x), again(x)
    assert type(plain.norm) is snn.ScaledRMSNorm
    assert type(again.model.norm) is CASES[case][1]
    assert again.model.norm.gamma.shape[1:] == ens.model.norm.gamma.shape[1:]
    for m in range(2):
        torch.testing.assert_close(out[m], ref, **TOL)
