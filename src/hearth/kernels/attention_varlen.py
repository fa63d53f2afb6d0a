"""Variable-length (packed) flash attention: ``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)``.

Layout (FlashAttention's varlen API): n sequences packed back to back along one token axis,
    q [total_q, Hq, D], k / v [total_k, Hk, D], sequence i = rows cu_seqlens[i] .. cu_seqlens[i+1]-1,
and each query attends only to the keys of its own sequence (a block-diagonal mask that is never built):

    O[rows of i] = softmax(scale * Q_i K_i^T (+ causal mask aligned at the sequence's start)) V_i

The Triton kernels are attention.py's own (forward, backward preprocess, dK/dV, dQ) with the constexpr
VARLEN flag set: a program (row block, sequence * head) reads its sequence's start and end from
cu_seqlens, offsets the T axis by the start and masks by the sequence's length; its key loops stop at
the sequence's end (causal: at the diagonal). The grid covers cdiv(max_seqlen, BLOCK) row blocks per
sequence; blocks past a sequence's end exit at once. The packed tensors reach the kernels as
[1, H, total, D] views (strides (any, D, H*D, 1) when contiguous), so the strided-pointer code is
reused unchanged; the backward preprocess (delta = rowsum(dO * O), row-wise) runs on those views as a
dense batch of one. VARLEN=False compiles to the same code as before the flag existed (sm_90 PTX
compared), so `attention` keeps its speed.

Work: the sum over sequences of attention's, 4 * Hq * sum_i(Tq_i * Tk_i) * D FLOPs forward (half of
the square when causal), 2.5x that backward; one packed sequence of length T costs what `attention`
at B=1 costs. Memory: out [total_q, Hq, D] and an fp32 logsumexp [Hq, total_q] saved for the backward.
Registers (ptxas, sm_90a, bf16, first Hopper config of each list): no spills in the VARLEN forward and
dQ; the D=128 dK/dV spills 104 bytes causal (the dense kernel: 84 at T=4097, 16 at T=4096: ragged
lengths cost per-row masks) and 4 non-causal (dense at T=4096: 0).

Checks: shapes, dtypes and devices at the public edge (no device sync); the cu_seqlens values
(start at 0, non-decreasing, last entry = the packed length, every length <= max_seqlen, equal q and
k lengths when causal) on the host, after ONE device->host copy of the two offset arrays (a
synchronisation of the stream): a bad offset would otherwise read out of bounds. The copy is made once per
pair of offset tensors (and lengths): the layers of a packed forward share them, and a pair seen before and not
changed in place since (its version counters) is not copied again. A write that bypasses PyTorch's version
counter (a raw kernel writing into cu_seqlens) is not seen; pass new tensors instead. The check
runs inside the custom op, so torch.compile sees one opaque node and the check still runs each call.
The backward reuses the forward's validated offsets (saved tensors: an in-place change between the
two is refused by autograd's version check).

On Hopper (bf16 / fp16; head_dim 128 forward, 64 and 128 backward) the Gluon kernels serve packed rows too
(attention_gluon.forward_varlen, backward_fused_varlen), picked by attention.forward_kernel / backward_kernel as
for dense attention and only where TMA can address the packed tensors; their fused backward adds dQ by TMA
reduce-adds into an fp32 buffer whose columns are the packed query rows when every query offset is a multiple of
DQ_TMA_ALIGN, and otherwise places each sequence's columns at a multiple of it (n_seqs * 64 more columns).

Limitations: HEARTH_ATTN_TMA does not apply to the Triton varlen kernels; n_seqs * Hq <= 65535 (CUDA grid); the int32 in-plane offsets bound max_seqlen * row stride < 2^31
(a plane 2^31 elements wide: a [T, Hq, D] sequence of T = 2^31 / (Hq * D) tokens, 419430 at 40 x 128).
"""

from __future__ import annotations

import collections
import importlib
import weakref

import torch

from hearth.kernels._common import (
    autograd_op,
    check_same_device,
    check_same_dtype,
    check_tensor,
    compiled_or_eager,
    interpret_mode,
    next_power_of_2,
    packed_planes,
    records_graph,
)

