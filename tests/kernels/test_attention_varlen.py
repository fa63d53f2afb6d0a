"""Tests for hearth.kernels.attention_varlen (packed sequences, cu_seqlens; forward + backward).

Accuracy: THE rule of tests/kernels/tolerance.py for the output and each gradient, against an fp64
reference with a block-diagonal mask (causal aligned at each sequence's start), PyTorch's same masked
math in the same dtype as the baseline. Beside it: the same kernels on each sequence alone
(`attention` at B=1) give bitwise the same numbers when both run the same block config (the
interpreter's fixed blocks; on the GPU with autotuning off), and changing one sequence's K/V leaves
every other sequence's output and gradients bitwise unchanged. On CPU the kernels run in Triton's
interpreter: a few tiny ragged sequences (interpreter blocks are 16/32 rows). test_gpu_* (-k gpu) use
real shapes (8 sequences of 300-4000 tokens, GQA 40/8, D 128, bf16).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import math

import pytest
import torch

from hearth.kernels import attention, attention_varlen
from hearth.kernels.attention_varlen import _varlen_fwd_op
from tests.kernels.no_lse import check_forward_skips_logsumexp
from tests.kernels.offline import run_offline
from tests.kernels.tolerance import DEVICE, HAS_CUDA, assert_close, gpu_only

# (q lengths, k lengths): zero-length sequences on both sides, a 1-token one, lengths that are not
# multiples of the blocks (16, 32) and one that crosses a 32-row block; non-causal cases give k its own
# lengths, including a sequence whose queries have no keys at all and one whose keys have no queries.
LENS_EQUAL = ([5, 0, 1, 34], [5, 0, 1, 34])
LENS_RAGGED = ([5, 0, 3, 34], [9, 2, 0, 40])


def _offsets(lens, device=DEVICE):
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)


def _make(lens_q, lens_k, Hq, Hk, D, dtype, seed=0, device=DEVICE):
    """Packed q [Tq, Hq, D], k/v [Tk, Hk, D], dO, and the offsets."""
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, Hq, D, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(tk, Hk, D, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(tk, Hk, D, generator=g).to(device=device, dtype=dtype)
    do = torch.randn(tq, Hq, D, generator=g).to(device=device, dtype=dtype)
    return q, k, v, do, _offsets(lens_q, device), _offsets(lens_k, device)


def _run(fn, q, k, v, do):
    """[out, dq, dk, dv] of fn on fresh leaf copies of q, k, v."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(do.to(out.dtype))
    return [out.detach()] + [x.grad.detach() for x in leaves]


def _varlen(lens_q, lens_k, causal, scale=None):
    mq, mk = max(1, max(lens_q)), max(1, max(lens_k))

    def fn(q, k, v):
        return attention_varlen(q, k, v, _offsets(lens_q, q.device), _offsets(lens_k, q.device), mq, mk,
                                causal=causal, scale=scale)
    return fn


def _block_diagonal(lens_q, lens_k, causal, scale):
    """softmax(q k^T * scale + block-diagonal (causal) mask) v in the inputs' dtype, GQA by repeating
    K/V heads; a query without keys gives 0. q [Tq, Hq, D] -> [Tq, Hq, D]."""
    def fn(q, k, v):
        dev = q.device
        seg_q = torch.repeat_interleave(torch.arange(len(lens_q), device=dev), torch.tensor(lens_q, device=dev))
        seg_k = torch.repeat_interleave(torch.arange(len(lens_k), device=dev), torch.tensor(lens_k, device=dev))
        pos_q = torch.arange(q.shape[0], device=dev) - _offsets(lens_q, dev)[seg_q]
        pos_k = torch.arange(k.shape[0], device=dev) - _offsets(lens_k, dev)[seg_k]
        keep = seg_q[:, None] == seg_k[None, :]
        if causal:
            keep &= pos_q[:, None] >= pos_k[None, :]
        has_key = keep.any(1)
        keep |= ~has_key[:, None]  # rows without keys: any finite softmax, multiplied by 0 below
        group = q.shape[1] // k.shape[1]
        qh, kh, vh = (x.transpose(0, 1) for x in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
        s = (qh @ kh.transpose(-1, -2)) * scale
        p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) * has_key[:, None].to(s.dtype)
        return (p @ vh).transpose(0, 1)
    return fn


def _check_rule(q, k, v, do, lens_q, lens_k, causal, scale=None, ours=None):
    """THE rule for out, dq, dk, dv against the fp64 block-diagonal reference."""
    dtype = q.dtype
    ref_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if ours is None:
        ours = _run(_varlen(lens_q, lens_k, causal, scale), q, k, v, do)
    ref = _run(_block_diagonal(lens_q, lens_k, causal, ref_scale), *(x.double() for x in (q, k, v)), do.double())
    low = _run(_block_diagonal(lens_q, lens_k, causal, ref_scale), q, k, v, do)
    for name, a, lp, r in zip(("out", "dq", "dk", "dv"), ours, low, ref):
        assert a.shape == r.shape and a.dtype == dtype, f"{name}: {a.shape} {a.dtype}"
        assert torch.isfinite(a).all(), f"{name} has non-finite values"
        assert_close(a, r, dtype, name, baseline=lp)
    return ours


def _per_sequence(q, k, v, do, lens_q, lens_k, causal, scale=None):
    """`attention` (B=1) on each sequence alone, concatenated; a sequence without keys gives out = dq = 0
    (and one without queries dk = dv = 0), which `attention` itself refuses to run."""
    parts = [[], [], [], []]
    cq, ck = _offsets(lens_q, "cpu").tolist(), _offsets(lens_k, "cpu").tolist()
    for i in range(len(lens_q)):
        qs, ks, vs, dos = q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], do[cq[i]:cq[i + 1]]
        if qs.shape[0] and ks.shape[0]:
            plane = lambda x: x.transpose(0, 1).unsqueeze(0)  # noqa: E731  [T, H, D] -> [1, H, T, D]
            res = _run(lambda a, b, c: attention(a, b, c, causal=causal, scale=scale), *map(plane, (qs, ks, vs, dos)))
            res = [r[0].transpose(0, 1) for r in res]
        else:
            res = [torch.zeros_like(x) for x in (qs, qs, ks, vs)]
        for acc, r in zip(parts, res):
            acc.append(r)
    return [torch.cat(p) for p in parts]


# ---------------------------------------------------------------- correctness (interpreter-sized)
CASES = [  # (dtype, causal, Hq, Hk, D, compare with per-sequence `attention` too)
    (torch.float32, False, 2, 1, 16, True),
    (torch.float32, True, 2, 2, 16, False),
    (torch.bfloat16, False, 2, 2, 32, False),
    (torch.bfloat16, True, 4, 2, 32, True),
    (torch.float16, True, 2, 1, 64, False),
]


@pytest.mark.parametrize("dtype,causal,Hq,Hk,D,per_seq", CASES,
                         ids=lambda c: str(c).replace("torch.", "") if isinstance(c, torch.dtype) else None)
