"""hearth.inspect, review 52g: the command's bad input as a user meets it on a machine without a GPU
(`hearth inspect OP --arch ... --json ...`): each is refused up front, exit 2, naming the argument -- before
anything is compiled (an arch LLVM does not know aborted the process; an exception left exit 1, the code
that means "a matmul without tensor cores")."""

from __future__ import annotations

import importlib
import json

import pytest

from hearth import inspect as hi

importlib.import_module("hearth.kernels")  # as tests/test_inspect.py: import under the suite's interpreter setting

HAS_PTXAS = bool(hi._tool("ptxas")) and bool(hi._tool("ptxas_blackwell"))


def _stub_report(arch):
    """One kernel's report as an offline build gives it (a wgmma kernel, no spill): the arguments were accepted and
    something was inspected, so main exits 0."""
    return hi.KernelReport(label="stub matmul", name="k", target=f"sm_{arch}a", matmul_like=True,
                           ptx=dict(hi.count_ptx(""), wgmma=8),
                           sass=None, registers=64, spill_bytes=0, shared_bytes=0, num_warps=4, num_stages=3,
                           level="ok", verdict="ok")


@pytest.fixture
def offline(monkeypatch):
    """collect_offline replaced by a recorder: nothing is compiled, and a test sees whether it was reached."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    calls = []

    def record(op, arch, dtype):
        calls.append((op, arch))
        return [_stub_report(arch)]

    monkeypatch.setattr(hi, "collect_offline", record)
    return calls


@pytest.mark.skipif(not HAS_PTXAS, reason="Triton's bundled ptxas tells which archs it can build for")
@pytest.mark.parametrize("arch", ["sm_91", "sm_999"])
def test_arch_the_installed_triton_cannot_target_is_refused(arch, offline, capsys):
    """Before: sm_91 died in LLVM ("Cannot select: intrinsic %llvm.nvvm.elect.sync", exit 134, no Python error) and
    sm_999 ended in a PassManager traceback with exit 1."""
    assert hi.main("matmul", arch=arch) == 2
    out = capsys.readouterr().out.replace("\n", " ")
    assert "--arch" in out and arch in out, out
    assert offline == []


@pytest.mark.skipif(not HAS_PTXAS, reason="Triton's bundled ptxas tells which archs it can build for")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "90a", "sm_100", "sm_120"])
def test_targetable_archs_still_pass(arch, offline):
    assert hi.main("matmul", arch=arch) == 0
    assert offline == [("matmul", int(arch.removeprefix("sm_").rstrip("a")))]


def test_unknown_op_is_named_before_the_cuda_check(capsys, monkeypatch):
    """Before, on a machine without a GPU: `hearth inspect nosuch` answered "no CUDA GPU is visible", and the user
    who then added --arch learnt only then that the op does not exist."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert hi.main("nosuch") == 2
    out = capsys.readouterr().out.replace("\n", " ")
    assert "unknown op 'nosuch'" in out and "matmul" in out, out


def test_json_into_a_missing_folder_is_refused_before_compiling(tmp_path, offline, capsys):
    """Before: the kernels were compiled and printed, then write_text raised FileNotFoundError (a traceback, exit 1)."""
    target = tmp_path / "no-such-dir" / "r.json"
    assert hi.main("matmul", arch="sm_90", json_out=target) == 2
    out = capsys.readouterr().out
    flat = "".join(out.split())  # rich wraps at the console's width, inside a long path too (no-such-\ndir)
    assert "--json" in flat and "".join(str(target.parent).split()) in flat, out
    assert offline == [] and not target.exists()


def test_json_is_written_when_no_kernel_was_found(tmp_path, monkeypatch, capsys):
    """Before: with no kernel the JSON was not written, so a script reading it found the previous run's file. And
    the run exits 2, as the help says for "nothing to compile for" (it exited 0, which a gate reads as "inspected,
    no problem": a shape that launches no Triton kernel passed a tensor-core check it never ran)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(hi, "collect_offline", lambda op, arch, dtype: [])
    target = tmp_path / "r.json"
    target.write_text(json.dumps([{"label": "stale", "level": "ok"}]))
    assert hi.main("matmul", arch="sm_90", json_out=target) == 2
    assert json.loads(target.read_text()) == []
    out = capsys.readouterr().out.replace("\n", " ")
    assert "no Triton kernel was launched" in out and "nothing was inspected" in out


def test_a_build_that_fails_is_exit_3_naming_the_error(monkeypatch, capsys):
    """Before: a compiler failure (ptxas, an MLIR pass) escaped as a traceback with exit 1, the code that means "a
    matmul without tensor cores", so a script could not tell the two apart."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")

    def failing(op, arch, dtype):
        raise RuntimeError("PTXAS error: Internal Triton PTX codegen error\nptxas fatal : ...")

    monkeypatch.setattr(hi, "collect_offline", failing)
    assert hi.main("matmul", arch="sm_90") == 3
    out = capsys.readouterr().out.replace("\n", " ")
    assert "the build failed" in out and "RuntimeError" in out and "PTXAS error" in out
