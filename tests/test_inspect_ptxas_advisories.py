"""hearth inspect reads ptxas's performance advisories: a wgmma kernel that ptxas serialized (C7514: every wgmma
waits for the one before, the tensor cores run one matmul at a time) compiles and computes the right result, so
only the compiler's log tells. Triton throws that log away; inspect re-assembles the PTX with `ptxas -v`."""

from __future__ import annotations

from pathlib import Path

from hearth import inspect as hi
from tests.kernels.offline import run_offline

DATA = Path(__file__).parent / "data" / "inspect"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_parse_ptxas_advisories():
    # ptxas -v on the fused attention backward with an S^T accumulator in flight across its step loop's back edge
    # (offline sm_90, Triton 3.6.0's ptxas, 2026-12-07)
    found = hi.parse_ptxas_advisories(read("ptxas_c7514_sm90.txt"))
    assert found == ["C7514: Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma "
                     "instructions reading accumulator registers of a wgmma between start and end of the pipeline "
                     "stage in the function '_attn_bwd_fused_gluon_kernel'"]
    # the producer-warp Gluon forward (a probe variant): an injected wait and the serialization, in order
    assert [a[:5] for a in hi.parse_ptxas_advisories(read("ptxas_c7517_sm90.txt"))] == ["C7517", "C7514"]
    assert hi.parse_ptxas_advisories("ptxas info    : Used 168 registers, used 3 barriers\n") == []
    assert hi.parse_ptxas_advisories(read("ptxas_c7514_sm90.txt") * 2) == found  # each once
    assert hi.parse_ptxas_spills(read("ptxas_c7514_sm90.txt")) == (0, 0)


def _report(advisories):
    ptx = read("wgmma_sm90.ptx")
    return hi.KernelReport(label="k", name="k", target=hi.ptx_target(ptx), matmul_like=True, ptx=hi.count_ptx(ptx),
                           sass=hi.count_sass(read("wgmma_sm90.sass")), registers=168, spill_bytes=0,
                           shared_bytes=1024, num_warps=4, num_stages=2, ptxas_advisories=advisories)


def test_verdict_names_a_serialized_wgmma():
    assert hi.verdict(_report([]))[0] == "ok"
    level, text = hi.verdict(_report(hi.parse_ptxas_advisories(read("ptxas_c7517_sm90.txt"))))
    assert level == "warn" and "wgmma tensor cores" in text
    assert "ptxas serialized the wgmma (C7514)" in text and "ptxas injected a warpgroup.wait (C7517)" in text
    # an advisory of another kind is kept in the report but does not change the verdict
    assert hi.verdict(_report(["C7999: something else"]))[0] == "ok"


_SCRIPT = r"""
import importlib, json, torch
from hearth import inspect as hi
ag = importlib.import_module("hearth.kernels.attention_gluon")
mm = importlib.import_module("hearth.kernels.matmul")
builds = list(mm.offline_kernels(90, torch.bfloat16))
builds += ag.offline_kernels(90, torch.bfloat16, variants=("pps", "bwd_fused"), head_dims=(64, 128), causal=(True,))
builds += ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(128,), causal=(True,), varlen=True,
                             fb_dq_pad=64)
control = ag.offline_kernels(90, torch.bfloat16, variants=("ws",), head_dims=(128,), causal=(True,))
out = [dict(label=label, advisories=hi.ptxas_advisories(k)) for label, k in builds]
r = hi.report_compiled(*control[0])
out.append(dict(label=r.label, advisories=r.ptxas_advisories, level=r.level, verdict=r.verdict, notes=r.notes))
print(json.dumps(out))
"""


def test_shipped_wgmma_kernels_are_not_serialized():
    """The wgmma kernels hearth ships on Hopper, built offline for sm_90: matmul's, the persistent attention forward
    and the fused backward (dense d64 / d128, packed d128; causal): ptxas has no advisory for any of them. The
    control, the producer-warp forward (a probe variant, never routed by default), is serialized (C7514), and
    report_compiled says so in its verdict and notes."""
    *shipped, control = run_offline(_SCRIPT)
    assert len(shipped) >= 8, shipped
    for r in shipped:
        assert r["advisories"] == [], r
    assert [a[:5] for a in control["advisories"]] == ["C7517", "C7514"], control
    assert control["level"] == "warn" and "ptxas serialized the wgmma (C7514)" in control["verdict"], control
    assert any(n.startswith("ptxas C7514: ") for n in control["notes"]), control
