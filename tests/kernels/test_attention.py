"""Tests for hearth.kernels.attention (flash attention forward + backward).

Accuracy: THE rule of tests/kernels/tolerance.py, against an fp64 reference, with PyTorch's plain math
in the same low precision as the baseline (it rounds P and the matmul results as hearth does): the
kernel's max error (output and each gradient) is at most 2x that baseline's, plus the small floor. On
CPU the kernels run in Triton's interpreter: shapes stay tiny here. The test_gpu_* tests (run them with
-k gpu) use real shapes (T=4097, GQA 40/8, D=16..256) with the same rule.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from hearth.kernels.attention import _attention_fwd_op, attention
from tests.kernels.no_lse import check_forward_skips_logsumexp
from tests.kernels.tolerance import DEVICE, DTYPES, HAS_CUDA, assert_close, gpu_only


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
        assert_close(a, r, dtype, name, baseline=lp)
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
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")  # FUSED_DQ is the Triton backward's variant
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


def _bthd_views(B, Hq, Hk, T, D, dtype, seed, device=DEVICE):
    """q, k, v as transposed views of dense [B, T, H, D] tensors (HF's layout), each a non-leaf view of a leaf."""
    g = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(B, T, h, D, generator=g).to(device, dtype).requires_grad_() for h in (Hq, Hk, Hk)]
    return leaves, [x.transpose(1, 2) for x in leaves]


def test_output_and_gradients_follow_the_inputs_memory_order():
    """As PyTorch's SDPA: for q / k / v that are [B, T, H, D] tensors viewed as [B, H, T, D], the output and the
    gradients come back in that memory order (their .transpose(1, 2) is dense, so the model's reshape to
    [B, T, H * D] copies nothing); for dense [B, H, T, D] inputs everything stays dense [B, H, T, D]. The
    custom ops' fake impls give the same strides (opcheck), as torch.compile relies on."""
    _, (q, k, v) = _bthd_views(1, 4, 2, 21, 16, torch.float16, seed=11)
    out = attention(q, k, v, causal=True)
    assert out.transpose(1, 2).is_contiguous() and not out.is_contiguous()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert g.transpose(1, 2).is_contiguous(), (name, g.stride())
    with torch.no_grad():
        assert attention(q, k, v, causal=True).transpose(1, 2).is_contiguous()
    dense = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
    out_d = attention(*dense, causal=True)
    assert out_d.is_contiguous()
    assert all(g.is_contiguous() for g in torch.autograd.grad(out_d, dense, torch.ones_like(out_d)))
    qs, ks, vs = (x.detach() for x in (q, k, v))
    torch.library.opcheck(torch.ops.hearth.attention_fwd, (qs, ks, vs, True, 0.25))
    torch.library.opcheck(torch.ops.hearth.attention_infer, (qs, ks, vs, True, 0.25))
    o, lse = torch.ops.hearth.attention_fwd(qs, ks, vs, True, 0.25)
    torch.library.opcheck(torch.ops.hearth.attention_bwd, (torch.ones_like(o), qs, ks, vs, o, lse, True, 0.25))


