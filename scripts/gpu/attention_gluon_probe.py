"""H200 probe of the Gluon flash-attention kernels (hearth.kernels.attention_gluon), < 90 s.
(--bwd: the Gluon backward kernels (dK / dV, dQ, both, and the fused 5-matmul kernel in its probe-only forms:
BWD_VARIANTS, a subset with --bwd-variants), fwd+bwd TFLOP/s and peak MiB beside the Triton backward and cuDNN.)

    python scripts/gpu/attention_gluon_probe.py --out $OUT/attention_gluon_probe.jsonl [--quick]

For each of issue 15's three cases (causal, bf16: B4 H32 T4096 D128, B2 Hq40 Hk8 T8192 D128,
B4 H32 T4096 D64), then the first one non-causal: first a correctness gate (the Gluon forward's O and
lse against the Triton forward's on the same inputs: max |diff|; a case whose O differs by more than
0.05 or whose lse differs by more than 1e-3 is reported "mismatch" and not timed), then TFLOP/s of
  * forward: Gluon (attention_gluon.forward; "gluon_ws" = its warp-specialised variant, timed only when it
    passes the same check), the current Triton forward (attention._attention_forward
    with HEARTH_ATTN_GLUON=0, autotuned as shipped), SDPA cuDNN;
  * fwd+bwd: attention() with HEARTH_ATTN_GLUON=1 (Gluon forward + the existing backward), attention()
    as shipped, SDPA cuDNN.
FLOPs: forward 4*B*Hq*T*T*D, halved when causal; fwd+bwd 3.5x the forward (as BENCHMARKS.md counts).
Timing: triton.testing.do_bench (warmup 25 ms, rep 100 ms), median ms. One JSON object per line to
--out (and stdout). Parts past an 80 s budget are skipped and say so. --quick: the first case only.
--sweep (a separate run, about 2 minutes: one compile per config and variant): after the cases, the Gluon
forward at every config of attention_gluon.CANDIDATES (all compile for sm_90 without spills) at the first
D=128 and D=64 cases, both variants, each gated by the same check; one row per (case, config, variant).
Then the ping-pong variant (attention_gluon.PING_PONG, what HEARTH_ATTN_GLUON_PP=1 selects) at every config
of attention_gluon.PP_CANDIDATES, same cases, gate and row format (variant "pp", config (BLOCK_M per
warpgroup, BLOCK_N, NUM_STAGES)). A wrong barrier schedule would hang the GPU, so these run in a child
process (--pp-child) with a PP_TIMEOUT_S limit (--pp-only: those rows alone, at all four cases, with the
Triton forward's (HEARTH_ATTN_GLUON=0) and cuDNN's TFLOP/s timed beside them in the same child): a hang
becomes a row with status "timed out", not a stalled probe.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
attn = importlib.import_module("hearth.kernels.attention")  # noqa: E402
ag = importlib.import_module("hearth.kernels.attention_gluon")  # noqa: E402

CASES = [  # (B, Hq, Hk, T, D, causal)
    (4, 32, 32, 4096, 128, True),
    (2, 40, 8, 8192, 128, True),
    (4, 32, 32, 4096, 64, True),
    (4, 32, 32, 4096, 128, False),
]
# --pp-only also times these: short sequences, where the forward is furthest behind cuDNN (0.81x at T 1024 on the
# goal grid), so a per-length config (or the persistent variant) can be judged there
SHORT_CASES = [
    (16, 32, 32, 1024, 128, True),
    (8, 32, 32, 2048, 128, True),
    (16, 32, 32, 1024, 64, True),
]
SWEEP = ag.CANDIDATES
PP_SWEEP = {d: list(c) for d, c in ag.PP_CANDIDATES.items()}
PP_TIMEOUT_S = 75  # the ping-pong rows: ~7 compiles and timings, seconds each; a hang never ends
BUDGET_S = 80.0
T0 = time.time()


def bench(fn, **kw):
    return triton.testing.do_bench(fn, warmup=25, rep=100, **kw)


def tflops(flops, ms):
    return round(flops / (ms * 1e-3) / 1e12, 1)


def case_label(case) -> str:
    B, Hq, Hk, T, D, causal = case
    return f"B{B} Hq{Hq} Hk{Hk} T{T} D{D} {'causal' if causal else 'full'}"


def case_inputs(case):
    """(q, k, v, scale, forward FLOPs) of one case: bf16, seeded, [B, H, T, D]."""
    B, Hq, Hk, T, D, causal = case
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hk, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hk, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v, D ** -0.5, 4 * B * Hq * T * T * D // (2 if causal else 1)


def error_text(e: Exception, width: int = 160) -> str:
    """'Type: first line of the message' (cut to width), also for an exception with an empty message."""
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0][:width] if lines else ''}"


def time_into(row, prefix, fns, flops, **bench_kw):
    """row[prefix + name] = the TFLOP/s of each of fns (name -> callable) at `flops` a call, or "error: ..."
    where one raises (cuDNN may refuse a shape: say so, keep going)."""
    for name, fn in fns.items():
        try:
            row[f"{prefix}{name}"] = tflops(flops, bench(fn, **bench_kw))
        except Exception as e:
            row[f"{prefix}{name}"] = f"error: {error_text(e)}"


def gated_sweep_row(row, run, reference, fwd_flops, sync=False):
    """Run `run` (a Gluon forward returning (out, lse)) once, compare with `reference` (the Triton forward's
    (out, lse)) and time it only when it agrees; fills and returns `row`."""
    o_t, lse_t = reference
    try:
        o, lse = run()
        if sync:
            torch.cuda.synchronize()
        row["max_abs_diff_out"] = float((o.float() - o_t.float()).abs().max())
        row["max_abs_diff_lse"] = float((lse - lse_t).abs().max())
        if row["max_abs_diff_out"] <= 0.05 and row["max_abs_diff_lse"] <= 1e-3:
            row["fwd_tflops_gluon"] = tflops(fwd_flops, bench(run))
        else:
            row["status"] = "mismatch: not timed"
    except Exception as e:
        row["error"] = error_text(e)
    return row


def use_triton_forward():
    """attention() and _attention_forward take the Triton forward from here on: with HEARTH_ATTN_GLUON unset,
    attention.forward_kernel routes head_dim 128 on Hopper to the Gluon ping-pong kernel."""
    os.environ["HEARTH_ATTN_GLUON"] = "0"


def cudnn_fn(q, k, v, causal):
    gqa = q.shape[1] != k.shape[1]

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return run


def probe(case, emit):
    D, causal = case[4], case[5]
    row = dict(case=case_label(case), dtype="bfloat16", device=torch.cuda.get_device_name(), config=ag.CONFIGS[D])
    q, k, v, scale, fwd_flops = case_inputs(case)
    use_triton_forward()

    t = time.time()
    try:
        o_g, lse_g = ag.forward(q, k, v, causal, scale)
        torch.cuda.synchronize()
    except Exception as e:  # a compile error on this Triton build: report it, go on to the next case
        row["status"] = f"gluon forward failed: {error_text(e, 300)}"
        emit(row)
        return
    row["gluon_first_call_s"] = round(time.time() - t, 2)  # compile + first run
    o_t, lse_t = attn._attention_forward(q, k, v, causal, scale)
    row["max_abs_diff_out"] = float((o_g.float() - o_t.float()).abs().max())
    row["max_abs_diff_lse"] = float((lse_g - lse_t).abs().max())
    row["finite"] = bool(torch.isfinite(o_g).all() and torch.isfinite(lse_g).all())
    if not row["finite"] or row["max_abs_diff_out"] > 0.05 or row["max_abs_diff_lse"] > 1e-3:
        row["status"] = "mismatch: not timed"
        emit(row)
        return

    def gluon(ws):
        def run():
            ag.WARP_SPECIALIZE = ws
            return ag.forward(q, k, v, causal, scale)
        return run

    ws_ok = True
    try:  # the warp-specialised variant must agree too before it is timed
        ag.WARP_SPECIALIZE = True
        o_w, lse_w = ag.forward(q, k, v, causal, scale)
        row["ws_max_abs_diff_out"] = float((o_w.float() - o_t.float()).abs().max())
        row["ws_max_abs_diff_lse"] = float((lse_w - lse_t).abs().max())
        ws_ok = row["ws_max_abs_diff_out"] <= 0.05 and row["ws_max_abs_diff_lse"] <= 1e-3
    except Exception as e:
        row["ws_error"] = error_text(e)
        ws_ok = False
    ag.WARP_SPECIALIZE = False
    fwd = {
        "gluon": gluon(False),
        "triton": lambda: attn._attention_forward(q, k, v, causal, scale),
        "sdpa_cudnn": cudnn_fn(q, k, v, causal),
    }
    if ws_ok:
        fwd["gluon_ws"] = gluon(True)
    time_into(row, "fwd_tflops_", fwd, fwd_flops)
    if time.time() - T0 > BUDGET_S:
        row["status"] = "fwd only (budget)"
        emit(row)
        return

    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    do = torch.randn_like(q)

    def fwd_bwd(env, ws=False):
        def run():
            ag.WARP_SPECIALIZE = ws
            if env:
                os.environ["HEARTH_ATTN_GLUON"] = "1"
            else:
                use_triton_forward()
            attn.attention(qg, kg, vg, causal=causal).backward(do)
        return run

    cud = cudnn_fn(qg, kg, vg, causal)
    fb = {"gluon": fwd_bwd(True), "triton": fwd_bwd(False), "sdpa_cudnn": lambda: cud().backward(do)}
    if ws_ok:
        fb["gluon_ws"] = fwd_bwd(True, ws=True)
    time_into(row, "fwdbwd_tflops_", fb, 3.5 * fwd_flops, grad_to_none=[qg, kg, vg])
    use_triton_forward()
    ag.WARP_SPECIALIZE = False
    row["status"] = "ok" if ws_ok else "ok (warp-specialised variant failed its check: not timed)"
    emit(row)


def sweep(case, emit):
    D, causal = case[4], case[5]
    q, k, v, scale, fwd_flops = case_inputs(case)
    use_triton_forward()  # the gate's reference
    reference = attn._attention_forward(q, k, v, causal, scale)
    shipped = ag.CONFIGS[D]
    try:
        for cfg in SWEEP[D]:
            for ws in (False, True):
                row = dict(case=case_label(case), sweep=True, config=cfg, variant="ws" if ws else "1part")
                ag.CONFIGS[D], ag.WARP_SPECIALIZE = cfg, ws
                emit(gated_sweep_row(row, lambda: ag.forward(q, k, v, causal, scale), reference, fwd_flops))
    finally:
        ag.CONFIGS[D], ag.WARP_SPECIALIZE = shipped, False


def sweep_pp(case, emit):
    """(In the --pp-child process) the ping-pong variant at every PP_SWEEP config of `case`, gated like sweep."""
    D, causal = case[4], case[5]
    q, k, v, scale, fwd_flops = case_inputs(case)
    use_triton_forward()  # reference and baseline, whatever the caller set
    reference = attn._attention_forward(q, k, v, causal, scale)
    if os.environ.get("HEARTH_PP_TIME_TRITON") == "1":  # --pp-only: the Triton forward timed in the same process
        emit(dict(case=case_label(case), sweep=True, variant="triton",
                  fwd_tflops_triton=tflops(fwd_flops, bench(lambda: attn._attention_forward(q, k, v, causal, scale))),
                  fwd_tflops_sdpa_cudnn=tflops(fwd_flops, bench(cudnn_fn(q, k, v, causal)))))
    ag.PING_PONG = True
    for cfg in PP_SWEEP[D]:
        row = dict(case=case_label(case), sweep=True, config=cfg, variant="pp")
        ag.PP_CONFIGS[D] = cfg
        print(f"# starting pp {cfg} {row['case']}", flush=True)  # the last one shown is the one that hung
        emit(gated_sweep_row(row, lambda: ag.forward(q, k, v, causal, scale, True, True), reference, fwd_flops,
                             sync=True))


def sweep_pp_guarded(emit, time_triton=False):
    """Run the ping-pong rows in a child process under PP_TIMEOUT_S and pass its rows on to `emit`.
    time_triton (--pp-only): the child also times the Triton forward, autotuned as shipped, per case."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if time_triton:
        env["HEARTH_PP_TIME_TRITON"] = "1"
    else:  # the child's Triton reference (the gate only) takes the first config: no second autotuning run
        env["HEARTH_ATTN_AUTOTUNE"] = "0"
    cmd = [sys.executable, os.path.abspath(__file__), "--out", os.devnull, "--pp-child"]
    # + two more cases and three short ones, and the Triton forward's autotuning at each
    limit = PP_TIMEOUT_S + (160 if time_triton else 0)
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
        out, status = res.stdout, None
        if res.returncode != 0:
            err = res.stderr.strip().splitlines()
            status = f"pp child failed (exit {res.returncode}): {err[-1][:300] if err else ''}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        status = f"pp child timed out after {limit} s (a hung barrier schedule?)"
    last = None
    for line in out.splitlines():
        if line.startswith("{"):
            emit(json.loads(line))
        elif line.startswith("# starting"):
            last = line[len("# starting "):]
    if status:
        emit(dict(sweep=True, variant="pp", status=status, last_started=last))


