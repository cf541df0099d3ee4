"""Baselines: the (M, B, K) contract, member independence, M=1 and pretrained-conversion
invariants, exact layer formulas, pinned parameter counts, and the factory."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens
from snens import baselines, models
from snens.baselines import (
    METHODS,
    BatchEnsembleConv2d,
    BatchEnsembleLinear,
    DeepEnsemble,
    FiLMBatchNorm2d,
    MCDropout,
    MCDropoutLayer,
    PackedConv2d,
    PackedLinear,
    batch_ensemble,
    film,
    film_norm,
    packed_resnet18,
    packed_resnet50,
)

from conftest import TinyResNet, randomize_norms

M = 4
K = 5  # TinyResNet's classes
TOL = {"rtol": 1e-5, "atol": 1e-5}
RESNET18 = 11_173_962  # CIFAR ResNet-18, 10 classes

# ResNet-18 CIFAR, 10 classes, M=4 (counted on the meta device: no memory, no forward).
PINNED_PARAMS = {
    "single": RESNET18,
    "deep_ensemble": 4 * RESNET18,  # 44,695,848
    "batch_ensemble": 11_210_652,  # ×1.0033: r, s per layer and member, member biases on fc
    "packed": 8_175_784,  # α=2, γ=2: ×0.73
    "film": 11_202_762,  # ×1.0026: 3 more affines on each of 4,800 norm channels
    "mc_dropout": RESNET18,
    "snens": 11_237_352,  # ×1.0057: gamma, member affine, 4 heads
}


pytestmark = pytest.mark.usefixtures("one_thread")


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture
def x():
    return torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def _only_member_changed(before: torch.Tensor, after: torch.Tensor, member: int) -> None:
    for m in range(before.shape[0]):
        if m == member:
            assert not torch.allclose(before[m], after[m], **TOL), "the member did not change"
        else:
            torch.testing.assert_close(after[m], before[m], rtol=0, atol=0)


# -- factory and the contract, for every method ---------------------------------------------------


def _build(method: str, resnet: nn.Module) -> nn.Module:
    if method == "packed":
        return baselines.PackedResNet(
            baselines.PackedBasicBlock, (1, 1, 1, 1), num_classes=K, num_members=M
        )
    return baselines.create(method, resnet, num_members=None if method == "single" else M)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("training", [True, False])
def test_every_method_returns_member_logits_that_train(method, training, resnet, x):
    net = _build(method, resnet).train(training)
    logits = net(x)
    members = 1 if method == "single" else M
    # MC-dropout trains as the plain model: one dropout sample per step, M in evaluation
    samples = 1 if method == "mc_dropout" and training else members
    assert logits.shape == (samples, x.shape[0], K)
    assert net.num_members == members
    probs = snens.predictive_probs(logits)
    torch.testing.assert_close(probs.sum(-1), torch.ones(x.shape[0]), **TOL)
    loss = snens.ensemble_loss(logits, torch.tensor([0, 1, 2]))
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("method", METHODS)
def test_parameter_counts_of_resnet18_at_four_members_are_pinned(method):
    with torch.device("meta"):
        net = baselines.create(method, "resnet18", num_classes=10, num_members=None)
    assert num_params(net) == PINNED_PARAMS[method]


def test_factory_by_name_passes_backbone_options_and_method_options(x):
    net = baselines.create(
        "batch_ensemble",
        "small_cnn",
        num_classes=3,
        num_members=2,
        backbone_options={"in_channels": 3, "width": 4},
        init_std=0.0,
    )
    assert net(x).shape == (2, 3, 3)
    assert all(torch.equal(m.r, torch.ones_like(m.r)) for m in net.modules() if hasattr(m, "r"))
    packed = baselines.create("packed", "resnet18", num_classes=7, num_members=2, alpha=1, gamma=1)
    assert packed.num_members == 2 and packed.fc.out_features == 2 * 7


def test_factory_errors_say_what_is_allowed(resnet):
    with pytest.raises(ValueError, match="deep_ensemble, batch_ensemble, packed, film"):
        baselines.create("ensemble", resnet)
    with pytest.raises(ValueError, match="one member"):
        baselines.create("single", resnet, num_members=4)
    with pytest.raises(ValueError, match="one of resnet18, resnet50, small_cnn"):
        baselines.create("packed", resnet)
    with pytest.raises(ValueError, match="one of resnet18, resnet50, small_cnn"):
        baselines.create("packed", "wrn28_10")
    with pytest.raises(TypeError, match="model name"):
        baselines.create("film", 3)


def test_factory_leaves_a_given_backbone_unchanged(resnet, x):
    reference = resnet(x)
    for method in ("batch_ensemble", "film", "mc_dropout", "snens", "deep_ensemble"):
        baselines.create(method, resnet, num_members=2)
    assert all(type(m) is not BatchEnsembleConv2d for m in resnet.modules())
    torch.testing.assert_close(resnet(x), reference, rtol=0, atol=0)


# -- deep ensemble --------------------------------------------------------------------------------


def test_deep_ensemble_members_are_independently_and_reproducibly_initialized():
    state = torch.get_rng_state()
    a = DeepEnsemble(lambda: TinyResNet(), 3, seed=7)
    b = DeepEnsemble(lambda: TinyResNet(), 3, seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is untouched
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    w = [m.stem[0].weight for m in a.members]
    assert not torch.allclose(w[0], w[1]) and not torch.allclose(w[1], w[2])
    torch.manual_seed(3)
    c = DeepEnsemble(lambda: TinyResNet(), 2)
    torch.manual_seed(3)
    d = DeepEnsemble(lambda: TinyResNet(), 2)
    assert c.seed == d.seed
    torch.testing.assert_close(c.members[1].fc.weight, d.members[1].fc.weight, rtol=0, atol=0)


@pytest.mark.parametrize("training", [True, False])
def test_deep_ensemble_of_one_is_the_model(resnet, x, training):
    plain = copy.deepcopy(resnet).train(training)
    ens = DeepEnsemble([copy.deepcopy(resnet)]).train(training)
    torch.testing.assert_close(ens(x)[0], plain(x), rtol=0, atol=0)


def test_deep_ensemble_perturbing_member_parameters_changes_only_that_member(x):
    ens = DeepEnsemble(lambda: TinyResNet(), M, seed=0).train()
    before = ens(x).detach()
    with torch.no_grad():
        ens.members[2].layers[0][0].conv1.weight.add_(0.5)
    _only_member_changed(before, ens(x).detach(), 2)


def test_deep_ensemble_vmap_matches_the_loop_in_outputs_gradients_and_statistics(x):
    loop = DeepEnsemble(lambda: TinyResNet(), 3, seed=1)
    vec = copy.deepcopy(loop)
    vec.vectorize = True
    for training in (True, False):
        loop.train(training), vec.train(training)
        out_loop, out_vec = loop(x), vec(x)
        torch.testing.assert_close(out_vec, out_loop, rtol=1e-4, atol=1e-5)
    loop.train(), vec.train()
    loop(x).square().sum().backward()
    vec(x).square().sum().backward()
    for (name, p_loop), p_vec in zip(loop.named_parameters(), vec.parameters()):
        torch.testing.assert_close(p_vec.grad, p_loop.grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, b_loop), b_vec in zip(loop.named_buffers(), vec.buffers()):
        torch.testing.assert_close(b_vec, b_loop, rtol=1e-4, atol=1e-5, msg=name)
    assert vec.members[0].stem[1].num_batches_tracked.item() == 2
    assert not any("skeleton" in k for k in vec.state_dict())


def test_deep_ensemble_argument_errors(resnet):
    with pytest.raises(ValueError, match="needs num_members"):
        DeepEnsemble(lambda: TinyResNet())
    with pytest.raises(ValueError, match="2 models were given"):
        DeepEnsemble([TinyResNet(), TinyResNet()], num_members=3)
    with pytest.raises(TypeError, match="list of models"):
        DeepEnsemble(resnet)


# -- BatchEnsemble --------------------------------------------------------------------------------


def test_batch_ensemble_layers_compute_the_rank_one_member_weights():
    g = torch.Generator().manual_seed(0)
    lin = BatchEnsembleLinear(6, 4, num_members=3)
    conv = BatchEnsembleConv2d(4, 6, 3, num_members=3, padding=1, groups=2)
    x_lin = torch.randn(3 * 2, 6, generator=g)
    x_conv = torch.randn(3 * 2, 4, 5, 5, generator=g)
    out_lin, out_conv = lin(x_lin), conv(x_conv)
    for m in range(3):
        rows = slice(2 * m, 2 * m + 2)
        w = lin.weight * torch.outer(lin.s[m], lin.r[m])  # W_m = W ⊙ s_m r_mᵀ
        torch.testing.assert_close(out_lin[rows], F.linear(x_lin[rows], w, lin.bias[m]), **TOL)
        # grouped: output channel o (group o // 3) reads input channels 2·(o // 3) + (0, 1)
        r_in = torch.stack([conv.r[m][2 * (o // 3) : 2 * (o // 3) + 2] for o in range(6)])
        w = conv.weight * conv.s[m].reshape(6, 1, 1, 1) * r_in.reshape(6, 2, 1, 1)
        want = F.conv2d(x_conv[rows], w, conv.bias[m], padding=1, groups=2)
        torch.testing.assert_close(out_conv[rows], want, **TOL)


def test_batch_ensemble_fast_weights_follow_the_paper_initialization():
    layer = BatchEnsembleLinear(512, 512, num_members=8)
    for p in (layer.r, layer.s):
        assert abs(p.mean().item() - 1.0) < 0.02 and abs(p.std().item() - 0.5) < 0.02
    signs = BatchEnsembleConv2d(64, 64, 3, num_members=4, random_sign=True)
    assert set(signs.r.unique().tolist()) == {-1.0, 1.0}
    assert 0.4 < (signs.s > 0).float().mean().item() < 0.6


def test_batch_ensemble_conversion_keeps_pretrained_weights_of_a_nested_model(resnet, x):
    reference = resnet(x)
    ens = batch_ensemble(resnet, M, init_std=0.0).eval()
    out = ens(x)
    for m in range(M):  # r = s = 1: every member is the pretrained model
        torch.testing.assert_close(out[m], reference, **TOL)
    plain = dict(resnet.named_modules())
    for name, layer in ens.model.named_modules():
        if isinstance(layer, (BatchEnsembleConv2d, BatchEnsembleLinear)):
            torch.testing.assert_close(layer.weight, plain[name].weight, rtol=0, atol=0)
    assert isinstance(ens.model.layers[1][0].shortcut[0], BatchEnsembleConv2d)
    assert len(ens.report.converted) == 7 and ens.report.head == "fc"
    assert ens.report.params_added == num_params(ens) - num_params(resnet)
    fast = (BatchEnsembleConv2d, BatchEnsembleLinear)
    assert not any(isinstance(m, fast) for m in resnet.modules())  # the input is untouched


@pytest.mark.parametrize("training", [True, False])
def test_batch_ensemble_of_one_with_unit_fast_weights_is_the_model(resnet, x, training):
    plain = copy.deepcopy(resnet).train(training)
    ens = batch_ensemble(resnet, 1, init_std=0.0).train(training)
    torch.testing.assert_close(ens(x)[0], plain(x), **TOL)


def test_batch_ensemble_members_are_independent_in_eval_and_share_norm_statistics_in_training(
    resnet, x
):
    ens = batch_ensemble(resnet, M, generator=torch.Generator().manual_seed(0)).eval()
    before = ens(x).detach()
    with torch.no_grad():
        ens.model.layers[0][0].conv2.r[1].mul_(1.5)
    _only_member_changed(before, ens(x).detach(), 1)
    ens.train()  # shared BatchNorm: batch statistics mix the members, as in the paper
    before = ens(x).detach()
    with torch.no_grad():
        ens.model.layers[0][0].conv2.r[1].mul_(1.5)
    assert not torch.allclose(ens(x).detach()[0], before[0])


def test_batch_ensemble_keeps_tied_weights_and_skips_attention_projections(transformer):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight
            self.again = self.a  # one module under two names

        def forward(self, x):
            return self.b(self.again(x))

    ens = batch_ensemble(Tied(), 2)
    assert ens.model.a is ens.model.again and ens.model.a.weight is ens.model.b.weight
    assert ens(torch.randn(3, 4)).shape == (2, 3, 4)

    ids = torch.randint(0, 50, (5, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[1, 4:] = 0
    reference = transformer(ids, attention_mask=mask)
    ens = batch_ensemble(transformer, 3, init_std=0.0).eval()
    out = ens(ids, attention_mask=mask)
    for m in range(3):
        torch.testing.assert_close(out[m], reference, **TOL)
    out_proj = ens.model.blocks[0].attn.out_proj
    assert type(out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear


def test_batch_ensemble_errors():
    with pytest.raises(ValueError, match="no nn.Conv2d or nn.Linear"):
        batch_ensemble(nn.Sequential(nn.ReLU()), 2)
    with pytest.raises(ValueError, match="M·B rows"):
        BatchEnsembleLinear(3, 2, num_members=4)(torch.randn(6, 3))


# -- Packed-Ensembles -----------------------------------------------------------------------------


def test_packed_parameter_counts_and_group_lowering_are_pinned():
    with torch.device("meta"):
        r18, r50 = packed_resnet18(10), packed_resnet50(10)
    assert num_params(r18) == 8_175_784  # 0.73 × ResNet-18
    assert num_params(r50) == 14_552_232  # 0.62 × ResNet-50 (the paper: 14.6 M)
    assert (r18.conv1.in_channels, r18.conv1.out_channels, r18.conv1.groups) == (3, 128, 1)
    # 64·α/M = 32 channels per member: γ lowered to 1 (< 64 per group); 128 per member: γ = 2
    assert r18.layer1[0].conv2.groups == 4 and r18.layer2[0].conv2.groups == 4
    assert r18.layer3[0].conv2.groups == 8 and r18.layer4[0].conv2.groups == 8
    assert r18.layer4[0].conv1.groups == 4  # a block's first convolution: γ = 1
    assert (r18.fc.in_features, r18.fc.out_features, r18.fc.groups) == (1024, 40, 4)


def test_packed_ensemble_of_one_unwidened_member_is_the_plain_resnet(x):
    torch.manual_seed(0)
    plain = randomize_norms(models.create("resnet18", num_classes=K))
    packed = packed_resnet18(K, num_members=1, alpha=1, gamma=1)
    assert num_params(packed) == num_params(plain)
    state = {k: v.reshape(packed.state_dict()[k].shape) for k, v in plain.state_dict().items()}
    packed.load_state_dict(state)
    for training in (True, False):
        plain.train(training), packed.train(training)
        torch.testing.assert_close(packed(x)[0], plain(x), **TOL)


def test_packed_members_are_independent_even_in_training(x):
    net = baselines.PackedResNet(
        baselines.PackedBasicBlock, (1, 1, 1, 1), num_classes=K, num_members=M
    ).train()
    before = net(x).detach()
    conv = net.layer2[0].conv1
    width = conv.out_channels // M
    with torch.no_grad():
        conv.weight[2 * width : 3 * width].add_(0.1)  # member 2's output channels
    _only_member_changed(before, net(x).detach(), 2)


def test_packed_first_layer_is_each_member_reading_its_own_copy_of_the_input(x):
    first = PackedConv2d(3, 16, 3, num_members=M, padding=1, first=True)
    grouped = nn.Conv2d(M * 3, first.out_channels, 3, padding=1, groups=M, bias=True)
    with torch.no_grad():
        grouped.weight.copy_(first.weight)
        grouped.bias.copy_(first.bias)
    torch.testing.assert_close(first(x), grouped(x.repeat(1, M, 1, 1)), **TOL)


def test_packed_linear_is_block_diagonal():
    layer = PackedLinear(8, 6, num_members=2, alpha=2, gamma=2)
    assert layer.groups == 4
    dense = torch.block_diag(*layer.weight)  # (M·k, M·d) with zeros between groups
    xin = torch.randn(5, layer.in_features)
    torch.testing.assert_close(layer(xin), F.linear(xin, dense, layer.bias), **TOL)


def test_packed_small_cnn_of_one_unwidened_member_is_the_plain_small_cnn():
    torch.manual_seed(0)
    plain = randomize_norms(models.create("small_cnn", num_classes=K, in_channels=1, width=8))
    packed = baselines.packed_small_cnn(K, in_channels=1, width=8, num_members=1, alpha=1, gamma=1)
    assert num_params(packed) == num_params(plain)
    state = {k: v.reshape(packed.state_dict()[k].shape) for k, v in plain.state_dict().items()}
    packed.load_state_dict(state)
    images = torch.randn(6, 1, 28, 28)
    for training in (True, False):
        plain.train(training), packed.train(training)
        torch.testing.assert_close(packed(images)[0], plain(images), **TOL)


def test_packed_small_cnn_members_are_independent_and_counted():
    torch.manual_seed(0)
    options = {"in_channels": 1, "width": 16}
    net = baselines.create(
        "packed", "small_cnn", num_classes=K, num_members=M, backbone_options=options
    ).train()
    # α=2, M=4, w=16: 8, 16, 32 channels per member; every group < 64 inputs, so γ → 1
    assert [net.stage1[0][0].out_channels, net.stage3[1][0].out_channels] == [32, 128]
    assert net.stage2[1][0].groups == M and net.stage1[0][0].groups == 1
    # convs 288 + 2,304 + 4,608 + 9,216 + 18,432 + 36,864; norms 2·448; head M·K·32 + M·K
    assert num_params(net) == 71_712 + 896 + M * K * 32 + M * K
    images = torch.randn(5, 1, 28, 28)
    before = net(images).detach()
    assert before.shape == (M, 5, K)
    conv = net.stage2[0][0]
    width = conv.out_channels // M
    with torch.no_grad():
        conv.weight[1 * width : 2 * width].add_(0.1)  # member 1's output channels
    _only_member_changed(before, net(images).detach(), 1)


def test_packed_argument_errors():
    with pytest.raises(ValueError, match="alpha"):
        packed_resnet18(alpha=0)
    with pytest.raises(ValueError, match="gamma"):
        packed_resnet18(gamma=0)


# -- FiLM-Ensemble --------------------------------------------------------------------------------


def test_film_conversion_keeps_pretrained_norms_of_a_nested_model(resnet, x):
    reference = resnet(x)
    ens = film(resnet, M, spread=0.0).eval()
    out = ens(x)
    for m in range(M):
        torch.testing.assert_close(out[m], reference, **TOL)
    bn, member = resnet.layers[1][0].shortcut[1], ens.model.layers[1][0].shortcut[1]
    assert isinstance(member, FiLMBatchNorm2d)
    for m in range(M):
        torch.testing.assert_close(member.weight[m], bn.weight, rtol=0, atol=0)
        torch.testing.assert_close(member.running_var[m], bn.running_var, rtol=0, atol=0)
    assert isinstance(ens.model.fc, nn.Linear)  # the head is shared
    assert ens.report.params_added == (M - 1) * sum(
        m.weight.numel() + m.bias.numel() for m in resnet.modules() if isinstance(m, nn.BatchNorm2d)
    )
    assert all(
        type(m) is nn.BatchNorm2d for m in resnet.modules() if "BatchNorm" in type(m).__name__
    )


@pytest.mark.parametrize("training", [True, False])
def test_film_of_one_with_plain_affine_is_the_model(resnet, x, training):
    plain = copy.deepcopy(resnet).train(training)
    ens = film(resnet, 1, spread=0.0).train(training)
    torch.testing.assert_close(ens(x)[0], plain(x), **TOL)


@pytest.mark.parametrize("training", [True, False])
def test_film_perturbing_one_members_affine_changes_only_that_member(resnet, x, training):
    ens = film(resnet, M, generator=torch.Generator().manual_seed(0)).train(training)
    before = ens(x).detach()
    with torch.no_grad():
        ens.model.layers[0][0].bn1.weight[3].mul_(1.5)
    _only_member_changed(before, ens(x).detach(), 3)


def test_film_norm_is_a_member_norm_with_importance_fixed_at_one(resnet, x):
    ens = film(resnet, M)
    assert not any(name.endswith("gamma") for name, _ in ens.named_parameters())
    layer = ens.model.stem[1]
    torch.testing.assert_close(layer.importances(), torch.ones(M, 8), rtol=0, atol=0)
    effective = snens.mean_effective_members(ens)
    assert effective == pytest.approx(M)
    assert not snens.diversity_loss(ens, temperature=1.0).requires_grad
    ens.eval()
    member = snens.extract_member(ens, 2).eval()
    torch.testing.assert_close(member(x), ens(x)[2], **TOL)
    copy_ = film(resnet, M)
    copy_.load_state_dict(ens.state_dict())
    torch.testing.assert_close(copy_.eval()(x), ens(x), rtol=0, atol=0)


def test_film_affine_spread_and_norm_layer_factory(x):
    layer = FiLMBatchNorm2d(1024, num_members=4, spread=0.5)
    assert (
        abs(layer.weight.mean().item() - 1) < 0.03 and abs(layer.weight.std().item() - 0.5) < 0.03
    )
    assert abs(layer.bias.mean().item()) < 0.03 and abs(layer.bias.std().item() - 0.5) < 0.03
    net = models.create("small_cnn", num_classes=3, in_channels=3, width=4, norm_layer=film_norm(2))
    ens = snens.Ensemble(net, 2)
    assert ens(x).shape == (2, 3, 3)


def test_film_errors_name_the_problem():
    with pytest.raises(TypeError, match=r"no FiLM version: 1 \(InstanceNorm2d\)"):
        film(nn.Sequential(nn.Conv2d(3, 4, 1), nn.InstanceNorm2d(4, affine=True)), 2)
    with pytest.raises(ValueError, match="no norm layer"):
        film(nn.Sequential(nn.Linear(3, 2)), 2)
    with pytest.raises(ValueError, match="spread"):
        film(TinyResNet(), 2, spread=-1.0)


# -- MC-dropout -----------------------------------------------------------------------------------


def test_mc_dropout_samples_differ_in_eval_and_are_reproducible(resnet, x):
    mc = MCDropout(resnet, M, p=0.5).eval()
    assert isinstance(mc.model.fc, nn.Sequential) and isinstance(mc.model.fc[0], MCDropoutLayer)
    torch.manual_seed(0)
    a = mc(x)
    torch.manual_seed(0)
    b = mc(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert a.shape == (M, 3, K)
    assert not torch.allclose(a[0], a[1]) and not torch.allclose(a[1], a[2])
    stem = mc.model.stem[1]
    mean = stem.running_mean.clone()
    mc(x)
    torch.testing.assert_close(stem.running_mean, mean, rtol=0, atol=0)  # norms stay in eval
    assert isinstance(resnet.fc, nn.Linear)  # the input model is untouched


def test_mc_dropout_without_dropping_is_the_model(resnet, x):
    out = MCDropout(resnet, M, p=0.0).eval()(x)
    for m in range(M):
        torch.testing.assert_close(out[m], resnet(x), **TOL)


def test_mc_dropout_uses_the_models_own_dropout_when_it_has_one(x):
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.3), nn.LazyLinear(2)
    )
    net(x)
    mc = MCDropout(net, 3).eval()
    assert isinstance(mc.model[3], MCDropoutLayer) and mc.model[3].p == 0.3
    assert type(mc.model[4]) is nn.Linear  # nothing inserted
    out = mc(x)
    assert out.shape == (3, 3, 2) and not torch.allclose(out[0], out[1])
    with pytest.raises(ValueError, match="no dropout with p > 0"):
        MCDropout(TinyResNet(), 2, insert=False)


def test_mc_dropout_trains_as_the_plain_model_and_samples_m_in_eval(x):
    """One dropout sample per step by default (the plain model's step and cost, as Gal &
    Ghahramani and torch-uncertainty train it); ``train_samples=M`` is multi-sample dropout."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5))
    net.append(nn.Linear(net(x).shape[1], 2))
    plain = copy.deepcopy(net).train()
    mc = MCDropout(net, 4).train()
    torch.manual_seed(1)
    out = mc(x)
    torch.manual_seed(1)
    expected = plain(x)  # the same dropout mask: the same draw from the same generator
    assert out.shape == (1, 3, 2)
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0)
    assert mc.eval()(x).shape == (4, 3, 2)
    multi = MCDropout(net, 4, train_samples=4).train()
    samples = multi(x)
    assert samples.shape == (4, 3, 2) and not torch.allclose(samples[0], samples[1])
    assert "train_samples=4" in repr(multi)
    for bad, error in ((0, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="train_samples must be"):
            MCDropout(net, 4, train_samples=bad)


def test_one_method_record_answers_what_each_method_is():
    """The engine asks the record, not the method's name: what wraps one network, what has
    member norms, what the regularizer and split inputs apply to."""
    from snens.baselines import METHOD_RECORDS
    from snens.engine.config import MEMBER_NORM_METHODS, ONE_NETWORK_METHODS, REGULARIZED_METHODS

    assert tuple(METHOD_RECORDS) == baselines.METHODS
    assert REGULARIZED_METHODS == ("snens",)
    assert MEMBER_NORM_METHODS == ("film", "snens")
    assert ONE_NETWORK_METHODS == ("single", "batch_ensemble", "film", "mc_dropout", "snens")
    assert METHOD_RECORDS["single"].fixed_members == 1
    assert all(m.fixed_members is None for n, m in METHOD_RECORDS.items() if n != "single")


@pytest.mark.parametrize(
    "method, options, message",
    [
        ("packed", {"alpha": 1e300}, r"alpha must be a number in \(0, 64\], got 1e\+300"),
        ("batch_ensemble", {"init_std": 1e300}, r"init_std must be a number in \[0, 100\], got"),
    ],
)
def test_method_options_out_of_range_are_named_before_anything_trains(method, options, message):
    """Packed's alpha = 1e300 had ended in a trace from inside torch; BatchEnsemble's init_std
    = 1e300 in a NaN first step blamed on an earlier update."""
    with pytest.raises(ValueError, match=message):
        baselines.create(method, "small_cnn", num_classes=3, num_members=2, **options)


def test_a_method_too_large_for_the_machine_is_named_with_its_options():
    """Within its bounds, a packed network too wide for the machine: a ValueError, not the
    allocator's trace."""
    with pytest.raises(ValueError, match=r"method 'packed' over small_cnn with options .* needs"):
        baselines.create("packed", "small_cnn", num_classes=3, num_members=2, width=2**20, alpha=64)
