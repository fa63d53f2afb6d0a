"""hearth.kernels.softmax_gluon, the cluster softmax for wide rows (its shared-memory form is what softmax() routes
wide rows to on Hopper; the register form is not routed: BENCHMARKS.md says why). No
interpreter runs Gluon or inline PTX, so on the CPU the kernel is built offline for sm_90 and its build is
checked; its values are checked on a Hopper GPU against an fp64 reference, within the 2x-PyTorch rule."""

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
from hearth.kernels import cross_entropy_gluon as cg


def build(op, n, dt, ctas):
    # one kernel built for sm_90 and what its PTX / LLVM IR show (argv: op, n, dtype, ctas, repeated)
    n, ctas = int(n), (int(ctas) or None)
    gated = op != "ce_smem_ungated"  # cross_entropy's launch is gated by its target check; direct callers' are not
    op = "ce_smem" if op == "ce_smem_ungated" else op
    eb = {"bf16": 2, "fp16": 2, "fp32": 4}[dt]
    if op in ("smem", "ce_smem", "bwd_smem"):
        ctas, chunk, chunks = sg.smem_config(n, eb, ctas, inputs=2 if op == "bwd_smem" else 1)
        p, warps = chunk * chunks, sg.SMEM_WARPS
        const = dict(sg.smem_constexprs(ctas, chunk, chunks, eb, warps))
    else:
        ctas, p, warps = sg.config(n, ctas)
        const = sg.constexprs(ctas, p, warps, eb)
    if op == "bwd_smem":
        fn, args = sg._softmax_bwd_cluster_smem_kernel, {"Y": f"*{dt}", "DY": f"*{dt}", "DX": f"*{dt}",
                                                         "stride_y": "i32", "stride_dy": "i32", "stride_dx": "i32",
                                                         "n_cols": "i32"}
    elif op == "smem":
        fn, args = sg._softmax_fwd_cluster_smem_kernel, {"X": f"*{dt}", "Y": f"*{dt}", "stride_x": "i32",
                                                         "stride_y": "i32", "n_cols": "i32"}
    elif op == "ce_smem":
        # as cross_entropy routes a mean loss: the gradient in place, its scale (1 / n_valid) read from the device
        fn, args = cg._ce_rows_cluster_smem_kernel, {"Logits": f"*{dt}", "Grad": f"*{dt}", "Target": "*i64",
                                                     "Loss": "*fp32", "Scale": "*fp32", "Gate": "*i32", "stride": "i32",
                                                     "stride_g": "i32", "n_cols": "i32", "ignore_index": "i32",
                                                     "scale_value": "fp32"}
        # ... with the target check's gate (cross_entropy's default), or without (ce_rows_smem_ called directly)
        const.update(WRITE_GRAD=True, SCALE_MODE=1, GATED=gated)
    elif op == "softmax":
        fn, args = sg._softmax_fwd_cluster_kernel, {"X": f"*{dt}", "Y": f"*{dt}", "stride_x": "i32", "stride_y": "i32"}
        args["n_cols"] = "i32"
    else:
        fn, args = cg._ce_rows_cluster_kernel, {"Logits": f"*{dt}", "Target": "*i64", "Loss": "*fp32", "stride": "i32"}
        args.update(n_cols="i32", ignore_index="i32", grad_scale="fp32")
    sig = {**args, **{k: "constexpr" for k in const}}
    # as a launch specializes them on 16-byte aligned rows: the pointers and these ints divisible by 16
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if name in ("X", "Y", "DY", "DX", "Logits", "Grad", "Target", "Loss", "Scale", "Gate", "stride_x", "stride_y",
                           "stride_dy", "stride_dx", "stride", "stride_g", "n_cols")}
    k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=const, attrs=aligned),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_ctas": ctas})
    ptx, llir = k.asm["ptx"], k.asm["llir"]
    # the compiler's own shared memory: every @global_smem address in the LLVM IR (the inline PTX's are in strings)
    offsets = [int(o) for o in re.findall(r"@global_smem, i32 (\d+)\)", llir)]
    bare = [line for line in llir.splitlines() if "@global_smem" in line and "@global_smem," not in line
            and "external addrspace(3)" not in line and "asm" not in line]
    # an address formed from global_smem + a run-time offset alone starts at byte 0 (where the slots are)
    bare += [line.strip() for line in llir.splitlines() if re.search(r"@global_smem, i(32|64) %", line)]
    # a layout the compiler thinks is replicated over the CTAs makes it predicate the row's stores on rank == 0:
    # `and.b32 rX, <rank>, CTAS - 1`, `setp.eq pY, rX, 0`, then pY and-ed into the st.global.v4 predicates
    rank_regs = set(re.findall(r"mov\.u32\s+(%r\d+), %cluster_ctarank;", ptx))
    masked = {m.group(1) for m in re.finditer(r"and\.b32\s+(%r\d+), (%r\d+|%cluster_ctarank), \d+;", ptx)
              if m.group(2) in rank_regs or m.group(2) == "%cluster_ctarank"}
    tainted = {m.group(1) for m in re.finditer(r"setp\.(?:eq|ne)\.[bsu]32\s+(%p\d+), (%r\d+), 0;", ptx)
               if m.group(2) in masked}
    for _ in range(4):  # predicates built from them (either polarity)
        for m in re.finditer(r"(?:and|or|xor)\.pred\s+(%p\d+), (%p\d+), (%p\d+);", ptx):
            if m.group(2) in tainted or m.group(3) in tainted:
                tainted.add(m.group(1))
        for m in re.finditer(r"not\.pred\s+(%p\d+), (%p\d+);", ptx):
            if m.group(2) in tainted:
                tainted.add(m.group(1))
    rank0 = [line.strip() for line in ptx.splitlines()
             if re.match(r"\s*@!?(%p\d+) st\.global\.v", line)
             and re.match(r"\s*@!?(%p\d+)", line).group(1) in tainted]
    # the shared-memory forms: chunk c (bytes [c * CHUNK_BYTES, (c + 1) * CHUNK_BYTES) of the CTA's buffer) may be
    # read only after a cp.async.wait_group leaving at most CHUNKS - 1 - c groups in flight, then a CTA barrier
    early = []
    if op in ("smem", "ce_smem", "bwd_smem"):
        chunks, last_wait, synced, seen = p // const["CHUNK"], None, False, set()
        # buffer chunk k holds the row's chunk k; the backward's dy chunk c sits at buffer chunk chunks - 1 + c
        held = 2 * chunks - 1 if op == "bwd_smem" else chunks
        for line in ptx.splitlines():
            w = re.match(r"\s*cp\.async\.wait_group\s+(\d+);", line)
            if w:
                last_wait, synced = int(w.group(1)), False
            elif re.match(r"\s*bar\.sync\s", line):
                synced = True
            ld = re.match(r"\s*ld\.shared\.v4\.b32\s+\{[^}]*\}, \[%r\d+\+(\d+)\];", line)
            if ld and sg.CHUNK_BYTES <= int(ld.group(1)) < held * sg.CHUNK_BYTES:
                slot = int(ld.group(1)) // sg.CHUNK_BYTES
                c = slot if slot < chunks else slot - (chunks - 1)
                if c not in seen and (last_wait is None or last_wait > chunks - 1 - c or not synced):
                    early.append((c, last_wait, synced))
                seen.add(c)
        early += [("unread", c) for c in range(1, chunks) if c not in seen]
    rep = hi.report_compiled("cluster", k, sass=False)
    return dict(
        ctas=ctas, p=p, warps=warps, shared=k.metadata.shared, spills=rep.spill_bytes, regs=rep.registers,
        cluster=f".reqnctapercluster {ctas}" in ptx, mapa=ptx.count("mapa.shared::cluster"),
        st_cluster=ptx.count("st.shared::cluster"), barriers=ptx.count("barrier.cluster"),
        offsets=offsets, bare=bare, rank0=rank0, cp_async=ptx.count("cp.async.cg.shared.global"),
        cp_async_small=ptx.count("cp.async.ca"), early=early)


