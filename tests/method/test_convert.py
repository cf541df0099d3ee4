"""snens.convert: any model in, an output-preserving ensemble out, with a report."""

import warnings

import pytest
import torch
from torch import nn

import snens
import snens.nn as snn

from conftest import TinyResNet, TinyTransformer

TOL = {"rtol": 1e-5, "atol": 1e-5}


def test_converted_resnet_reproduces_the_original_in_every_member(resnet):
    x = torch.randn(6, 3, 8, 8)
    ref = resnet(x)
    ens = snens.convert(resnet, num_members=4).eval()
    out = ens(x)
    assert out.shape == (4, 6, 5)
    for m in range(4):
        torch.testing.assert_close(out[m], ref, **TOL)


def test_converted_transformer_reproduces_the_original_in_every_member(transformer, text_batch):
    ids, mask = text_batch
    ref = transformer(ids, attention_mask=mask)
    ens = snens.convert(transformer, num_members=3).eval()
    out = ens(ids, attention_mask=mask)
    assert out.shape == (3, 5, 3)
    for m in range(3):
        torch.testing.assert_close(out[m], ref, **TOL)


def test_report_counts_layers_and_parameters(resnet):
    before = sum(p.numel() for p in resnet.parameters())
    ens = snens.convert(resnet, num_members=4)
    report = ens.report
    bn_channels = [m.num_features for m in resnet.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(report.converted) == len(bn_channels) == 6
    assert {c[1:] for c in report.converted} == {("BatchNorm2d", "MemberBatchNorm2d")}
    assert report.head == "fc"
    # per norm: M·C gamma plus (M-1)·2C extra affine; head: (M-1)·(K·D + K)
    expected = sum(4 * c + 3 * 2 * c for c in bn_channels) + 3 * (5 * 16 + 5)
    assert report.params_before == before
    assert report.params_added == expected
    assert report.params_after == sum(p.numel() for p in ens.parameters())
    text = str(report)
    assert (
        "6 × BatchNorm2d -> MemberBatchNorm2d" in text
        and "head: 'fc' (its name in the model), one copy per member" in text
    )


def test_convert_copies_by_default_and_never_aliases_members(resnet):
    state = {k: v.clone() for k, v in resnet.state_dict().items()}
    ens = snens.convert(resnet, num_members=3)
    for k, v in resnet.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    assert isinstance(resnet.stem[1], nn.BatchNorm2d)
    bn = ens.model.stem[1]
    with torch.no_grad():
        bn.weight[0].add_(1.0)
        bn.running_mean[0].add_(1.0)
    # only member 0 moved: no storage shared between members
    assert (bn.weight[1] != bn.weight[0]).all()
    assert (bn.running_mean[1] != bn.running_mean[0]).all()
    storages = {p.untyped_storage().data_ptr() for p in ens.parameters()}
    assert len(storages) == len(list(ens.parameters()))


def test_inplace_conversion_and_shared_modules_stay_shared():
    shared = nn.BatchNorm1d(4)
    model = nn.Sequential(nn.Linear(3, 4), shared, nn.Linear(4, 4), shared, nn.Linear(4, 2))
    ens = snens.convert(model, num_members=2, inplace=True)
    assert ens.model is model
    assert isinstance(model[1], snn.MemberBatchNorm1d) and model[1] is model[3]
    assert len(ens.report.converted) == 1


def test_head_selection():
    ens = snens.convert(TinyResNet(), num_members=2, head="fc")
    assert isinstance(ens.model.fc, snn.MemberLinear)
    ens = snens.convert(TinyResNet(), num_members=2, head=None)
    assert type(ens.model.fc) is nn.Linear and ens.report.head is None
    # auto never picks attention's out_proj: the head is the last *plain* nn.Linear
    ens = snens.convert(TinyTransformer(), num_members=2)
    assert ens.report.head == "head"
    with pytest.raises(ValueError, match="head='nope' is not a submodule.*fc"):
        snens.convert(TinyResNet(), num_members=2, head="nope")
    with pytest.raises(TypeError, match="head='stem' is a Sequential"):
        snens.convert(TinyResNet(), num_members=2, head="stem")


def test_reset_heads_differ_between_members():
    g = torch.Generator().manual_seed(0)
    ens = snens.convert(TinyResNet(), num_members=3, head_init="reset", generator=g)
    w = ens.model.fc.weight
    assert (w[0] - w[1]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="head_init must be 'copy' or 'reset'"):
        snens.convert(TinyResNet(), num_members=3, head_init="zeros")


def test_generator_makes_gamma_reproducible():
    a = snens.convert(TinyResNet(), 2, generator=torch.Generator().manual_seed(5))
    b = snens.convert(TinyResNet(), 2, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a.model.stem[1].gamma, b.model.stem[1].gamma, rtol=0, atol=0)


def test_unsupported_norm_is_named_and_can_be_skipped():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.LocalResponseNorm(2))
    with pytest.raises(
        TypeError, match=r"2 \(LocalResponseNorm\).*register_norm\(Local.*skip_unsu"
    ):
        snens.convert(model, num_members=2, skip_unsupported=False)
    ens = snens.convert(model, num_members=2, skip_unsupported=True)
    assert ens.report.skipped == (("2", "LocalResponseNorm"),)
    assert type(ens.model[2]) is nn.LocalResponseNorm


