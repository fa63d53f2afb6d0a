"""GPU probe: a persistent, double-buffered form of the cluster row kernels (softmax forward, cross-entropy loss and
in-place gradient) against the routed shared-memory forms (hearth.kernels.softmax_gluon / cross_entropy_gluon).

Why: softmax and cross_entropy meet every goal of the model-shape suite but one, >= 90% of the device copy
bandwidth at the large cases (the H200 rows: softmax forward 84%, cross-entropy 72-76%). The routed forms take one
row per cluster and exit: a CTA copies its part of the row in, reduces it, waits for the cluster's exchange, then
writes its part out, and nothing of the next row is in flight meanwhile except in the other CTAs an SM holds.

The form here (one kernel, CE selects the op): a cluster stays resident and walks rows handed out by a global
ticket counter (an atomic add by the cluster's rank-0 thread, its result handed round in the exchange itself), and
each CTA keeps two buffers of its part: the next row's copies (cp.async, one group a chunk) are issued before this
row's statistics, so they are in flight during this row's reduction, exchange and output. The ticket for the row
after next is fetched a row early, so its latency is hidden too. Exchange slots come in two sets used by row
parity (a CTA may write set k only once every CTA has read it two rows back: the one cluster barrier a row
guarantees that). Buffer chunk 0 (the first 4 KiB of the CTA's only allocation, at global_smem + 0) holds the
slots and is never touched by compiled code, as in the routed forms. Over-launching clusters is harmless (a late
cluster finds the counter past the rows and exits), so the grid is the number of SMs times the CTAs an SM holds by
shared memory, over the cluster size.

    python scripts/gpu/rows_persist_probe.py --out DIR/rows_persist.jsonl     # Hopper GPU, about two minutes
    python scripts/gpu/rows_persist_probe.py --offline                       # sm_90 builds on the CPU, no GPU

Each (shape, provider): correctness over every row (softmax against torch in fp32 of the same values, with torch's
own bf16 error beside it: over 2x is wrong and not timed; cross-entropy's loss and gradient likewise against fp64 /
fp32 references, every row, so a row the tickets skipped cannot pass), then time_call (CUDA events, L2 flushed);
GB/s = one read and one write of the rows (the backward: two reads and one write). One JSON line per row; a table at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from hearth.kernels import softmax_gluon as sg

LOG2E = ttgl.constexpr(1.4426950408889634)
SLOT_SET = 16 * sg.MAX_CTAS  # bytes of one parity set of slots: (m, s, ticket, pad) a CTA, 16 bytes each
SMEM_PER_SM = 232448  # sm_90's shared memory a block may use, summed over an SM's blocks (227 KiB) + 1 KiB each

WAIT = "barrier.cluster.wait.aligned;\nmov.u32 $0, 0;"


def ticket_ptx(step: int) -> str:
    """Rank 0's thread 0 takes `step` rows from the counter ($1, a global u32): $0 = the first (0 elsewhere)."""
    return "\n".join(["{", ".reg .pred p;", ".reg .u32 t, r;", "mov.u32 t, %tid.x;", "mov.u32 r, %cluster_ctarank;",
                      "or.b32 t, t, r;", "setp.eq.u32 p, t, 0;", "mov.u32 $0, 0;",
                      f"@p atom.global.add.u32 $0, [$1], {step};", "}"])


