"""The whole ensemble exports with a dynamic batch size: torch.export and ONNX equal eager."""

import logging
import warnings

import pytest
import torch

import snens

from conftest import TinyResNet, TinyTransformer, randomize_norms

pytestmark = pytest.mark.usefixtures("one_thread")

M = 4
BATCH_SIZES = (1, 3, 8, 17)
# eager runs the fused CPU kernels, the exported graph the per-member loop of plain norms:
# measured |eager − exported| <= 4e-7 (torch.export and onnxruntime) on logits of order 1
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _resnet():
    torch.manual_seed(0)
    return randomize_norms(TinyResNet()).eval()


def _transformer():
    torch.manual_seed(0)
    return randomize_norms(TinyTransformer()).eval()


def _small_cnn():
    torch.manual_seed(0)
    return randomize_norms(snens.models.create("small_cnn", in_channels=1, num_classes=10)).eval()


def _images(channels: int, size: int):
    def make(batch: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, channels, size, size, generator=g),), {}

    return make


def _tokens(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 50, (batch, 7), generator=g),), {}


def _tokens_with_mask(batch: int, seed: int = 0):
    (ids,), _ = _tokens(batch, seed)
    mask = torch.ones(batch, 7, dtype=torch.long)
    mask[::2, 4:] = 0  # padding in every other example
    return (ids,), {"attention_mask": mask}


def _keyword_images(batch: int, seed: int = 0):
    """Inputs by keyword only, as a Hugging Face model takes them (pixel_values=…)."""
    (x,), _ = _images(3, 8)(batch, seed)
    return (), {"x": x}


def _llama_classifier():
    """A Hugging Face ``LlamaForSequenceClassification`` (2 layers of width 32): it pools the
    last token that is not padding, whose index the export must keep dynamic in the batch."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=3,
        pad_token_id=0,
        use_cache=False,
    )
    torch.manual_seed(0)
    return randomize_norms(transformers.LlamaForSequenceClassification(config)).eval()


def _padded_tokens(batch: int, seed: int = 0):
    """Right-padded token ids (pad 0) with their mask, by keyword as a Hugging Face model takes
    them; lengths differ between examples."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (batch, 7), generator=g)
    mask = torch.ones(batch, 7, dtype=torch.long)
    for i in range(batch):
        mask[i, 7 - i % 4 :] = 0
    return (), {"input_ids": ids * mask, "attention_mask": mask}


# (name, model, inputs(batch) -> (args, kwargs))
CASES = [
    ("resnet", _resnet, _images(3, 8)),
    ("resnet_keyword_only", _resnet, _keyword_images),
    ("transformer", _transformer, _tokens),
    ("transformer_mask", _transformer, _tokens_with_mask),
    ("small_cnn", _small_cnn, _images(1, 28)),
    ("llama_sequence_classification", _llama_classifier, _padded_tokens),
]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def exported(request):
    """An ensemble of each model and its program, exported from an example of B=5."""
    name, model, inputs = request.param
    ens = snens.convert(model(), num_members=M).eval()
    args, kwargs = inputs(5, seed=99)
    program = snens.export(ens, *args, **kwargs)
    return ens, program, inputs


@pytest.mark.parametrize("batch", BATCH_SIZES)
def test_exported_program_equals_eager_at_every_batch_size(exported, batch):
    ens, program, inputs = exported
    args, kwargs = inputs(batch)
    with torch.no_grad():
        expected = ens(*args, **kwargs)
        got = program.module()(*args, **kwargs)
    assert got.shape == (M, batch, expected.shape[-1])
    torch.testing.assert_close(got, expected, **TOL)


def test_exported_graph_holds_standard_ops_only(exported):
    _, program, _ = exported
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not [t for t in targets if "snens" in t], targets


def test_torch_export_with_a_batch_dim_directly(resnet):
    """The plain torch.export call, without snens.export: (B, …) per-example args are dynamic."""
    ens = snens.convert(resnet, num_members=M).eval()
    batch = torch.export.Dim("batch")
    example = torch.randn(5, 3, 8, 8)
    program = torch.export.export(ens, (example,), dynamic_shapes={"args": ({0: batch},)})
    for b in BATCH_SIZES:
        x = torch.randn(b, 3, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), ens(x), **TOL)


def test_export_refuses_training_mode_and_a_batch_of_one(resnet):
    ens = snens.convert(resnet, num_members=M)
    with pytest.raises(ValueError, match="eval"):
        snens.export(ens.train(), torch.randn(4, 3, 8, 8))
    with pytest.raises(ValueError, match="B >= 2"):
        snens.export(ens.eval(), torch.randn(1, 3, 8, 8))
    with pytest.raises(TypeError, match="snens.Ensemble"):
        snens.export(resnet, torch.randn(4, 3, 8, 8))


