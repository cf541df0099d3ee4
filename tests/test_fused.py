"""The fused member LayerNorm kernel equals the member loop of plain layer norms.

Reference: for each member m, ``F.layer_norm`` on rows [m·B, (m+1)·B) with the folded affine
sigmoid(gamma_m)·weight_m, sigmoid(gamma_m)·bias_m, concatenated. The fused kernel must match it
in outputs, input gradients and the gradients of gamma, weight and bias; it must be the path a
float32/float64 CPU input takes, and every other case (SNENS_FUSED=0, bf16, a failed build) must
take the loop with the same results.
"""

import copy
import importlib.util
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

import snens.nn as snn
from snens.nn import fused

from conftest import member_loop

M = 4
TOL = {"float32": {"rtol": 1e-5, "atol": 1e-5}, "float64": {"rtol": 1e-12, "atol": 1e-12}}

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        os.environ.get(fused.ENV) == "0", reason=f"{fused.ENV}=0 turns the fused kernels off"
    ),
]


def _toolchain_missing() -> str | None:
    """Why no build can be tried here (no C++ compiler, no ninja), or None."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} is not on PATH)"
    if importlib.util.find_spec("ninja") is None and shutil.which("ninja") is None:
        return "no ninja (pip install ninja)"
    return None


@pytest.fixture(scope="module", autouse=True)
def built():
    """Skip only where no build can be tried; where it can, a failed build fails these tests
    (the loop fallback hides it from users, so this is where it must show)."""
    missing = _toolchain_missing()
    if missing is not None:
        pytest.skip(f"the fused kernels cannot be built here: {missing}")
    assert fused.available(), f"the fused kernels failed to build: {fused.build_error()}"


def _layer(normalized_shape, bias=True, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    layer = snn.MemberLayerNorm(normalized_shape, M, bias=bias).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    return layer


def _both(layer, x, grad):
    results = []
    for lay, run in ((layer, layer), (copy.deepcopy(layer), None)):
        run = run or (lambda t, lay=lay: member_loop(lay, t))
        xi = x.detach().clone().requires_grad_(True)
        y = run(xi)
        y.backward(grad)
        results.append((y, xi.grad, {n: p.grad for n, p in lay.named_parameters()}))
    return results


def _assert_same(results, tol):
    (y, gx, params), (y_ref, gx_ref, params_ref) = results
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(gx, gx_ref, **tol)
    assert params.keys() == params_ref.keys()
    for name in params:
        torch.testing.assert_close(params[name], params_ref[name], **tol, msg=name)


CASES = {
    "seq": (8, (3, 7, 8), True),
    "two_dims": ((3, 8), (3, 3, 8), True),
    "no_bias": (8, (3, 7, 8), False),
    "one_row_per_member": (16, (1, 16), True),
    "wide_offset": (384, (2, 5, 384), True),  # large D, mean far from 0
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_fused_equals_the_member_loop(case, dtype):
    shape, per_member, bias = CASES[case]
    layer = _layer(shape, bias, dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn((M * per_member[0], *per_member[1:]), generator=g, dtype=dtype) * 3 + 0.5
    if case == "wide_offset":
        x = x * 100 + 1000
    grad = torch.randn(x.shape, generator=g, dtype=dtype)
    results = _both(layer, x, grad)
    assert type(results[0][0].grad_fn).__name__ == "_FusedMemberLayerNormBackward"
    _assert_same(results, TOL[str(dtype).split(".")[-1]])


def test_strided_input_and_no_grad_eval():
    layer = _layer(8).eval()
    base = torch.randn(M * 3, 8, 7)
    x = base.transpose(1, 2)  # (M·3, 7, 8), not contiguous
    grad = torch.randn(x.shape)
    _assert_same(_both(layer, x, grad), TOL["float32"])
    with torch.no_grad():
        y = layer(x)
        assert y.grad_fn is None
        torch.testing.assert_close(y, member_loop(layer, x), **TOL["float32"])


def test_two_threads_give_the_loop_results():
    layer = _layer(64)
    x = torch.randn(M * 16, 9, 64)
    grad = torch.randn(x.shape)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = _both(layer, x, grad)
    finally:
        torch.set_num_threads(threads)
    _assert_same(results, TOL["float32"])


def test_switched_off_bf16_and_compiled_inputs_take_the_loop(monkeypatch):
    layer = _layer(8)
    x = torch.randn(M * 3, 5, 8, requires_grad=True)
    monkeypatch.setenv(fused.ENV, "0")
    assert not fused.available()
    assert type(layer(x).grad_fn).__name__ == "CatBackward0"
    monkeypatch.delenv(fused.ENV)
    assert not fused.applies(x.bfloat16(), layer.weight.bfloat16().float())
    assert not fused.applies(x.bfloat16(), layer.weight.bfloat16())
    assert fused.applies(x, layer.weight)


def test_a_failed_build_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(fused, "_built", None)
    monkeypatch.setattr(fused, "_error", None)
    monkeypatch.setattr(fused, "_build", lambda: (False, "CalledProcessError: no compiler"))
    layer = _layer(8)
    x = torch.randn(M * 3, 5, 8)
    with pytest.warns(RuntimeWarning, match="no compiler.*SNENS_FUSED=0"):
        y = layer(x)
    assert fused.build_error() == "CalledProcessError: no compiler"
    torch.testing.assert_close(y, member_loop(layer, x), rtol=0, atol=0)  # the loop itself
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        layer(x)


# ---------------------------------------------------------------------------- batch norm


def _bn_layer(kind, C, track=True, momentum=0.1, dtype=torch.float32, seed=0):
    cls = {"1d": snn.MemberBatchNorm1d, "2d": snn.MemberBatchNorm2d, "3d": snn.MemberBatchNorm3d}
    layer = cls[kind](C, M, track_running_stats=track, momentum=momentum).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
        if track:
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=g))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=g) + 0.5)
    return layer


BN_CASES = {
    "1d_flat": ("1d", (3, 5)),
    "1d_seq": ("1d", (3, 5, 7)),
    "2d": ("2d", (3, 6, 5, 4)),
    "3d": ("3d", (2, 6, 3, 4, 2)),
    "2d_one_image": ("2d", (1, 6, 3, 3)),
}


@pytest.mark.parametrize("fused_on", [True, False], ids=["fused", "out_kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("track", [True, False], ids=["running", "batch_only"])
@pytest.mark.parametrize("case", BN_CASES)
def test_batch_norm_paths_equal_the_member_loop(
    case, track, training, dtype, fused_on, monkeypatch
):
    if not fused_on:
        monkeypatch.setenv(fused.ENV, "0")
    kind, per_member = BN_CASES[case]
    layer = _bn_layer(kind, per_member[1], track=track, dtype=dtype).train(training)
    ref = copy.deepcopy(layer)
    stats = {k: v.clone() for k, v in ref.named_buffers() if k in ("running_mean", "running_var")}
    g = torch.Generator().manual_seed(2)
    x = torch.randn((M * per_member[0], *per_member[1:]), generator=g, dtype=dtype) * 2 + 0.5
    grad = torch.randn(x.shape, generator=g, dtype=dtype)
    results = []
    for lay, run in ((layer, layer), (ref, lambda t: member_loop(ref, t, stats))):
        xi = x.clone().requires_grad_(True)
        y = run(xi)
        y.backward(grad)
        results.append((y, xi.grad, {n: p.grad for n, p in lay.named_parameters()}))
    expected = "_FusedMemberBatchNormBackward" if fused_on else "_MemberBatchNormFunctionBackward"
    assert type(results[0][0].grad_fn).__name__ == expected
    _assert_same(results, TOL[str(dtype).split(".")[-1]])
    for name, value in stats.items():
        torch.testing.assert_close(getattr(layer, name), value, **TOL[str(dtype).split(".")[-1]])


def test_batch_norm_no_grad_and_cumulative_momentum():
    layer = _bn_layer("2d", 6, momentum=None).train()
    ref = copy.deepcopy(layer)
    stats = {"running_mean": ref.running_mean.clone(), "running_var": ref.running_var.clone()}
    for call in range(1, 4):
        x = torch.randn(M * 3, 6, 4, 4) + call
        with torch.no_grad():
            y = layer(x)
            want = member_loop(ref, x, stats, momentum=1.0 / call)
        assert y.grad_fn is None
        torch.testing.assert_close(y, want, **TOL["float32"])
    torch.testing.assert_close(layer.running_mean, stats["running_mean"], **TOL["float32"])
    torch.testing.assert_close(layer.running_var, stats["running_var"], **TOL["float32"])
    assert int(layer.num_batches_tracked) == 3


def test_batch_norm_channels_last_keeps_the_out_kernel_path():
    layer = _bn_layer("2d", 6).train()
    x = torch.randn(M * 3, 6, 5, 4).contiguous(memory_format=torch.channels_last)
    y = layer(x.requires_grad_(True))
    assert type(y.grad_fn).__name__ == "_MemberBatchNormFunctionBackward"
    assert y.is_contiguous(memory_format=torch.channels_last)


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    return int(child.stdout)


def test_a_build_lock_whose_process_is_gone_is_taken_with_torchs(tmp_path):
    """A build killed at any moment leaves its lock file and torch's; neither blocks the next."""
    import platform

    (tmp_path / "snens.lock").write_text(f"{platform.node()} {_dead_pid()}")
    (tmp_path / "lock").touch()  # torch's, which its own loop would wait on forever
    start = time.monotonic()
    with fused._build_lock(tmp_path):
        assert time.monotonic() - start < 5
        assert (tmp_path / "snens.lock").read_text() == f"{platform.node()} {os.getpid()}"
        assert not (tmp_path / "lock").exists()
    assert not (tmp_path / "snens.lock").exists()


