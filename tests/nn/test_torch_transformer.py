"""torch's own transformer layers convert, and evaluate through the member norms and layers.

``nn.TransformerEncoderLayer`` in eval mode with autograd off hands ``norm1.weight`` to a
fused kernel instead of calling the norm, and ``nn.TransformerEncoder`` packs padded batches
into nested tensors for it, applying no dropout (``snens.nn.torch_transformers``). Each test
diversifies the members first, so a path that skipped them, or ran one member for all, would
fail; the baselines that replace a layer's submodules (BatchEnsemble, FiLM, MC-dropout) too.

torch's layers are sequence-first by default, (S, M·B, D) inside: their member layers find the
members in dimension 1 (``snens.nn.layout``), and a layout snens cannot see is an error, not a
split of the sequence into members.
"""

import pytest
import torch
from torch import nn

import snens
from snens.baselines import MCDropout, batch_ensemble, film
from snens.nn import sequence_first
from snens.nn.norms import MemberNorm

pytestmark = [
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning"),
]

M, B, S, D = 4, 3, 5, 8
TOL = {"rtol": 1e-5, "atol": 1e-6}


class Encoder(nn.Module):
    """Embedding, a 2-layer torch encoder, the first token's features to 3 classes."""

    def __init__(self, norm_first: bool, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Linear(4, D)
        layer = nn.TransformerEncoderLayer(
            D, 2, 16, dropout, activation=activation, batch_first=True, norm_first=norm_first
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first)
        self.head = nn.Linear(D, 3)

    def forward(self, x, src_key_padding_mask=None):
        features = self.encoder(self.embed(x), src_key_padding_mask=src_key_padding_mask)
        return self.head(features[:, 0])


def diversified(norm_first: bool, activation: str = "relu") -> tuple[nn.Module, snens.Ensemble]:
    torch.manual_seed(0)
    plain = Encoder(norm_first, activation).eval()
    ensemble = snens.convert(plain, num_members=M).eval()
    with torch.no_grad():
        for module in ensemble.modules():
            if isinstance(module, MemberNorm):
                for param in module.parameters():
                    param.add_(torch.randn_like(param))
    return plain, ensemble


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(B, S, 4, generator=torch.Generator().manual_seed(1))
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[0, 3:] = True  # right-padded, as the nested-tensor path requires
    padding[2, 4:] = True
    return x, padding


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
def test_evaluation_without_autograd_runs_every_member(norm_first, masked):
    _, ensemble = diversified(norm_first)
    x, padding = inputs()
    kwargs = {"src_key_padding_mask": padding} if masked else {}
    module_path = ensemble(x, **kwargs).detach()  # autograd on: torch calls every module
    with torch.inference_mode():
        evaluated = ensemble(x, **kwargs)
    torch.testing.assert_close(evaluated, module_path, **TOL)
    assert (module_path[0] - module_path[1]).abs().max() > 0.05  # the members do differ


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_an_extracted_member_gets_the_fast_path_back_and_computes_its_member(norm_first):
    _, ensemble = diversified(norm_first, activation="gelu")
    x, padding = inputs()
    with torch.inference_mode():
        logits = ensemble(x, src_key_padding_mask=padding)
    for member in (0, 3):
        plain = snens.extract_member(ensemble, member)
        layer = plain.encoder.layers[0]
        assert layer.activation_relu_or_gelu == 2  # gelu, as torch set it
        assert plain.encoder.use_nested_tensor is (not norm_first)
        with torch.inference_mode():
            out = plain(x, src_key_padding_mask=padding)
        torch.testing.assert_close(out, logits[member], **TOL)
    # the ensemble itself keeps its module path
    assert ensemble.model.encoder.layers[0].activation_relu_or_gelu == 0


def test_conversion_is_exact_and_the_report_names_the_modules_routed():
    torch.manual_seed(0)
    plain = Encoder(norm_first=False).eval()
    x, padding = inputs()
    with torch.inference_mode():
        reference = plain(x, src_key_padding_mask=padding)
    ensemble = snens.convert(plain, num_members=M).eval()
    with torch.inference_mode():
        logits = ensemble(x, src_key_padding_mask=padding)
    torch.testing.assert_close(logits, reference.expand(M, -1, -1), **TOL)
    (note,) = ensemble.report.notes
    assert "encoder, encoder.layers.0, encoder.layers.1" in note
    assert "fast path is off" in note


def test_a_model_saved_whole_keeps_the_module_path(tmp_path):
    _, ensemble = diversified(norm_first=False)
    x, padding = inputs()
    torch.save(ensemble, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False).eval()
    with torch.inference_mode():
        torch.testing.assert_close(
            loaded(x, src_key_padding_mask=padding),
            ensemble(x, src_key_padding_mask=padding),
            **TOL,
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda model: batch_ensemble(model, M, init_std=0.5),
        lambda model: film(model, M, spread=0.5),
    ],
    ids=["batch_ensemble", "film"],
)
def test_baselines_that_replace_layers_evaluate_them_without_autograd(make):
    torch.manual_seed(0)
    ensemble = make(Encoder(norm_first=False)).eval()
    x, padding = inputs()
    module_path = ensemble(x, src_key_padding_mask=padding).detach()
    with torch.inference_mode():
        evaluated = ensemble(x, src_key_padding_mask=padding)
    torch.testing.assert_close(evaluated, module_path, **TOL)
    assert (module_path[0] - module_path[1]).abs().max() > 0.05


