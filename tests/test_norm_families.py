"""Norm families of modern models convert output-preservingly; users can register their own.

Hugging Face RMS norms (Llama, Mistral, Qwen2, Gemma, T5, OLMo-2, Gemma 3n), Hugging Face's
float32 layer norms (Cohere, OLMo-1), channels-first LayerNorms (timm's LayerNorm2d,
ConvNextLayerNorm) and user-registered norms. Models are tiny random configs built from their
config classes, with randomized norm weights so that a plain identity cannot pass.
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
from snens.nn import external_norms, hf_formulas, hf_norms, plain_conversion
from snens.nn.adapters import member_converter
from snens.nn.channels_first import layer_norm_layout
from snens.nn.hf_formulas import hf_formula

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from transformers.models.cohere.modeling_cohere import CohereLayerNorm  # noqa: E402
from transformers.models.convnext.modeling_convnext import ConvNextLayerNorm  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.gemma3n.modeling_gemma3n import Gemma3nRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralRMSNorm  # noqa: E402
from transformers.models.olmo.modeling_olmo import OlmoLayerNorm  # noqa: E402
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm  # noqa: E402
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


class LastTokenClassifier(nn.Module):
    """A decoder's last hidden state at the last token through a linear head, as the
    ForSequenceClassification classes do, for decoders transformers has none of."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder
        self.head = nn.Linear(decoder.config.hidden_size, 3)

    def forward(self, input_ids):
        return self.head(self.decoder(input_ids=input_ids).last_hidden_state[:, -1])


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


def _gemma3n() -> nn.Module:
    decoder = tf.Gemma3nTextModel(
        tf.Gemma3nTextConfig(
            **_DECODER,
            head_dim=8,
            vocab_size_per_layer_input=64,
            hidden_size_per_layer_input=4,
            laurel_rank=4,
            num_kv_shared_layers=0,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=8,
            activation_sparsity_pattern=[0.0, 0.0],
        )
    )
    with torch.no_grad():  # HF's zero init leaves the per-layer input norms no gradient
        for layer in decoder.layers:
            layer.altup.correct_output_scale.fill_(1.0)
    return decoder


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
    "olmo2": (
        lambda: tf.Olmo2ForSequenceClassification(tf.Olmo2Config(**_DECODER)),
        {"Olmo2RMSNorm": "MemberOlmo2RMSNorm"},
    ),
    "olmo": (
        lambda: tf.OlmoForSequenceClassification(tf.OlmoConfig(**_DECODER)),
        {"OlmoLayerNorm": "MemberOlmoLayerNorm"},
    ),
    "cohere": (  # with its QK norms, whose weights are (heads, head_dim)
        lambda: LastTokenClassifier(tf.CohereModel(tf.CohereConfig(**_DECODER, use_qk_norm=True))),
        {"CohereLayerNorm": "MemberCohereLayerNorm"},
    ),
    "gemma3n": (
        lambda: LastTokenClassifier(_gemma3n()),
        {"Gemma3nRMSNorm": "MemberGemma3nRMSNorm"},
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
#: family -> the plain class of the norms it leaves, refused by name: Gemma 3n's value norms,
#: Gemma3nRMSNorm(with_scale=False), hold no weight and do not record their size
REFUSED = {"gemma3n": "Gemma3nRMSNorm"}
#: the plain class a member norm's to_plain gives, where it is not the class converted
EXTRACTED_AS = {"OlmoLayerNorm": "CohereLayerNorm"}


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


def _convert_model(model: nn.Module, family: str) -> snens.Ensemble:
    """``snens.convert``, with ``skip_unsupported`` only for a family with norms it refuses."""
    generator = torch.Generator().manual_seed(0)
    return snens.convert(model, M, skip_unsupported=family in REFUSED, generator=generator)


# -- whole models --------------------------------------------------------------------------------
def test_every_member_reproduces_the_model(family):
    """Without ``skip_unsupported`` (Gemma 3n: with it, leaving exactly its weightless norms)."""
    name, model, kinds = family
    inputs = _inputs(name)
    norms = [(n, m) for n, m in model.named_modules() if type(m).__name__ in kinds]
    refused = [(n, m) for n, m in norms if member_converter(m) is None]
    assert bool(refused) == (name in REFUSED)
    assert all(type(m).__name__ == REFUSED[name] for _, m in refused)
    with torch.no_grad():
        ref = _logits(model(**inputs))
        ens = _convert_model(model, name).eval()
        out = ens(**inputs)
    assert out.shape == (M, B, 3)
    for m in range(M):
        torch.testing.assert_close(out[m], ref, **LOGITS_TOL)
    report = ens.report
    assert report.skipped == tuple((n, type(m).__name__) for n, m in refused)
    assert len(report.converted) == len(norms) - len(refused) > 0
    for _, plain, member in report.converted:
        allowed = kinds[plain]
        assert member in ((allowed,) if isinstance(allowed, str) else allowed)
    left = [n for n, m in ens.model.named_modules() if type(m).__name__ in kinds]
    assert left == [n for n, _ in refused]


def test_member_norms_hold_distinct_parameters_and_train_apart(family):
    name, model, _ = family
    inputs = _inputs(name)
    ens = _convert_model(model, name).train()
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
    ens = _convert_model(model, name)
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
    assert {type(x).__name__ for x in member.modules()} >= {EXTRACTED_AS.get(k, k) for k in kinds}
    assert (out[0] - out[-1]).abs().max() > 1e-4


def test_film_still_refuses_the_norms_it_has_no_version_of():
    from snens.baselines import film

    model = nn.Sequential(nn.Linear(4, 8), LlamaRMSNorm(8), nn.LayerNorm(8))
    with pytest.raises(TypeError, match=r"1 \(LlamaRMSNorm\)"):
        film(model, 2)


_CAUSAL_LM = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=32,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)
CAUSAL_LMS = {
    "olmo2": lambda: tf.Olmo2ForCausalLM(tf.Olmo2Config(**_CAUSAL_LM)),
    "olmo": lambda: tf.OlmoForCausalLM(tf.OlmoConfig(**_CAUSAL_LM)),
    "cohere": lambda: tf.CohereForCausalLM(tf.CohereConfig(**_CAUSAL_LM, use_qk_norm=True)),
}


