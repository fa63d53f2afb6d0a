"""H200 probe: the Triton attention forward's launch configs at head_dim 64, one by one.

    python scripts/gpu/attention_fwd_config_probe.py --out $OUT/fwd_cfg.jsonl [--budget-s 240] [--cases ...]

At head_dim 64 hearth's forward is the Triton kernel (attention._attn_fwd_kernel; the Gluon ping-pong forward
measured slower there): on Hopper at the config attention.forward_config's rule gives (since 4747270, from this
probe's first run), elsewhere autotuned over attention._FWD_CANDIDATES["d64"] (four configs). This probe times every
(BLOCK_M, BLOCK_N, num_warps, num_stages) of a wider grid (BLOCK_M 64 / 128, BLOCK_N 32-128 with BLOCK_M % BLOCK_N
== 0 as the causal stages need, 4 / 8 warps, 2-4 stages), each launched alone (the module's AUTOTUNE off and the
list's first entry set to the config), at each case (bf16, GQA 40/8 by default: the goal grid's), with cuDNN (SDPA)
the shipped forward ("shipped": the rule where it applies) and the autotuner's pick ("autotuner": the rule switched
off for the row; the first run, at f23e60e, had no rule and called its one such row "shipped-autotuned") timed
beside them. Every config's output and logsumexp are checked against the
shipped first config's on the same inputs (max |diff| of O under 2e-2 of its max, lse under 1e-3); a config that
fails to build (shared memory, registers) or to match is reported, not timed. Timing: hearth.bench.timing.time_call
(L2 flushed, a device sleep at least one call long before each call, CUDA events, median ms). One JSON object per
line; configs past the budget are skipped and say so. A probe, not a benchmark: the goal grid's figures come from
`hearth bench attention --sizes goal`.
--varlen: the same configs through attention_varlen's Triton forward (its Gluon forward is not the default at
head_dim 64), each case's B sequences of T tokens packed into one call ([B * T, H, D], cu_seqlens 0, T, 2T, ...):
whether the dense rule (attention.FWD_RULE_HOPPER_D64) also holds on packed rows (its first run, at 8a96ceb, when
varlen's launch took no rule, found 64x64 w4 s3 fastest causal and not: attention.FWD_RULE_HOPPER_D64_VARLEN since);
cuDNN still runs the dense batch (the same math).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import math
import os
import time

import torch
import torch.nn.functional as F

CASES = [  # (label, B, Hq, Hk, T, D, causal)
    ("causal T1024 B16", 16, 40, 8, 1024, 64, True),
    ("causal T4096 B4", 4, 40, 8, 4096, 64, True),
    ("causal T16384 B1", 1, 40, 8, 16384, 64, True),
    ("non-causal T1024 B16", 16, 40, 8, 1024, 64, False),
    ("non-causal T4096 B4", 4, 40, 8, 4096, 64, False),
    ("non-causal T16384 B1", 1, 40, 8, 16384, 64, False),
]


def grid() -> list[tuple[int, int, int, int]]:
    """The configs timed: BLOCK_M in (128, 64), BLOCK_N dividing it (32..128), 4 or 8 warps, 2-4 stages."""
    out = []
    for bm, bn, w, s in itertools.product((128, 64), (128, 64, 32), (8, 4), (3, 4, 2)):
        if bm % bn == 0 and not (bm == 64 and w == 8):
            out.append((bm, bn, w, s))
    return out


def main() -> None:
    from attention_knob_probe import _parse_cases, jsonl_out  # this folder's knob probe: the same --cases format

    from hearth.bench.timing import time_call

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--cases", default=None, help='"LABEL:B,Hq,Hk,T,D,causal;..." (default: CASES)')
    ap.add_argument("--varlen", action="store_true", help="attention_varlen's forward on the cases packed")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu" under TRITON_INTERPRET=1: a smoke run
    args = ap.parse_args()
    cases = _parse_cases(args.cases) if args.cases else CASES
    os.environ["HEARTH_ATTN_GLUON"] = "0"  # the Triton forward everywhere (read at call time)
    at = importlib.import_module("hearth.kernels.attention")
    av = importlib.import_module("hearth.kernels.attention_varlen")
    shipped = list(at._FWD_CANDIDATES["d64"])
    start = time.monotonic()
    with jsonl_out(args.out) as emit:
        for label, B, Hq, Hk, T, D, causal in cases:
            g = torch.Generator(device=args.device).manual_seed(0)
            q, k, v = (torch.randn(B, h, T, D, device=args.device, dtype=torch.bfloat16, generator=g)
                       for h in (Hq, Hk, Hk))
            scale = 1.0 / math.sqrt(D)
            flops = 4 * B * Hq * T * T * D / (2 if causal else 1)

            if args.varlen:  # [B * T, H, D] packed views of the same values, B sequences of T tokens
                qp, kp, vp = (t.transpose(1, 2).reshape(B * T, t.shape[1], D) for t in (q, k, v))
                cu = torch.arange(0, B + 1, device=args.device, dtype=torch.int32) * T

                def fwd():
                    return av._varlen_forward(qp, kp, vp, cu, cu, T, T, causal, scale)
            else:
                def fwd():
                    return at._attention_forward(q, k, v, causal, scale)

            def timed(name, fn, **extra):
                ms = time_call(fn, [], q.device).median_ms
                emit(dict(case=label, config=name, ms=ms, tflops=flops / ms / 1e9, status="ok",
                          varlen=bool(args.varlen and name != "cudnn"), **extra))

            try:
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                    timed("cudnn", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                          enable_gqa=Hq != Hk))
            except RuntimeError as e:  # no cuDNN attention here (the CPU smoke run)
                emit(dict(case=label, config="cudnn", status=f"error: {str(e)[:120]}"))
            at.AUTOTUNE = True
            at._FWD_CANDIDATES["d64"] = shipped
            timed("shipped", fwd)
            rule = at.forward_config  # the launch's rule (read at call time) switched off: the autotuner picks
            at.forward_config = lambda *a, **kw: None
            try:
                timed("autotuner", fwd)
            finally:
                at.forward_config = rule
            at.AUTOTUNE = False
            ref = None
            for cfg in [shipped[0]] + [c for c in grid() if c != shipped[0]]:
                name = "x".join(map(str, cfg))
                if time.monotonic() - start > args.budget_s:
                    emit(dict(case=label, config=name, status="skipped (budget)"))
                    continue
                at._FWD_CANDIDATES["d64"] = [cfg]
                try:
                    out, lse = fwd()
                    if q.is_cuda:
                        torch.cuda.synchronize()
                    if ref is None:
                        ref = (out.float(), lse)
                    err_o = float((out.float() - ref[0]).abs().max() / ref[0].abs().max())
                    err_l = float((lse - ref[1]).abs().max())
                    if err_o > 2e-2 or err_l > 1e-3:
                        emit(dict(case=label, config=name, status="mismatch", err_o=err_o, err_lse=err_l))
                        continue
                    timed(name, fwd, err_o=err_o, shipped=cfg in shipped)
                except Exception as e:  # a config that does not build: report it, go on
                    emit(dict(case=label, config=name, status=f"error: {type(e).__name__}: {str(e)[:200]}"))
            at._FWD_CANDIDATES["d64"] = shipped
            at.AUTOTUNE = True
            q = k = v = ref = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