# the module, not the package's `attention` function of the same name; read at call time, so that its
# run-time flags (FUSED_DQ, AUTOTUNE) and tables apply here as they do to `attention`
_attn = importlib.import_module("hearth.kernels.attention")


# ----------------------------------------------------------------------------------------------
# Offsets: the one host check
# ----------------------------------------------------------------------------------------------
# Offsets already validated, so that the 40 attention layers of one packed forward (which all receive the same
# cu_seqlens tensors) pay the device->host copy and its stream sync once, not 40 times: id(cu_q) -> (weak refs to
# cu_q and cu_k, their version counters and data pointers, the lengths they were checked against). An in-place
# change through PyTorch bumps the version and forces a new check; the newest few pairs are kept.
_VALIDATED: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
_VALIDATED_MAX = 8


def _offsets_state(cu_q: torch.Tensor, cu_k: torch.Tensor, args: tuple) -> tuple:
    return (cu_q._version, cu_k._version, cu_q.data_ptr(), cu_k.data_ptr(), args)


def _check_offsets(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int,
                   max_q: int, max_k: int, causal: bool) -> None:
    """Validate both offset arrays after one device->host copy; ValueError naming the argument. A pair of
    offset tensors already validated against the same lengths, and not changed in place since (their version
    counters), is not copied again (_VALIDATED). The entry also keeps whether every query offset is a multiple of
    DQ_TMA_ALIGN (_q_aligned) and the sequences' lengths as host ints (_host_lengths)."""
    state = _offsets_state(cu_q, cu_k, (total_q, total_k, max_q, max_k, causal))
    seen = _VALIDATED.get(id(cu_q))
    if seen is not None and seen[0]() is cu_q and seen[1]() is cu_k and seen[2] == state:
        return
    aligned, lengths = _check_offsets_on_host(cu_q, cu_k, total_q, total_k, max_q, max_k, causal)
    _VALIDATED[id(cu_q)] = (weakref.ref(cu_q), weakref.ref(cu_k), state, aligned, lengths)
    _VALIDATED.move_to_end(id(cu_q))
    while len(_VALIDATED) > _VALIDATED_MAX:
        _VALIDATED.popitem(last=False)


# The fused Gluon backward adds dQ^T into its fp32 buffer by TMA reduce-adds whose innermost coordinate is a query
# column: at a packed sequence's first row that is not a multiple of this, the H200 raised an illegal instruction
# (suite at a102095: every test with ragged offsets; the benchmark's rows, all offsets multiples of 64, ran). Such
# packs get their columns placed apart, each sequence's at a multiple of it (backward_fused_varlen's aligned).
DQ_TMA_ALIGN = 64


def _validated(cu_q: torch.Tensor, cu_k: torch.Tensor | None = None):
    """The entry _check_offsets left for cu_q (and cu_k, when given), if those tensors are unchanged since (their
    version counters); None when not known (never checked, evicted, or changed in place)."""
    seen = _VALIDATED.get(id(cu_q))
    if seen is None or seen[0]() is not cu_q or seen[2][0] != cu_q._version:
        return None
    if cu_k is not None and (seen[1]() is not cu_k or seen[2][1] != cu_k._version):
        return None
    return seen


def _q_aligned(cu_q: torch.Tensor) -> bool:
    """Whether the forward validated cu_q (and it is unchanged) with every query offset a multiple of
    DQ_TMA_ALIGN; False when not known (an evicted entry): the padded placement serves every pack."""
    seen = _validated(cu_q)
    return seen is not None and seen[3]


def _host_lengths(cu_q: torch.Tensor, cu_k: torch.Tensor) -> tuple | None:
    """(query lengths, key lengths) of the packed sequences as host ints, from the entry the forward's check left
    for this pair of offset tensors (unchanged since); None when not known."""
    seen = _validated(cu_q, cu_k)
    return None if seen is None else seen[4]