def test_a_model_with_one_unconvertible_norm_converts_the_rest_and_names_it():
    """The default (skip_unsupported=None): every other norm converts, the unconvertible one
    stays shared, the report counts and names it with its reason, one warning says so, and
    every member still computes the model. skip_unsupported=True: the same, silently;
    False: all or nothing, refused naming the class."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.LocalResponseNorm(2), nn.ReLU(),
        nn.Conv2d(4, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(4 * 5 * 5, 3),
    ).eval()  # fmt: skip
    x = torch.randn(2, 3, 9, 9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ens = snens.convert(model, num_members=3).eval()
    assert len(caught) == 1 and caught[0].category is UserWarning
    assert "left 1 norm of Sequential shared" in str(caught[0].message)
    assert "LocalResponseNorm" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the caller's line
    report = ens.report
    assert report.skipped == (("2", "LocalResponseNorm"),)
    assert [c[0] for c in report.converted] == ["1", "5"]
    assert report.skipped_reasons[0][0] == "LocalResponseNorm"
    text = str(report)
    assert "left shared, no member version: 1 norm: 2 (LocalResponseNorm)" in text
    assert "LocalResponseNorm: LocalResponseNorm (torch) normalizes across" in text
    assert type(ens.model[2]) is nn.LocalResponseNorm
    with torch.no_grad():
        torch.testing.assert_close(ens(x), model(x).expand(3, -1, -1), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = snens.convert(model, num_members=3, skip_unsupported=True)
    assert quiet.report.skipped == report.skipped
    with pytest.raises(TypeError, match=r"no member version: 2 \(LocalResponseNorm\)"):
        snens.convert(model, num_members=3, skip_unsupported=False)
    with pytest.raises(TypeError, match="skip_unsupported must be None"):
        snens.convert(model, num_members=3, skip_unsupported="yes")


def test_a_model_whose_norms_all_convert_converts_alike_in_every_mode():
    """No warning, and the same ensemble, bit for bit, under None, True and False."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(196, 3))
    states = []
    for mode in (None, True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ens = snens.convert(
                model, 2, skip_unsupported=mode, generator=torch.Generator().manual_seed(0)
            )
        assert ens.report.skipped == () and "left shared" not in str(ens.report)
        states.append(ens.state_dict())
    for state in states[1:]:
        assert state.keys() == states[0].keys()
        assert all(torch.equal(state[k], states[0][k]) for k in state)


def test_instance_norms_convert_exactly_unless_they_keep_running_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4, affine=True), nn.ReLU(),
        nn.Conv2d(4, 4, 3), nn.InstanceNorm2d(4), nn.Flatten(), nn.Linear(4 * 5 * 5, 3),
    )  # fmt: skip
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 2.0)
        model[1].bias.uniform_(-1.0, 1.0)
    x = torch.randn(2, 3, 9, 9)
    ens = snens.convert(model, num_members=3).eval()
    assert [type(m).__name__ for m in (ens.model[1], ens.model[4])] == ["MemberInstanceNorm2d"] * 2
    torch.testing.assert_close(ens(x), model.eval()(x).expand(3, -1, -1), rtol=1e-5, atol=1e-5)
    member = snens.extract_member(ens, 2)
    assert type(member[1]) is nn.InstanceNorm2d and member[1].affine
    torch.testing.assert_close(member(x), model(x), rtol=1e-5, atol=1e-5)
    # running statistics it would use in eval mode are not kept: named, and skippable
    model[4] = nn.InstanceNorm2d(4, track_running_stats=True)
    with pytest.raises(TypeError, match=r"4 \(InstanceNorm2d\)\. InstanceNorm2d\(track_runn"):
        snens.convert(model, num_members=3, skip_unsupported=False)
    ens = snens.convert(model, num_members=3, skip_unsupported=True)
    assert ens.report.skipped == (("4", "InstanceNorm2d"),)
    assert type(ens.model[4]) is nn.InstanceNorm2d