def test_expanded_or_overlapping_inputs_get_dense_outputs():
    """empty_heads_like takes the [B, T, H, D] order only for inputs whose heads do not overlap: an expanded
    multi-query k (stride 0 across heads) must not give dK / dV a [B, T, H, D] buffer whose [T, D] plane spans
    H times the checked input's (the kernels' in-plane offsets are int32); its gradients come back dense
    [B, H, T, D] and match the dense call's."""
    from hearth.kernels._common import empty_heads_like

    big = torch.empty(1, 1, 300000, 128).expand(1, 64, 300000, 128)  # strides (.., 0, 128, 1): no memory touched
    assert big.stride(1) == 0 and empty_heads_like(big, big.shape).is_contiguous()
    qkv = torch.empty(2, 7, 3 * 4 * 16).view(2, 7, 3, 4, 16)[:, :, 0].transpose(1, 2)  # q sliced from a fused qkv
    assert empty_heads_like(qkv, qkv.shape).transpose(1, 2).is_contiguous()
    q, k1, v1, do = _make(1, 4, 1, 19, 16, torch.float32, seed=13)
    k, v = k1.expand(1, 4, 19, 16), v1.expand(1, 4, 19, 16)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k1, v1)]
    out = attention(leaves[0], leaves[1].expand(1, 4, 19, 16), leaves[2].expand(1, 4, 19, 16), causal=True)
    out.backward(do)
    want = _run(lambda a, b, c: attention(a, b, c, causal=True), q, k.contiguous(), v.contiguous(), do)
    torch.testing.assert_close(out.detach(), want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(leaves[1].grad, want[2].sum(1, keepdim=True), atol=1e-4, rtol=1e-4)


def test_saved_logsumexp_is_the_logsumexp():
    q, k, v, _ = _make(1, 2, 1, 33, 16, torch.float32, seed=6)
    scale = 0.25
    out, lse = _attention_fwd_op(q, k, v, True, scale)
    s = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) * scale
    s = s.masked_fill(~torch.ones(33, 33, dtype=torch.bool, device=DEVICE).tril(), float("-inf"))
    assert lse.shape == (1, 2, 33) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)