def exchange_ptx(ctas: int) -> str:
    """The (max, sum) exchange with a ticket: inputs $2 = m_i, $3 = s_i, $4 = the slot set's byte offset, $5 = the
    ticket (rank 0's counts), $6 = a value that must be loaded before the exchange (unused: the dependence alone
    orders its load before the barrier's release); outputs $0 = m, $1 = s. Each CTA's thread 0 stores
    (m_i, s_i, ticket) into slot `rank` of the set in every CTA, then one cluster barrier (release / acquire), then
    every thread combines the set's pairs."""
    log2e = "0f3FB8AA3B"
    lines = ["{", ".reg .u32 la, sa, ra, off;", ".reg .b32 w0, w1, w2;", ".reg .pred p;",
             ".reg .f32 mi, si, mx, acc, nm, d;",
             "mov.u32 off, %tid.x;", "setp.eq.u32 p, off, 0;",
             "mov.u32 la, global_smem;", "add.u32 la, la, $4;",
             "mov.u32 off, %cluster_ctarank;", "shl.b32 off, off, 4;", "add.u32 sa, la, off;",
             "mov.b32 w0, $2;", "mov.b32 w1, $3;", "mov.b32 w2, $5;"]
    for peer in range(ctas):
        lines += [f"mapa.shared::cluster.u32 ra, sa, {peer};", "@p st.shared::cluster.v4.b32 [ra], {w0, w1, w2, w2};"]
    lines += ["barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;",
              "ld.shared.v2.f32 {mx, acc}, [la];"]
    for i in range(1, ctas):
        lines += [f"ld.shared.v2.f32 {{mi, si}}, [la+{16 * i}];", "max.f32 nm, mx, mi;",
                  "sub.f32 d, mx, nm;", f"mul.f32 d, d, {log2e};", "ex2.approx.ftz.f32 d, d;", "mul.f32 acc, acc, d;",
                  "sub.f32 d, mi, nm;", f"mul.f32 d, d, {log2e};", "ex2.approx.ftz.f32 d, d;",
                  "fma.rn.f32 acc, si, d, acc;", "mov.f32 mx, nm;"]
    lines += ["mov.f32 $0, mx;", "mov.f32 $1, acc;", "}"]
    return "\n".join(lines)


# rank 0's ticket from the slot set at byte offset $1 (read after the exchange's barrier: volatile asm keeps order)
ROW = "{\n.reg .u32 la;\nmov.u32 la, global_smem;\nadd.u32 la, la, $1;\nld.shared.u32 $0, [la+8];\n}"


@gluon.jit
def _exchange_row(m_i, s_i, slot_off, tk, dep, EXCHANGE_ASM: ttgl.constexpr, ROW_ASM: ttgl.constexpr):
    """The exchange on the slot set at byte offset slot_off (a scalar), carrying this CTA's ticket tk (a scalar:
    rank 0's counts) and a [CTAS] value `dep` whose load must precede the barrier; returns the row's (m, s) and rank
    0's ticket, read from the set after the barrier."""
    izero_v = ttgl.zeros_like(m_i).to(ttgl.int32)
    m, s = ttgl.inline_asm_elementwise(EXCHANGE_ASM, "=f,=f,f,f,r,r,f",
                                       [m_i, s_i, izero_v + slot_off, izero_v + tk, dep],
                                       dtype=(ttgl.float32, ttgl.float32), is_pure=False, pack=1)
    row = ttgl.inline_asm_elementwise(ROW_ASM, "=r,r", [slot_off], dtype=ttgl.int32, is_pure=False, pack=1)
    return m, s, row


