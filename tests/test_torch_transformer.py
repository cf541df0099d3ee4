"""torch's own transformer layers convert, and evaluate through the member norms and layers.

``nn.TransformerEncoderLayer`` in eval mode with autograd off hands ``norm1.weight`` to a
fused kernel instead of calling the norm, and ``nn.TransformerEncoder`` packs padded batches
into nested tensors for it, applying no dropout (``snens.nn.torch_fast_paths``). Each test
diversifies the members first, so a path that skipped them, or ran one member for all, would
fail; the baselines that replace a layer's submodules (BatchEnsemble, FiLM, MC-dropout) too.
"""

import pytest
import torch
from torch import nn

import snens
from snens.baselines import MCDropout, batch_ensemble, film
from snens.nn.norms import MemberNorm

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")

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
