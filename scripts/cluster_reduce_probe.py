"""Can a Triton 3.6 kernel keep one wide row on chip across the CTAs of a thread-block cluster?

Wide softmax (4096 x 262144) and cross-entropy read each row twice: a 512 KiB bf16 row does not fit one SM's
registers and shared memory, and splitting it across programs through a global-memory barrier measured slower
(BENCHMARKS.md). The way to one HBM read per row on Hopper is a cluster: the row split over 2-8 CTAs on
different SMs, their partial (max, sum-exp) exchanged through distributed shared memory. This script builds,
offline for sm_90 (no GPU: triton.compile with the bundled ptxas), three Gluon kernels over one row held by a
cluster of CTAS CTAs (`num_ctas`, a BlockedLayout whose CGA layout splits the row) and prints which build:

  copy      load and store the row, cluster-split (no exchange)
  reduce    ttgl.max / ttgl.sum along the axis the CTAs split (the exchange left to the compiler)
  convert   per-CTA partials (an intra-CTA reduce), then convert_layout to a layout replicated over the CTAs
            (the exchange as a layout conversion), then the final reduce in each CTA
  asm       the exchange in inline PTX: each CTA indexes its own part of the row by %cluster_ctarank (the
            layout is replicated over the CTAs as far as the compiler knows), reduces it in-CTA, stores the
            partial into slot `rank` of every CTA's slot buffer (mapa + st.shared::cluster), then
            barrier.cluster arrive.release / wait.acquire, and reads the CTAS slots locally. The slot buffer is a
            Gluon allocation made first and kept live to the end, so the compiler places it at global_smem + 0
            and puts its own reduction scratch after it: the script prints where that scratch went.

On Triton 3.6.0 (2026-12-03, rows of 16384 over 2 CTAs and 262144 over 8): copy builds (PTX
.reqnctapercluster, %cluster_ctarank); reduce and convert fail in the TritonGPU -> LLVM lowering. reduce:
the assertion `helper.isReduceWithinCTA()` (a reduce across CTAs is not implemented); convert: "'nvvm.mapa' op
result #0 must be LLVM pointer in address space 0 or 7, but got '!llvm.ptr<3>'" (the distributed-shared-memory
lowering exists but emits IR its LLVM rejects). So the exchange would need inline PTX (mapa /
ld.shared::cluster / barrier.cluster) until a Triton that builds these; asm builds (ptxas accepts it). A
kernel built that way also needs a cluster barrier before the first remote store (a peer must not zero its
slots after they were written). hearth.kernels.softmax_gluon is that kernel, with the (max, sum) exchange and
the opening barrier; it ran correctly on the H200 (2026-12-03; its figures are in BENCHMARKS.md). This
script's asm variant stays the minimal max-only exchange it checked the build with.

    python scripts/cluster_reduce_probe.py [--n 16384] [--ctas 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon._runtime import GluonASTSource

WARPS = 8


@gluon.jit
def _copy_or_reduce(X, Y, N: ttgl.constexpr, CTAS: ttgl.constexpr, layout: ttgl.constexpr, REDUCE: ttgl.constexpr):
    offs = ttgl.arange(0, N, layout=layout)
    row = ttgl.program_id(0) // CTAS
    x = ttgl.load(X + row * N + offs).to(ttgl.float32)
    if REDUCE:
        e = ttgl.exp(x - ttgl.max(x, 0))
        x = e / ttgl.sum(e, 0)
    ttgl.store(Y + row * N + offs, x.to(ttgl.bfloat16))


@gluon.jit
def _convert(X, Y, CTAS: ttgl.constexpr, P: ttgl.constexpr, layout: ttgl.constexpr, rep: ttgl.constexpr):
    r = ttgl.arange(0, CTAS, layout=ttgl.SliceLayout(1, layout))
    c = ttgl.arange(0, P, layout=ttgl.SliceLayout(0, layout))
    row = ttgl.program_id(0) // CTAS
    offs = r[:, None] * P + c[None, :]
    x = ttgl.load(X + row * CTAS * P + offs).to(ttgl.float32)
    m = ttgl.max(ttgl.convert_layout(ttgl.max(x, 1), rep), 0)  # CTA i's partial -> every CTA
    e = ttgl.exp(x - m)
    s = ttgl.sum(ttgl.convert_layout(ttgl.sum(e, 1), rep), 0)
    ttgl.store(Y + row * CTAS * P + offs, (e / s).to(ttgl.bfloat16))


@contextlib.contextmanager
def _fd2_to(path: str):
    """Send file descriptor 2 to `path` (MLIR's diagnostics and LLVM ERROR lines are written there by C++, not
    through sys.stderr)."""
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@gluon.jit
def _asm_exchange(X, Y, P: ttgl.constexpr, layout: ttgl.constexpr, slot_layout: ttgl.constexpr,
                  slot_shared: ttgl.constexpr, EXCHANGE: ttgl.constexpr):
    slots = ttgl.allocate_shared_memory(ttgl.float32, [32 * 8], slot_shared)
    rank = ttgl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=ttgl.int32, is_pure=True,
                                       pack=1)
    base = ttgl.program_id(0) * P * ttgl.num_ctas() + rank * P
    offs = ttgl.arange(0, P, layout=layout)
    x = ttgl.load(X + base + offs).to(ttgl.float32)
    m = ttgl.inline_asm_elementwise(EXCHANGE, "=f,f", [ttgl.max(x, 0)], dtype=ttgl.float32, is_pure=False, pack=1)
    keep = slots.load(slot_layout)  # the slots stay live to here: the compiler's scratch goes elsewhere
    ttgl.store(Y + base + offs, (ttgl.exp(x - m) + ttgl.sum(keep, 0) * 0).to(ttgl.bfloat16))


def exchange_ptx(ctas: int) -> str:
    """Inline PTX: $1 (this CTA's partial max) into slot rank of every CTA's slots (global_smem + 4 * rank),
    a cluster barrier, then $0 = the max of the local slots."""
    lines = ["{", ".reg .u32 la, ra, off;", ".reg .f32 v, w;", "mov.u32 off, %cluster_ctarank;", "shl.b32 off, off, 2;",
             "mov.u32 la, global_smem;", "add.u32 la, la, off;"]
    for peer in range(ctas):
        lines += [f"mapa.shared::cluster.u32 ra, la, {peer};", "st.shared::cluster.f32 [ra], $1;"]
    lines += ["barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;",
              "mov.u32 la, global_smem;", "ld.shared.f32 v, [la];"]
    for peer in range(1, ctas):
        lines += [f"ld.shared.f32 w, [la+{4 * peer}];", "max.f32 v, v, w;"]
    return "\n".join(lines + ["mov.f32 $0, v;", "}"])


def build(fn, consts: dict, ctas: int) -> str:
    """'builds (...)' with the cluster instructions in its PTX, or 'FAILS: ' and the compiler's error lines."""
    sig = {"X": "*bf16", "Y": "*bf16", **{k: "constexpr" for k in consts}}
    with tempfile.NamedTemporaryFile(suffix=".log") as log:
        try:
            with _fd2_to(log.name):
                k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=consts),
                                   target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS, "num_ctas": ctas})
        except Exception as e:  # the lowering's reason is in the captured diagnostics; the exception says where
            text = open(log.name, errors="replace").read()
            why = [line.split("error: ", 1)[-1] for line in text.splitlines() if " error: " in line
                   and "Failures have been detected" not in line]
            why += [line.split("Assertion ", 1)[-1] for line in text.splitlines() if "LLVM ERROR" in line
                    or "Assertion " in line]
            return "FAILS: " + (" | ".join(why) or str(e).splitlines()[-1])[:400]
    ptx = k.asm["ptx"]
    found = re.findall(r"(mapa\S*|ld\.shared::cluster\S*|barrier\.cluster\S*|\.reqnctapercluster \d+|%cluster_ctarank)",
                       ptx)
    scratch = sorted({int(o) for o in re.findall(r"\[global_smem\+(\d+)\]", ptx)})
    return (f"builds ({', '.join(sorted(set(found))) or 'no cluster instructions'}; shared {k.metadata.shared} B"
            + (f", compiler scratch read at global_smem+{scratch}" if scratch else "") + ")")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384, help="row length (a power of two)")
    ap.add_argument("--ctas", type=int, default=2, help="CTAs in the cluster (2, 4 or 8)")
    args = ap.parse_args(argv)
    n, ctas = args.n, args.ctas
    if ctas not in (2, 4, 8) or n & (n - 1) or n // ctas < 32 * WARPS:
        raise SystemExit(f"--ctas must be 2, 4 or 8 and --n a power of two >= {32 * WARPS} x ctas")
    os.environ.setdefault("TRITON_ALWAYS_COMPILE", "1")
    p = n // ctas
    split = [[1 << i] for i in range(ctas.bit_length() - 1)]  # CTA bit i -> the i-th tile of the row
    row = ttgl.BlockedLayout([p // (32 * WARPS)], [32], [WARPS], [0], split)
    tiled = ttgl.BlockedLayout([1, p // (32 * WARPS)], [1, 32], [1, WARPS], [1, 0], [[b[0], 0] for b in split])
    rep = ttgl.BlockedLayout([ctas], [32], [WARPS], [0], [[0] for _ in split])  # every CTA holds every partial
    print(f"Triton {triton.__version__}, sm_90, row {n} over a cluster of {ctas} CTAs, {WARPS} warps each")
    print("copy   ", build(_copy_or_reduce, {"N": n, "CTAS": ctas, "layout": row, "REDUCE": False}, ctas))
    print("reduce ", build(_copy_or_reduce, {"N": n, "CTAS": ctas, "layout": row, "REDUCE": True}, ctas))
    print("convert", build(_convert, {"CTAS": ctas, "P": p, "layout": tiled, "rep": rep}, ctas))
    own = ttgl.BlockedLayout([p // (32 * WARPS)], [32], [WARPS], [0], [[0] for _ in split])  # replicated over CTAs
    slot_layout = ttgl.BlockedLayout([1], [32], [WARPS], [0], [[0] for _ in split])
    slot_shared = ttgl.SwizzledSharedLayout(1, 1, 1, [0], [[0] for _ in split])
    asm_consts = {"P": p, "layout": own, "slot_layout": slot_layout, "slot_shared": slot_shared,
                  "EXCHANGE": exchange_ptx(ctas)}
    print("asm    ", build(_asm_exchange, asm_consts, ctas))


if __name__ == "__main__":
    main()
