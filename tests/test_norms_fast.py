"""Fast paths of the member norms equal the per-member loop of plain torch norms.

The reference runs, for each member m, the plain functional norm on rows [m·B, (m+1)·B) with the
folded affine sigmoid(gamma_m)·weight_m and sigmoid(gamma_m)·bias_m, and
concatenates. The fast paths (one ``native_batch_norm.out`` per member into one output for batch
norms, one whole-tensor group norm for GroupNorm) must match it in outputs, input gradients,
gradients of gamma, weight and bias, and running statistics, in training and eval, float32 and
bf16 autocast, contiguous and channels-last, with one example per member.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

import snens.nn as snn

from conftest import member_loop

M = 4
TOL = {"rtol": 1e-5, "atol": 1e-5}
BF16_TOL = {"rtol": 2e-2, "atol": 2e-2}


pytestmark = pytest.mark.usefixtures("one_thread")


# name: (layer factory, input shape per member)
CASES = {
    "bn1d": (lambda: snn.MemberBatchNorm1d(5, M), (3, 5)),
    "bn1d_seq": (lambda: snn.MemberBatchNorm1d(5, M), (3, 5, 7)),
    "bn2d": (lambda: snn.MemberBatchNorm2d(6, M), (3, 6, 5, 4)),
    "bn3d": (lambda: snn.MemberBatchNorm3d(6, M), (2, 6, 3, 4, 2)),
    "bn2d_no_stats": (lambda: snn.MemberBatchNorm2d(6, M, track_running_stats=False), (3, 6, 5, 4)),
    "gn": (lambda: snn.MemberGroupNorm(3, 6, M), (3, 6, 5, 4)),
    "gn3d": (lambda: snn.MemberGroupNorm(2, 6, M), (3, 6, 7)),
    "gn5d": (lambda: snn.MemberGroupNorm(2, 6, M), (2, 6, 3, 2, 2)),
    "gn2d_input": (lambda: snn.MemberGroupNorm(2, 6, M), (3, 6)),
    "in1d": (lambda: snn.MemberInstanceNorm1d(6, M), (3, 6, 7)),
    "in2d": (lambda: snn.MemberInstanceNorm2d(6, M), (3, 6, 5, 4)),
    "ln": (lambda: snn.MemberLayerNorm(8, M), (3, 7, 8)),
    "ln2": (lambda: snn.MemberLayerNorm((3, 8), M), (3, 3, 8)),
    "rms": (lambda: snn.MemberRMSNorm(8, M, eps=1e-6), (3, 7, 8)),
}
BATCH_NORMS = snn.MemberBatchNorm1d | snn.MemberBatchNorm2d | snn.MemberBatchNorm3d


def _randomized(make, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    layer = make()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
        if getattr(layer, "running_mean", None) is not None:
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=g))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=g) + 0.5)
    return layer


def _run_both(case, training, *, rows=None, channels_last=False, autocast=False, seed=0):
    make, shape = CASES[case]
    shape = (rows or shape[0], *shape[1:])
    fast = _randomized(make, seed).train(training)
    ref = copy.deepcopy(fast)
    stats = {k: v.clone() for k, v in ref.named_buffers() if k in ("running_mean", "running_var")}
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((M * shape[0], *shape[1:]), generator=g) * 2 + 0.5
    if channels_last:
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    grad = torch.randn(x.shape, generator=g)
    results = []
    for layer, run in ((fast, lambda t: fast(t)), (ref, lambda t: member_loop(ref, t, stats))):
        xi = x.detach().clone(memory_format=torch.preserve_format).requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = run(xi.bfloat16() if autocast else xi)
        y.backward(grad.to(y.dtype))
        params = {n: p.grad for n, p in layer.named_parameters()}
        results.append((y, xi.grad, params))
    return fast, stats, results


def _assert_equal_results(results, tol):
    (y, gx, params), (y_ref, gx_ref, params_ref) = results
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(gx, gx_ref, **tol)
    assert params.keys() == params_ref.keys() and params.keys() >= {"gamma", "weight"}
    for name in params:
        torch.testing.assert_close(params[name], params_ref[name], **tol, msg=name)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("training", [True, False])
def test_fast_path_equals_the_member_loop(case, training):
    fast, stats, results = _run_both(case, training)
    _assert_equal_results(results, TOL)
    for name, value in stats.items():
        torch.testing.assert_close(getattr(fast, name), value, **TOL, msg=name)


@pytest.mark.parametrize("case", ["bn2d", "bn3d", "gn", "gn5d"])
@pytest.mark.parametrize("training", [True, False])
def test_channels_last_inputs(case, training):
    fast, stats, results = _run_both(case, training, channels_last=True)
    _assert_equal_results(results, TOL)
    for name, value in stats.items():
        torch.testing.assert_close(getattr(fast, name), value, **TOL, msg=name)
    y = results[0][0]
    if isinstance(fast, BATCH_NORMS):  # the batch-norm path keeps the memory format
        fmt = torch.channels_last if y.dim() == 4 else torch.channels_last_3d
        assert y.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("case", ["bn1d_seq", "bn2d", "bn3d", "gn", "ln", "rms"])
@pytest.mark.parametrize("training", [True, False])
def test_one_example_per_member(case, training):
    fast, stats, results = _run_both(case, training, rows=1)
    _assert_equal_results(results, TOL)
    for name, value in stats.items():
        torch.testing.assert_close(getattr(fast, name), value, **TOL, msg=name)


# plain and member RMSNorm alike warn on a bf16 input with float32 weights (torch falls back)
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
@pytest.mark.parametrize("case", ["bn1d_seq", "bn2d", "bn3d", "gn", "ln", "rms"])
@pytest.mark.parametrize("training", [True, False])
def test_bf16_autocast_and_bf16_inputs(case, training):
    """Under CPU autocast norms run in their input's dtype; a bf16 input stays bf16."""
    fast, stats, results = _run_both(case, training, autocast=True)
    assert results[0][0].dtype == results[1][0].dtype == torch.bfloat16
    _assert_equal_results(results, BF16_TOL)
    for name, value in stats.items():
        torch.testing.assert_close(getattr(fast, name), value, **BF16_TOL, msg=name)