# name -> the env the backward reads (attention.backward_kernel and attention_gluon.backward_fused); unset = default.
# "gluon_fused" is the shipped fused backward (the default on Hopper: dQ^T by TMA reduce-add, lse / delta staged by
# the producer, 64-query steps, dQ^T split at D 128, fp32 buffer bounded to FB_ACC_MIB); the others change one
# thing: 32-query steps (M32), the pre-2026-12-03 form (fp32 atomics, consumers' loads, no split, M32: what the
# default was built from), no dQ split, the buffer unbounded or bounded to 32 / 64 / 128 MiB, the next step's
# lse / delta a step ahead (PF), the grid order (HEARTH_ATTN_FB_PAIR_GROUP: KM every pair's key block 0 first, PM
# a pair's key blocks together, PGn groups of n pairs).
# "triton" turns the fused kernel off. (The red.v2.f32 and shared-memory-A forms of the 2026-12-03 runs were
# removed after them: BENCHMARKS.md.)
_NO_FUSED = {"HEARTH_ATTN_GLUON_BWD_FUSED": "0"}
_FUSED = {"HEARTH_ATTN_GLUON_BWD_FUSED": "1"}
_OLD = dict(_FUSED, HEARTH_ATTN_FB_DQ_TMA="0", HEARTH_ATTN_FB_STATS_SMEM="0", HEARTH_ATTN_FB_DQ_SPLIT="0")
BWD_VARIANTS = {
    "triton": _NO_FUSED, "gluon_dkdv": dict(_NO_FUSED, HEARTH_ATTN_GLUON_BWD="1"),
    "gluon_dq": dict(_NO_FUSED, HEARTH_ATTN_GLUON_BWD_DQ="1"),
    "gluon_both": dict(_NO_FUSED, HEARTH_ATTN_GLUON_BWD="1", HEARTH_ATTN_GLUON_BWD_DQ="1"),
    "gluon_fused": _FUSED,
    "gluon_fused_m32": dict(_FUSED, HEARTH_ATTN_FB_CONFIG="32,2"),
    "gluon_fused_old_m32": dict(_OLD, HEARTH_ATTN_FB_CONFIG="32,2"),
    "gluon_fused_nosplit": dict(_FUSED, HEARTH_ATTN_FB_DQ_SPLIT="0"),
    "gluon_fused_unbounded": dict(_FUSED, HEARTH_ATTN_FB_ACC_MIB="0"),
    "gluon_fused_32m": dict(_FUSED, HEARTH_ATTN_FB_ACC_MIB="32"),
    "gluon_fused_64m": dict(_FUSED, HEARTH_ATTN_FB_ACC_MIB="64"),
    "gluon_fused_128m": dict(_FUSED, HEARTH_ATTN_FB_ACC_MIB="128"),
    "gluon_fused_pf": dict(_FUSED, HEARTH_ATTN_FB_PREFETCH="1"),
    "gluon_fused_km": dict(_FUSED, HEARTH_ATTN_FB_PAIR_GROUP="0"),
    "gluon_fused_pm": dict(_FUSED, HEARTH_ATTN_FB_PAIR_GROUP="1"),
    "gluon_fused_pg4": dict(_FUSED, HEARTH_ATTN_FB_PAIR_GROUP="4"),
    "gluon_fused_pg8": dict(_FUSED, HEARTH_ATTN_FB_PAIR_GROUP="8"),
    "gluon_fused_pg16": dict(_FUSED, HEARTH_ATTN_FB_PAIR_GROUP="16"),
}
BWD_VARS = sorted({var for env in BWD_VARIANTS.values() for var in env})