def _check_offsets_on_host(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int,
                           max_q: int, max_k: int, causal: bool) -> tuple[bool, tuple]:
    """The checks of _check_offsets; returns (whether every query offset is a multiple of DQ_TMA_ALIGN, the
    sequences' (query lengths, key lengths) as tuples of host ints)."""
    host = torch.cat((cu_q, cu_k)).cpu()  # the one device->host copy (a stream sync) of the call
    n1 = cu_q.shape[0]
    lengths = {}
    for name, cu, total, most, max_name, t_name in (
        ("cu_seqlens_q", host[:n1], total_q, max_q, "max_seqlen_q", "q"),
        ("cu_seqlens_k", host[n1:], total_k, max_k, "max_seqlen_k", "k"),
    ):
        if int(cu[0]) != 0:
            raise ValueError(f"{name} must start at 0, got {int(cu[0])}")
        lens = cu[1:] - cu[:-1]
        bad = (lens < 0).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise ValueError(f"{name} must be non-decreasing, got {int(cu[i])} then {int(cu[i + 1])} at index {i}")
        if int(cu[-1]) != total:
            raise ValueError(f"{name} must end at the packed length of {t_name} ({total} rows), got {int(cu[-1])}")
        longest = int(lens.max())
        if longest > most:
            raise ValueError(f"{max_name} ({most}) is less than the longest sequence in {name} ({longest})")
        lengths[t_name] = lens
    if causal and not torch.equal(lengths["q"], lengths["k"]):
        i = int((lengths["q"] != lengths["k"]).nonzero()[0, 0])
        raise ValueError(
            f"causal attention needs equal q and k lengths in every sequence (cu_seqlens_q and cu_seqlens_k; the mask "
            f"is aligned at each sequence's start), got sequence {i} with q {int(lengths['q'][i])} and k {int(lengths['k'][i])}"
        )
    return bool((host[:n1] % DQ_TMA_ALIGN == 0).all()), (tuple(lengths["q"].tolist()), tuple(lengths["k"].tolist()))


# ----------------------------------------------------------------------------------------------
# Launchers (attention.py's kernels with VARLEN=True; block sizes from its tables, via its _launch)
# ----------------------------------------------------------------------------------------------
def _tune_key(max_q: int, max_k: int) -> tuple[int, int]:
    """The kernels' N_CTX_Q / N_CTX_K under VARLEN: read only by the autotuner (each program reads its own
    lengths from cu_seqlens), so they carry max_seqlen's power-of-two bucket: a packed batch's longest
    sequence changes from step to step, and a key per exact value would re-tune on every new one."""
    return next_power_of_2(max_q), next_power_of_2(max_k)


def _gluon(choice: str, serving: tuple[str, ...], *packed: torch.Tensor):
    """attention_gluon when `choice` (attention.forward_kernel's or backward_kernel's "fused" pick: the one place
    that routes dense attention, so its env switches and its Hopper / dtype / head-dim rule hold here too) is one
    of `serving` (the picks with a packed form: the ping-pong forward, the fused backward) and TMA can address the
    packed tensors; None: the Triton kernels."""
    if choice not in serving:
        return None
    from hearth.kernels import attention_gluon  # imports Gluon: only when it may be used

    return attention_gluon if attention_gluon.varlen_serves(*packed) else None


def _meta(q: torch.Tensor, causal: bool, cu_q: torch.Tensor, cu_k: torch.Tensor) -> dict:
    return dict(HEAD_DIM=q.shape[-1], CAUSAL=causal, USE_TMA=False, DOT_PREC=_attn._dot_precision(q.dtype),
                INTERP=interpret_mode(), CuSeqQ=cu_q, CuSeqK=cu_k, VARLEN=True)