def test_mc_dropout_samples_the_dropout_inside_torch_encoder_layers():
    torch.manual_seed(0)
    model = Encoder(norm_first=False, dropout=0.3)
    sampler = MCDropout(model, M, insert=False).eval()
    x, _ = inputs()
    with torch.inference_mode():
        samples = sampler(x)  # (M, B, 3)
        plain = model.eval()(x)  # the fused kernel: no dropout
    assert (samples[0] - samples[1]).abs().max() > 0.05
    assert all((samples[m] - plain).abs().max() > 0.01 for m in range(M))


class SequenceFirstEncoder(nn.Module):
    """(B, S, 4) inputs, a torch encoder with batch_first=False inside, the first position."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, D)
        layer = nn.TransformerEncoderLayer(D, 2, 16, dropout=0.0)  # batch_first=False
        self.encoder = nn.TransformerEncoder(
            layer, 2, norm=nn.LayerNorm(D), enable_nested_tensor=False
        )
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x).transpose(0, 1))[0])  # (S, B, D) inside


class SequenceFirstSeq2Seq(nn.Module):
    """torch's nn.Transformer (encoder and decoder, sequence-first) on (B, S, 4) inputs."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, D)
        self.transformer = nn.Transformer(D, 2, 1, 1, 16, dropout=0.0)
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        h = self.embed(x).transpose(0, 1)
        return self.head(self.transformer(h, h[:2])[-1])


