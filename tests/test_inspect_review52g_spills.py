"""hearth.inspect, review 52g: what the spill column and the SASS note claim, checked against ptxas -v and
cuobjdump on real cubins (two small hand-written PTX kernels assembled by Triton's bundled ptxas: no Triton
compile). `hearth inspect matmul --arch sm_120` printed "8 bytes spilled to local memory" and a
warning for kernels whose ptxas -v reads "8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"."""

from __future__ import annotations

import importlib
import subprocess
from types import SimpleNamespace

import pytest

from hearth import inspect as hi

importlib.import_module("hearth.kernels")  # as tests/test_inspect.py: import under the suite's interpreter setting

PTXAS, CUOBJDUMP = hi._tool("ptxas"), hi._tool("cuobjdump")
needs_tools = pytest.mark.skipif(not (PTXAS and CUOBJDUMP), reason="needs Triton's bundled ptxas and cuobjdump")

HEAD = ".version 8.0\n.target sm_90a\n.address_size 64\n\n"
# a local array indexed at run time: a 64-byte stack frame that holds no spilled register
STACK_PTX = HEAD + """\
.visible .entry stack_kernel(.param .u64 out, .param .u32 i, .param .u32 j)
{
\t.local .align 8 .b8 buf[64];
\t.reg .b32 %r<6>;
\t.reg .b64 %rd<8>;
\tld.param.u64 %rd1, [out];
\tld.param.u32 %r1, [i];
\tld.param.u32 %r4, [j];
\tmov.u64 %rd2, buf;
\tand.b32 %r2, %r1, 15;
\tmul.wide.u32 %rd3, %r2, 4;
\tadd.u64 %rd4, %rd2, %rd3;
\tst.local.u32 [%rd4], %r4;
\tand.b32 %r5, %r4, 15;
\tmul.wide.u32 %rd6, %r5, 4;
\tadd.u64 %rd7, %rd2, %rd6;
\tld.local.u32 %r3, [%rd7];
\tcvta.to.global.u64 %rd5, %rd1;
\tst.global.u32 [%rd5], %r3;
\tret;
}
"""


def _spill_ptx(n: int = 40) -> str:
    """n floats all live at once under .maxnreg 16: ptxas must spill them."""
    body = [f"\tld.volatile.global.f32 %f{i}, [%rd1+{4 * i}];" for i in range(n)]
    body += [f"\tmov.f32 %f{n}, 0f00000000;"] + [f"\tadd.f32 %f{n}, %f{n}, %f{i};" for i in range(n)]
    for i in range(n):
        body += [f"\tmul.f32 %f{n + 1 + i}, %f{i}, %f{n};", f"\tst.volatile.global.f32 [%rd2+{4 * i}], %f{n + 1 + i};"]
    return HEAD + "\n".join([
        ".visible .entry spill_kernel(.param .u64 src, .param .u64 dst) .maxnreg 16", "{",
        f"\t.reg .f32 %f<{2 * n + 2}>;", "\t.reg .b64 %rd<4>;",
        "\tld.param.u64 %rd1, [src];", "\tld.param.u64 %rd2, [dst];",
        "\tcvta.to.global.u64 %rd1, %rd1;", "\tcvta.to.global.u64 %rd2, %rd2;", *body, "\tret;", "}", ""])


def _kernel(ptx: str, name: str, tmp_path, **extra):
    src, out = tmp_path / f"{name}.ptx", tmp_path / f"{name}.cubin"
    src.write_text(ptx)
    subprocess.run([PTXAS, "--gpu-name=sm_90a", str(src), "-o", str(out)], check=True, capture_output=True, timeout=60)
    meta = SimpleNamespace(name=name, shared=0, num_warps=4, num_stages=1, enable_fp_fusion=True, ptx_options=None)
    return SimpleNamespace(asm={"ptx": ptx, "cubin": out.read_bytes(), "ttir": ""}, metadata=meta, **extra)


@needs_tools
def test_a_stack_frame_without_spills_is_not_reported_as_spills(tmp_path):
    rep = hi.report_compiled("stack", _kernel(STACK_PTX, "stack_kernel", tmp_path))
    assert rep.spill_bytes == 0, rep
    assert rep.stack_bytes == 64  # cuobjdump -res-usage: STACK:64
    assert rep.level == "ok" and "spilled" not in rep.verdict, rep.verdict
    assert any("64 bytes of stack frame" in n and "no register spills" in n for n in rep.notes), rep.notes


@needs_tools
def test_real_spills_are_still_reported(tmp_path):
    rep = hi.report_compiled("spill", _kernel(_spill_ptx(), "spill_kernel", tmp_path))
    assert rep.spill_bytes and rep.level == "warn" and f"{rep.spill_bytes} bytes spilled" in rep.verdict, rep
    assert rep.spill_bytes == rep.stack_bytes  # the frame's bytes: what the spills occupy


@pytest.mark.skipif(not CUOBJDUMP, reason="needs Triton's bundled cuobjdump")
def test_sass_note_says_why_when_cuobjdump_is_there_but_fails(tmp_path):
    """Before: `hearth inspect matmul --arch sm_103` (and sm_121) said "SASS unavailable (no cuobjdump)" though
    Triton ships one: it was there and refused the cubin ("nvdisasm fatal : Cannot decode architecture 'SM103a'")."""
    k = SimpleNamespace(asm={"ptx": ".target sm_103a\n", "cubin": b"not a cubin", "ttir": ""},
                        metadata=SimpleNamespace(name="k", shared=0, num_warps=4, num_stages=1))
    rep = hi.report_compiled("k", k)
    assert rep.sass is None
    assert not any("no cuobjdump" in n for n in rep.notes), rep.notes
    assert any("cuobjdump" in n and "could not" in n for n in rep.notes), rep.notes
