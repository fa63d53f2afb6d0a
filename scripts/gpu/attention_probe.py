"""GPU probe for hearth.kernels.attention: correctness vs torch SDPA, then TFLOP/s (< 3 minutes).

Run on a CUDA machine from the repo root:  python scripts/gpu/attention_probe.py [--quick]
Without a GPU: python scripts/gpu/attention_probe.py --ptxas [D] [bf16|fp16|fp32] [varlen] prints, per candidate
config, what ptxas makes of it for sm_90a (wgmma, cp.async/TMA, registers, spill bytes); `varlen`: the
VARLEN=True variants (attention_varlen's packed sequences) instead of the dense ones.
(--quick: correctness checks + the three target shapes only). Env HEARTH_ATTN_TMA=1 /
HEARTH_ATTN_FUSED_DQ=1 make TMA / the atomic-dQ backward the main variant. Prints one JSON line per case and writes $OUT/attention_probe.jsonl and .png (or ./).
Order: checks, target shapes (autotuned), fused-dQ variant, TMA variant, SDPA baseline, D=64; later parts are skipped
past a 170 s budget (Triton's cache makes a rerun faster).

FLOPs: forward 4*B*Hq*T*T*D, halved when causal; fwd+bwd counts 3.5x the forward (bwd = 2.5x).
Timing: triton.testing.do_bench (warmup 25 ms, rep 100 ms), median ms. Correctness is checked
before anything is timed: max |error| of out/dq/dk/dv against an fp32 math reference must be within
2x (+ a small per-dtype slack) of PyTorch's plain math in the same dtype; SDPA's error is printed beside it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
attn_mod = importlib.import_module("hearth.kernels.attention")  # noqa: E402
from hearth.kernels.attention import attention  # noqa: E402

T0 = time.time()
BUDGET_S = 170.0
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


def math_attention(q, k, v, causal):
    """Plain PyTorch math in the inputs' dtype (the flash-attention tests' low-precision baseline)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        t = q.shape[2]
        s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


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
    lowp = grads(lambda a, b, c: math_attention(a, b, c, causal), q, k, v, do)
    q32, k32, v32 = [x.detach().float().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):  # fp32 math: the reference both are measured against
        ref = grads(lambda a, b, c: sdpa(a, b, c, causal), q32, k32, v32, do.float())
    names = ["out", "dq", "dk", "dv"]
    err_ours = {n: (a.float() - r).abs().max().item() for n, a, r in zip(names, ours, ref)}
    err_sdpa = {n: (a.float() - r).abs().max().item() for n, a, r in zip(names, theirs, ref)}
    err_math = {n: (a.float() - r).abs().max().item() for n, a, r in zip(names, lowp, ref)}
    # flash-attention's bound: within 2x of PyTorch's own low-precision math (+ small slack)
    slack = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(dtype, 1e-5)  # as tests/kernels/test_attention.py
    ok = all(err_ours[n] <= 2 * err_math[n] + slack for n in names) and all(
        torch.isfinite(t).all().item() for t in ours
    )
    log(dict(kind="check", case=name, B=B, Hq=Hq, Hk=Hk, T=T, D=D, dtype=str(dtype), causal=causal,
             hf_layout=hf_layout, ok=ok, err_hearth=err_ours, err_torch_math=err_math, err_sdpa=err_sdpa))
    return ok


def bench(name, B, Hq, Hk, T, D, dtype, causal, provider="hearth", variant=""):
    q, k, v = make(B, Hq, Hk, T, D, dtype)
    do = torch.randn(B, Hq, T, D, device="cuda", dtype=dtype)
    fn = (lambda: attention(q, k, v, causal=causal)) if provider == "hearth" else (lambda: sdpa(q, k, v, causal))
    sanity = {}
    if provider == "hearth":  # the tuned configs on the timed tensors, against SDPA (same dtype)
        ours = grads(lambda a, b, c: attention(a, b, c, causal=causal), q, k, v, do)
        theirs = grads(lambda a, b, c: sdpa(a, b, c, causal), q, k, v, do)
        sanity = {n: round((a.float() - b.float()).abs().max().item(), 5)
                  for n, a, b in zip(["out", "dq", "dk", "dv"], ours, theirs)}
        del ours, theirs
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
        row["maxdiff_vs_sdpa"] = sanity
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


