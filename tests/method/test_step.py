"""The training objective written once (snens.method.step): what the engine, SnensTrainer and
SnensModule differentiate, and the stop on a non-finite loss they share."""

import pytest
import torch

import snens
import snens.engine.epoch
import snens.engine.train
from snens.method.step import NonFiniteLossError, check_finite, training_loss


def _ensemble(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )
    return snens.convert(net, num_members=2)


def test_the_loss_is_ensemble_loss_plus_diversity_loss():
    ens = _ensemble()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    loss = training_loss(ens, ens(x), y, temperature=0.5, weight=0.1, label_smoothing=0.1)
    task = snens.ensemble_loss(ens(x), y, label_smoothing=0.1)
    div = snens.diversity_loss(ens, temperature=0.5, weight=0.1)
    assert torch.equal(loss.task, task) and torch.equal(loss.diversity, div)
    assert torch.equal(loss.total, task + div)
    off = training_loss(ens, ens(x), y, weight=0.0)
    assert off.diversity is None and off.total is off.task


def test_task_value_keeps_the_value_of_the_task_loss_and_the_gradient_of_the_whole():
    ens = _ensemble()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    gradients = []
    for task_value in (False, True):
        ens.zero_grad()
        loss = training_loss(ens, ens(x), y, weight=0.1, task_value=task_value)
        loss.total.backward()
        gradients.append([p.grad.clone() for p in ens.parameters()])
    assert torch.equal(loss.total, loss.task)
    for a, b in zip(*gradients):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_host_labels_are_the_ones_checked():
    ens = _ensemble()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    with pytest.raises(ValueError, match="label 7 is out of range for 3 classes"):
        training_loss(ens, ens(x), y, host_labels=torch.full((6,), 7))
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        training_loss(ens, ens(x), y, label_smoothing=2.0)


def test_a_non_finite_loss_stops_naming_the_step_and_the_cause():
    ens = _ensemble()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    loss = training_loss(ens, ens(x), y)
    check_finite(loss, ens, x, where="step 1", temperature=1.0, remedy="lower lr")  # finite
    x[2, 1] = float("inf")
    loss = training_loss(ens, ens(x), y)
    with pytest.raises(NonFiniteLossError, match=r"^non-finite loss at step 4 of 9: task loss nan"):
        check_finite(loss, ens, x, where="step 4 of 9", temperature=1.0, remedy="lower lr")
    with pytest.raises(NonFiniteLossError, match=r"the batch's 'x' hold NaN or inf values"):
        check_finite(loss, ens, {"x": x}, where="step 4", temperature=1.0, remedy="lower lr")
    clean = x.nan_to_num(posinf=0.0)
    with torch.no_grad():
        ens.model[0].weight[0, 0] = float("nan")
    loss = training_loss(ens, ens(clean), y)
    diverged = (
        r"cause: the parameters hold NaN or inf values: an earlier update diverged; lower lr\."
    )
    with pytest.raises(NonFiniteLossError, match=diverged):
        check_finite(loss, ens, clean, where="step 5", temperature=1.0, remedy="lower lr")


def test_the_engine_raises_the_methods_error_under_its_old_names():
    assert snens.engine.epoch.NonFiniteLossError is NonFiniteLossError
    assert snens.engine.train.NonFiniteLossError is NonFiniteLossError
    assert issubclass(NonFiniteLossError, ValueError)
