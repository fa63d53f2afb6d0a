"""hearth.inspect: the parsers and verdicts on stored compiler output (tests/data/inspect/: cut from
Triton 3.6 builds of hearth's matmul kernels -- TMA+wgmma for sm_90a, mma.sync for sm_80, and an
fp32 'ieee' dot that compiles to plain FMAs), the report/render path with a stand-in kernel object,
and the command's refusal without CUDA. The GPU test compiles the real matmul."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from hearth import inspect as hi

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


def test_hfma2_mma_is_not_a_tensor_core_instruction():
    text = read("flat_fma_sm90.sass")
    assert "HFMA2.MMA" in text  # the fixture holds the look-alike
    assert hi.count_sass(text)["HMMA"] == 0


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
def test_main_without_cuda_exits_nonzero(capsys):
    assert hi.main("matmul") == 2
    assert "no CUDA GPU" in capsys.readouterr().out.replace("\n", " ")


@pytest.mark.parametrize("shape,dtype", [("12xq", "bfloat16"), ("0x4", "bfloat16"), (None, "int8")])
def test_main_bad_arguments(shape, dtype, capsys):
    assert hi.main("matmul", shape, dtype) == 2
    assert "error" in capsys.readouterr().out


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU path")
def test_cli_inspect_refuses_without_cuda():
    from typer.testing import CliRunner

    from hearth.cli import app

    res = CliRunner().invoke(app, ["inspect", "matmul", "--shape", "64x64x64"])
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
