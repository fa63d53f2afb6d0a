"""Tests for hearth.kernels.attention (flash attention forward + backward).

Accuracy bound (from flash-attention's own tests): against an fp64 reference, the kernel's max error
(output and each gradient) is at most 2x the error of PyTorch's plain math in the same low precision,
plus a small absolute slack. On CPU the kernels run in Triton's interpreter: shapes stay tiny here.
The test_gpu_* tests (run them with -k gpu) use real shapes (T=4097, GQA 40/8, D=128) with the same
bound, and also require the error to be within 4x of torch SDPA's (flash / efficient backends).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from hearth.kernels.attention import _attention_fwd_op, attention
from tests.kernels.tolerance import DEVICE, DTYPES, HAS_CUDA, gpu_only

# Absolute slack on top of the 2x bound (covers cases where torch's own error is ~0, e.g. T=1).
SLACK = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _math_attention(q, k, v, causal, scale):
    """softmax(q k^T * scale + mask) v in q's dtype, K/V heads repeated for GQA. q [B,Hq,Tq,D]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        tq, tk = q.shape[2], k.shape[2]
        keep = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _run(fn, q, k, v, do):
    """(out, dq, dk, dv) of fn on fresh leaf copies of q, k, v."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(do.to(out.dtype))
    return [out.detach()] + [x.grad.detach() for x in leaves]


def _make(B, Hq, Hk, Tq, D, dtype, Tk=None, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    Tk = Tq if Tk is None else Tk
    q = torch.randn(B, Hq, Tq, D, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(B, Hk, Tk, D, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(B, Hk, Tk, D, generator=g).to(device=device, dtype=dtype)
    do = torch.randn(B, Hq, Tq, D, generator=g).to(device=device, dtype=dtype)
    return q, k, v, do


def _assert_within_bound(q, k, v, do, causal, scale, ours=None, low_precision=None):
    """Check the 2x-PyTorch bound for out, dq, dk, dv; `ours` / `low_precision` may be given."""
    dtype = q.dtype
    ref_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if ours is None:
        ours = _run(lambda a, b, c: attention(a, b, c, causal=causal, scale=scale), q, k, v, do)
    ref = _run(lambda a, b, c: _math_attention(a, b, c, causal, ref_scale), *(x.double() for x in (q, k, v)), do.double())
    if low_precision is None:
        low_precision = _run(lambda a, b, c: _math_attention(a, b, c, causal, ref_scale), q, k, v, do)
    for name, a, lp, r in zip(("out", "dq", "dk", "dv"), ours, low_precision, ref):
        assert a.shape == r.shape and a.dtype == dtype, f"{name}: {a.shape} {a.dtype}"
        assert torch.isfinite(a).all(), f"{name} has non-finite values"
        err = (a.double() - r.double()).abs().max().item()
        err_torch = (lp.double() - r.double()).abs().max().item()
        bound = 2 * err_torch + SLACK[dtype]
        assert err <= bound, f"{name}: max error {err:.3e} > bound {bound:.3e} (PyTorch {dtype} error {err_torch:.3e})"
    return ours, ref


# ---------------------------------------------------------------- correctness (interpreter-sized)
SHAPES = [  # (B, Hq, Hk, T, D): ragged T everywhere (interpreter blocks are 16/32), MHA and GQA
    (1, 2, 2, 17, 16),
    (2, 4, 2, 33, 32),
    (1, 4, 1, 70, 64),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_Hq{}_Hk{}_T{}_D{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_fp64_reference(dtype, causal, shape):
    B, Hq, Hk, T, D = shape
    q, k, v, do = _make(B, Hq, Hk, T, D, dtype)
    _assert_within_bound(q, k, v, do, causal, None)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_single_token(causal):
    q, k, v, do = _make(2, 4, 2, 1, 16, torch.bfloat16)
    _assert_within_bound(q, k, v, do, causal, None)


def test_custom_scale():
    q, k, v, do = _make(1, 4, 2, 33, 16, torch.float16, seed=3)
    _assert_within_bound(q, k, v, do, True, 0.37)
    # and the scale really is used: a different scale gives a different answer
    a = attention(q, k, v, causal=True, scale=0.37)
    b = attention(q, k, v, causal=True)
    assert (a.float() - b.float()).abs().max() > 1e-2


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fused_dq_variant(monkeypatch, causal):
    """FUSED_DQ: dQ summed by fp32 atomics inside the dK/dV kernel; same bound, GQA and ragged T."""
    mod = importlib.import_module("hearth.kernels.attention")

    monkeypatch.setattr(mod, "FUSED_DQ", True)
    q, k, v, do = _make(1, 4, 2, 70, 32, torch.bfloat16, seed=8)
    _assert_within_bound(q, k, v, do, causal, None)


def test_non_causal_different_lengths():
    q, k, v, do = _make(1, 2, 1, 17, 16, torch.float32, Tk=40, seed=4)
    _assert_within_bound(q, k, v, do, False, None)


def test_strided_inputs_match_contiguous():
    """HF hands over [B, T, H, D] storage viewed as [B, H, T, D]; strides are honoured, not copied."""
    B, Hq, Hk, T, D = 1, 4, 2, 33, 16
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, T, Hq, D, generator=g).to(DEVICE, torch.float16).transpose(1, 2)
    k = torch.randn(B, T, Hk, D, generator=g).to(DEVICE, torch.float16).transpose(1, 2)
    v = torch.randn(B, T, Hk, D, generator=g).to(DEVICE, torch.float16).transpose(1, 2)
    do = torch.randn(B, T, Hq, D, generator=g).to(DEVICE, torch.float16).transpose(1, 2)
    assert not q.is_contiguous()
    strided = _run(lambda a, b, c: attention(a, b, c, causal=True), q, k, v, do)
    contig = _run(lambda a, b, c: attention(a, b, c, causal=True), *(x.contiguous() for x in (q, k, v)), do.contiguous())
    for name, a, b in zip(("out", "dq", "dk", "dv"), strided, contig):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


def test_saved_logsumexp_is_the_logsumexp():
    q, k, v, _ = _make(1, 2, 1, 33, 16, torch.float32, seed=6)
    scale = 0.25
    out, lse = _attention_fwd_op(q, k, v, True, scale)
    s = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) * scale
    s = s.masked_fill(~torch.ones(33, 33, dtype=torch.bool, device=DEVICE).tril(), float("-inf"))
    assert lse.shape == (1, 2, 33) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)


def test_torch_compile_fullgraph():
    """The op is a torch.library custom op: no graph break, and gradients flow through it."""
    torch._dynamo.reset()

    def block(q, k, v):
        return (attention(q, k, v, causal=True) * 2.0).sum()

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager" if not HAS_CUDA else "inductor")
    q, k, v, _ = _make(1, 2, 1, 17, 16, torch.float32, seed=7)
    leaves_c = [x.clone().requires_grad_() for x in (q, k, v)]
    leaves_e = [x.clone().requires_grad_() for x in (q, k, v)]
    compiled(*leaves_c).backward()
    block(*leaves_e).backward()
    for a, b in zip(leaves_c, leaves_e):
        torch.testing.assert_close(a.grad, b.grad)


# ---------------------------------------------------------------- bad input
def _ok(dtype=torch.float16, B=1, Hq=2, Hk=1, T=5, D=16):
    q, k, v, _ = _make(B, Hq, Hk, T, D, dtype)
    return q, k, v


def test_rejects_non_tensor():
    q, k, v = _ok()
    with pytest.raises(TypeError, match="v"):
        attention(q, k, v.tolist())


def test_rejects_wrong_dtype():
    q, k, v = _ok()
    with pytest.raises(TypeError, match="q"):
        attention(q.to(torch.float64), k.double(), v.double())


def test_rejects_mixed_dtypes():
    q, k, v = _ok()
    with pytest.raises(TypeError, match="k"):
        attention(q, k.to(torch.bfloat16), v)


def test_rejects_different_devices():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="k"):
        attention(q, k.to("meta"), v)


def test_rejects_heads_not_divisible():
    q, _, _ = _ok(Hq=3)
    _, k, v = _ok(Hq=2, Hk=2)
    with pytest.raises(ValueError, match="heads"):
        attention(q, k, v)


def test_rejects_batch_mismatch():
    q, _, _ = _ok(B=2)
    _, k, v = _ok(B=1)
    with pytest.raises(ValueError, match="batch"):
        attention(q, k, v)


def test_rejects_causal_length_mismatch():
    q, k, v, _ = _make(1, 2, 1, 5, 16, torch.float16, Tk=7)
    attention(q, k, v)  # fine without the causal mask
    with pytest.raises(ValueError, match="causal"):
        attention(q, k, v, causal=True)


def test_rejects_value_shape_mismatch():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="v"):
        attention(q, k, v[:, :, :3])


def test_rejects_head_dim_mismatch():
    q, k, v = _ok()
    _, k32, _ = _ok(D=32)
    with pytest.raises(ValueError, match="k head dim"):
        attention(q, k32, v)


@pytest.mark.parametrize("D", [48, 8, 512])
def test_rejects_unsupported_head_dim(D):
    q, k, v = _ok(D=D)
    with pytest.raises(ValueError, match="q head dim"):
        attention(q, k, v)


def test_rejects_empty():
    q, k, v = _ok(T=0)
    with pytest.raises(ValueError, match="q must not be empty"):
        attention(q, k, v)


def test_rejects_wrong_ndim():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        attention(q[0], k, v)


def test_rejects_bad_causal_and_scale():
    q, k, v = _ok()
    with pytest.raises(TypeError, match="causal"):
        attention(q, k, v, causal=1)
    with pytest.raises(TypeError, match="scale"):
        attention(q, k, v, scale="0.1")
    with pytest.raises(ValueError, match="scale"):
        attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="scale"):
        attention(q, k, v, scale=-0.5)


# ---------------------------------------------------------------- GPU, real shapes
def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def _gpu_bound_vs_sdpa(B, Hq, Hk, T, D, dtype, causal):
    """The 2x bound against PyTorch's plain math in `dtype`, and the same ballpark as SDPA."""
    q, k, v, do = _make(B, Hq, Hk, T, D, dtype, device="cuda")
    ours, ref = _assert_within_bound(q, k, v, do, causal, None)
    sdpa = _run(lambda a, b, c: _sdpa(a, b, c, causal), q, k, v, do)
    for name, a, s, r in zip(("out", "dq", "dk", "dv"), ours, sdpa, ref):
        err, err_sdpa = (a.double() - r).abs().max().item(), (s.double() - r).abs().max().item()
        assert err <= 4 * err_sdpa + SLACK[dtype], f"{name}: error {err:.3e} vs SDPA's {err_sdpa:.3e}"


