"""The (B, …) -> (M, B, K) contract: repeated and split inputs, loss, probabilities, members."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens

from conftest import TinyResNet, randomize_norms

M = 4
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _diversify(ens: snens.Ensemble, seed: int = 0) -> snens.Ensemble:
    """Make the members differ, as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ens.named_parameters():
            if name.endswith(("gamma", "weight", "bias")) and p.dim() >= 2 and p.shape[0] == M:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return ens


@pytest.fixture
def ens(resnet):
    return _diversify(snens.convert(resnet, num_members=M))


def test_split_gives_member_m_its_own_slice(ens):
    ens.train()
    ens.input_policy = "split"
    x = torch.randn(8, 3, 8, 8)
    out = ens(x)
    assert out.shape == (M, 2, 5)
    for m in range(M):
        member = snens.extract_member(ens, m).train()
        torch.testing.assert_close(out[m], member(x[2 * m : 2 * m + 2]), **TOL)
    # evaluation always repeats
    assert ens.eval()(x).shape == (M, 8, 5)


@pytest.mark.parametrize("training", [True, False])
def test_the_ensemble_takes_the_mode_of_the_model_it_converts(training):
    """nn.Module starts in training mode: an ensemble of a model in eval mode read training
    and, with split inputs, gave each member a slice of the batch while its norms evaluated."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).train(training)
    ens = snens.convert(model, num_members=2, input_policy="split")
    assert (ens.training, ens.model.training, ens.model[1].training) == (training,) * 3
    assert ens(torch.randn(4, 4)).shape == ((2, 2, 3) if training else (2, 4, 3))


def test_split_needs_a_batch_divisible_by_members(ens):
    ens.train()
    ens.input_policy = "split"
    with pytest.raises(ValueError, match="divisible by num_members=4, got B=6"):
        ens(torch.randn(6, 3, 8, 8))
    with pytest.raises(ValueError, match="input_policy must be 'repeat' or 'split'"):
        ens.input_policy = "slice"


@pytest.mark.parametrize("training", [True, False])
def test_extract_member_equals_the_ensemble_member(ens, training):
    ens.train(training)
    x = torch.randn(6, 3, 8, 8)
    out = ens(x).detach()
    for m in range(M):
        member = snens.extract_member(ens, m).train(training)
        assert type(member) is TinyResNet
        assert not any(isinstance(mod, snens.nn.MemberNorm) for mod in member.modules())
        torch.testing.assert_close(member(x), out[m], **TOL)


def test_extract_member_from_a_transformer(transformer, text_batch):
    ens = _diversify(snens.convert(transformer, num_members=M)).eval()
    ids, mask = text_batch
    out = ens(ids, attention_mask=mask)
    for m in range(M):
        member = snens.extract_member(ens, m)
        torch.testing.assert_close(member(ids, attention_mask=mask), out[m], **TOL)


def test_extract_member_errors(ens):
    with pytest.raises(ValueError, match="member 4 is out of range for num_members=4"):
        snens.extract_member(ens, 4)
    with pytest.raises(ValueError, match="member -1 is out of range"):
        snens.extract_member(ens, -1)
    with pytest.raises(TypeError, match="member must be an int, got 1.0"):
        snens.extract_member(ens, 1.0)
    with pytest.raises(TypeError, match="expects a snens.Ensemble, got TinyResNet"):
        snens.extract_member(TinyResNet(), 0)


def test_members_are_independent(ens):
    """Perturbing one member's parameters changes only that member's output."""
    ens.eval()
    x = torch.randn(6, 3, 8, 8)
    before = ens(x).detach()
    with torch.no_grad():
        ens.model.layers[1][0].bn2.gamma[2].add_(1.0)
        ens.model.fc.weight[2].mul_(1.5)
    after = ens(x).detach()
    for m in (0, 1, 3):
        torch.testing.assert_close(after[m], before[m], rtol=0, atol=0)
    assert (after[2] - before[2]).abs().max() > 1e-3


def test_one_member_equals_the_plain_model(resnet):
    x = torch.randn(5, 3, 8, 8)
    ens, plain = snens.convert(resnet, num_members=1), copy.deepcopy(resnet)
    for training in (True, False):  # train first: running statistics must move alike
        torch.testing.assert_close(ens.train(training)(x)[0], plain.train(training)(x), **TOL)


def test_state_dict_round_trip_and_other_num_members(ens):
    other = snens.convert(TinyResNet(), num_members=M)
    other.load_state_dict(ens.state_dict())
    x = torch.randn(3, 3, 8, 8)
    torch.testing.assert_close(other.eval()(x), ens.eval()(x), rtol=0, atol=0)
    two = snens.convert(TinyResNet(), num_members=2)
    with pytest.raises(ValueError, match="num_members=4, this one has num_members=2"):
        two.load_state_dict(ens.state_dict())


def test_models_built_with_the_factory():
    norm = snens.nn.member_norm(M)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), norm(4), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(M, 3, 5, 5))  # materialize the lazy head
    ens = snens.Ensemble(model, num_members=M)
    assert ens(torch.randn(3, 3, 5, 5)).shape == (M, 3, 2)
    with pytest.raises(ValueError, match="num_members=4, the ensemble num_members=2"):
        snens.Ensemble(model, num_members=2)
    with pytest.raises(ValueError, match="holds no member norm"):
        snens.Ensemble(nn.Linear(2, 2), num_members=2)


def test_there_is_one_input_path_and_no_replication_argument(resnet):
    """The batch is repeated at the input, always; no option chooses another path."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'replication'"):
        snens.convert(resnet, M, replication="lazy")
    with pytest.raises(TypeError, match="unexpected keyword argument 'replication'"):
        snens.Ensemble(snens.convert(resnet, M).model, M, replication="lazy")