@pytest.mark.parametrize("name", list(CAUSAL_LMS))
def test_every_member_of_a_converted_causal_lm_reproduces_its_logits(name):
    torch.manual_seed(0)
    model = _randomize_norms(CAUSAL_LMS[name]().eval())
    ids = _inputs(name)["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=ids).logits  # (B, T, V)
        ens = snens.convert(model, num_members=M).eval()
        out = ens(input_ids=ids)
    assert out.shape == (M, *ref.shape) and ens.report.skipped == ()
    for m in range(M):
        torch.testing.assert_close(out[m], ref, **LOGITS_TOL)


# -- single norms ------------------------------------------------------------------------------
HF_NORM_CLASSES = {
    LlamaRMSNorm: snn.MemberLlamaRMSNorm,
    MistralRMSNorm: snn.MemberLlamaRMSNorm,
    Qwen2RMSNorm: snn.MemberLlamaRMSNorm,
    GemmaRMSNorm: snn.MemberGemmaRMSNorm,
    T5LayerNorm: snn.MemberT5RMSNorm,
    Olmo2RMSNorm: snn.MemberOlmo2RMSNorm,
    Gemma3nRMSNorm: snn.MemberGemma3nRMSNorm,
    CohereLayerNorm: snn.MemberCohereLayerNorm,
    OlmoLayerNorm: snn.MemberOlmoLayerNorm,
}
HALF = (torch.float32, torch.bfloat16, torch.float16)


def _random_hf_norm(cls, C=24, dtype=torch.float32, seed=0):
    if cls is OlmoLayerNorm:
        return OlmoLayerNorm(C)  # no parameters; eps is its forward's constant, 1e-5
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


@pytest.mark.parametrize("cls", list(HF_NORM_CLASSES), ids=lambda c: c.__name__)
def test_hf_member_reproduces_the_plain_module_in_float32(cls):
    plain = _random_hf_norm(cls)
    member = _convert(plain).eval()
    back_type = CohereLayerNorm if cls is OlmoLayerNorm else cls
    assert type(member) is HF_NORM_CLASSES[cls] and member.plain_type is back_type
    x = 3 * torch.randn(B, 5, 24)
    with torch.no_grad():
        out = member(x.repeat(M, 1, 1)).unflatten(0, (M, -1))
        for m in range(M):
            torch.testing.assert_close(out[m], plain(x), **NORM_TOL)
            # independent reference: the Hugging Face class with member m's folded weight
            torch.testing.assert_close(out[m], member.to_plain(m)(x), **NORM_TOL)
        # a plain state_dict (a pretrained checkpoint) loads into every member
        fresh = _convert(plain, seed=1)
        if cls is OlmoLayerNorm:  # it has none: the member keeps what conversion set
            assert plain.state_dict() == {}
            missing = fresh.load_state_dict(plain.state_dict(), strict=False).missing_keys
            assert sorted(missing) == ["gamma", "weight"]
        else:
            fresh.load_state_dict(plain.state_dict())
        torch.testing.assert_close(fresh(x.repeat(M, 1, 1))[:B], plain(x), **NORM_TOL)
    assert pickle.loads(pickle.dumps(member)).plain_type is back_type


@pytest.mark.parametrize(
    ("cls", "param_dtype", "input_dtype"),
    list(
        itertools.product(
            [
                LlamaRMSNorm,
                GemmaRMSNorm,
                T5LayerNorm,
                Olmo2RMSNorm,
                Gemma3nRMSNorm,
                CohereLayerNorm,
            ],
            HALF,
            HALF,
        )
    ),
    ids=lambda v: getattr(v, "__name__", str(v).removeprefix("torch.")),
)
def test_hf_member_keeps_the_half_precision_casts(cls, param_dtype, input_dtype):
    """HF's norms compute in float32 and cast back, each at its own point: the member's output
    has the plain module's dtype and equals, bit for bit, the plain class holding the member's
    folded scale (Gemma: within one rounding of that scale − 1); against the original it differs
    by the rounding of weight/σ(γ_m) stored in the parameter dtype (≤ 2 ulp there) and one
    rounding of the output."""
    plain = _random_hf_norm(cls, dtype=param_dtype)
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


@pytest.mark.parametrize("input_dtype", HALF, ids=lambda d: str(d).removeprefix("torch."))
def test_olmo_layer_norm_member_keeps_its_float32_layer_norm_and_one_cast(input_dtype):
    """OlmoLayerNorm has no parameters, so its member's are float32, the precision its layer
    norm runs in, whatever the input's dtype; the output is cast once, to the input's dtype, as
    the plain module's. Against it the member differs by the rounding of σ(γ_m)·(1/σ(γ_m))
    (a few float32 ulp) and then at most one rounding of the output; against ``to_plain``'s
    CohereLayerNorm, by that layer norm written as explicit ops (≤ 1e-6 in float32)."""
    plain = OlmoLayerNorm(24)
    member = _convert(plain).eval()
    assert member.weight.dtype == torch.float32
    x = (3 * torch.randn(B, 5, 24)).to(input_dtype)
    with torch.no_grad():
        ref = plain(x)
        out = member(x.repeat(M, 1, 1)).unflatten(0, (M, -1))
        assert out.dtype == ref.dtype == input_dtype
        ulp = torch.finfo(input_dtype).eps
        for m in range(M):
            back = member.to_plain(m)
            assert type(back) is CohereLayerNorm and back.weight.dtype == torch.float32
            for expected in (ref, back(x)):
                torch.testing.assert_close(out[m].float(), expected.float(), rtol=ulp, atol=1e-6)
            if input_dtype != torch.float32:  # the same casts: nearly all bits agree
                assert (out[m] == ref).float().mean() > 0.99


def test_cohere_qk_norm_member_normalizes_each_head_with_its_weight():
    """Cohere's QK norms hold an (H, D) weight and normalize each head's D features."""
    plain = _randomize_norms(CohereLayerNorm((2, 12), eps=1e-5))
    member = _convert(plain).eval()
    assert member.feature_shape == (2, 12) and member.weight.shape == (M, 2, 12)
    x = 3 * torch.randn(B, 5, 2, 12)
    with torch.no_grad():
        out = member(x.repeat(M, 1, 1, 1)).unflatten(0, (M, -1))
        for m in range(M):
            torch.testing.assert_close(out[m], plain(x), **NORM_TOL)
            back = member.to_plain(m)
            assert back.weight.shape == (2, 12)
            torch.testing.assert_close(out[m], back(x), rtol=0.0, atol=0.0)
        fresh = _convert(plain, seed=1)
        fresh.load_state_dict(plain.state_dict())
        torch.testing.assert_close(fresh(x.repeat(M, 1, 1, 1))[:B], plain(x), **NORM_TOL)
    with pytest.raises(ValueError, match=r"trailing shape \(2, 12\)"):
        member(torch.randn(M * B, 5, 24))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("cls", sorted(set(HF_NORM_CLASSES.values()), key=lambda c: c.__name__))
def test_hf_member_norm_equals_its_per_member_loop(cls, dtype):
    """``_normalize``, the formula once over (M, B, …, C), is ``_reference``'s per-member loop,
    forward and backward."""
    g = torch.Generator().manual_seed(0)
    layer = cls(8, M, dtype=dtype).train()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    x = (2 * torch.randn(M * B, 5, 8, generator=g, dtype=dtype) + 0.5).requires_grad_(True)
    out = layer(x)
    reference = layer._reference(x, *layer.scale_and_shift())
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0.0, "atol": 1e-12}
    torch.testing.assert_close(out, reference, **tol)
    grad = torch.randn(out.shape, generator=g, dtype=dtype)
    inputs = (x, layer.gamma, layer.weight)
    for got, want in zip(
        torch.autograd.grad(out, inputs, grad), torch.autograd.grad(reference, inputs, grad)
    ):
        torch.testing.assert_close(got, want, **tol)


