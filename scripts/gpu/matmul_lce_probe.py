"""GPU probe for hearth's matmul and linear_cross_entropy (run on a CUDA machine, < 3 minutes).

    python scripts/gpu/matmul_lce_probe.py [--out benchmarks/probe] [--skip-lce] [--skip-inspect]
    python scripts/gpu/matmul_lce_probe.py --lce-budgets 120,160,200,240 --out DIR   # the chunk-budget sweep only
    python scripts/gpu/matmul_lce_probe.py --tma-desc --out DIR   # TMA host vs device descriptors only
    python scripts/gpu/matmul_lce_probe.py --chunk-gemms --out DIR   # the LCE chunk GEMMs against unchunked ones

1. matmul: correctness against fp32 (every size, and the backward's transposed-view launches), then
   TFLOP/s = 2*M*N*K / time against cuBLAS (torch.mm) at 4096^3, 8192^3 and odd sizes; which kernel
   ran (tma / pointer), the autotuner's pick and every config's autotune time, and the host time per
   call (a shape whose host time exceeds its GPU time is launch-bound, not badly tiled). Target: >= 0.97x cuBLAS at 4096^3 and 8192^3 bf16.
2. linear_cross_entropy fwd+bwd (bf16): loss and gradients against eager PyTorch, median ms
   (triton.testing.do_bench, warmup 25, rep 100, gradients reset each call) and extra peak memory
   during one call: TOTAL (everything the call allocated, weight gradient included, LESSON 8) and
   ACTIVATION (total minus the [V, H] and [N, H] gradients that any implementation allocates).
   Targets: N=8192 H=4096 V=131072 <= 38 ms, <= +128 MiB; H=5120 V=151936 <= 55 ms trainable,
   <= 36 ms frozen, <= +160 MiB.
3. `hearth inspect matmul`: tensor-core instructions in the compiled kernels.
--lce-budgets B1,B2,... (MiB): instead of 1-3, linear_cross_entropy's time and memory at the model-shape
   suite's three cases (`hearth bench linear_cross_entropy --sizes models`) with chunk_rows_for(budget) rows per
   chunk for each budget: a larger logits chunk means fewer read+write passes over the [V, H] weight gradient
   (trainable) and fewer, fuller row-kernel launches (frozen), against more activation memory. What decides
   the default budget (EXTRA_MEMORY_BUDGET, 224 MiB since f589c9c, beside the 768-row cap), which must stay well under
   torch.compile's (it materialises the logits: 2-2.4 GiB of activations at these shapes).
--lce-rows R1,R2,...: as --lce-budgets, but with these exact rows per chunk, at the model-shape cases and the two
   headline trainable cases (N 8192: H 4096 V 131072, H 5120 V 151936). What it asks: the budget sweep had 512-row
   chunks fastest everywhere and 448- and 640-row chunks slower than 384 in the frozen case (69.4 and 69.5 ms
   against 66.6 at Qwen3-14B), which points at the GEMMs' row tiles. Two H200 sweeps (256-640 rows) set
   CHUNK_ROWS_MAX to 512; H100 sweeps of 384-2048 rows (multiples of 256 fastest, trainable time falling with
   rows) moved it to 768, the most whose logits stay within 1/10 of torch.compile's. Writes OUT/lce_rows.json.
--tma-desc: instead of 1-3, the TMA matmul with host descriptors (the default) against the device-descriptor
   kernel (HEARTH_MATMUL_TMA_DESC=device) in the forward's and the backward's operand layouts: median ms, host
   time per call, and the extra peak memory of one call next to the output's size (host: exactly the output;
   device: the output plus the descriptors' per-launch scratch). Writes OUT/tma_desc.json.
--chunk-gemms: instead of 1-3, each GEMM of one linear_cross_entropy chunk alone (times the chunks) against the same
   GEMM unchunked (torch.compile's), at the model-shape cases, with split-K by hand for grad_x and a 2x chunk for
   grad_W (probe_chunk_gemms). Writes OUT/chunk_gemms.json.
Writes OUT/matmul_lce_probe.json and OUT/matmul_lce_probe.png (GPU name, versions, date inside).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
from rich.console import Console
from rich.table import Table

console = Console()
MiB = 1 << 20


def bench(fn, grad_to_none=None) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def probe_matmul(rows: list) -> None:
    mm_mod = importlib.import_module("hearth.kernels.matmul")  # the module (the package re-exports the function)
    from hearth.kernels.matmul import matmul

    table = Table(title="matmul bf16 (TFLOP/s = 2*M*N*K / median time)")
    for col in ("M x N x K", "kernel", "max |err| / ref scale", "hearth TFLOP/s", "cuBLAS TFLOP/s", "ratio", "target"):
        table.add_column(col)
    # (2048, 2048, 8192): 128 tiles of 128x256 < 132 SMs -> only the 128x128 configs are tuned (_prune_few_tiles)
    sizes = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 8192), (1000, 3001, 777), (4097, 4095, 4100), (8192, 1024, 4096),
             (2048, 2048, 8192)]
    for m, n, k in sizes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        t0 = time.time()
        out = matmul(a, b)  # includes autotuning for this shape
        torch.cuda.synchronize()
        tune_s = time.time() - t0
        backend = mm_mod.LAST_BACKEND
        tuner = mm_mod.LAST_TUNER
        best = tuner.best_config if tuner is not None else None
        # every config's autotune median (ms): tells a bad tile choice from a launch-bound shape
        timings = {str(c): round(float(t[0] if isinstance(t, (list, tuple)) else t), 4)
                   for c, t in (getattr(tuner, "configs_timings", None) or {}).items()}
        # host time per call (launch-bound when it exceeds the GPU time)
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        for _ in range(50):
            matmul(a, b)
        host_us = (time.perf_counter() - h0) / 50 * 1e6
        torch.cuda.synchronize()
        ref = a.float() @ b.float()
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        del ref
        t_h = bench(lambda: matmul(a, b))
        t_c = bench(lambda: torch.mm(a, b))
        flop = 2.0 * m * n * k
        tf_h, tf_c = flop / t_h / 1e9, flop / t_c / 1e9
        target = ">= 0.97" if (m, n, k) in ((4096,) * 3, (8192,) * 3) else ""
        ok = err < 1e-2
        table.add_row(f"{m}x{n}x{k}", backend, f"{err:.1e}" + ("" if ok else " FAIL"), f"{tf_h:.0f}", f"{tf_c:.0f}",
                      f"{tf_h / tf_c:.3f}", target)
        rows.append(dict(case="matmul", m=m, n=n, k=k, kernel=backend, rel_err=err, correct=ok, hearth_ms=t_h,
                         cublas_ms=t_c, hearth_tflops=tf_h, cublas_tflops=tf_c, ratio=tf_h / tf_c, first_call_s=tune_s,
                         host_us_per_call=host_us, best_config=str(best), config_ms=timings))
        console.print(f"[dim]{m}x{n}x{k}: {backend} {best} | host {host_us:.0f} us/call vs GPU {t_h * 1e3:.0f} us | "
                      f"autotune ms: {timings}[/]")
    if mm_mod._TMA_BROKEN:
        console.print(f"[bold red]TMA kernel disabled: {mm_mod._TMA_BROKEN}[/]")
    console.print(table)

    # backward: dA = dC @ B^T and dB = A^T @ dC run on transposed views (no copies)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(2048, 1536, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(1536, 1000, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn(2048, 1000, device="cuda", dtype=dtype)
        matmul(a, b).backward(g)
        a32, b32 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        (a32 @ b32).backward(g.double())
        errs = [((x.grad.double() - y.grad).abs().max() / y.grad.abs().max()).item() for x, y in ((a, a32), (b, b32))]
        ok = max(errs) < (2e-2 if dtype != torch.float16 else 5e-3)
        console.print(f"matmul backward {dtype}: rel err dA {errs[0]:.1e} dB {errs[1]:.1e} [{'green' if ok else 'red'}]{'ok' if ok else 'FAIL'}[/]"
                      f" (kernel {mm_mod.LAST_BACKEND}; fp32 runs TF32)")
        rows.append(dict(case="matmul_backward", dtype=str(dtype), rel_err_da=errs[0], rel_err_db=errs[1], correct=ok))


def probe_tma_desc(rows: list) -> None:
    """--tma-desc: the two descriptor modes, same shapes and layouts, one process (the variable is read per launch)."""
    import os

    mm_mod = importlib.import_module("hearth.kernels.matmul")
    from hearth.kernels.matmul import matmul

    table = Table(title="matmul bf16 TMA: host descriptors (default) vs device descriptors")
    for col in ("M x N x K", "layout", "descriptors", "max |err| / ref scale", "ms", "host us/call", "extra MiB", "output MiB"):
        table.add_column(col)
    sizes = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 4096), (2048, 2048, 8192), (512, 512, 512)]
    # NN: a forward; NT: dA = dC @ B^T; TN: dB = A^T @ dC (transposed views, read in place)
    layouts = {"NN": (False, False), "NT": (False, True), "TN": (True, False)}
    try:
        for m, n, k in sizes:
            for name, (a_t, b_t) in layouts.items():
                a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if a_t else torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if b_t else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
                ref = a.float() @ b.float()
                for mode in ("host", "device"):
                    os.environ[mm_mod.TMA_DESC_ENV] = mode
                    warm = matmul(a, b)  # autotunes this shape and layout for this mode
                    backend = mm_mod.LAST_BACKEND
                    del warm
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    out = matmul(a, b)
                    torch.cuda.synchronize()
                    extra = torch.cuda.max_memory_allocated() - base
                    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    del out
                    h0 = time.perf_counter()
                    for _ in range(50):
                        matmul(a, b)
                    host_us = (time.perf_counter() - h0) / 50 * 1e6
                    torch.cuda.synchronize()
                    ms = bench(lambda: matmul(a, b))
                    ok = err < 1e-2 and backend == "tma"
                    out_bytes = m * n * 2
                    table.add_row(f"{m}x{n}x{k}", name, mode, f"{err:.1e}" + ("" if ok else f" FAIL ({backend})"), f"{ms:.4f}",
                                  f"{host_us:.1f}", f"{extra / MiB:.3f}", f"{out_bytes / MiB:.3f}")
                    rows.append(dict(case="tma_desc", m=m, n=n, k=k, layout=name, desc=mode, kernel=backend, rel_err=err,
                                     correct=ok, ms=ms, host_us_per_call=host_us, extra_bytes=extra, output_bytes=out_bytes,
                                     best_config=str(mm_mod.LAST_TUNER.best_config if mm_mod.LAST_TUNER else None)))
    finally:
        os.environ.pop(mm_mod.TMA_DESC_ENV, None)
    console.print(table)


def _lce_check(n, h, v, frozen) -> dict:
    """Loss and gradients at a smaller N against eager fp32 autograd (full logits)."""
    from hearth.kernels.linear_cross_entropy import linear_cross_entropy

    torch.manual_seed(0)
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16) / h ** 0.5
    t = torch.randint(0, v, (n,), device="cuda")
    t[::9] = -100
    xh, wh = x.clone().requires_grad_(), w.clone().requires_grad_(not frozen)
    loss = linear_cross_entropy(xh, wh, t)
    loss.backward()
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_(not frozen)
    ref = torch.nn.functional.cross_entropy(xr @ wr.t(), t, ignore_index=-100)
    ref.backward()
    res = dict(loss_rel_err=abs(loss.item() - ref.item()) / abs(ref.item()),
               grad_input_err=((xh.grad.float() - xr.grad).abs().max() / xr.grad.abs().max()).item())
    if not frozen:
        res["grad_weight_err"] = ((wh.grad.float() - wr.grad).abs().max() / wr.grad.abs().max()).item()
    assert (wh.grad is None) == frozen
    res["correct"] = res["loss_rel_err"] < 1e-2 and max(v for k, v in res.items() if k.startswith("grad")) < 3e-2
    return res


def _lce_time_and_memory(x, w, t, chunk, leaves):
    """(median ms, extra MiB total, MiB of the gradients on `leaves`) of one linear_cross_entropy fwd+bwd
    with `chunk` rows per chunk: a warm-up call, one call for the peak memory, then do_bench."""
    from hearth.kernels.linear_cross_entropy import linear_cross_entropy

    def step():
        linear_cross_entropy(x, w, t, chunk_rows=chunk).backward()

    step()  # warm-up / compile
    for p in leaves:
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    total = (torch.cuda.max_memory_allocated() - before) / MiB
    grads = sum(p.numel() * p.element_size() for p in leaves) / MiB
    for p in leaves:
        p.grad = None
    return bench(step, grad_to_none=leaves), total, grads


def probe_lce(rows: list) -> None:
    from hearth.kernels.linear_cross_entropy import chunk_rows_for

    table = Table(title="linear_cross_entropy fwd+bwd bf16")
    for col in ("N x H x V", "weight", "check (rel err)", "chunk rows", "median ms", "target ms", "extra MiB total", "activation MiB", "target MiB"):
        table.add_column(col)
    # (N, H, V, frozen, target ms, target MiB, chunk_rows): None = the default (chunk_rows_for:
    # <= 768 rows, logits chunk <= 224 MiB); the fixed 384-row cases show the time/memory trade of smaller chunks
    # (more passes over grad_W, a smaller logits chunk; the older 120 MiB rule took 448 rows at V=131072, 384 at
    # V=151936).
    cases = [(8192, 4096, 131072, False, 38.0, 128, None), (8192, 4096, 131072, False, 38.0, 128, 384),
             (8192, 5120, 151936, False, 55.0, 160, None), (8192, 5120, 151936, False, 55.0, 160, 384),
             (8192, 5120, 151936, True, 36.0, 160, None)]
    checked = set()
    for n, h, v, frozen, target_ms, target_mib, chunk in cases:
        if (h, v, frozen) not in checked:
            check = _lce_check(1024, h, v, frozen)
            checked.add((h, v, frozen))
        chunk = chunk or chunk_rows_for(n, v, 2)
        x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16) / h ** 0.5).requires_grad_(not frozen)
        t = torch.randint(0, v, (n,), device="cuda")
        leaves = [x] if frozen else [x, w]
        ms, total, grads = _lce_time_and_memory(x, w, t, chunk, leaves)
        errs = " ".join(f"{k.split('_')[1] if k.startswith('grad') else 'loss'} {val:.1e}" for k, val in check.items() if k != "correct")
        table.add_row(f"{n}x{h}x{v}", "frozen" if frozen else "trainable",
                      f"[{'green' if check['correct'] else 'red'}]{errs}[/]", str(chunk),
                      f"{ms:.2f}", f"<= {target_ms}", f"{total:.0f}", f"{total - grads:.0f}", f"<= {target_mib}")
        rows.append(dict(case="linear_cross_entropy", n=n, h=h, v=v, frozen=frozen, chunk_rows=chunk, median_ms=ms, target_ms=target_ms,
                         extra_total_mib=total, extra_activation_mib=total - grads, target_mib=target_mib, **check))
        del x, w, t
        torch.cuda.empty_cache()
    console.print(table)


# the model-shape suite's linear_cross_entropy cases: (name, N, H, V, frozen)
LCE_MODEL_CASES = [("Qwen3-0.6B", 16384, 1024, 151936, False), ("Llama-3.1-8B", 4096, 4096, 128256, False),
                   ("Qwen3-14B frozen W", 12289, 5120, 151936, True)]


LCE_HEADLINE_CASES = [("headline H4096 V131072", 8192, 4096, 131072, False), ("headline H5120 V151936", 8192, 5120, 151936, False)]


def probe_lce_chunks(rows: list, sizes: list[int], by: str) -> None:
    """linear_cross_entropy fwd+bwd for each chunk size (see the module docstring): by "budget", `sizes` are
    budgets in MiB (chunk_rows_for's rows) at LCE_MODEL_CASES (--lce-budgets); by "rows", exact rows per chunk
    at LCE_MODEL_CASES and LCE_HEADLINE_CASES (--lce-rows)."""
    from hearth.kernels.linear_cross_entropy import chunk_rows_for

    table = Table(title=f"linear_cross_entropy fwd+bwd bf16 by {'chunk budget' if by == 'budget' else 'rows per chunk'}")
    for col in ("case", "budget MiB", "chunk rows", "chunks", "logits chunk MiB", "median ms", "extra MiB total",
                "activation MiB"):
        table.add_column(col)
    cases = LCE_MODEL_CASES if by == "budget" else LCE_MODEL_CASES + LCE_HEADLINE_CASES
    for name, n, h, v, frozen in cases:
        x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16) / h ** 0.5).requires_grad_(not frozen)
        t = torch.randint(0, v, (n,), device="cuda")
        leaves = [x] if frozen else [x, w]
        for size in sizes:
            chunk = chunk_rows_for(n, v, 2, size * MiB) if by == "budget" else size
            ms, total, grads = _lce_time_and_memory(x, w, t, chunk, leaves)
            chunks = -(-n // chunk)
            chunk_mib = min(chunk, n) * v * 2 / MiB
            table.add_row(name, str(size) if by == "budget" else "-", str(chunk), str(chunks), f"{chunk_mib:.0f}",
                          f"{ms:.2f}", f"{total:.0f}", f"{total - grads:.0f}")
            row = dict(case=f"linear_cross_entropy_{by}", name=name, n=n, h=h, v=v, frozen=frozen, chunk_rows=chunk,
                       chunks=chunks, logits_chunk_mib=chunk_mib, median_ms=ms, extra_total_mib=total,
                       extra_activation_mib=total - grads)
            if by == "budget":
                row["budget_mib"] = size
            rows.append(row)
        del x, w, t
        torch.cuda.empty_cache()
    console.print(table)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def probe_chunk_gemms(rows: list, splits: tuple[int, ...] = (2, 4, 8), cases=None, device: str = "cuda") -> None:
    """--chunk-gemms: each GEMM of one linear_cross_entropy chunk (hearth's chunk_rows_for rows, C) timed alone, times
    the number of chunks, against the same GEMM unchunked over all N rows (what torch.compile runs): the logits
    x_c @ W^T, grad_x g_c @ W (a [C, H] output over K = V: few tiles), grad_W += g_c^T @ x_c (K = C: short, and a
    read of grad_W). For grad_x also split-K by hand: the vocabulary cut into s slices, one batched GEMM into s
    [C, H] partials, summed (torch.sum, fp32 inside) into the bf16 output; its relative error (Frobenius, against
    fp32) beside the plain GEMM's. For grad_W also a chunk of 2C rows (the memory a larger chunk would cost). What
    it asks: which chunk GEMM is the gap to torch.compile's 0.88-0.99x in the model-shape suite. cases / device:
    LCE_MODEL_CASES on the GPU unless given (the CPU test runs toy cases)."""
    from hearth.kernels.linear_cross_entropy import chunk_rows_for

    table = Table(title="linear_cross_entropy's chunk GEMMs, bf16: ms per chunk x chunks against the unchunked GEMM")
    for col in ("case", "C x chunks", "GEMM", "chunked ms (total)", "unchunked ms", "ratio", "rel err"):
        table.add_column(col)
    gen = torch.Generator(device=device).manual_seed(0)
    for name, n, h, v, _frozen in cases or LCE_MODEL_CASES:
        c = chunk_rows_for(n, v, 2)
        x = torch.randn(n, h, device=device, dtype=torch.bfloat16, generator=gen)
        w = (torch.randn(v, h, device=device, generator=gen) * h ** -0.5).to(torch.bfloat16)
        big = (torch.randn(n, v, device=device, generator=gen) * 1e-3).to(torch.bfloat16)  # all rows' d/dlogits
        g, xc = big[:c], x[:c]
        logits, gx, gw = torch.empty(c, v, device=device, dtype=torch.bfloat16), torch.empty_like(xc), torch.zeros_like(w)
        ref_gx = g.float() @ w.float()

        def add(gemm, chunk_ms, full_ms, err=None, rows_c=c):
            chunks = -(-n // rows_c)
            total = chunk_ms * chunks
            table.add_row(name, f"{rows_c} x {chunks}", gemm, f"{chunk_ms:.3f} ({total:.2f})",
                          f"{full_ms:.2f}" if full_ms else "", f"{full_ms / total:.3f}" if full_ms else "",
                          "" if err is None else f"{err:.2e}")
            rows.append(dict(case=f"chunk_gemms {name}", n=n, h=h, v=v, chunk_rows=rows_c, gemm=gemm, chunk_ms=chunk_ms,
                             chunked_total_ms=total, unchunked_ms=full_ms, rel_err=err))

        add("logits x_c @ W^T", bench(lambda: torch.mm(xc, w.t(), out=logits)), bench(lambda: torch.mm(x, w.t())))
        gx_full = bench(lambda: torch.mm(big, w))
        # gx holds the last timed call's result when its error is read (bench runs the call many times)
        add("grad_x g_c @ W", bench(lambda: torch.mm(g, w, out=gx)), gx_full, _rel_err(gx, ref_gx))
        for split in splits:
            if v % split:
                continue
            gs, ws = g.view(c, split, v // split).transpose(0, 1), w.view(split, v // split, h)

            def split_k(gs=gs, ws=ws):
                torch.sum(torch.bmm(gs, ws), 0, out=gx)

            add(f"grad_x split-K {split} (bmm + sum)", bench(split_k), gx_full, _rel_err(gx, ref_gx))
        gw_full = bench(lambda: torch.mm(big.t(), x))
        add("grad_W += g_c^T @ x_c", bench(lambda: gw.addmm_(g.t(), xc)), gw_full)
        if 2 * c <= n:
            g2, x2 = big[:2 * c], x[:2 * c]
            add("grad_W += g_c^T @ x_c", bench(lambda: gw.addmm_(g2.t(), x2)), gw_full, rows_c=2 * c)
    console.print(table)


def _positive_ints(parser, flag: str, text: str | None, what: str, unit: str) -> list[int] | None:
    """`text` as a comma list of positive ints, or None when the flag was not given; parser.error otherwise."""
    if not text:
        return None
    try:
        values = [int(b) for b in text.split(",")]
    except ValueError:
        parser.error(f"{flag}: a comma list of whole {unit}, got {text!r}")
    if any(b <= 0 for b in values):
        parser.error(f"{flag}: {what} must be positive, got {text!r}")
    return values


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mm = [r for r in rows if r["case"] == "matmul"]
    if not mm:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in mm]
    xs = range(len(mm))
    ax.bar([i - 0.2 for i in xs], [r["hearth_tflops"] for r in mm], width=0.4, label="hearth matmul")
    ax.bar([i + 0.2 for i in xs], [r["cublas_tflops"] for r in mm], width=0.4, label="cuBLAS (torch.mm)")
    ax.set_xticks(list(xs), labels, rotation=20, fontsize=8)
    ax.set_ylabel("TFLOP/s (bf16)")
    ax.set_title(f"matmul on {torch.cuda.get_device_name()}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/probe"))
    parser.add_argument("--skip-lce", action="store_true")
    parser.add_argument("--skip-inspect", action="store_true")
    parser.add_argument("--tma-desc", action="store_true",
                        help="run only the TMA host- vs device-descriptor comparison (module docstring)")
    parser.add_argument("--lce-rows", default=None,
                        help="comma list of rows per chunk: run only the chunk-rows sweep (module docstring)")
    parser.add_argument("--chunk-gemms", action="store_true",
                        help="run only the timing of linear_cross_entropy's chunk GEMMs against unchunked ones (module docstring)")
    parser.add_argument("--lce-budgets", default=None,
                        help="comma list of chunk budgets in MiB: run only the chunk-budget sweep (module docstring)")
    args = parser.parse_args()
    budgets = _positive_ints(parser, "--lce-budgets", args.lce_budgets, "budgets", "MiB")
    chunk_rows = _positive_ints(parser, "--lce-rows", args.lce_rows, "rows", "rows")
    if not torch.cuda.is_available():
        console.print("[bold red]this probe needs a CUDA GPU[/]")
        return 2
    start = time.time()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    console.print(meta)
    rows: list = []

    def save(name: str) -> None:
        """rows (with meta) as JSON to args.out/name, and say so."""
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / name).write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
        console.print(f"wrote {args.out}/{name} ({time.time() - start:.0f} s)")

    if args.chunk_gemms:
        probe_chunk_gemms(rows)
        save("chunk_gemms.json")
        return 0
    if args.tma_desc:
        probe_tma_desc(rows)
        save("tma_desc.json")
        return 0 if all(r["correct"] for r in rows) else 1
    # --lce-rows, else --lce-budgets: the chunk sweep alone
    for sizes, kind, name in ((chunk_rows, "rows", "lce_rows.json"), (budgets, "budget", "lce_budgets.json")):
        if sizes:
            probe_lce_chunks(rows, sizes, kind)
            save(name)
            return 0
    probe_matmul(rows)
    console.print(f"[dim]matmul done at {time.time() - start:.0f} s[/]")
    if not args.skip_lce:
        probe_lce(rows)
        console.print(f"[dim]linear_cross_entropy done at {time.time() - start:.0f} s[/]")
    save("matmul_lce_probe.json")
    plot(rows, args.out / "matmul_lce_probe.png")
    rc = 0 if all(r.get("correct", True) for r in rows) else 1
    if not args.skip_inspect:
        res = subprocess.run([sys.executable, "-m", "hearth.cli", "inspect", "matmul", "--shape", "4096x4096x4096",
                              "--json", str(args.out / "inspect_matmul.json")])
        rc = rc or res.returncode
    console.print(f"wrote {args.out}/  ({time.time() - start:.0f} s total), exit {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