class OwnSequenceFirstBlock(nn.Module):
    """A block of one's own on (S, B, D): attention, then a LayerNorm snens cannot place."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, D)
        self.attn = nn.MultiheadAttention(D, 2)  # batch_first=False
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        h = self.embed(x).transpose(0, 1)  # (S, B, D)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        return self.head(h[0])


def diversify(ensemble: snens.Ensemble) -> snens.Ensemble:
    with torch.no_grad():
        for module in ensemble.modules():
            if isinstance(module, MemberNorm):
                for param in module.parameters():
                    param.add_(torch.randn_like(param))
    return ensemble


def assert_members_are_their_extracted_models(ensemble: snens.Ensemble, x: torch.Tensor):
    for mode in (torch.enable_grad, torch.inference_mode):
        with mode():
            logits = ensemble(x)
            assert (logits[0] - logits[1]).abs().max() > 0.05
            for member in range(M):
                plain = snens.extract_member(ensemble, member).eval()
                torch.testing.assert_close(plain(x), logits[member], **TOL)


@pytest.mark.parametrize("model", [SequenceFirstEncoder, SequenceFirstSeq2Seq])
def test_sequence_first_torch_transformers_find_the_members_where_the_batch_is(model):
    torch.manual_seed(0)
    ensemble = diversify(snens.convert(model().eval(), num_members=M).eval())
    x, _ = inputs()
    assert_members_are_their_extracted_models(ensemble, x)
    (note,) = [n for n in ensemble.report.notes if n.startswith("sequence-first")]
    if model is SequenceFirstEncoder:
        assert "encoder.layers.0.norm1, encoder.layers.0.norm2" in note
        assert "encoder.norm" in note
    else:  # the decoder's three norms and both stacks' final norms
        assert "transformer.decoder.layers.0.norm3" in note
        assert "transformer.encoder.norm, " in note and "transformer.decoder.norm, " in note


def test_a_layout_snens_cannot_see_is_an_error_and_sequence_first_is_the_fix():
    torch.manual_seed(0)
    ensemble = diversify(snens.convert(OwnSequenceFirstBlock().eval(), num_members=M).eval())
    x, _ = inputs()  # (3, 5, 4): the norm sees (5, 12, 8), and 5 is not a multiple of 12
    with pytest.raises(ValueError, match=r"MemberLayerNorm got a tensor of shape \(5, 12, 8\)"):
        ensemble(x)
    with pytest.raises(ValueError, match=r"snens.nn.sequence_first\(module\)"):
        ensemble(x)


class QueryPool(nn.Module):
    """DETR- or Perceiver-style learned queries: a norm of a tensor with no batch dimension."""

    def __init__(self, queries: int):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(queries, D))
        self.query_norm = nn.LayerNorm(D)
        self.proj = nn.Linear(4, D)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        q, h = self.query_norm(self.queries), self.norm(self.proj(x))  # (Q, D), (B, T, D)
        attention = torch.softmax(q @ h.transpose(1, 2), -1)  # (B, Q, T)
        return self.head((attention @ h).mean(1))


def test_a_norm_of_learned_queries_names_norms_as_the_fix_and_converts_left_shared():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4)
    ensemble = diversify(snens.convert(QueryPool(queries=5).eval(), num_members=M).eval())
    with pytest.raises(ValueError, match=r"no batch dimension .learned queries. stays shared"):
        ensemble(x)
    shared = snens.convert(QueryPool(queries=5).eval(), num_members=M, norms=["norm"]).eval()
    assert [name for name, *_ in shared.report.converted] == ["norm"]
    assert_members_are_their_extracted_models(diversify(shared), x)


def test_sequence_first_marks_a_block_of_ones_own():
    torch.manual_seed(0)
    ensemble = diversify(snens.convert(OwnSequenceFirstBlock().eval(), num_members=M).eval())
    assert sequence_first(ensemble.model.norm) == [""]  # the head sees (B, D): not marked
    assert sequence_first(ensemble.model.norm) == []  # marking twice changes nothing
    x, _ = inputs()
    assert_members_are_their_extracted_models(ensemble, x)
    with pytest.raises(ValueError, match="holds no member layer"):
        sequence_first(nn.Linear(2, 2))


def test_batch_ensemble_of_a_sequence_first_encoder_computes_the_batch_first_one():
    torch.manual_seed(0)
    first = SequenceFirstEncoder().eval()
    batch_first = Encoder(norm_first=False).eval()
    batch_first.encoder.norm = nn.LayerNorm(D)  # the same modules, batch first
    batch_first.load_state_dict(first.state_dict())
    x, _ = inputs()
    reference = batch_ensemble(batch_first, M, generator=torch.Generator().manual_seed(3)).eval()
    ensemble = batch_ensemble(first, M, generator=torch.Generator().manual_seed(3)).eval()
    with torch.inference_mode():
        torch.testing.assert_close(ensemble(x), reference(x), **TOL)
        assert (reference(x)[0] - reference(x)[1]).abs().max() > 0.05


def test_an_empty_batch_passes_the_batch_first_check():
    model = nn.Sequential(nn.Linear(4, D), nn.LayerNorm(D), nn.Linear(D, 3))
    for ensemble in (snens.convert(model, num_members=M), batch_ensemble(model, M)):
        assert ensemble.eval()(torch.zeros(0, 4)).shape == (M, 0, 3)


def test_xlnet_is_sequence_first_inside_refused_then_marked():
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = tf.XLNetConfig(
        num_labels=3, d_model=16, n_layer=2, n_head=2, d_inner=32, vocab_size=50
    )
    ensemble = diversify(
        snens.convert(tf.XLNetForSequenceClassification(config).eval(), num_members=M).eval()
    )
    ids = torch.randint(1, 50, (B, 7), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"shape \(7, 12, 16\).*sequence-first"):
        ensemble(input_ids=ids)
    assert sequence_first(ensemble.model.transformer.layer) == [
        f"{i}.{part}.layer_norm" for i in (0, 1) for part in ("rel_attn", "ff")
    ]
    with torch.inference_mode():
        logits = ensemble(input_ids=ids)
        for member in (0, 3):
            plain = snens.extract_member(ensemble, member)
            torch.testing.assert_close(plain(input_ids=ids).logits, logits[member], **TOL)
    assert (logits[0] - logits[1]).abs().max() > 0.005


def test_an_ensemble_built_from_member_layers_adapts_torchs_modules_too():
    torch.manual_seed(0)
    model = SequenceFirstEncoder().eval()
    for layer in model.encoder.layers:  # member norms at construction, as norm_layer= would
        layer.norm1 = snens.nn.MemberLayerNorm((D,), M)
        layer.norm2 = snens.nn.MemberLayerNorm((D,), M)
    ensemble = diversify(snens.Ensemble(model, M)).eval()
    x, _ = inputs()
    assert_members_are_their_extracted_models(ensemble, x)


def test_a_sequence_first_model_saved_whole_keeps_its_marks(tmp_path):
    torch.manual_seed(0)
    ensemble = diversify(snens.convert(SequenceFirstEncoder().eval(), num_members=M).eval())
    torch.save(ensemble, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False).eval()
    x, _ = inputs()
    assert_members_are_their_extracted_models(loaded, x)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(x), ensemble(x), **TOL)