@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gqa_40_8_t4097(causal):
    _gpu_bound_vs_sdpa(1, 40, 8, 4097, 128, torch.bfloat16, causal)


@gpu_only
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_dtypes_head_dims(dtype, causal, D):
    _gpu_bound_vs_sdpa(2, 8, 2, 1000, D, dtype, causal)


@gpu_only
@pytest.mark.parametrize("D", [16, 32, 256])
def test_gpu_other_head_dims(D):
    _gpu_bound_vs_sdpa(1, 4, 4, 300, D, torch.bfloat16, True)


@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_fused_dq_variant(monkeypatch, causal):
    mod = importlib.import_module("hearth.kernels.attention")

    monkeypatch.setattr(mod, "FUSED_DQ", True)
    _gpu_bound_vs_sdpa(1, 40, 8, 4097, 128, torch.bfloat16, causal)


@gpu_only
def test_gpu_tma_path_matches_pointer_path():
    mod = importlib.import_module("hearth.kernels.attention")

    q, k, v, do = _make(2, 8, 2, 1000, 128, torch.bfloat16, device="cuda")
    fn = lambda a, b, c: attention(a, b, c, causal=True)  # noqa: E731
    old = mod.USE_TMA
    try:
        mod.USE_TMA = False
        expected = _run(fn, q, k, v, do)
        mod.USE_TMA = True
        got = _run(fn, q, k, v, do)
    finally:
        mod.USE_TMA = old
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=lambda m: f"{name}: {m}")