def _varlen_forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float, store_lse: bool = True):
    """q [total_q, Hq, D], k/v [total_k, Hk, D] (any strides), cu_* int32 [n + 1] ->
    out [total_q, Hq, D] contiguous, lse [Hq, total_q] fp32.
    store_lse=False (no backward will run): lse is None, neither allocated nor written."""
    total_q, Hq, D = q.shape
    total_k, Hk = k.shape[0], k.shape[1]
    _check_offsets(cu_q, cu_k, total_q, total_k, max_q, max_k, causal)
    n_seqs = cu_q.shape[0] - 1
    cap = _attn.device_capability(q.device)
    choice = _attn.forward_kernel(cap, q.dtype, D, causal, seq_len=max_q)  # persistent up to PERSIST_MAX_T, as dense
    gluon = _gluon(choice, ("gluon_pp", "gluon_pps"), q, k, v)
    if gluon is not None:
        lengths = _host_lengths(cu_q, cu_k) if choice == "gluon_pps" else None
        return gluon.forward_varlen(q, k, v, cu_q, cu_k, max_q, causal, scale, store_lse, lengths=lengths)
    out = torch.empty((total_q, Hq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((Hq, total_q), dtype=torch.float32, device=q.device) if store_lse else None
    q4, k4, v4, o4 = packed_planes(q, k, v, out)
    args = (
        q4, k4, v4, o4, lse, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
        scale * _attn.LOG2E, Hq, Hq // Hk, *_tune_key(max_q, max_k),
    )
    fixed = _attn.forward_config(cap, q.dtype, D, causal, varlen=True)
    with _attn._on_device(q.device):
        _attn._launch(_attn._attn_fwd_kernel, _attn._fwd_tuned, "fwd", _attn._FWD_CANDIDATES, max_q, n_seqs * Hq,
                      args, dict(_meta(q, causal, cu_q, cu_k), STORE_LSE=store_lse), fixed=fixed)
    return out, lse


def _varlen_backward(do, q, k, v, out, lse, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float):
    """Gradients: dq [total_q, Hq, D], dk/dv [total_k, Hk, D] (contiguous, input dtype)."""
    total_q, Hq, D = q.shape
    total_k, Hk = k.shape[0], k.shape[1]
    n_seqs = cu_q.shape[0] - 1
    delta = torch.empty((Hq, total_q), dtype=torch.float32, device=q.device)
    dk = torch.empty((total_k, Hk, D), dtype=k.dtype, device=k.device)
    dv = torch.empty((total_k, Hk, D), dtype=v.dtype, device=v.device)
    choice = _attn.backward_kernel(_attn.device_capability(q.device), q.dtype, D, causal, part="fused",
                                   packed_max_len=max_k, group=Hq // Hk)
    gluon = _gluon(choice, ("gluon",), q, k, v, do)
    with _attn._on_device(q.device):
        if gluon is not None:  # delta there, in the launch that clears its dQ buffer
            dq = torch.empty((total_q, Hq, D), dtype=q.dtype, device=q.device)
            gluon.backward_fused_varlen(q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, max_q, max_k, causal,
                                        scale, aligned=_q_aligned(cu_q), out=out)
            return dq, dk, dv
        # delta is row-wise: the dense preprocess over the packed axis (a batch of one) computes it as is
        o4, do4 = packed_planes(out, do)
        _attn._bwd_preprocess(o4, do4, delta)
        q4, k4, v4, dk4, dv4 = packed_planes(q, k, v, dk, dv)
        meta = _meta(q, causal, cu_q, cu_k)
        fused = bool(_attn.FUSED_DQ)
        dq_acc = torch.zeros((1, Hq, total_q, D) if fused else (1,), dtype=torch.float32, device=q.device)
        dkdv_args = (
            q4, k4, v4, do4, lse, delta, dk4, dv4, dq_acc,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(),
            scale, scale * _attn.LOG2E, Hq, Hk, Hq // Hk, *_tune_key(max_q, max_k),
        )
        _attn._launch(_attn._attn_bwd_dkdv_kernel, _attn._dkdv_tuned, "dkdv", _attn._DKDV_CANDIDATES, max_k,
                      n_seqs * Hk, dkdv_args, dict(meta, FUSED_DQ=fused))
        if fused:
            return dq_acc[0].transpose(0, 1).to(q.dtype).contiguous(), dk, dv
        dq = torch.empty((total_q, Hq, D), dtype=q.dtype, device=q.device)
        (dq4,) = packed_planes(dq)
        dq_args = (
            q4, k4, v4, do4, lse, delta, dq4, *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dq4.stride(),
            scale, scale * _attn.LOG2E, Hq, Hq // Hk, *_tune_key(max_q, max_k),
        )
        _attn._launch(_attn._attn_bwd_dq_kernel, _attn._dq_tuned, "dq", _attn._DQ_CANDIDATES, max_q, n_seqs * Hq,
                      dq_args, meta)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------
# torch.library op + autograd: opaque to torch.compile (no graph break), fake impls give shapes.
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("hearth::attention_varlen_fwd", mutates_args=())
def _varlen_fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)


@_varlen_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale):
    total_q, Hq, D = q.shape
    return q.new_empty((total_q, Hq, D)), q.new_empty((Hq, total_q), dtype=torch.float32)


def _varlen_infer_forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float) -> torch.Tensor:
    """The forward when no backward will run: no [Hq, total_q] fp32 logsumexp is allocated or written (the op then
    holds only its output)."""
    return _varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, store_lse=False)[0]


