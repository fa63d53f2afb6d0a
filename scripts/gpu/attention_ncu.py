"""Nsight Compute on one attention fwd+bwd: where hearth's backward spends its cycles, beside FlashAttention-4's.

    ncu --profile-from-start off --clock-control none --section ... --csv --page raw \\
        python3 scripts/gpu/attention_ncu.py run --provider hearth --case "Qwen3-32B T8192:1,64,8,8192,128,1"
    python3 scripts/gpu/attention_ncu.py table RAW.csv [RAW.csv ...]        # the compact table, from ncu's raw CSV
    ncu --profile-from-start off --clock-control none --section SourceCounters --section WarpStateStats \\
        --kernel-name regex:_attn_bwd_fused --launch-count 1 --page source --print-source sass --csv --log-file SRC.csv \\
        python3 scripts/gpu/attention_ncu.py run ...
    python3 scripts/gpu/attention_ncu.py source SRC.csv [--top 12]          # stall samples by kind of instruction
    bash scripts/gpu/attention_ncu.sh                                         # both providers, every case, on the device

`run` builds one case (bf16, [B, H, T, D], random inputs), calls fwd+bwd three times unprofiled (compiles, autotune
picks, allocator warm), then once between cudaProfilerStart / Stop, so that `ncu --profile-from-start off` profiles
that call's kernels and nothing else. Providers: hearth (hearth.kernels.attention) and fa4 (flash_attn.cute's
flash_attn_func, FlashAttention-4, where it imports: scripts/gpu/peer_wheels.sh). Kernel replay restores memory
between passes, so the accumulating kernels (dQ in fp32) see the same inputs every pass.

`table` reads ncu's `--csv --page raw` output (one row per kernel, one column per metric) and prints, per kernel:
duration, SM / tensor-pipe / DRAM throughput, issue-slot use, registers, shared memory, achieved occupancy and the
five largest warp-stall reasons (cycles per issued instruction): the few figures that say whether a backward is
tensor-bound, latency-bound or stalled on a barrier, which CUDA-event timing cannot. `--json` adds one JSON object per
kernel with every metric the table reads.

`source` reads ncu's `--page source --print-source sass --csv` output (one row per SASS instruction, with the warp-stall
samples taken at it) and sorts the samples by what the warp waited at: idle warps (the warps warp_specialize leaves
without work, parked at a named barrier in the loop that retries `setmaxnreg` until the kernel ends: they issue
nothing, yet the raw page's "warps stalled at a barrier per issue" counts them), wgmma waits (WARPGROUP.DEPBAR),
named-barrier syncs (BAR.SYNC and the instruction after one, where a warp that waits at it is sampled), mbarrier
waits (SYNCS.PHASECHK, and the branch into its retry loop, where a waiting warp is sampled; one line per mbarrier
address) and arrives (SYNCS.ARRIVE), and the rest; then the instructions with the most samples. Found
by it (2026-12-07, an H100): about two thirds of the fused backward's and the forward's barrier samples were idle warps.

Without CUDA, `run --smoke` runs the hearth path at a tiny shape (TRITON_INTERPRET=1) to check the script itself.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys

from hearth.bench.cases import parse_attention_case

# ncu raw-page metric names the table reads (Hopper, Nsight Compute 2025.x); a missing one prints as "-". The
# UNIT_KEYS ones are scaled by their units row into the table's units; the rest are read as they are.
METRICS = {
    "dur_us": "gpu__time_duration.sum",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    # the tensor pipe's active cycles (every MMA kind, wgmma included) over the elapsed cycles
    "tensor_pct": ("sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.avg"
                   ".pct_of_peak_sustained_elapsed"),
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "issue_pct": "sm__inst_issued.avg.pct_of_peak_sustained_elapsed",
    "regs": "launch__registers_per_thread",
    "smem_kib": "launch__shared_mem_per_block",
    "occ_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
}
UNIT_KEYS = ("dur_us", "smem_kib")  # us and KiB
# the units row's names -> the table's units (us, KiB); ncu scales values unless told `--print-units base`
# (Nsight Compute 2025.3 with --print-units base writes "ns" and "byte/block"; older ones "nsecond", "byte")
UNIT_SCALE = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3,
              "s": 1e6, "byte": 1 / 1024, "Kbyte": 1000 / 1024, "Kibyte": 1.0, "KB": 1000 / 1024, "KiB": 1.0,
              "Mbyte": 1e6 / 1024, "Mibyte": 1024.0}
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def _fa4():
    """FlashAttention-4 itself (flash_attn.cute, no fallback to an older FlashAttention) on [B, H, T, D] tensors."""
    from flash_attn.cute import flash_attn_func

    from hearth.bench.providers import flash_attn_bhtd

    return flash_attn_bhtd(flash_attn_func)


def run(provider: str, case: str, smoke: bool) -> None:
    import torch

    from hearth.kernels.attention import attention

    label, (b, hq, hk, t, d, causal) = parse_attention_case(case)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not smoke:
        raise SystemExit("run needs CUDA (or --smoke, a tiny CPU check of this script)")
    if provider == "hearth":
        fn = attention
    elif provider == "fa4":
        fn = _fa4()
    else:
        raise SystemExit(f"--provider must be hearth or fa4, got {provider!r}")
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, hq, t, d, device=dev, dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(b, hk, t, d, device=dev, dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(b, hk, t, d, device=dev, dtype=dtype, generator=g).requires_grad_()
    dout = torch.randn(b, hq, t, d, device=dev, dtype=dtype, generator=g)

    def step():
        q.grad = k.grad = v.grad = None
        out = fn(q, k, v, causal=causal)
        out.backward(dout)

    for _ in range(1 if smoke else 3):
        step()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    step()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v)), "non-finite gradients"
    print(f"{provider} {label}: one profiled fwd+bwd, B={b} Hq={hq} Hk={hk} T={t} D={d} causal={causal}")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_raw(text: str) -> list[dict[str, str]]:
    """The kernels of an ncu `--csv --page raw` dump: its header row names the metrics, a units row follows,
    then one row per kernel. Lines before the header (the program's own output, ==PROF== notes) are skipped. Each
    kernel's dict also holds the units row under the key "__units__"."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    units = next((r for r in rows if _number(r.get("ID", "")) is None), {})
    return [dict(r, __units__=units) for r in rows if _number(r.get("ID", "")) is not None]


def summarize(row: dict) -> dict:
    out = {"kernel": row.get("Kernel Name", "?")}
    units = row.get("__units__", {})
    for key, metric in METRICS.items():
        v = _number(row.get(metric, ""))
        if v is not None and key in UNIT_KEYS:
            unit = units.get(metric, "").removesuffix("/block")
            if unit not in UNIT_SCALE:
                raise ValueError(f"{metric}: unit {unit!r} not known to the table (UNIT_SCALE)")
            v *= UNIT_SCALE[unit]
        out[key] = v
    stalls = {}
    for name, value in row.items():
        if name and name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX):
            v = _number(value)
            if v is not None and not math.isnan(v):
                stalls[name[len(STALL_PREFIX):-len(STALL_SUFFIX)]] = v
    out["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    return out


def table(paths: list[str], as_json: bool) -> None:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    for path in paths:
        with open(path) as f:
            kernels = [summarize(r) for r in read_raw(f.read())]
        print(f"== {path}: {len(kernels)} kernel(s)")
        if not kernels:
            print("   (no ncu raw CSV rows: did ncu profile anything? see the file's ==PROF== lines)")
        for s in kernels:
            top = ", ".join(f"{k} {v:.2f}" for k, v in list(s["stalls"].items())[:5]) or "-"
            print(f"  {s['kernel'][:90]}")
            print(f"    {fmt(s['dur_us'], '.1f')} us | SM {fmt(s['sm_pct'], '.1f')}% tensor {fmt(s['tensor_pct'], '.1f')}%"
                  f" DRAM {fmt(s['dram_pct'], '.1f')}% issue {fmt(s['issue_pct'], '.1f')}% | regs {fmt(s['regs'], '.0f')}"
                  f" smem {fmt(s['smem_kib'], '.1f')} KiB occ {fmt(s['occ_pct'], '.1f')}% grid {fmt(s['grid'], '.0f')}"
                  f" x {fmt(s['block'], '.0f')}")
            print(f"    stalls (warps per issue): {top}")
            if as_json:
                print(json.dumps(dict(s, file=path)))


# the kinds of instruction `source` sorts stall samples by: (kind, test on the SASS text of the instruction, the one
# before it and the one after it), the first match wins
IDLE_LOOP = "USETMAXREG.TRY_ALLOC"


def _sass_kind(text: str, before: str, after: str, target: str = "") -> str:
    """The kind of a SASS instruction for `source`, from its text, its neighbours' and, for a branch, its target's."""
    words = text.split()
    op = words[1] if text.startswith("@") and len(words) > 1 else (words or [""])[0]
    if IDLE_LOOP in after and op == "NOP":
        return "idle warps (setmaxnreg retry loop)"
    if op.startswith("WARPGROUP.DEPBAR"):
        return "wgmma wait (WARPGROUP.DEPBAR)"
    if op.startswith("SYNCS.PHASECHK") or (op == "BRA" and target.startswith("SYNCS.PHASECHK")):
        # a try-wait, or the branch into its retry loop, where a warp that waits is sampled: named by the barrier
        wait = target if op == "BRA" else text
        slot = next((w.rstrip(",") for w in wait.split() if w.startswith("[")), "?")
        return f"mbarrier wait {slot}"
    if op.startswith("BAR.") or before.split()[:1] == ["BAR.SYNC.DEFER_BLOCKING"]:
        return "named barrier (BAR.SYNC, or just after one)"
    if op.startswith("SYNCS.ARRIVE"):
        return "mbarrier arrive (SYNCS.ARRIVE)"
    if op.startswith("HGMMA"):
        return "wgmma issue (HGMMA)"
    return "other"


def read_sources(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """[(kernel name, instructions)] of an ncu `--csv --page source --print-source sass` dump, one entry per profiled
    kernel: each is a "Kernel Name" line, then a header row ("Address", "Source", sample and stall columns) and one
    row per SASS instruction. Lines before the first (the program's output, ==PROF== notes) are skipped."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith('"Kernel Name"')]
    out = []
    for j, i in enumerate(starts):
        name = next(csv.reader([lines[i]]))[1]
        block = lines[i + 1:starts[j + 1] if j + 1 < len(starts) else len(lines)]
        head = next((k for k, ln in enumerate(block) if ln.startswith('"Address"')), None)
        rows = [] if head is None else [r for r in csv.DictReader(io.StringIO("\n".join(block[head:])))
                                        if r.get("Address")]
        out.append((name, rows))
    return out


def read_source(text: str) -> tuple[str, list[dict[str, str]]]:
    """The first kernel of read_sources ("?" and no rows when there is none)."""
    return next(iter(read_sources(text)), ("?", []))


def source_summary(rows: list[dict[str, str]]) -> dict:
    """Samples by kind of instruction (_sass_kind), each split by stall reason, and every instruction's kind."""
    texts = [" ".join((r.get("Source") or "").split()) for r in rows]
    at = {(r.get("Address") or "").lower(): t for r, t in zip(rows, texts)}
    kinds: dict[str, dict] = {}
    total = 0.0
    per = []
    for i, r in enumerate(rows):
        words = texts[i].split()
        target = at.get(words[-1].lower(), "") if "BRA" in words[:2] and words else ""
        kind = _sass_kind(texts[i], texts[i - 1] if i else "", texts[i + 1] if i + 1 < len(texts) else "", target)
        n = _number(r.get("Warp Stall Sampling (All Samples)", "")) or 0.0
        total += n
        k = kinds.setdefault(kind, {"samples": 0.0, "reasons": {}})
        k["samples"] += n
        for col, v in r.items():
            if col and col.startswith("stall_") and "Not Issued" not in col:
                x = _number(v)
                if x:
                    k["reasons"][col[len("stall_"):]] = k["reasons"].get(col[len("stall_"):], 0.0) + x
        per.append((n, r.get("Address", "?"), texts[i], kind))
    return {"total": total, "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["samples"])),
            "top": sorted(per, key=lambda t: -t[0])}


def source(paths: list[str], top: int) -> None:
    for path in paths:
        with open(path) as f:
            kernels = read_sources(f.read())
        if not kernels:
            print(f"== {path}: no kernel (was ncu run with --page source --print-source sass --csv?)")
        for name, rows in kernels:
            _source_kernel(path, name, rows, top)


def _source_kernel(path: str, name: str, rows: list[dict[str, str]], top: int) -> None:
    s = source_summary(rows)
    print(f"== {path}: {name[:90]}, {len(rows)} SASS instructions, {s['total']:.0f} stall samples")
    if not rows or not s["total"]:
        return
    barrier = sum(k["reasons"].get("barrier", 0.0) for k in s["kinds"].values())
    idle = next((k for kind, k in s["kinds"].items() if kind.startswith("idle")), {"samples": 0.0, "reasons": {}})
    print(f"   barrier samples {barrier:.0f}, of them at idle warps {idle['reasons'].get('barrier', 0.0):.0f}"
          f" ({100 * idle['reasons'].get('barrier', 0.0) / barrier if barrier else 0:.0f}%)")
    for kind, k in s["kinds"].items():
        if not k["samples"]:
            continue
        reasons = ", ".join(f"{r} {v:.0f}" for r, v in sorted(k["reasons"].items(), key=lambda kv: -kv[1])[:4])
        print(f"   {kind:<44} {k['samples']:>9.0f} ({100 * k['samples'] / s['total'] if s['total'] else 0:4.1f}%)"
              f"  {reasons}")
    print(f"   the {top} instructions with the most samples:")
    for n, addr, text, kind in s["top"][:top]:
        print(f"   {n:>9.0f}  {addr[-6:]}  {text[:64]:<64}  {kind}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one profiled fwd+bwd (under ncu --profile-from-start off)")
    r.add_argument("--provider", default="hearth", help="hearth or fa4")
    r.add_argument("--case", default="Qwen3-32B T8192:1,64,8,8192,128,1", help="LABEL:B,Hq,Hk,T,D,causal")
    r.add_argument("--smoke", action="store_true", help="tiny CPU run under TRITON_INTERPRET=1 (checks the script)")
    t = sub.add_parser("table", help="the compact table of ncu --csv --page raw dumps")
    t.add_argument("paths", nargs="+")
    t.add_argument("--json", action="store_true")
    so = sub.add_parser("source", help="stall samples by kind of instruction, from ncu --csv --page source dumps")
    so.add_argument("paths", nargs="+")
    so.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        try:
            run(args.provider, args.case if not args.smoke else "smoke:1,4,2,32,16,1", args.smoke)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    elif args.cmd == "source":
        source(args.paths, args.top)
    else:
        table(args.paths, args.json)


if __name__ == "__main__":
    sys.exit(main())