args = sys.argv[1:]
print(json.dumps([build(*args[i:i + 4]) for i in range(0, len(args), 4)]))
"""


_REGISTER_BUILDS = [
    ("softmax", 262144, "bf16", 0), ("softmax", 151936, "fp32", 0), ("softmax", 65536, "fp16", 0),
    ("softmax", 262144, "bf16", 8), ("cross_entropy", 131072, "bf16", 0), ("cross_entropy", 151936, "fp32", 0)]
_SMEM_BUILDS = [
    ("smem", 262144, "bf16", 0), ("smem", 151936, "bf16", 0), ("smem", 65536, "fp16", 0), ("smem", 262144, "fp32", 0),
    ("smem", 131072, "bf16", 16), ("ce_smem", 131072, "bf16", 0), ("ce_smem", 151936, "fp32", 0),
    ("ce_smem_ungated", 131072, "bf16", 0),
    ("bwd_smem", 262144, "bf16", 0), ("bwd_smem", 151936, "bf16", 0), ("bwd_smem", 65536, "fp32", 0)]


@pytest.fixture(scope="module")
def sm90_builds() -> dict:
    """Every build the two tests below check, made once: two processes (CI's two cores) that each build half of
    them, so the tests pay Triton's import twice and not once a build. {(op, n, dtype, ctas): report}."""
    cases = _REGISTER_BUILDS + _SMEM_BUILDS
    halves = [cases[0::2], cases[1::2]]
    reports = run_offline(_BUILD_SCRIPT, *(tuple(str(v) for case in half for v in case) for half in halves))
    return {case: r for half, rs in zip(halves, reports) for case, r in zip(half, rs)}


@pytest.mark.xdist_group("softmax_gluon_builds")  # one worker makes the module fixture's builds (scripts/gpu/test.sh)
@pytest.mark.parametrize("op, n, dtype, ctas", _REGISTER_BUILDS,
    ids=["softmax-262144-bf16", "softmax-151936-fp32", "softmax-65536-fp16", "softmax-262144-bf16-8ctas",
         "ce-131072-bf16", "ce-151936-fp32"])
def test_sm90_build_exchanges_through_slots_ahead_of_the_compilers_scratch(sm90_builds, op, n, dtype, ctas):
    """The kernels build for sm_90 as a cluster (.reqnctapercluster); each stores its pair into every CTA's
    slots (one mapa + st.shared::cluster per CTA) between cluster barriers (arrive at start, wait,
    arrive.release, wait.acquire); every shared-memory address the compiler forms (its reduction scratch)
    lies past the slot buffer, which the inline PTX addresses at global_smem + 0; and no store of the row is
    predicated on the CTA's rank being 0 (what a layout the compiler believes replicated over the CTAs
    produces: review found every store but CTA 0's dropped that way; cross-entropy's one-writer loss store
    is meant to be). At config's pick nothing spills; 8 CTAs at 262144
    columns (64 values a thread) may spill, which is what the pick avoids."""
    r = sm90_builds[(op, n, dtype, ctas)]
    assert r["cluster"] and r["mapa"] == r["ctas"] and r["st_cluster"] == r["ctas"], r
    assert r["barriers"] == 4, r
    slot_bytes = sg.SLOT_FLOATS * 4
    assert r["offsets"] and min(r["offsets"]) >= slot_bytes and not r["bare"], r
    assert r["shared"] > slot_bytes, r
    assert not r["rank0"], r
    if ctas == 0:
        assert r["spills"] == 0, r


@pytest.mark.xdist_group("softmax_gluon_builds")  # one worker makes the module fixture's builds (scripts/gpu/test.sh)
@pytest.mark.parametrize("op, n, dtype, ctas", _SMEM_BUILDS,
    ids=["262144-bf16", "151936-bf16", "65536-fp16", "262144-fp32", "131072-bf16-16ctas", "ce-131072-bf16",
         "ce-151936-fp32", "ce-131072-bf16-ungated", "bwd-262144-bf16", "bwd-151936-bf16", "bwd-65536-fp32"])
def test_sm90_smem_build_leaves_chunk_zero_to_the_slots(sm90_builds, op, n, dtype, ctas):
    """The shared-memory forms (softmax forward and backward; cross-entropy) build as a cluster with the same
    exchange; they copy chunks 1.. by cp.async (16 bytes a lane); every shared address the compiler forms is at or past
    CHUNK_BYTES (chunk 0's bytes, at global_smem + 0 where the buffer sits, are the exchange's slots: the
    compiler never touches them, and a bare @global_smem use would mean it does); each chunk is first read
    after a cp.async.wait_group that has let it land and a CTA barrier; no row store predicated on rank 0;
    no spills."""
    r = sm90_builds[(op, n, dtype, ctas)]
    assert r["cluster"] and r["mapa"] == r["ctas"] and r["st_cluster"] == r["ctas"] and r["barriers"] == 4, r
    assert r["cp_async"] > 0 and r["cp_async_small"] == 0 and not r["early"], r
    assert r["offsets"] and min(r["offsets"]) >= sg.CHUNK_BYTES and not r["bare"], r
    assert not r["rank0"] and r["spills"] == 0, r


def test_smem_config_parts_fit_and_bad_input_is_named():
    for n, eb in ((32769, 2), (40000, 4), (131072, 2), (151936, 2), (262144, 2), (262144, 4)):
        ctas, chunk, chunks = sg.smem_config(n, eb)
        assert ctas in (2, 4, 8, 16) and chunk * eb == sg.CHUNK_BYTES, (n, eb)
        assert ctas * chunk * chunks >= n > ctas * chunk * (chunks - 1), (n, eb, ctas, chunks)
        assert chunks * sg.CHUNK_BYTES <= (sg.SMEM_PART_BYTES if ctas < 16 else sg.SMEM_MAX_PART_BYTES)
    assert sg.smem_config(262144, 2) == (16, 2048, 8)
    assert sg.smem_config(151936, 2) == sg.smem_config(152064, 2) == (8, 2048, 10)  # 38 KiB parts
    assert sg.smem_config(131072, 2) == (8, 2048, 8) and sg.smem_config(65536, 2) == (4, 2048, 8)
    assert sg.smem_config(163840, 2) == (8, 2048, 10) and sg.smem_config(163841, 2) == (16, 2048, 6)
    assert sg.smem_config(151936, 2, inputs=2) == (16, 2048, 5)  # the backward holds y and dy
    with pytest.raises(ValueError, match="ctas"):
        sg.smem_config(65536, 2, 3)
    with pytest.raises(ValueError, match="n_cols"):
        sg.smem_config(262144, 4, 2)


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
    assert "barrier.cluster.arrive.relaxed" in sg.START and "wait" not in sg.START


def test_routing_rule_shapes_dtypes_alignment_and_shared_memory():
    """rows_fit, the shape side of `serves` (a pure function, so the CPU checks it): 2-D rows with unit column
    stride, a served dtype, 32768 < width <= 262144, 16-byte aligned pointer / width / row stride, and the
    backward's two rows fitting 16 CTAs' shared memory (not fp32 at 262144); `serves` is False off CUDA."""
    bf16, fp32 = torch.bfloat16, torch.float32
    assert sg.rows_fit(bf16, (8, 131072), (131072, 1), 4096)
    assert sg.rows_fit(bf16, (8, 262144), (262144, 1), 0, inputs=2)
    assert sg.rows_fit(fp32, (8, 262144), (262144, 1), 0) and not sg.rows_fit(fp32, (8, 262144), (262144, 1), 0, 2)
    assert sg.rows_fit(fp32, (8, 131072), (131072, 1), 0, inputs=2)
    assert not sg.rows_fit(bf16, (8, 32768), (32768, 1), 0)  # the one-pass kernel's widths
    assert sg.rows_fit(bf16, (8, 32768 + 16), (32768 + 16, 1), 0)
    assert not sg.rows_fit(bf16, (8, 262144 + 16), (262144 + 16, 1), 0)
    assert not sg.rows_fit(bf16, (8, 131072), (1, 8), 0)  # column stride
    assert not sg.rows_fit(bf16, (2, 8, 131072), (8 * 131072, 131072, 1), 0)  # 3-D
    assert not sg.rows_fit(torch.float64, (8, 131072), (131072, 1), 0)
    assert not sg.rows_fit(bf16, (8, 131072 + 8), (131072 + 8, 1), 0)  # width
    assert not sg.rows_fit(bf16, (8, 131072), (131072 + 8, 1), 0)  # row stride
    assert not sg.rows_fit(bf16, (8, 131072), (131072, 1), 8)  # pointer
    x = torch.zeros(2, 131072, dtype=bf16)
    assert sg.rows_fit(x.dtype, tuple(x.shape), tuple(x.stride()), x.data_ptr() - x.data_ptr() % 16)
    assert not sg.serves(x)


def test_softmax_takes_narrower_16_bit_rows_than_cross_entropy():
    """smem_min_cols: softmax's 16-bit rows go to the shared-memory forms past 16384 columns forward and 4096
    backward (where they measured faster than the one-pass kernels); fp32 and the default (cross-entropy's
    rule, and the register form's) keep MIN_COLS; the bound is exclusive and rows_fit / supported honour it."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    assert sg.smem_min_cols(bf16) == sg.smem_min_cols(fp16) == 16384 == sg.SMEM_FWD_MIN_COLS
    assert sg.smem_min_cols(bf16, inputs=2) == 4096 == sg.SMEM_BWD_MIN_COLS
    assert sg.smem_min_cols(fp32) == sg.smem_min_cols(fp32, inputs=2) == sg.MIN_COLS
    fwd, bwd = sg.smem_min_cols(bf16), sg.smem_min_cols(bf16, inputs=2)
    assert sg.rows_fit(bf16, (8, 32000), (32000, 1), 0, min_cols=fwd)
    assert not sg.rows_fit(bf16, (8, 32000), (32000, 1), 0)  # cross-entropy's rule: the one-pass widths
    assert not sg.rows_fit(bf16, (8, 16384), (16384, 1), 0, min_cols=fwd)
    assert sg.rows_fit(bf16, (8, 16384 + 16), (16384 + 16, 1), 0, min_cols=fwd)
    assert sg.rows_fit(bf16, (8, 8192), (8192, 1), 0, inputs=2, min_cols=bwd)
    assert not sg.rows_fit(bf16, (8, 4096), (4096, 1), 0, inputs=2, min_cols=bwd)
    assert not sg.rows_fit(bf16, (8, 32000 + 8), (32000 + 8, 1), 0, min_cols=fwd)  # alignment still applies
    assert sg.supported((9, 0), bf16, 8192, min_cols=bwd) and not sg.supported((9, 0), bf16, 8192)
    with pytest.raises(ValueError, match="4096 < n <= 262144"):
        sg.softmax_bwd_smem(torch.zeros(2, 8192, dtype=bf16), torch.zeros(2, 8192, dtype=bf16))  # CPU: not Hopper


def test_kernels_import_without_gluon():
    """hearth.kernels imports on a Triton without Gluon (the package allows older ones): softmax and
    cross_entropy then keep every row on their Triton kernels."""
    script = r"""
import importlib.abc, json, sys
class NoGluon(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("triton.experimental.gluon"):
            raise ImportError("no gluon here")
sys.meta_path.insert(0, NoGluon())
import hearth.kernels
sm, ce = sys.modules["hearth.kernels.softmax"], sys.modules["hearth.kernels.cross_entropy"]
print(json.dumps([sm.sg is None, ce.sg is None, ce.cg is None]))
"""
    assert run_offline(script) == [True, True, True]


def test_supported_and_bad_input_name_the_argument():
    assert sg.supported((9, 0), torch.bfloat16, 262144) and not sg.supported((8, 0), torch.bfloat16, 262144)
    assert not sg.supported((9, 0), torch.bfloat16, 4096) and not sg.supported(None, torch.float32, 65536)
    with pytest.raises(ValueError, match="x: the cluster softmax serves Hopper"):
        sg.softmax_fwd(torch.zeros(2, 65536))  # a CPU tensor
    with pytest.raises(ValueError, match="x must be 2-D"):
        sg.softmax_fwd(torch.zeros(2, 3, 65536))
    with pytest.raises(ValueError, match="x: the cluster softmax serves Hopper"):
        sg.softmax_fwd_smem(torch.zeros(2, 65536))
    with pytest.raises(ValueError, match="x must be 2-D"):
        sg.softmax_fwd_smem(torch.zeros(65536))


@pytest.mark.parametrize("case", ["width", "stride", "pointer"])
def test_smem_form_names_unaligned_rows(case):
    """cp.async copies 16 bytes a lane: a width or row stride that is not a multiple of 16 elements, or a
    pointer off 16 bytes, is refused by name (a 2-byte dtype would otherwise fail to build: there is no
    2-byte cp.async), before the device is asked, so the message is the same on any machine."""
    x = torch.zeros(3, 65536 + 32, dtype=torch.bfloat16)
    t = {"width": x[:, : 65536 + 8], "stride": torch.zeros(3, 65536 + 40, dtype=torch.bfloat16)[:, :65536],
         "pointer": x[:, 1: 1 + 65536]}[case]
    assert not sg.smem_aligned(t) and sg.smem_aligned(x)
    with pytest.raises(ValueError, match="x: the cluster softmax \\(shared-memory form\\) needs 16-byte aligned"):
        sg.softmax_fwd_smem(t)


# ---------------------------------------------------------------- GPU (H200)
HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
hopper_only = pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.x (Hopper)")


def _special_rows(rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[rows, n] CUDA values of `dtype` (rows >= 2): row 0 with a large spread (its first third 40 lower), the
    last row's second half -inf (masked parts: a CTA whose columns are all -inf or past n), row 1's first
    quarter -inf (a first part all -inf)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(rows, n, generator=g) * 4).to(dtype)
    x[0, : n // 3] -= 40
    x[-1, n // 2:] = float("-inf")
    x[1, : n // 4] = float("-inf")
    return x.cuda()


@hopper_only
@pytest.mark.parametrize("rows, n, dtype, ctas", [
    (3, 262144, torch.bfloat16, None), (5, 151936, torch.bfloat16, None), (4, 65536 + 7, torch.float16, None),
    (2, 40000, torch.float32, None), (3, 262144, torch.bfloat16, 8), (4, 131072, torch.bfloat16, 16)])
def test_gpu_matches_reference(rows, n, dtype, ctas):
    """Against softmax in fp64 of the same values, within 2x PyTorch's own error in `dtype`; one row with a
    large spread, one with a tail of -inf (masked parts: a CTA whose columns are all -inf or past n), one
    whose first part is all -inf."""
    x = _special_rows(rows, n, dtype, seed=n)
    y = sg.softmax_fwd(x, ctas=ctas)
    ref = torch.softmax(x.double(), -1)
    assert_close(y, ref, dtype, msg="cluster softmax", baseline=torch.softmax(x, -1))
    assert torch.equal(y[-1, n // 2:], torch.zeros_like(y[-1, n // 2:]))


@hopper_only
@pytest.mark.parametrize("rows, n, dtype, ctas", [
    (3, 262144, torch.bfloat16, None), (5, 151936, torch.bfloat16, None), (4, 65536 + 16, torch.float16, None),
    (3, 40000, torch.float32, None), (3, 262144, torch.float32, None), (4, 131072, torch.bfloat16, 16),
    (3, 40000, torch.bfloat16, 16), (3, 32000, torch.bfloat16, None), (4, 16384 + 32, torch.float16, None),
    (3, 20000, torch.bfloat16, 4)])
def test_gpu_smem_form_matches_reference(rows, n, dtype, ctas):
    """The shared-memory form against fp64, within 2x PyTorch's error, with the same special rows (a large
    spread, a tail of -inf, a first part all -inf); 40000 columns over 16 CTAs leaves whole chunks and
    whole CTAs past the row's end."""
    x = _special_rows(rows, n, dtype, seed=n + 1)
    y = sg.softmax_fwd_smem(x, ctas=ctas)
    assert_close(y, torch.softmax(x.double(), -1), dtype, msg="cluster softmax (shared memory)",
                 baseline=torch.softmax(x, -1))
    assert torch.equal(y[-1, n // 2:], torch.zeros_like(y[-1, n // 2:]))
    view = x[:, : n - 16]  # a row stride that is not the width (both multiples of 16: smem_aligned)
    assert_close(sg.softmax_fwd_smem(view, ctas=ctas), torch.softmax(view.double(), -1), dtype, msg="strided",
                 baseline=torch.softmax(view, -1))


@hopper_only
def test_gpu_reads_rows_through_their_stride_and_handles_zero_rows():
    x = torch.randn(4, 70000, device="cuda", dtype=torch.bfloat16)
    view = x[:, :65536]
    assert_close(sg.softmax_fwd(view), torch.softmax(view.double(), -1), torch.bfloat16, msg="strided",
                 baseline=torch.softmax(view, -1))
    assert sg.softmax_fwd(x[:0]).shape == (0, 70000)


@hopper_only
@pytest.mark.parametrize("rows, n, dtype", [(3, 262144, torch.bfloat16), (5, 151936, torch.bfloat16),
                                           (4, 65536 + 16, torch.float16), (3, 40000, torch.float32),
                                           (3, 131072, torch.float32), (3, 32000, torch.bfloat16),
                                           (4, 4096 + 16, torch.bfloat16), (2, 8192, torch.float16)])
def test_gpu_smem_backward_matches_reference(rows, n, dtype):
    """softmax_bwd_smem against y * (dy - sum(dy * y)) in fp64 of the same y and dy, within 2x PyTorch's own
    error in `dtype` (its softmax backward on the same values); one row with a tail of zeros in y (the
    forward of -inf), and a row stride that is not the width."""
    g = torch.Generator(device="cpu").manual_seed(n + 2)
    x = torch.randn(rows, n, generator=g) * 4
    x[-1, n // 2:] = float("-inf")
    x = x.to(dtype).cuda().requires_grad_()
    y = torch.softmax(x, -1)
    dy = (torch.randn(rows, n, generator=g)).to(dtype).cuda()
    y.backward(dy)
    yd, dyd = y.detach().double(), dy.double()
    ref = yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
    assert_close(sg.softmax_bwd_smem(y.detach(), dy), ref, dtype, msg="cluster softmax backward", baseline=x.grad)
    wide_y = torch.zeros(rows, n + 16, dtype=dtype, device="cuda")
    wide_y[:, :n] = y.detach()
    assert_close(sg.softmax_bwd_smem(wide_y[:, :n], dy), ref, dtype, msg="strided", baseline=x.grad)


def test_smem_backward_names_bad_input():
    y = torch.zeros(2, 65536)
    with pytest.raises(ValueError, match="dy: the cluster softmax backward \\(shared-memory form\\) needs 16-byte"):
        sg.softmax_bwd_smem(y, torch.zeros(2, 65536 + 8)[:, 1:65537])
    with pytest.raises(ValueError, match="y: the cluster softmax backward serves Hopper"):
        sg.softmax_bwd_smem(y, y)


@hopper_only
def test_gpu_softmax_routes_wide_aligned_rows_to_the_smem_form(monkeypatch):
    """hearth's softmax() sends a wide row that is smem_aligned to softmax_fwd_smem and its backward to
    softmax_bwd_smem (one call each, the values within the rule), an unaligned one or ROUTE off to the
    chunked Triton kernels, and the fp32 backward at 262144 columns (y and dy past the shared memory of 16
    CTAs) to the Triton backward; 16-bit rows narrower than MIN_COLS by smem_min_cols (32000: both, 16384: the
    backward only, 4096: neither), fp32 ones of that width to the one-pass kernels."""
    from hearth.kernels.softmax import softmax

    calls = []
    fwd, bwd = sg.softmax_fwd_smem, sg.softmax_bwd_smem
    monkeypatch.setattr(sg, "softmax_fwd_smem", lambda *a, **k: calls.append("fwd") or fwd(*a, **k))
    monkeypatch.setattr(sg, "softmax_bwd_smem", lambda *a, **k: calls.append("bwd") or bwd(*a, **k))
    torch.manual_seed(3)
    for n, dtype, routed in ((131072, torch.bfloat16, ["fwd", "bwd"]), (131072 + 8, torch.bfloat16, []),
                             (262144, torch.float32, ["fwd"]), (32000, torch.bfloat16, ["fwd", "bwd"]),
                             (16384, torch.bfloat16, ["bwd"]), (4096, torch.float16, []),
                             (32000, torch.float32, []), (32000 + 8, torch.bfloat16, [])):
        x = (torch.randn(2, 3, n, device="cuda") * 3).to(dtype).requires_grad_()
        calls.clear()
        y = softmax(x)
        dy = torch.randn_like(y)
        y.backward(dy)
        assert calls == routed, (n, dtype, calls)
        ref = torch.softmax(x.detach().double(), -1)
        assert_close(y, ref, dtype, msg=f"routed {routed}", baseline=torch.softmax(x.detach(), -1))
        ref_grad = ref * (dy.double() - (dy.double() * ref).sum(-1, keepdim=True))
        base_x = x.detach().clone().requires_grad_()
        torch.softmax(base_x, -1).backward(dy)
        assert_close(x.grad, ref_grad, dtype, msg="grad", baseline=base_x.grad)
    monkeypatch.setattr(sg, "ROUTE", False)
    calls.clear()
    softmax(torch.randn(2, 131072, device="cuda", dtype=torch.bfloat16))
    assert not calls


@pytest.mark.xdist_group("gpu_big")  # three ~4 GiB storages: one at a time (scripts/gpu/test.sh)
@hopper_only
def test_gpu_routed_rows_past_int32():
    """Rows whose last one starts past element 2^31 (row stride below 2^31, so Triton passes it as int32):
    softmax() routes them to the smem forms (the stride is a multiple of 16), which must widen row * stride
    to int64; forward and backward against fp64."""
    from hearth.kernels.softmax import softmax
    from tests.kernels.tolerance import rows_past_int32

    n = 65536
    x = rows_past_int32(3, n, torch.bfloat16)
    assert sg.serves(x) and sg.serves(x, inputs=2)
    y = softmax(x)
    ref = torch.softmax(x.double(), -1)
    assert_close(y, ref, torch.bfloat16, msg="forward", baseline=torch.softmax(x, -1))
    y_far, dy = rows_past_int32(3, n, torch.bfloat16), rows_past_int32(3, n, torch.bfloat16)
    y_far.copy_(y)
    dx = sg.softmax_bwd_smem(y_far, dy)
    yd = y_far.double()
    ref_dx = yd * (dy.double() - (yd * dy.double()).sum(-1, keepdim=True))
    base = y_far.float() * (dy.float() - (y_far.float() * dy.float()).sum(-1, keepdim=True))
    assert_close(dx, ref_dx, torch.bfloat16, msg="backward", baseline=base.to(torch.bfloat16))