@torch.library.custom_op("hearth::attention_varlen_infer", mutates_args=())
def _varlen_infer_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: float,
) -> torch.Tensor:
    return _varlen_infer_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)


@_varlen_infer_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale):
    return q.new_empty(q.shape)


_varlen_infer = compiled_or_eager(_varlen_infer_op, _varlen_infer_forward)


@torch.library.custom_op("hearth::attention_varlen_bwd", mutates_args=())
def _varlen_bwd_op(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _varlen_backward(do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            causal, scale)


@_varlen_bwd_op.register_fake
def _(do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.mark_non_differentiable(lse)  # saved for the backward only
    ctx.max_q, ctx.max_k, ctx.causal, ctx.scale = max_q, max_k, causal, scale


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    elif _seq_extent(dout, ctx.max_q) >= _attn._INT32_LIMIT:  # in-plane offsets are int32
        dout = dout.contiguous()
    dq, dk, dv = (_varlen_backward if ctx.eager else _varlen_bwd_op)(
        dout, q, k, v, out, lse, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None, None


# eager: a torch.autograd.Function over the launchers; under torch.compile: the custom ops
_attention_varlen = autograd_op(_varlen_fwd_op, _varlen_forward, _setup_context, _backward, once=True)


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------
def _seq_extent(t: torch.Tensor, max_len: int) -> int:
    """Largest element offset inside one sequence's [T, D] plane of a packed [total, H, D] tensor."""
    return (max_len - 1) * t.stride(0) + (t.shape[2] - 1) * t.stride(2)


def _check_offsets_arg(cu, name: str, device) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype int32, got {str(cu.dtype).replace('torch.', '')}")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be 1-D with n_seqs + 1 >= 2 entries, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; they must share a device")


def _check_max(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def attention_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False, scale: float | None = None,
) -> torch.Tensor:
    """Flash attention over packed sequences: each query attends to the keys of its own sequence only.

    Args:
        q: [total_q, Hq, D] queries of all sequences, back to back (any strides).
        k: [total_k, Hk, D] keys; Hk must divide Hq (grouped-query attention when Hk < Hq).
        v: [total_k, Hk, D] values.
        cu_seqlens_q: int32 [n_seqs + 1] offsets into q's first axis: 0, then non-decreasing, last = total_q.
            Sequence i is rows cu_seqlens_q[i] .. cu_seqlens_q[i+1]-1. Zero-length sequences are allowed.
        cu_seqlens_k: int32 [n_seqs + 1] offsets into k / v, likewise (last = total_k).
        max_seqlen_q: an int >= the longest query sequence (the grid's row bound; a larger value only
            launches blocks that exit at once).
        max_seqlen_k: an int >= the longest key sequence.
        causal: mask keys after the query position, aligned at each sequence's start; needs equal q and
            k lengths in every sequence.
        scale: multiplier of q k^T; default 1/sqrt(D).

    Returns:
        [total_q, Hq, D] contiguous, in the input dtype. Differentiable in q, k and v. A query whose
        sequence has no keys (k length 0, non-causal) gets 0.

    dtypes and head dims as `attention`: float16 / bfloat16 / float32; D 1..256 (a power of two in
    16..256 natively, any other zero-padded to the next). Cost: attention's per sequence, summed. With no gradient
    to compute (torch.no_grad, or no input that requires grad) the forward writes no [Hq, total_q] fp32 logsumexp:
    the call holds only its output, as `attention` does.

    Host cost: ONE device->host copy of cu_seqlens_q and cu_seqlens_k per forward (it synchronises the
    stream), to check their values before any kernel reads through them. That copy also keeps a call out
    of CUDA-graph capture.

    Raises:
        TypeError: a non-tensor, an unsupported or mixed dtype, cu_seqlens not int32, a non-int max_seqlen,
            a non-bool causal or a non-number scale.
        ValueError: wrong ndim, empty q / k / v, different devices, mismatched heads / D, Hq not a multiple
            of Hk, an unsupported D, cu_seqlens of different lengths or not 1-D, offsets that do not start
            at 0, decrease or do not end at the packed length, a sequence longer than max_seqlen,
            causal with unequal q and k lengths in a sequence, n_seqs * Hq > 65535, a scale that is not
            positive and finite.
    """
    check_tensor(q, "q", ndim=3)
    check_tensor(k, "k", ndim=3)
    check_tensor(v, "v", ndim=3)
    check_same_device(q=q, k=k, v=v)
    check_same_dtype(q=q, k=k, v=v)
    total_q, Hq, D = q.shape
    if _attn.padded_head_dim(D) is None:
        raise ValueError(f"q head dim (last dim) must be in 1..{_attn.MAX_HEAD_DIM}, got {D}")
    if k.shape[2] != D:
        raise ValueError(f"k head dim must equal q's ({D}), got shape {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    Hk = k.shape[1]
    if Hq % Hk:
        raise ValueError(f"k heads ({Hk}) must divide q heads ({Hq}) for grouped-query attention")
    _check_offsets_arg(cu_seqlens_q, "cu_seqlens_q", q.device)
    _check_offsets_arg(cu_seqlens_k, "cu_seqlens_k", q.device)
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(f"cu_seqlens_k must have as many entries as cu_seqlens_q ({cu_seqlens_q.shape[0]}), "
                         f"got {cu_seqlens_k.shape[0]}")
    _check_max(max_seqlen_q, "max_seqlen_q")
    _check_max(max_seqlen_k, "max_seqlen_k")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    scale = _attn._checked_scale(scale, D)
    n_seqs = cu_seqlens_q.shape[0] - 1
    if n_seqs * Hq > _attn.MAX_BATCH_HEADS:
        raise ValueError(f"cu_seqlens_q gives n_seqs x heads = {n_seqs} x {Hq} = {n_seqs * Hq}; at most "
                         f"{_attn.MAX_BATCH_HEADS} (CUDA grid limit) are supported")
    tensors = {"q": q, "k": k, "v": v}
    padded = _attn.padded_head_dim(D)
    if padded != D:  # e.g. 80 or 96 -> 128: zero columns, scale kept at the real D's (computed above)
        tensors = {n: torch.nn.functional.pad(t, (0, padded - D)) for n, t in tensors.items()}
    # checked on the tensors the kernels read: a padded copy's rows are wider than the caller's
    for name, t in tensors.items():
        longest = max_seqlen_q if name == "q" else max_seqlen_k
        if _seq_extent(t, longest) >= _attn._INT32_LIMIT:
            # one sequence's [T, D] plane spans >= 2^31 elements (int32 in-plane offsets): a dense copy may fit
            tensors[name] = t = t.contiguous()
            if _seq_extent(t, longest) >= _attn._INT32_LIMIT:
                raise ValueError(f"{name}: a sequence of up to {longest} rows x {t.stride(0)} elements spans >= 2^31 "
                                 f"elements; lower max_seqlen_{name[0] if name == 'q' else 'k'}")
    # the kernels read the offsets as a dense int32 array: a strided view is copied (a no-op when dense)
    args = (tensors["q"], tensors["k"], tensors["v"], cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
            max_seqlen_q, max_seqlen_k, causal, scale)
    if records_graph(q, k, v):
        out, _ = _attention_varlen(*args)
    else:  # no graph to record: skip the logsumexp the backward would need
        out = _varlen_infer(*args)
    return out if padded == D else out[..., :D]
