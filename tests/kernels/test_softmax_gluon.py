"""hearth.kernels.softmax_gluon, the cluster softmax for wide rows (branch; not routed). No interpreter runs
Gluon or inline PTX, so on the CPU the kernel is built offline for sm_90 and its build is checked; its values
are checked on a Hopper GPU against an fp64 reference, within the 2x-PyTorch rule."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.kernels.offline import run_offline
from tests.kernels.tolerance import HAS_CUDA, assert_close

sg = importlib.import_module("hearth.kernels.softmax_gluon")

_BUILD_SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from hearth import inspect as hi
from hearth.kernels import softmax_gluon as sg

n, dt, ctas, pipelined = int(sys.argv[1]), sys.argv[2], (int(sys.argv[3]) or None), sys.argv[4] == "1"
ctas, p, warps = sg.config(n, ctas)
const = sg.constexprs(ctas, p, warps, pipelined)
fn = sg._softmax_fwd_cluster_pipelined_kernel if pipelined else sg._softmax_fwd_cluster_kernel
ints = ("stride_x", "stride_y") + (("n_rows",) if pipelined else ()) + ("n_cols", "never")
sig = {"X": f"*{dt}", "Y": f"*{dt}", **{k: "i32" for k in ints}, **{k: "constexpr" for k in const}}
# as a launch specializes them on 16-byte aligned rows: the pointers and these ints divisible by 16
aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
           if name in ("X", "Y", "stride_x", "stride_y", "n_cols")}
k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=const, attrs=aligned),
                   target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": warps, "num_ctas": ctas,
                            **({"maxnreg": sg.PIPELINED_MAXNREG} if pipelined else {})})
ptx = k.asm["ptx"]
own = "\n".join(line for line in ptx.splitlines() if "cluster" not in line and "global_smem;" not in line)
rep = hi.report_compiled("softmax_gluon", k)
print(json.dumps(dict(
    ctas=ctas, p=p, warps=warps, shared=k.metadata.shared, spills=rep.spill_bytes, regs=rep.registers,
    cluster=f".reqnctapercluster {ctas}" in ptx, mapa=ptx.count("mapa.shared::cluster"),
    st_cluster=ptx.count("st.shared::cluster"), barriers=ptx.count("barrier.cluster"),
    cp_async=ptx.count("cp.async.ca") + ptx.count("cp.async.cg"),
    # the compiler's own shared-memory addresses (its reduction scratch), outside the inline PTX
    scratch=sorted({int(o) for o in re.findall(r"\[global_smem\+(\d+)\]", own)}),
    bare=own.count("[global_smem]"))))
"""


@pytest.mark.parametrize("n, dtype, ctas, pipelined", [
    (262144, "bf16", 0, 0), (151936, "fp32", 0, 0), (65536, "fp16", 0, 0), (262144, "bf16", 8, 0),
    (262144, "bf16", 0, 1), (151936, "fp32", 0, 1)],
    ids=["262144-bf16", "151936-fp32", "65536-fp16", "262144-bf16-8ctas", "pipelined-262144-bf16",
         "pipelined-151936-fp32"])
def test_sm90_build_exchanges_through_slots_ahead_of_the_compilers_scratch(n, dtype, ctas, pipelined):
    """The kernels build for sm_90 as a cluster (.reqnctapercluster), store their pair into every CTA's slots
    (one mapa + st.shared::cluster per CTA) between cluster barriers (arrive at start, wait, arrive.release,
    wait.acquire), and the compiler's own shared memory (the reduction scratch, and the pipelined kernel's
    row buffers, filled by cp.async) lies past the slot buffer, which the inline PTX addresses at
    global_smem + 0. At config's pick nothing spills; 8 CTAs at 262144 columns (64 values a thread) spill a
    little, which is what the pick avoids."""
    r = run_offline(_BUILD_SCRIPT, (str(n), dtype, str(ctas), str(pipelined)))[0]
    assert r["cluster"] and r["mapa"] == r["ctas"] and r["st_cluster"] == r["ctas"], r
    assert r["barriers"] == 4, r
    assert (r["cp_async"] > 0) == bool(pipelined), r
    slot_bytes = sg.SLOT_FLOATS * 4
    assert r["scratch"] and min(r["scratch"]) >= slot_bytes and r["bare"] == 0, r
    assert r["shared"] > slot_bytes, r
    if ctas == 0:
        assert r["spills"] == 0, r
    assert r["regs"] <= 65536 // (32 * r["warps"]), r


