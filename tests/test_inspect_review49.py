"""hearth.inspect, review 49: defects found by reading `hearth inspect matmul|attention --arch sm_90` (and
sm_100) against the PTX / SASS / `cuobjdump -res-usage` of the same builds (Triton 3.6, bundled ptxas)."""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
from types import SimpleNamespace

from rich.console import Console

from hearth import inspect as hi

importlib.import_module("hearth.kernels")  # as tests/test_inspect.py: import under the suite's interpreter setting

# cut from a Gluon attention forward's TTGIR (Gluon builds carry no "ttir" in CompiledKernel.asm)
GLUON_TTGIR = """\
  tt.func public @_attn_fwd_gluon_kernel(%Q: !tt.ptr<bf16>) {
      %s_tok_49 = ttng.warp_group_dot %q_smem, %s_tok, %cst_2, %false {inputPrecision = 0 : i32, isAsync = true} : !ttg.memdesc<128x64xbf16, #shared, #smem, mutable> * !ttg.memdesc<64x128xbf16, #shared2, #smem, mutable> -> tensor<128x128xf32, #mma>
      %w = ttng.warp_group_dot_wait %s_tok_49 {pendings = 0 : i32} : tensor<128x128xf32, #mma>
"""
# cut from `hearth inspect matmul --arch sm_100` (the TMA kernel): Blackwell's tensor-core MMA, PTX and SASS
TCGEN05_PTX = """\
.target sm_100a
	@%p33 tcgen05.mma.cta_group::1.kind::f16 [ %r901 + 0 ], %rd7, %rd8, %r109, %p32;
	@%p33 tcgen05.mma.cta_group::1.kind::f16 [ %r901 + 0 ], %rd9, %rd10, %r109, %p34;
	@%p33 tcgen05.commit.cta_group::1.mbarrier::arrive::one.b64 [%rd15];
	tcgen05.ld.sync.aligned.32x32b.x64.b32 {%r184, %r185}, [%r248 + 0];
"""
UTCHMMA_SASS = """\
        /*2150*/                   UTCHMMA gdesc[UR6], gdesc[UR12], tmem[UR39], tmem[UR34], idesc[UR35], !UPT ;  /* 0x00ff220c060075ea */
        /*2180*/                   UTCHMMA gdesc[UR32], gdesc[UR28], tmem[UR39], tmem[UR40], idesc[UR41], UPT ;  /* 0x00ff281c200075ea */
        /*21a0*/                   UTCBAR [UR36], URZ ;  /* 0x000000ff240073e9 */
"""


def _kernel(ptx="", ttir=None, ttgir=None, **extra):
    asm = {"ptx": ptx, "cubin": b""}
    if ttir is not None:
        asm["ttir"] = ttir
    if ttgir is not None:
        asm["ttgir"] = ttgir
    return SimpleNamespace(asm=asm, metadata=SimpleNamespace(name="k", shared=1024, num_warps=8, num_stages=3), **extra)


def test_gluon_kernel_without_ttir_is_matmul_like():
    """Gluon kernels (every `hearth inspect attention --arch sm_90` row) have no "ttir" in asm; their dots are
    ttng.warp_group_dot in the TTGIR. Before: matmul_like False for all 28, so a Gluon kernel that lost its wgmma
    was reported "no matmul in this kernel: tensor cores not expected" (ok, exit 0) -- LESSON 4 switched off."""
    assert hi.uses_dot(GLUON_TTGIR)
    assert not hi.uses_dot("%w = ttng.warp_group_dot_wait %x {pendings = 0 : i32}")
    assert hi.uses_dot("%d = ttng.tc_gen5_mma %a, %b, %acc, %true, %true : !ttg.memdesc<128x64xbf16>")
    rep = hi.report_compiled("attention_gluon fwd", _kernel(".target sm_90a\n\tadd.s32 %r1, %r2, 1;", ttgir=GLUON_TTGIR))
    assert rep.matmul_like
    assert rep.level == "error" and rep.verdict.startswith("No tensor-core instructions")


def test_blackwell_tcgen05_counts_as_tensor_cores():
    """`hearth inspect matmul --arch sm_100` printed "No tensor-core instructions were emitted" in red for all three
    kernels and exited 1: tcgen05.mma (PTX) / UTCHMMA (SASS) were not counted."""
    assert hi.count_ptx(TCGEN05_PTX)["tcgen05.mma"] == 2
    assert hi.count_sass(UTCHMMA_SASS)["UTCMMA"] == 2
    rep = hi.KernelReport(label="k", name="k", target="sm_100a", matmul_like=True, ptx=hi.count_ptx(TCGEN05_PTX),
                          sass=hi.count_sass(UTCHMMA_SASS), registers=127, spill_bytes=0, shared_bytes=1024,
                          num_warps=8, num_stages=3)
    level, text = hi.verdict(rep)
    assert level == "ok" and "tcgen05" in text


def test_hopper_int8_igmma_and_sparse_mma_forms_count():
    assert hi.count_sass("/*0100*/ IGMMA.64x128x32.S32.S8.S8 R24, gdesc[UR8], R24 ;")["IGMMA"] == 1
    assert hi.count_ptx("\tmma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2}, %r3, 0x0;")["mma.sync"] == 1
    assert hi.count_ptx("\tmma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%f1}, {%r1}, {%r2}, {%f2}, %r3, 0x0;")["mma.sync"] == 1
    # wmma.mma.sync is one wmma, not also an mma.sync
    counts = hi.count_ptx("\twmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {%f1}, {%r1}, {%r2}, {%f2};")
    assert counts["wmma"] == 1 and counts["mma.sync"] == 0