def test_output_selection_and_errors(resnet):
    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = resnet

        def forward(self, x):
            return {"scores": self.net(x)}

    with pytest.raises(TypeError, match="pass output=callable"):
        snens.convert(Wrapped(), M)(torch.randn(2, 3, 8, 8))
    ens = snens.convert(Wrapped(), M, output=lambda out: out["scores"]).eval()
    assert ens(torch.randn(2, 3, 8, 8)).shape == (M, 2, 5)
    with pytest.raises(TypeError, match="holds no tensor"):
        ens(x=None)


def test_ensemble_loss_broadcasts_labels():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(M, 6, 5, generator=g), torch.randint(0, 5, (6,), generator=g)
    expected = sum(F.cross_entropy(logits[m], labels) for m in range(M)) / M
    torch.testing.assert_close(snens.ensemble_loss(logits, labels), expected, **TOL)
    # split: member m is scored on its own slice of the (B,) labels
    split, labels8 = torch.randn(M, 2, 5, generator=g), torch.randint(0, 5, (8,), generator=g)
    expected = sum(F.cross_entropy(split[m], labels8[2 * m : 2 * m + 2]) for m in range(M)) / M
    torch.testing.assert_close(snens.ensemble_loss(split, labels8), expected, **TOL)
    with pytest.raises(ValueError, match="labels of length 7 fit neither"):
        snens.ensemble_loss(logits, torch.zeros(7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected ensemble logits of shape \(M, B, K\)"):
        snens.ensemble_loss(logits[0], labels)


def test_predictive_probs_is_the_mean_of_member_softmaxes():
    logits = torch.tensor([[[0.0, 0.0]], [[2.0, 0.0]]])  # M=2, B=1, K=2
    p1 = 1 / (1 + torch.exp(torch.tensor(-2.0)))
    expected = torch.tensor([[(0.5 + p1) / 2, (0.5 + 1 - p1) / 2]])
    torch.testing.assert_close(snens.predictive_probs(logits), expected, **TOL)
    probs = snens.predictive_probs(torch.randn(M, 3, 5).bfloat16())
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(3), **TOL)


def test_converted_model_keeps_pretrained_weights_in_a_deep_nest():
    model = randomize_norms(
        nn.Sequential(nn.Sequential(nn.Sequential(TinyResNet(num_classes=3)))), seed=4
    ).eval()
    x = torch.randn(4, 3, 8, 8)
    ens = snens.convert(model, M).eval()
    torch.testing.assert_close(ens(x), model(x).expand(M, -1, -1), **TOL)
    assert ens.report.head == "0.0.0.fc"


class TwoInputs(nn.Module):
    """Two image tensors through separate stems, fused before a shared trunk."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.b = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.head = nn.Linear(4, 3)

    def forward(self, x, depth, *, scale=1.0):
        return self.head(scale * (self.a(x) + self.b(depth)).mean(dim=(2, 3)))


def test_several_positional_tensors_and_keywords():
    torch.manual_seed(0)
    model = randomize_norms(TwoInputs()).eval()
    x, depth = torch.randn(5, 3, 6, 6), torch.randn(5, 1, 6, 6)
    ens = snens.convert(model, M).eval()
    out = ens(x, depth, scale=2.0)
    torch.testing.assert_close(out, model(x, depth, scale=2.0).expand(M, -1, -1), **TOL)


def test_names_that_moved_out_of_the_ensemble_module_still_import_from_it():
    import snens.method.ensemble as ensemble_module
    from snens.method import export, loss

    assert ensemble_module.convert is snens.convert
    assert ensemble_module.ensemble_loss is loss.ensemble_loss
    assert ensemble_module.export_onnx is export.export_onnx
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        ensemble_module.nothing_here  # noqa: B018
