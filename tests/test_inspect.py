"""hearth.inspect: the parsers and verdicts on stored compiler output (tests/data/inspect/: cut from
Triton 3.6 builds of hearth's matmul kernels -- TMA+wgmma for sm_90a, mma.sync for sm_80, and an
fp32 'ieee' dot that compiles to plain FMAs), the report/render path with a stand-in kernel object,
and the command's refusal without CUDA. The GPU test compiles the real matmul."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from hearth import inspect as hi

# the kernels imported now, under the suite's interpreter setting, as a whole-suite run does before this file: a
# test below sets TRITON_INTERPRET=0, and Gluon's modules refuse a first import with the flag changed under them
importlib.import_module("hearth.kernels")

DATA = Path(__file__).parent / "data" / "inspect"
HAS_CUDA = torch.cuda.is_available()


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    "name,expected",
    [
        ("wgmma_sm90.ptx", dict(wgmma=4, **{"mma.sync": 0}, tma=4, **{"fma.f32": 0})),
        ("mma_sm80.ptx", dict(wgmma=0, **{"mma.sync": 6}, tma=0)),
        ("flat_fma_sm90.ptx", dict(wgmma=0, **{"mma.sync": 0}, wmma=0, **{"fma.f32": 9})),
    ],
)
def test_count_ptx(name, expected):
    counts = hi.count_ptx(read(name))
    for key, value in expected.items():
        assert counts[key] == value, (key, counts)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("wgmma_sm90.sass", dict(HGMMA=4, HMMA=0, UTMA=8, FFMA=0)),
        ("mma_sm80.sass", dict(HGMMA=0, HMMA=6, UTMA=0)),
        ("flat_fma_sm90.sass", dict(HGMMA=0, HMMA=0, FFMA=8)),
    ],
)
def test_count_sass(name, expected):
    counts = hi.count_sass(read(name))
    for key, value in expected.items():
        assert counts[key] == value, (key, counts)


def test_count_sass_by_words_is_the_search_per_pattern():
    """count_sass counts whole words (each pattern is one); a search of the comment-free text per pattern gives the
    same counts, on the fixtures and on look-alikes: a pattern inside a longer word, after a dot, in a comment."""
    import re

    tricky = ("HGMMA.64x128x16.F32.BF16 R0 ; XHGMMA R1 ; HGMMAX ; @P0 HMMA.16816.F32 ; HFMA2.MMA R2 ;\n"
              "UTMALDG.2D [UR4] ; UTMALDGX ; UTCHMMA ; UTCMMA ; LDL.64 R4 ; STL [R1] ; /* HGMMA */ // FFMA\n")
    for text in [read(n) for n in ("wgmma_sm90.sass", "mma_sm80.sass", "flat_fma_sm90.sass")] + [tricky]:
        body = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text))
        assert hi.count_sass(text) == {k: len(re.findall(p, body)) for k, p in hi.SASS_PATTERNS.items()}
    assert hi.count_sass(tricky) == dict(HGMMA=1, QGMMA=0, IGMMA=0, UTCMMA=2, HMMA=1, IMMA=0, UTMA=1, FFMA=0,
                                         **{"LDL/STL": 2})
    for pattern in hi.SASS_PATTERNS.values():  # what counting by words relies on
        assert pattern.startswith(r"\b") and pattern.endswith(r"\b"), pattern


def test_hfma2_mma_is_not_a_tensor_core_instruction():
    text = read("flat_fma_sm90.sass")
    assert "HFMA2.MMA" in text  # the fixture holds the look-alike
    assert hi.count_sass(text)["HMMA"] == 0


def test_tma_reduce_counts_as_tma():
    """A TMA reduce-add (the fused attention backward's dQ) is a TMA bulk op in PTX and in SASS."""
    ptx = "\tcp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];"
    assert hi.count_ptx(ptx)["tma"] == 1
    assert hi.count_sass("UTMAREDG.3D.ADD [UR4], [UR8] ;")["UTMA"] == 1


def test_render_prints_labels_with_brackets_as_they_are():
    """Kernel labels such as "bwd[fused]" are text, not rich markup: the table and the notes keep the brackets."""
    rep = hi.KernelReport(label="attention_gluon bwd[fused] d128", name="k", target="sm_90a", matmul_like=True,
                          ptx=dict(hi.count_ptx(""), wgmma=4), sass=None, registers=168, spill_bytes=0,
                          shared_bytes=1024, num_warps=4, num_stages=2, notes=["see [notes]"])
    rep.level, rep.verdict = hi.verdict(rep)
    console = Console(record=True, width=250)
    hi.render([rep], console)
    out = console.export_text()
    assert "bwd[fused] d128" in out and "see [notes]" in out


def test_comments_do_not_count():
    assert hi.count_ptx("// wgmma.mma_async.sync.aligned.m64n256k16\n\tadd.s32 %r1, %r2, 1;")["wgmma"] == 0
    assert hi.count_sass("/* HGMMA.64x128x16 */ FFMA R1, R2, R3, R4 ;") == dict(hi.count_sass(""), FFMA=1)


def test_ptx_target_and_dot_detection():
    assert hi.ptx_target(read("wgmma_sm90.ptx")) == "sm_90a"
    assert hi.ptx_target(read("mma_sm80.ptx")) == "sm_80"
    assert hi.uses_dot(read("flat_fma_sm90.ttir"))
    assert not hi.uses_dot("tt.func @softmax() { %0 = tt.load %p : tensor<128x!tt.ptr<f32>> }")


def test_parse_res_usage():
    usage = hi.parse_res_usage(read("res_usage.txt"))
    assert usage["_matmul_tma_kernel"]["REG"] == 161
    assert usage["_matmul_kernel_flat"]["REG"] == 72
    assert usage["_spilling_kernel"]["STACK"] == 96 and usage["_spilling_kernel"]["LOCAL"] == 32


def _report(ptx_file, sass_file=None, *, matmul_like=True, spill=0):
    ptx = read(ptx_file)
    return hi.KernelReport(
        label="k", name="k", target=hi.ptx_target(ptx), matmul_like=matmul_like, ptx=hi.count_ptx(ptx),
        sass=hi.count_sass(read(sass_file)) if sass_file else None, registers=128, spill_bytes=spill,
        shared_bytes=1024, num_warps=8, num_stages=3,
    )


def test_verdicts():
    level, text = hi.verdict(_report("flat_fma_sm90.ptx", "flat_fma_sm90.sass"))
    assert level == "error" and text.startswith("No tensor-core instructions were emitted")
    level, text = hi.verdict(_report("wgmma_sm90.ptx", "wgmma_sm90.sass"))
    assert level == "ok" and "wgmma" in text and "TMA" in text
    assert hi.verdict(_report("mma_sm80.ptx", "mma_sm80.sass"))[0] == "ok"
    # a flat kernel that has no tl.dot is fine
    assert hi.verdict(_report("flat_fma_sm90.ptx", matmul_like=False)) == ("ok", "no matmul in this kernel: tensor cores not expected")
    level, text = hi.verdict(_report("wgmma_sm90.ptx", spill=128))
    assert level == "warn" and "128 bytes spilled" in text


def test_mma_sync_on_hopper_is_a_warning():
    rep = _report("mma_sm80.ptx", "mma_sm80.sass")
    rep.target = "sm_90a"
    level, text = hi.verdict(rep)
    assert level == "warn" and "wgmma" in text


def test_report_compiled_and_render_shout_on_flat_matmul(tmp_path):
    kernel = SimpleNamespace(
        asm={"ptx": read("flat_fma_sm90.ptx"), "ttir": read("flat_fma_sm90.ttir"), "cubin": b""},
        metadata=SimpleNamespace(name="_matmul_kernel", shared=1024, num_warps=4, num_stages=2),
        n_regs=72, n_spills=0,
    )
    rep = hi.report_compiled("matmul fp32", kernel)
    assert rep.level == "error" and rep.sass is None and rep.registers == 72
    console = Console(record=True, width=200)
    hi.render([rep], console)
    out = console.export_text()
    assert "NO TENSOR-CORE INSTRUCTIONS WERE EMITTED" in out
    assert "SASS unavailable" in out


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU path")
def test_main_without_cuda_exits_nonzero(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert hi.main("matmul") == 2
    assert "no CUDA GPU" in capsys.readouterr().out.replace("\n", " ")


def test_main_under_interpreter_exits_nonzero(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert hi.main("matmul", arch="sm_90") == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().out


@pytest.mark.parametrize("shape,dtype", [("12xq", "bfloat16"), ("0x4", "bfloat16"), (None, "int8")])
def test_main_bad_arguments(shape, dtype, capsys):
    assert hi.main("matmul", shape, dtype) == 2
    assert "error" in capsys.readouterr().out


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU path")
def test_cli_inspect_refuses_without_cuda():
    from typer.testing import CliRunner

    from hearth.cli import app

    res = CliRunner().invoke(app, ["inspect", "matmul", "--shape", "64x64x64"], env={"TRITON_INTERPRET": "0"})
    assert res.exit_code == 2
    assert "CUDA" in res.output


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_inspect_matmul_has_tensor_cores(tmp_path):
    out = tmp_path / "r.json"
    assert hi.main("matmul", "1024x1024x1024", "bfloat16", json_out=out) == 0
    reports = json.loads(out.read_text())
    assert reports and all(r["matmul_like"] for r in reports)
    assert all(r["ptx"]["wgmma"] + r["ptx"]["mma.sync"] > 0 for r in reports)
    if torch.cuda.get_device_capability()[0] == 9:
        assert any(r["ptx"]["wgmma"] > 0 for r in reports)


_OFFLINE = r"""
import importlib, json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hearth import inspect as hi
mm = importlib.import_module("hearth.kernels.matmul")
# LESSON 4 for real: an fp32 dot forced to 'ieee' precision compiles to plain FMAs on sm_90
const = dict(stride_ak=1, stride_bn=1, stride_cn=1, PRECISION="ieee", UPCAST=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8)
sig = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}
sig.update({k: "constexpr" for k in const})
flat = triton.compile(ASTSource(fn=mm._matmul_kernel, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
reports = [hi.report_compiled(label, k) for label, k in mm.offline_kernels(90, torch.bfloat16)]
reports.append(hi.report_compiled("flat", flat))
rc = hi.main("matmul", arch="sm_90", json_out=__import__("pathlib").Path(sys.argv[1]))  # the command's offline path
assert rc == 0, rc
print(json.dumps([dict(label=r.label, level=r.level, verdict=r.verdict, ptx=r.ptx, sass=r.sass, registers=r.registers) for r in reports]))
"""


def test_offline_sm90_build_of_the_real_kernels(tmp_path):
    """Compiles hearth's matmul for sm_90 on this (GPU-less) machine with Triton's bundled ptxas:
    the TMA kernels must emit wgmma (HGMMA in SASS) and TMA copies; a forced-'ieee' fp32 dot must be
    called out as having no tensor-core instructions."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, "-c", _OFFLINE, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    reports = {r["label"]: r for r in json.loads(res.stdout.strip().splitlines()[-1])}
    tma = [r for label, r in reports.items() if "[tma]" in label]
    assert len(tma) == 2
    for r in tma:
        assert r["level"] == "ok" and r["ptx"]["wgmma"] > 0 and r["ptx"]["tma"] > 0, r
        if r["sass"] is not None:
            assert r["sass"]["HGMMA"] > 0 and r["sass"]["UTMA"] > 0
        assert r["registers"] and r["registers"] <= 255
    flat = reports["flat"]
    assert flat["level"] == "error" and flat["verdict"].startswith("No tensor-core instructions")
    assert flat["ptx"]["fma.f32"] > 0
    assert all(r["ptx"]["wgmma"] > 0 for r in json.loads(out.read_text()))  # `hearth inspect matmul --arch sm_90 --json`
    assert hi.main("matmul", arch="sm_9x") == 2