def test_sass_decides_when_ptx_and_sass_disagree():
    """The SASS is what runs: PTX wgmma that ptxas dropped (e.g. an accumulator never stored) is no tensor core."""
    ptx = dict(hi.count_ptx(""), wgmma=4)
    rep = hi.KernelReport(label="k", name="k", target="sm_90a", matmul_like=True, ptx=ptx, sass=hi.count_sass(""),
                          registers=90, spill_bytes=0, shared_bytes=1024, num_warps=8, num_stages=3)
    level, text = hi.verdict(rep)
    assert level == "error" and text.startswith("No tensor-core instructions"), (level, text)
    rep.sass = None  # no cuobjdump: PTX is all there is
    assert hi.verdict(rep)[0] == "ok"


def test_gpu_spills_are_bytes():
    """On a GPU, CompiledKernel.n_spills is CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4 (triton/backends/nvidia/driver.c),
    32-bit words; it was reported as spill_bytes (benchmarks/h200/inspect/attention.json: "spill_bytes": 10, i.e. 40
    bytes), 4x under the offline figure for the same kernel."""
    rep = hi.report_compiled("k", _kernel(".target sm_90a", n_regs=168, n_spills=4))
    assert rep.spill_bytes == 16
    assert "16 bytes spilled" in rep.verdict


def test_text_output_keeps_labels_and_verdicts_when_not_a_terminal():
    """Under CI / a pipe / tee (no terminal: rich's 80 columns) the table squeezed the kernel and verdict columns to
    nothing -- benchmarks/h200/inspect/attention.txt has no kernel name and no verdict in it."""
    rep = hi.KernelReport(label="attention_gluon fwd[pps] d128 causal 2x64x128 w4+4+1 s3 sm_90", name="k",
                          target="sm_90a", matmul_like=True, ptx=dict(hi.count_ptx(""), wgmma=64, tma=8),
                          sass=dict(hi.count_sass(""), HGMMA=64), registers=168, spill_bytes=16,
                          shared_bytes=229736, num_warps=12, num_stages=3)
    rep.level, rep.verdict = hi.verdict(rep)
    buf = io.StringIO()
    console = Console(file=buf, width=80, record=True)
    assert not console.is_terminal
    hi.render([rep], console)
    out = console.export_text()
    assert rep.label in out
    assert "16 bytes spilled to local memory" in out


def test_offline_shape_is_not_silently_ignored(capsys, monkeypatch):
    """--shape has no effect on an offline build (offline_kernels takes none): say so instead of a table that reads as
    the given shape's kernels; and an offline error names the arch, not "shape None"."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(hi, "collect_offline", lambda op, arch, dtype: [])
    assert hi.main("matmul", "64x64x64", arch="sm_90") == 2  # nothing was built (this stub): "nothing to compile for"
    assert "--shape" in capsys.readouterr().out

    def refuse(op, arch, dtype):
        raise ValueError("no offline build here")

    monkeypatch.setattr(hi, "collect_offline", refuse)
    assert hi.main("softmax", arch="sm_90") == 2
    out = capsys.readouterr().out.replace("\n", " ")
    assert "sm_90" in out and "shape None" not in out


_OFFLINE = r"""
import importlib, json, sys, torch
from hearth import inspect as hi
ag = importlib.import_module("hearth.kernels.attention_gluon")
rows = [hi.report_compiled(label, k) for label, k in
        ag.offline_kernels(90, torch.bfloat16, variants=("pp",), head_dims=(64,), causal=(False,))]
rc = hi.main("matmul", arch="sm_100", json_out=__import__("pathlib").Path(sys.argv[1]))
print(json.dumps(dict(rc=rc, gluon=[dict(label=r.label, matmul_like=r.matmul_like, level=r.level) for r in rows])))
"""


def test_offline_gluon_and_sm100_builds(tmp_path):
    """The real builds: a Gluon attention forward for sm_90 (the shipped ping-pong one: the single-partition probe
    variant this used to build is, rightly, a warning now, ptxas having serialized its wgmma) is matmul-like and
    passes; matmul for sm_100 (tcgen05) passes."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, "-c", _OFFLINE, str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["gluon"] and all(r["matmul_like"] and r["level"] == "ok" for r in got["gluon"]), got
    assert got["rc"] == 0, res.stdout[-3000:]
    reports = json.loads(out.read_text())
    assert all(r["ptx"]["tcgen05.mma"] > 0 and r["level"] == "ok" for r in reports), reports
    if all(r["sass"] is not None for r in reports):
        assert all(r["sass"]["UTCMMA"] > 0 for r in reports)


def test_report_without_sass_reads_the_resources_and_never_disassembles(monkeypatch):
    """report_compiled(sass=False): cuobjdump runs for the resource usage only (registers, stack), never -sass; the
    report counts the PTX and says the SASS was not read."""
    flags = []

    def cuobjdump(cubin, flag):
        flags.append(flag)
        usage = " Function k:\n  REG:90 STACK:0 SHARED:1024 LOCAL:0\n"
        return (usage, "") if flag == "-res-usage" else ("HGMMA ;\n", "")

    monkeypatch.setattr(hi, "_run_cuobjdump", cuobjdump)
    kernel = _kernel(".target sm_90a\n\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2;")
    rep = hi.report_compiled("k", kernel, sass=False)
    assert flags == ["-res-usage"] and rep.sass is None and rep.registers == 90 and rep.spill_bytes == 0
    assert rep.ptx["wgmma"] == 1 and any("not read: sass=False" in n for n in rep.notes), rep.notes
    flags.clear()
    assert hi.report_compiled("k", kernel).sass["HGMMA"] == 1 and flags == ["-sass", "-res-usage"]
