"""Probe (one Hopper GPU, about a minute): the fused Gluon backward at other (BLOCK_M, NUM_STAGES) configs than
FB_CONFIGS', through attention() and attention_varlen() as a model calls them (the probe knob
HEARTH_ATTN_FB_CONFIG="BLOCK_M,NUM_STAGES" applies to every head_dim, so pick cases of one head_dim).

    python3 scripts/gpu/attention_fb_config_probe.py --configs default,128,2 --out $OUT/fb_config.jsonl
    python3 scripts/gpu/attention_fb_config_probe.py --head-dim 128 --configs default,64,3 --out $OUT/fb_d128.jsonl

Each config runs in its own child process (a wrong barrier schedule would hang the GPU: the child is killed after
--timeout-s and its row says so). In the child, first a correctness gate at a small causal GQA case: dQ / dK / dV
against an fp32 reference (SDPA math on fp32 copies), the error of each over the reference's norm beside
torch's own bf16 SDPA error (hearth's may be at most 2x torch's, as the test suite asks); then fwd+bwd GPU ms
(triton.testing.do_bench, median) and peak MiB at each case. One JSON object per (config, case) to --out and stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# per head_dim, (name, kind, B, Hq, Hk, T or (n_seqs, seq_len), causal): the model-shape suite's cases of that
# head_dim (Llama-3.2-1B's 32 / 8 heads at 64; Qwen3-14B's 40 / 8 and Llama-2-7B's 32 / 32 at 128) and issue 15's
CASES = {
    64: [
        ("Llama-3.2-1B 32/8 d64 T8192 B1 causal", "dense", 1, 32, 8, 8192, True),
        ("B4 H32 T4096 D64 causal", "dense", 4, 32, 32, 4096, True),
        ("B4 H32 T4096 D64 full", "dense", 4, 32, 32, 4096, False),
        ("Llama-3.2-1B 32/8 d64 32 x 1024 packed causal", "varlen", 1, 32, 8, (32, 1024), True),
    ],
    128: [
        ("Qwen3-14B 40/8 d128 T4096 B2 causal", "dense", 2, 40, 8, 4096, True),
        ("B4 H32 T4096 D128 causal", "dense", 4, 32, 32, 4096, True),
        ("B4 H32 T4096 D128 full", "dense", 4, 32, 32, 4096, False),
        ("Qwen3-14B 40/8 d128 8 x 2048 packed causal", "varlen", 1, 40, 8, (8, 2048), True),
    ],
}


def _child(config: str, head_dim: int) -> None:
    import torch
    import triton.testing

    from hearth.kernels.attention import attention
    from hearth.kernels.attention_varlen import attention_varlen

    if config != "default":
        os.environ["HEARTH_ATTN_FB_CONFIG"] = config
    dev = torch.device("cuda")
    torch.manual_seed(0)

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    # gate: B2 Hq8 Hk2 T1024 causal, against fp32 math
    B, Hq, Hk, T = 2, 8, 2, 1024
    q = torch.randn(B, Hq, T, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, Hk, T, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, Hk, T, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, Hq, T, head_dim, device=dev, dtype=torch.bfloat16)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    sdpa(*ref, is_causal=True, enable_gqa=True).backward(dy.float())
    tb = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sdpa(*tb, is_causal=True, enable_gqa=True).backward(dy)
    attention(q, k, v, causal=True).backward(dy)
    gate = {}
    for name, h, t, r in zip(("dq", "dk", "dv"), (q, k, v), tb, ref):
        gate[name] = dict(hearth=rel(h.grad, r.grad), torch_bf16=rel(t.grad, r.grad))
    ok = all(g["hearth"] <= 2 * g["torch_bf16"] + 1e-6 for g in gate.values())
    print(json.dumps(dict(config=config, head_dim=head_dim, case="gate B2 Hq8 Hk2 T1024 causal", ok=ok, gate=gate)), flush=True)
    if not ok:
        return
    for name, kind, B, Hq, Hk, T, causal in CASES[head_dim]:
        if kind == "dense":
            q = torch.randn(B, Hq, T, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(B, Hk, T, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(B, Hk, T, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn_like(q)
            flops = 4 * B * Hq * T * T * head_dim * (0.5 if causal else 1.0) * 3.5

            def fn():
                attention(q, k, v, causal=causal).backward(dy)
        else:
            n, L = T
            total = n * L
            q = torch.randn(total, Hq, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(total, Hk, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(total, Hk, head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn_like(q)
            cu = torch.arange(0, total + 1, L, device=dev, dtype=torch.int32)
            flops = 4 * n * Hq * L * L * head_dim * (0.5 if causal else 1.0) * 3.5

            def fn():
                attention_varlen(q, k, v, cu, cu, L, L, causal=causal).backward(dy)
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, grad_to_none=[q, k, v])
        print(json.dumps(dict(config=config, case=name, ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1),
                              peak_mib=round(peak, 1))), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="default,128,2",
                    help="comma list; 'default' or BLOCK_M,NUM_STAGES pairs (e.g. default,128,2,64,3)")
    ap.add_argument("--out", required=True, help="JSONL file to write")
    ap.add_argument("--timeout-s", type=float, default=150)
    ap.add_argument("--head-dim", type=int, default=64, choices=sorted(CASES),
                    help="the cases' head_dim (the knob applies to every head_dim, so one at a time)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.head_dim)
        return
    parts = args.configs.split(",")
    configs, i = [], 0
    while i < len(parts):
        if parts[i] == "default":
            configs.append("default")
            i += 1
        else:
            configs.append(f"{int(parts[i])},{int(parts[i + 1])}")
            i += 2
    with open(args.out, "w") as out:
        for cfg in configs:
            try:
                res = subprocess.run([sys.executable, __file__, "--out", os.devnull, "--child", cfg,
                                      "--head-dim", str(args.head_dim)],
                                     capture_output=True, text=True, timeout=args.timeout_s)
                lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
                if res.returncode != 0:
                    lines.append(json.dumps(dict(config=cfg, status=f"rc {res.returncode}",
                                                 stderr=res.stderr[-1500:])))
            except subprocess.TimeoutExpired:
                lines = [json.dumps(dict(config=cfg, status=f"timed out after {args.timeout_s} s"))]
            for ln in lines:
                print(ln, flush=True)
                out.write(ln + "\n")


if __name__ == "__main__":
    main()