def test_a_live_builders_lock_is_waited_for_then_times_out(tmp_path, monkeypatch):
    from snens.locks import LockHeldError, hold

    (tmp_path / "lock").touch()  # the live build's torch lock: not ours to remove
    monkeypatch.setattr(fused, "_WAIT_S", 1)
    with hold(tmp_path / "snens.lock", "a build"):
        start = time.monotonic()
        with pytest.raises(LockHeldError, match=r"kernel build .* is in use by .* \d+"):
            with fused._build_lock(tmp_path):
                pass
        assert 1 <= time.monotonic() - start < 5  # waited its _WAIT_S, then gave up
        assert (tmp_path / "lock").exists()
    with fused._build_lock(tmp_path):  # released: taken at once
        pass


def test_a_build_waits_for_the_other_builder_and_then_builds(tmp_path):
    """The second of two concurrent builds takes the lock as soon as the first lets go."""
    import threading

    from snens.locks import hold

    took = []
    with hold(tmp_path / "snens.lock", "a build"):
        waiter = threading.Thread(target=lambda: took.append(_take(tmp_path)))
        waiter.start()
        time.sleep(0.6)
        assert took == []  # still waiting
    waiter.join(timeout=10)
    assert took == [True]


def _take(directory):
    with fused._build_lock(directory):
        return True