def bwd_probe(case, emit, variants=None):
    """--bwd: fwd+bwd through attention() with the backward's dK / dV and dQ kernels Triton or Gluon
    (HEARTH_ATTN_GLUON_BWD / HEARTH_ATTN_GLUON_BWD_DQ) or the fused Gluon backward (BWD_VARIANTS), each Gluon
    variant gated on its gradients agreeing with the Triton backward's (max |diff| of dq / dk / dv <= 0.05), and
    SDPA cuDNN; TFLOP/s at 3.5x the forward's FLOPs, and each one's peak MiB. The forward is whatever
    attention.forward_kernel picks."""
    causal = case[5]
    q, k, v, scale, fwd_flops = case_inputs(case)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)
    row = dict(case=case_label(case), bwd=True, config_dkdv=ag.BWD_CONFIGS[case[4]], config_dq=ag.BWD_DQ_CONFIGS[case[4]])

    def run(env):
        def fn():
            for var in BWD_VARS:
                if var in env:
                    os.environ[var] = env[var]
                else:
                    os.environ.pop(var, None)
            attn.attention(qg, kg, vg, causal=causal).backward(do)
        return fn

    fns, grads = {}, {}
    for name, env in BWD_VARIANTS.items():
        if variants and name not in variants and name != "triton":
            continue
        try:
            qg.grad = kg.grad = vg.grad = None
            run(env)()
            torch.cuda.synchronize()
            grads[name] = [t.grad.float() for t in (qg, kg, vg)]
        except Exception as e:
            row[f"error_{name}"] = error_text(e)
            continue
        if name != "triton" and "triton" in grads:
            diff = {n: float((a - b).abs().max()) for n, a, b in zip(("dq", "dk", "dv"), grads["triton"], grads[name])}
            row[f"max_abs_diff_{name}"] = diff
            if max(diff.values()) > 0.05:
                row[f"status_{name}"] = "mismatch: not timed"
                continue
        fns[name] = run(env)
    cud = cudnn_fn(qg, kg, vg, causal)
    fns["sdpa_cudnn"] = lambda: cud().backward(do)
    time_into(row, "fwdbwd_tflops_", fns, 3.5 * fwd_flops, grad_to_none=[qg, kg, vg])
    for name, fn in fns.items():  # peak memory of one fwd+bwd above what was allocated before it, MiB
        try:
            qg.grad = kg.grad = vg.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            row[f"fwdbwd_peak_mib_{name}"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
        except Exception as e:
            row[f"fwdbwd_peak_mib_{name}"] = f"error: {error_text(e)}"
    for var in BWD_VARS:
        os.environ.pop(var, None)
    emit(row)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSONL file to write (one object per case)")
    ap.add_argument("--quick", action="store_true", help="the first case only")
    ap.add_argument("--sweep", action="store_true",
                    help="then every SWEEP config (both variants) and every PP_SWEEP config (ping-pong) at two cases")
    ap.add_argument("--pp-only", action="store_true",
                    help="only the ping-pong rows (every PP_SWEEP config at the four cases and the three SHORT_CASES), the "
                         "Triton forward and cuDNN beside them")
    ap.add_argument("--bwd", action="store_true",
                    help="only fwd+bwd with the Gluon dK / dV and dQ kernels against the Triton ones and cuDNN, at all four cases")
    ap.add_argument("--bwd-variants", default=None,
                    help="with --bwd: comma list of BWD_VARIANTS names to time (the Triton backward always runs)")
    ap.add_argument("--pp-child", action="store_true", help=argparse.SUPPRESS)  # sweep_pp_guarded's child
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("attention_gluon_probe needs a Hopper GPU (compute capability 9.x)")
    if args.pp_child:  # rows to stdout only: the parent writes them to --out
        # --pp-only: all four cases (the routing in attention.forward_kernel is per (head_dim, causal)) and the short ones
        pp_only = os.environ.get("HEARTH_PP_TIME_TRITON") == "1"
        for case in CASES + SHORT_CASES if pp_only else (CASES[0], CASES[2]):
            sweep_pp(case, lambda row: print(json.dumps(row), flush=True))
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        def emit(row):
            row["elapsed_s"] = round(time.time() - T0, 1)
            line = json.dumps(row)
            print(line, flush=True)
            f.write(line + "\n")
            f.flush()

        if args.pp_only:
            sweep_pp_guarded(emit, time_triton=True)
            return
        if args.bwd:
            for case in CASES:
                bwd_probe(case, emit, args.bwd_variants.split(",") if args.bwd_variants else None)
            return
        for case in CASES[:1] if args.quick else CASES:
            if time.time() - T0 > BUDGET_S:
                emit(dict(case=str(case), status="skipped: past the 80 s budget"))
                continue
            probe(case, emit)
        if args.sweep:
            for case in (CASES[0], CASES[2]):
                sweep(case, emit)
            sweep_pp_guarded(emit)


if __name__ == "__main__":
    main()
