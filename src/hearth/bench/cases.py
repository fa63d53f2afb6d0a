"""Op specs for the benchmark: sizes, byte / FLOP formulas, input makers and fp32 references.

A *case* is op x size x dtype x mode, where mode is
  fwd  - the forward alone, inputs without requires_grad (inference forward);
  bwd  - the backward alone (each forward runs outside the timed region, then the backward is timed);
  full - forward then backward, gradients reset to None before every call.

Each OpSpec states the work a case must do at least: for memory-bound ops the fewest bytes
(each input read once, each output written once) giving GB/s, for matmul-bound ops the FLOPs
giving TFLOP/s. A full case is two calls, the forward returning before dy exists, so its bytes are the
forward's plus the backward's (the backward re-reads what it needs, except tensors small enough to stay in
L2 between the two: weights, rope's cos / sin); only cross entropy's scalar loss lets a fused forward write
the gradient while it reads the logits. The same formula text is written into the
Markdown report.

Inputs are random normal (never zeros: zeros hide unwritten outputs), drawn from a seeded
generator so every provider of a case sees the same tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

MODES = ("fwd", "bwd", "full")

# OpSpec.layout values: what a row's "layout" says about its inputs
LAYOUTS = {
    "contiguous": "every input a contiguous tensor",
    "hf": "q, k (v) and dy as a Hugging Face attention module holds them: [B, H, T, D] views of [B, T, H, D] memory "
          "(q_proj(x).view(B, T, H, D).transpose(1, 2))",
}


@dataclass
class OpSpec:
    """One benchmarked op.

    make(size, dtype, device, requires_grad) -> dict of named input tensors.
    reference(**fp32 inputs) -> output tensor or tuple (autograd-differentiable, fp32).
    grad_names: the inputs whose gradients are checked and reset (in this order).
    work(size, itemsize, mode) -> bytes (metric "GB/s") or FLOPs (metric "TFLOP/s").
    """

    name: str
    metric: str  # "GB/s" or "TFLOP/s"
    formula: str
    work: Callable[[dict, int, str], float]
    make: Callable
    reference: Callable
    grad_names: Callable[[dict], list[str]]
    label: Callable[[dict], str]
    sizes: dict[str, list[dict]]
    headline: list[tuple[dict, tuple[str, ...]]]
    knob: str
    explicit: Callable[[int], dict]
    modes: tuple[str, ...] = MODES
    notes: str = ""
    check_sizes: list[dict] = field(default_factory=list)
    # non-tensor keyword arguments a size implies for the op and its reference (attention: causal)
    call_kwargs: Callable[[dict], dict] = lambda s: {}
    # the model-shape suite (--sizes models): (name naming the source model, size, modes)
    models: list[tuple[str, dict, tuple[str, ...]]] = field(default_factory=list)
    # (input elements, largest intermediate's elements) of a size, for the memory estimate
    elems: Callable[[dict], tuple[int, int]] = lambda s: (0, 0)
    # per output, the input whose memory layout its dy takes (empty: contiguous dy). rope: ("q", "k"), as the
    # attention backward hands a model's rope its gradient in the layout rope handed it q and k; attention: ("q",),
    # as o_proj's backward hands the attention output's gradient back through o.transpose(1, 2)
    grad_like: tuple[str, ...] = ()
    # the inputs' memory layout, written into every row ("layout"; LAYOUTS): rows of different layouts are never
    # ranked against each other (report.row_layout)
    layout: str = "contiguous"

    def case_label(self, size: dict) -> str:
        """The case's name in rows and tables: a model case's own name, else the shape."""
        return size.get("name") or self.label(size)


# ----------------------------------------------------------------------------- helpers
def _randn(shape, dtype, device, seed, requires_grad=False, scale=1.0):
    """Seeded N(0, scale^2) drawn on `device` itself (drawing 10 GB of logits on the host and
    copying them over would take longer than the benchmark)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
    return t.to(dtype=dtype).requires_grad_(requires_grad)


def _randint(high, shape, device, seed):
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, high, shape, generator=gen, device=device)


def _gen(seed=0):
    return seed


def _mode_factor(mode: str, fwd: float, bwd: float) -> float:
    """Work of a mode from the forward and backward terms (full = fwd + bwd unless fused)."""
    return {"fwd": fwd, "bwd": bwd, "full": fwd + bwd}[mode]


# ----------------------------------------------------------------------------- softmax
def _softmax_make(s, dtype, device, rg):
    return {"x": _randn((s["M"], s["N"]), dtype, device, _gen(), rg)}


def _softmax_ref(x):
    import torch

    return torch.softmax(x, dim=-1)


def _softmax_work(s, b, mode):
    mn = s["M"] * s["N"] * b
    return {"fwd": 2 * mn, "bwd": 3 * mn, "full": 5 * mn}[mode]


# ----------------------------------------------------------------------------- cross entropy
def _ce_make(s, dtype, device, rg):
    x = _randn((s["N"], s["V"]), dtype, device, _gen(), rg, scale=2.0)
    t = _randint(s["V"], (s["N"],), device, 1)
    return {"input": x, "target": t}


def _ce_ref(input, target):
    import torch.nn.functional as F

    return F.cross_entropy(input, target)


def _ce_work(s, b, mode):
    nv = s["N"] * s["V"] * b
    # fwd reads the logits once; bwd reads logits and writes their gradient; a fused fwd+bwd
    # can write the gradient while it reads the logits: read once + write once.
    return {"fwd": nv, "bwd": 2 * nv, "full": 2 * nv}[mode] + s["N"] * 8