def test_matches_block_diagonal_fp64_and_attention_per_sequence(dtype, causal, Hq, Hk, D, per_seq):
    lens_q, lens_k = LENS_EQUAL if causal else LENS_RAGGED
    q, k, v, do, _, _ = _make(lens_q, lens_k, Hq, Hk, D, dtype)
    ours = _check_rule(q, k, v, do, lens_q, lens_k, causal)
    if not causal:  # the queries of the sequence without keys read nothing: out and dq are 0 there
        rows = slice(sum(lens_q[:2]), sum(lens_q[:3]))
        assert lens_k[2] == 0 and lens_q[2] > 0
        assert not ours[0][rows].any() and not ours[1][rows].any()
    if per_seq:  # the same kernels, each sequence alone, same block config: bitwise the same
        expected = _per_sequence(q, k, v, do, lens_q, lens_k, causal)
        for name, a, b in zip(("out", "dq", "dk", "dv"), ours, expected):
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


def test_nothing_attends_across_a_boundary():
    """Replace sequence 0's keys and values: every other sequence's output and gradients stay bitwise
    the same (and sequence 0's change, so the perturbation reaches the kernels)."""
    lens_q, lens_k = LENS_RAGGED
    q, k, v, do, _, cu_k = _make(lens_q, lens_k, 2, 1, 16, torch.bfloat16, seed=1)
    lo, hi = int(cu_k[0]), int(cu_k[1])
    k2, v2 = k.clone(), v.clone()
    k2[lo:hi] = torch.randn_like(k2[lo:hi].float()).to(k2.dtype) * 3
    v2[lo:hi] = -v2[lo:hi]
    fn = _varlen(lens_q, lens_k, False)
    base, pert = _run(fn, q, k, v, do), _run(fn, q, k2, v2, do)
    qlo, qhi = 0, lens_q[0]
    for name, a, b, (s, e) in zip(("out", "dq", "dk", "dv"), base, pert, [(qlo, qhi)] * 2 + [(lo, hi)] * 2):
        others = torch.ones(a.shape[0], dtype=torch.bool, device=a.device)
        others[s:e] = False
        torch.testing.assert_close(a[others], b[others], atol=0, rtol=0, msg=lambda m: f"{name} outside sequence 0: {m}")
        assert not torch.equal(a[s:e], b[s:e]), f"{name} of sequence 0 did not change"


def test_fused_dq_variant_and_padded_head_dim(monkeypatch):
    """FUSED_DQ (dQ by fp32 atomics from the dK/dV kernel into a [1, Hq, total_q, D] buffer) and a head
    dim that runs zero-padded (24 -> 32), GQA 4/2, causal: same rule."""
    monkeypatch.setattr(importlib.import_module("hearth.kernels.attention"), "FUSED_DQ", True)
    lens_q, lens_k = LENS_EQUAL
    q, k, v, do, _, _ = _make(lens_q, lens_k, 4, 2, 24, torch.bfloat16, seed=2)
    _check_rule(q, k, v, do, lens_q, lens_k, True, scale=0.3)


def test_strided_inputs_and_saved_logsumexp():
    """q, k, v as views of a fused [T, Hq + 2 Hk, D] projection (what a packed model hands over) and strided
    offsets give the same result as contiguous copies; the saved lse is the block-diagonal logsumexp,
    [Hq, total_q]."""
    lens = [3, 0, 18]
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(21, 4, 16, generator=g).to(DEVICE)
    q, k, v = qkv[:, :2], qkv[:, 2:3], qkv[:, 3:4]
    assert not q.is_contiguous()
    cu = _offsets(lens)
    out = attention_varlen(q, k, v, cu, cu, 18, 18, causal=True)
    torch.testing.assert_close(out, attention_varlen(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, 18, 18,
                                                     causal=True), atol=0, rtol=0)
    # offsets as a strided view (every other element of an interleaved pair): read as values, not as memory
    strided_cu = torch.stack((cu, torch.full_like(cu, 10**6)), 1)[:, 0]
    assert not strided_cu.is_contiguous()
    torch.testing.assert_close(attention_varlen(q, k, v, strided_cu, strided_cu, 18, 18, causal=True), out, atol=0, rtol=0)
    _, lse = _varlen_fwd_op(q, k, v, cu, cu, 18, 18, True, 0.25)
    assert lse.shape == (2, 21) and lse.dtype == torch.float32
    s = (q.double().transpose(0, 1) @ k.double().repeat_interleave(2, 1).permute(1, 2, 0)) * 0.25
    keep = torch.zeros(21, 21, dtype=torch.bool, device=DEVICE)
    keep[:3, :3] = torch.ones(3, 3, dtype=torch.bool).tril()
    keep[3:, 3:] = torch.ones(18, 18, dtype=torch.bool).tril()
    torch.testing.assert_close(lse.double(), torch.logsumexp(s.masked_fill(~keep, float("-inf")), -1), atol=1e-5, rtol=1e-5)


def test_torch_compile_fullgraph():
    """A torch.library custom op: no graph break (the offsets check runs inside it), gradients flow. The second
    call's other max_seqlen recompiles it as a SymInt (automatic dynamic shapes), as a packed batch's changing
    longest sequence does in training."""
    torch._dynamo.reset()
    lens = [3, 0, 9]
    cu = _offsets(lens)

    def block(q, k, v, longest):
        return (attention_varlen(q, k, v, cu, cu, longest, longest, causal=True) * 2.0).sum()

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager" if not HAS_CUDA else "inductor")
    q, k, v, _, _, _ = _make(lens, lens, 2, 1, 16, torch.float32, seed=7)
    for longest in (9, 12):
        leaves_c = [x.clone().requires_grad_() for x in (q, k, v)]
        leaves_e = [x.clone().requires_grad_() for x in (q, k, v)]
        compiled(*leaves_c, longest).backward()
        block(*leaves_e, longest).backward()
        for a, b in zip(leaves_c, leaves_e):
            torch.testing.assert_close(a.grad, b.grad)


# ---------------------------------------------------------------- bad input
def _ok(lens=(3, 4), Hq=2, Hk=1, D=16, dtype=torch.float16):
    q, k, v, _, cu, _ = _make(list(lens), list(lens), Hq, Hk, D, dtype)
    return q, k, v, cu


def _raises(exc, match, *args, **kw):
    with pytest.raises(exc, match=match):
        attention_varlen(*args, **kw)


def test_rejects_bad_tensors():
    q, k, v, cu = _ok()
    _raises(TypeError, r"^v must be a torch.Tensor", q, k, v.tolist(), cu, cu, 4, 4)
    _raises(TypeError, r"^q must have dtype", q.double(), k.double(), v.double(), cu, cu, 4, 4)
    _raises(TypeError, r"^k has dtype", q, k.to(torch.bfloat16), v, cu, cu, 4, 4)
    _raises(ValueError, r"^q must have 3 dimensions", q[None], k, v, cu, cu, 4, 4)
    _raises(ValueError, r"^k (must be a CUDA tensor|is on meta)", q, k.to("meta"), v, cu, cu, 4, 4)
    _raises(ValueError, r"^q must not be empty", q[:0], k, v, cu, cu, 4, 4)
    _raises(ValueError, r"^k heads \(2\) must divide q heads \(3\)", *_ok(Hq=3, Hk=2)[:3], cu, cu, 4, 4)
    _raises(ValueError, r"^k head dim", q, k[..., :8], v[..., :8], cu, cu, 4, 4)
    _raises(ValueError, r"^v must have the shape of k", q, k, v[:5], cu, cu, 4, 4)
    _raises(ValueError, r"^q head dim", *_ok(D=257)[:3], cu, cu, 4, 4)
    _raises(TypeError, r"^causal must be a bool", q, k, v, cu, cu, 4, 4, causal=1)
    _raises(TypeError, r"^scale must be a float", q, k, v, cu, cu, 4, 4, scale="0.1")
    _raises(ValueError, r"^scale must be positive", q, k, v, cu, cu, 4, 4, scale=-1.0)


