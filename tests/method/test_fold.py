"""Folding members into the batch and back: (B, …) -> (M·B, …) -> (M, B, …), by value."""

import re

import pytest
import torch
from torch import nn

import snens
from snens.method.ensemble import fold_members, forward_repeated, unfold_members

pytestmark = pytest.mark.usefixtures("one_thread")

M = 4
EXACT = {"rtol": 0.0, "atol": 0.0}  # folding only moves values: nothing may change
# another batch size may take another kernel blocking: a few float32 ulps of a dot product
ROUNDING = {"rtol": 1e-6, "atol": 1e-6}


def _batch(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(3,), (3, 5), (3, 2, 4, 4)])
def test_fold_gives_member_m_rows_equal_to_the_input(shape):
    x = _batch(*shape)
    folded = fold_members(x, M)
    B = shape[0]
    assert folded.shape == (M * B, *shape[1:])
    for m in range(M):
        torch.testing.assert_close(folded[m * B : (m + 1) * B], x, **EXACT)


def test_fold_is_a_copy_even_for_one_member():
    x = _batch(3, 5)
    folded = fold_members(x, 1)
    torch.testing.assert_close(folded, x, **EXACT)
    assert folded.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("shape", [(3,), (3, 5), (3, 2, 4, 4)])
def test_unfold_of_fold_is_the_input_once_per_member(shape):
    x = _batch(*shape)
    expected = x.unsqueeze(0).expand(M, *shape)
    torch.testing.assert_close(unfold_members(fold_members(x, M), M), expected, **EXACT)
    got = unfold_members(fold_members(x, M), M, batch_size=shape[0])
    torch.testing.assert_close(got, expected, **EXACT)


def test_unfold_puts_row_m_b_at_member_m_example_b():
    B, K = 3, 5
    rows = torch.arange(M * B * K, dtype=torch.float32).reshape(M * B, K)
    unfolded = unfold_members(rows, M)
    assert unfolded.shape == (M, B, K)
    for m in range(M):
        for b in range(B):
            torch.testing.assert_close(unfolded[m, b], rows[m * B + b], **EXACT)


def test_unfold_refuses_rows_that_are_not_a_multiple_of_m():
    message = (
        "cannot unfold a tensor of shape (6, 5) into (M, B, …): expected a multiple of M=4 "
        "member-major rows; does every path to the model's output pass through a member layer?"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        unfold_members(torch.zeros(6, 5), M)


def test_unfold_refuses_rows_other_than_m_times_b():
    # 8 rows are a multiple of M=4, but not M·B for B=3: a model that skipped the members
    message = (
        "cannot unfold a tensor of shape (8, 5) into (M, B, …): expected 12 member-major rows "
        "(M=4 × B=3); does every path to the model's output pass through a member layer?"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        unfold_members(torch.zeros(8, 5), M, batch_size=3)


def test_unfold_refuses_a_scalar():
    with pytest.raises(RuntimeError, match=re.escape("tensor of shape () into (M, B, …)")):
        unfold_members(torch.tensor(1.0), M)


@pytest.mark.parametrize("fold", [fold_members, unfold_members])
def test_fold_and_unfold_refuse_a_bad_member_count(fold):
    with pytest.raises(ValueError, match="num_members must be >= 1, got 0"):
        fold(torch.zeros(4, 2), 0)
    with pytest.raises(TypeError, match=r"num_members must be an int, got 2\.0"):
        fold(torch.zeros(4, 2), 2.0)


def test_forward_repeated_equals_the_ensemble(resnet):
    ens = snens.convert(resnet, num_members=M).eval()
    with torch.no_grad():
        for p in ens.parameters():  # members that differ, so a swapped member would show
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    x = _batch(5, 3, 8, 8)
    with torch.no_grad():
        expected = ens(x)
        got = forward_repeated(ens.model, M, (x,), {})
    assert got.shape == (M, 5, 5)
    torch.testing.assert_close(got, expected, **EXACT)


class _Shifted(nn.Module):
    """Adds a per-example ``shift`` (B, K) and a shared ``bias`` (K,) to a linear's output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x, *, shift, bias):
        return self.linear(x) + shift + bias


def test_forward_repeated_folds_per_example_inputs_only():
    torch.manual_seed(0)
    model = _Shifted()
    x, shift, bias = _batch(5, 6), _batch(5, 3, seed=1), _batch(3, seed=2)
    got = forward_repeated(model, M, (x,), {"shift": shift, "bias": bias})
    # the reference is the same (M·B)-row batch computed the same way: exactness is the point,
    # and a matrix kernel may block B and M·B rows differently (last bit, 1.2e-7 seen)
    folded = model(x.repeat(M, 1), shift=shift.repeat(M, 1), bias=bias)  # bias (K,) not folded
    torch.testing.assert_close(got, folded.reshape(M, 5, 3), **EXACT)
    # every member is the plain model on the unfolded batch, to float32 rounding of 6 products
    for m in range(M):
        torch.testing.assert_close(got[m], model(x, shift=shift, bias=bias), **ROUNDING)


def test_forward_repeated_picks_the_logits_with_output():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    x = _batch(5, 6)
    got = forward_repeated(model, M, (x,), {}, output=lambda out: 2 * out)
    torch.testing.assert_close(got, 2 * model(x.repeat(M, 1)).reshape(M, 5, 3), **EXACT)


def test_forward_repeated_names_a_model_that_mixes_the_rows():
    class Pooled(nn.Module):
        def forward(self, x):
            return x.reshape(-1, 2, x.shape[-1]).mean(1)  # (M·B/2, K): members mixed

    message = (
        "cannot unfold a tensor of shape (12, 3) into (M, B, …): expected 24 member-major rows "
        "(M=4 × B=6); does every path to the model's output pass through a member layer?"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        forward_repeated(Pooled(), M, (_batch(6, 3),), {})


def test_forward_repeated_refuses_logits_without_a_class_dimension():
    message = (
        "the model returned logits of shape (24,), expected (24, K): member-major rows "
        "(M=4 × B=6) of K class scores"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        forward_repeated(nn.Flatten(0), M, (_batch(6),), {})


class _Folded(nn.Module):
    """A model of member layers run through :func:`forward_repeated`: (B, …) -> (M, B, K)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return forward_repeated(self.model, M, (x,), {})


def test_fold_and_unfold_export_with_a_dynamic_batch(resnet):
    """Without unfold's export-time copy this export fails: the member head's (M·B, K) strides
    guard B."""
    module = _Folded(snens.convert(resnet, num_members=M).model).eval()
    batch = torch.export.Dim("batch")
    program = torch.export.export(module, (_batch(5, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})
    for b in (1, 3, 8):
        x = _batch(b, 3, 8, 8, seed=b)
        with torch.no_grad():
            expected = module(x)
            got = program.module()(x)
        assert got.shape == (M, b, 5)
        # eager runs the fused CPU norm kernels, the program the per-member loop of plain
        # norms: measured |eager − exported| <= 6e-8 here, 4e-7 in test_export
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