@gluon.jit
def _first_row(Counter, zero_v, TICKET2_ASM: ttgl.constexpr, WAIT_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr,
               ROW_ASM: ttgl.constexpr, SLOTS: ttgl.constexpr):
    """The cluster's first row (the second is the next one): one ticket of two, taken by rank 0 once every CTA of
    the cluster has started (the wait pairing with START), handed round by an exchange on slot set 1."""
    tk = ttgl.inline_asm_elementwise(TICKET2_ASM, "=r,l", [Counter], dtype=ttgl.int32, is_pure=False, pack=1)
    ttgl.inline_asm_elementwise(WAIT_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    _, _, cur = _exchange_row(zero_v, zero_v, tk * 0 + SLOTS, tk, zero_v, EXCHANGE_ASM, ROW_ASM)
    return cur


@gluon.jit
def _issue_row(buf, base, xrow, offs, c0, left, ok, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr):
    """cp.async of this CTA's part of a row into buffer chunks base.., one commit group a chunk (masked off
    entirely when not ok: the group is still committed, so the wait counts stay fixed)."""
    for c in ttgl.static_range(CHUNKS):
        async_copy.async_copy_global_to_shared(buf.index(base + c), xrow + offs + c * CHUNK,
                                               mask=(c0 < (left - c * CHUNK)[:, None]) & ok)
        async_copy.commit_group()


@gluon.jit
def _rows_persist_kernel(
    X, Y, Target, Loss, Counter, stride_x, stride_y, n_rows, n_cols, ignore_index, grad_scale,
    CE: ttgl.constexpr, CTAS: ttgl.constexpr, P: ttgl.constexpr, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr,
    layout: ttgl.constexpr, buf_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, WAIT_ASM: ttgl.constexpr,
    TICKET1_ASM: ttgl.constexpr, TICKET2_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr, ROW_ASM: ttgl.constexpr,
    SLOTS: ttgl.constexpr,
):
    """A resident cluster walking ticketed rows; CTA i holds columns [i * P, i * P + P) of a row in CHUNKS chunks
    of shared memory, in one of two buffers (chunks 1.. and 1 + CHUNKS..) by row parity. CE: cross-entropy (loss
    into Loss, grad_scale * (softmax - onehot) over X in place, Y unused); else softmax into Y."""
    buf = ttgl.allocate_shared_memory(X.dtype.element_ty, [1 + 2 * CHUNKS, CTAS, CHUNK], buf_shared)
    ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    vec_layout: ttgl.constexpr = ttgl.SliceLayout(1, layout)
    part = ttgl.arange(0, CTAS, layout=vec_layout)
    c0 = ttgl.arange(0, CHUNK, layout=ttgl.SliceLayout(0, layout))[None, :]
    left = n_cols - part * P  # [CTAS]: the row's columns from this CTA's first one
    offs = part[:, None] * P + c0
    zero_v = ttgl.zeros([CTAS], ttgl.float32, vec_layout)
    cur = _first_row(Counter, zero_v, TICKET2_ASM, WAIT_ASM, EXCHANGE_ASM, ROW_ASM, SLOTS)
    nxt = cur + 1
    _issue_row(buf, 1, X + cur.to(ttgl.int64) * stride_x, offs, c0, left, cur < n_rows, CHUNK, CHUNKS)
    it = cur * 0
    while cur < n_rows:
        par = it % 2
        base_c = 1 + par * CHUNKS
        ttgl.thread_barrier()  # every thread is done with the other buffer (the row before's) before it refills
        _issue_row(buf, 1 + (1 - par) * CHUNKS, X + nxt.to(ttgl.int64) * stride_x, offs, c0, left, nxt < n_rows,
                   CHUNK, CHUNKS)
        tk = ttgl.inline_asm_elementwise(TICKET1_ASM, "=r,l", [Counter], dtype=ttgl.int32, is_pure=False, pack=1)
        xrow = X + cur.to(ttgl.int64) * stride_x
        if CE:
            t = ttgl.load(Target + cur)
            valid = t != ignore_index
            in_range = (t >= 0) & (t < n_cols)
            x_t = ttgl.load(xrow + ttgl.where(in_range, t, 0), mask=in_range, other=float("nan")).to(ttgl.float32)
        else:
            x_t = 0.0
        mx = ttgl.full([CTAS, CHUNK], float("-inf"), ttgl.float32, layout)
        for c in ttgl.static_range(CHUNKS):
            async_copy.wait_group(2 * CHUNKS - 1 - c)  # this row's chunk c has landed (the next row's may not)
            x = buf.index(base_c + c).load(layout).to(ttgl.float32)
            mx = ttgl.maximum(mx, ttgl.where(c0 < (left - c * CHUNK)[:, None], x, float("-inf")))
        m_part = ttgl.maximum(ttgl.max(mx, 1), sg.LOWEST)
        se = ttgl.zeros([CTAS, CHUNK], ttgl.float32, layout)
        for c in ttgl.static_range(CHUNKS):
            x = buf.index(base_c + c).load(layout).to(ttgl.float32)
            e = ttgl.exp2((x - m_part[:, None]) * LOG2E)
            se += ttgl.where(c0 < (left - c * CHUNK)[:, None], e, 0.0)
        s_part = ttgl.sum(se, 1)
        m, s, nn = _exchange_row(m_part, s_part, par * SLOTS, tk, zero_v + x_t, EXCHANGE_ASM, ROW_ASM)
        if CE:
            lse = m + ttgl.log(s)
            ttgl.store(Loss + cur + part * 0, ttgl.where(valid, lse - x_t, 0.0), mask=part == 0)
            scale = ttgl.where(valid, grad_scale, 0.0)
            t_off = ttgl.where(in_range, t, -1).to(ttgl.int32) - part * P
            for c in ttgl.static_range(CHUNKS):
                x = buf.index(base_c + c).load(layout).to(ttgl.float32)
                g = ttgl.exp2((x - lse[:, None]) * LOG2E) * scale
                g = ttgl.where(c0 == (t_off - c * CHUNK)[:, None], g - scale, g)
                g = ttgl.where(valid, g, 0.0)  # an ignored row: zeros, whatever its logits
                ttgl.store(xrow + offs + c * CHUNK, g.to(X.dtype.element_ty), mask=c0 < (left - c * CHUNK)[:, None])
        else:
            inv = 1.0 / s
            yrow = Y + cur.to(ttgl.int64) * stride_y
            for c in ttgl.static_range(CHUNKS):
                x = buf.index(base_c + c).load(layout).to(ttgl.float32)
                y = ttgl.exp2((x - m[:, None]) * LOG2E) * inv[:, None]
                ttgl.store(yrow + offs + c * CHUNK, y.to(Y.dtype.element_ty), mask=c0 < (left - c * CHUNK)[:, None])
        cur = nxt
        nxt = nn
        it += 1
    async_copy.wait_group(0)  # the masked-off copies of a row past the end, before the CTA's memory goes
    buf._keep_alive()  # live to the end: nothing else may take the slot bytes at global_smem + 0


@gluon.jit
def _softmax_bwd_persist_kernel(
    Yp, DY, DX, Counter, stride_y, stride_dy, stride_dx, n_rows, n_cols,
    CTAS: ttgl.constexpr, P: ttgl.constexpr, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr,
    layout: ttgl.constexpr, buf_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, WAIT_ASM: ttgl.constexpr,
    TICKET1_ASM: ttgl.constexpr, TICKET2_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr, ROW_ASM: ttgl.constexpr,
    SLOTS: ttgl.constexpr,
):
    """dx = y * (dy - sum(y * dy)) by resident clusters over ticketed rows: y's part in buffer chunks
    1 + par * 2 * CHUNKS.., dy's in the CHUNKS after it (par: the row's parity); the partial sums are exchanged as
    (0, sum) pairs, which the exchange combines into the plain sum."""
    buf = ttgl.allocate_shared_memory(Yp.dtype.element_ty, [1 + 4 * CHUNKS, CTAS, CHUNK], buf_shared)
    ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    vec_layout: ttgl.constexpr = ttgl.SliceLayout(1, layout)
    part = ttgl.arange(0, CTAS, layout=vec_layout)
    c0 = ttgl.arange(0, CHUNK, layout=ttgl.SliceLayout(0, layout))[None, :]
    left = n_cols - part * P
    offs = part[:, None] * P + c0
    zero_v = ttgl.zeros([CTAS], ttgl.float32, vec_layout)
    cur = _first_row(Counter, zero_v, TICKET2_ASM, WAIT_ASM, EXCHANGE_ASM, ROW_ASM, SLOTS)
    nxt = cur + 1
    _issue_row2(buf, 1, Yp + cur.to(ttgl.int64) * stride_y, DY + cur.to(ttgl.int64) * stride_dy, offs, c0, left,
                cur < n_rows, CHUNK, CHUNKS)
    it = cur * 0
    while cur < n_rows:
        par = it % 2
        base_c = 1 + par * 2 * CHUNKS
        ttgl.thread_barrier()
        _issue_row2(buf, 1 + (1 - par) * 2 * CHUNKS, Yp + nxt.to(ttgl.int64) * stride_y,
                    DY + nxt.to(ttgl.int64) * stride_dy, offs, c0, left, nxt < n_rows, CHUNK, CHUNKS)
        tk = ttgl.inline_asm_elementwise(TICKET1_ASM, "=r,l", [Counter], dtype=ttgl.int32, is_pure=False, pack=1)
        acc = ttgl.zeros([CTAS, CHUNK], ttgl.float32, layout)
        for c in ttgl.static_range(CHUNKS):
            async_copy.wait_group(2 * CHUNKS - 1 - c)
            y = buf.index(base_c + c).load(layout).to(ttgl.float32)
            d = buf.index(base_c + CHUNKS + c).load(layout).to(ttgl.float32)
            acc += ttgl.where(c0 < (left - c * CHUNK)[:, None], y * d, 0.0)
        _, s, nn = _exchange_row(zero_v, ttgl.sum(acc, 1), par * SLOTS, tk, zero_v, EXCHANGE_ASM, ROW_ASM)
        out = DX + cur.to(ttgl.int64) * stride_dx
        for c in ttgl.static_range(CHUNKS):
            y = buf.index(base_c + c).load(layout).to(ttgl.float32)
            d = buf.index(base_c + CHUNKS + c).load(layout).to(ttgl.float32)
            ttgl.store(out + offs + c * CHUNK, (y * (d - s[:, None])).to(DX.dtype.element_ty),
                       mask=c0 < (left - c * CHUNK)[:, None])
        cur = nxt
        nxt = nn
        it += 1
    async_copy.wait_group(0)
    buf._keep_alive()


@gluon.jit
def _issue_row2(buf, base, yrow, drow, offs, c0, left, ok, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr):
    """cp.async of this CTA's part of a row of y (chunks base..) and dy (base + CHUNKS..), one group a chunk of
    both."""
    for c in ttgl.static_range(CHUNKS):
        mask = (c0 < (left - c * CHUNK)[:, None]) & ok
        async_copy.async_copy_global_to_shared(buf.index(base + c), yrow + offs + c * CHUNK, mask=mask)
        async_copy.async_copy_global_to_shared(buf.index(base + CHUNKS + c), drow + offs + c * CHUNK, mask=mask)
        async_copy.commit_group()


def launch_bwd(y: torch.Tensor, dy: torch.Tensor, *, ctas: int | None = None, warps: int = sg.SMEM_WARPS,
               oversub: float = 1.0) -> torch.Tensor:
    n, v = y.shape
    ctas, chunk, chunks = sg.smem_config(v, y.element_size(), ctas, inputs=2)
    counter = torch.zeros(1, dtype=torch.int32, device=y.device)
    dx = torch.empty_like(y)
    per_cta = (1 + 4 * chunks) * sg.CHUNK_BYTES + 1024
    n_sm = torch.cuda.get_device_properties(y.device).multi_processor_count
    g = max(1, min(n, math.ceil(n_sm * max(1, min(32, SMEM_PER_SM // per_cta)) * oversub / ctas)))
    _softmax_bwd_persist_kernel[(g,)](y, dy, dx, counter, y.stride(0), dy.stride(0), dx.stride(0), n, v,
                                      **constexprs(ctas, chunk, chunks, y.element_size(), warps, None),
                                      num_warps=warps, num_ctas=ctas)
    return dx


def constexprs(ctas: int, chunk: int, chunks: int, elem_bytes: int, warps: int, ce: bool) -> dict:
    """The kernel's constexprs: softmax_gluon's layouts for the part, this form's inline PTX."""
    base = dict(sg.smem_constexprs(ctas, chunk, chunks, elem_bytes, warps))
    if ce is not None:
        base["CE"] = ce
    base.update(WAIT_ASM=WAIT, TICKET1_ASM=ticket_ptx(1), TICKET2_ASM=ticket_ptx(2),
                EXCHANGE_ASM=exchange_ptx(ctas), ROW_ASM=ROW, SLOTS=SLOT_SET)
    return base


def grid(n_rows: int, ctas: int, chunks: int, n_sm: int, oversub: float = 1.0) -> int:
    """Clusters to launch: the CTAs an SM holds by shared memory (two parts of CHUNKS chunks and the slot chunk,
    plus the 1 KiB the driver reserves a block), times the SMs, over the cluster size (rounded up: an extra
    cluster finds no rows and exits), never more than the rows."""
    per_cta = (1 + 2 * chunks) * sg.CHUNK_BYTES + 1024
    per_sm = max(1, min(32, SMEM_PER_SM // per_cta))
    return max(1, min(n_rows, math.ceil(n_sm * per_sm * oversub / ctas)))


def launch(x: torch.Tensor, *, ce: bool, target=None, y=None, grad_scale: float = 1.0, ignore_index: int = -100,
           ctas: int | None = None, warps: int = sg.SMEM_WARPS, oversub: float = 1.0):
    """softmax(x) into y (new when None), or cross-entropy of x against target (loss returned, gradient over x)."""
    n, v = x.shape
    ctas, chunk, chunks = sg.smem_config(v, x.element_size(), ctas)
    counter = torch.zeros(1, dtype=torch.int32, device=x.device)
    if ce:
        loss = torch.empty(n, dtype=torch.float32, device=x.device)
        out, tgt = x, target
    else:
        out = torch.empty_like(x) if y is None else y
        loss, tgt = counter, counter  # placeholders, never read
    g = grid(n, ctas, chunks, torch.cuda.get_device_properties(x.device).multi_processor_count, oversub)
    _rows_persist_kernel[(g,)](x, out, tgt, loss, counter, x.stride(0), out.stride(0), n, v, ignore_index,
                               float(grad_scale), **constexprs(ctas, chunk, chunks, x.element_size(), warps, ce),
                               num_warps=warps, num_ctas=ctas)
    return loss if ce else out


# ----------------------------------------------------------------------------------------------------------------
def offline(cases) -> list[dict]:
    """Build for sm_90 without a GPU: registers, spills, shared bytes and the PTX facts the form relies on."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from hearth import inspect as hi

    found = []
    for op, n, dt, ctas in cases:
        eb = {"bf16": 2, "fp32": 4}[dt]
        ctas, chunk, chunks = sg.smem_config(n, eb, ctas, inputs=2 if op == "bwd" else 1)
        if op == "bwd":
            const = constexprs(ctas, chunk, chunks, eb, sg.SMEM_WARPS, None)
            fn = _softmax_bwd_persist_kernel
            args = {"Yp": f"*{dt}", "DY": f"*{dt}", "DX": f"*{dt}", "Counter": "*i32", "stride_y": "i32",
                    "stride_dy": "i32", "stride_dx": "i32", "n_rows": "i32", "n_cols": "i32"}
        else:
            const = constexprs(ctas, chunk, chunks, eb, sg.SMEM_WARPS, op == "ce")
            fn = _rows_persist_kernel
            args = {"X": f"*{dt}", "Y": f"*{dt}", "Target": "*i64", "Loss": "*fp32", "Counter": "*i32",
                    "stride_x": "i32", "stride_y": "i32", "n_rows": "i32", "n_cols": "i32", "ignore_index": "i32",
                    "grad_scale": "fp32"}
        sig = {**args, **{k: "constexpr" for k in const}}
        aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
                   if name in ("X", "Y", "Yp", "DY", "DX", "stride_x", "stride_y", "stride_dy", "stride_dx", "n_cols")}
        k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=const, attrs=aligned),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": sg.SMEM_WARPS, "num_ctas": ctas})
        ptx, llir = k.asm["ptx"], k.asm["llir"]
        offsets = [int(o) for o in re.findall(r"@global_smem, i32 (\d+)\)", llir)]
        rep = hi.report_compiled("persist", k, sass=False)
        found.append(dict(op=op, n=n, dtype=dt, ctas=ctas, chunks=chunks, shared=k.metadata.shared,
                          regs=rep.registers, spills=rep.spill_bytes, min_offset=min(offsets) if offsets else None,
                          cp_async=ptx.count("cp.async.cg.shared.global"), barriers=ptx.count("barrier.cluster"),
                          atom=ptx.count("atom.global.add.u32"), bar_sync=len(re.findall(r"bar\.sync", ptx))))
    return found


def _copy_gbps(device) -> float:
    from hearth.bench.timing import time_call
    a = torch.empty(2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t = time_call(lambda: b.copy_(a), [], device)
    return 2 * a.numel() / (t.median_ms * 1e-3) / 1e9


def _ce_grad_ref(xs, ts, scale):
    """d(scale * sum of per-row cross-entropy) / d logits in fp32 for a block of rows (ignored rows: zeros)."""
    g = torch.softmax(xs.float(), -1)
    ok = ts != -100
    rows = torch.arange(xs.shape[0], device=xs.device)[ok]
    g[rows, ts[ok]] -= 1.0
    g *= scale
    g[~ok] = 0
    return g


def ce_reference(x, t, scale, block=1024):
    """The fp64 loss of every row, and torch's own bf16 errors (loss, gradient) against the references, in blocks of
    rows (a whole fp64 copy of the widest case would not fit beside the rest)."""
    losses, base_l, base_g = [], 0.0, 0.0
    for i in range(0, x.shape[0], block):
        xs, ts = x[i:i + block], t[i:i + block]
        ok = ts != -100
        xd = xs.double()
        ref = torch.where(ok, torch.logsumexp(xd, -1) - xd.gather(1, ts.clamp(min=0)[:, None])[:, 0], 0.0)
        del xd
        losses.append(ref)
        tl = torch.nn.functional.cross_entropy(xs, ts, reduction="none")
        base_l = max(base_l, (tl.double() - ref).abs().max().item())
        xg = xs.clone().requires_grad_()
        torch.nn.functional.cross_entropy(xg, ts, reduction="sum").mul(scale).backward()
        base_g = max(base_g, (xg.grad.float() - _ce_grad_ref(xs, ts, scale)).abs().max().item())
    return torch.cat(losses), base_l, base_g


def grad_error(x, t, scale, got, block=1024):
    """The largest |gradient - fp32 reference| over every row."""
    err = 0.0
    for i in range(0, x.shape[0], block):
        err = max(err, (got[i:i + block].float() - _ce_grad_ref(x[i:i + block], t[i:i + block], scale)).abs().max().item())
    return err


SM_SHAPES = [(4096, 262144), (4096, 151936), (8192, 131072), (4096, 128256), (16384, 32000)]
BWD_SHAPES = [(4096, 128256), (16384, 32000), (4096, 262144)]
CE_SHAPES = [(4096, 152064), (4096, 262144), (12289, 151936), (16384, 128256)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--offline", action="store_true", help="build for sm_90 on the CPU and print what the builds show")
    p.add_argument("--ctas", default="", help="extra cluster sizes to time beside smem_config's pick, e.g. 4,8,16")
    p.add_argument("--oversub", default="1", help="grid multipliers to time, e.g. 1,2")
    p.add_argument("--sm-shapes", default=None)
    p.add_argument("--ce-shapes", default=None)
    p.add_argument("--bwd-shapes", default=None)
    args = p.parse_args(argv)
    if args.offline:
        cases = [("softmax", 262144, "bf16", None), ("softmax", 151936, "bf16", None), ("softmax", 32000, "bf16", None),
                 ("ce", 152064, "bf16", None), ("ce", 262144, "bf16", None), ("ce", 128256, "bf16", 16),
                 ("softmax", 65536, "fp32", None), ("bwd", 128256, "bf16", None), ("bwd", 262144, "bf16", None)]
        for r in offline(cases):
            print(json.dumps(r))
        return 0
    from rich.console import Console
    from rich.table import Table

    from hearth.bench.runner import env_info
    from hearth.bench.timing import time_call
    from hearth.kernels import cross_entropy_gluon as cg

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("rows_persist_probe needs a Hopper GPU (compute capability 9.x)")
    parse = lambda s, d: [tuple(int(v) for v in t.split("x")) for t in s.split(";")] if s else d  # noqa: E731
    device = torch.device("cuda")
    meta = {**env_info(device), "command": " ".join(["python", "scripts/gpu/rows_persist_probe.py",
                                                     *(sys.argv[1:] if argv is None else argv)])}
    copy = _copy_gbps(device)
    extra = [int(c) for c in args.ctas.split(",") if c]
    oversubs = [float(o) for o in args.oversub.split(",") if o]
    table = Table(title=f"persistent cluster rows, bf16 (device copy {copy:.0f} GB/s)")
    for col in ("op", "shape", "provider", "ms", "GB/s", "% copy", "err / torch"):
        table.add_column(col)
    t0 = time.time()
    f = open(args.out, "a") if args.out else None

    def emit(row):
        if f:
            f.write(json.dumps(row) + "\n")
            f.flush()
        nan = float("nan")
        table.add_row(row["op"], f"{row['rows']}x{row['cols']}", row["provider"], f"{row.get('ms', nan):.3f}",
                      f"{row.get('gbps', 0):.0f}", f"{100 * row.get('gbps', 0) / copy:.1f}",
                      row.get("err_text", "") + ("" if row.get("ok") else " WRONG " + row.get("error", "")[:60]))

    for m, n in parse(args.sm_shapes, SM_SHAPES):
        x = (torch.randn(m, n, device=device) * 3).to(torch.bfloat16)
        ref = torch.softmax(x.float(), -1)
        base_err = (torch.softmax(x, -1).float() - ref).abs().max().item()
        pick = sg.smem_config(n, 2)[0]
        provs = [("smem", lambda t: sg.softmax_fwd_smem(t))]
        for c in [pick] + [c for c in extra if c != pick]:
            for o in oversubs:
                provs.append((f"persist-c{c}-o{o:g}", lambda t, c=c, o=o: launch(t, ce=False, ctas=c, oversub=o)))
        for name, fn in provs:
            row = {"op": "softmax", "rows": m, "cols": n, "provider": name, **meta}
            try:
                y = fn(x)
                err = (y.float() - ref).abs().max().item()
                row.update(max_err=err, torch_err=base_err, ok=err <= 2 * base_err + 1e-6,
                           err_text=f"{err:.1e} / {base_err:.1e}")
                del y
                if row["ok"]:
                    tm = time_call(lambda fn=fn, x=x: fn(x), [], device)
                    row.update(ms=tm.median_ms, p20_ms=tm.p20_ms, p80_ms=tm.p80_ms,
                               gbps=2 * x.numel() * 2 / (tm.median_ms * 1e-3) / 1e9, copy_gbps=copy)
            except Exception as e:  # noqa: BLE001 -- a failing provider is a row
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            emit(row)
        del x, ref
    for m, n in parse(args.bwd_shapes, BWD_SHAPES):
        x = (torch.randn(m, n, device=device) * 3).to(torch.bfloat16)
        y = torch.softmax(x, -1)
        dy = torch.randn_like(y)
        yf, df = y.float(), dy.float()
        ref = yf * (df - (yf * df).sum(-1, keepdim=True))
        base_err = (torch._softmax_backward_data(dy, y, -1, y.dtype).float() - ref).abs().max().item()
        pick = sg.smem_config(n, 2, inputs=2)[0]
        provs = [("smem", lambda a, b: sg.softmax_bwd_smem(a, b))]
        for c in [pick] + [c for c in extra if c != pick]:
            for o in oversubs:
                provs.append((f"persist-c{c}-o{o:g}", lambda a, b, c=c, o=o: launch_bwd(a, b, ctas=c, oversub=o)))
        for name, fn in provs:
            row = {"op": "softmax_bwd", "rows": m, "cols": n, "provider": name, **meta}
            try:
                got = fn(y, dy)
                err = (got.float() - ref).abs().max().item()
                row.update(max_err=err, torch_err=base_err, ok=err <= 2 * base_err + 1e-6,
                           err_text=f"{err:.1e} / {base_err:.1e}")
                del got
                if row["ok"]:
                    tm = time_call(lambda fn=fn, y=y, dy=dy: fn(y, dy), [], device)
                    row.update(ms=tm.median_ms, p20_ms=tm.p20_ms, p80_ms=tm.p80_ms,
                               gbps=3 * y.numel() * 2 / (tm.median_ms * 1e-3) / 1e9, copy_gbps=copy)
            except Exception as e:  # noqa: BLE001 -- a failing provider is a row
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            emit(row)
        del x, y, dy, yf, df, ref
    for m, v in parse(args.ce_shapes, CE_SHAPES):
        x = (torch.randn(m, v, device=device) * 3).to(torch.bfloat16)
        t = torch.randint(0, v, (m,), device=device)
        t[::97] = -100  # some ignored rows
        valid = t != -100
        scale = 1.0 / max(1, int(valid.sum()))
        ref_loss, base_l, base_g = ce_reference(x, t, scale)
        pick = sg.smem_config(v, 2)[0]
        provs = [("smem", lambda w: cg.ce_rows_smem_(w, t, grad_scale=scale))]
        for c in [pick] + [c for c in extra if c != pick]:
            for o in oversubs:
                provs.append((f"persist-c{c}-o{o:g}",
                              lambda w, c=c, o=o: launch(w, ce=True, target=t, grad_scale=scale, ctas=c, oversub=o)))
        work = torch.empty_like(x)
        for name, fn in provs:
            row = {"op": "cross_entropy", "rows": m, "cols": v, "provider": name, **meta}
            try:
                work.copy_(x)
                loss = fn(work)
                l_err = (loss.double() - ref_loss).abs().max().item()
                g_err = grad_error(x, t, scale, work)  # noqa: F821 -- bound in this iteration
                row.update(loss_err=l_err, grad_err=g_err, torch_loss_err=base_l, torch_grad_err=base_g,
                           ok=l_err <= 2 * base_l + 1e-6 and g_err <= 2 * base_g + 1e-9,
                           err_text=f"{l_err:.1e}/{base_l:.1e} {g_err:.1e}/{base_g:.1e}")
                if row["ok"]:
                    def setup(work=work, x=x):
                        work.copy_(x)
                        return work
                    tm = time_call(lambda w, fn=fn: fn(w), [], device, setup=setup)
                    row.update(ms=tm.median_ms, p20_ms=tm.p20_ms, p80_ms=tm.p80_ms,
                               gbps=2 * x.numel() * 2 / (tm.median_ms * 1e-3) / 1e9, copy_gbps=copy)
            except Exception as e:  # noqa: BLE001
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            emit(row)
        del x, work
    Console(width=170).print(table)
    print(f"{time.time() - t0:.0f} s")
    if f:
        f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
