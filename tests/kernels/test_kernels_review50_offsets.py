"""Review 50: 32-bit offset overflow at real shapes (logits 65536 x 151936, packed attention of 2^31+ elements).

CPU tests use tolerance.rows_past_int32's trick: a view whose rows lie 2^30 + 64 elements apart in ~4 GiB of
virtual memory (only the touched pages become resident), so that `row * stride` passes 2^31 while the stride itself
is still an int32 kernel argument; a kernel that multiplies in int32 wraps (under the interpreter too, whose numpy
int32 arithmetic wraps as the GPU's does). GPU-only tests (test_gpu_*) run the real sizes on an H200.
"""

from __future__ import annotations

import pytest
import torch

from hearth.kernels import attention_varlen, softmax, swiglu
from tests.kernels.tolerance import DEVICE, assert_close, gpu_only

STRIDE = (1 << 30) + 64  # rows this far apart: row 2 starts at element 2^31 + 128, the stride is an int32


def _huge(shape, strides, gen, dtype=torch.float16):
    """A view of `shape` / `strides` over ~4 GiB of virtual memory, filled from `gen` (few pages resident)."""
    extent = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    t = torch.empty(extent, dtype=dtype, device=DEVICE).as_strided(shape, strides)
    return t.copy_(torch.randn(shape, generator=gen).to(DEVICE, dtype))


def test_varlen_backward_preprocess_rows_past_int32():
    # The backward's delta = rowsum(dO * O) runs over the WHOLE packed axis as one dense [1, H, total, D] plane
    # (attention_varlen._varlen_backward, and the fused Gluon backward's _fb_prepare): its row offset is
    # row * token stride over every packed token, not one sequence's (which the public check bounds). At Qwen3-32B's
    # 64 x 128 heads that passes 2^31 at 262144 packed tokens. Here: three 1-token sequences (each sequence's own
    # plane is tiny, so nothing is copied) whose dO rows lie 2^30 + 64 elements apart.
    gen = torch.Generator().manual_seed(50)
    q, k, v = (torch.randn(3, 1, 16, generator=gen).to(DEVICE, torch.float16).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=DEVICE)
    do = _huge((3, 1, 16), (STRIDE, 16, 1), gen)
    out = attention_varlen(q, k, v, cu, cu, 1, 1)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out2 = attention_varlen(*leaves, cu, cu, 1, 1)
    want = torch.autograd.grad(out2, leaves, do.contiguous())
    for got, ref in zip((dq, dk, dv), want):
        torch.testing.assert_close(got, ref, atol=0, rtol=0)


# ------------------------------------------------------------- already int64: coverage the suite lacked (passed before)
def test_swiglu_rows_past_int32_forward_and_backward():
    # the row kernels (strided rows: not the flat kernels) form row * stride in int64
    gen = torch.Generator().manual_seed(51)
    gate, up = _huge((3, 40), (STRIDE, 1), gen), _huge((3, 40), (STRIDE, 1), gen)
    gate.requires_grad_()
    up.requires_grad_()
    h = swiglu(gate, up)
    dh = torch.randn(3, 40, generator=gen).to(DEVICE, torch.float16)
    dg, du = torch.autograd.grad(h, (gate, up), dh)
    g64, u64 = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    h64 = torch.nn.functional.silu(g64) * u64
    rg, ru = torch.autograd.grad(h64, (g64, u64), dh.double())
    g16, u16 = gate.detach().clone().requires_grad_(), up.detach().clone().requires_grad_()
    h16 = torch.nn.functional.silu(g16) * u16
    bg, bu = torch.autograd.grad(h16, (g16, u16), dh)
    assert_close(h, h64, torch.float16, "h", baseline=h16)
    assert_close(dg, rg, torch.float16, "dgate", baseline=bg)
    assert_close(du, ru, torch.float16, "dup", baseline=bu)


def test_softmax_backward_rows_past_int32():
    # the backward reads dy through its row stride (no copy: unit column stride), rows past 2^31
    gen = torch.Generator().manual_seed(52)
    x = torch.randn(3, 100, generator=gen).to(DEVICE, torch.float16).requires_grad_()
    dy = _huge((3, 100), (STRIDE, 1), gen)
    (dx,) = torch.autograd.grad(softmax(x), (x,), dy)
    x64 = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(torch.softmax(x64, -1), (x64,), dy.double())
    assert_close(dx, ref, torch.float16)


# ----------------------------------------------------------------------------------- GPU only: the real sizes
@pytest.mark.xdist_group("gpu_big")  # ~21 GiB live: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("fused", ["1", "0"], ids=["gluon-fused", "triton"])
def test_gpu_varlen_backward_past_2_31_packed_elements(monkeypatch, fused):
    """Qwen3-32B's attention (64 x 128 query heads, 8 K/V heads), causal, 33 packed sequences of 8192 tokens:
    out and dO are [270336, 64, 128] = 2.2e9 elements, so the delta preprocess (which walks the whole packed axis
    as one plane: the fused Gluon backward's _fb_prepare on Hopper, the Triton backward's _bwd_preprocess
    elsewhere or with HEARTH_ATTN_GLUON_BWD_FUSED=0) reads the last sequence's rows past element 2^31. Its
    gradients must equal those of the same sequence run alone: out, dK, dV bitwise (the same tiles), dQ to the
    last bits of the fused kernel's unordered fp32 adds."""
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", fused)
    n, T, Hq, Hk, D = 33, 8192, 64, 8, 128
    g = torch.Generator(device="cuda").manual_seed(53)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)

    q, k, v, do = rand(n * T, Hq, D), rand(n * T, Hk, D), rand(n * T, Hk, D), rand(n * T, Hq, D)
    assert do.numel() >= 2**31 and (n - 1) * T * Hq * D >= 2**31  # the last sequence starts past 2^31
    cu = torch.arange(0, (n + 1) * T, T, dtype=torch.int32, device="cuda")
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = attention_varlen(*leaves, cu, cu, T, T, causal=True)
    grads = torch.autograd.grad(out, leaves, do)
    s = slice((n - 1) * T, n * T)
    one = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    alone = [t.detach()[s].clone().requires_grad_() for t in (q, k, v)]
    out1 = attention_varlen(*alone, one, one, T, T, causal=True)
    want = torch.autograd.grad(out1, alone, do[s].contiguous())
    torch.testing.assert_close(out.detach()[s], out1.detach(), atol=0, rtol=0)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        got = got[s].float()
        tol = 0 if name != "dq" else 2e-2 * float(ref.float().abs().max())
        torch.testing.assert_close(got, ref.float(), atol=tol, rtol=0 if name != "dq" else 2e-2,
                                   msg=lambda m, name=name: f"{name}: {m}")