def test_config_covers_the_row_in_power_of_two_parts():
    for n in (32769, 40000, 65536, 131072, 151936, 262144):
        ctas, p, warps = sg.config(n)
        assert ctas in (2, 4, 8, 16) and p & (p - 1) == 0 and ctas * p >= n > (ctas // 2) * p, (n, ctas, p)
        assert p // (32 * warps) <= sg.ELEMENTS_PER_THREAD, (n, p, warps)
    assert sg.config(262144) == (16, 16384, 16)
    assert sg.config(262144, 8) == (8, 32768, 16)
    with pytest.raises(ValueError, match="ctas"):
        sg.config(65536, 3)


def test_exchange_ptx_stores_one_pair_per_cta_and_reads_them_all():
    for ctas in (2, 16):
        text = sg.exchange_ptx(ctas)
        assert text.count("st.shared::cluster.v2.f32") == ctas and text.count("mapa.shared::cluster") == ctas
        assert text.count("ld.shared.v2.f32") == ctas
        assert text.index("barrier.cluster.wait.aligned") < text.index("st.shared::cluster")
        assert text.index("st.shared::cluster") < text.index("barrier.cluster.arrive.release")
        # the persistent kernel's: no opening wait (START_SYNC has it), a slot region picked by $4
        rows = sg.exchange_ptx(ctas, parity=True)
        assert "barrier.cluster.wait.aligned" not in rows and f"mul.lo.u32 sa, $4, {8 * ctas};" in rows
    assert sg.START_SYNC.index("arrive") < sg.START_SYNC.index("wait") and "wait" not in sg.START


def test_cp_async_ok_needs_16_byte_rows():
    """The pipelined kernel's 16-byte row copies: start, row stride and row length in multiples of 16 bytes."""
    x = torch.zeros(4, 65536 + 8, dtype=torch.bfloat16)
    assert sg.cp_async_ok(x) and sg.cp_async_ok(x[:, :65536])
    assert not sg.cp_async_ok(x[:, : 65536 + 7]) and not sg.cp_async_ok(x[:, 1:65537])
    assert not sg.cp_async_ok(torch.zeros(4, 65536 + 9, dtype=torch.bfloat16)[:, :65536])  # stride 65545


def test_supported_and_bad_input_name_the_argument():
    assert sg.supported((9, 0), torch.bfloat16, 262144) and not sg.supported((8, 0), torch.bfloat16, 262144)
    assert not sg.supported((9, 0), torch.bfloat16, 4096) and not sg.supported(None, torch.float32, 65536)
    with pytest.raises(ValueError, match="x: the cluster softmax serves Hopper"):
        sg.softmax_fwd(torch.zeros(2, 65536))  # a CPU tensor
    with pytest.raises(ValueError, match="x must be 2-D"):
        sg.softmax_fwd(torch.zeros(2, 3, 65536))
    if HOPPER:
        with pytest.raises(ValueError, match="clusters must be a positive int"):
            sg.softmax_fwd(torch.zeros(2, 65536, device="cuda"), pipelined=True, clusters=0)


# ---------------------------------------------------------------- GPU (H200)
HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
hopper_only = pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.x (Hopper)")


@hopper_only
@pytest.mark.parametrize("pipelined", [False, True], ids=["row-per-cluster", "pipelined"])
@pytest.mark.parametrize("rows, n, dtype, ctas", [
    (3, 262144, torch.bfloat16, None), (5, 151936, torch.bfloat16, None), (4, 65536 + 7, torch.float16, None),
    (2, 40000, torch.float32, None), (3, 262144, torch.bfloat16, 8), (4, 131072, torch.bfloat16, 16)])
def test_gpu_matches_reference(rows, n, dtype, ctas, pipelined):
    """Against softmax in fp64 of the same values, within 2x PyTorch's own error in `dtype`; one row with a
    large spread, one with a tail of -inf (masked parts: a CTA whose columns are all -inf or past n)."""
    g = torch.Generator(device="cpu").manual_seed(n)
    x = (torch.randn(rows, n, generator=g) * 4).to(dtype)
    x[0, : n // 3] -= 40
    x[-1, n // 2:] = float("-inf")
    x = x.cuda()
    y = sg.softmax_fwd(x, ctas=ctas, pipelined=pipelined)
    ref = torch.softmax(x.double(), -1)
    assert_close(y, ref, dtype, msg="cluster softmax", baseline=torch.softmax(x, -1))
    assert torch.equal(y[-1, n // 2:], torch.zeros_like(y[-1, n // 2:]))


@hopper_only
@pytest.mark.parametrize("clusters", [1, 3, None])
def test_gpu_pipelined_walks_every_row(clusters):
    """The persistent kernel with fewer clusters than rows (each walks rows c, c + G, ...): every row right."""
    x = (torch.randn(37, 100000, device="cuda") * 3).to(torch.bfloat16)
    y = sg.softmax_fwd(x, pipelined=True, clusters=clusters)
    assert_close(y, torch.softmax(x.double(), -1), torch.bfloat16, msg=f"clusters={clusters}",
                 baseline=torch.softmax(x, -1))


@hopper_only
def test_gpu_reads_rows_through_their_stride_and_handles_zero_rows():
    x = torch.randn(4, 70000, device="cuda", dtype=torch.bfloat16)
    view = x[:, :65536]
    assert_close(sg.softmax_fwd(view), torch.softmax(view.double(), -1), torch.bfloat16, msg="strided",
                 baseline=torch.softmax(view, -1))
    assert sg.softmax_fwd(x[:0]).shape == (0, 70000)
