"""H200 probe: the fused attention backward's preprocess, one launch (delta and the fp32 dQ buffer cleared together,
attention_gluon._fb_prepare) in several launch configs, against the two-launch form (torch.zeros of the buffer,
then the plain 128-row delta pass).

    python scripts/gpu/attention_pre_probe.py --out $OUT/pre_probe.jsonl [--reps 200]

Per shape (B, H, T, D; bf16 O and dO in [B, H, T, D], the buffer [B * H, D, T rounded up to 64] fp32 as
backward_fused sizes it): GPU microseconds a call by CUDA events around `reps` back-to-back calls (each call moves
more bytes than L2 holds, so no flush), three rounds, the median round; and the bytes moved over that time. The
one-launch results are checked against the two-launch form (delta to fp32 rounding, the buffer all zero). One
JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

SHAPES = [(4, 32, 2048, 128), (8, 32, 1024, 128), (4, 32, 4096, 128), (2, 40, 4096, 128), (4, 32, 4096, 64)]
CONFIGS = [(64, 4), (64, 8), (32, 4), (128, 8), (128, 4)]


def _time(fn, reps: int) -> float:
    """Median over three rounds of the mean GPU microseconds a call of `reps` back-to-back calls."""
    fn()
    rounds = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(rounds)


def main() -> None:
    import importlib

    from hearth.kernels import attention_gluon as ag

    attn = importlib.import_module("hearth.kernels.attention")  # the module (the package exports a function)

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    with open(args.out, "w") as f:
        for B, H, T, D in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(0)
            out, do = (torch.randn(B, H, T, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
            n_pad = -(-T // 64) * 64
            delta = torch.empty((B, H, T), device="cuda")
            heads = B * H
            moved = 2 * out.numel() * 2 + heads * D * n_pad * 4 + delta.numel() * 4

            def two_launch():
                acc = torch.zeros((heads, D, n_pad), device="cuda")
                attn._bwd_preprocess(out, do, delta)
                return acc

            two_launch()
            want = delta.clone()
            rows = [dict(shape=[B, H, T, D], form="two_launch", us=_time(two_launch, args.reps))]
            for block, warps in CONFIGS:
                def one_launch(block=block, warps=warps):
                    acc = torch.empty((heads, D, n_pad), device="cuda")
                    ag._fb_prepare(out, do, delta, acc, heads, n_pad, block=block, warps=warps)
                    return acc

                delta.fill_(float("nan"))
                acc = one_launch()
                ok = bool((acc == 0).all()) and torch.allclose(delta, want, rtol=1e-5, atol=1e-4)
                rows.append(dict(shape=[B, H, T, D], form=f"one_launch {block}x{warps}w", ok=ok,
                                 us=_time(one_launch, args.reps)))
            for row in rows:
                row["tb_s"] = moved / row["us"] / 1e6
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