def test_rejects_bad_offsets_before_any_kernel_reads_through_them():
    q, k, v, cu = _ok()  # two sequences, 3 + 4 rows
    i32 = lambda *xs: torch.tensor(xs, dtype=torch.int32, device=DEVICE)  # noqa: E731
    _raises(TypeError, r"^cu_seqlens_q must have dtype int32, got int64", q, k, v, cu.long(), cu, 4, 4)
    _raises(TypeError, r"^cu_seqlens_k must be a torch.Tensor", q, k, v, cu, [0, 3, 7], 4, 4)
    _raises(ValueError, r"^cu_seqlens_q must be 1-D", q, k, v, cu[None], cu, 4, 4)
    _raises(ValueError, r"^cu_seqlens_q must be 1-D", q, k, v, cu[:1], cu, 4, 4)
    _raises(ValueError, r"^cu_seqlens_k is on meta", q, k, v, cu, cu.to("meta"), 4, 4)
    _raises(ValueError, r"^cu_seqlens_k must have as many entries", q, k, v, cu, i32(0, 7), 4, 7)
    _raises(ValueError, r"^cu_seqlens_q must start at 0, got 1", q, k, v, i32(1, 3, 7), cu, 4, 4)
    _raises(ValueError, r"^cu_seqlens_k must be non-decreasing, got 5 then 2 at index 1",
            q, k, v, i32(0, 3, 7), i32(0, 5, 2), 4, 5)
    _raises(ValueError, r"^cu_seqlens_q must end at the packed length of q \(7 rows\), got 6", q, k, v, i32(0, 3, 6), cu, 4, 4)
    _raises(ValueError, r"^cu_seqlens_k must end at the packed length of k \(7 rows\), got 9", q, k, v, cu, i32(0, 3, 9), 4, 9)
    _raises(ValueError, r"^max_seqlen_q \(3\) is less than the longest sequence in cu_seqlens_q \(4\)", q, k, v, cu, cu, 3, 4)
    _raises(ValueError, r"^max_seqlen_k \(2\) is less than", q, k, v, cu, cu, 4, 2)
    _raises(TypeError, r"^max_seqlen_q must be an int", q, k, v, cu, cu, 4.0, 4)
    _raises(ValueError, r"^max_seqlen_k must be >= 1", q, k, v, cu, cu, 4, 0)
    _raises(ValueError, r"^causal attention needs equal q and k lengths .* sequence 0 with q 3 and k 2",
            q, k, v, cu, i32(0, 2, 7), 4, 5, causal=True)
    many = torch.zeros(65536 // 2 + 2, dtype=torch.int32, device=DEVICE)
    many[-1] = 7
    _raises(ValueError, r"^cu_seqlens_q gives n_seqs x heads", q, k, v, many, many, 7, 7)


def test_offsets_are_copied_to_the_host_once_per_pair(monkeypatch):
    """The layers of a packed forward share one pair of cu_seqlens tensors: the device->host copy (a stream sync on
    the GPU) is made for the first call only. Changing the offsets in place (version counter), passing new tensors
    or other lengths checks them again, and an offset made bad in place is still refused."""
    mod = importlib.import_module("hearth.kernels.attention_varlen")
    checks = []
    real = mod._check_offsets_on_host
    monkeypatch.setattr(mod, "_check_offsets_on_host", lambda *a: checks.append(a[2:]) or real(*a))
    monkeypatch.setattr(mod, "_VALIDATED", type(mod._VALIDATED)())
    q, k, v, cu = _ok()
    cu_k = cu.clone()
    first = attention_varlen(q, k, v, cu, cu_k, 4, 4)
    for _ in range(3):  # the other layers of the same forward
        assert torch.equal(attention_varlen(q, k, v, cu, cu_k, 4, 4), first)
    assert len(checks) == 1
    attention_varlen(q, k, v, cu, cu_k, 5, 4)  # other lengths: checked again
    attention_varlen(q, k, v, cu.clone(), cu_k, 4, 4)  # new tensors: checked again
    assert len(checks) == 3
    cu_k[1] = 5  # in place: 0, 5, 7 -- still valid, and checked again
    attention_varlen(q, k, v, cu, cu_k, 4, 5)
    assert len(checks) == 4
    cu_k[1] = 9  # in place, now past the end
    _raises(ValueError, r"^cu_seqlens_k must be non-decreasing", q, k, v, cu, cu_k, 4, 9)


# ---------------------------------------------------------------- sm_90 compile (no GPU needed)
_COMPILE = r"""
import importlib, json
import triton
from triton.backends.compiler import GPUTarget

A = importlib.import_module("hearth.kernels.attention")
done, failed = [], []
for fn, (bm, bn, warps, stages), extra in ((A._attn_fwd_kernel, A._FWD_CANDIDATES["d64"][0], {}),
                                           (A._attn_bwd_dkdv_kernel, A._DKDV_CANDIDATES["d64"][0], {"FUSED_DQ": False}),
                                           (A._attn_bwd_dq_kernel, A._DQ_CANDIDATES["d64"][0], {})):
    const = dict(HEAD_DIM=64, CAUSAL=True, USE_TMA=False, DOT_PREC="tf32", INTERP=False, BLOCK_M=bm, BLOCK_N=bn,
                 VARLEN=True, **extra)
    try:
        triton.compile(A.offline_source(fn, const), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
        done.append(fn.__name__)
    except Exception as e:
        failed.append(f"{fn.__name__}: {type(e).__name__}: {str(e)[-400:]}")
print(json.dumps({"done": done, "failed": failed}))
"""


def test_varlen_kernels_compile_for_sm90():
    """The interpreter never type-checks a kernel (LESSON 10): compile the VARLEN forward, dK/dV and dQ
    kernels for the H200 (causal, bf16, head dim 64, the first Hopper config) with Triton's bundled ptxas,
    in a subprocess because TRITON_INTERPRET=1 replaces @triton.jit functions here."""
    out = run_offline(_COMPILE)
    assert not out["failed"], "\n".join(out["failed"])
    assert len(out["done"]) == 3


# ---------------------------------------------------------------- GPU, real shapes
GPU_LENS = [300, 4000, 1023, 2049, 517, 3001, 777, 1500]  # 13167 tokens: ragged, none a block multiple


def _rule_per_sequence(q, k, v, do, lens_q, lens_k, causal):
    """THE rule with the fp64 reference and the bf16 baseline computed one sequence at a time
    (the block-diagonal [T, T] matrices of 13k tokens would not fit) and concatenated."""
    ours = _run(_varlen(lens_q, lens_k, causal), q, k, v, do)
    cq, ck = _offsets(lens_q, "cpu").tolist(), _offsets(lens_k, "cpu").tolist()
    refs, lows = [[], [], [], []], [[], [], [], []]
    scale = 1.0 / math.sqrt(q.shape[-1])
    for i in range(len(lens_q)):
        part = (q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], do[cq[i]:cq[i + 1]])
        fn = _block_diagonal([lens_q[i]], [lens_k[i]], causal, scale)
        for acc, r in zip(refs, _run(fn, *(x.double() for x in part))):
            acc.append(r)
        for acc, r in zip(lows, _run(fn, *part)):
            acc.append(r)
        torch.cuda.empty_cache()
    for name, a, r, lp in zip(("out", "dq", "dk", "dv"), ours, refs, lows):
        assert torch.isfinite(a).all(), f"{name} has non-finite values"
        assert_close(a, torch.cat(r), q.dtype, name, baseline=torch.cat(lp))
    return ours