def test_preprocess_can_clear_the_fused_backward_dq_buffer():
    """_bwd_preprocess_kernel with ZERO_ACC (the fused Gluon backward's preprocess, one launch instead of a fill and
    the delta pass): delta = rowsum(dO * O) at every row, and the dQ buffer's first ACC_HEADS heads cleared over
    all N_PAD_Q columns (past T too: the grid covers the padding); the heads after them, and delta's neighbours,
    untouched."""
    from hearth.kernels.attention import _bwd_preprocess_kernel

    g = torch.Generator().manual_seed(3)
    B, H, T, D, n_pad, heads, block = 2, 3, 50, 16, 96, 4, 16
    out = torch.randn(B, T, H, D, generator=g).transpose(1, 2).to(DEVICE)  # strided, as a [B, T, H, D] output
    do = torch.randn(B, H, T, D, generator=g).to(DEVICE)
    delta = torch.full((B * H * T + 7,), float("nan"), device=DEVICE)
    acc = torch.full((B * H, D, n_pad), float("nan"), device=DEVICE)
    _bwd_preprocess_kernel[(-(-n_pad // block), B * H)](
        out, do, delta, *out.stride(), *do.stride(), H, T, HEAD_DIM=D, BLOCK_M=block,
        DQacc=acc, ACC_HEADS=heads, N_PAD_Q=n_pad, ZERO_ACC=True,
    )
    want = (out.double() * do.double()).sum(-1).flatten()
    torch.testing.assert_close(delta[:B * H * T].double(), want, rtol=1e-5, atol=1e-5)
    assert delta[B * H * T:].isnan().all()
    assert (acc[:heads] == 0).all()
    assert acc[heads:].isnan().all()


@pytest.mark.parametrize("D", [16, 24], ids=["D16", "D24_padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_without_grad_skips_the_logsumexp(monkeypatch, causal, D):
    """No input needs a gradient (or grad mode is off): the kernel runs with STORE_LSE=False, no logsumexp
    is allocated, and the output is bitwise the training forward's (the same kernel and config)."""
    q, k, v, _ = _make(1, 4, 2, 19, D, torch.float32, seed=9)
    check_forward_skips_logsumexp(monkeypatch, importlib.import_module("hearth.kernels.attention"),
                                  "_attention_forward", lambda q, k, v: attention(q, k, v, causal=causal), q, k, v)


def test_inference_op_opcheck():
    """The no-logsumexp forward is its own custom op (what torch.compile traces without grad): its fake
    impl and schema agree with the real one."""
    q, k, v, _ = _make(1, 2, 1, 9, 16, torch.float32, seed=10)
    torch.library.opcheck(torch.ops.hearth.attention_infer, (q, k, v, True, 0.25))
    out = torch.ops.hearth.attention_infer(q, k, v, True, 0.25)
    assert torch.equal(out, attention(q, k, v, causal=True, scale=0.25))


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


@pytest.mark.parametrize("D", [257, 512])
def test_rejects_unsupported_head_dim(D):
    q, k, v = _ok(D=D)
    with pytest.raises(ValueError, match="q head dim"):
        attention(q, k, v)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [8, 24, 48])
def test_head_dims_that_are_not_powers_of_two_run_padded(D, causal):
    """80 and 96 (real models) on the GPU; here the same padding path at interpreter size."""
    q, k, v, do = _make(1, 4, 2, 33, D, torch.float32)
    _assert_within_bound(q, k, v, do, causal, None)


def test_rejects_empty():
    q, k, v = _ok(T=0)
    with pytest.raises(ValueError, match="q must not be empty"):
        attention(q, k, v)


def test_forward_config_rule_replaces_the_autotuner_on_hopper_at_head_dim_64(monkeypatch):
    """forward_config: on Hopper, bf16 / fp16, head_dim 64, the rule's config by causal (64x64 w4 s3 causal, 128x64
    w8 s3 not; packed rows 64x64 w4 s3 either way); None elsewhere (the autotuner). Both rule configs are list entries (so the every-config GPU test
    runs them) and keep the causal block invariant. _launch launches the rule's config when the autotuner is on,
    and the list's first when HEARTH_ATTN_AUTOTUNE is off, as before."""
    mod = importlib.import_module("hearth.kernels.attention")
    for dtype in (torch.bfloat16, torch.float16):
        assert mod.forward_config((9, 0), dtype, 64, True) == (64, 64, 4, 3)
        assert mod.forward_config((9, 0), dtype, 64, False) == (128, 64, 8, 3)
        for causal in (True, False):  # packed rows (attention_varlen): one config, causal or not
            assert mod.forward_config((9, 0), dtype, 64, causal, varlen=True) == (64, 64, 4, 3)
    assert mod.forward_config((9, 0), torch.float32, 64, True) is None
    assert mod.forward_config((9, 0), torch.bfloat16, 128, True) is None
    assert mod.forward_config((9, 0), torch.bfloat16, 32, True) is None
    assert mod.forward_config((8, 0), torch.bfloat16, 64, True) is None
    assert mod.forward_config(None, torch.bfloat16, 64, True) is None
    assert mod.forward_config((9, 0), torch.bfloat16, 128, False, varlen=True) is None
    assert mod.forward_config((8, 0), torch.bfloat16, 64, False, varlen=True) is None
    for cfg in [*mod.FWD_RULE_HOPPER_D64.values(), mod.FWD_RULE_HOPPER_D64_VARLEN]:
        assert cfg in mod._FWD_CANDIDATES["d64"] and cfg[0] % cfg[1] == 0

    launched = []

    class _Raw:
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append((grid, meta))

    monkeypatch.setattr(mod, "interpret_mode", lambda: False)
    args = (torch.empty(1, dtype=torch.bfloat16),)
    for autotune, want in ((True, (64, 64, 4, 3)), (False, mod._FWD_CANDIDATES["d64"][0])):
        monkeypatch.setattr(mod, "AUTOTUNE", autotune)
        launched.clear()
        mod._launch(_Raw(), None, "fwd", mod._FWD_CANDIDATES, 1000, 8, args, {"HEAD_DIM": 64},
                    fixed=(64, 64, 4, 3))
        (grid, meta), = launched
        assert (meta["BLOCK_M"], meta["BLOCK_N"], meta["num_warps"], meta["num_stages"]) == want
        assert grid == (-(-1000 // want[0]), 8)


def test_config_tables_keep_the_causal_block_invariant(monkeypatch):
    """A dQ config with BLOCK_M < BLOCK_N (64 x 128) sat in the head_dim<=64 list; the GPU autotuner
    picked it at head_dim 16 and 32 and the causal dQ was wrong (max error 1.28). The tables are checked
    at import now; a bad entry must be refused, and the interpreter run with that shape must be wrong
    without the check (the bug is real, not only a rule)."""
    mod = importlib.import_module("hearth.kernels.attention")
    mod._check_tables()
    for table in (mod._FWD_CANDIDATES, mod._DQ_CANDIDATES):
        assert all(bm % bn == 0 for cls in table.values() for bm, bn, _, _ in cls)
    assert all(bn % bm == 0 for cls in mod._DKDV_CANDIDATES.values() for bm, bn, _, _ in cls)
    bad = {k: list(v) for k, v in mod._DQ_CANDIDATES.items()}
    bad["d64"].append((64, 128, 4, 3))
    monkeypatch.setattr(mod, "_DQ_CANDIDATES", bad)
    with pytest.raises(AssertionError, match="BLOCK_M % BLOCK_N"):
        mod._check_tables()
    # the same shape of config (dQ block 16 rows, key blocks 32 wide) really computes a wrong dQ: under
    # the interpreter through its fixed blocks, on the GPU through the fp32 list with autotuning off
    monkeypatch.setattr(mod, "_INTERPRET", {**mod._INTERPRET, "dq": (16, 32, 4, 1)})
    monkeypatch.setattr(mod, "AUTOTUNE", False)
    monkeypatch.setitem(mod._DQ_CANDIDATES, "fp32", [(16, 32, 4, 2)])
    q, k, v, do = _make(1, 2, 2, 40, 16, torch.float32)
    ours = _run(lambda a, b, c: attention(a, b, c, causal=True), q, k, v, do)
    ref = _run(lambda a, b, c: _math_attention(a, b, c, True, 0.25), *(x.double() for x in (q, k, v)), do.double())
    assert (ours[1].double() - ref[1]).abs().max() > 1e-2  # dq wrong with BLOCK_M < BLOCK_N
    assert (ours[2].double() - ref[2]).abs().max() < 1e-4  # dk fine (its own kernel)


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
def _gpu_bound_vs_sdpa(B, Hq, Hk, T, D, dtype, causal):
    """The rule against PyTorch's plain math in `dtype` (SDPA's flash/efficient backends round
    differently -- fp32 P -- so they are not the same-dtype baseline; they are timed in the bench)."""
    q, k, v, do = _make(B, Hq, Hk, T, D, dtype, device="cuda")
    _assert_within_bound(q, k, v, do, causal, None)


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gqa_40_8_t4097(causal):
    _gpu_bound_vs_sdpa(1, 40, 8, 4097, 128, torch.bfloat16, causal)


@gpu_only
@pytest.mark.parametrize("bwd", ["routed", "triton"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_dtypes_head_dims(dtype, causal, D, bwd, monkeypatch):
    """bwd "routed": as attention() picks (on Hopper, bf16 / fp16: the fused Gluon backward); "triton": the Triton
    backward kernels (HEARTH_ATTN_GLUON_BWD_FUSED=0)."""
    if bwd == "triton":
        monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")
    _gpu_bound_vs_sdpa(2, 8, 2, 1000, D, dtype, causal)


@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [16, 32, 80, 96, 256])
def test_gpu_other_head_dims(D, causal):
    _gpu_bound_vs_sdpa(1, 4, 4, 300, D, torch.bfloat16, causal)


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("Hq,Hk", [(8, 8), (16, 4), (40, 8), (20, 4), (32, 4)])
def test_gpu_gqa_ratios(Hq, Hk):
    """GQA ratios 1, 4, 5, 8 at T=2049 (ragged), D=128, causal, bf16."""
    _gpu_bound_vs_sdpa(1, Hq, Hk, 2049, 128, torch.bfloat16, True)


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
def test_gpu_strided_bthd_views():
    """q, k, v as transposed [B, T, H, D] views (what HF attention modules hand over), bf16, GQA 40/8."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1500, 40, 128, generator=g).to("cuda", torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, 1500, 8, 128, generator=g).to("cuda", torch.bfloat16).transpose(1, 2)
    v = torch.randn(1, 1500, 8, 128, generator=g).to("cuda", torch.bfloat16).transpose(1, 2)
    do = torch.randn(1, 40, 1500, 128, generator=g).to("cuda", torch.bfloat16)
    _assert_within_bound(q, k, v, do, True, None)


@gpu_only
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_bthd_order_output_and_gradients_match_dense_bitwise(D, monkeypatch):
    """On the GPU (head_dim 128: the Gluon ping-pong forward storing through a 4-D TMA descriptor with the
    [B, T, H, D] strides; 64: the Triton kernels; the Triton backward, whose dQ has the same bits every run:
    the fused Gluon backward's fp32 adds do not), HF-ordered inputs give an output and gradients in that
    order, bitwise equal to the dense-layout call's."""
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")
    leaves, (q, k, v) = _bthd_views(2, 8, 2, 777, D, torch.bfloat16, seed=12, device="cuda")
    out = attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert out.transpose(1, 2).is_contiguous() and all(g.transpose(1, 2).is_contiguous() for g in grads)
    dense = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
    out_d = attention(*dense, causal=True)
    grads_d = torch.autograd.grad(out_d, dense, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (out_d, *grads_d)):
        assert torch.equal(a, b), name


@gpu_only
@pytest.mark.parametrize("cls,D,dtype", [("d64", 64, torch.bfloat16), ("d128", 128, torch.bfloat16),
                                         ("large", 256, torch.bfloat16), ("fp32", 64, torch.float32)])
def test_gpu_every_config_is_correct(monkeypatch, cls, D, dtype):
    """Every (BLOCK_M, BLOCK_N, warps, stages) the autotuner may pick, each run once (causal, GQA 4/2,
    ragged T=300), under the rule: the autotuner tests only its winner, and a wrong config it never picks
    on one GPU may win on another (the 64 x 128 dQ entry did, at head_dim 16/32)."""
    mod = importlib.import_module("hearth.kernels.attention")
    monkeypatch.setattr(mod, "AUTOTUNE", False)
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")  # the Triton backward's tables, on Hopper too
    tables = {"fwd": mod._FWD_CANDIDATES, "dkdv": mod._DKDV_CANDIDATES, "dq": mod._DQ_CANDIDATES}
    n = max(len(t[cls]) for t in tables.values())
    q, k, v, do = _make(1, 4, 2, 300, D, dtype, device="cuda")
    for i in range(n):
        for name, table in tables.items():
            entries = table[cls]
            monkeypatch.setitem(table, cls, [entries[i % len(entries)]] + list(entries))
        try:
            _assert_within_bound(q, k, v, do, True, None)
        except AssertionError as e:
            picked = {name: table[cls][0] for name, table in tables.items()}
            raise AssertionError(f"configs {picked}: {e}") from e
        for name, table in tables.items():
            monkeypatch.setitem(table, cls, list(table[cls][1:]))


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_fused_dq_variant(monkeypatch, causal):
    mod = importlib.import_module("hearth.kernels.attention")

    monkeypatch.setattr(mod, "FUSED_DQ", True)
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")  # FUSED_DQ is the Triton backward's variant
    _gpu_bound_vs_sdpa(1, 40, 8, 4097, 128, torch.bfloat16, causal)


@gpu_only
def test_gpu_tma_path_matches_pointer_path(monkeypatch):
    """The Triton kernels' TMA loads against their pointer loads (HEARTH_ATTN_GLUON=0 and
    HEARTH_ATTN_GLUON_BWD_FUSED=0: on Hopper the Gluon kernels would run instead)."""
    mod = importlib.import_module("hearth.kernels.attention")
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "0")
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")

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


@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_forward_without_grad_holds_only_its_output(causal, monkeypatch):
    """Inference forward of the Triton kernel (HEARTH_ATTN_GLUON=0; the Gluon forwards have their own test of
    this in test_attention_gluon.py): the peak memory a call adds is its output plus the device TMA
    descriptors' scratch (256 B a program: 32 KiB here), less than the [B, Hq, T] fp32 logsumexp (64 KiB) the
    training forward keeps; the output equals the training forward's."""
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "0")
    q, k, v, _ = _make(2, 8, 2, 1024, 128, torch.bfloat16, device="cuda")
    with torch.no_grad():
        attention(q, k, v, causal=causal)  # autotune and compile outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = attention(q, k, v, causal=causal)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
    out_bytes = out.numel() * out.element_size()
    lse_bytes = 2 * 8 * 1024 * 4
    assert out_bytes <= extra < out_bytes + lse_bytes, (extra, out_bytes)
    with torch.enable_grad():
        want = attention(q.clone().requires_grad_(), k, v, causal=causal).detach()
    assert torch.equal(out, want)


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