def test_custom_norm_classes_are_refused_but_normalize_is_not():
    """A class that looks like a norm converts only where it computes one (probed), whatever
    its name; a torch subclass that changes forward is refused, one that does not converts."""

    class T5LayerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return self.weight * x

    class Normalize(nn.Module):  # input normalization, not a norm layer
        def forward(self, x):
            return (x - 0.5) / 0.25

    class ShiftedBatchNorm(nn.BatchNorm1d):  # a subclass may change forward
        def forward(self, x):
            return super().forward(x) + 1

    class MyBatchNorm(nn.BatchNorm1d):  # computes BatchNorm1d
        pass

    with pytest.raises(TypeError, match=r"1 \(T5LayerNorm\)\. T5LayerNorm computes none"):
        snens.convert(
            nn.Sequential(nn.BatchNorm1d(4), T5LayerNorm()), num_members=2, skip_unsupported=False
        )
    with pytest.raises(TypeError, match=r"0 \(ShiftedBatchNorm\)\. ShiftedBatchNorm computes"):
        snens.convert(
            nn.Sequential(ShiftedBatchNorm(4), nn.BatchNorm1d(4)),
            num_members=2,
            skip_unsupported=False,
        )
    ens = snens.convert(nn.Sequential(MyBatchNorm(4), nn.BatchNorm1d(4)), num_members=2)
    assert ens.report.converted[0] == ("0", "MyBatchNorm", "MemberBatchNorm1d")
    ens = snens.convert(nn.Sequential(Normalize(), nn.BatchNorm1d(4)), num_members=2)
    assert ens.report.skipped == ()


def test_model_without_norms_is_refused():
    with pytest.raises(ValueError, match="no supported norm layer"):
        snens.convert(nn.Sequential(nn.Linear(3, 2)), num_members=2)


@pytest.mark.parametrize(
    ("bad", "error", "pattern"),
    [
        (0, ValueError, "num_members must be >= 1, got 0"),
        (-2, ValueError, "num_members must be >= 1, got -2"),
        (2.5, TypeError, "num_members must be an int, got 2.5"),
        ("4", TypeError, "num_members must be an int, got '4'"),
        (True, TypeError, "num_members must be an int, got True"),
    ],
)
def test_bad_num_members(bad, error, pattern):
    with pytest.raises(error, match=pattern):
        snens.convert(TinyResNet(), num_members=bad)


def test_not_a_module():
    with pytest.raises(TypeError, match="must be a torch.nn.Module, got function"):
        snens.convert(lambda x: x, num_members=2)