@pytest.mark.xdist_group("gpu_big")  # big fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_eight_sequences_gqa_40_8(causal):
    """8 sequences of 300-4000 tokens, Hq 40 / Hk 8, D 128, bf16; non-causal with other key lengths."""
    lens_k = GPU_LENS if causal else [n + 129 for n in reversed(GPU_LENS)]
    q, k, v, do, _, _ = _make(GPU_LENS, lens_k, 40, 8, 128, torch.bfloat16, device="cuda")
    _rule_per_sequence(q, k, v, do, GPU_LENS, lens_k, causal)


@gpu_only
@pytest.mark.parametrize("D,dtype", [(64, torch.bfloat16), (128, torch.float16), (96, torch.bfloat16),
                                     (64, torch.float32)], ids=["d64-bf16", "d128-fp16", "d96-bf16", "d64-fp32"])
def test_gpu_dtypes_head_dims_with_empty_sequences(D, dtype):
    lens = [0, 700, 1, 0, 1300, 65]
    q, k, v, do, _, _ = _make(lens, lens, 8, 2, D, dtype, device="cuda")
    _rule_per_sequence(q, k, v, do, lens, lens, True)


@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_same_as_attention_per_sequence(monkeypatch, causal):
    """With autotuning off both run the first config of each table: the packed call and `attention` on
    each sequence alone must give bitwise the same numbers (same tiles, same order of operations). The
    per-sequence calls take the Triton kernels (HEARTH_ATTN_GLUON=0, HEARTH_ATTN_GLUON_BWD_FUSED=0): on Hopper
    attention() defaults to the Gluon ping-pong forward (head_dim 128) and the fused Gluon backward, other kernels,
    which the varlen path does not use."""
    monkeypatch.setattr(importlib.import_module("hearth.kernels.attention"), "AUTOTUNE", False)
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "0")
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")
    lens = [300, 1000, 129, 2000]
    q, k, v, do, _, _ = _make(lens, lens, 8, 2, 128, torch.bfloat16, device="cuda")
    ours = _run(_varlen(lens, lens, causal), q, k, v, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, _per_sequence(q, k, v, do, lens, lens, causal)):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_autotuned_path(monkeypatch, causal):
    """scripts/gpu/test.sh pins configs (HEARTH_ATTN_AUTOTUNE=0); the bench and training autotune: the VARLEN
    launches through the autotuners (key: max_seqlen's power-of-two bucket, VARLEN) under the same rule."""
    monkeypatch.setattr(importlib.import_module("hearth.kernels.attention"), "AUTOTUNE", True)
    lens = [300, 1000, 129, 2000]
    q, k, v, do, _, _ = _make(lens, lens, 8, 2, 128, torch.bfloat16, device="cuda")
    _rule_per_sequence(q, k, v, do, lens, lens, causal)