# ----------------------------------------------------------------------------- linear cross entropy
def _lce_make(s, dtype, device, rg):
    x = _randn((s["N"], s["H"]), dtype, device, _gen(), rg)
    w = _randn((s["V"], s["H"]), dtype, device, _gen(2), rg and not s.get("frozen", 0), scale=1.0 / math.sqrt(s["H"]))
    t = _randint(s["V"], (s["N"],), device, 1)
    return {"input": x, "linear_weight": w, "target": t}


def _lce_ref(input, linear_weight, target):
    import torch.nn.functional as F

    return F.cross_entropy(F.linear(input, linear_weight), target)


def _lce_work(s, b, mode):
    mm = 2 * s["N"] * s["H"] * s["V"]
    bwd = mm if s.get("frozen", 0) else 2 * mm  # grad input (+ grad weight unless frozen)
    return _mode_factor(mode, mm, bwd)


def _lce_grads(s):
    return ["input"] if s.get("frozen", 0) else ["input", "linear_weight"]


# ----------------------------------------------------------------------------- norms
def _rms_make(s, dtype, device, rg):
    import torch

    w = (_randn((s["N"],), torch.float32, device, 3, scale=0.1) + 1.0).to(dtype)
    return {"x": _randn((s["M"], s["N"]), dtype, device, _gen(), rg), "weight": w.requires_grad_(rg)}


def _rms_ref(x, weight):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def _ln_make(s, dtype, device, rg):
    d = _rms_make(s, dtype, device, rg)
    d["bias"] = _randn((s["N"],), dtype, device, _gen(4), rg, scale=0.1)
    return d


def _ln_ref(x, weight, bias):
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


def _norm_work(s, b, mode):
    mn = s["M"] * s["N"] * b
    # fwd: read x, write y. bwd: read x and dy, write dx. full = fwd + bwd: the forward returns before dy exists,
    # so the backward reads x again (no fwd+bwd can share that read). Weight/bias terms (N elements) are counted once.
    return {"fwd": 2 * mn, "bwd": 3 * mn, "full": 5 * mn}[mode] + 2 * s["N"] * b


# ----------------------------------------------------------------------------- rope
def _rope_make(s, dtype, device, rg):
    """q, k as a Hugging Face attention module hands them to apply_rotary_pos_emb: q_proj(x).view(B, T, H, D)
    .transpose(1, 2), a [B, H, T, D] view of [B, T, H, D] memory (hearth reads any strides; Liger's kernel works in
    place on those rows and copied q, k, dy and its gradient on contiguous [B, H, T, D], about 3x its bytes)."""
    import torch

    B, Hq, Hk, T, D = s["B"], s["Hq"], s["Hk"], s["T"], s["D"]
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    emb = torch.cat([ang, ang], dim=-1)[None]  # [1, T, D], rotate-half convention
    return {
        "q": _randn((B, T, Hq, D), dtype, device, _gen()).transpose(1, 2).requires_grad_(rg),
        "k": _randn((B, T, Hk, D), dtype, device, _gen(5)).transpose(1, 2).requires_grad_(rg),
        "cos": emb.cos().to(device=device, dtype=dtype),
        "sin": emb.sin().to(device=device, dtype=dtype),
    }


def rotate_half(x):
    import torch

    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope_ref(q, k, cos, sin):
    c, s_ = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rotate_half(q) * s_, k * c + rotate_half(k) * s_


def _rope_work(s, b, mode):
    qk = s["B"] * (s["Hq"] + s["Hk"]) * s["T"] * s["D"] * b
    cs = 2 * s["T"] * s["D"] * b
    # full: q, k passes of fwd + bwd; cos / sin (2*T*D elements, tens of MiB at most) counted once, as they can stay in
    # L2 from the forward to the backward (q, k, their outputs and gradients cannot: each pass is 4x-150x the L2)
    return {"fwd": 2 * qk + cs, "bwd": 2 * qk + cs, "full": 4 * qk + cs}[mode]


# ----------------------------------------------------------------------------- swiglu
def _swiglu_make(s, dtype, device, rg):
    return {"gate": _randn((s["M"], s["I"]), dtype, device, _gen(), rg), "up": _randn((s["M"], s["I"]), dtype, device, _gen(6), rg)}


def _swiglu_ref(gate, up):
    import torch.nn.functional as F

    return F.silu(gate) * up


def _swiglu_work(s, b, mode):
    mi = s["M"] * s["I"] * b
    # fwd: read g, u; write h. bwd: read g, u, dh; write dg, du. full = fwd + bwd = 8 passes: the forward returns
    # before dh exists, so the backward reads g and u again (6 passes, as if one call read them once, put a kernel at
    # the copy bandwidth at 75% of it).
    return {"fwd": 3 * mi, "bwd": 5 * mi, "full": 8 * mi}[mode]


# ----------------------------------------------------------------------------- swiglu mlp
def _mlp_make(s, dtype, device, rg):
    H, I = s["H"], s["I"]
    return {
        "x": _randn((s["N"], H), dtype, device, _gen(), rg),
        "w_gate": _randn((I, H), dtype, device, _gen(7), rg, scale=1 / math.sqrt(H)),
        "w_up": _randn((I, H), dtype, device, _gen(8), rg, scale=1 / math.sqrt(H)),
        "w_down": _randn((H, I), dtype, device, _gen(9), rg, scale=1 / math.sqrt(I)),
    }


def _mlp_ref(x, w_gate, w_up, w_down):
    import torch.nn.functional as F

    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _mlp_work(s, b, mode):
    mm = 3 * 2 * s["N"] * s["H"] * s["I"]  # gate, up, down projections
    return _mode_factor(mode, mm, 2 * mm)


