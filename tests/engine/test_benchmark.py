import re

import pytest
import torch

from snens.engine.bench import load_harness

# the rows and the command line: the checkout's benchmarks/harness.py, as `snens bench` runs it
harness = load_harness()  # its folder first on sys.path: the measuring core beside it imports
from measure import Measure, compare, format_table  # noqa: E402


def test_verdicts_compare_the_median_with_the_target():
    assert Measure("a", 1.04, (1.0, 1.1), "≤1.05×", 10.0).verdict() == "met"
    assert Measure("b", 1.06, (1.0, 1.1), "≤1.05×", 10.0).verdict() == "NOT met"
    assert Measure("c", 0.9, (0.8, 1.0), "report", 10.0).verdict() == "report"
    table = format_table([Measure("a", 1.04, (1.0, 1.1), "≤1.05×", 10.0)])
    assert "| a | 1.040× | 1.00–1.10 | ≤1.05× | met | 10.0 |" in table


def test_compare_counts_calls_and_returns_the_ratio_of_work():
    calls = {"variant": 0, "baseline": 0}

    def variant():
        calls["variant"] += 1

    def baseline():
        calls["baseline"] += 1

    ratio, (low, high), _ = compare(variant, baseline, repeats=3, inner=4, warmup=1)
    assert calls == {"variant": 13, "baseline": 13}
    assert low <= ratio <= high


