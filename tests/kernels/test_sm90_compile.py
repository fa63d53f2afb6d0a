"""Compile kernels for the H200 (sm_90) on this GPU-less machine, every constexpr branch that changes
types: the interpreter runs Python and never type-checks a kernel, so a loop-carried variable that
changes type only when a constexpr branch is taken (the softcap bug: the row loop's int64 `r` rebound
to fp32) passes every CPU test and fails to compile on the GPU. triton.compile for GPUTarget("cuda",
90, 32) with Triton's bundled ptxas needs no GPU; it runs in a subprocess because TRITON_INTERPRET=1
(set for the CPU tests) replaces @triton.jit functions."""

from __future__ import annotations

from tests.kernels.offline import run_offline

_SCRIPT = r"""
import importlib, itertools, json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import triton

ce = importlib.import_module("hearth.kernels.cross_entropy")
target = GPUTarget("cuda", 90, 32)
done, failed = [], []
sig = {"logits_ptr": "*bf16", "grad_ptr": "*bf16", "target_ptr": "*i64", "loss_ptr": "*fp32", "scale_ptr": "*fp32",
       "gate_ptr": "*i32", "n_rows": "i32", "n_cols": "i32", "stride_logits": "i32", "stride_grad": "i32", "ignore_index": "i32",
       "label_smoothing": "fp32", "z_loss": "fp32", "softcap": "fp32", "scale_value": "fp32"}
# every option alone and all together, with and without the gradient pass, pipelined (the GPU config) or not
flag_sets = [dict(HAS_SOFTCAP=s, HAS_SMOOTHING=m, HAS_ZLOSS=z) for s, m, z in
             [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1)]]
# GATED: cross_entropy's default (the target check gates the kernel); ungated: linear_cross_entropy's plain loss
cases = [(flags, write_grad, ss, True) for flags, write_grad, ss in itertools.product(flag_sets, (0, 1), ((1, 0), (3, 1)))]
cases += [(flag_sets[0], write_grad, ss, False) for write_grad, ss in itertools.product((0, 1), ((1, 0), (3, 1)))]
for flags, write_grad, (stages, scale_mode), gated in cases:
    const = dict(BLOCK=1024, WRITE_GRAD=write_grad, SCALE_MODE=scale_mode, NUM_STAGES=stages, GATED=gated,
                 **{k: bool(v) for k, v in flags.items()})
    s = dict(sig); s.update({k: "constexpr" for k in const})
    label = ",".join(f"{k}={v}" for k, v in const.items())
    try:
        triton.compile(ASTSource(fn=ce._ce_rows_kernel, signature=s, constexprs=const), target=target,
                       options={"num_warps": 4, "num_stages": stages})
        done.append(label)
    except Exception as e:
        failed.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}")
print(json.dumps({"done": done, "failed": failed}))
"""


def test_cross_entropy_row_kernel_compiles_for_sm90_with_every_option():
    out = run_offline(_SCRIPT)
    assert not out["failed"], "\n".join(out["failed"])
    assert len(out["done"]) == 24  # 20 gated (every option) + 4 ungated


_SOFTMAX_ROWS_SCRIPT = r"""
import importlib, json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hearth import inspect as hi

sm = importlib.import_module("hearth.kernels.softmax")
out = []
# the widest rows each kernel is offered for: the most registers and shared memory
for fn, n_inputs, block in ((sm._softmax_fwd_rows_kernel, 1, 32768), (sm._softmax_bwd_rows_kernel, 2, 16384)):
    for dt, itemsize in (("bf16", 2), ("fp32", 4)):
        for cand in sm._onepass_pick_candidates(block, 32, itemsize, n_inputs):
            if isinstance(cand, int):
                continue
            per_sm, warps, stages = cand
            sig = {n: (f"*{dt}" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
            sig.update(BLOCK="constexpr", NUM_STAGES="constexpr")
            # pointers, row strides and the width divisible by 16, as a launch at 32000 columns specialises them
            attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                     if n.endswith("_ptr") or n.startswith("stride") or n == "n_cols"}
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": block, "NUM_STAGES": stages},
                                         attrs=attrs), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": warps, "num_stages": stages})
            r = hi.report_compiled("softmax rows", k, sass=False)
            out.append(dict(label=f"{fn.__name__} {dt} {block} {cand}", per_sm=per_sm, warps=warps, regs=r.registers,
                            spill=r.spill_bytes, smem=r.shared_bytes, cp_async=len(re.findall(r"cp\.async", k.asm["ptx"]))))
print(json.dumps(out))
"""