def test_triton_forward_takes_the_packed_rule_on_hopper_at_head_dim_64(monkeypatch):
    """On Hopper at head_dim 64 (bf16) the packed forward launches attention.forward_config's varlen pick
    (FWD_RULE_HOPPER_D64_VARLEN, causal or not) in place of the autotuner; at head_dim 32 it passes none (the
    autotuner), and off Hopper none. The launch is recorded, not run (no GPU here)."""
    at = importlib.import_module("hearth.kernels.attention")
    av = importlib.import_module("hearth.kernels.attention_varlen")
    seen = []
    monkeypatch.setattr(at, "_launch", lambda *a, fixed=None, **kw: seen.append(fixed))
    monkeypatch.setattr(at, "_on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "0")  # the Triton forward (the Gluon one is not built here)
    for cap, D, causal, want in (((9, 0), 64, True, at.FWD_RULE_HOPPER_D64_VARLEN),
                                 ((9, 0), 64, False, at.FWD_RULE_HOPPER_D64_VARLEN),
                                 ((9, 0), 32, True, None), ((8, 0), 64, True, None)):
        monkeypatch.setattr(at, "device_capability", lambda device, cap=cap: cap)
        q, k, v, _, cu_q, cu_k = _make([5, 3], [5, 3], 4, 2, D, torch.bfloat16, device="cpu")
        seen.clear()
        av._varlen_forward(q, k, v, cu_q, cu_k, 5, 5, causal, 1.0)
        assert seen == [want], (cap, D, causal)


def test_packed_backward_asks_the_kernel_pick_with_its_longest_sequence_and_group(monkeypatch):
    """_varlen_backward hands attention.backward_kernel the packed rows' max_seqlen_k and the GQA group, so its
    short-packed-rows rule (Triton backward for causal GQA head_dim 128 up to FUSED_VARLEN_SHORT_MAX tokens)
    applies; the pick is recorded and the Triton backward's launches stubbed (no GPU here)."""
    at = importlib.import_module("hearth.kernels.attention")
    av = importlib.import_module("hearth.kernels.attention_varlen")
    asked = []

    def pick(*args, **kw):
        asked.append((args, kw))
        return "triton"

    monkeypatch.setattr(at, "backward_kernel", pick)
    monkeypatch.setattr(at, "_launch", lambda *a, **kw: None)
    monkeypatch.setattr(at, "_bwd_preprocess", lambda *a, **kw: None)
    q, k, v, do, cu_q, cu_k = _make([5, 3], [5, 3], 8, 2, 64, torch.bfloat16, device="cpu")
    av._varlen_backward(do, q, k, v, q, torch.zeros(8, 8), cu_q, cu_k, 5, 7, True, 1.0)
    assert len(asked) == 1
    args, kw = asked[0]
    assert args[1:] == (torch.bfloat16, 64, True)
    assert kw == {"part": "fused", "packed_max_len": 7, "group": 4}


# ---------------------------------------------------------------- the persistent packed forward's schedule
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_pps_schedule_lists_every_tile_once_balanced(causal):
    """varlen_pps_schedule: every query block that starts inside its sequence, for every head, exactly once (a
    sequence without keys too, none for one without queries), codes that decode to (sequence, block, head), and
    longest-processing-time balance: no program's cost exceeds the lightest program's by more than one tile."""
    from hearth.kernels import attention_gluon as ag

    lens_q = [300, 0, 65, 1300, 5, 129, 1]
    lens_k = [300, 90, 0, 1301, 64, 200, 1] if not causal else [300, 0, 65, 1300, 5, 129, 1]
    bm, bn, h_q, programs = 64, 128, 3, 7
    per, n_m = ag.varlen_pps_schedule(lens_q, lens_k, h_q, causal, programs, bm, bn)
    assert n_m == -(-max(lens_q) // (2 * bm)) and len(per) == programs
    codes = [c for tiles in per for c in tiles]
    want = {(sq, m, h) for sq, n in enumerate(lens_q) for m in range(-(-n // (2 * bm))) for h in range(h_q)}
    got = [(c // h_q // n_m, c // h_q % n_m, c % h_q) for c in codes]
    assert len(got) == len(set(got)) and set(got) == want

    def cost(c):
        sq, m = c // h_q // n_m, c // h_q % n_m
        return ag.pps_tile_turns(m, lens_q[sq], lens_k[sq], causal, bm, bn) + ag.PPS_TILE_COST

    loads = [sum(cost(c) for c in tiles) for tiles in per]
    assert max(loads) - min(loads) <= max(cost(c) for c in codes), loads
    for tiles in per:  # each program runs its tiles heaviest first
        assert [cost(c) for c in tiles] == sorted((cost(c) for c in tiles), reverse=True)


def test_varlen_pps_schedule_edges():
    """Fewer tiles than programs: one program a tile; no query anywhere: no program; a code past int32 and
    mismatched lengths are refused, naming what is wrong."""
    from hearth.kernels import attention_gluon as ag

    per, n_m = ag.varlen_pps_schedule([10, 3], [10, 3], 2, True, 132, 64, 128)
    assert sorted(len(t) for t in per) == [1, 1, 1, 1] and n_m == 1
    assert ag.varlen_pps_schedule([0, 0], [4, 4], 2, False, 8, 64, 128)[0] == []
    with pytest.raises(ValueError, match="int32"):
        ag.varlen_pps_schedule([2**24] + [1] * 1000, [2**24] + [1] * 1000, 32, True, 132, 64, 128)  # checked first
    with pytest.raises(ValueError, match="lens_q and lens_k"):
        ag.varlen_pps_schedule([1, 2], [1], 2, True, 8, 64, 128)
    with pytest.raises(ValueError, match="programs"):
        ag.varlen_pps_schedule([1], [1], 2, True, 0, 64, 128)


def test_offsets_check_keeps_the_lengths_on_the_host():
    """The forward's offsets check keeps each sequence's query and key counts as host ints beside its entry
    (_host_lengths), for the persistent schedule; an in-place change of the offsets makes them unknown again."""
    av = importlib.import_module("hearth.kernels.attention_varlen")
    cu_q = torch.tensor([0, 5, 5, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 9], dtype=torch.int32)
    av._check_offsets(cu_q, cu_k, 8, 9, 5, 4, False)
    assert av._host_lengths(cu_q, cu_k) == ((5, 0, 3), (4, 2, 3))
    assert av._host_lengths(cu_q, cu_q) is None  # another key tensor
    cu_q[1] = 4
    assert av._host_lengths(cu_q, cu_k) is None


def test_packed_forward_goes_persistent_by_the_dense_rule(monkeypatch):
    """_varlen_forward asks attention.forward_kernel with the longest sequence as seq_len (THE rule: persistent up to
    PERSIST_MAX_T) and hands the Gluon forward the host lengths only when the pick is the persistent one
    (HEARTH_ATTN_GLUON_PERSIST=0: per tile). The Gluon call is recorded, not run (no GPU here)."""
    at = importlib.import_module("hearth.kernels.attention")
    av = importlib.import_module("hearth.kernels.attention_varlen")
    seen = []

    class Fake:
        @staticmethod
        def forward_varlen(*a, lengths=None, **kw):
            seen.append(lengths)
            return None, None

    monkeypatch.setattr(at, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(av, "_gluon", lambda choice, serving, *t: Fake if choice in serving else None)
    q, k, v, _, cu_q, cu_k = _make([5, 3], [5, 3], 4, 2, 128, torch.bfloat16, device="cpu")
    av._varlen_forward(q, k, v, cu_q, cu_k, 5, 5, True, 1.0)
    assert seen == [((5, 3), (5, 3))]
    monkeypatch.setenv("HEARTH_ATTN_GLUON_PERSIST", "0")
    av._varlen_forward(q, k, v, cu_q, cu_k, 5, 5, True, 1.0)
    assert seen == [((5, 3), (5, 3)), None]
    monkeypatch.delenv("HEARTH_ATTN_GLUON_PERSIST")
    longest = at.PERSIST_MAX_T[False] + 1  # past the non-causal bound: per tile
    q, k, v, _, cu_q, cu_k = _make([longest], [longest], 4, 2, 128, torch.bfloat16, device="cpu")
    av._varlen_forward(q, k, v, cu_q, cu_k, longest, longest, False, 1.0)
    assert seen[-1] is None


@gpu_only
@pytest.mark.parametrize("sms", [None, 3], ids=["all-sms", "3-programs"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_persistent_packed_forward_same_as_per_tile(D, causal, sms, monkeypatch):
    """The persistent packed forward computes each tile as the per-tile one does (same blocks in the same order,
    the same block functions), so out and lse match it to the last bit or so (held to one bf16 ulp and 1e-6 for
    lse, in case the two builds schedule an fp32 operation differently), with and without the logsumexp, on the
    whole GPU and on 3 programs (each walks dozens of tiles): ragged sequences, non-causal ones without queries and
    without keys (zeros and lse -inf), tiles that end past their sequence, 1-token sequences. Then the whole
    call against the fp64 reference under THE rule, persistent by default."""
    from hearth.kernels import attention_gluon as ag

    if importlib.import_module("hearth.kernels.attention").device_capability(torch.device("cuda"))[0] != 9:
        pytest.skip("the Gluon kernels serve Hopper only")
    if sms:
        monkeypatch.setattr(ag, "num_sms", lambda device: sms)
    lens_q = [700, 0, 65, 1300, 5, 129, 1, 256] if not causal else [700, 65, 1300, 5, 129, 1, 256]
    lens_k = [300, 90, 0, 1301, 64, 200, 1, 256] if not causal else lens_q
    q, k, v, do, cu_q, cu_k = _make(lens_q, lens_k, 8, 2, D, torch.bfloat16, seed=5, device="cuda")
    for store_lse in (True, False):
        tile = ag.forward_varlen(q, k, v, cu_q, cu_k, max(lens_q), causal, D ** -0.5, store_lse)
        pers = ag.forward_varlen(q, k, v, cu_q, cu_k, max(lens_q), causal, D ** -0.5, store_lse,
                                 lengths=(tuple(lens_q), tuple(lens_k)))
        torch.testing.assert_close(pers[0].float(), tile[0].float(), atol=1e-6, rtol=2 ** -7)
        if store_lse:
            finite = torch.isfinite(tile[1])
            assert torch.equal(finite, torch.isfinite(pers[1])) and torch.equal(tile[1][~finite], pers[1][~finite])
            torch.testing.assert_close(pers[1][finite], tile[1][finite], atol=1e-6, rtol=1e-6)
        else:
            assert pers[1] is None
    _rule_per_sequence(q, k, v, do, lens_q, lens_k, causal)


# ---------------------------------------------------------------- the Gluon kernels on packed rows (Hopper)
def test_gluon_route_follows_the_dense_pick_and_tma():
    """attention_varlen takes the Gluon forward / fused backward only where attention.forward_kernel /
    backward_kernel pick them for dense attention and TMA can address the packed tensors (a dO expanded from a
    sum() has zero strides: the Triton kernels)."""
    from hearth.kernels import attention_gluon

    route = importlib.import_module("hearth.kernels.attention_varlen")._gluon
    q, k, v, do, _, _ = _make([5, 3], [5, 3], 4, 2, 64, torch.bfloat16, device="cpu")
    fwd, bwd = ("gluon_pp", "gluon_pps"), ("gluon",)
    assert route("gluon_pp", fwd, q, k, v) is attention_gluon
    assert route("gluon_pps", fwd, q, k, v) is attention_gluon
    assert route("gluon", bwd, q, k, v, do) is attention_gluon
    assert route("triton", fwd, q, k, v) is None and route("triton", bwd, q, k, v, do) is None
    assert route("gluon", fwd, q, k, v) is None  # the opt-in single-partition forward has no packed form
    assert route("gluon", bwd, q, k, v, torch.ones(1, 1, 1, dtype=q.dtype).expand_as(q)) is None
    assert route("gluon_pp", fwd, q[:, :, 1:], k[:, :, 1:], v[:, :, 1:]) is None  # 16-byte alignment lost


_VARLEN_GLUON_BUILDS = r"""
import json, re, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
def add(label, k, tma, store_lse):
    r = hi.report_compiled(label, k, sass=False)
    out.append(dict(label=label, spill=r.spill_bytes, shared=r.shared_bytes, wgmma=r.ptx["wgmma"], tma=r.ptx["tma"],
                    dq_tma=tma, store_lse=store_lse, st_global=len(re.findall(r"\bst\.global", k.asm["ptx"]))))
for order in (1, 0):
    for tma, pad in ((True, 0), (True, 64), (False, 0)):
        variants = ("pp", "pps", "bwd_fused") if order == 1 and tma and not pad else ("bwd_fused",)
        for label, k in ag.offline_kernels(90, torch.bfloat16, variants=variants, varlen=True, fb_pair_group=order,
                                           fb_dq_tma=tma, fb_dq_pad=pad):
            add(label, k, tma, True)
# the groups of pairs fb_pair_group gives causal GQA at up to FB_GQA_GROUP_MAX_KB key blocks (the shipped forms, DQ_PAD)
for order in (4, 8, 16):
    for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), varlen=True, causal=(True,),
                                       fb_pair_group=order, fb_dq_pad=64):
        add(label, k, True, True)
# the sequences longest first (SEQ_ORDER, the probe switch HEARTH_ATTN_FB_SEQ_ORDER), in a group of 8 pairs
for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), varlen=True, causal=(True,),
                                   fb_pair_group=8, fb_dq_pad=64, fb_seq_order=True):
    add(label, k, True, True)
# the packed forward without the logsumexp store (attention_varlen with no gradient to compute)
for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("pp", "pps"), varlen=True, store_lse=False):
    add(label, k, True, False)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def varlen_builds():
    """The sm_90 builds of the packed Gluon kernels, compiled once for the tests below (one subprocess)."""
    return run_offline(_VARLEN_GLUON_BUILDS)


def test_gluon_varlen_kernels_build_for_sm90(varlen_builds):
    """The packed forms of the ping-pong forward (per tile and persistent) and the fused backward (both grid orders; dQ^T added by TMA
    reduce-adds at the packed rows' columns or at columns placed apart per sequence, backward_fused_varlen's
    aligned and DQ_PAD, or by fp32 atomics) build for the H200: wgmma, TMA, within 227 KiB
    of shared memory. Spills: none in any build of the TMA forms (the shipped ones): at D 128 the fused backward's
    sequence's first key row and K/V head are read again at the end, not kept live across the steps (they were 8
    bytes, 16 causal), and the causal mask is applied at every step, not behind a diagonal test (whose branch kept
    a transient word on the stack: 8 bytes); at most 16 in the atomics form at D 128 (per-element addresses; 96
    before these two changes). The causal builds in groups of 4, 8 and 16 pairs (fb_pair_group's causal GQA orders
    for short sequences) spill none either, nor those that take the sequences longest first (SEQ_ORDER)."""
    reports = [r for r in varlen_builds if r["store_lse"]]
    assert len(reports) == 2 * 4 + 3 * 4 + 3 * 4 + 3 * 2 + 2, [r["label"] for r in reports]
    assert sum(" seq-order " in r["label"] for r in reports) == 2, [r["label"] for r in reports]
    assert sum(f" pairs{n} " in r["label"] for r in reports for n in (4, 8, 16)) == 3 * 2 + 2, [r["label"] for r in reports]
    assert sum("fwd[pps]" in r["label"] for r in reports) == 4, [r["label"] for r in reports]
    for r in reports:
        assert "varlen" in r["label"] and r["wgmma"] > 0 and r["tma"] > 0 and r["shared"] <= 227 * 1024, r
        limit = 0
        if "bwd[fused]" in r["label"] and " d128 " in r["label"]:
            limit = 0 if r["dq_tma"] else 16
        assert r["spill"] <= limit, r


def test_gluon_varlen_inference_forward_builds_for_sm90(varlen_builds):
    """The packed ping-pong forward (per tile and persistent) without the logsumexp store (what attention_varlen
    runs on Hopper when no backward will run) builds for sm_90 at every head_dim and causal setting, with wgmma and
    TMA, no spills, and fewer global stores than the training build (only the ragged last tile's O rows, and a
    sequence without keys, go out through pointers)."""
    train = {r["label"]: r for r in varlen_builds if r["store_lse"] and r["label"].startswith("attention_gluon fwd")}
    infer = [r for r in varlen_builds if not r["store_lse"]]
    assert len(infer) == len(train) == 8, [r["label"] for r in varlen_builds]
    for r in infer:
        assert "no-lse" in r["label"] and r["wgmma"] > 0 and r["tma"] > 0 and r["spill"] == 0, r
        twin = train[r["label"].replace(" no-lse", "")]
        assert r["st_global"] < twin["st_global"], (r, twin)


@gpu_only
def test_gpu_packed_rows_run_the_gluon_kernels(monkeypatch):
    """On Hopper, bf16, head_dim 128, a packed call runs the Gluon ping-pong forward and fused backward (spied),
    under THE rule; with HEARTH_ATTN_GLUON=0 and HEARTH_ATTN_GLUON_BWD_FUSED=0 it runs neither."""
    from hearth.kernels import attention_gluon

    if importlib.import_module("hearth.kernels.attention").device_capability(torch.device("cuda"))[0] != 9:
        pytest.skip("the Gluon kernels serve Hopper only")
    calls = []
    for name in ("forward_varlen", "backward_fused_varlen"):
        real = getattr(attention_gluon, name)
        monkeypatch.setattr(attention_gluon, name, lambda *a, _r=real, _n=name, **kw: calls.append(_n) or _r(*a, **kw))
    lens = [300, 1000, 129, 2000]
    q, k, v, do, _, _ = _make(lens, lens, 8, 2, 128, torch.bfloat16, device="cuda")
    _rule_per_sequence(q, k, v, do, lens, lens, True)
    assert calls == ["forward_varlen", "backward_fused_varlen"], calls
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "0")
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")
    _run(_varlen(lens, lens, True), q, k, v, do)
    assert calls == ["forward_varlen", "backward_fused_varlen"], calls


@gpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gluon_packed_same_as_dense_gluon_per_sequence(monkeypatch, causal):
    """The packed Gluon kernels against the dense Gluon kernels on each sequence alone (per-tile ping-pong forward,
    fused backward): the same tiles in the same order, so out, dK and dV are bitwise the same; dQ is summed by fp32
    reduce-adds in whatever order the programs reach them (two runs of one call may differ in the last bits), so
    it is held to THE rule against fp64."""
    monkeypatch.setenv("HEARTH_ATTN_GLUON_PERSIST", "0")
    lens = [300, 1000, 129, 2000, 64, 1]
    lens_k = lens if causal else [n + 37 for n in reversed(lens)]
    q, k, v, do, _, _ = _make(lens, lens_k, 8, 2, 128, torch.bfloat16, device="cuda")
    ours = _rule_per_sequence(q, k, v, do, lens, lens_k, causal)
    dense = _per_sequence(q, k, v, do, lens, lens_k, causal)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, dense):
        if name != "dq":
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


@gpu_only
@pytest.mark.parametrize("lens", [[128, 640, 64, 1024], [127, 641, 63, 1025]], ids=["aligned", "ragged"])
def test_gpu_gluon_backward_places_dq_by_alignment(monkeypatch, lens):
    """Packs whose query offsets are all multiples of DQ_TMA_ALIGN take the fused backward's packed-row dQ^T columns
    (aligned=True), others the per-sequence placement (aligned=False, the kernel's DQ_PAD); both under THE rule,
    causal GQA at head_dim 128 and 64."""
    from hearth.kernels import attention_gluon

    if importlib.import_module("hearth.kernels.attention").device_capability(torch.device("cuda"))[0] != 9:
        pytest.skip("the Gluon kernels serve Hopper only")
    seen = []
    real = attention_gluon.backward_fused_varlen
    monkeypatch.setattr(attention_gluon, "backward_fused_varlen",
                        lambda *a, **kw: seen.append(kw["aligned"]) or real(*a, **kw))
    want = all(n % 64 == 0 for n in lens)
    for D in (128, 64):
        q, k, v, do, _, _ = _make(lens, lens, 8, 2, D, torch.bfloat16, seed=D, device="cuda")
        _rule_per_sequence(q, k, v, do, lens, lens, True)
    assert seen == [want, want], seen


@gpu_only
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gluon_backward_longest_sequences_first(monkeypatch, D, causal):
    """HEARTH_ATTN_FB_SEQ_ORDER=1: the packed fused backward takes its sequences longest first (a permutation its
    programs read); every row, dQ^T column and dK / dV row stays its sequence's own: out, dK and dV bitwise those
    of the packed order, dQ under THE rule (its fp32 adds may come in another order). GQA 8/2, lengths out of order
    with a sequence of one token and ties."""
    from hearth.kernels import attention_gluon

    if importlib.import_module("hearth.kernels.attention").device_capability(torch.device("cuda"))[0] != 9:
        pytest.skip("the Gluon kernels serve Hopper only")
    lens = [300, 1000, 1, 2000, 1000, 129]
    lens_k = lens if causal else [n + 37 for n in reversed(lens)]
    q, k, v, do, _, _ = _make(lens, lens_k, 8, 2, D, torch.bfloat16, seed=D + causal, device="cuda")
    seen = []
    real = attention_gluon.fb_seq_order
    monkeypatch.setattr(attention_gluon, "fb_seq_order", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
    monkeypatch.delenv("HEARTH_ATTN_FB_SEQ_ORDER", raising=False)
    packed = _rule_per_sequence(q, k, v, do, lens, lens_k, causal)
    monkeypatch.setenv("HEARTH_ATTN_FB_SEQ_ORDER", "1")
    longest = _rule_per_sequence(q, k, v, do, lens, lens_k, causal)
    assert seen[0] is None and seen[-1] is not None
    assert [lens_k[i] for i in seen[-1].tolist()] == sorted(lens_k, reverse=True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), longest, packed):
        if name != "dq":
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


@gpu_only
def test_gpu_gluon_backward_dq_async(monkeypatch):
    """HEARTH_ATTN_FB_DQ_ASYNC=1 (the packed fused backward with dQ^T's matmul issued behind dK's, head_dim 128):
    out, dK and dV bitwise the shipped form's (the same products, summed in the same order), dQ under THE rule;
    GQA 8/2, causal, ragged lengths with a one-token sequence."""
    if importlib.import_module("hearth.kernels.attention").device_capability(torch.device("cuda"))[0] != 9:
        pytest.skip("the Gluon kernels serve Hopper only")
    lens = [300, 1000, 1, 2000, 129]
    q, k, v, do, _, _ = _make(lens, lens, 8, 2, 128, torch.bfloat16, seed=11, device="cuda")
    monkeypatch.delenv("HEARTH_ATTN_FB_DQ_ASYNC", raising=False)
    shipped = _rule_per_sequence(q, k, v, do, lens, lens, True)
    monkeypatch.setenv("HEARTH_ATTN_FB_DQ_ASYNC", "1")
    issued = _rule_per_sequence(q, k, v, do, lens, lens, True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), issued, shipped):
        if name != "dq":
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


@gpu_only
@pytest.mark.parametrize("knob,value", [("HEARTH_ATTN_FB_LATE_RELEASE", "0"), ("HEARTH_ATTN_FB_DQ_BUFS2", "1"),
                                        ("HEARTH_ATTN_FB_DQ_EARLY", "1"), ("HEARTH_ATTN_FB_DQ_EARLY", "2"),
                                        ("HEARTH_ATTN_FB_STATS_AHEAD", "1"), ("HEARTH_ATTN_FB_ST_AHEAD", "1")])
def test_gpu_gluon_backward_early_release_and_dq_bufs2(monkeypatch, knob, value):
    """HEARTH_ATTN_FB_LATE_RELEASE=0 (the packed fused backward giving the Q / dO slot back after dK's matmul, not
    after dQ^T's as shipped; head_dim 128), HEARTH_ATTN_FB_DQ_BUFS2=1 (two dQ^T staging tiles a warpgroup) and
    HEARTH_ATTN_FB_DQ_EARLY=1 / 2 (dQ^T's matmul issued before dK's, dV's after dS^T or as shipped) and
    HEARTH_ATTN_FB_STATS_AHEAD=1 (the producer's lse / delta loads a step ahead) and HEARTH_ATTN_FB_ST_AHEAD=1 (the
    next step's S^T computed during this step's dQ^T staging): out, dK and dV bitwise the
    shipped form's (the same products in the same order: only when a buffer is refilled or a matmul is issued
    moves), dQ under THE rule (its adds land in any order); GQA 8/2, causal, ragged lengths with a one-token
    sequence."""
    if importlib.import_module("hearth.kernels.attention").device_capability(torch.device("cuda"))[0] != 9:
        pytest.skip("the Gluon kernels serve Hopper only")
    lens = [300, 1000, 1, 2000, 129]
    q, k, v, do, _, _ = _make(lens, lens, 8, 2, 128, torch.bfloat16, seed=12, device="cuda")
    monkeypatch.delenv(knob, raising=False)
    shipped = _rule_per_sequence(q, k, v, do, lens, lens, True)
    monkeypatch.setenv(knob, value)
    other = _rule_per_sequence(q, k, v, do, lens, lens, True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), other, shipped):
        if name != "dq":
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


@gpu_only
@pytest.mark.parametrize("order", ["1", "2"])
def test_gpu_gluon_backward_step_orders(monkeypatch, order):
    """HEARTH_ATTN_FB_STEP_ORDER=1 / 2 (the packed fused backward taking each query block's heads together, 2 from
    each sequence's last block down): out, dq, dk and dv under THE rule, causal and not (its dK / dV sum the same
    steps in another order, so they are not bitwise the shipped order's); GQA 8/2, ragged lengths with a one-token
    sequence, head_dim 128."""
    if importlib.import_module("hearth.kernels.attention").device_capability(torch.device("cuda"))[0] != 9:
        pytest.skip("the Gluon kernels serve Hopper only")
    lens = [300, 1000, 1, 2000, 129]
    q, k, v, do, _, _ = _make(lens, lens, 8, 2, 128, torch.bfloat16, seed=13, device="cuda")
    monkeypatch.setenv("HEARTH_ATTN_FB_STEP_ORDER", order)
    for causal in (False, True):
        _rule_per_sequence(q, k, v, do, lens, lens, causal)


def test_fb_seq_order_env():
    """The packed fused backward's sequence order: None unless HEARTH_ATTN_FB_SEQ_ORDER=1, then the sequences by
    key count, longest first, ties in packed order (int32, on cu_k's device); a bad value is an error naming it."""
    from hearth.kernels import attention_gluon

    cu = torch.tensor([0, 300, 1300, 1301, 3301, 4301, 4430], dtype=torch.int32)
    assert attention_gluon.fb_seq_order(cu, env={}) is None
    assert attention_gluon.fb_seq_order(cu, env={"HEARTH_ATTN_FB_SEQ_ORDER": "0"}) is None
    order = attention_gluon.fb_seq_order(cu, env={"HEARTH_ATTN_FB_SEQ_ORDER": "1"})
    assert order.dtype == torch.int32 and order.tolist() == [3, 1, 4, 0, 5, 2]
    with pytest.raises(ValueError, match="HEARTH_ATTN_FB_SEQ_ORDER"):
        attention_gluon.fb_seq_order(cu, env={"HEARTH_ATTN_FB_SEQ_ORDER": "yes"})


@gpu_only
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_gluon_queries_without_keys_keys_without_queries_and_boundaries(D):
    """Non-causal packed rows with a sequence whose queries have no keys (out 0, dq 0) and one whose keys have no
    queries (dk = dv = 0), sequence ends inside the kernels' tiles, under THE rule; then sequence 1's keys and
    values replaced: out, dk and dv of every other sequence stay bitwise the same and dq within the reduce-add's
    last bits (the tiles that straddle a boundary read the next sequence's rows, which must not leak)."""
    lens_q, lens_k = [700, 0, 65, 1300, 5, 129], [300, 90, 0, 1301, 64, 200]
    q, k, v, do, _, cu_k = _make(lens_q, lens_k, 8, 2, D, torch.bfloat16, seed=3, device="cuda")
    base = _rule_per_sequence(q, k, v, do, lens_q, lens_k, False)
    cq = _offsets(lens_q, "cpu").tolist()
    ck = cu_k.tolist()
    for name, t, (s, e) in (("out", base[0], cq[2:4]), ("dq", base[1], cq[2:4]),  # sequence 2: no keys
                            ("dk", base[2], ck[1:3]), ("dv", base[3], ck[1:3])):  # sequence 1: no queries
        assert e > s and torch.count_nonzero(t[s:e]) == 0, f"{name} rows {s}:{e} are not all 0"
    lo, hi = ck[3], ck[4]  # sequence 3: 1300 queries on 1301 keys
    k2, v2 = k.clone(), v.clone()
    k2[lo:hi] = torch.randn_like(k2[lo:hi].float()).to(k2.dtype) * 3
    v2[lo:hi] = -v2[lo:hi]
    pert = _run(_varlen(lens_q, lens_k, False), q, k2, v2, do)
    for name, a, b, (s, e) in zip(("out", "dq", "dk", "dv"), base, pert, [(cq[3], cq[4])] * 2 + [(lo, hi)] * 2):
        others = torch.ones(a.shape[0], dtype=torch.bool, device=a.device)
        others[s:e] = False
        tol = dict(atol=1e-5, rtol=2 ** -6) if name == "dq" else dict(atol=0, rtol=0)  # dq: two bf16 ulps
        torch.testing.assert_close(a[others].float(), b[others].float(), **tol, msg=lambda m: f"{name} outside: {m}")
        assert not torch.equal(a[s:e], b[s:e]), f"{name} of sequence 3 did not change"


# ---------------------------------------------------------------- the forward without a backward (no logsumexp)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_without_grad_skips_the_logsumexp(causal, monkeypatch):
    """Under no_grad, or with inputs that need no gradient, attention_varlen asks its forward for no [Hq, total_q]
    fp32 logsumexp (lse None: neither allocated nor written; the kernel's STORE_LSE False runs here in the
    interpreter) and returns the training forward's output exactly; with a gradient wanted, the node keeps one."""
    lens_q, lens_k = LENS_EQUAL if causal else LENS_RAGGED
    q, k, v, _, _, _ = _make(lens_q, lens_k, 4, 2, 16, torch.float32, seed=21)
    fn = _varlen(lens_q, lens_k, causal)
    check_forward_skips_logsumexp(monkeypatch, importlib.import_module("hearth.kernels.attention_varlen"),
                                  "_varlen_forward", fn, q, k, v)
    with torch.enable_grad():  # a gradient wanted: the node keeps the logsumexp for its backward
        out = fn(q.clone().requires_grad_(), k, v)
    assert any(t.dtype == torch.float32 and t.shape == (4, sum(lens_q)) for t in out.grad_fn.saved_tensors)


def test_inference_op_opcheck():
    """The no-logsumexp packed forward is its own custom op (what torch.compile traces without grad): its fake
    impl and schema agree with the real one, and it gives attention_varlen's output."""
    lens = [5, 3, 9]
    q, k, v, _, cu, _ = _make(lens, lens, 2, 1, 16, torch.float32, seed=22)
    args = (q, k, v, cu, cu, max(lens), max(lens), True, 0.25)
    torch.library.opcheck(torch.ops.hearth.attention_varlen_infer, args)
    out = torch.ops.hearth.attention_varlen_infer(*args)
    assert torch.equal(out, attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, scale=0.25))


@gpu_only
@pytest.mark.parametrize("gluon", ["1", "0"], ids=["gluon", "triton"])
def test_gpu_forward_without_grad_holds_only_its_output(gluon, monkeypatch):
    """On the GPU (the Gluon packed forward on Hopper at D 128, and the Triton one with HEARTH_ATTN_GLUON=0): a
    no-grad call adds its output and less than the [Hq, total_q] fp32 logsumexp the training forward keeps, and
    its output equals the training forward's bit for bit."""
    monkeypatch.setenv("HEARTH_ATTN_GLUON", gluon)
    lens = [300, 1000, 129, 2000]
    q, k, v, _, cu, _ = _make(lens, lens, 8, 2, 128, torch.bfloat16, device="cuda")
    call = lambda: attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)  # noqa: E731
    with torch.no_grad():
        call()  # autotune and compile outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = call()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
    out_bytes = out.numel() * out.element_size()
    lse_bytes = 8 * sum(lens) * 4
    assert out_bytes <= extra < out_bytes + lse_bytes, (extra, out_bytes)
    with torch.enable_grad():
        want = attention_varlen(q.clone().requires_grad_(), k, v, cu, cu, max(lens), max(lens), causal=True).detach()
    assert torch.equal(out, want)