def test_a_weightless_gemma3n_norm_is_refused_by_name_and_left_shared_on_request():
    """Gemma3nRMSNorm(with_scale=False) holds no weight and does not record its size, so no
    member version can be built: conversion names it and the fixes; ``skip_unsupported=True``
    leaves it shared, which is exact (it has no parameters)."""
    weightless = Gemma3nRMSNorm(8, with_scale=False)
    assert hf_formula(weightless) is None and hf_formula(Gemma3nRMSNorm(8)) == "gemma3n"
    model = nn.Sequential(nn.Linear(4, 8), weightless, nn.LayerNorm(8)).eval()
    with pytest.raises(
        TypeError,
        match=r"1 \(Gemma3nRMSNorm\).*register_norm\(Gemma3nRMSNorm.*skip_unsupported=True",
    ):
        snens.convert(model, M)
    x = torch.randn(B, 4)
    with torch.no_grad():
        ref = model(x)
        ens = snens.convert(model, M, skip_unsupported=True).eval()
        out = ens(x)
    assert ens.report.skipped == (("1", "Gemma3nRMSNorm"),)
    assert type(ens.model[1]) is Gemma3nRMSNorm and isinstance(ens.model[2], snn.MemberNorm)
    for m in range(M):
        torch.testing.assert_close(out[m], ref, **NORM_TOL)