def test_models_built_with_member_norms_convert_their_head_only():
    norm = snn.member_norm(3, nn.BatchNorm1d)
    model = nn.Sequential(nn.Linear(4, 8), norm(8), nn.ReLU(), nn.Linear(8, 2))
    ens = snens.convert(model, num_members=3)
    assert ens.report.converted == () and ens.report.head == "3"
    assert ens(torch.randn(5, 4)).shape == (3, 5, 2)
    with pytest.raises(ValueError, match="num_members=3, but num_members=2 was asked"):
        snens.convert(model, num_members=2)


def test_converting_a_converted_model_again_changes_nothing():
    torch.manual_seed(0)
    ens = snens.convert(TinyResNet(), num_members=2).eval()
    again = snens.convert(ens.model, num_members=2).eval()
    assert again.report.converted == () and again.report.head is None
    assert again.report.notes == () and again.report.params_added == 0
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(again(x), ens(x), rtol=0, atol=0)


def test_a_registered_norm_is_converted_whole_with_the_norms_inside_it():
    class TwoStepNorm(nn.Module):  # a user's norm built from torch norms
        def __init__(self):
            super().__init__()
            self.unused = nn.InstanceNorm1d(4)  # refused on its own
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            return self.bn(x)

    def to_members(plain, num_members, **kw):
        return snn.MemberBatchNorm1d.from_plain(plain.bn, num_members, **kw)

    snn.register_norm(TwoStepNorm, from_plain=to_members)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), TwoStepNorm(), nn.Linear(4, 2)).eval()
    ens = snens.convert(model, num_members=2).eval()
    assert ens.report.converted == (("1", "TwoStepNorm", "MemberBatchNorm1d"),)
    assert ens.report.skipped == ()
    x = torch.randn(5, 4)
    with torch.no_grad():
        out, ref = ens(x), model(x)
    for m in range(2):
        torch.testing.assert_close(out[m], ref, **TOL)


def test_refusals_name_the_module_and_count_the_rest():
    many = nn.Sequential(nn.BatchNorm1d(4), *[nn.LocalResponseNorm(2) for _ in range(10)])
    with pytest.raises(
        TypeError, match=r"1 \(LocalResponseNorm\), .*, 8 \(LocalResponseNorm\) and 2 more\."
    ):
        snens.convert(many, num_members=2, skip_unsupported=False)
    with pytest.raises(TypeError, match="head must be 'auto', a module name or None, got 3"):
        snens.convert(TinyResNet(), num_members=2, head=3)

    class ShapedNorm(nn.Module):
        def forward(self, x):
            return x

    def refuse(plain, num_members, **kw):
        raise ValueError("needs a weight of 4 channels")

    snn.register_norm(ShapedNorm, from_plain=refuse)
    with pytest.raises(ValueError, match=r"cannot convert 1 \(ShapedNorm\): needs a weight"):
        snens.convert(nn.Sequential(nn.Linear(4, 4), ShapedNorm()), num_members=2)