def test_export_leaves_eager_outputs_unchanged(resnet):
    ens = snens.convert(resnet, num_members=M).eval()
    x = torch.randn(6, 3, 8, 8)
    with torch.no_grad():
        before = ens(x)
        snens.export(ens, x)
        after = ens(x)
    assert torch.equal(before, after)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_onnx_model_equals_eager_at_every_batch_size(case, tmp_path):
    pytest.importorskip("onnx", reason="ONNX export needs onnx: pip install 'snens[export]'")
    pytest.importorskip(
        "onnxscript", reason="ONNX export needs onnxscript: pip install 'snens[export]'"
    )
    ort = pytest.importorskip(
        "onnxruntime",
        reason="running the ONNX model needs onnxruntime: pip install 'snens[export]'",
    )
    name, model, inputs = case
    ens = snens.convert(model(), num_members=M).eval()
    args, kwargs = inputs(5, seed=99)
    path = snens.export_onnx(ens, tmp_path / f"{name}.onnx", *args, **kwargs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    # named as the forward's keywords (positional: input), the output logits, the batch batch
    assert names == ["input"] * len(args) + list(kwargs)
    assert [i.shape[0] for i in session.get_inputs()] == ["batch"] * len(names)
    (output,) = session.get_outputs()
    assert output.name == "logits" and output.shape[:2] == [M, "batch"]
    for b in BATCH_SIZES:
        args, kwargs = inputs(b)
        feed = dict(zip(names, [t.numpy() for t in (*args, *kwargs.values())], strict=True))
        (got,) = session.run(None, feed)
        with torch.no_grad():
            expected = ens(*args, **kwargs)
        torch.testing.assert_close(torch.from_numpy(got), expected, **TOL)


def test_onnx_input_names_are_checked_against_the_inputs(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    ens = snens.convert(_transformer(), num_members=M).eval()
    (ids,), kwargs = _tokens_with_mask(5)
    with pytest.raises(ValueError, match=r"input_names \['ids'\] name 1 inputs, but the example"):
        snens.export_onnx(ens, tmp_path / "t.onnx", ids, input_names=["ids"], **kwargs)
    path = snens.export_onnx(ens, tmp_path / "t.onnx", ids, input_names=["ids", "mask"], **kwargs)
    import onnx

    graph = onnx.load(path).graph
    assert [i.name for i in graph.input] == ["ids", "mask"]
    assert [o.name for o in graph.output] == ["logits"]


def _tiny_bert():
    """A Hugging Face ``BertForSequenceClassification`` of width 32, built from a config."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        vocab_size=100,
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).eval()


def _bert_tokens(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (batch, 7), generator=g)
    return (), {"input_ids": ids, "attention_mask": torch.ones(batch, 7, dtype=torch.long)}


QUIET_CASES = [("small_cnn", _small_cnn, _images(1, 28)), ("bert", _tiny_bert, _bert_tokens)]


@pytest.mark.parametrize("case", QUIET_CASES, ids=[c[0] for c in QUIET_CASES])
def test_a_correct_onnx_export_prints_nothing_and_warns_nothing(case, tmp_path, capfd, caplog):
    """torch.onnx's progress lines, its skipped torchvision ops, onnxscript's constant folding
    ("Evaluation failed: …") and torch's own LeafSpec deprecation stay out of a clean export."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    name, model, inputs = case
    ens = snens.convert(model(), num_members=M).eval()
    args, kwargs = inputs(5, seed=99)
    capfd.readouterr()
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        snens.export_onnx(ens, tmp_path / f"{name}.onnx", *args, **kwargs)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert [r.getMessage() for r in caplog.records] == []  # pytest's handler, else stderr
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def test_onnx_export_keeps_other_messages_and_restores_the_filters(monkeypatch, tmp_path, caplog):
    """Only the known chatter is dropped, only during the export: another record of the same
    loggers and another warning show, an error raises, and the loggers are as they were."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    ens = snens.convert(_small_cnn(), num_members=M).eval()
    x = torch.randn(3, 1, 28, 28)
    folding = logging.getLogger("onnxscript.optimizer._constant_folding")
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    before = (list(folding.filters), list(registration.filters))
    real_export = torch.onnx.export

    def chatty(*args, fail=False, **kwargs):
        folding.warning("Evaluation failed: %s", "cannot reshape")
        folding.warning("a real problem")
        registration.warning("torchvision is not installed. Skipping %s", "torchvision::nms")
        warnings.warn(
            "`isinstance(treespec, LeafSpec)` is deprecated, use …", FutureWarning, stacklevel=2
        )
        warnings.warn("a real warning", UserWarning, stacklevel=2)
        if fail:
            raise RuntimeError("a real error")
        return real_export(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", chatty)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        snens.export_onnx(ens, tmp_path / "c.onnx", x)
    assert [r.getMessage() for r in caplog.records] == ["a real problem"]
    assert [str(w.message) for w in caught] == ["a real warning"]
    assert (folding.filters, registration.filters) == before

    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: chatty(*a, fail=True, **k))
    with pytest.raises(RuntimeError, match="a real error"), pytest.warns(UserWarning):
        snens.export_onnx(ens, tmp_path / "d.onnx", x)
    assert (folding.filters, registration.filters) == before
    folding.warning("Evaluation failed: %s", "after the export")
    assert caplog.records[-1].getMessage() == "Evaluation failed: after the export"
