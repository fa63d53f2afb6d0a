"""GPU probe: the fused attention backward's last pass, dQ out of its fp32 buffer (attention_gluon.dq_from_acc:
scale, transpose [heads, D, T] -> [.., T, D], cast to bf16, and clear the buffer when a later launch reuses it), in
several launch configs (HEARTH_ATTN_DQ_CONV="BLOCK_T,WARPS"; shipped: DQ_CONV_BLOCK x DQ_CONV_WARPS).

    python scripts/gpu/dq_conv_probe.py --out $OUT/dq_conv.jsonl [--reps 100] [--configs "64,4;128,8"]
    TRITON_INTERPRET=1 python scripts/gpu/dq_conv_probe.py --smoke --out x.jsonl   # CPU, toy cases: checks the script

Per case, the form backward_fused / backward_fused_varlen gives it at a model-shape suite case (its heads a launch:
half the query heads under GQA, FB_ACC_GQA_SPLIT; the packed form's sequences placed DQ_PAD = 64 apart), with and
without the clearing: GPU microseconds a call by CUDA events around `reps` back-to-back calls, three rounds, the
median round (no L2 flush: the packed cases move 4-5x an H100's 50 MB of L2, the dense ones about 1-1.3x, so L2 may
flatter those); the bytes it moves (fp32 read, bf16 written, the fp32
buffer written again when it clears) over that time. Every config's dq is checked against the shipped config's
(bitwise: the same fp32 products cast the same way). One JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

# (label, query heads a launch, head_dim, sequence lengths: one entry = a dense [1, heads, T, D] view)
CASES = [
    ("Qwen3-14B 40/8 d128 T4096 B2 (a launch: 1 x 20 heads)", 20, 128, [4096]),
    ("Llama-3.2-1B 32/8 d64 T8192 B1 (16 heads)", 16, 64, [8192]),
    ("Qwen3-14B 40/8 d128 packed 8 x 2048 (20 heads)", 20, 128, [2048] * 8),
    ("Llama-3.2-1B 32/8 d64 packed 32 x 1024 (16 heads)", 16, 64, [1024] * 32),
]
CONFIGS = "64,4;64,8;128,4;128,8;32,4;256,8"
# --smoke (the CPU under TRITON_INTERPRET=1): the same forms at toy sizes, timed by the host clock
SMOKE_CASES = [("dense toy", 3, 16, [200]), ("packed toy", 2, 16, [70, 0, 130])]


def _host_time(fn, reps: int) -> float:
    """--smoke's timer, off the GPU: attention_pre_probe._time's rounds by the host clock (median over three rounds
    of the mean microseconds a call of `reps` back-to-back calls)."""
    fn()
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        rounds.append((time.perf_counter() - t0) * 1e6 / reps)
    return statistics.median(rounds)


def main(argv=None) -> None:
    from hearth.kernels import attention_gluon as ag

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--configs", default=CONFIGS, help="'BLOCK_T,WARPS;...' (HEARTH_ATTN_DQ_CONV values)")
    ap.add_argument("--smoke", action="store_true", help="CPU (TRITON_INTERPRET=1), toy cases: checks the script")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    cases = SMOKE_CASES if args.smoke else CASES
    if args.smoke:
        timer = _host_time
    else:  # GPU time by CUDA events: the sibling probe's timer
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from attention_pre_probe import _time as timer
    configs = [c.strip() for c in args.configs.split(";") if c.strip()]
    for c in configs:
        ag.dq_conv_config({"HEARTH_ATTN_DQ_CONV": c})  # a malformed config fails here, before any GPU work
    with open(args.out, "w") as f:
        for label, heads, d, lens in cases:
            total = sum(lens)
            packed = len(lens) > 1
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
            n_pad = ag.dq_pad_columns(total, len(lens), 64) if packed else -(-total // 64) * 64
            g = torch.Generator(device=device).manual_seed(0)
            acc0 = torch.randn((heads, d, n_pad), device=device, generator=g)
            acc = acc0.clone()
            dq = torch.empty((1, heads, total, d), dtype=torch.bfloat16, device=device)
            extra = dict(cu_q=cu, max_q=max(lens), pad=64) if packed else {}
            for zero in (False, True):
                moved = heads * d * total * (4 + 2 + (4 if zero else 0))
                ref = None
                for conf in configs:
                    os.environ["HEARTH_ATTN_DQ_CONV"] = conf

                    def call(zero=zero):
                        ag.dq_from_acc(acc, dq, heads, total, 0.5, zero, **extra)

                    acc.copy_(acc0)
                    dq.zero_()
                    ag.dq_from_acc(acc, dq, heads, total, 0.5, False, **extra)
                    ok = True if ref is None else bool(torch.equal(dq, ref))
                    if ref is None:
                        ref = dq.clone()
                    us = timer(call, args.reps)
                    row = dict(case=label, config=conf, zero=zero, ok=ok, us=round(us, 2),
                               tb_s=round(moved / us / 1e6, 3))
                    print(json.dumps(row), flush=True)
                    f.write(json.dumps(row) + "\n")
            os.environ.pop("HEARTH_ATTN_DQ_CONV", None)
            acc = acc0 = dq = ref = None
            if device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