def test_converted_model_trains(resnet):
    ens = snens.convert(resnet, num_members=2).train()
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 5, (8,))
    loss = snens.ensemble_loss(ens(x), y)
    loss.backward()
    grads = {n: p.grad for n, p in ens.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["model.stem.1.gamma"].abs().sum(dim=1).min() > 0


def test_a_bad_head_name_fails_before_anything_is_replaced():
    """With inplace=True a bad head had been found only after every norm was replaced,
    leaving the caller's model half-converted."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(1), nn.Linear(4, 2))
    for head, error in (("nope", ValueError), ("1", TypeError)):
        with pytest.raises(error) as err:
            snens.convert(model, num_members=2, head=head, inplace=True)
        assert type(model[1]) is nn.BatchNorm2d  # untouched
    assert "head='1' is a BatchNorm2d; the head must be an nn.Linear" in str(err.value)


def test_a_model_with_uninitialized_lazy_modules_names_the_fix():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(1), nn.LazyLinear(2))
    with pytest.raises(ValueError) as err:
        snens.convert(model, num_members=2)
    assert str(err.value) == (
        "3.weight of Sequential is an uninitialized parameter or buffer of a lazy module; run "
        "one forward pass on an example batch first, then convert"
    )
    model(torch.randn(2, 3, 5, 5))  # initialized: it converts
    assert snens.convert(model, num_members=2)(torch.randn(2, 3, 5, 5)).shape == (2, 2, 2)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("affine", [True, False])
def test_a_lazy_batch_norm_not_yet_run_names_the_fix(affine, inplace):
    """A LazyBatchNorm2d failed inside torch's Tensor.__deepcopy__ (the copy came before the
    check), and with affine=False (running statistics, no parameters) inside the registry."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d(affine=affine), nn.Flatten(1))
    with pytest.raises(ValueError) as err:
        snens.convert(model, num_members=2, inplace=inplace)
    first = "1.weight" if affine else "1.running_mean"
    assert str(err.value).startswith(f"{first} of Sequential is an uninitialized parameter or ")
    assert type(model[1]) is nn.LazyBatchNorm2d  # untouched


