"""input_policy "own": every member a batch of its own, from a training order of its own.

The deep ensemble as the field trains it is M models trained apart, each on its own shuffle of
the data; "own" does that in one run: the loader draws M orders and gives M·B rows per step,
member m's at rows [m·B, (m+1)·B), and the model trains member m on its block.
"""

import json

import pytest
import torch
from torch import nn

from snens.baselines import DeepEnsemble
from snens.data import TensorLoader, TokenLoader
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.train import train

pytestmark = pytest.mark.usefixtures("one_thread")

N, B, M = 24, 4, 3


def _loader(**options):
    x = torch.arange(N, dtype=torch.float32).view(N, 1)  # each row holds its own index
    return TensorLoader(x, torch.arange(N), B, shuffle=True, drop_last=True, seed=5, **options)


def test_each_member_sees_the_whole_set_once_per_epoch_in_an_order_of_its_own():
    loader = _loader(member_orders=M)
    batches = list(loader)
    assert len(batches) == len(loader) == N // B
    seen = [[] for _ in range(M)]
    for x, y in batches:
        assert x.shape == (M * B, 1) and y.shape == (M * B,)
        assert torch.equal(x[:, 0].long(), y)  # rows and labels travel together
        for m in range(M):
            seen[m] += y[m * B : (m + 1) * B].tolist()
    for m in range(M):
        assert sorted(seen[m]) == list(range(N))  # every example, once
    assert seen[0] != seen[1] != seen[2]  # each its own order
    # the next epoch draws new orders; the epoch's orders depend on (seed, epoch) only
    again = [y for _, y in _loader(member_orders=M)]
    assert all(torch.equal(a, b) for a, b in zip(again, [y for _, y in batches], strict=True))
    assert not torch.equal(next(iter(loader))[1], batches[0][1])


def test_one_order_is_the_loader_as_it_was():
    plain, one = list(_loader()), list(_loader(member_orders=1))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(plain, one, strict=True))


def test_ranks_share_every_members_batch():
    """Two data-parallel ranks: rank r takes its half of each member's batch, member-major, so
    the ensemble's blocks on each rank are still one member each."""
    full = next(iter(_loader(member_orders=M)))[1].view(M, B)
    halves = [next(iter(_loader(member_orders=M).shard(r, 2)))[1].view(M, B // 2) for r in (0, 1)]
    assert torch.equal(torch.cat(halves, dim=1), full)


def test_token_batches_of_members_are_trimmed_together():
    ids = torch.randint(1, 50, (N, 9))
    mask = torch.ones_like(ids)
    mask[:, 6:] = 0
    loader = TokenLoader(ids, mask, torch.arange(N), B, shuffle=True, member_orders=M)
    x, y = next(iter(loader))
    assert x["input_ids"].shape == (M * B, 6) and y.shape == (M * B,)
    assert torch.equal(x["input_ids"], ids[y, :6])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"member_orders": 0}, r"member_orders must be an int in 1\.\.1024 \(M\), got 0"),
        ({"member_orders": 2.0}, "got 2.0"),
    ],
)
def test_bad_member_orders_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        _loader(**options)
    x = torch.zeros(N, 1)
    with pytest.raises(ValueError, match="needs shuffle=True"):
        TensorLoader(x, torch.arange(N), B, member_orders=2)


def test_a_deep_ensemble_with_split_inputs_trains_member_m_on_block_m():
    torch.manual_seed(0)
    members = [nn.Linear(2, 3) for _ in range(M)]
    ens = DeepEnsemble(members, input_policy="split")
    x = torch.randn(M * B, 2)
    out = ens.train()(x)
    assert out.shape == (M, B, 3)
    for m in range(M):
        torch.testing.assert_close(out[m], members[m](x[m * B : (m + 1) * B]))
    assert ens.eval()(x).shape == (M, M * B, 3)  # evaluation: every member on every row
    with pytest.raises(ValueError, match="divisible by num_members=3, got B=4"):
        ens.train()(torch.randn(4, 2))
    with pytest.raises(ValueError, match="leave vectorize=False"):
        DeepEnsemble(members, input_policy="split", vectorize=True)
    with pytest.raises(ValueError, match="input_policy must be 'repeat' or 'split', got 'own'"):
        DeepEnsemble(members, input_policy="own")


def _config(tmp_path, *overrides):
    return load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir='{tmp_path}'",
            "threads=1",
            "data.train_examples=400",
            "data.test_examples=200",
            "data.ood_examples=200",
            *overrides,
        ],
    )


@pytest.mark.parametrize("method", ["deep_ensemble", "snens"])
def test_a_run_with_own_batches_trains_and_reports(tmp_path, method):
    config = _config(tmp_path, f"method.name='{method}'", "method.input_policy='own'")
    run = train(config, progress=False, log=None)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 400 // 100  # steps per epoch: N / B, each of M·B rows
    final = json.loads((run / "final.json").read_text())["metrics"]
    assert final["test/num_members"] == 4
    assert final["test/disagreement"] > 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["method.name='single'", "method.num_members=1", "method.input_policy='own'"],
            "method.input_policy 'own' is implemented for methods 'snens', 'deep_ensemble', "
            "got method.name 'single'",
        ),
        (
            ["data.dataset='imagenet'", "data.ood=[]", "method.input_policy='own'"],
            "not class folders",
        ),
    ],
)
def test_own_batches_are_refused_where_they_do_not_apply(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, *overrides)
