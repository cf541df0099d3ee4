"""Norm families of modern models convert output-preservingly; users can register their own.

Hugging Face RMS norms (Llama, Mistral, Qwen2, Gemma, T5, OLMo-2, Gemma 3n, Helium, Llama 4,
CPM-Ant, ImageGPT), Hugging Face's float32 layer norms (Cohere, OLMo-1, DeBERTa), channels-first
LayerNorms (timm's LayerNorm2d, ConvNextLayerNorm, SqueezeBERT's), a GroupNorm subclass
(PoolFormer) and user-registered norms, all recognized by what they compute
(:mod:`snens.nn.probe`). Models are tiny random configs built from their config classes, with
randomized norm weights so that a plain identity cannot pass.
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
from snens.nn.registry import member_converter, refusal

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from transformers.models.cohere.modeling_cohere import CohereLayerNorm  # noqa: E402
from transformers.models.convnext.modeling_convnext import ConvNextLayerNorm  # noqa: E402
from transformers.models.deberta.modeling_deberta import DebertaLayerNorm  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.gemma3n.modeling_gemma3n import Gemma3nRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.llama4 import modeling_llama4  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralRMSNorm  # noqa: E402
from transformers.models.olmo.modeling_olmo import OlmoLayerNorm  # noqa: E402
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm  # noqa: E402
from transformers.models.t5.modeling_t5 import T5LayerNorm  # noqa: E402

#: Llama 4's weightless QK norm, by the name the installed transformers gives it (its name
#: until 5.25, Llama4TextL2Norm, is kept there as an alias)
LLAMA4_QK_NORM = getattr(
    modeling_llama4, "Llama4TextWeightlessRMSNorm", modeling_llama4.Llama4TextL2Norm
).__name__

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


_ENCODER = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
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
        # with_scale=False (its value norms): weightless, one scale per member
        {"Gemma3nRMSNorm": ("MemberGemma3nRMSNorm", "MemberUnweightedRMSNorm")},
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
    # recognized by what they compute since their source differs from every known one
    "helium": (  # OLMo-2's cast with the weight in float32: Gemma 3n's formula
        lambda: tf.HeliumForSequenceClassification(tf.HeliumConfig(**_DECODER, head_dim=8)),
        {"HeliumRMSNorm": "MemberGemma3nRMSNorm"},
    ),
    "llama4": (  # its QK norms hold no weight and record no size
        lambda: LastTokenClassifier(
            tf.Llama4TextModel(
                tf.Llama4TextConfig(
                    **_DECODER, intermediate_size_mlp=32, head_dim=8, num_local_experts=2
                )
            )
        ),
        {"Llama4TextRMSNorm": "MemberLlamaRMSNorm", LLAMA4_QK_NORM: "MemberUnweightedRMSNorm"},
    ),
    "deberta": (
        lambda: tf.DebertaForSequenceClassification(tf.DebertaConfig(**_ENCODER)),
        {"DebertaLayerNorm": "MemberDebertaLayerNorm"},
    ),
    "squeezebert": (  # nn.LayerNorm subclasses over the channels of (N, C, W)
        lambda: tf.SqueezeBertForSequenceClassification(
            tf.SqueezeBertConfig(**_ENCODER, embedding_size=16, q_groups=1, k_groups=1)
        ),
        {"SqueezeBertLayerNorm": "MemberLayerNorm2d", "LayerNorm": "MemberLayerNorm"},
    ),
    "imagegpt": (  # an RMS norm in the input's dtype, closest to T5's
        lambda: tf.ImageGPTForImageClassification(
            tf.ImageGPTConfig(
                vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, num_labels=3
            )
        ),
        {"ImageGPTLayerNorm": "MemberT5RMSNorm"},
    ),
    "poolformer": (  # a GroupNorm subclass with one group
        lambda: tf.PoolFormerForImageClassification(
            tf.PoolFormerConfig(
                hidden_sizes=[8, 16],
                depths=[1, 1],
                num_encoder_blocks=2,
                patch_sizes=[7, 3],
                strides=[4, 2],
                padding=[2, 1],
                num_labels=3,
                layer_scale_init_value=1.0,  # HF's 1e-5 leaves the blocks' norms no gradient
            )
        ),
        {"PoolFormerGroupNorm": "MemberGroupNorm"},
    ),
}
#: family -> the plain class of the norms it leaves, refused by name (none since Gemma 3n's
#: value norms, Gemma3nRMSNorm(with_scale=False), and Llama 4's QK norms, weightless and of no
#: recorded size, convert with one scale per member)
REFUSED: dict[str, str] = {}
#: the plain class a member norm's to_plain gives, where it is not the class converted
EXTRACTED_AS = {
    "OlmoLayerNorm": "CohereLayerNorm",
    "PoolFormerGroupNorm": "GroupNorm",
    LLAMA4_QK_NORM: "ScaledRMSNorm",  # a weightless class cannot hold a member's scale
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
    if family in ("convnext", "layernorm2d", "poolformer"):
        key = "x" if family == "layernorm2d" else "pixel_values"
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
    return snens.convert(model, M, skip_unsupported=family in REFUSED or None, generator=generator)


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
        if getattr(norm, "broadcast", False):
            continue  # one scale per member: steps of a few ulps, which may coincide
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
    DebertaLayerNorm: snn.MemberDebertaLayerNorm,
}
HALF = (torch.float32, torch.bfloat16, torch.float16)


def _random_hf_norm(cls, C=24, dtype=torch.float32, seed=0):
    if cls is OlmoLayerNorm:
        return OlmoLayerNorm(C)  # no parameters; eps is its forward's constant, 1e-5
    g = torch.Generator().manual_seed(seed)
    plain = cls(C, eps=1e-6)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.5 * torch.randn(C, generator=g))
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
                DebertaLayerNorm,
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
    rounding of the output (DeBERTa's: also of bias/σ(γ_m), relative to the output's scale
    where w·x̂ + b cancels)."""
    plain = _random_hf_norm(cls, dtype=param_dtype)
    member = _convert(plain).eval()
    x = (3 * torch.randn(B, 5, 24)).to(input_dtype)
    with torch.no_grad():
        ref = plain(x)
        out = member(x.repeat(M, 1, 1)).unflatten(0, (M, -1))
        assert out.dtype == ref.dtype
        rounding = 2 * torch.finfo(param_dtype).eps + torch.finfo(out.dtype).eps
        exact = 0.0 if cls is not GemmaRMSNorm else rounding
        scale = ref.abs().max().item() if cls is DebertaLayerNorm else 1e-2
        for m in range(M):
            back = member.to_plain(m)
            assert type(back) is cls and back.weight.dtype == param_dtype
            torch.testing.assert_close(out[m], back(x), rtol=exact, atol=exact * 1e-2)
            torch.testing.assert_close(
                out[m].float(), ref.float(), rtol=rounding, atol=max(1e-6, rounding * scale)
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


def test_a_weightless_gemma3n_norm_converts_with_one_scale_per_member():
    """Gemma3nRMSNorm(with_scale=False) holds no weight and does not record its size: its
    member holds one scale per member, from 1 (σ(γ)·w with w = 1/σ(γ)), broadcast over the
    features, so every member reproduces it; extracted, it is a ScaledRMSNorm."""
    weightless = Gemma3nRMSNorm(8, with_scale=False)
    assert refusal(weightless) is None
    assert type(_convert(Gemma3nRMSNorm(8))) is snn.MemberGemma3nRMSNorm
    model = nn.Sequential(nn.Linear(4, 8), weightless, nn.LayerNorm(8)).eval()
    x = torch.randn(B, 4)
    with torch.no_grad():
        ref = model(x)
        ens = snens.convert(model, M, skip_unsupported=False).eval()
        out = ens(x)
    assert ens.report.skipped == ()
    assert type(ens.model[1]) is snn.MemberUnweightedRMSNorm
    assert ens.model[1].gamma.shape == (M, 1)
    for m in range(M):
        torch.testing.assert_close(out[m], ref, **NORM_TOL)
        member = snens.extract_member(ens, m)
        assert type(member[1]) is snn.ScaledRMSNorm
        torch.testing.assert_close(member(x), out[m], **NORM_TOL)


@pytest.mark.parametrize("data_format", ["channels_first", "channels_last"])
def test_convnext_layer_norm_is_recognised_by_what_it_computes(data_format):
    plain = ConvNextLayerNorm(8, eps=1e-6, data_format=data_format)
    _randomize_norms(plain)
    member = _convert(plain).eval()
    expected = snn.MemberLayerNorm2d if data_format == "channels_first" else snn.MemberLayerNorm
    assert type(member) is expected
    x = torch.randn(B, 8, 4, 5) if data_format == "channels_first" else torch.randn(B, 4, 5, 8)
    with torch.no_grad():
        out = member(x.repeat(M, 1, 1, 1)).unflatten(0, (M, -1))
        for m in range(M):
            torch.testing.assert_close(out[m], plain(x), **NORM_TOL)
            back = member.to_plain(m)
            torch.testing.assert_close(out[m], back(x), rtol=1e-6, atol=1e-6)
    if data_format == "channels_first":
        assert type(back) is ConvNextLayerNorm and back.data_format == "channels_first"


def test_layer_norm_2d_member_names_the_channels_it_wants():
    member = _convert(_randomize_norms(LayerNorm2d(6)))
    with pytest.raises(ValueError, match="6 channels at dim 1"):
        member(torch.randn(M * B, 3, 4, 6))


def test_recognition_is_by_what_a_module_computes_not_its_source():
    """Copies of Hugging Face norms convert whatever their source, where they compute a
    supported formula; edited ones that compute something else are refused by name."""

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

    matrix_weight = LlamaRMSNorm(8)  # Llama's formula with a weight per (head, feature)
    matrix_weight.weight = nn.Parameter(torch.ones(2, 8))
    with_bias = CohereLayerNorm(8)  # Cohere's forward ignores a bias: state beyond its own
    with_bias.bias = nn.Parameter(torch.zeros(8))

    converts = {
        MyLlamaRMSNorm(8): (snn.MemberLlamaRMSNorm, 1e-6),
        OlmoStyleRMSNorm(8): (snn.MemberOlmo2RMSNorm, 1e-6),  # Olmo2RMSNorm's formula
        SqrtRMSNorm(8): (snn.MemberOlmo2RMSNorm, 1e-6),  # within a rounding of it
        OlmoLayerNorm(8): (snn.MemberOlmoLayerNorm, 1e-5),  # the constant in its forward
        Eps6OlmoLayerNorm(8): (snn.MemberOlmoLayerNorm, 1e-6),
        CohereLayerNorm((2, 8)): (snn.MemberCohereLayerNorm, 1e-5),
        matrix_weight: (snn.MemberLlamaRMSNorm, 1e-6),
    }
    for module, (member_type, eps) in converts.items():
        convert = member_converter(module)
        assert (convert.args, convert.keywords) == ((member_type,), {"eps": eps}), module
    for unknown in (EditedLlamaRMSNorm(8), with_bias, HalfLayerNorm2d(8)):
        name = type(unknown).__name__
        assert member_converter(unknown) is None
        assert refusal(unknown).startswith(f"{name} computes none of the supported formulas")
        model = nn.Sequential(nn.Linear(4, 8), unknown, nn.LayerNorm(8))
        with pytest.raises(TypeError, match=rf"1 \({name}\).*register_norm\({name}"):
            snens.convert(model, 2, skip_unsupported=False)
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
    ("norm", "registration", "probed"),
    [
        (ScaleRMSNorm, {"member_type": snn.MemberRMSNorm}, snn.MemberT5RMSNorm),
        (GainOffsetNorm, {"from_plain": gain_offset_to_members}, None),
    ],
    ids=["member_type", "from_plain"],
)
def test_register_norm_converts_a_user_norm_in_one_line(norm, registration, probed):
    """A norm the probe does not recognize (its affine named gain and offset) is refused until
    registered; one it recognizes (an RMS norm computed in the input's dtype, closest to T5's)
    converts, and registration overrides its choice."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), norm(8), nn.GELU(), nn.Linear(8, 3)).eval()
    x = torch.randn(B, 6)
    name = norm.__name__
    if probed is None:
        with pytest.raises(TypeError, match=rf"1 \({name}\).*register_norm\({name}"):
            snens.convert(model, M, skip_unsupported=False)
    else:
        assert snens.convert(model, M).report.converted[0][1:] == (name, probed.__name__)
    snn.register_norm(norm, **registration)
    with torch.no_grad():
        ref = model(x)
        ens = snens.convert(model, M).eval()
        out = ens(x)
        for m in range(M):
            torch.testing.assert_close(out[m], ref, **NORM_TOL)
            torch.testing.assert_close(snens.extract_member(ens, m)(x), out[m], **NORM_TOL)
    assert ens.report.converted[0][1] == name and ens.report.skipped == ()
    if probed is not None:
        assert ens.report.converted[0][2] == registration["member_type"].__name__


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


# -- norms recognized by what they compute, and those refused -----------------------------------
def _cpmant_norm(C):
    from transformers.models.cpmant.modeling_cpmant import CpmAntLayerNorm

    return CpmAntLayerNorm(tf.CpmAntConfig(hidden_size=C, eps=1e-6))


def _hf_class(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(__import__(f"transformers.models.{module}", fromlist=[name]), name)


#: norm -> (build it with C features, the member class reproducing it); none has a source
#: snens knew before it recognized norms by what they compute
RECOGNIZED = {
    "HeliumRMSNorm": (lambda C: _hf_class("helium.modeling_helium.HeliumRMSNorm")(C), "Gemma3n"),
    "NemotronHRMSNorm": (
        lambda C: _hf_class("nemotron_h.modeling_nemotron_h.NemotronHRMSNorm")(C),
        "Gemma3n",
    ),
    "Llama4TextRMSNorm": (
        lambda C: _hf_class("llama4.modeling_llama4.Llama4TextRMSNorm")(C),
        "Llama",
    ),
    "DebertaLayerNorm": (
        lambda C: _hf_class("deberta.modeling_deberta.DebertaLayerNorm")(C),
        "Deberta",
    ),
    "ImageGPTLayerNorm": (
        lambda C: _hf_class("imagegpt.modeling_imagegpt.ImageGPTLayerNorm")(C),
        "T5",
    ),
    "CpmAntLayerNorm": (_cpmant_norm, "Llama"),
}


@pytest.mark.parametrize("name", RECOGNIZED)
def test_norms_recognized_by_what_they_compute_convert_exactly(name):
    """Every member reproduces the plain module: float32 to 1e-6, bfloat16 (parameters and
    input) to one rounding of its output; ``to_plain`` gives the module's own class back, or
    says why it cannot (CpmAntLayerNorm is built from a whole config)."""
    make, formula = RECOGNIZED[name]
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2 * 2**-7)):
        plain = make(24)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # ImageGPT's and CPM-Ant's weights start uninitialized
            for p in plain.parameters():
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
        plain = plain.to(dtype)
        member = _convert(plain).eval()
        assert type(member).__name__.startswith(f"Member{formula}")
        x = (3 * torch.randn(B, 5, 24)).to(dtype)
        with torch.no_grad():
            out = member(x.repeat(M, 1, 1)).unflatten(0, (M, -1))
            for m in range(M):
                torch.testing.assert_close(out[m], plain(x), rtol=tol, atol=tol)
    if name == "CpmAntLayerNorm":
        with pytest.raises(TypeError, match=r"cannot rebuild CpmAntLayerNorm\(24"):
            member.to_plain(0)
    else:
        assert type(member.to_plain(0)) is type(plain)


def test_a_cpmant_model_converts_exactly():
    torch.manual_seed(0)
    config = tf.CpmAntConfig(
        vocab_size=128, hidden_size=16, num_attention_heads=2, dim_head=8, dim_ff=32,
        num_hidden_layers=2,
    )  # fmt: skip
    model = _randomize_norms(tf.CpmAntForCausalLM(config).eval())
    ids = torch.randint(3, 128, (B, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        ens = snens.convert(model, M).eval()
        out = ens(input_ids=ids)
    assert {member for _, _, member in ens.report.converted} == {"MemberLlamaRMSNorm"}
    for m in range(M):
        torch.testing.assert_close(out[m], ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


#: model -> (build it, the norm class refused, why)
REFUSED_MODELS = {
    "ibert": (
        lambda: tf.IBertForSequenceClassification(tf.IBertConfig(**_ENCODER)),
        "IntLayerNorm",
        r"holds submodules \(activation\)",
    ),
    "mobilebert": (
        lambda: tf.MobileBertForSequenceClassification(
            tf.MobileBertConfig(**_ENCODER, embedding_size=16, intra_bottleneck_size=16)
        ),
        "NoNorm",
        "computes none of the supported formulas",
    ),
    "bit": (
        lambda: tf.BitForImageClassification(
            tf.BitConfig(embedding_size=8, hidden_sizes=[32, 64], depths=[1, 1], num_groups=4)
        ),
        "BitGroupNormActivation",
        r"holds submodules \(activation\)",
    ),
}


@pytest.mark.parametrize("name", REFUSED_MODELS)
def test_models_with_norms_no_member_version_computes_are_refused_by_name(name):
    build, norm, why = REFUSED_MODELS[name]
    torch.manual_seed(0)
    with pytest.raises(TypeError, match=rf"\({norm}\).*\. {norm} {why}.*register_norm\({norm}"):
        snens.convert(build(), M, skip_unsupported=False)


#: model -> (build it, the norm class it once refused, its member class): gated RMS norms
#: (forward(x, gate)) and F.layer_norm with the weight 1 + w
FORMERLY_REFUSED_MODELS = {
    "nemotron": (
        lambda: tf.NemotronForSequenceClassification(tf.NemotronConfig(**_DECODER, head_dim=8)),
        "NemotronLayerNorm1P",
        "MemberLayerNorm1P",
    ),
    "nemotron_h": (
        lambda: tf.NemotronHForCausalLM(
            tf.NemotronHConfig(
                vocab_size=64,
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=8,
                mamba_num_heads=2,
                mamba_head_dim=16,
                ssm_state_size=8,
                n_groups=1,
                intermediate_size=32,
                layers_block_type=["mamba", "attention"],
                pad_token_id=0,
            )
        ),  # fmt: skip
        "NemotronHRMSNormGated",
        "MemberGateFirstRMSNorm",
    ),
    "mamba2": (  # gate first, over 2 groups of 16
        lambda: tf.Mamba2ForCausalLM(
            tf.Mamba2Config(
                vocab_size=64,
                hidden_size=16,
                num_hidden_layers=2,
                num_heads=4,
                head_dim=8,
                expand=2,
                n_groups=2,
                state_size=8,
                chunk_size=8,
            )
        ),  # fmt: skip
        ("MambaRMSNormGated", "Mamba2RMSNormGated"),  # renamed in transformers 5.25
        "MemberGateFirstRMSNorm",
    ),
    "bamba": (
        lambda: tf.BambaForCausalLM(
            tf.BambaConfig(
                vocab_size=64,
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=32,
                mamba_n_heads=4,
                mamba_d_head=8,
                mamba_expand=2,
                mamba_n_groups=1,
                mamba_d_state=8,
                attn_layer_indices=[1],
                mamba_chunk_size=8,
            )
        ),  # fmt: skip
        "BambaRMSNormGated",
        "MemberGateFirstRMSNorm",
    ),
    "kimi_linear": (  # the norm, the weight in float32, then a sigmoid gate
        lambda: tf.KimiLinearForCausalLM(
            tf.KimiLinearConfig(
                vocab_size=64,
                pad_token_id=0,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=64,
                linear_attn_config={
                    "full_attn_layers": [2],
                    "kda_layers": [1],
                    "num_heads": 2,
                    "head_dim": 16,
                    "short_conv_kernel_size": 4,
                },
                num_experts=4,
                moe_intermediate_size=32,
                num_experts_per_token=2,
                first_k_dense_replace=2,
            )
        ),  # fmt: skip
        "KimiLinearRMSNormGated",
        "MemberGatedRMSNormF32",
    ),
}


@pytest.mark.parametrize("name", FORMERLY_REFUSED_MODELS)
def test_models_with_gated_and_one_plus_weight_norms_convert_exactly(name):
    build, norm, member = FORMERLY_REFUSED_MODELS[name]
    torch.manual_seed(0)
    model = _randomize_norms(build().eval())
    ids = torch.randint(2, 64, (B, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = _logits(model(input_ids=ids))
        ens = snens.convert(model, M, skip_unsupported=False).eval()
        out = ens(input_ids=ids)
    names = (norm,) if isinstance(norm, str) else norm  # the class's name in each release
    converted = {(plain, kind) for _, plain, kind in ens.report.converted}
    assert any((n, member) in converted for n in names), converted
    assert ens.report.skipped == ()
    for m in range(M):
        torch.testing.assert_close(out[m], ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
