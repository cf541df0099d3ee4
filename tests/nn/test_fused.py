"""The fused member-norm kernels: built once, used where they apply, never in the way.

A failed build falls back to the native per-member paths after one warning; ``SNENS_FUSED=0``,
bf16 and code being traced take them too; results with two threads equal the per-member loop;
concurrent and killed builds never block one another; each environment has its own build. That
the fused kernels compute the per-member loop of plain norms (outputs, input and parameter
gradients, running statistics, float32 and float64, every shape) is the matrix's
(``tests/nn/test_norms.py::test_every_member_norm_is_the_per_member_loop_of_plain_norms``, its
``dispatch`` path; ``no_fused`` is the fallback), and which input takes them
``tests/nn/test_norm_dispatch.py``'s.
"""

import copy
import importlib.util
import os
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch

import snens.nn as snn
from snens.nn import fused

from conftest import member_loop

M = 4
TOL = {"rtol": 1e-5, "atol": 1e-5}

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


def _randomized(layer: snn.MemberNorm, seed: int = 0) -> snn.MemberNorm:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        if getattr(layer, "running_mean", None) is not None:
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=g))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=g) + 0.5)
    return layer


# layer, one member's input, the fused kernel's autograd function
THREAD_CASES = {
    "layer_norm": (lambda: snn.MemberLayerNorm(64, M), (16, 9, 64), "_FusedMemberLayerNorm"),
    "batch_norm_2d": (lambda: snn.MemberBatchNorm2d(16, M), (8, 16, 6, 6), "_FusedMemberBatchNorm"),
}


@pytest.mark.parametrize("case", THREAD_CASES)
def test_two_threads_give_the_loop_results(case):
    """With two threads the fused kernels split their rows or channels between them: output,
    input and parameter gradients and running statistics still equal the member loop's."""
    make, per_member, function = THREAD_CASES[case]
    layer = _randomized(make()).train()
    ref = copy.deepcopy(layer)
    stats = {k: v.clone() for k, v in ref.named_buffers() if k in ("running_mean", "running_var")}
    g = torch.Generator().manual_seed(1)
    x = torch.randn((M * per_member[0], *per_member[1:]), generator=g) * 2 + 0.5
    grad = torch.randn(x.shape, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = []
        for lay, run in ((layer, layer), (ref, lambda t: member_loop(ref, t, stats))):
            xi = x.clone().requires_grad_(True)
            y = run(xi)
            y.backward(grad)
            results.append((y, xi.grad, {n: p.grad for n, p in lay.named_parameters()}))
    finally:
        torch.set_num_threads(threads)
    (y, gx, params), (y_ref, gx_ref, params_ref) = results
    assert type(y.grad_fn).__name__ == f"{function}Backward"
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)
    assert params.keys() == params_ref.keys() >= {"gamma", "weight", "bias"}
    for name in params:
        torch.testing.assert_close(params[name], params_ref[name], **TOL, msg=name)
    for name, value in stats.items():
        torch.testing.assert_close(getattr(layer, name), value, **TOL, msg=name)


def test_switched_off_bf16_and_compiled_inputs_take_the_loop(monkeypatch):
    layer = _randomized(snn.MemberLayerNorm(8, M))
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
    layer = _randomized(snn.MemberLayerNorm(8, M))
    x = torch.randn(M * 3, 5, 8)
    with pytest.warns(RuntimeWarning, match="no compiler.*SNENS_FUSED=0"):
        y = layer(x)
    assert fused.build_error() == "CalledProcessError: no compiler"
    torch.testing.assert_close(y, member_loop(layer, x), rtol=0, atol=0)  # the loop itself
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        layer(x)


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
