"""GPU probe for hearth.kernels.attention: correctness vs torch SDPA, then TFLOP/s (< 3 minutes).

Run on a CUDA machine from the repo root:  python scripts/gpu/attention_probe.py [--quick]
Prints one line per case and writes JSONL to $OUT/attention_probe.jsonl (or ./attention_probe.jsonl).

FLOPs: forward 4*B*Hq*T*T*D, halved when causal; fwd+bwd counts 3.5x the forward (bwd = 2.5x).
Timing: triton.testing.do_bench (warmup 25 ms, rep 100 ms), median ms. Correctness is checked
before anything is timed: max |error| of out/dq/dk/dv against an fp32 math reference, next to SDPA's.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import hearth.kernels.attention as attn_mod  # noqa: E402
from hearth.kernels.attention import attention  # noqa: E402

T0 = time.time()
BUDGET_S = 160.0
RESULTS = []


def log(row):
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def make(B, Hq, Hk, T, D, dtype, hf_layout=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if hf_layout:  # [B, T, H, D] storage viewed as [B, H, T, D] (what HF models hand over)
        q = torch.randn(B, T, Hq, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        k = torch.randn(B, T, Hk, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        v = torch.randn(B, T, Hk, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
    else:
        q = torch.randn(B, Hq, T, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(B, Hk, T, D, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(B, Hk, T, D, device="cuda", dtype=dtype, generator=g)
    return [x.requires_grad_() for x in (q, k, v)]


def sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def grads(fn, q, k, v, do):
    for x in (q, k, v):
        x.grad = None
    o = fn(q, k, v)
    o.backward(do)
    return [o.detach()] + [x.grad.detach().clone() for x in (q, k, v)]


def check(name, B, Hq, Hk, T, D, dtype, causal, hf_layout=False):
    q, k, v = make(B, Hq, Hk, T, D, dtype, hf_layout)
    do = torch.randn(B, Hq, T, D, device="cuda", dtype=dtype)
    ours = grads(lambda a, b, c: attention(a, b, c, causal=causal), q, k, v, do)
    theirs = grads(lambda a, b, c: sdpa(a, b, c, causal), q, k, v, do)
    q32, k32, v32 = [x.detach().float().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):  # fp32 math: the reference both are measured against
        ref = grads(lambda a, b, c: sdpa(a, b, c, causal), q32, k32, v32, do.float())
    names = ["out", "dq", "dk", "dv"]
    err_ours = {n: (a.float() - r).abs().max().item() for n, a, r in zip(names, ours, ref)}
    err_sdpa = {n: (a.float() - r).abs().max().item() for n, a, r in zip(names, theirs, ref)}
    ok = all(err_ours[n] <= 2 * err_sdpa[n] + 1e-3 for n in names) and all(
        torch.isfinite(t).all().item() for t in ours
    )
    log(dict(kind="check", case=name, B=B, Hq=Hq, Hk=Hk, T=T, D=D, dtype=str(dtype), causal=causal,
             hf_layout=hf_layout, ok=ok, err_hearth=err_ours, err_sdpa=err_sdpa))
    return ok


def bench(name, B, Hq, Hk, T, D, dtype, causal, provider="hearth", variant=""):
    q, k, v = make(B, Hq, Hk, T, D, dtype)
    do = torch.randn(B, Hq, T, D, device="cuda", dtype=dtype)
    fn = (lambda: attention(q, k, v, causal=causal)) if provider == "hearth" else (lambda: sdpa(q, k, v, causal))
    flops = 4 * B * Hq * T * T * D * (0.5 if causal else 1.0)
    with torch.no_grad():
        ms_f = triton.testing.do_bench(fn, warmup=25, rep=100)

    def fwd_bwd():
        fn().backward(do)

    ms_fb = triton.testing.do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=[q, k, v])
    row = dict(kind="bench", case=name, provider=provider, variant=variant, B=B, Hq=Hq, Hk=Hk, T=T, D=D,
               dtype=str(dtype), causal=causal, fwd_ms=round(ms_f, 4), fwd_tflops=round(flops / ms_f / 1e9, 1),
               fwdbwd_ms=round(ms_fb, 4), fwdbwd_tflops=round(3.5 * flops / ms_fb / 1e9, 1))
    if provider == "hearth":
        row["configs"] = best_configs()
    log(row)


def best_configs():
    out = {}
    for label, tuned in (("fwd", attn_mod._fwd_tuned), ("dkdv", attn_mod._dkdv_tuned), ("dq", attn_mod._dq_tuned)):
        c = getattr(tuned, "best_config", None)
        if c is not None:
            out[label] = f"{c.kwargs.get('BLOCK_M')}x{c.kwargs.get('BLOCK_N')} w{c.num_warps} s{c.num_stages}"
    return out


def inspect_fwd(D=128, causal=True):
    """Compile the forward once with the tuned config; report wgmma use, registers and spills."""
    c = attn_mod._fwd_tuned.best_config
    if c is None:
        return
    B, H, T = 1, 1, 256
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, device="cuda", dtype=torch.float32)
    ck = attn_mod._attn_fwd_kernel[(triton.cdiv(T, c.kwargs["BLOCK_M"]), B * H)](
        q, q, q, out, lse, *q.stride(), *q.stride(), *q.stride(), *out.stride(), 0.1, H, 1, T, T,
        HEAD_DIM=D, CAUSAL=causal, USE_TMA=False, DOT_PREC="tf32", INTERP=False,
        BLOCK_M=c.kwargs["BLOCK_M"], BLOCK_N=c.kwargs["BLOCK_N"], num_warps=c.num_warps, num_stages=c.num_stages,
    )
    ptx = ck.asm.get("ptx", "")
    log(dict(kind="inspect", kernel="fwd", wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
             cp_async_bulk=ptx.count("cp.async.bulk"), cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
             n_regs=getattr(ck, "n_regs", None), n_spills=getattr(ck, "n_spills", None)))


def over_budget():
    return time.time() - T0 > BUDGET_S


def main():
    quick = "--quick" in sys.argv
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    log(dict(kind="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
             date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())))
    bf16 = torch.bfloat16
    # Correctness first (small-ish but ragged, GQA, HF layout, fp16, D=64).
    checks = [
        ("ragged-causal", 2, 8, 8, 1000, 128, bf16, True, False),
        ("ragged-gqa-hf", 2, 8, 2, 777, 128, bf16, False, True),
        ("gqa-40-8-causal-4097", 1, 40, 8, 4097, 128, bf16, True, False),
        ("fp16-d64-causal", 2, 4, 4, 513, 64, torch.float16, True, False),
    ]
    all_ok = True
    for c in checks:
        all_ok &= check(c[0], *c[1:])
    if not all_ok:
        print("CORRECTNESS FAILED: timings below are not meaningful", flush=True)
    # Target shapes (TARGETS.md).
    targets = [
        ("causal-mha", 4, 32, 32, 4096, 128, bf16, True),
        ("noncausal-mha", 4, 32, 32, 4096, 128, bf16, False),
        ("causal-gqa-40-8", 4, 40, 8, 4096, 128, bf16, True),
    ]
    for name, *shape in targets:
        bench(name, *shape)
        inspect_fwd(causal=shape[-1]) if name == "causal-mha" else None
    if quick:
        return finish()
    for name, *shape in targets[:2]:
        if over_budget():
            break
        bench(name, *shape, provider="sdpa")
    # Variant: forward K/V loads through TMA descriptors.
    for name, *shape in targets[:2]:
        if over_budget():
            break
        attn_mod.USE_TMA = True
        try:
            bench(name, *shape, variant="tma")
        except Exception as e:  # report and keep going: the flag is experimental
            log(dict(kind="error", case=name, variant="tma", error=repr(e)[:500]))
        finally:
            attn_mod.USE_TMA = False
    if not over_budget():
        bench("causal-mha-d64", 4, 32, 32, 4096, 64, bf16, True)
    finish()


def finish():
    path = os.path.join(os.environ.get("OUT", "."), "attention_probe.jsonl")
    with open(path, "w") as f:
        for r in RESULTS:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {path} in {time.time() - T0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
