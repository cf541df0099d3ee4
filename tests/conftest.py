"""Shared by the tests: a ResNet-style CNN, a pre-norm transformer, the member-norm reference."""

import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from hypothesis import settings
from torch import nn

import snens.models
import snens.nn as snn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Without a CUDA device the Triton member-norm kernels are tested in Triton's interpreter on CPU
# tensors (snens.nn.triton_norms), which must be chosen before triton is imported; with one,
# they are compiled and run on it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Property tests: `make test` draws the same inputs on every run ("ci": derandomized, no example
# database), so a CI result never depends on chance; `make fuzz` searches new inputs each run
# ("explore", 20× the inputs) to find bugs, which then become fixed regression tests.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("SNENS_FUZZ_PROFILE", "ci"))

# The tests under tests/docs/ hold the README, the docs and the docstrings to their text; with the
# studies' checks of their committed reports they carry the pins_text marker, so
# `pytest -m "not pins_text"` runs the behaviour tests alone.
_DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs") + os.sep


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.path).startswith(_DOCS):
            item.add_marker(pytest.mark.pins_text)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class TinyResNet(nn.Module):
    """A nested ResNet: stem, two stages of basic blocks, pooled linear head."""

    def __init__(self, num_classes: int = 5, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        self.layers = nn.ModuleList(
            [
                nn.Sequential(BasicBlock(width, width)),
                nn.Sequential(BasicBlock(width, 2 * width, stride=2)),
            ]
        )
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for layer in self.layers:
            x = layer(x)
        return self.fc(x.mean(dim=(2, 3)))


class PreNormBlock(nn.Module):
    def __init__(self, dim: int, heads: int = 2) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, key_padding_mask=None):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=key_padding_mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """A pre-norm text classifier taking ``input_ids`` and an ``attention_mask`` keyword."""

    def __init__(self, vocab: int = 50, dim: int = 16, depth: int = 2, num_classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([PreNormBlock(dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids, attention_mask=None):
        x = self.embed(input_ids)
        pad = None if attention_mask is None else attention_mask == 0
        for block in self.blocks:
            x = block(x, key_padding_mask=pad)
        x = self.norm(x)
        if attention_mask is None:
            pooled = x.mean(dim=1)
        else:
            w = attention_mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * w).sum(1) / w.sum(1)
        return self.head(pooled)


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random norm affine and running statistics, as a trained model would have."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d | nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a whole test module (``pytestmark = usefixtures("one_thread")``).

    Tiny tensors gain nothing from threads, and on a loaded 2-core machine the OpenMP threads
    contend: measured 44-48 s with 2 threads vs 3.7 s with 1 for tests/baselines, 10x for the
    corruption tests.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def resnet():
    torch.manual_seed(0)
    return randomize_norms(TinyResNet()).eval()


@pytest.fixture
def transformer():
    torch.manual_seed(0)
    return randomize_norms(TinyTransformer()).eval()


@pytest.fixture
def text_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (5, 7), generator=g)
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return ids, mask


def member_loop(layer, x: torch.Tensor, stats: dict | None = None, momentum=None) -> torch.Tensor:
    """The member norms' reference: for each member m, the plain functional norm on its rows
    [m·B, (m+1)·B) with its folded affine sigmoid(gamma_m)·weight_m, sigmoid(gamma_m)·bias_m,
    concatenated. Batch norms use the rows of ``stats["running_mean"]``/``["running_var"]``
    (updated in place in training) and ``momentum`` (default: the layer's)."""
    stats = stats or {}
    s = torch.sigmoid(layer.gamma)
    scale = s * layer.weight
    shift = None if layer.bias is None else s * layer.bias
    rows = x.shape[0] // layer.num_members
    outs = []
    for m in range(layer.num_members):
        xm = x[m * rows : (m + 1) * rows]
        b = None if shift is None else shift[m]
        if isinstance(layer, snn.MemberBatchNorm1d | snn.MemberBatchNorm2d | snn.MemberBatchNorm3d):
            rm = stats["running_mean"][m] if "running_mean" in stats else None
            rv = stats["running_var"][m] if "running_var" in stats else None
            use_batch = layer.training or rm is None
            mom = layer.momentum if momentum is None else momentum
            y = F.batch_norm(xm, rm, rv, scale[m], b, use_batch, mom, layer.eps)
        elif isinstance(layer, snn.MemberGroupNorm):
            y = F.group_norm(xm, layer.num_groups, scale[m], b, layer.eps)
        elif isinstance(layer, snn.MemberRMSNorm):
            y = F.rms_norm(xm, layer.normalized_shape, scale[m], layer.eps)
        else:
            y = F.layer_norm(xm, layer.normalized_shape, scale[m], b, layer.eps)
        outs.append(y)
    return torch.cat(outs)


@pytest.fixture(autouse=True)
def _norm_registrations_end_with_the_test():
    """A test's snens.nn.register_norm calls are undone after it, so no other test (in this
    worker process) converts with a norm class it did not register."""
    from snens.nn import registry

    kept = dict(registry._TABLE)
    yield
    registry._TABLE.clear()
    registry._TABLE.update(kept)


# The study scripts of experiments/ as modules, for the tests of the studies that register
# backbones of their own: each imported once per test module, its backbones taken off the
# registry after, so no other test sees them (snens.models.available).
_EXPERIMENTS = str(Path(__file__).resolve().parents[1] / "experiments")


def _experiment(name: str, backbones: Sequence[str]) -> Iterator[ModuleType]:
    sys.path.insert(0, _EXPERIMENTS)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(_EXPERIMENTS)
        sys.modules.pop(name, None)
        for backbone in backbones:
            snens.models._BUILDERS.pop(backbone, None)


@pytest.fixture(scope="module")
def holdout() -> Iterator[ModuleType]:
    yield from _experiment("holdout", ("holdout_mlp", "holdout_gn_cnn"))


@pytest.fixture(scope="module")
def fresh() -> Iterator[ModuleType]:
    yield from _experiment("fresh", ("fresh_review_transformer", "fresh_convnext"))