def test_peak_memory_counts_resident_tensors_and_the_forward_peak():
    import torch
    from measure import peak_memory_bytes
    from torch import nn

    class TwoBuffers(nn.Module):
        """Holds 4 kB of parameters; its forward peaks at two 4 MB tensors alive together."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(1000))

        def forward(self, x):
            a = torch.empty(1000, 1000)
            b = torch.empty(1000, 1000)
            del a, b
            return x.sum()

    peak = peak_memory_bytes(TwoBuffers(), torch.zeros(4))
    assert 8_004_000 <= peak <= 8_004_000 + 4096  # + the tiny output of sum


def test_norm_rows_cover_every_norm_and_mode(monkeypatch):
    monkeypatch.setattr(harness, "compare", lambda *a, **k: (1.0, (1.0, 1.0), 1e-3))
    rows = harness.norm_measures(2, 2, repeats=1)
    names = [r.name for r in rows]
    for norm in ("BatchNorm2d", "LayerNorm", "GroupNorm", "RMSNorm"):
        for mode in ("fwd+bwd vs", "fwd+bwd bf16 autocast", "eval fwd"):
            assert any(norm in n and mode in n for n in names), (norm, mode)
    assert all(r.target == "≤1.2×" for r in rows)


def test_absolute_throughput_of_single_snens_and_deep_ensemble():
    rows = harness.throughput("small_cnn", num_members=2, batch=4, repeats=2, image=(1, 28, 28))
    by_method = {r.method: r for r in rows}
    assert list(by_method) == ["single", "σN-Ens", "deep ensemble"]
    single = by_method["single"].params
    assert by_method["deep ensemble"].params == 2 * single
    assert single < by_method["σN-Ens"].params < 1.1 * single
    for r in rows:
        assert r.train_images_per_s > 0 and r.infer_images_per_s > 0
        assert r.train_peak_mib is None  # measured on GPUs only
        assert r.infer_peak_mib >= r.params * 4 / 2**20  # at least the float32 weights
    table = harness.format_throughput(rows)
    assert table.count("\n") == 4 and "| deep ensemble |" in table


def test_absolute_command_prints_the_table(capsys):
    assert harness.main(["--absolute", "--num-members", "2", "--batch", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| σN-Ens |" in out and "CPU, float32" in out


def test_plain_norm_copy_keeps_heads_and_replication_and_member_zero():
    """The ablation model: no member norm left, and in eval its member 0 is the ensemble's
    member 0 exactly (member 0's norms, member 0's head)."""
    import torch

    import snens

    torch.manual_seed(0)
    ens = snens.convert(snens.models.create("small_cnn", num_classes=10, width=8), 3).eval()
    with torch.no_grad():  # members that differ (a conversion starts them all equal)
        for module in ens.modules():
            if isinstance(module, snens.nn.MemberNorm):
                for p in (module.gamma, module.weight, module.bias):
                    p.copy_(torch.randn_like(p))
    ablated = harness.with_plain_norms(ens).eval()
    assert not any(isinstance(m, snens.nn.MemberNorm) for m in ablated.modules())
    assert any(isinstance(m, snens.nn.MemberNorm) for m in ens.modules())  # a copy
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        want, got = ens(x), ablated(x)
    assert got.shape == want.shape == (3, 5, 10)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[1], want[1])


def test_norms_only_prints_just_the_norm_rows(monkeypatch, capsys):
    monkeypatch.setattr(harness, "compare", lambda *a, **k: (1.0, (1.0, 1.0), 1e-3))
    assert harness.main(["--norms-only", "--num-members", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("| member ") == 12 and "resnet18" not in out


def test_steps_only_runs_the_three_step_rows(monkeypatch):
    import pytest

    monkeypatch.setattr(harness, "compare", lambda *a, **k: (1.0, (1.0, 1.0), 1e-3))
    rows = harness.run(num_members=2, batch=2, repeats=1, quick=True, steps_only=True)
    assert [r.name for r in rows] == [
        "resnet18: σN-Ens step (B=2) vs single at M·B",
        "resnet18: σN-Ens step with plain norms (heads, replication) vs single at M·B",
        "resnet18: σN-Ens step vs deep ensemble, B=2",
    ]
    assert [r.target for r in rows] == ["≤1.05×", "report", "≤1.0×"]
    with pytest.raises(ValueError, match="exclude each other"):
        harness.run(norms_only=True, steps_only=True)


def _row_names(out: str) -> list[str]:
    """The measure column of a printed ratio table, less a trailing parenthesis that holds a
    measured number (MiB, images/s, compile seconds)."""
    names = re.findall(r"^\| (.+?) \| \d+\.\d{3}× \|", out, re.MULTILINE)
    return [re.sub(r" \([^()]*\d[^()]*\)$", "", n) for n in names]


TINY = ["--num-members", "2", "--batch", "2", "--repeats", "1"]


def test_explicit_cpu_device_gives_the_default_rows(monkeypatch, capsys):
    monkeypatch.setattr(harness, "compare", lambda *a, **k: (1.0, (1.0, 1.0), 1e-3))
    assert harness.main(["--quick", *TINY]) == 0
    default = capsys.readouterr().out
    assert harness.main(["--quick", "--device", "cpu", *TINY]) == 0
    explicit = capsys.readouterr().out
    names = _row_names(default)
    assert len(names) == 12 + 8  # 4 norms × 3 modes, then ResNet-18's rows
    assert names[0] == "member BatchNorm2d fwd+bwd vs plain, same (M·B, …)"
    assert names[12:] == [
        "resnet18: σN-Ens step (B=2) vs single at M·B",
        "resnet18: σN-Ens step with plain norms (heads, replication) vs single at M·B",
        "resnet18: σN-Ens step vs deep ensemble, B=2",
        "resnet18: σN-Ens step channels-last vs contiguous",
        "resnet18: split step vs single at B",
        "resnet18: σN-Ens inference images/s vs deep ensemble",
        "resnet18: σN-Ens inference peak memory vs deep ensemble",
        "resnet18: parameters vs single",
    ]
    assert _row_names(explicit) == names
    assert " threads, torch " in explicit.splitlines()[-1]


def test_cuda_without_a_device_is_a_usage_error(monkeypatch, capsys):
    from snens.engine.cli import main as cli_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["--device", "cuda"], ["--absolute", "--device", "cuda"]):
        with pytest.raises(SystemExit) as exit_info:
            harness.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "argument --device: 'cuda', but torch" in err and "sees no CUDA device" in err
    with pytest.raises(SystemExit) as exit_info:  # the same through `snens bench`
        cli_main(["bench", "--steps-only", "--device", "cuda"])
    assert exit_info.value.code == 2
    with pytest.raises(ValueError, match="sees no CUDA device"):
        harness.run(device="cuda")
    with pytest.raises(ValueError, match="cpu or cuda, got 'meta'"):
        harness.throughput("small_cnn", device="meta")


def test_absolute_takes_the_backbone(capsys):
    """WRN-28-10 at the smallest sizes: 18-28 s on one busy CPU thread."""
    argv = ["--absolute", "--backbone", "wrn28_10", "--batch", "1", "--num-members", "2"]
    assert harness.main([*argv, "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| single | 36,479,194 |" in out  # WRN-28-10's parameters at 10 classes
    assert "| deep ensemble | 72,958,388 |" in out
    assert "wrn28_10, M=2, B=1, CPU, float32" in out


def test_absolute_refuses_a_backbone_without_an_image_input(capsys):
    with pytest.raises(SystemExit) as exit_info:
        harness.main(["--absolute", "--backbone", "minilm"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'minilm'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no known input shape for 'minilm'"):
        harness.throughput("minilm")


def test_bf16_steps_autocast_and_say_so(monkeypatch, capsys):
    """--steps-only --bf16: every timed training step runs under bf16 autocast, and each row
    names it; without the flag none does."""
    seen = []
    train_step = harness.train_step

    def recording_train_step(model, x, y, bf16=False):
        seen.append(bf16)
        return train_step(model, x, y, bf16)

    monkeypatch.setattr(harness, "train_step", recording_train_step)
    monkeypatch.setattr(harness, "compare", lambda *a, **k: (1.0, (1.0, 1.0), 1e-3))
    assert harness.main(["--steps-only", "--bf16", "--quick", *TINY]) == 0
    assert _row_names(capsys.readouterr().out) == [
        "resnet18 (bf16): σN-Ens step (B=2) vs single at M·B",
        "resnet18 (bf16): σN-Ens step with plain norms (heads, replication) vs single at M·B",
        "resnet18 (bf16): σN-Ens step vs deep ensemble, B=2",
    ]
    assert seen == [True] * 5, seen  # σN-Ens, single, plain-norm σN-Ens, single, deep
    seen.clear()
    assert harness.main(["--steps-only", "--quick", *TINY]) == 0
    assert "(bf16)" not in capsys.readouterr().out and seen == [False] * 5


def test_compile_only_yields_only_the_compile_rows(monkeypatch, capsys):
    # compilation itself is not what is tested (minutes on a CPU): torch.compile is the identity
    # here, undone cleanly (patching torch._dynamo.config.disable left it unreadable, and every
    # later torch.compile in the session failed)
    monkeypatch.setattr(torch, "compile", lambda model, *args, **kwargs: model)
    monkeypatch.setattr(harness, "compare", lambda *a, **k: (1.0, (1.0, 1.0), 1e-3))
    assert harness.main(["--compile-only", *TINY]) == 0
    assert _row_names(capsys.readouterr().out) == [
        "resnet18: σN-Ens step torch.compile vs eager",
        "vit_small: σN-Ens step torch.compile vs eager",
    ]
    for other in ("--norms-only", "--steps-only"):
        with pytest.raises(SystemExit) as exit_info:
            harness.main(["--compile-only", other])
        assert exit_info.value.code == 2
        assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(ValueError, match="exclude each other"):
        harness.run(compile_only=True, steps_only=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ratio_rows_run_on_cuda(monkeypatch, capsys):
    """The --quick rows at tiny sizes on cuda: every timed model and input lives there, the rows
    are the CPU run's, and the footer names the GPU."""
    devices = set()
    train_step = harness.train_step

    def recording_train_step(model, x, y, bf16=False):
        devices.update({x.device.type, y.device.type})
        devices.update(p.device.type for p in model.parameters())
        return train_step(model, x, y, bf16)

    monkeypatch.setattr(harness, "train_step", recording_train_step)
    assert harness.main(["--quick", "--device", "cuda", *TINY]) == 0
    out = capsys.readouterr().out
    assert devices == {"cuda"}
    names = _row_names(out)
    assert len(names) == 12 + 8 and names[12] == "resnet18: σN-Ens step (B=2) vs single at M·B"
    ratios = [float(r) for r in re.findall(r"^\| .+? \| (\d+\.\d{3})× \|", out, re.MULTILINE)]
    assert all(r > 0 for r in ratios)
    assert torch.cuda.get_device_name() in out.splitlines()[-1]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--repeats", "0"], "argument --repeats: must be an int in 1..1000, got 0"),
        (["--batch", "0"], "argument --batch: must be an int in 1..65536, got 0"),
        (["--threads", "-1"], "argument --threads: must be an int in 0..1024 (0 = all), got -1"),
        (
            ["--threads", "100000"],
            "argument --threads: must be an int in 0..1024 (0 = all), got 100000",
        ),
        (["--num-members", "0"], "argument --num-members: must be an int in 1..1024, got 0"),
        (
            ["--llm", "--llm-layers", "0"],
            "argument --llm-layers: must be an int in 1..30 (SmolLM2's decoder layers), got 0",
        ),
        (
            ["--llm", "--tokens", "0"],
            "argument --tokens: must be an int in 1..8192 (SmolLM2's context), got 0",
        ),
        (["--tokens", "many"], "argument --tokens: must be an int, got 'many'"),
    ],
)
def test_every_numeric_flag_is_bounded_before_anything_runs(flags, message, capsys):
    """Each had ended in a traceback from inside torch (--threads 100000: a segmentation
    fault in libgomp)."""
    from snens.engine.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"snens bench: error: {message}")
    assert "Traceback" not in err


def test_bench_without_a_checkout_says_where_the_harness_is(monkeypatch, tmp_path, capsys):
    """An installed package holds no benchmarks/: `snens bench` names what it looked for and
    exits 2, never a traceback."""
    from snens.engine import bench
    from snens.engine.cli import main

    monkeypatch.setattr(bench, "HARNESS_DIR", tmp_path / "benchmarks")
    with pytest.raises(FileNotFoundError, match="benchmarks/harness.py"):
        bench.load_harness()
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"snens bench: no benchmarks/harness.py in {tmp_path}: ")
    assert "pip install -e ." in err and "Traceback" not in err