def test_non_dense_input_and_gradient():
    """A strided (sliced) input and an expanded gradient take the batch-norm path too."""
    layer = _randomized(CASES["bn2d"][0]).train()
    ref = copy.deepcopy(layer)
    stats = {"running_mean": ref.running_mean.clone(), "running_var": ref.running_var.clone()}
    base = torch.randn(M * 3, 6, 5, 8)
    for lay, run in ((layer, layer), (ref, lambda t: member_loop(ref, t, stats))):
        x = base.clone().requires_grad_(True)
        run(x[..., ::2]).sum().backward()  # sum's gradient is an expanded (stride-0) tensor
        lay.grad_x = x.grad
    torch.testing.assert_close(layer.grad_x, ref.grad_x, **TOL)
    torch.testing.assert_close(layer.running_mean, stats["running_mean"], **TOL)


def test_frozen_affine_still_gives_the_input_gradient():
    layer = _randomized(CASES["bn2d"][0]).train()
    for p in layer.parameters():
        p.requires_grad_(False)
    x = torch.randn(M * 3, 6, 5, 4, requires_grad=True)
    layer(x).pow(2).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.no_grad():  # inference: no graph, same output
        stats = {"running_mean": layer.running_mean, "running_var": layer.running_var}
        torch.testing.assert_close(layer.eval()(x), member_loop(layer, x, stats), **TOL)