def ptxas_report(head_dim=128, dtype="bf16", varlen=False):
    """--ptxas (no GPU needed): compile every candidate config for sm_90a ahead of time and print
    wgmma / cp.async / TMA counts and ptxas registers and spill bytes, as the run-time specialisation
    would see them (unit head-dim strides, 16-divisible pointers, strides and lengths)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    element_size = 4 if dtype == "fp32" else 2
    prec = "ieee" if dtype == "fp32" else "tf32"
    kernels = [("fwd", attn_mod._attn_fwd_kernel, attn_mod._FWD_CANDIDATES),
               ("dkdv", attn_mod._attn_bwd_dkdv_kernel, attn_mod._DKDV_CANDIDATES),
               ("dq", attn_mod._attn_bwd_dq_kernel, attn_mod._DQ_CANDIDATES)]
    kernels.append(("dkdv+dq", attn_mod._attn_bwd_dkdv_kernel, attn_mod._DKDV_CANDIDATES))
    for causal in (True, False):
        for use_tma in ((False,) if varlen else (False, True)):  # attention_varlen uses the pointer path only
            for label, fn, table in kernels:
                for bm, bn, warps, stages in table[attn_mod._size_class(head_dim, element_size)]:
                    consts = dict(HEAD_DIM=head_dim, CAUSAL=causal, USE_TMA=use_tma, DOT_PREC=prec, INTERP=False,
                                  BLOCK_M=bm, BLOCK_N=bn)
                    if label.startswith("dkdv"):
                        consts["FUSED_DQ"] = label == "dkdv+dq"
                    consts.update({n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("d")})
                    consts["VARLEN"] = varlen
                    if not varlen:  # the dense launch passes no offsets: None, a constexpr
                        consts.update(CuSeqQ=None, CuSeqK=None)
                    src = attn_mod.offline_source(fn, consts, dtype)
                    name = f"{'varlen ' if varlen else ''}{label} causal={causal} tma={use_tma} {bm}x{bn} w{warps} s{stages}"
                    try:
                        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                            options=dict(num_warps=warps, num_stages=stages))
                    except Exception as e:
                        log(dict(kind="ptxas", config=name, error=repr(e)[:300]))
                        continue
                    ptx = ck.asm["ptx"]
                    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                        f.write(ptx)
                    info = subprocess.run([os.path.join(bin_dir, "ptxas"), "-arch=sm_90a", "-v", f.name, "-o",
                                           os.devnull], capture_output=True, text=True).stderr
                    os.unlink(f.name)
                    regs = re.search(r"Used (\d+) registers", info)
                    spills = re.search(r"(\d+) bytes spill stores", info)
                    log(dict(kind="ptxas", config=name, wgmma=ptx.count("wgmma.mma_async"),
                             cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
                             tma=ptx.count("cp.async.bulk.tensor"), regs=int(regs.group(1)) if regs else None,
                             spill_bytes=int(spills.group(1)) if spills else None, smem=ck.metadata.shared))


def over_budget():
    return time.time() - T0 > BUDGET_S


def main():
    if "--ptxas" in sys.argv:  # e.g. --ptxas 64 fp16
        rest = sys.argv[sys.argv.index("--ptxas") + 1:]
        ptxas_report(int(rest[0]) if rest else 128, rest[1] if len(rest) > 1 else "bf16", "varlen" in rest[2:])
        return
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
    attn_mod.AUTOTUNE = False  # checks use each list's first config: fewer compiles (the probe has < 3 min)
    for c in checks:
        all_ok &= check(c[0], *c[1:])
    attn_mod.AUTOTUNE = True
    if not all_ok:
        print("CORRECTNESS FAILED: timings below are not meaningful", flush=True)
    # The published target shapes.
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
    # Variant: dQ accumulated with fp32 atomics inside the dK/dV kernel (5 matmuls instead of 7).
    for name, *shape in targets:
        if over_budget():
            break
        attn_mod.FUSED_DQ = True
        try:
            bench(name, *shape, variant="fused-dq")
        except Exception as e:
            log(dict(kind="error", case=name, variant="fused-dq", error=repr(e)[:500]))
        finally:
            attn_mod.FUSED_DQ = False
    # Variant: every streamed tile (fwd K/V, dK/dV's Q/dO, dQ's K/V) through TMA descriptors.
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
    for name, *shape in targets[:2]:
        if over_budget():
            break
        bench(name, *shape, provider="sdpa")
    if not over_budget():
        bench("causal-mha-d64", 4, 32, 32, 4096, 64, bf16, True)
    if over_budget():
        print(f"stopped early: over the {BUDGET_S:.0f}s budget (compiles are cached; rerun for the rest)", flush=True)
    finish()


def finish():
    out_dir = os.environ.get("OUT", ".")
    path = os.path.join(out_dir, "attention_probe.jsonl")
    with open(path, "w") as f:
        for r in RESULTS:
            f.write(json.dumps(r) + "\n")
    plot(os.path.join(out_dir, "attention_probe.png"))
    print(f"wrote {path} in {time.time() - T0:.0f}s", flush=True)


def plot(path):
    """Bar chart of TFLOP/s per case and provider/variant (forward and forward+backward)."""
    rows = [r for r in RESULTS if r["kind"] == "bench"]
    if not rows:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['case']}\n{r['provider']}{'-' + r['variant'] if r['variant'] else ''}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
    ax.bar([i - 0.2 for i in x], [r["fwd_tflops"] for r in rows], 0.4, label="fwd")
    ax.bar([i + 0.2 for i in x], [r["fwdbwd_tflops"] for r in rows], 0.4, label="fwd+bwd")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("TFLOP/s (4BHT^2D, /2 causal, x3.5 fwd+bwd)")
    ax.set_title(f"hearth attention on {torch.cuda.get_device_name()}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