def test_softmax_persistent_rows_kernel_builds_for_sm90_pipelined_without_spills():
    """Every persistent one-pass candidate the forward (32768 columns) and backward (16384) offer, built for the
    H200: the row loads are pipelined (cp.async), nothing spills, and per_sm programs fit an SM's registers and
    shared memory."""
    rows = run_offline(_SOFTMAX_ROWS_SCRIPT)
    # forward at 32768: bf16 3 candidates, fp32 2; backward at 16384 (y and dy pipelined): bf16 3, fp32 2
    assert len(rows) == 10, rows
    for r in rows:
        assert r["spill"] == 0 and r["cp_async"] > 0, r
        if r["regs"] is not None:  # cuobjdump's figure (absent where the bundled cuobjdump is)
            assert r["per_sm"] * r["regs"] * 32 * r["warps"] <= 65536, r
        assert r["per_sm"] * r["smem"] <= 227 * 1024, r


_MATMUL_TMA_SCRIPT = r"""
import importlib, itertools, json, re, torch
from hearth import inspect as hi

mm = importlib.import_module("hearth.kernels.matmul")
out = []
for desc, cfg, (a_t, b_t) in itertools.chain(
        # the default kernel (host descriptors): the two tile families offline_kernels reports, every layout
        itertools.product(["host"], (mm._TMA_CONFIGS[0], mm._TMA_CONFIGS[4]), itertools.product((False, True), repeat=2)),
        [("device", mm._TMA_CONFIGS[0], (True, True))]):  # HEARTH_MATMUL_TMA_DESC=device still builds
    k = mm.compile_tma_offline(90, torch.bfloat16, cfg, a_t=a_t, b_t=b_t, desc=desc)
    r = hi.report_compiled("matmul tma", k, sass=False)
    ptx = k.asm["ptx"]
    out.append(dict(desc=desc, a_t=a_t, b_t=b_t, tile=[cfg.kwargs[n] for n in ("BLOCK_M", "BLOCK_N", "BLOCK_K")],
                    wgmma=r.ptx["wgmma"], tma_copies=len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                    spill=r.spill_bytes, regs=r.registers, smem=r.shared_bytes,
                    scratch=k.metadata.global_scratch_size, tensormap_ops=len(re.findall(r"tensormap", ptx)),
                    descs=len(k.metadata.tensordesc_meta or [])))
print(json.dumps(out))
"""


def test_matmul_tma_kernel_builds_for_sm90_with_host_descriptors_in_every_layout():
    """The TMA matmul as the launcher runs it by default: TensorDescriptor arguments typed
    tensordesc<bf16[block]> (block shapes per config and layout, _block_shapes), for the H200, in all four
    operand layouts: wgmma and TMA copies, no spills, and no global scratch (the host descriptors'
    point: the device-descriptor kernel needs scratch for the descriptors it writes, every launch)."""
    rows = run_offline(_MATMUL_TMA_SCRIPT)
    assert len(rows) == 9, rows
    for r in rows:
        assert r["wgmma"] > 0 and r["tma_copies"] > 0 and r["spill"] == 0, r
        assert r["smem"] <= 232448, r  # sm_90's opt-in shared memory per block
        if r["regs"] is not None:
            assert r["regs"] <= 255, r
        if r["desc"] == "host":
            # three CUtensorMaps filled by the launcher, nothing written or fenced on the device
            assert r["descs"] == 3 and r["scratch"] == 0 and r["tensormap_ops"] == 0, r
        else:
            assert r["scratch"] > 0 and r["tensormap_ops"] > 0, r