def test_converting_an_ensemble_again_names_it_and_the_fix():
    """A re-run notebook cell ``model = snens.convert(model, 4)`` built Ensemble(Ensemble(…)),
    which failed only at the first forward pass with "cannot unfold a tensor of shape
    (4, 8, 3)"; so did a model holding an ensemble as a submodule."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    ens = snens.convert(model, num_members=4)
    for again, where in (
        (ens, "model is already"),
        (nn.Sequential(ens, nn.Softmax(-1)), "model already holds"),
    ):
        with pytest.raises(TypeError) as err:
            snens.convert(again, num_members=4)
        message = str(err.value)
        assert message.startswith(f"{where} a σN-Ens ensemble with M=4 members")
        assert "Convert the original model instead" in message
    assert "(its module '0')" in message
    # the original model, and the ensemble's own model (member norms, no wrapper), still convert
    assert snens.convert(model, num_members=2)(torch.randn(5, 4)).shape == (2, 5, 3)
    assert snens.convert(ens.model, num_members=4)(torch.randn(5, 4)).shape == (4, 5, 3)


# ------------------------------------------------------------------------------------------
# norms=: convert some norms only


NORM_NAMES = ["blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1", "blocks.1.norm2", "norm"]


@pytest.mark.parametrize(
    ("norms", "converted"),
    [
        (["norm2"], ["blocks.0.norm2", "blocks.1.norm2"]),  # a name ending
        (["blocks.1.norm1", "norm"], ["blocks.1.norm1", "norm"]),  # whole names
        (r"blocks\.1\..*|norm", ["blocks.1.norm1", "blocks.1.norm2", "norm"]),  # a regex
        (lambda name, module: name.startswith("blocks.0"), ["blocks.0.norm1", "blocks.0.norm2"]),
    ],
    ids=["name ending", "whole names", "regex", "function"],
)
def test_norms_converts_the_chosen_norms_and_leaves_the_others_shared(
    transformer, text_batch, norms, converted
):
    ids, mask = text_batch
    ref = transformer(ids, attention_mask=mask)
    ens = snens.convert(transformer, num_members=3, norms=norms).eval()
    report = ens.report
    assert [name for name, _, _ in report.converted] == converted
    assert [name for name, _ in report.unselected] == [n for n in NORM_NAMES if n not in converted]
    assert report.head == "head"
    for name in NORM_NAMES:  # the ones left out are the plain modules, not member norms
        member = isinstance(ens.model.get_submodule(name), snn.MemberNorm)
        assert member == (name in converted)
    # per member norm of 16 features: weight, bias and γ of (3, 16) for a weight and bias
    # of 16; the head's 16·3 + 3 = 51 parameters become 3 × 51
    assert report.params_added == len(converted) * (3 * 3 * 16 - 2 * 16) + 2 * 51
    assert f"left shared by norms=: {len(NORM_NAMES) - len(converted)}" in str(report)
    out = ens(ids, attention_mask=mask)
    for m in range(3):
        torch.testing.assert_close(out[m], ref, **TOL)


def test_members_differ_through_the_chosen_norms_only_and_train(transformer, text_batch):
    ids, mask = text_batch
    ens = snens.convert(transformer, num_members=3, norms=["norm"])
    optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-2))
    for _ in range(3):
        loss = snens.ensemble_loss(
            ens.train()(ids, attention_mask=mask), torch.tensor([0, 1, 2, 0, 1])
        )
        loss = loss + snens.diversity_loss(ens, 1.0, 0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    gammas = [n for n, p in ens.named_parameters() if n.endswith("gamma")]
    assert gammas == ["model.norm.gamma"]
    with torch.no_grad():
        out = ens.eval()(ids, attention_mask=mask)
    assert (out[0] - out[1]).abs().max() > 1e-3


def test_an_unsupported_norm_left_out_by_norms_is_not_refused():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LocalResponseNorm(2), nn.BatchNorm2d(4))
    model = nn.Sequential(*model, nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 6, 6))
    with pytest.raises(TypeError, match=r"1 \(LocalResponseNorm\)"):
        snens.convert(model, 2, skip_unsupported=False)
    ens = snens.convert(model, 2, norms=["2"])
    assert ens.report.converted == (("2", "BatchNorm2d", "MemberBatchNorm2d"),)
    assert ens.report.unselected == (("1", "LocalResponseNorm"),)
    assert ens.report.skipped == ()


@pytest.mark.parametrize(
    ("norms", "error", "message"),
    [
        (
            ["norm2", "norm3"],
            ValueError,
            r"norms= names \['norm3'\] match no norm of TinyTransformer; its norms are named "
            r"like blocks.0.norm1, blocks.0.norm2, norm",
        ),
        (
            r"layers\..*",
            ValueError,
            r"chooses none of the 5 norms of TinyTransformer, named like blocks.0.norm1, "
            r"blocks.0.norm2, norm",
        ),
        ("blocks.(", ValueError, "is not a valid regular expression"),
        (["norm", ""], TypeError, "norms must be None, a regular expression, a list"),
        (3, TypeError, "got 3"),
    ],
    ids=["unmatched name", "regex choosing none", "bad regex", "empty name", "not a selection"],
)
def test_a_bad_norms_is_refused_naming_it_before_the_model_is_touched(
    transformer, norms, error, message
):
    with pytest.raises(error, match=message):
        snens.convert(transformer, 2, norms=norms, inplace=True)
    assert not any(isinstance(m, snn.MemberNorm) for m in transformer.modules())


def test_a_scripted_module_and_a_state_of_another_width_name_the_right_fix():
    """A TorchScript module had been told it has no supported norm; a state of the same M
    and another width had been told to convert with that same M."""
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    for inplace in (False, True):
        with pytest.raises(TypeError, match="convert takes an eager nn.Module, got a TorchScript"):
            snens.convert(torch.jit.script(model), 2, inplace=inplace)
    narrow = snens.convert(model, 2)
    wide = snens.convert(nn.Sequential(nn.Linear(4, 16), nn.LayerNorm(16), nn.Linear(16, 3)), 2)
    with pytest.raises(ValueError) as err:
        wide.load_state_dict(narrow.state_dict())
    assert str(err.value) == (
        "cannot load model.1.gamma of shape (2, 8) into MemberLayerNorm with gamma (2, 16): the "
        "same num_members (2), other features, so the state_dict comes from another "
        "architecture or width; build the model it was saved from"
    )


def test_an_overflowing_gamma_spread_advises_a_smaller_spread():
    """gamma_std = 1e300 with gamma_mean = 0.0 had been told to use "a larger gamma_mean (e.g.
    0.0)", the value it had."""
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"use a smaller gamma_std \(the default is 1\.0\) or a "):
        snens.convert(model, 2, gamma_std=1e300)