# ---------------------------------------------------------------- audit additions (CPU-sized)
def test_plane_wider_than_int32_is_copied_not_overflowed():
    # the kernels index inside one (b, h) [T, D] plane in int32; a strided q whose rows lie 2^30
    # elements apart spans > 2^31 elements there: it must be copied (same result), not overflow
    stride = (1 << 30) + 64
    g = torch.Generator().manual_seed(12)
    q = torch.empty(2 * stride + 16, dtype=torch.float16, device=DEVICE).as_strided((1, 1, 3, 16), (0, 0, stride, 1))
    q.copy_(torch.randn(1, 1, 3, 16, generator=g).to(DEVICE))
    k = torch.randn(1, 1, 3, 16, generator=g).to(DEVICE, torch.float16)
    v = torch.randn(1, 1, 3, 16, generator=g).to(DEVICE, torch.float16)
    q.requires_grad_()
    out = attention(q, k, v, causal=True)
    out.float().sum().backward()
    q_dense = q.detach().contiguous().requires_grad_()
    expected = attention(q_dense, k, v, causal=True)
    expected.float().sum().backward()
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(q.grad, q_dense.grad, atol=0, rtol=0)


def test_rejects_batch_times_heads_beyond_the_grid_limit():
    q = torch.zeros(65536, 1, 1, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"^q has batch x heads"):
        attention(q, q, q)


def test_rejects_int_dtype_and_other_device_for_each_argument():
    q, k, v = _ok()
    with pytest.raises(TypeError, match=r"^q\b"):
        attention(q.to(torch.int32), k.to(torch.int32), v.to(torch.int32))
    with pytest.raises(ValueError, match=r"\bv\b"):
        attention(q, k, v.to("meta"))