# ----------------------------------------------------------------------------- attention
def _attn_make(s, dtype, device, rg):
    """q, k, v as a Hugging Face attention module hands them to its attention function (since review 50; contiguous
    [B, H, T, D] before): x_proj(x).view(B, T, H, D).transpose(1, 2), [B, H, T, D] views of [B, T, H, D] memory (rope
    keeps q's and k's memory order). Each is a leaf, so its .grad is checked and reset; autograd lays a gradient out
    like its leaf, as a model's transpose / view backward does."""
    B, Hq, Hk, T, D = s["B"], s["Hq"], s["Hk"], s["T"], s["D"]
    return {
        "q": _randn((B, T, Hq, D), dtype, device, _gen()).transpose(1, 2).requires_grad_(rg),
        "k": _randn((B, T, Hk, D), dtype, device, _gen(10)).transpose(1, 2).requires_grad_(rg),
        "v": _randn((B, T, Hk, D), dtype, device, _gen(11)).transpose(1, 2).requires_grad_(rg),
    }


def _attention_chunk(qs, k, v, scale, causal):
    import torch

    sc = (qs @ k.transpose(-1, -2)) * scale  # [g, T, T]
    if causal:
        T = sc.shape[-1]
        sc = sc.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=sc.device).tril(), float("-inf"))
    return torch.softmax(sc, dim=-1) @ v