def test_double_backward_of_batch_norm_is_refused_clearly():
    layer = snn.MemberBatchNorm2d(6, M).train()
    x = torch.randn(M * 3, 6, 5, 4, requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_num_batches_tracked_and_cumulative_momentum():
    layer = snn.MemberBatchNorm2d(6, M, momentum=None).train()
    ref = copy.deepcopy(layer)
    for step in range(3):
        x = torch.randn(M * 3, 6, 2, 2) + step
        layer(x)
        with torch.no_grad():
            for m, xm in enumerate(x.chunk(M)):
                F.batch_norm(
                    xm, ref.running_mean[m], ref.running_var[m], None, None, True, 1 / (step + 1)
                )
    assert int(layer.num_batches_tracked) == 3
    torch.testing.assert_close(layer.running_mean, ref.running_mean, **TOL)
    torch.testing.assert_close(layer.running_var, ref.running_var, **TOL)


def test_torch_compile_of_a_model_with_member_norms_runs():
    if not torch._dynamo.is_dynamo_supported():  # e.g. a Python newer than this torch knows
        pytest.skip("torch.compile is not supported on this Python/platform")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        snn.MemberBatchNorm2d(8, M),
        torch.nn.ReLU(),
        snn.MemberGroupNorm(2, 8, M),
        torch.nn.Flatten(1),
        snn.MemberLayerNorm(8 * 4 * 4, M),
    )
    x = torch.randn(M * 2, 3, 4, 4)
    want = copy.deepcopy(model)(x)
    got = torch.compile(model, backend="aot_eager")(x)  # any failure here is a failure
    torch.testing.assert_close(got, want, **TOL)
    got.sum().backward()
    assert model[1].gamma.grad is not None


def test_two_forwards_then_one_backward():
    """Running statistics updated by a second forward do not break the first one's backward."""
    layer = _randomized(CASES["bn2d"][0]).train()
    ref = copy.deepcopy(layer)
    stats = {"running_mean": ref.running_mean.clone(), "running_var": ref.running_var.clone()}
    x = torch.randn(M * 3, 6, 5, 4)
    grads = []
    for run in (layer, lambda t: member_loop(ref, t, stats)):
        xi = x.clone().requires_grad_(True)
        (run(xi).sum() + run(2 * xi).pow(2).sum()).backward()
        grads.append(xi.grad)
    torch.testing.assert_close(grads[0], grads[1], **TOL)
    torch.testing.assert_close(layer.running_mean, stats["running_mean"], **TOL)


@pytest.mark.parametrize("case", ["bn1d_seq", "bn2d", "bn3d", "bn2d_no_stats"])
@pytest.mark.parametrize("training", [True, False])
def test_no_grad_forward_skips_the_autograd_function_with_equal_results(case, training):
    """Inference (no_grad) takes the kernel loop without the autograd function: same output and
    running statistics as the member loop, and a graph-free result."""
    layer = _randomized(CASES[case][0], seed=3).train(training)
    ref = copy.deepcopy(layer)
    stats = {k: v.clone() for k, v in ref.named_buffers() if k in ("running_mean", "running_var")}
    x = torch.randn((M * 3, *CASES[case][1][1:]), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        y = layer(x)
        want = member_loop(ref, x, stats)
    assert y.grad_fn is None
    torch.testing.assert_close(y, want, **TOL)
    for name, value in stats.items():
        torch.testing.assert_close(getattr(layer, name), value, **TOL, msg=name)
    if training and "running_mean" in stats:  # the training forward moved them
        assert not torch.allclose(layer.running_mean, _randomized(CASES[case][0], 3).running_mean)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rms_norm_matches_the_member_loop_bit_for_bit(dtype):
    """float32/64 take one rms_norm plus a broadcast member weight, the loop's arithmetic op for
    op; bf16 (weight applied inside rms_norm's upcast) keeps the loop. Either way: identical."""
    layer = _randomized(CASES["rms"][0]).to(dtype).eval()
    x = torch.randn(M * 3, 7, 8, dtype=dtype, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got, want = layer(x), member_loop(layer, x, {})
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["bn2d", "ln", "rms", "gn"])
def test_torch_func_transforms_take_the_plain_ops(case):
    """Inside vmap and grad the custom kernels stand aside: per-sample results of vmap equal a
    loop over samples, and torch.func.grad equals autograd's input gradient."""
    layer = _randomized(CASES[case][0], seed=7).eval()
    shape = (M * CASES[case][1][0], *CASES[case][1][1:])
    x = torch.randn((5, *shape), generator=torch.Generator().manual_seed(8))
    got = torch.func.vmap(layer)(x)
    torch.testing.assert_close(got, torch.stack([layer(sample) for sample in x]), **TOL)
    grad = torch.func.grad(lambda t: layer(t).pow(2).sum())(x[0])
    xi = x[0].clone().requires_grad_(True)
    layer(xi).pow(2).sum().backward()
    torch.testing.assert_close(grad, xi.grad, **TOL)
