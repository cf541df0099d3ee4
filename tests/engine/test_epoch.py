"""The engine's training step (snens.engine.epoch.run_epoch): what it reads back from the
device, and where it checks its labels."""

from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

import snens
import snens.engine.epoch
import snens.method.step
from snens.engine.epoch import NonFiniteLossError, StepSettings, run_epoch

STEPS = 5
# What turns a tensor into a Python value: on a GPU each one waits for the device.
READS = {"item", "__bool__", "tolist", "__float__", "__int__", "__index__", "cpu", "numpy"}


class _Reads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.reads[name] += 1
        return func(*args, **(kwargs or {}))


def _setup(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 3),
    )
    model = snens.convert(net, num_members=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    batches = [(torch.randn(4, 1, 6, 6), torch.randint(0, 3, (4,))) for _ in range(STEPS)]
    return model, optimizer, schedule, batches


def test_one_device_read_per_step_and_one_per_epoch(monkeypatch):
    """The step decision (loss and gradient norm finite) is the one read of a step; the
    epoch's sums come back once, at its end. The label range check reads too, but it runs on
    the loader's tensors, before they move to the device (pinned by identity below)."""
    model, optimizer, schedule, batches = _setup()
    checked = []
    check = snens.method.step.check_labels
    monkeypatch.setattr(
        snens.method.step, "check_labels", lambda y, k: (checked.append(y), check(y, k))[1]
    )
    mode = _Reads()
    with mode:
        stats = run_epoch(
            model,
            batches,
            optimizer,
            schedule,
            StepSettings(diversity_weight=0.1, grad_clip=1.0),
            epoch=0,
        )
    label_reads = 2 * STEPS  # int(labels.min()), int(labels.max()), on the host
    assert mode.reads == Counter({"__bool__": STEPS, "tolist": 1, "__int__": label_reads})
    assert [id(y) for y in checked] == [id(y) for _, y in batches]
    assert stats.steps == STEPS and stats.skipped == 0


def test_epoch_means_equal_the_per_step_values():
    """The device-side float64 sums give what per-step Python floats gave."""
    model, optimizer, schedule, batches = _setup()
    losses, norms = [], []
    model_b, optimizer_b, schedule_b, _ = _setup()  # the same model, trained step by step
    for x, y in batches:
        optimizer_b.zero_grad()
        logits = model_b(x)
        task = snens.ensemble_loss(logits, y)
        task.backward()
        norms.append(torch.nn.utils.get_total_norm([p.grad for p in model_b.parameters()]).item())
        losses.append(task.item())
        optimizer_b.step()
        schedule_b.step()
    stats = run_epoch(model, batches, optimizer, schedule, StepSettings(), epoch=0)
    assert stats.task_loss == sum(v * 4 for v in losses) / (4 * STEPS)
    assert stats.grad_norm == sum(norms) / STEPS
    assert stats.diversity_loss == 0.0


def test_a_nonfinite_gradient_with_a_finite_loss_is_named(monkeypatch):
    model, optimizer, schedule, batches = _setup()
    original = torch.nn.utils.get_total_norm
    monkeypatch.setattr(
        torch.nn.utils, "get_total_norm", lambda grads: original(grads) * float("inf")
    )
    with pytest.raises(NonFiniteLossError, match=r"the gradient norm is inf with a finite loss"):
        run_epoch(model, batches, optimizer, schedule, StepSettings(), epoch=0)
    assert all(p.grad is None for p in model.parameters())  # nothing of the step is left


def test_a_long_epoch_says_its_progress(monkeypatch):
    """Logged to a file (no bar), an epoch says step, pace and time left; texts in tokens."""
    model, optimizer, schedule, batches = _setup()
    lines = []
    clock = iter(float(t) for t in range(0, 1000, 7))  # each read of the clock: 7 s later
    monkeypatch.setattr(snens.engine.epoch.time, "perf_counter", lambda: next(clock))
    run_epoch(
        model,
        batches,
        optimizer,
        schedule,
        StepSettings(),
        epoch=1,
        say=lines.append,
        say_every=10.0,
    )
    # clock: start 0; step i ends at 7·i (one read per step): lines when 10 s have passed
    assert lines[0] == ("  epoch 2: step 2/5, 7.00 s/step, 0.6 examples/s, 21 s left in the epoch")
    assert [line.split(",")[0] for line in lines] == ["  epoch 2: step 2/5", "  epoch 2: step 4/5"]
    masked = [({"x": x, "attention_mask": torch.ones(4, 3)}, y) for x, y in batches]
    seen = _pace_lines(masked)
    assert "tokens/s" in seen[0] and "examples/s" not in seen[0]


def _pace_lines(batches):
    pace_lines = []
    pace = snens.engine.epoch._Pace(0, len(batches), 0.0, pace_lines.append, 0.0)
    for i, (x, y) in enumerate(batches):
        pace.count(x, y)
        pace.step(i + 1)
    return pace_lines