def test_each_environment_and_checkout_has_its_own_build(monkeypatch, tmp_path):
    """torch's build.ninja holds absolute paths: a shared directory would be rebuilt by every
    other virtual environment or checkout, so each gets its own name."""
    import sys

    here = fused._build_name()
    assert fused._build_name() == here  # stable
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-venv"))
    assert fused._build_name() != here
    monkeypatch.undo()
    copy = tmp_path / "csrc"
    copy.mkdir()
    for source in fused._SOURCES:
        (copy / source.name).write_text(source.read_text())
    monkeypatch.setattr(fused, "_SOURCES", tuple(copy / s.name for s in fused._SOURCES))
    assert fused._build_name() != here  # same sources, another checkout


def test_build_kernels_command(monkeypatch, capsys):
    from snens.engine.cli import main

    assert main(["build-kernels"]) == 0
    out = capsys.readouterr()
    library = Path(out.out.split(" (")[0])
    assert library.is_file() and library.suffix == ".so"
    assert "snens: kernels cached in" in out.err or "built the fused kernels" in out.err
    monkeypatch.setattr(fused, "_build", lambda verbose=False: (False, "OSError: no g++"))
    assert main(["build-kernels"]) == 1
    assert "no g++; member norms will run their native-kernel paths" in capsys.readouterr().err