def attention_reference(q, k, v, causal):
    """fp32 attention one (batch, query head) at a time, each chunk under activation
    checkpointing: only one head's T*T scores exist at once, in the forward and the backward
    (at T=32k one head's scores take 4 GiB; a GQA group of 8 at once would need ~100 GB with
    the softmax and the backward). Query head i uses kv head i // g."""
    import torch
    from torch.utils.checkpoint import checkpoint

    B, Hq, T, D = q.shape
    Hk = k.shape[1]
    g = Hq // Hk
    scale = 1.0 / math.sqrt(D)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    outs = []
    for b in range(B):
        heads = []
        for h in range(Hq):
            args = (q[b, h:h + 1], k[b, h // g], v[b, h // g], scale, causal)
            heads.append(checkpoint(_attention_chunk, *args, use_reentrant=False) if grad else _attention_chunk(*args))
        outs.append(torch.cat(heads, 0))
    return torch.stack(outs, 0)


def _attn_work(s, b, mode):
    f = 4 * s["B"] * s["Hq"] * s["T"] * s["T"] * s["D"] * (0.5 if s["causal"] else 1.0)
    return {"fwd": f, "bwd": 2.5 * f, "full": 3.5 * f}[mode]


# ----------------------------------------------------------------------------- attention_varlen
def varlen_lengths(S: int, T: int) -> list[int]:
    """S ragged sequence lengths summing to T (T >= S): alternately 1/2 and 3/2 of T/S (the 1:3 spread
    of packed fine-tuning data), the last taking what is left. Deterministic, so every provider and
    every run sees the same packing."""
    base = T // S
    lens = [base - base // 2 if i % 2 == 0 else base + base // 2 for i in range(S - 1)]
    return lens + [T - sum(lens)]


def parse_attention_case(text: str, option: str = "--case", ragged: bool = False) -> tuple[str, tuple]:
    """The attention probes' case text 'LABEL:B,Hq,Hk,T,D,causal' (the label may hold ':'), with ragged=True also
    'LABEL:S,Hq,Hk,L,D,causal,1' (S sequences of L tokens packed raggedly: varlen_lengths) -> (label, (B, Hq, Hk, T,
    D, causal)), with ragged=True (..., causal, ragged). Bad text is a ValueError naming `option` and the case."""
    fields = "B,Hq,Hk,T,D,causal" + ("[,ragged]" if ragged else "")
    label, sep, dims = text.rpartition(":")
    if not sep or not label.strip():
        raise ValueError(f"{option} must be 'LABEL:{fields}', got {text!r}")
    parts = dims.split(",")
    counts = (6, 7) if ragged else (6,)
    if len(parts) not in counts:
        raise ValueError(f"{option} {text!r}: expected {' or '.join(map(str, counts))} numbers {fields}, "
                         f"got {len(parts)}")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{option} {text!r}: {fields} must be whole numbers") from None
    b, hq, hk, t, d, causal = nums[:6]
    flags = nums[5:]
    if min(b, hq, hk, t, d) < 1 or hq % hk or any(f not in (0, 1) for f in flags):
        raise ValueError(f"{option} {text!r}: sizes must be positive, Hq a multiple of Hk, causal"
                         f"{' and ragged' if ragged else ''} 0 or 1")
    out = (b, hq, hk, t, d, bool(causal))
    return label.strip(), out + ((bool(nums[6]) if len(nums) == 7 else False,) if ragged else ())


def _varlen_make(s, dtype, device, rg):
    import itertools

    import torch

    T, Hq, Hk, D = s["T"], s["Hq"], s["Hk"], s["D"]
    cu = torch.tensor([0, *itertools.accumulate(varlen_lengths(s["S"], T))], dtype=torch.int32, device=device)
    return {
        "q": _randn((T, Hq, D), dtype, device, _gen(), rg),
        "k": _randn((T, Hk, D), dtype, device, _gen(10), rg),
        "v": _randn((T, Hk, D), dtype, device, _gen(11), rg),
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu.clone(),
    }


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
    """fp32, one sequence at a time through attention_reference (one head's scores at a time).
    q [T, Hq, D] packed; sequence i is rows cu_seqlens[i] .. cu_seqlens[i+1]-1."""
    import torch

    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs = []
    for i in range(len(cq) - 1):
        seq_q = q[cq[i]:cq[i + 1]].transpose(0, 1).unsqueeze(0)
        seq_k = k[ck[i]:ck[i + 1]].transpose(0, 1).unsqueeze(0)
        seq_v = v[ck[i]:ck[i + 1]].transpose(0, 1).unsqueeze(0)
        outs.append(attention_reference(seq_q, seq_k, seq_v, causal)[0].transpose(0, 1))
    return torch.cat(outs)


def _varlen_work(s, b, mode):
    squares = sum(n * n for n in varlen_lengths(s["S"], s["T"]))
    f = 4 * s["Hq"] * squares * s["D"] * (0.5 if s["causal"] else 1.0)
    return {"fwd": f, "bwd": 2.5 * f, "full": 3.5 * f}[mode]


def _varlen_kwargs(s):
    longest = max(varlen_lengths(s["S"], s["T"]))
    return {"max_seqlen_q": longest, "max_seqlen_k": longest, "causal": bool(s["causal"])}


# ----------------------------------------------------------------------------- matmul
def _mm_make(s, dtype, device, rg):
    return {"a": _randn((s["M"], s["K"]), dtype, device, _gen(), rg), "b": _randn((s["K"], s["N"]), dtype, device, _gen(12), rg)}


def _mm_ref(a, b):
    return a @ b


def _mm_work(s, b, mode):
    f = 2 * s["M"] * s["N"] * s["K"]
    return _mode_factor(mode, f, 2 * f)


# ----------------------------------------------------------------------------- labels
def _mn(s):
    return f"{s['M']}x{s['N']}"


def _attn_label(s):
    heads = f"H={s['Hq']}" if s["Hq"] == s["Hk"] else f"Hq={s['Hq']} Hk={s['Hk']}"
    return f"B={s['B']} {heads} T={s['T']} D={s['D']} {'causal' if s['causal'] else 'non-causal'}"


def _varlen_label(s):
    lens = varlen_lengths(s["S"], s["T"])
    heads = f"H={s['Hq']}" if s["Hq"] == s["Hk"] else f"Hq={s['Hq']} Hk={s['Hk']}"
    seqs = f"{s['S']} seqs of {min(lens)}-{max(lens)}" if s["S"] > 1 else "1 seq"
    return f"{seqs} (T={s['T']}) {heads} D={s['D']} {'causal' if s['causal'] else 'non-causal'}"


def _rope_label(s):
    return f"q[{s['B']},{s['Hq']},{s['T']},{s['D']}] k[{s['B']},{s['Hk']},{s['T']},{s['D']}]"


def _lce_label(s):
    return f"N={s['N']} H={s['H']} V={s['V']}" + (" frozen W" if s.get("frozen", 0) else "")


def _attn(B, Hq, Hk, T, D=128, causal=1):
    return dict(B=B, Hq=Hq, Hk=Hk, T=T, D=D, causal=causal)


def _varlen(S, T, Hq, Hk, D=128, causal=1):
    return dict(S=S, T=T, Hq=Hq, Hk=Hk, D=D, causal=causal)


FWD, FULL, BOTH = ("fwd",), ("full",), ("fwd", "full")

SPECS: dict[str, OpSpec] = {
    "softmax": OpSpec(
        "softmax", "GB/s", "bytes: fwd 2*M*N*b (read x, write y); bwd 3*M*N*b (read y, dy; write dx); full 5*M*N*b",
        _softmax_work, _softmax_make, _softmax_ref, lambda s: ["x"], _mn,
        sizes={"sweep": [dict(M=4096, N=n) for n in (1024, 4096, 16384, 65536, 262144)],
               "small": [dict(M=1024, N=n) for n in (1024, 8192)]},
        headline=[(dict(M=16384, N=8192), BOTH), (dict(M=4096, N=262144), FWD)],
        knob="N", explicit=lambda v: dict(M=4096, N=v),
        check_sizes=[dict(M=5, N=100)]),
    "cross_entropy": OpSpec(
        "cross_entropy", "GB/s", "bytes: fwd N*V*b; bwd 2*N*V*b; full 2*N*V*b (read logits once, write grad once); + 8*N for targets",
        _ce_work, _ce_make, _ce_ref, lambda s: ["input"], lambda s: f"N={s['N']} V={s['V']}",
        sizes={"sweep": [dict(N=8192, V=v) for v in (32768, 65536, 131072, 151936, 262144)],
               "small": [dict(N=1024, V=v) for v in (32768, 131072)]},
        headline=[(dict(N=8192, V=131072), FULL), (dict(N=16384, V=151936), FULL)],
        knob="V", explicit=lambda v: dict(N=8192, V=v),
        notes="fused losses (Liger, hearth) may compute the gradient inside the forward, so their bwd alone is near zero: compare full",
        check_sizes=[dict(N=6, V=100)]),
    "linear_cross_entropy": OpSpec(
        "linear_cross_entropy", "TFLOP/s", "FLOPs: fwd 2*N*H*V; bwd 4*N*H*V (2*N*H*V with frozen W); full = fwd + bwd",
        _lce_work, _lce_make, _lce_ref, _lce_grads, _lce_label,
        sizes={"sweep": [dict(N=8192, H=4096, V=v) for v in (32768, 65536, 131072, 262144)],
               "small": [dict(N=1024, H=1024, V=32768)]},
        headline=[(dict(N=8192, H=4096, V=131072), FULL), (dict(N=8192, H=5120, V=151936), FULL),
                  (dict(N=8192, H=5120, V=151936, frozen=1), FULL)],
        knob="V", explicit=lambda v: dict(N=8192, H=4096, V=v),
        notes="memory: total = everything the call allocates incl. the [V, H] weight gradient; activation = total - gradients",
        check_sizes=[dict(N=6, H=32, V=100), dict(N=6, H=32, V=100, frozen=1)]),
    "rms_norm": OpSpec(
        "rms_norm", "GB/s", "bytes: fwd 2*M*N*b; bwd 3*M*N*b; full 5*M*N*b (fwd + bwd: the backward re-reads x); + 2*N*b for the weight",
        _norm_work, _rms_make, _rms_ref, lambda s: ["x", "weight"], _mn,
        sizes={"sweep": [dict(M=16384, N=n) for n in (1024, 2048, 4096, 8192, 16384)] + [dict(M=m, N=4096) for m in (4096, 65536)],
               "small": [dict(M=4096, N=n) for n in (1024, 4096)]},
        headline=[(dict(M=32768, N=4096), FULL)],
        knob="N", explicit=lambda v: dict(M=16384, N=v), check_sizes=[dict(M=5, N=96)]),
    "layer_norm": OpSpec(
        "layer_norm", "GB/s", "bytes: fwd 2*M*N*b; bwd 3*M*N*b; full 5*M*N*b (fwd + bwd); + 2*N*b for weight and bias",
        _norm_work, _ln_make, _ln_ref, lambda s: ["x", "weight", "bias"], _mn,
        sizes={"sweep": [dict(M=16384, N=n) for n in (1024, 2048, 4096, 8192, 16384)] + [dict(M=m, N=4096) for m in (4096, 65536)],
               "small": [dict(M=4096, N=n) for n in (1024, 4096)]},
        headline=[(dict(M=32768, N=4096), FULL)],
        knob="N", explicit=lambda v: dict(M=16384, N=v), check_sizes=[dict(M=5, N=96)]),
    "rope": OpSpec(
        "rope", "GB/s", "bytes: fwd and bwd 2*(Nq+Nk)*b; full 4*(Nq+Nk)*b, Nq = B*Hq*T*D, Nk = B*Hk*T*D; + 2*T*D*b for cos/sin",
        _rope_work, _rope_make, _rope_ref, lambda s: ["q", "k"], _rope_label,
        notes="q, k and dy in the Hugging Face layout: [B, H, T, D] views of [B, T, H, D] memory",
        grad_like=("q", "k"), layout="hf",
        sizes={"sweep": [dict(B=1, Hq=32, Hk=8, T=t, D=128) for t in (1024, 2048, 4096, 8192, 16384)],
               "small": [dict(B=1, Hq=32, Hk=8, T=1024, D=128)]},
        headline=[(dict(B=4, Hq=32, Hk=8, T=4096, D=128), FULL)],
        knob="T", explicit=lambda v: dict(B=1, Hq=32, Hk=8, T=v, D=128), check_sizes=[dict(B=1, Hq=4, Hk=2, T=8, D=16)]),
    "swiglu": OpSpec(
        "swiglu", "GB/s", "bytes: fwd 3*M*I*b; bwd 5*M*I*b; full 8*M*I*b (fwd + bwd: the backward re-reads g, u)",
        _swiglu_work, _swiglu_make, _swiglu_ref, lambda s: ["gate", "up"], lambda s: f"{s['M']}x{s['I']}",
        sizes={"sweep": [dict(M=m, I=14336) for m in (1024, 4096, 8192, 16384, 32768)],
               "small": [dict(M=1024, I=14336)]},
        headline=[(dict(M=8192, I=14336), FULL)],
        knob="M", explicit=lambda v: dict(M=v, I=14336), check_sizes=[dict(M=5, I=96)]),
    "swiglu_mlp": OpSpec(
        "swiglu_mlp", "TFLOP/s", "FLOPs: fwd 6*N*H*I (gate, up, down); bwd 12*N*H*I; full 18*N*H*I",
        _mlp_work, _mlp_make, _mlp_ref, lambda s: ["x", "w_gate", "w_up", "w_down"], lambda s: f"N={s['N']} H={s['H']} I={s['I']}",
        sizes={"sweep": [dict(N=n, H=4096, I=14336) for n in (1024, 2048, 4096, 8192, 16384)],
               "small": [dict(N=1024, H=1024, I=4096)]},
        headline=[(dict(N=8192, H=4096, I=14336), FULL)],
        knob="N", explicit=lambda v: dict(N=v, H=4096, I=14336),
        notes="hearth = hearth.nn.SwiGLUMLP; memory: total incl. the three weight gradients, activation = total - gradients",
        check_sizes=[dict(N=5, H=32, I=64)]),
    "attention": OpSpec(
        "attention", "TFLOP/s", "FLOPs: fwd 4*B*Hq*T*T*D (halved when causal); bwd 2.5x fwd; full 3.5x fwd",
        _attn_work, _attn_make, None, lambda s: ["q", "k", "v"], _attn_label,
        sizes={"sweep": [_attn(max(1, 16384 // t), 32, 32, t) for t in (512, 1024, 2048, 4096, 8192, 16384)],
               "small": [_attn(2, 16, 16, 1024)],
               # the flash-attention goal's grid: GQA 40/8, head_dim 64 and 128, causal and not, T 1024-32768,
               # 16384 tokens a batch (B = 16384 / T, at least 1)
               "goal": [_attn(max(1, 16384 // t), 40, 8, t, D=d, causal=c) for c in (1, 0) for d in (128, 64)
                        for t in (1024, 2048, 4096, 8192, 16384, 32768)]},
        headline=[(_attn(4, 32, 32, 4096), BOTH), (_attn(4, 40, 8, 4096), BOTH), (_attn(4, 32, 32, 4096, causal=0), BOTH)],
        knob="T", explicit=lambda v: _attn(max(1, 16384 // v), 32, 32, v),
        notes="q, k, v and dy in the Hugging Face layout: [B, H, T, D] views of [B, T, H, D] memory (contiguous "
              "[B, H, T, D] in rows without a layout field)",
        grad_like=("q",), layout="hf",
        check_sizes=[_attn(1, 4, 2, 16, D=16, causal=1), _attn(1, 2, 2, 16, D=16, causal=0)]),
    "attention_varlen": OpSpec(
        "attention_varlen", "TFLOP/s",
        "FLOPs: fwd 4*Hq*D*sum_i(T_i^2) over the packed sequences (halved when causal); bwd 2.5x fwd; full 3.5x fwd",
        _varlen_work, _varlen_make, attention_varlen_reference, lambda s: ["q", "k", "v"], _varlen_label,
        sizes={"sweep": [_varlen(n, 16384, 32, 8) for n in (1, 2, 4, 8, 16, 32, 64)],
               "small": [_varlen(4, 4096, 16, 16)]},
        headline=[(_varlen(8, 16384, 40, 8), BOTH), (_varlen(8, 16384, 40, 8, causal=0), BOTH),
                  (_varlen(64, 16384, 32, 8), BOTH)],
        knob="S", explicit=lambda v: _varlen(v, 16384, 32, 8),
        notes="packed sequences (cu_seqlens), no attention across them; q, k, v contiguous [total_tokens, H, D], as a "
              "model's packed batch reaches its varlen attention; eager = SDPA with a block-diagonal mask "
              "(built once per case, K/V heads repeated for GQA); flash_attn = its varlen function where it imports",
        check_sizes=[_varlen(3, 21, 2, 1, D=16, causal=1), _varlen(2, 16, 2, 2, D=16, causal=0)]),
    "matmul": OpSpec(
        "matmul", "TFLOP/s", "FLOPs: fwd 2*M*N*K; bwd 4*M*N*K; full 6*M*N*K",
        _mm_work, _mm_make, _mm_ref, lambda s: ["a", "b"], lambda s: f"{s['M']}x{s['N']}x{s['K']}",
        sizes={"sweep": [dict(M=n, N=n, K=n) for n in (1024, 2048, 4096, 8192, 16384)],
               "small": [dict(M=2048, N=2048, K=2048)]},
        headline=[(dict(M=4096, N=4096, K=4096), FWD), (dict(M=8192, N=8192, K=8192), FWD)],
        knob="M", explicit=lambda v: dict(M=v, N=v, K=v), check_sizes=[dict(M=33, N=40, K=48)]),
}
# rope_inplace: the in-place ropes side by side, hearth's rope(inplace=True) against Liger's (which always rotates in
# place): the same cases as rope, whose rows stay the comparison with torch.compile's out-of-place rope. Both write
# over q and k, so neither may be a leaf (PyTorch's rule, which hearth keeps): each provider gets non-leaf copies
# made once outside the timed call, as a model's q_proj(x) is (providers._inplace_rope_bound).
SPECS["rope_inplace"] = replace(
    SPECS["rope"], name="rope_inplace",
    notes="in place, hearth vs Liger like for like: q, k (non-leaf, Hugging Face layout) and dy are overwritten")
SPECS["attention"].reference = attention_reference
SPECS["attention"].call_kwargs = lambda s: {"causal": bool(s["causal"])}
SPECS["attention_varlen"].call_kwargs = _varlen_kwargs


# ----------------------------------------------------------------------------- model shapes (--sizes models)
# Shapes from the published configs of the models trained with these kernels (config.json of each):
#   model            hidden  intermediate  heads q/kv  head_dim  vocab
#   Qwen3-0.6B        1024      3072         16/8        128     151936
#   Qwen3-1.7B        2048      6144         16/8        128     151936
#   Qwen3-4B          2560      9728         32/8        128     151936
#   Qwen3-8B          4096     12288         32/8        128     151936
#   Qwen3-14B         5120     17408         40/8        128     151936
#   Qwen3-32B         5120     25600         64/8        128     151936
#   Llama-3.2-1B      2048      8192         32/8         64     128256
#   Llama-3.1-8B      4096     14336         32/8        128     128256
#   Llama-3.1-70B     8192     28672         64/8        128     128256
#   Llama-2-7B        4096     11008         32/32       128      32000
#   Qwen2.5-7B        3584     18944         28/4        128     152064
#   Gemma-3 (4B-27B)     -         -            -          -     262144
# Token counts: 4096 and 16384 (packed batches), 12289 (an odd packed row count: no power-of-two
# tail), 65536 (small models, long packs). One case per distinct shape; a shape shared by several
# models is named after one of them. Together the ops cover every hidden size (norms, linear CE,
# MLP), intermediate size (swiglu, MLP), vocabulary (softmax, cross entropy, linear CE), token
# count, head_dim and GQA group (1, 4, 5, 8; T 2048-32768) above, in 44 cases (fwd+bwd unless
# marked, as training runs them) so that the whole suite, torch.compile of every peer graph
# included, fits in about 7 minutes on an H200 (scripts/gpu/bench_models.sh).
def _tokens(n):
    return f"{n} tokens"


MODEL_CASES: dict[str, list[tuple[str, dict, tuple[str, ...]]]] = {
    "softmax": [(f"{src} vocab {n} x {_tokens(m)}", dict(M=m, N=n), modes) for src, n, m, modes in (
        ("Llama-2-7B", 32000, 16384, FULL), ("Llama-3.1-8B", 128256, 4096, FULL),
        ("Qwen3", 151936, 4096, FWD), ("Gemma-3", 262144, 4096, FWD))],
    "cross_entropy": [(f"{src} vocab {v} x {_tokens(n)}", dict(N=n, V=v), FULL) for src, v, n in (
        ("Llama-3.1-8B", 128256, 16384), ("Qwen3-14B", 151936, 12289), ("Qwen2.5-7B", 152064, 4096),
        ("Gemma-3", 262144, 4096))],
    "linear_cross_entropy": [
        (f"{src} hidden {h} vocab {v} x {_tokens(n)}" + (" frozen W" if fr else ""), dict(N=n, H=h, V=v, frozen=fr), FULL)
        for src, h, v, n, fr in (("Qwen3-0.6B", 1024, 151936, 16384, 0), ("Llama-3.1-8B", 4096, 128256, 4096, 0),
                                 ("Qwen3-14B", 5120, 151936, 12289, 1))],
    "rms_norm": [(f"{src} hidden {n} x {_tokens(m)}", dict(M=m, N=n), FULL) for src, n, m in (
        ("Qwen3-0.6B", 1024, 65536), ("Qwen3-1.7B", 2048, 16384), ("Qwen3-4B", 2560, 12289),
        ("Llama-3.1-8B", 4096, 16384), ("Qwen3-14B", 5120, 12289), ("Llama-3.1-70B", 8192, 4096))]
    + [("Qwen3-8B q_norm head_dim 128 x 4096 tokens x 32 heads", dict(M=4096 * 32, N=128), FULL)],
    "layer_norm": [(f"{src} width {n} x {_tokens(m)}", dict(M=m, N=n), FULL) for src, n, m in (
        ("Qwen3-0.6B", 1024, 65536), ("Qwen3-14B", 5120, 12289))],
    "rope": [(f"{src} {hq}/{hk} heads d{d} T {t} x B{b}", dict(B=b, Hq=hq, Hk=hk, T=t, D=d), FULL) for src, hq, hk, d, t, b in (
        ("Llama-2-7B", 32, 32, 128, 4096, 4), ("Llama-3.2-1B", 32, 8, 64, 8192, 2), ("Qwen3-14B", 40, 8, 128, 2048, 8),
        ("Qwen3-32B", 64, 8, 128, 32768, 1))],
    "swiglu": [(f"{src} intermediate {i} x {_tokens(m)}", dict(M=m, I=i), FULL) for src, i, m in (
        ("Qwen3-0.6B", 3072, 65536), ("Llama-3.1-8B", 14336, 16384), ("Qwen3-14B", 17408, 12289),
        ("Qwen3-32B", 25600, 4096), ("Llama-3.1-70B", 28672, 4096))],
    "swiglu_mlp": [(f"{src} hidden {h} intermediate {i} x {_tokens(n)}", dict(N=n, H=h, I=i), FULL) for src, h, i, n in (
        ("Qwen3-0.6B", 1024, 3072, 16384), ("Qwen3-4B", 2560, 9728, 12289), ("Qwen3-14B", 5120, 17408, 4096))],
    "attention": [(f"{src} {hq}/{hk} heads d{d} T {t} x B{b} causal", _attn(b, hq, hk, t, D=d), modes)
                  for src, hq, hk, d, t, b, modes in (
        ("Llama-2-7B", 32, 32, 128, 2048, 4, FULL), ("Llama-3.2-1B", 32, 8, 64, 8192, 1, FULL),
        ("Qwen3-14B", 40, 8, 128, 4096, 2, BOTH), ("Llama-3.1-8B", 32, 8, 128, 32768, 1, FULL),
        ("Qwen3-32B", 64, 8, 128, 8192, 1, FULL))],
    # a packed fine-tuning row: 16384 / 32768 tokens in sequences of 1:3 spread lengths; 16381 tokens put the sequence
    # starts off multiples of 64 (real packs do), where the fused Gluon backward places each sequence's dQ^T
    # columns apart (attention_varlen.DQ_TMA_ALIGN)
    "attention_varlen": [(f"{src} {hq}/{hk} heads d{d} {t} tokens in {n} seqs causal", _varlen(n, t, hq, hk, D=d), modes)
                         for src, hq, hk, d, t, n, modes in (
        ("Qwen3-14B", 40, 8, 128, 16384, 8, BOTH), ("Llama-3.2-1B", 32, 8, 64, 32768, 32, FULL),
        ("Qwen3-8B", 32, 8, 128, 16384, 64, FULL), ("Qwen3-14B", 40, 8, 128, 16381, 8, FULL))],
    "matmul": [(f"{src} {what} {m}x{k} @ {k}x{n}", dict(M=m, N=n, K=k), FWD) for src, what, m, k, n in (
        ("Qwen3-14B", "up_proj", 12289, 5120, 17408), ("Llama-3.1-8B", "down_proj", 16384, 14336, 4096),
        ("Llama-3.1-70B", "up_proj", 4096, 8192, 28672), ("Qwen3-32B", "down_proj", 4096, 25600, 5120),
        ("Qwen3-4B", "q_proj", 12289, 2560, 4096), ("Qwen3-0.6B", "lm_head", 16384, 1024, 151936))],
}

MODEL_CASES["rope_inplace"] = MODEL_CASES["rope"]

_ELEMS = {
    "softmax": lambda s: (s["M"] * s["N"], s["M"] * s["N"]),
    "cross_entropy": lambda s: (s["N"] * s["V"], s["N"] * s["V"]),
    "linear_cross_entropy": lambda s: (s["N"] * s["H"] + s["V"] * s["H"], s["N"] * s["V"]),
    "rms_norm": lambda s: (s["M"] * s["N"], s["M"] * s["N"]),
    "layer_norm": lambda s: (s["M"] * s["N"], s["M"] * s["N"]),
    "rope": lambda s: (s["B"] * (s["Hq"] + s["Hk"]) * s["T"] * s["D"],) * 2,
    "swiglu": lambda s: (2 * s["M"] * s["I"], s["M"] * s["I"]),
    "swiglu_mlp": lambda s: (s["N"] * s["H"] + 3 * s["H"] * s["I"], 2 * s["N"] * s["I"]),
    # the fp32 reference holds one query head's [T, T] scores (and its softmax) at a time
    "attention": lambda s: (s["B"] * (s["Hq"] + 2 * s["Hk"]) * s["T"] * s["D"], 2 * s["T"] * s["T"]),
    # eager's [T, T] block-diagonal mask (and its additive form); the reference's one head of one sequence
    "attention_varlen": lambda s: ((s["Hq"] + 2 * s["Hk"]) * s["T"] * s["D"], s["T"] * s["T"]),
    "matmul": lambda s: (s["M"] * s["K"] + s["K"] * s["N"], s["M"] * s["N"]),
}
_ELEMS["rope_inplace"] = _ELEMS["rope"]  # the same tensors, rotated in place
for _op, _spec in SPECS.items():
    _spec.models = MODEL_CASES[_op]
    _spec.elems = _ELEMS[_op]

MAX_CASE_GIB = 100.0  # cases estimated above this are recorded as skipped, not run


def estimate_gib(spec: OpSpec, size: dict, itemsize: int) -> float:
    """A generous estimate of a case's peak device memory in GiB: the inputs in the case's dtype
    three times (the harness's copy, a provider's copy, its gradients), fp32 copies of the inputs
    and gradients for the reference, and the largest intermediate three times in fp32 (the
    reference's and an unfused peer's)."""
    n_in, n_big = spec.elems(size)
    return (n_in * (3 * itemsize + 2 * 4) + n_big * 3 * 4) / 2**30


def _shrink(op: str, s: dict) -> dict:
    """A model case scaled down for the CPU interpreter (--check --sizes models): every
    dimension divided by 256 and clamped to [16, 64] (odd values stay odd: 12289 -> 49),
    attention and rope to a few heads of T=16, D=16 with the same GQA group (at most 4)."""
    t = dict(s)
    for k in ("M", "N", "K", "V", "H", "I"):
        if k in t:
            t[k] = max(16, min(64, t[k] // 256 + t[k] % 2))
    if "T" in t:
        g = min(4, t["Hq"] // t["Hk"])
        t.update(B=1, Hk=2, Hq=2 * g, T=16, D=16)
        if "S" in t:  # attention_varlen: a few sequences in the 16 tokens
            t.update(S=min(3, t["S"]), T=21)
            t.pop("B")
    return t


def _explicit_values(spec: OpSpec, sizes: str) -> list[int]:
    """The integers of a comma list of the op's knob; ValueError naming the presets when `sizes` is not one."""
    try:
        values = [int(v) for v in sizes.split(",") if v.strip()]
    except ValueError:
        named = ", ".join(["headline", "models", *spec.sizes])
        raise ValueError(f"sizes must be one of {spec.name}'s presets ({named}) or a comma list of integers, "
                         f"got {sizes!r}") from None
    if not values:
        raise ValueError(f"sizes must name at least one size, got {sizes!r}")
    if min(values) < 1:  # a case of N = 0 or -4 would only fail (rows of errors read as hearth's), or not plan at all
        raise ValueError(f"sizes must be positive integers ({spec.name}'s {spec.knob}), got {sizes!r}")
    return values


def cases_for(spec: OpSpec, sizes: str, modes: list[str] | None, check: bool) -> list[tuple[dict, str]]:
    """(size, mode) pairs for `spec` under a size preset.

    sizes: "headline" (the published target shapes with their modes), "models" (MODEL_CASES: shapes of
    real model configs, each size carrying its "name"), "sweep", "small", an op's own preset (attention:
    "goal", the flash-attention goal's grid), or a comma list of
    integers for the op's knob (spec.explicit builds the size). check=True uses the tiny
    CPU-interpreter sizes (for "models": the first two model cases scaled down). modes filters (default: the preset's modes;
    fwd+full for sweeps, since bwd alone is full minus fwd to within noise). A `sizes` that is none of these is a
    ValueError, under check too (where the check sizes run in place of all but "models")."""
    values = None if sizes in ("headline", "models") or sizes in spec.sizes else _explicit_values(spec, sizes)
    if check and sizes == "models":
        # the first two model cases, scaled down, keeping their names (the suite's naming,
        # per-op geomean and reports are exercised in CI)
        pairs = [({**_shrink(spec.name, s), "name": f"{name} (check-scaled)"}, m)
                 for name, s, ms in spec.models[:2] for m in ms]
    elif check:
        pairs = [(s, m) for s in spec.check_sizes for m in spec.modes]
    elif sizes == "models":
        pairs = [({**s, "name": name}, m) for name, s, ms in spec.models for m in ms]
    elif sizes == "headline":
        pairs = [(s, m) for s, ms in spec.headline for m in ms]
    elif sizes in spec.sizes:  # sweep, small, and an op's own presets (attention: goal)
        pairs = [(s, m) for s in spec.sizes[sizes] for m in ("fwd", "full")]
    else:
        pairs = [(spec.explicit(v), m) for v in values for m in ("fwd", "full")]
    if modes:
        bad = [m for m in modes if m not in MODES]
        if bad:
            raise ValueError(f"modes must be among {MODES}, got {bad}")
        distinct = list({spec.case_label(s): s for s, _ in pairs}.values())
        pairs = [(s, m) for s in distinct for m in dict.fromkeys(modes)]  # a mode named twice runs once
    return [(s, m) for s, m in pairs if m in spec.modes]
