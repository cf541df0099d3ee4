"""Norm families of modern models convert output-preservingly; users can register their own.

Hugging Face RMS norms (Llama, Mistral, Qwen2, Gemma, T5), channels-first LayerNorms (timm's
LayerNorm2d, ConvNextLayerNorm) and user-registered norms. Models are tiny random configs built
from their config classes, with randomized norm weights so that a plain identity cannot pass.
"""

import copy
import itertools
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens
import snens.nn as snn
from snens.nn.adapters import member_converter
from snens.nn.external_norms import layer_norm_layout, rms_formula

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from transformers.models.convnext.modeling_convnext import ConvNextLayerNorm  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralRMSNorm  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm  # noqa: E402
from transformers.models.t5.modeling_t5 import T5LayerNorm  # noqa: E402

M, B = 4, 3
#: float32 logits through 1–2 attention layers: the norms agree to ≤ 1e-6, the logits to ~1e-7
LOGITS_TOL = {"rtol": 1e-5, "atol": 1e-6}
NORM_TOL = {"rtol": 0.0, "atol": 1e-6}  # one norm, float32, outputs of order 1


class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: layer norm over the channels of (B, C, H, W) inputs."""

    def __init__(self, num_channels, eps=1e-6, affine=True, **kwargs):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine, **kwargs)

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class TinyConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3), LayerNorm2d(8), nn.GELU(), nn.Conv2d(8, 8, 3), LayerNorm2d(8)
        )
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


_DECODER = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
    num_labels=3,
    pad_token_id=0,
)

# family -> (build the model, its plain norm classes, the member norm classes they become)
FAMILIES = {
    "llama": (
        lambda: tf.LlamaForSequenceClassification(tf.LlamaConfig(**_DECODER)),
        {"LlamaRMSNorm": "MemberLlamaRMSNorm"},
    ),
    "mistral": (
        lambda: tf.MistralForSequenceClassification(tf.MistralConfig(**_DECODER)),
        {"MistralRMSNorm": "MemberLlamaRMSNorm"},
    ),
    "qwen2": (
        lambda: tf.Qwen2ForSequenceClassification(tf.Qwen2Config(**_DECODER)),
        {"Qwen2RMSNorm": "MemberLlamaRMSNorm"},
    ),
    "gemma": (
        lambda: tf.GemmaForSequenceClassification(tf.GemmaConfig(**_DECODER, head_dim=8)),
        {"GemmaRMSNorm": "MemberGemmaRMSNorm"},
    ),
    "t5": (
        lambda: tf.T5ForSequenceClassification(
            tf.T5Config(
                vocab_size=64,
                d_model=16,
                d_kv=8,
                d_ff=32,
                num_layers=1,
                num_decoder_layers=1,
                num_heads=2,
                num_labels=3,
                dropout_rate=0.0,
                classifier_dropout=0.0,
                pad_token_id=0,
                eos_token_id=1,
                decoder_start_token_id=0,
            )
        ),
        {"T5LayerNorm": "MemberT5RMSNorm"},
    ),
    "convnext": (
        lambda: tf.ConvNextForImageClassification(
            tf.ConvNextConfig(
                num_channels=3,
                num_stages=2,
                hidden_sizes=[8, 16],
                depths=[1, 1],
                num_labels=3,
                image_size=32,
                layer_scale_init_value=1.0,  # HF's 1e-6 leaves the blocks' norms no gradient
            )
        ),
        {
            "ConvNextLayerNorm": ("MemberLayerNorm2d", "MemberLayerNorm"),
            "LayerNorm": "MemberLayerNorm",
        },
    ),
    "layernorm2d": (TinyConvNet, {"LayerNorm2d": "MemberLayerNorm2d"}),
}


def _randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random norm weights and biases, as a trained model has (HF initializes them to 1/0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if "Norm" not in type(module).__name__:
                continue
            for p in module.parameters(recurse=False):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _inputs(family: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if family in ("convnext", "layernorm2d"):
        key = "pixel_values" if family == "convnext" else "x"
        return {key: torch.randn(B, 3, 32, 32, generator=g)}
    ids = torch.randint(2, 64, (B, 7), generator=g)
    ids[:, -1] = 1  # T5 classifies at the <eos> token; a plain token for the decoders
    return {"input_ids": ids}


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


@pytest.fixture(params=list(FAMILIES))
def family(request):
    torch.manual_seed(0)
    build, kinds = FAMILIES[request.param]
    return request.param, _randomize_norms(build().eval()), kinds


# -- whole models --------------------------------------------------------------------------------
def test_every_member_reproduces_the_model_without_skip_unsupported(family):
    name, model, kinds = family
    inputs = _inputs(name)
    norms = [m for m in model.modules() if type(m).__name__ in kinds]
    with torch.no_grad():
        ref = _logits(model(**inputs))
        ens = snens.convert(model, M, generator=torch.Generator().manual_seed(0)).eval()
        out = ens(**inputs)
    assert out.shape == (M, B, 3)
    for m in range(M):
        torch.testing.assert_close(out[m], ref, **LOGITS_TOL)
    report = ens.report
    assert report.skipped == () and len(report.converted) == len(norms) > 0
    for _, plain, member in report.converted:
        allowed = kinds[plain]
        assert member in ((allowed,) if isinstance(allowed, str) else allowed)
    assert not any(type(m).__name__ in kinds for m in ens.modules())


def test_member_norms_hold_distinct_parameters_and_train_apart(family):
    name, model, _ = family
    inputs = _inputs(name)
    ens = snens.convert(model, M, generator=torch.Generator().manual_seed(0)).train()
    norms = [m for m in ens.modules() if isinstance(m, snn.MemberNorm)]
    for norm in norms:
        for p in (norm.gamma, norm.weight):
            rows = p.detach().flatten(1)  # (M, C)
            assert all((rows[i] != rows[j]).any() for i, j in itertools.combinations(range(M), 2))
    before = [norm.weight.detach().clone() for norm in norms]
    optimizer = torch.optim.SGD(ens.parameters(), lr=0.1)
    snens.ensemble_loss(ens(**inputs), torch.tensor([0, 1, 2])).backward()
    optimizer.step()
    for norm, old in zip(norms, before, strict=True):
        step = (norm.weight.detach() - old).flatten(1)  # (M, C)
        assert step.abs().max() > 0
        assert (step[0] - step[1:]).abs().amax(dim=1).min() > 0, "members took the same step"


def test_extracted_member_is_the_plain_model_with_its_norm_classes(family):
    name, model, kinds = family
    inputs = _inputs(name)
    ens = snens.convert(model, M, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # make the members differ, as fine-tuning would
        for layer in ens.modules():
            if isinstance(layer, snn.MemberNorm):
                layer.gamma.add_(torch.randn_like(layer.gamma))
        out = ens.eval()(**inputs)
        for m in (0, M - 1):
            member = snens.extract_member(ens, m).eval()
            assert type(member) is type(model)
            assert not any(isinstance(x, snn.MemberNorm) for x in member.modules())
            torch.testing.assert_close(_logits(member(**inputs)), out[m], **LOGITS_TOL)
    assert {type(x).__name__ for x in member.modules()} >= set(kinds)
    assert (out[0] - out[-1]).abs().max() > 1e-4


def test_film_still_refuses_the_norms_it_has_no_version_of():
    from snens.baselines import film

    model = nn.Sequential(nn.Linear(4, 8), LlamaRMSNorm(8), nn.LayerNorm(8))
    with pytest.raises(TypeError, match=r"1 \(LlamaRMSNorm\)"):
        film(model, 2)


# -- single norms ------------------------------------------------------------------------------
RMS_CLASSES = {
    LlamaRMSNorm: snn.MemberLlamaRMSNorm,
    MistralRMSNorm: snn.MemberLlamaRMSNorm,
    Qwen2RMSNorm: snn.MemberLlamaRMSNorm,
    GemmaRMSNorm: snn.MemberGemmaRMSNorm,
    T5LayerNorm: snn.MemberT5RMSNorm,
}
HALF = (torch.float32, torch.bfloat16, torch.float16)


def _random_rms(cls, C=24, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    plain = cls(C, eps=1e-6)
    with torch.no_grad():
        plain.weight.add_(0.5 * torch.randn(C, generator=g))
    return plain.to(dtype)


def _convert(plain, seed=0):
    convert = member_converter(plain)
    assert convert is not None, f"{type(plain).__name__} not recognised"
    return convert(
        plain, M, gamma_mean=0.0, gamma_std=1.0, generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("cls", list(RMS_CLASSES), ids=lambda c: c.__name__)
def test_rms_member_reproduces_the_plain_module_in_float32(cls):
    plain = _random_rms(cls)
    member = _convert(plain).eval()
    assert type(member) is RMS_CLASSES[cls] and member.plain_type is cls
    x = 3 * torch.randn(B, 5, 24)
    with torch.no_grad():
        out = member(x.repeat(M, 1, 1)).unflatten(0, (M, -1))
        for m in range(M):
            torch.testing.assert_close(out[m], plain(x), **NORM_TOL)
            # independent reference: the Hugging Face class with member m's folded weight
            torch.testing.assert_close(out[m], member.to_plain(m)(x), **NORM_TOL)
        # a plain state_dict (a pretrained checkpoint) loads into every member
        fresh = _convert(plain, seed=1)
        fresh.load_state_dict(plain.state_dict())
        torch.testing.assert_close(fresh(x.repeat(M, 1, 1))[:B], plain(x), **NORM_TOL)
    assert pickle.loads(pickle.dumps(member)).plain_type is cls


@pytest.mark.parametrize(
    ("cls", "param_dtype", "input_dtype"),
    list(itertools.product([LlamaRMSNorm, GemmaRMSNorm, T5LayerNorm], HALF, HALF)),
    ids=lambda v: getattr(v, "__name__", str(v).removeprefix("torch.")),
)
def test_rms_member_keeps_the_half_precision_casts(cls, param_dtype, input_dtype):
    """HF's norms compute in float32 and cast back, each at its own point: the member's output
    has the plain module's dtype and equals, bit for bit, the plain class holding the member's
    folded scale (Gemma: within one rounding of that scale − 1); against the original it differs
    by the rounding of weight/σ(γ_m) stored in the parameter dtype (≤ 2 ulp there) and one
    rounding of the output."""
    plain = _random_rms(cls, dtype=param_dtype)
    member = _convert(plain).eval()
    x = (3 * torch.randn(B, 5, 24)).to(input_dtype)
    with torch.no_grad():
        ref = plain(x)
        out = member(x.repeat(M, 1, 1)).unflatten(0, (M, -1))
        assert out.dtype == ref.dtype
        rounding = 2 * torch.finfo(param_dtype).eps + torch.finfo(out.dtype).eps
        exact = 0.0 if cls is not GemmaRMSNorm else rounding
        for m in range(M):
            back = member.to_plain(m)
            assert type(back) is cls and back.weight.dtype == param_dtype
            torch.testing.assert_close(out[m], back(x), rtol=exact, atol=exact * 1e-2)
            torch.testing.assert_close(
                out[m].float(), ref.float(), rtol=rounding, atol=max(1e-6, rounding * 1e-2)
            )


@pytest.mark.parametrize("data_format", ["channels_first", "channels_last"])
def test_convnext_layer_norm_is_recognised_by_what_it_computes(data_format):
    plain = ConvNextLayerNorm(8, eps=1e-6, data_format=data_format)
    _randomize_norms(plain)
    member = _convert(plain).eval()
    expected = snn.MemberLayerNorm2d if data_format == "channels_first" else snn.MemberLayerNorm
    assert layer_norm_layout(plain) == data_format and type(member) is expected
    x = torch.randn(B, 8, 4, 5) if data_format == "channels_first" else torch.randn(B, 4, 5, 8)
    with torch.no_grad():
        out = member(x.repeat(M, 1, 1, 1)).unflatten(0, (M, -1))
        for m in range(M):
            torch.testing.assert_close(out[m], plain(x), **NORM_TOL)
            back = member.to_plain(m)
            torch.testing.assert_close(out[m], back(x), rtol=1e-6, atol=1e-6)
    if data_format == "channels_first":
        assert type(back) is ConvNextLayerNorm and back.data_format == "channels_first"


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_2d_member_equals_the_per_member_loop(bias):
    plain = _randomize_norms(LayerNorm2d(6, bias=bias))
    member = _convert(plain).train()
    x = torch.randn(M * B, 6, 3, 4, requires_grad=True)
    out = member(x)
    scale, shift = member.scale_and_shift()
    reference = torch.cat(
        [
            F.layer_norm(
                rows.permute(0, 2, 3, 1), (6,), scale[m], None if shift is None else shift[m], 1e-6
            ).permute(0, 3, 1, 2)
            for m, rows in enumerate(x.split(B))
        ]
    )
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-6)
    grad = torch.randn_like(out)
    (g_out,) = torch.autograd.grad(out, x, grad)
    (g_ref,) = torch.autograd.grad(reference, x, grad)
    torch.testing.assert_close(g_out, g_ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="6 channels at dim 1"):
        member(torch.randn(M * B, 3, 4, 6))


def test_recognition_needs_the_known_formula():
    class MyLlamaRMSNorm(LlamaRMSNorm):  # inherits the known forward
        pass

    class EditedLlamaRMSNorm(LlamaRMSNorm):
        def forward(self, hidden_states):
            return 2 * super().forward(hidden_states)

    class OlmoStyleRMSNorm(nn.Module):  # Llama's attributes, the cast after the product
        def __init__(self, hidden_size, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden_size))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return (self.weight * hidden_states).to(input_dtype)

    class HalfLayerNorm2d(nn.LayerNorm):  # permutes to channels-last, never back
        def forward(self, x):
            return super().forward(x.permute(0, 2, 3, 1))

    assert rms_formula(MyLlamaRMSNorm(8)) == "llama"
    assert rms_formula(EditedLlamaRMSNorm(8)) is None
    assert rms_formula(OlmoStyleRMSNorm(8)) is None
    assert layer_norm_layout(HalfLayerNorm2d(8)) is None
    for unknown in (EditedLlamaRMSNorm(8), OlmoStyleRMSNorm(8), HalfLayerNorm2d(8)):
        name = type(unknown).__name__
        model = nn.Sequential(nn.Linear(4, 8), unknown, nn.LayerNorm(8))
        with pytest.raises(TypeError, match=rf"1 \({name}\).*register_norm\({name}"):
            snens.convert(model, 2)
    with pytest.raises(TypeError, match="is not one"):
        snn.MemberLlamaRMSNorm.from_plain(OlmoStyleRMSNorm(8), 2)
    with pytest.raises(TypeError, match="does not compute one"):
        snn.MemberLayerNorm2d.from_plain(nn.LayerNorm(8), 2)


# -- register_norm -------------------------------------------------------------------------------
class ScaleRMSNorm(nn.Module):
    """A user's RMS norm with nn.RMSNorm's attributes: weight ⊙ x / rms(x)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.normalized_shape, self.eps = (dim,), eps
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class GainOffsetNorm(nn.Module):
    """A user's layer norm whose affine is called gain and offset."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(1 + 0.3 * torch.randn(dim))
        self.offset = nn.Parameter(0.3 * torch.randn(dim))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) * self.gain + self.offset


def gain_offset_to_members(plain, num_members, **kw):
    layer_norm = nn.LayerNorm(plain.gain.shape[0], eps=plain.eps)
    with torch.no_grad():
        layer_norm.weight.copy_(plain.gain)
        layer_norm.bias.copy_(plain.offset)
    return snn.MemberLayerNorm.from_plain(layer_norm, num_members, **kw)


@pytest.mark.parametrize(
    ("norm", "registration"),
    [
        (ScaleRMSNorm, {"member_type": snn.MemberRMSNorm}),
        (GainOffsetNorm, {"from_plain": gain_offset_to_members}),
    ],
    ids=["member_type", "from_plain"],
)
def test_register_norm_converts_a_user_norm_in_one_line(norm, registration):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), norm(8), nn.GELU(), nn.Linear(8, 3)).eval()
    x = torch.randn(B, 6)
    name = norm.__name__
    with pytest.raises(TypeError, match=rf"1 \({name}\).*register_norm\({name}"):
        snens.convert(model, M)
    snn.register_norm(norm, **registration)
    with torch.no_grad():
        ref = model(x)
        ens = snens.convert(model, M).eval()
        out = ens(x)
        for m in range(M):
            torch.testing.assert_close(out[m], ref, **NORM_TOL)
            torch.testing.assert_close(snens.extract_member(ens, m)(x), out[m], **NORM_TOL)
    assert ens.report.converted[0][1] == name and ens.report.skipped == ()


def test_register_norm_refuses_what_it_cannot_use():
    class PlainNorm(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match="LayerNorm already converts to MemberLayerNorm"):
        snn.register_norm(nn.LayerNorm, snn.MemberLayerNorm)
    with pytest.raises(TypeError, match="exactly one of them"):
        snn.register_norm(PlainNorm)
    with pytest.raises(TypeError, match="exactly one of them"):
        snn.register_norm(PlainNorm, snn.MemberLayerNorm, from_plain=gain_offset_to_members)
    with pytest.raises(TypeError, match="must be a MemberNorm subclass"):
        snn.register_norm(PlainNorm, nn.LayerNorm)
    with pytest.raises(TypeError, match="must be an nn.Module class"):
        snn.register_norm("PlainNorm", snn.MemberLayerNorm)
    with pytest.raises(TypeError, match="is a member module"):
        snn.register_norm(snn.MemberLayerNorm, snn.MemberLayerNorm)


def test_a_registered_conversion_must_return_a_member_norm():
    class BrokenNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.weight

    snn.register_norm(BrokenNorm, from_plain=lambda plain, num_members, **kw: nn.LayerNorm(4))
    with pytest.raises(TypeError, match=r"converting 1 \(BrokenNorm\).*num_members=2"):
        snens.convert(nn.Sequential(nn.Linear(4, 4), BrokenNorm()), 2)

    class AttributelessNorm(BrokenNorm):
        pass

    snn.register_norm(AttributelessNorm, snn.MemberLayerNorm)
    with pytest.raises(TypeError, match=r"cannot convert 1 \(AttributelessNorm\).*from_plain="):
        snens.convert(nn.Sequential(nn.Linear(4, 4), AttributelessNorm()), 2)


@pytest.mark.parametrize("cls", list(RMS_CLASSES), ids=lambda c: c.__name__)
def test_a_model_holding_an_hf_member_norm_moves_and_casts(cls):
    """The member's formula had been a method named ``_apply``, which overrides
    ``nn.Module._apply``: ``.to()``, ``.double()`` or ``.cuda()`` of any model holding one
    failed with a TypeError. Moved and cast, it still equals the plain norm cast alike."""
    plain = _random_rms(cls)
    model = nn.Sequential(nn.Linear(24, 24), _convert(plain)).eval()
    reference = nn.Sequential(copy.deepcopy(model[0]), copy.deepcopy(plain)).eval()
    model.to("cpu").double()
    reference.double()
    assert all(p.dtype == torch.float64 for p in model.parameters())
    x = torch.randn(B, 5, 24, dtype=torch.float64)
    with torch.no_grad():
        out = model(x.repeat(M, 1, 1)).unflatten(0, (M, -1))
        for m in range(M):
            member = nn.Sequential(model[0], model[1].to_plain(m))  # its folded float64 scale
            exact = 1e-12 if cls is not GemmaRMSNorm else 1e-6  # Gemma stores scale − 1
            torch.testing.assert_close(out[m], member(x), rtol=exact, atol=exact)
            # the fold weight/σ(γ_m) was rounded in float32 before the cast
            torch.testing.assert_close(out[m], reference(x), rtol=1e-6, atol=1e-6)