def test_external_norms_re_exports_the_modules_split_from_it():
    for name in external_norms.__all__:
        assert getattr(external_norms, name) is not None
    assert external_norms.MemberLlamaRMSNorm is hf_norms.MemberLlamaRMSNorm
    assert external_norms.MemberLayerNorm2d is snn.MemberLayerNorm2d
    assert external_norms.from_plain_as is plain_conversion.from_plain_as
    assert external_norms.rms_formula is hf_formulas.hf_formula
    assert external_norms.RMS_MEMBER_NORMS is hf_norms.HF_MEMBER_NORMS


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

    class SqrtRMSNorm(OlmoStyleRMSNorm):  # the same maths, other ops: another rounding
        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states / torch.sqrt(variance + self.variance_epsilon)
            return (self.weight * hidden_states).to(input_dtype)

    class Eps6OlmoLayerNorm(OlmoLayerNorm):  # OLMo-1's forward with another eps constant
        def forward(self, hidden_states):
            orig_dtype = hidden_states.dtype
            return F.layer_norm(
                hidden_states.to(dtype=torch.float32), self.normalized_shape, None, None, eps=1e-6
            ).to(orig_dtype)

    class HalfLayerNorm2d(nn.LayerNorm):  # permutes to channels-last, never back
        def forward(self, x):
            return super().forward(x.permute(0, 2, 3, 1))

    matrix_weight = LlamaRMSNorm(8)  # Llama's formula, but a weight only Cohere's may have
    matrix_weight.weight = nn.Parameter(torch.ones(2, 8))
    with_bias = CohereLayerNorm(8)  # Cohere's forward ignores a bias: state beyond its own
    with_bias.bias = nn.Parameter(torch.zeros(8))

    assert hf_formula(MyLlamaRMSNorm(8)) == "llama"
    assert hf_formula(OlmoStyleRMSNorm(8)) == "olmo2"  # Olmo2RMSNorm's forward, token for token
    assert hf_formula(OlmoLayerNorm(8)) == "olmo"
    assert hf_formula(CohereLayerNorm((2, 8))) == "cohere"
    unknowns = (
        EditedLlamaRMSNorm(8),
        SqrtRMSNorm(8),
        Eps6OlmoLayerNorm(8),
        matrix_weight,
        with_bias,
        HalfLayerNorm2d(8),
    )
    assert all(hf_formula(unknown) is None for unknown in unknowns)
    assert layer_norm_layout(HalfLayerNorm2d(8)) is None
    for unknown in unknowns:
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


@pytest.mark.parametrize("cls", list(HF_NORM_CLASSES), ids=lambda c: c.__name__)
def test_a_model_holding_an_hf_member_norm_moves_and_casts(cls):
    """The member's formula had been a method named ``_apply``, which overrides
    ``nn.Module._apply``: ``.to()``, ``.double()`` or ``.cuda()`` of any model holding one
    failed with a TypeError. Moved and cast, it still equals the plain norm cast alike."""
    plain = _random_hf_norm(cls)
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
            # Gemma stores scale − 1; OLMo-1's to_plain is Cohere's layer norm as explicit ops
            exact = 1e-6 if cls in (GemmaRMSNorm, OlmoLayerNorm) else 1e-12
            torch.testing.assert_close(out[m], member(x), rtol=exact, atol=exact)
            # the fold weight/σ(γ_m) was rounded in float32 before the cast
            torch.testing.assert_close(out[m], reference(x), rtol=1e-6, atol=1e-6)
