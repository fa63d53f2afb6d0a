"""Tests for hearth.kernels.attention_gluon (the Gluon flash-attention forward for Hopper) and for the one
place that chooses it (attention.forward_kernel).

CPU (CI): the Triton interpreter does not run Gluon, so the kernel is compiled offline for sm_90 with
Triton's bundled ptxas, every (dtype, head_dim, causal) variant, and the compiled code is read with
hearth.inspect: wgmma (PTX wgmma.mma_async / SASS HGMMA), TMA (cp.async.bulk.tensor / UTMALDG, UTMASTG),
no spills, registers and shared memory within the H200's limits. The choice of kernel and the TMA
addressability check are tested directly.

GPU (test_gpu_*, skip without a CUDA GPU of compute capability 9.x): O and the log-sum-exp against an
fp64 reference under tests/kernels/tolerance.py's rule, and the full forward + backward through
attention() with HEARTH_ATTN_GLUON=1, at several T (ragged tails included), GQA 40/8 and strided views.
The ping-pong variant's GPU tests (test_gpu_pp_*, marker gluon_pp) run each case in a subprocess with a
timeout: a wrong barrier schedule hangs the GPU, and a hang must fail that test, not stall the suite.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.kernels.offline import run_offline
from tests.kernels.tolerance import HAS_CUDA, assert_close

attn = importlib.import_module("hearth.kernels.attention")
ag = importlib.import_module("hearth.kernels.attention_gluon")

# ---------------------------------------------------------------- offline sm_90 build (CPU)
_SCRIPT = r"""
import json, re, sys, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
dtype = getattr(torch, sys.argv[1])
out = []
for label, k in ag.offline_kernels(90, dtype):
    r = hi.report_compiled(f"{dtype} {label}", k)
    ptx = k.asm["ptx"]
    out.append(dict(label=r.label, target=r.target, ptx=r.ptx, sass=r.sass, registers=r.registers,
                    spill=r.spill_bytes, shared=r.shared_bytes, level=r.level, verdict=r.verdict,
                    warps=r.num_warps, scratch=getattr(k.metadata, "global_scratch_size", None),
                    tensormap_ops=len(re.findall(r"tensormap\.", ptx)),
                    setmaxnreg=sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
                    wgmma_waits=sorted(set(int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)))))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sm90_reports():
    """Reports of every variant, built offline for sm_90 (one subprocess per dtype, in parallel: the
    interpreter flag must be off for triton.compile, and the two builds share CI's two cores)."""
    return [r for dtype in run_offline(_SCRIPT, ("bfloat16",), ("float16",)) for r in dtype]


def test_every_variant_compiles_for_sm90(sm90_reports):
    """The five variants (forward: single partition; producer warp + consumer warpgroups; ping-pong; the
    backward's dK / dV and dQ kernels) x dtype x head_dim x causal."""
    labels = [r["label"] for r in sm90_reports]
    assert len(labels) == 2 * 5 * len(ag.HEAD_DIMS) * 2, labels
    for dtype in ("bfloat16", "float16"):
        for variant in ("fwd", "fwd[ws]", "fwd[pp]", "bwd[dkdv]", "bwd[dq]"):
            for d in ag.HEAD_DIMS:
                for mode in ("full", "causal"):
                    want = f"torch.{dtype} attention_gluon {variant} d{d} {mode} "
                    assert sum(want in lab for lab in labels) == 1, (want, labels)
    assert all(r["target"] == "sm_90a" for r in sm90_reports), [r["target"] for r in sm90_reports]


def test_sm90_build_uses_wgmma_and_tma(sm90_reports):
    for r in sm90_reports:
        assert r["ptx"]["wgmma"] > 0, f"{r['label']}: no wgmma.mma_async in the PTX"
        assert r["ptx"]["mma.sync"] == 0, f"{r['label']}: mma.sync (pre-Hopper tensor cores) in the PTX"
        # TMA copies of Q, K, V and O (K and V also in the prologue / the producer's loop)
        assert r["ptx"]["tma"] >= 4, f"{r['label']}: expected TMA copies of Q, K, V and O, PTX has {r['ptx']['tma']}"
        if " fwd d" in r["label"] or " fwd[ws] " in r["label"]:
            # the single-partition and producer-warp forwards (probe variants, never routed by default): ptxas
            # serializes their wgmma (C7514, after an injected warpgroup.wait, C7517), which the report names
            assert r["level"] == "warn" and "ptxas serialized the wgmma (C7514)" in r["verdict"], r
        else:
            assert r["level"] == "ok", f"{r['label']}: {r['verdict']}"
        if r["sass"] is not None:  # cuobjdump ships with Triton; without it, PTX only
            assert r["sass"]["HGMMA"] > 0, f"{r['label']}: no HGMMA in the SASS"
            assert r["sass"]["UTMA"] >= 4, f"{r['label']}: too few UTMALDG/UTMASTG in the SASS"


def test_sm90_build_has_no_spills_and_fits(sm90_reports):
    for r in sm90_reports:
        assert r["spill"] == 0, f"{r['label']}: {r['spill']} bytes spilled"
        assert r["ptx"]["local"] == 0, f"{r['label']}: local-memory loads/stores in the PTX"
        if r["sass"] is not None:
            assert r["sass"]["LDL/STL"] == 0, f"{r['label']}: LDL/STL in the SASS"
        assert r["registers"] is not None and r["registers"] <= 255, f"{r['label']}: {r['registers']} registers"
        assert 0 < r["shared"] <= 227 * 1024, f"{r['label']}: {r['shared']} bytes of shared memory (H200: 227 KiB)"


def test_sm90_ping_pong_build_is_warp_specialised_and_overlapped(sm90_reports):
    """The ping-pong build: host-built TMA descriptors (no global scratch); register budgets moved by setmaxnreg (the producer warp down to
    PRODUCER_REGS, consumer warpgroup 1 to CONSUMER_REGS), and the consumers' wgmma wait with one group
    still in flight (QK^T(j) retired, PV(j - 1) still running: the overlap the schedule is for)."""
    pp = [r for r in sm90_reports if "fwd[pp]" in r["label"]]
    assert len(pp) == 2 * len(ag.HEAD_DIMS) * 2, [r["label"] for r in sm90_reports]
    for r in pp:
        assert ["dec", str(ag.PRODUCER_REGS)] in r["setmaxnreg"], (r["label"], r["setmaxnreg"])
        assert ["inc", str(ag.CONSUMER_REGS)] in r["setmaxnreg"], (r["label"], r["setmaxnreg"])
        assert 1 in r["wgmma_waits"], f"{r['label']}: no wgmma.wait_group 1 (waits: {r['wgmma_waits']})"
        # consumer warpgroups 0 and 1, and the producer warp padded to a warpgroup: 384 threads a CTA
        assert r["warps"] == ag.PP_WARPS + 4 + 4, (r["label"], r["warps"])
        # its four TMA descriptors are built on the host: no device-side tensormap, no global scratch
        assert r["scratch"] == 0 and r["tensormap_ops"] == 0, (r["label"], r["scratch"], r["tensormap_ops"])


_NO_LSE_SCRIPT = r"""
import json, re, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for store in (True, False):
    for label, k in ag.offline_kernels(90, torch.bfloat16, head_dims=(64,), store_lse=store,
                                       variants=("1part", "ws", "pp")):
        out.append(dict(label=label, store_lse=store, st_global=len(re.findall(r"\bst\.global", k.asm["ptx"])),
                        spill=hi.report_compiled(label, k, sass=False).spill_bytes))
print(json.dumps(out))
"""


def test_sm90_inference_build_stores_no_logsumexp():
    """store_lse=False (no backward will run) builds every variant with Lse a None constexpr: the PTX has no
    global store left (O goes out by TMA), where the training build stores the logsumexp."""
    reports = run_offline(_NO_LSE_SCRIPT)
    assert len(reports) == 2 * 3 * 2, [r["label"] for r in reports]
    for r in reports:
        if r["store_lse"]:
            assert r["st_global"] > 0, f"{r['label']}: the training build stores no logsumexp"
        else:
            assert "no-lse" in r["label"] and r["st_global"] == 0, (r["label"], r["st_global"])
        assert r["spill"] == 0, f"{r['label']}: {r['spill']} bytes spilled"


def test_inference_forward_asks_the_gluon_kernel_for_no_logsumexp(monkeypatch):
    """_attention_forward passes store_lse through to the Gluon forward (positionally, as its spies take it)
    and returns the Gluon forward's lse as it comes (None when no backward will run)."""
    calls = []

    def fake(q, k, v, causal, scale, store_lse=True, ping_pong=None, persistent=None):
        calls.append(store_lse)
        assert ping_pong is False and persistent is False  # "gluon" asked for: not the ping-pong kernel
        return torch.zeros_like(q), (torch.zeros(q.shape[:3]) if store_lse else None)

    monkeypatch.setattr(attn, "forward_kernel", lambda *a, **kw: "gluon")
    monkeypatch.setattr(ag, "tma_addressable", lambda *t: True)
    monkeypatch.setattr(ag, "forward", fake)
    q = torch.randn(1, 2, 8, 64)
    assert attn._attention_forward(q, q, q, True, 0.125, store_lse=False)[1] is None
    assert attn._attention_forward(q, q, q, True, 0.125)[1] is not None
    assert calls == [False, True]


_BWD_CANDIDATES_SCRIPT = r"""
import json, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for variant, table, key in (("bwd", ag.BWD_CANDIDATES, "bwd_configs"), ("bwd_dq", ag.BWD_DQ_CANDIDATES, "bwd_dq_configs"),
                            ("bwd_fused", ag.FB_CANDIDATES, "fb_configs")):
    for d, cands in table.items():
        for cfg in cands:
            for label, k in ag.offline_kernels(90, torch.bfloat16, head_dims=(d,), variants=(variant,), **{key: {d: cfg}}):
                r = hi.report_compiled(label, k, sass=False)
                out.append(dict(label=label, spill=r.spill_bytes, wgmma=r.ptx["wgmma"], tma=r.ptx["tma"],
                                shared=r.shared_bytes))
print(json.dumps(out))
"""


_PP_CANDIDATES_SCRIPT = r"""
import json, re, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for d, cands in ag.PP_CANDIDATES.items():
    for cfg in cands:
        for label, k in ag.offline_kernels(90, torch.bfloat16, head_dims=(d,), variants=("pp",), pp_configs={d: cfg}):
            r = hi.report_compiled(label, k, sass=False)
            ptx = k.asm["ptx"]
            out.append(dict(label=label, cfg=list(cfg), spill=r.spill_bytes, warps=r.num_warps, wgmma=r.ptx["wgmma"],
                            tma=r.ptx["tma"], scratch=getattr(k.metadata, "global_scratch_size", None),
                            setmaxnreg=sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
                            wgmma_waits=sorted(set(int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)))))
print(json.dumps(out))
"""


def test_sm90_every_ping_pong_candidate_builds_without_spills():
    """Every ping-pong config the sweep may time (PP_CANDIDATES) builds for sm_90, causal or not: no spills, no
    global scratch, wgmma and TMA, 12 warps (two 4-warp consumers and the producer padded to a warpgroup),
    setmaxnreg giving the consumers CONSUMER_REGS and the producer PRODUCER_REGS, and the wgmma wait that keeps
    PV(j - 1) in flight."""
    reports = run_offline(_PP_CANDIDATES_SCRIPT)
    assert len(reports) == 2 * sum(len(c) for c in ag.PP_CANDIDATES.values()), [r["label"] for r in reports]
    for r in reports:
        assert r["spill"] == 0, f"{r['label']}: {r['spill']} bytes spilled"
        assert r["scratch"] == 0 and r["wgmma"] > 0 and r["tma"] > 0, r
        assert r["warps"] == 12, (r["label"], r["warps"])
        assert ["inc", str(ag.CONSUMER_REGS)] in r["setmaxnreg"], (r["label"], r["setmaxnreg"])
        assert ["dec", str(ag.PRODUCER_REGS)] in r["setmaxnreg"], (r["label"], r["setmaxnreg"])
        assert 1 in r["wgmma_waits"], (r["label"], r["wgmma_waits"])


def test_sm90_every_backward_candidate_builds_without_spills():
    """Every dK / dV, dQ and fused config (BWD_CANDIDATES / BWD_DQ_CANDIDATES / FB_CANDIDATES, the first of each is the shipped one;
    the fused one in its shipped forms) builds for sm_90, causal or not, with wgmma and TMA and no spills, but the
    fused backward's 128-query steps at head_dim 64 (FB_CONFIGS[64] since 2026-12-06: 6-9% faster on an
    H100 than 64-query steps, which spill none): at most 8 bytes without the causal mask, 16 with it."""
    for table, shipped in ((ag.BWD_CANDIDATES, ag.BWD_CONFIGS), (ag.BWD_DQ_CANDIDATES, ag.BWD_DQ_CONFIGS),
                          (ag.FB_CANDIDATES, ag.FB_CONFIGS)):
        for d, cands in table.items():
            assert cands[0] == shipped[d]
    reports = run_offline(_BWD_CANDIDATES_SCRIPT)
    n = sum(len(c) for t in (ag.BWD_CANDIDATES, ag.BWD_DQ_CANDIDATES, ag.FB_CANDIDATES) for c in t.values())
    assert len(reports) == 2 * n, [r["label"] for r in reports]
    for r in reports:
        limit = (16 if " causal " in r["label"] else 8) if "bwd[fused] d64" in r["label"] and " 128x128 " in r["label"] else 0
        assert r["spill"] <= limit and r["wgmma"] > 0 and r["tma"] >= 4 and r["shared"] <= 227 * 1024, r


_FB_FORMS_SCRIPT = r"""
import json, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []

def build(tma, **forms):
    for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(128,), **forms):
        r = hi.report_compiled(label, k, sass=False)
        ptx = k.asm["ptx"]
        out.append(dict(label=label, tma=tma, spill=r.spill_bytes, shared=r.shared_bytes,
                        reduces=ptx.count("cp.reduce.async.bulk.tensor"),
                        adds=ptx.count("atom.global") + ptx.count("red.global")))

for tma in (False, True):
    for ss in (False, True):
        for split in (False, True):
            build(tma, fb_configs={128: (32, 2)}, fb_dq_tma=tma, fb_stats_smem=ss, fb_dq_split=split)
# the shipped forms at the shipped config in the rule's other grid orders (PAIR_GROUP 0: every pair's key block 0
# first; 2: causal MHA's pairs of pairs; 4, 8, 16: causal GQA's groups at short sequences, 8 bytes of stack)
build(ag.FB_DQ_TMA, fb_pair_group=0)
build(ag.FB_DQ_TMA, fb_pair_group=ag.FB_MHA_CAUSAL_PAIRS[128])
for n in (4, 8, 16):
    build(ag.FB_DQ_TMA, fb_pair_group=n, causal=(True,))
print(json.dumps(out))
"""


def test_sm90_fused_backward_forms_build_without_spills():
    """The fused backward's forms at head_dim 128 with 32-query steps, every combination of DQ_TMA (dQ^T added by a
    TMA reduce-add: the PTX has cp.reduce.async.bulk.tensor and no global fp32 atomics; else atomics and no
    reduce), STATS_SMEM and DQ_SPLIT, for sm_90, causal or not: no spills, within the 227 KiB of shared memory a
    block may take; and the shipped forms in the grid orders fb_pair_group gives causal GQA (PAIR_GROUP 0) and
    causal MHA at head_dim 128 (2). Causal GQA's groups of 4, 8 and 16 pairs (short sequences) keep 8 bytes of
    stack at head_dim 128 (the offline build of 2026-12-06; taken for their 5-29% on the GPU: fb_pair_group).
    (The shipped forms at every candidate config, in the order of 1: the candidates test above.)"""
    reports = run_offline(_FB_FORMS_SCRIPT)
    assert len(reports) == 23, [r["label"] for r in reports]
    assert sum(" pairs0" in r["label"] for r in reports) == 2, [r["label"] for r in reports]
    assert sum(" pairs2" in r["label"] for r in reports) == 2, [r["label"] for r in reports]
    grouped = [r for r in reports if any(f" pairs{n} " in r["label"] for n in (4, 8, 16))]
    assert len(grouped) == 3 and all(" causal " in r["label"] for r in grouped), [r["label"] for r in reports]
    for r in reports:
        assert r["spill"] <= (8 if r in grouped else 0) and r["shared"] <= 227 * 1024, r
        assert (r["reduces"] > 0 and r["adds"] == 0) if r["tma"] else (r["reduces"] == 0 and r["adds"] > 0), r


_FB_DQ_ASYNC_SCRIPT = r"""
import json, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for varlen, causal, pair_group in ((False, (True, False), 0), (False, (True,), 8), (True, (True,), 0),
                                   (True, (True,), 8)):
    extra = dict(varlen=True, fb_dq_pad=64) if varlen else {}
    for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(128,), causal=causal,
                                       fb_pair_group=pair_group, fb_dq_async=True, **extra):
        r = hi.report_compiled(label, k, sass=False)
        out.append(dict(label=label, spill=r.spill_bytes, shared=r.shared_bytes,
                        reduces=k.asm["ptx"].count("cp.reduce.async.bulk.tensor")))
print(json.dumps(out))
"""


def test_sm90_fused_backward_dq_async_builds():
    """The probe form DQ_ASYNC (HEARTH_ATTN_FB_DQ_ASYNC=1: dQ^T's matmul issued behind dK's) at head_dim 128 with the
    dQ split, dense in every-pair order (causal or not) and in groups of 8 (causal), and packed: it builds for sm_90
    within shared memory, adds dQ^T by TMA reduce, and its accumulator beside P^T and dS^T costs the dense builds
    at most 40 bytes of stack (24 / 24 / 40 on 2026-12-06) and the packed ones none."""
    reports = run_offline(_FB_DQ_ASYNC_SCRIPT)
    assert len(reports) == 5 and all(" dq-async" in r["label"] for r in reports), [r["label"] for r in reports]
    for r in reports:
        assert r["shared"] <= 227 * 1024 and r["reduces"] > 0, r
        assert r["spill"] <= (0 if " varlen" in r["label"] else 40), r


_FB_LATE_RELEASE_SCRIPT = r"""
import json, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for varlen, causal, pair_group in ((False, (True, False), 0), (False, (True,), 8), (True, (True,), 0)):
    extra = dict(varlen=True, fb_dq_pad=64) if varlen else {}
    for late in (False, True):
        for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(128,),
                                           causal=causal, fb_pair_group=pair_group, fb_late_release=late, **extra):
            r = hi.report_compiled(label, k, sass=False)
            sass = hi._run_cuobjdump(k.asm["cubin"], "-sass")[0]
            out.append(dict(label=label, late=late, spill=r.spill_bytes, shared=r.shared_bytes,
                            bars=sass.count("BAR.SYNC"), arrives=k.asm["ptx"].count("mbarrier.arrive.shared")))
print(json.dumps(out))
"""


def test_sm90_fused_backward_late_release_builds():
    """The shipped form LATE_RELEASE (FB_LATE_RELEASE: the Q / dO slot given back after dQ^T's matmul, on the one
    mbarrier that also frees dS^T's buffer) at head_dim 128 with the dQ split, dense (every-pair order, causal or
    not; groups of 8) and packed: it builds for sm_90 within shared memory, spills no more than the early-release
    form (HEARTH_ATTN_FB_LATE_RELEASE=0), has fewer mbarrier arrives in its PTX (one a consumer warpgroup) and at
    least 4 fewer named-barrier syncs in its SASS than the early-release build of the same case (31 against 36 on 2026-12-06: Triton syncs the warpgroup beside
    every arrive)."""
    reports = run_offline(_FB_LATE_RELEASE_SCRIPT)
    assert len(reports) == 8, [r["label"] for r in reports]
    early = {r["label"]: r for r in reports if not r["late"]}
    late = [r for r in reports if r["late"]]
    assert all(" late-release" in r["label"] for r in late) and not any(" late-release" in r for r in early)
    for r in late:
        base = early[r["label"].replace(" late-release", "")]
        assert r["shared"] <= 227 * 1024 and r["spill"] <= base["spill"], (r, base)
        assert r["arrives"] < base["arrives"] and r["bars"] <= base["bars"] - 4, (r, base)


_FB_DQ_BUFS2_SCRIPT = r"""
import json, re, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for varlen in (False, True):
    extra = dict(varlen=True, fb_dq_pad=64) if varlen else {}
    for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(128,), causal=(True,),
                                       fb_dq_bufs=2, **extra):
        r = hi.report_compiled(label, k, sass=False)
        waits = sorted(set(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+(\d+);", k.asm["ptx"])))
        out.append(dict(label=label, spill=r.spill_bytes, shared=r.shared_bytes, waits=waits))
print(json.dumps(out))
"""


def test_sm90_fused_backward_dq_bufs2_builds():
    """The probe form DQ_BUFS 2 (HEARTH_ATTN_FB_DQ_BUFS2=1: two dQ^T staging tiles a consumer warpgroup, used in turn)
    at head_dim 128, dense and packed, causal: it builds for sm_90 within shared memory (230832 bytes dense on
    2026-12-06), the loop's reduce waits with one reduce left in flight (the last one before the kernel's end with
    none), and its spill stays within 8 bytes dense (8 on 2026-12-06: the tile's parity kept), none packed."""
    reports = run_offline(_FB_DQ_BUFS2_SCRIPT)
    assert len(reports) == 2 and all(" dq-bufs2" in r["label"] for r in reports), [r["label"] for r in reports]
    for r in reports:
        assert r["shared"] <= 227 * 1024 and r["waits"] == ["0", "1"], r
        assert r["spill"] <= (0 if " varlen" in r["label"] else 8), r


_FB_DQ_EARLY_SCRIPT = r"""
import json, re, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for varlen in (False, True):
    extra = dict(varlen=True, fb_dq_pad=64) if varlen else {}
    for early in (0, 1, 2):
        for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(128,),
                                           causal=(True,), fb_dq_early=early, **extra):
            r = hi.report_compiled(label, k, sass=False)
            waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", k.asm["ptx"])
            out.append(dict(label=label, early=early, spill=r.spill_bytes, shared=r.shared_bytes,
                            wait1=waits.count("1"), wait0=waits.count("0")))
print(json.dumps(out))
"""


def test_fb_dq_early_env():
    """The DQ_EARLY probe knob: unset or "0" the shipped order, "1" / "2" the two early forms; anything else is an
    error naming the variable (not a silent fall back to the shipped form, which would time the wrong kernel)."""
    assert ag._fb_dq_early({}) == 0
    assert [ag._fb_dq_early({"HEARTH_ATTN_FB_DQ_EARLY": v}) for v in ("0", "1", "2")] == [0, 1, 2]
    for bad in ("3", "yes", ""):
        with pytest.raises(ValueError, match="HEARTH_ATTN_FB_DQ_EARLY"):
            ag._fb_dq_early({"HEARTH_ATTN_FB_DQ_EARLY": bad})


SPILL_DQ_EARLY = {1: (8, 24), 2: (0, 0)}  # (dense, packed) bytes, as built on 2026-12-07


def test_sm90_fused_backward_dq_early_builds():
    """The probe form DQ_EARLY (HEARTH_ATTN_FB_DQ_EARLY=1 or 2: dQ^T's matmul issued before dK's, its reduce while
    dK's matmul runs; 1 with dV's matmul after dS^T, FlashAttention-4's order, 2 with dV's as shipped) at head_dim
    128, causal, dense and packed: it builds for sm_90 in the shipped form's shared memory, each consumer
    warpgroup's step has one more partial wgmma wait than the shipped one (form 1: dV and dQ^T each retired with a
    matmul still in flight; form 2: dQ^T retired with dK's in flight, and dP^T with dV's as shipped), and its spill
    stays within SPILL_DQ_EARLY (the shipped builds spill none)."""
    reports = run_offline(_FB_DQ_EARLY_SCRIPT)
    assert len(reports) == 6, [r["label"] for r in reports]
    shipped = {r["label"]: r for r in reports if not r["early"]}
    for r in (r for r in reports if r["early"]):
        tag = f" dq-early{r['early']}"
        base = shipped[r["label"].replace(tag, "")]
        assert tag in r["label"] and r["shared"] == base["shared"] <= 227 * 1024, (r, base)
        assert r["wait1"] == base["wait1"] + 2, (r, base)  # one more in each consumer warpgroup's code
        bound = SPILL_DQ_EARLY[r["early"]][1 if " varlen" in r["label"] else 0]
        assert base["spill"] == 0 and r["spill"] <= bound, (r, base)


_FB_STATS_AHEAD_SCRIPT = r"""
import json, re, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for varlen in (False, True):
    extra = dict(varlen=True, fb_dq_pad=64) if varlen else {}
    for ahead in (False, True):
        for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(64, 128),
                                           causal=(True,), fb_stats_ahead=ahead, **extra):
            r = hi.report_compiled(label, k, sass=False)
            loads = len(re.findall(r"ld\.global[.\w]*\.(?:b32|f32)", k.asm["ptx"]))
            out.append(dict(label=label, ahead=ahead, spill=r.spill_bytes, shared=r.shared_bytes, loads=loads))
print(json.dumps(out))
"""


def test_sm90_fused_backward_stats_ahead_builds():
    """The probe form STATS_AHEAD (HEARTH_ATTN_FB_STATS_AHEAD=1: the producer loads a step's lse / delta a step
    ahead, before it waits for the step's slot, so the Q / dO copies go out as soon as the slot is free) at head_dim
    64 and 128, causal, dense and packed: it builds for sm_90 in the shipped form's shared memory and spill (8 / 16
    bytes dense at d64 as shipped, none elsewhere, on 2026-12-07), and its producer has the one more pair of global
    loads (step 0's, before the loop) that the form adds."""
    reports = run_offline(_FB_STATS_AHEAD_SCRIPT)
    assert len(reports) == 8, [r["label"] for r in reports]
    shipped = {r["label"]: r for r in reports if not r["ahead"]}
    for r in (r for r in reports if r["ahead"]):
        assert " stats-ahead" in r["label"], r
        base = shipped[r["label"].replace(" stats-ahead", "")]
        assert r["shared"] == base["shared"] and r["spill"] == base["spill"], (r, base)
        assert r["loads"] > base["loads"], (r, base)


def test_fb_step_order_env():
    """The STEP_ORDER probe knob: unset the shipped FB_STEP_ORDER, "0" / "1" / "2" those orders (_fb_step); anything
    else is an error naming the variable (a silent fall back would time the wrong kernel)."""
    assert ag._fb_step_order({}) == ag.FB_STEP_ORDER
    assert [ag._fb_step_order({"HEARTH_ATTN_FB_STEP_ORDER": v}) for v in ("0", "1", "2")] == [0, 1, 2]
    for bad in ("3", "-1", "yes"):
        with pytest.raises(ValueError, match="HEARTH_ATTN_FB_STEP_ORDER"):
            ag._fb_step_order({"HEARTH_ATTN_FB_STEP_ORDER": bad})
    assert ag._fb_meta(128, None, {"HEARTH_ATTN_FB_STEP_ORDER": "2"})["STEP_ORDER"] == 2


def test_fb_st_ahead_env():
    """The ST_AHEAD probe knob: off by default (FB_ST_AHEAD), "1" on, "0" off; the kernel takes it only where the form
    serves (_fb_st_ahead: the dQ split's TMA reduce with one staging tile, not DQ_ASYNC or DQ_EARLY)."""
    assert ag._fb_meta(128, None, {})["ST_AHEAD"] is ag.FB_ST_AHEAD is False
    assert ag._fb_meta(128, None, {"HEARTH_ATTN_FB_ST_AHEAD": "1"})["ST_AHEAD"] is True
    assert ag._fb_meta(128, None, {"HEARTH_ATTN_FB_ST_AHEAD": "0"})["ST_AHEAD"] is False
    serves = ag._fb_st_ahead.fn if hasattr(ag._fb_st_ahead, "fn") else ag._fb_st_ahead
    assert serves(True, True, False, 0, True, 1)
    for args in ((False, True, False, 0, True, 1), (True, False, False, 0, True, 1), (True, True, True, 0, True, 1),
                 (True, True, False, 1, True, 1), (True, True, False, 0, False, 1), (True, True, False, 0, True, 2)):
        assert not serves(*args), args


_FB_ST_AHEAD_SCRIPT = r"""
import json, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for varlen in (False, True):
    extra = dict(varlen=True, fb_dq_pad=64) if varlen else {}
    for ahead in (False, True):
        for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(64, 128),
                                           causal=(False, True), fb_st_ahead=ahead, **extra):
            r = hi.report_compiled(label, k, sass=False)
            out.append(dict(label=label, ahead=ahead, spill=r.spill_bytes, shared=r.shared_bytes,
                            wgmma=k.asm["ptx"].count("wgmma.mma_async"), advisories=hi.ptxas_advisories(k)))
print(json.dumps(out))
"""


def test_sm90_fused_backward_st_ahead_builds():
    """The probe form ST_AHEAD at head_dim 128 (the dQ split), causal and not, dense and packed: it builds for sm_90
    in the shipped form's shared memory, is named " st-ahead", has one more S^T matmul in its PTX a consumer
    warpgroup (step 0's, before the loop: 8 k-steps of 16 more wgmma.mma_async) and spills at most 56 bytes
    (28-52 on 2026-12-07: three 64-bit reloads a step dense); at head_dim 64 (no dQ split) the knob leaves the
    shipped build as it is. ptxas has no advisory for it (the first form, S^T in flight across the loop's back edge,
    had every wgmma serialized: C7514)."""
    reports = run_offline(_FB_ST_AHEAD_SCRIPT)
    assert len(reports) == 16, [r["label"] for r in reports]
    shipped = {r["label"]: r for r in reports if not r["ahead"]}
    for r in (r for r in reports if r["ahead"]):
        if " d64 " in r["label"]:
            assert " st-ahead" not in r["label"] and r == dict(shipped[r["label"]], ahead=True), r
            continue
        assert " st-ahead" in r["label"], r
        base = shipped[r["label"].replace(" st-ahead", "")]
        assert r["shared"] == base["shared"] and r["spill"] <= 56, (r, base)
        assert r["wgmma"] == base["wgmma"] + 2 * 8, (r, base)
        assert r["advisories"] == [] == base["advisories"], (r, base)  # no wgmma serialized (C7514)


_FB_STEP_ORDER_SCRIPT = r"""
import json, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for varlen in (False, True):
    extra = dict(varlen=True, fb_dq_pad=64) if varlen else {}
    for order in (0, 1, 2):
        for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("bwd_fused",), head_dims=(64, 128),
                                           causal=(True,), fb_step_order=order, **extra):
            r = hi.report_compiled(label, k, sass=False)
            out.append(dict(label=label, order=order, spill=r.spill_bytes, shared=r.shared_bytes))
print(json.dumps(out))
"""


def test_sm90_fused_backward_step_orders_build():
    """The probe orders STEP_ORDER 1 and 2 (each query block's heads together; 2 from the last block down) at
    head_dim 64 and 128, causal, dense and packed: each builds for sm_90 within the shipped order's shared memory
    (its scratch may move by a few bytes: 16 fewer at d64 packed on 2026-12-07), is named by its order, and spills
    at most 16 bytes more than the shipped build (16 more at d64 dense and d128 packed on 2026-12-07)."""
    reports = run_offline(_FB_STEP_ORDER_SCRIPT)
    assert len(reports) == 12, [r["label"] for r in reports]
    shipped = {r["label"]: r for r in reports if not r["order"]}
    for r in (r for r in reports if r["order"]):
        tag = f" step-order{r['order']}"
        assert tag in r["label"], r
        base = shipped[r["label"].replace(tag, "")]
        assert r["shared"] <= min(base["shared"] + 64, 227 * 1024) and r["spill"] <= base["spill"] + 16, (r, base)


@pytest.mark.parametrize("d", [64, 128])
def test_backward_kernel_is_opt_in(d):
    """dK / dV: the Gluon kernel only with HEARTH_ATTN_GLUON_BWD=1, and only where it serves."""
    on = {"HEARTH_ATTN_GLUON_BWD": "1"}
    assert attn.backward_kernel((9, 0), torch.bfloat16, d, True, env={}) == "triton"
    assert attn.backward_kernel((9, 0), torch.bfloat16, d, True, env=on) == "gluon"
    assert attn.backward_kernel((8, 0), torch.bfloat16, d, True, part="fused",
                                env={"HEARTH_ATTN_GLUON_BWD_FUSED": "1"}) == "triton"
    assert attn.backward_kernel((9, 0), torch.float16, d, False, env=on) == "gluon"
    assert attn.backward_kernel((9, 0), torch.float32, d, True, env=on) == "triton"
    assert attn.backward_kernel((8, 0), torch.bfloat16, d, True, env=on) == "triton"
    assert attn.backward_kernel(None, torch.bfloat16, d, True, env=on) == "triton"
    assert attn.backward_kernel((9, 0), torch.bfloat16, 96, True, env=on) == "triton"
    # dQ has its own switch
    assert attn.backward_kernel((9, 0), torch.bfloat16, d, True, part="dq", env=on) == "triton"
    assert attn.backward_kernel((9, 0), torch.bfloat16, d, True, part="dq",
                                env={"HEARTH_ATTN_GLUON_BWD_DQ": "1"}) == "gluon"
    with pytest.raises(ValueError, match="part"):
        attn.backward_kernel((9, 0), torch.bfloat16, d, True, part="dqkv", env=on)


def test_offline_kernels_names_a_bad_variant():
    with pytest.raises(ValueError, match="variants"):
        ag.offline_kernels(90, torch.bfloat16, variants=("pingpong",))
    with pytest.raises(ValueError, match="'bwd'"):
        ag.offline_kernels(90, torch.bfloat16, variants=("backward",))


# ---------------------------------------------------------------- the choice of forward (CPU)
ON = {"HEARTH_ATTN_GLUON": "1"}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [64, 128])
def test_forward_choice_on_hopper(d, dtype, causal):
    """Unset: the ping-pong forward exactly where it measured faster (GLUON_PP_DEFAULT: D128), Triton
    elsewhere; HEARTH_ATTN_GLUON=1: a Gluon forward everywhere it serves; =0: Triton everywhere."""
    default = "gluon_pp" if (d, causal) in attn.GLUON_PP_DEFAULT else "triton"
    assert attn.forward_kernel((9, 0), dtype, d, causal, env={}) == default
    assert attn.forward_kernel((9, 0), dtype, d, causal, env={"HEARTH_ATTN_GLUON": "2"}) == default
    assert attn.forward_kernel((9, 0), dtype, d, causal, env=ON) == ("gluon_pp" if ag.PING_PONG else "gluon")
    assert attn.forward_kernel((9, 0), dtype, d, causal, env={"HEARTH_ATTN_GLUON": "0"}) == "triton"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_ping_pong_up_to_its_measured_length(causal):
    """The ping-pong forward runs persistent up to PERSIST_MAX_T[causal] query rows (where the H200 measured it
    faster: 16384 causal with the balanced schedule, 2048 non-causal), per tile above it and when the length is
    unknown;
    HEARTH_ATTN_GLUON_PERSIST=1 / 0 forces it on / off at any length; cases that do not pick the ping-pong
    forward are untouched."""
    at = attn.PERSIST_MAX_T[causal]
    assert at == (16384 if causal else 2048)
    pick = lambda env, t, d=128: attn.forward_kernel((9, 0), torch.bfloat16, d, causal, seq_len=t, env=env)
    assert [pick({}, t) for t in (1, at, at + 1, None)] == ["gluon_pps", "gluon_pps", "gluon_pp", "gluon_pp"]
    assert [pick({"HEARTH_ATTN_GLUON_PERSIST": "1"}, t) for t in (1, 32768, None)] == ["gluon_pps"] * 3
    assert [pick({"HEARTH_ATTN_GLUON_PERSIST": "0"}, t) for t in (1, 32768)] == ["gluon_pp"] * 2
    assert pick({}, 1024, d=64) == "triton"  # head_dim 64 stays with the Triton forward
    assert pick({"HEARTH_ATTN_GLUON": "0", "HEARTH_ATTN_GLUON_PERSIST": "1"}, 1024) == "triton"
    assert attn.forward_kernel((8, 0), torch.bfloat16, 128, causal, seq_len=1024, env={}) == "triton"
    if not ag.PING_PONG:  # HEARTH_ATTN_GLUON=1 without the ping-pong variant: the other Gluon forward
        assert pick({"HEARTH_ATTN_GLUON": "1"}, 1024) == "gluon"


def test_attention_forward_passes_the_persistent_choice(monkeypatch):
    """_attention_forward asks forward_kernel with the query length and hands "gluon_pps" / "gluon_pp" to the
    Gluon forward as ping_pong=True with persistent True / False."""
    seen, calls = [], []

    def fake(q, k, v, causal, scale, store_lse=True, ping_pong=None, persistent=None):
        calls.append((ping_pong, persistent))
        return torch.zeros_like(q), torch.zeros(q.shape[:3])

    monkeypatch.setattr(ag, "tma_addressable", lambda *t: True)
    monkeypatch.setattr(ag, "forward", fake)
    for kernel in ("gluon_pps", "gluon_pp"):
        monkeypatch.setattr(attn, "forward_kernel", lambda *a, _k=kernel, **kw: seen.append(kw["seq_len"]) or _k)
        q = torch.randn(1, 2, 24, 64)
        attn._attention_forward(q, torch.randn(1, 2, 40, 64), torch.randn(1, 2, 40, 64), False, 0.125)
    assert calls == [(True, True), (True, False)] and seen == [24, 24]


def test_ping_pong_default_is_the_measured_case_only():
    assert attn.GLUON_PP_DEFAULT == {(128, True), (128, False)}
    assert attn.forward_kernel((9, 0), torch.float32, 128, True, env={}) == "triton"
    assert attn.forward_kernel((8, 0), torch.bfloat16, 128, True, env={}) == "triton"
    assert attn.forward_kernel(None, torch.bfloat16, 128, True, env={}) == "triton"


@pytest.mark.parametrize("cap,dtype,d", [
    ((8, 0), torch.bfloat16, 128),   # Ampere: no wgmma / TMA
    ((10, 0), torch.bfloat16, 128),  # Blackwell: not this kernel's target
    (None, torch.bfloat16, 128),     # CPU / interpreter
    ((9, 0), torch.float32, 128),    # fp32: full-precision matmuls stay in the Triton kernel
    ((9, 0), torch.bfloat16, 32),
    ((9, 0), torch.bfloat16, 256),
])
def test_triton_kernel_kept_where_gluon_does_not_serve(cap, dtype, d):
    assert attn.forward_kernel(cap, dtype, d, True, env=ON) == "triton"
    assert attn.forward_kernel(cap, dtype, d, True, env={}) == "triton"


def test_attention_reads_the_env_var(monkeypatch):
    """The default env is the process's: HEARTH_ATTN_GLUON=1 set at run time is seen."""
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "1")
    assert attn.forward_kernel((9, 0), torch.bfloat16, 64, False) == "gluon"
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "0")
    assert attn.forward_kernel((9, 0), torch.bfloat16, 128, False) == "triton"
    monkeypatch.delenv("HEARTH_ATTN_GLUON")
    assert attn.forward_kernel((9, 0), torch.bfloat16, 64, False) == "triton"
    assert attn.forward_kernel((9, 0), torch.bfloat16, 128, False) == "gluon_pp"


def test_env_on_without_hopper_still_runs_the_triton_kernel(monkeypatch):
    """HEARTH_ATTN_GLUON=1 on a machine the Gluon kernel does not serve (here: CPU) changes nothing."""
    q, k, v = (torch.randn(1, 2, 17, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    if HAS_CUDA:
        q, k, v = q.cuda(), k.cuda(), v.cuda()
    expected = attn.attention(q, k, v, causal=True)
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "1")
    called = []
    monkeypatch.setattr(ag, "forward", lambda *a, **k: called.append(a) or pytest.fail("Gluon forward on fp32"))
    torch.testing.assert_close(attn.attention(q, k, v, causal=True), expected, atol=0, rtol=0)
    assert not called


def test_ping_pong_is_read_from_its_env_var_and_off_by_default(monkeypatch):
    """HEARTH_ATTN_GLUON_PP is read in one place, attention_gluon's import: off unless it is "1"."""
    try:
        monkeypatch.delenv("HEARTH_ATTN_GLUON_PP", raising=False)
        assert importlib.reload(ag).PING_PONG is False
        monkeypatch.setenv("HEARTH_ATTN_GLUON_PP", "0")
        assert importlib.reload(ag).PING_PONG is False
        monkeypatch.setenv("HEARTH_ATTN_GLUON_PP", "1")
        assert importlib.reload(ag).PING_PONG is True
        # the ping-pong switch does not choose the Gluon forward by itself
        assert attn.forward_kernel((9, 0), torch.bfloat16, 64, True, env={"HEARTH_ATTN_GLUON_PP": "1"}) == "triton"
        assert attn.forward_kernel((9, 0), torch.bfloat16, 64, True,
                                   env={"HEARTH_ATTN_GLUON_PP": "1", "HEARTH_ATTN_GLUON": "1"}) == "gluon_pp"
    finally:  # back to the process's own setting
        monkeypatch.undo()
        importlib.reload(ag)


def test_tma_addressable():
    x = torch.zeros(2, 3, 40, 64, dtype=torch.bfloat16)
    assert ag.tma_addressable(x)
    assert ag.tma_addressable(torch.zeros(2, 40, 3, 64, dtype=torch.bfloat16).transpose(1, 2))  # [B,T,H,D] view
    assert not ag.tma_addressable(x.transpose(2, 3))  # last dim not contiguous
    assert not ag.tma_addressable(torch.zeros(2, 3, 40, 68, dtype=torch.bfloat16)[..., :64])  # 136-byte rows
    assert not ag.tma_addressable(torch.zeros(2 * 3 * 40 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 3, 40, 64))
    assert not ag.tma_addressable(torch.zeros(1, 1, 40, 64, dtype=torch.bfloat16).expand(2, 3, 40, 64))


def test_supported():
    assert ag.supported((9, 0), torch.bfloat16, 64) and ag.supported((9, 0), torch.float16, 128)
    assert not ag.supported((9, 0), torch.bfloat16, 96)
    assert not ag.supported((8, 9), torch.bfloat16, 64)
    assert not ag.supported(None, torch.bfloat16, 64)


# ---------------------------------------------------------------- GPU (H200)
HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
hopper_only = pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.x (Hopper)")


def _inputs(B, Hq, Hk, T, D, dtype, seed=0, bthd=False):
    g = torch.Generator().manual_seed(seed)
    if bthd:  # HF's [B, T, H, D] storage viewed as [B, H, T, D]
        mk = lambda h: torch.randn(B, T, h, D, generator=g).to("cuda", dtype).transpose(1, 2)  # noqa: E731
    else:
        mk = lambda h: torch.randn(B, h, T, D, generator=g).to("cuda", dtype)  # noqa: E731
    return mk(Hq), mk(Hk), mk(Hk), mk(Hq)


def _reference(q, k, v, causal, scale, dtype64=torch.float64):
    """(out, lse) of softmax(scale q k^T + mask) v computed in dtype64 (GQA heads repeated)."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = q.to(dtype64), k.to(dtype64).repeat_interleave(group, 1), v.to(dtype64).repeat_interleave(group, 1)
    s = (qd @ kd.transpose(-1, -2)) * scale
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ vd, torch.logsumexp(s, -1)


def _same_dtype_out(q, k, v, causal, scale):
    """PyTorch's plain math in q's dtype (rounds P as the kernel does): the rule's baseline for O."""
    group = q.shape[1] // k.shape[1]
    s = (q @ k.repeat_interleave(group, 1).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v.repeat_interleave(group, 1)


@pytest.fixture(params=[False, True], ids=["1part", "ws"])
def variant(request, monkeypatch):
    """Each GPU test runs the single-partition kernel and the warp-specialised one."""
    monkeypatch.setattr(ag, "WARP_SPECIALIZE", request.param)
    return request.param


def _check_forward(B, Hq, Hk, T, D, dtype, causal, bthd=False):
    q, k, v, _ = _inputs(B, Hq, Hk, T, D, dtype, bthd=bthd)
    assert ag.tma_addressable(q, k, v)
    scale = 1.0 / math.sqrt(D)
    out, lse = ag.forward(q, k, v, causal, scale)
    torch.cuda.synchronize()
    ref_out, ref_lse = _reference(q, k, v, causal, scale)
    assert out.shape == (B, Hq, T, D) and out.dtype == dtype and lse.shape == (B, Hq, T) and lse.dtype == torch.float32
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert_close(out, ref_out, dtype, "out", baseline=_same_dtype_out(q, k, v, causal, scale))
    # lse is fp32 from exact (16-bit) inputs: PyTorch's own fp32 logsumexp of the same scores is the baseline
    assert_close(lse, ref_lse, torch.float32, "lse", baseline=_reference(q, k, v, causal, scale, torch.float32)[1])


def _check_forward_without_lse(B, Hq, Hk, T, D, causal):
    """store_lse=False: lse is None, O is bitwise the training forward's, and the call's peak memory is
    exactly the [B, Hq, T] fp32 logsumexp below the training call's (the descriptor scratch is the same)."""
    q, k, v, _ = _inputs(B, Hq, Hk, T, D, torch.bfloat16, seed=5)
    scale = 1.0 / math.sqrt(D)

    def run(store_lse):
        ag.forward(q, k, v, causal, scale, store_lse)  # compile outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out, lse = ag.forward(q, k, v, causal, scale, store_lse)
        torch.cuda.synchronize()
        return out, lse, torch.cuda.max_memory_allocated() - base

    out_t, lse_t, extra_t = run(True)
    out_i, lse_i, extra_i = run(False)
    assert lse_t is not None and lse_i is None
    assert torch.equal(out_i, out_t)
    assert extra_t - extra_i == B * Hq * T * 4, (extra_t, extra_i)


def _check_forward_memory_is_its_output(B, Hq, Hk, T, D, causal):
    """(the ping-pong kernel, host-built descriptors) the inference call's peak memory is its output alone: no
    logsumexp and no descriptor scratch."""
    q, k, v, _ = _inputs(B, Hq, Hk, T, D, torch.bfloat16, seed=6)
    scale = 1.0 / math.sqrt(D)
    ag.forward(q, k, v, causal, scale, False, True)  # compile outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, lse = ag.forward(q, k, v, causal, scale, False, True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert lse is None and extra == out.numel() * out.element_size(), (extra, out.numel() * out.element_size())


@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_forward_without_lse(causal, variant):
    _check_forward_without_lse(2, 8, 2, 1024, 128, causal)


@hopper_only
@pytest.mark.parametrize("T", [1, 100, 128, 1000, 2048, 4097])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_forward_matches_reference(D, causal, T, variant):
    _check_forward(1, 4, 2, T, D, torch.bfloat16, causal)


@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_forward_fp16(D, causal, variant):
    _check_forward(2, 4, 4, 777, D, torch.float16, causal)


@pytest.mark.xdist_group("gpu_big")
@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_forward_gqa_40_8_strided(causal, variant):
    _check_forward(1, 40, 8, 1500, 128, torch.bfloat16, causal, bthd=True)


def _check_forward_lengths(Tq, Tk, D):
    """Non-causal, Tq query rows against Tk keys (scale 0.1)."""
    q, _, _, _ = _inputs(1, 4, 2, Tq, D, torch.bfloat16, seed=1)
    _, k, v, _ = _inputs(1, 4, 2, Tk, D, torch.bfloat16, seed=2)
    out, lse = ag.forward(q, k, v, False, 0.1)
    ref_out, ref_lse = _reference(q, k, v, False, 0.1)
    assert_close(out, ref_out, torch.bfloat16, "out", baseline=_same_dtype_out(q, k, v, False, 0.1))
    assert_close(lse, ref_lse, torch.float32, "lse", baseline=_reference(q, k, v, False, 0.1, torch.float32)[1])


@hopper_only
def test_gpu_forward_non_causal_different_lengths(variant):
    _check_forward_lengths(300, 1111, 128)


@pytest.mark.xdist_group("gpu_big")
@hopper_only
@pytest.mark.parametrize("T,Hq,Hk,D", [(1000, 4, 2, 128), (4097, 40, 8, 128), (333, 8, 8, 64), (1500, 40, 8, 64)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_attention_fwd_bwd_through_public_function(monkeypatch, causal, T, Hq, Hk, D, variant):
    """attention() with HEARTH_ATTN_GLUON=1: the Gluon forward runs (counted) and the existing backward
    consumes its O and lse; out, dq, dk, dv all within the rule."""
    test_attention = importlib.import_module("tests.kernels.test_attention")
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "1")
    calls = []
    real = ag.forward
    monkeypatch.setattr(ag, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v, do = _inputs(1, Hq, Hk, T, D, torch.bfloat16, seed=3)
    test_attention._assert_within_bound(q, k, v, do, causal, None)
    assert calls, "HEARTH_ATTN_GLUON=1 on Hopper did not run the Gluon forward"


@hopper_only
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_every_candidate_config_is_correct(monkeypatch, D, variant):
    """Every config the probe's --sweep may time (and a later session may ship), causal and not, ragged
    T=300, GQA 4/2: a config that is fast but wrong must fail here before it can win a benchmark."""
    for cfg in ag.CANDIDATES[D]:
        monkeypatch.setitem(ag.CONFIGS, D, cfg)
        for causal in (False, True):
            try:
                _check_forward(1, 4, 2, 300, D, torch.bfloat16, causal)
            except AssertionError as e:
                raise AssertionError(f"config {cfg} causal={causal}: {e}") from e


def test_shipped_config_is_the_first_candidate():
    for d in ag.HEAD_DIMS:
        assert ag.CANDIDATES[d][0] == ag.CONFIGS[d]
        for bm, bn, warps, stages in ag.CANDIDATES[d]:
            assert bm == 16 * warps, (d, bm, warps)  # the accumulator layout gives each warp 16 rows of the tile
            assert stages >= 2, (d, stages)  # _consume's next QK^T reads another slot than the one refilled
        assert ag.PP_CANDIDATES[d][0] == ag.PP_CONFIGS[d]
        for bm, bn, stages in ag.PP_CANDIDATES[d]:
            assert bm % 64 == 0, (d, bm)  # one warpgroup's wgmma covers 64 rows; larger tiles repeat it
            assert stages >= 2, (d, stages)  # QK^T(j) is issued while PV(j - 1) still reads the other slot


@hopper_only
@pytest.mark.xdist_group("gpu_big")  # fp64 references at T 16484: one at a time (scripts/gpu/test.sh)
def test_gpu_default_runs_ping_pong_for_d128(monkeypatch):
    """HEARTH_ATTN_GLUON unset: attention() at D128 bf16 runs the ping-pong forward (counted), persistent up to
    PERSIST_MAX_T[causal] query rows and per tile above (each causal form at its own threshold, two heads past
    the causal one), fwd + bwd within the rule; at D64 (not in GLUON_PP_DEFAULT) it runs no Gluon forward."""
    monkeypatch.delenv("HEARTH_ATTN_GLUON", raising=False)
    monkeypatch.delenv("HEARTH_ATTN_GLUON_PERSIST", raising=False)
    test_attention = importlib.import_module("tests.kernels.test_attention")
    calls = []
    real = ag.forward
    monkeypatch.setattr(ag, "forward", lambda *a, **k: calls.append((a[6:], k)) or real(*a, **k))
    for causal in (True, False):
        for t, persistent in ((1000, True), (attn.PERSIST_MAX_T[causal] + 100, False)):
            heads = (8, 2) if t <= 4096 else (2, 1)
            q, k, v, do = _inputs(1, *heads, t, 128, torch.bfloat16, seed=4)
            test_attention._assert_within_bound(q, k, v, do, causal, None)
            assert len(calls) >= 1 and all(c == ((True,), {"persistent": persistent}) for c in calls), (t, calls)
            calls.clear()
    q, k, v, do = _inputs(1, 8, 2, 1000, 64, torch.bfloat16, seed=4)
    attn.attention(q, k, v, causal=True)
    assert calls == []


_BWD_PARTS = {"dkdv": ("HEARTH_ATTN_GLUON_BWD", "backward_dkdv"), "dq": ("HEARTH_ATTN_GLUON_BWD_DQ", "backward_dq"),
              "fused": ("HEARTH_ATTN_GLUON_BWD_FUSED", "backward_fused")}


def test_short_packed_gqa_rows_take_the_triton_backward():
    """backward_kernel's packed rule: causal grouped-query packed rows at head_dim 128 whose longest sequence is at
    most FUSED_VARLEN_SHORT_MAX tokens take the Triton backward (measured faster there); longer ones, MHA,
    non-causal, head_dim 64 and dense calls keep the fused kernel, and HEARTH_ATTN_GLUON_BWD_FUSED=1 keeps it for
    all."""
    short = attn.FUSED_VARLEN_SHORT_MAX
    pick = functools.partial(attn.backward_kernel, (9, 0), torch.bfloat16, part="fused")
    assert pick(128, True, env={}, packed_max_len=short, group=4) == "triton"
    assert pick(128, True, env={}, packed_max_len=1, group=5) == "triton"
    assert pick(128, True, env={}, packed_max_len=short + 1, group=4) == "gluon"
    assert pick(128, True, env={}, packed_max_len=short, group=1) == "gluon"  # MHA
    assert pick(128, False, env={}, packed_max_len=short, group=4) == "gluon"  # non-causal
    assert pick(64, True, env={}, packed_max_len=short, group=4) == "gluon"
    assert pick(128, True, env={}, group=4) == "gluon"  # dense: no packed length
    assert pick(128, True, env={"HEARTH_ATTN_GLUON_BWD_FUSED": "1"}, packed_max_len=256, group=4) == "gluon"
    assert pick(128, True, env={"HEARTH_ATTN_GLUON_BWD_FUSED": "0"}, packed_max_len=4096, group=4) == "triton"


@pytest.mark.parametrize("d", [64, 128])
def test_fused_backward_is_the_default_where_it_serves(d, monkeypatch):
    """The fused Gluon backward: Hopper's bf16 / fp16 head_dim 64 / 128 backward by default, replacing both split
    parts; HEARTH_ATTN_GLUON_BWD_FUSED=0 and torch's deterministic mode (its dQ adds run in no fixed order) give the
    Triton kernels, as do other GPUs, dtypes and head dims."""
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            assert attn.backward_kernel((9, 0), dtype, d, causal, part="fused", env={}) == "gluon"
    assert attn.backward_kernel((9, 0), torch.bfloat16, d, True, part="fused",
                                env={"HEARTH_ATTN_GLUON_BWD_FUSED": "0"}) == "triton"
    assert attn.backward_kernel((9, 0), torch.float32, d, True, part="fused", env={}) == "triton"
    assert attn.backward_kernel((8, 0), torch.bfloat16, d, True, part="fused", env={}) == "triton"
    assert attn.backward_kernel(None, torch.bfloat16, d, True, part="fused", env={}) == "triton"
    assert attn.backward_kernel((9, 0), torch.bfloat16, 96, True, part="fused", env={}) == "triton"
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert attn.backward_kernel((9, 0), torch.bfloat16, d, True, part="fused", env={}) == "triton"


@contextlib.contextmanager
def _backward_parts(parts):
    """With the env var of each part set (dkdv: HEARTH_ATTN_GLUON_BWD=1, dq: HEARTH_ATTN_GLUON_BWD_DQ=1, fused:
    HEARTH_ATTN_GLUON_BWD_FUSED=1; without "fused", HEARTH_ATTN_GLUON_BWD_FUSED=0) and each part's Gluon launcher
    counted; restores both on exit, then asserts that every part ran."""
    calls = {p: [] for p in parts}
    with pytest.MonkeyPatch.context() as mp:
        if "fused" not in parts:  # the split parts run only with the fused backward (the default) off
            mp.setenv(_BWD_PARTS["fused"][0], "0")
        for p in parts:
            var, fn = _BWD_PARTS[p]
            mp.setattr(ag, fn, (lambda c, r: lambda *a, **kw: c.append(1) or r(*a, **kw))(calls[p], getattr(ag, fn)))
            mp.setenv(var, "1")
        yield
    for p in parts:
        assert calls[p], f"{_BWD_PARTS[p][0]}=1 on Hopper did not run the Gluon {p} kernel"


def _check_backward(B, Hq, Hk, T, D, causal, bthd=False, dtype=torch.bfloat16, parts=("dkdv",)):
    """With the Gluon backward kernels of `parts` on (_backward_parts), attention()'s fwd + bwd runs them and
    stays within the 2x rule against the fp64 reference (tests/kernels/test_attention.py's bound)."""
    test_attention = importlib.import_module("tests.kernels.test_attention")
    with _backward_parts(parts):
        q, k, v, do = _inputs(B, Hq, Hk, T, D, dtype, seed=8, bthd=bthd)
        test_attention._assert_within_bound(q, k, v, do, causal, None)


@hopper_only
@pytest.mark.parametrize("T", [1, 100, 1000, 4160])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_dkdv_matches_reference(D, causal, T):
    _check_backward(1, 4, 2, T, D, causal)


@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_dkdv_gqa_40_8_bthd_and_fp16(D, causal):
    _check_backward(1, 40, 8, 1500, D, causal, bthd=True)
    _check_backward(2, 4, 4, 777, D, causal, dtype=torch.float16)


@hopper_only
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_every_backward_candidate_is_correct(monkeypatch, D):
    for cfg in ag.BWD_CANDIDATES[D]:
        monkeypatch.setitem(ag.BWD_CONFIGS, D, cfg)
        for causal in (False, True):
            _check_backward(1, 4, 2, 1000, D, causal)
    for cfg in ag.BWD_DQ_CANDIDATES[D]:
        monkeypatch.setitem(ag.BWD_DQ_CONFIGS, D, cfg)
        for causal in (False, True):
            _check_backward(1, 4, 2, 1000, D, causal, parts=("dq",))


@hopper_only
@pytest.mark.parametrize("T", [1, 100, 1000, 4160])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_dq_and_both_match_reference(D, causal, T):
    _check_backward(1, 4, 2, T, D, causal, parts=("dq",))
    _check_backward(1, 4, 2, T, D, causal, parts=("dkdv", "dq"))


def _check_backward_lengths(Tq, Tk, D, dtype=torch.bfloat16, score_shift=0.0, parts=("dkdv", "dq")):
    """Non-causal Tq != Tk through the Gluon backward kernels of `parts` against the fp64 reference. score_shift moves
    every score down (q gets a component along a shared direction, k its negative): lse < 0, so a key past T_k
    that were not masked would give P = e^-lse >> 1 and overflow 16-bit dS."""
    test_attention = importlib.import_module("tests.kernels.test_attention")
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, Tq, D, generator=g)
    k = torch.randn(1, 2, Tk, D, generator=g)
    if score_shift:
        u = torch.zeros(D)
        u[0] = 1.0
        q = q + score_shift ** 0.5 * u
        k = k - score_shift ** 0.5 * u
    v = torch.randn(1, 2, Tk, D, generator=g)
    do = torch.randn(1, 4, Tq, D, generator=g)
    q, k, v, do = (t.to("cuda", dtype) for t in (q, k, v, do))
    with _backward_parts(parts):
        test_attention._assert_within_bound(q, k, v, do, False, None)


@hopper_only
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_non_causal_different_lengths(D):
    """Ragged key tails in both kernels (T_k not a multiple of any block), both ways round, and fp16 with scores
    pushed negative (lse < 0), where an unmasked key tail in dQ overflowed to inf and NaN."""
    _check_backward_lengths(300, 1111, D)
    _check_backward_lengths(1111, 100, D)
    _check_backward_lengths(200, 100, D, dtype=torch.float16, score_shift=32.0 * math.sqrt(D))  # scores near -32


@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_both_gqa_40_8_bthd_and_fp16(D, causal):
    _check_backward(1, 40, 8, 1500, D, causal, bthd=True, parts=("dkdv", "dq"))
    _check_backward(2, 4, 4, 777, D, causal, dtype=torch.float16, parts=("dkdv", "dq"))


@hopper_only
@pytest.mark.parametrize("T", [1, 100, 1000, 4160])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_fused_matches_reference(D, causal, T):
    """The fused 5-matmul backward (HEARTH_ATTN_GLUON_BWD_FUSED=1): dK, dV and dQ within the 2x rule."""
    _check_backward(1, 4, 2, T, D, causal, parts=("fused",))


@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_fused_gqa_40_8_bthd_fp16_and_lengths(D, causal):
    _check_backward(1, 40, 8, 1500, D, causal, bthd=True, parts=("fused",))
    _check_backward(2, 4, 4, 777, D, causal, dtype=torch.float16, parts=("fused",))
    if not causal:
        _check_backward_lengths(300, 1111, D, parts=("fused",))
        _check_backward_lengths(1111, 100, D, parts=("fused",))
        _check_backward_lengths(200, 100, D, dtype=torch.float16, score_shift=32.0 * math.sqrt(D), parts=("fused",))


@hopper_only
@pytest.mark.parametrize("order", ["1", "2"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_fused_step_orders(monkeypatch, D, order):
    """The fused backward's probe step orders (HEARTH_ATTN_FB_STEP_ORDER 1 / 2: each query block's heads together,
    2 from the last block down) within the 2x rule, causal and not, GQA 40/8 in [B, T, H, D] memory, fp16 with a
    ragged length, and GQA 4/2 at a length with a partial last block; the order only moves when a step runs."""
    monkeypatch.setenv("HEARTH_ATTN_FB_STEP_ORDER", order)
    for causal in (False, True):
        _check_backward(1, 40, 8, 1500, D, causal, bthd=True, parts=("fused",))
        _check_backward(2, 4, 4, 777, D, causal, dtype=torch.float16, parts=("fused",))
        _check_backward(1, 4, 2, 4160, D, causal, parts=("fused",))


def test_fused_backward_grid_order_rule():
    """Pairs interleaved per key block: all of the launch's (every pair's key block 0 first) for causal grouped-query
    attention, where the H200 measured it faster; two for causal MHA at head_dim 128 and one at 64, as measured;
    1 for non-causal, where more measured slower; the env forces n, or the largest power of two below it that
    divides the pairs (0 or more than the pairs: all), and a bad value is an error that names it."""
    assert ag.fb_pair_group(True, 5, 32, 128, env={}) == 32 and ag.fb_pair_group(True, 2, 3, 64, env={}) == 3
    # causal GQA at short sequences: the fewest pairs (a power of two) whose key blocks make 128 programs, as measured
    assert [ag.fb_pair_group(True, 5, 32, 128, env={}, n_kb=n) for n in (8, 12, 16, 24, 32)] == [16, 16, 8, 8, 4]
    assert ag.fb_pair_group(True, 4, 32, 64, env={}, n_kb=8) == 16
    assert ag.fb_pair_group(True, 5, 40, 128, env={}, n_kb=8) == 8  # 16 does not divide 40 pairs
    assert ag.fb_pair_group(True, 5, 12, 128, env={}, n_kb=8) == 12  # 16 or more: all of them
    assert ag.fb_pair_group(True, 5, 32, 128, env={}, n_kb=33) == 32 == ag.fb_pair_group(True, 5, 32, 128, env={},
                                                                                          n_kb=64)  # long: all
    assert ag.fb_pair_group(True, 1, 32, 128, env={}, n_kb=8) == 2  # MHA keeps its rule
    assert ag.fb_pair_group(False, 5, 32, 128, env={}, n_kb=8) == 1  # non-causal too
    assert ag.fb_pair_group(True, 5, 32, 128, env={"HEARTH_ATTN_FB_PAIR_GROUP": "0"}, n_kb=8) == 32  # the env wins
    assert ag.fb_pair_group(True, 1, 32, 128, env={}) == 2 and ag.fb_pair_group(True, 1, 32, 64, env={}) == 1
    assert ag.fb_pair_group(True, 1, 3, 128, env={}) == 1  # two does not divide three pairs
    assert ag.fb_pair_group(True, 1, 1, 128, env={}) == 1
    assert ag.fb_pair_group(False, 5, 32, 128, env={}) == 1 and ag.fb_pair_group(False, 1, 32, 128, env={}) == 1
    force = lambda v: {"HEARTH_ATTN_FB_PAIR_GROUP": v}
    assert ag.fb_pair_group(False, 1, 32, 128, env=force("8")) == 8
    assert (ag.fb_pair_group(False, 1, 32, 128, env=force("7")) == 4
            and ag.fb_pair_group(True, 5, 12, 128, env=force("5")) == 4)
    assert ag.fb_pair_group(True, 5, 32, 128, env=force("1")) == 1
    assert (ag.fb_pair_group(False, 1, 32, 128, env=force("0")) == 32
            == ag.fb_pair_group(False, 1, 32, 128, env=force("99")))
    assert ag.fb_pair_group(True, 5, 32, 128, env=force(" ")) == 32  # blank: the rule
    assert ag.fb_pair_group(False, 1, 512, 128, env=force("200")) == 128  # no cap at 64 groups
    assert ag.fb_pair_group(False, 1, 96, 128, env=force("90")) == 32  # 96 = 32 x 3
    for bad in ("many", "-1", "2.5"):
        with pytest.raises(ValueError, match="HEARTH_ATTN_FB_PAIR_GROUP"):
            ag.fb_pair_group(True, 5, 32, 128, env=force(bad))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_host_descriptors_equal_the_validating_constructor(dtype):
    """_host_desc / _dq_acc_desc set TensorDescriptor's fields directly (its dataclass init and asserts cost host
    time a launch): the result must equal what the validating constructor builds, field by field, Triton must
    specialise a launch on it the same way (the kernel cache key), and the layouts are built once."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import create_function_from_signature

    dense = torch.empty((2, 3, 100, 64), dtype=dtype)
    transposed = torch.empty((2, 100, 3, 128), dtype=dtype).transpose(1, 2)  # a [B, T, H, D] layout seen as [B, H, T, D]
    acc = torch.empty((6, 128, 128), dtype=torch.float32)
    cases = [(ag._host_desc(dense, 64), dense, [1, 1, 64, 64]),
             (ag._host_desc(transposed, 128), transposed, [1, 1, 128, 128]),
             (ag._dq_acc_desc(acc, True, 64), acc, [1, 64, 64]),
             (ag._dq_acc_desc(acc, False, 32), acc, [1, 128, 32])]
    backend = make_backend(GPUTarget("cuda", 90, 32))
    kernel = ag._attn_bwd_fused_gluon_kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    for fast, t, box in cases:
        ref = TensorDescriptor(t, list(t.shape), list(t.stride()), box, fast.layout)
        assert fast.base is t and (fast.shape, fast.strides, fast.block_shape, fast.padding) == (
            ref.shape, ref.strides, ref.block_shape, ref.padding)
        assert fast.layout == type(fast.layout).get_default_for(box, ag._GL_DTYPES.get(t.dtype, ag.ttgl.float32))
        # the first argument of the fused backward is a descriptor: Triton's specialisation of either must agree
        args = [fast] + [0] * (len(kernel.params) - 1)
        ref_args = [ref] + [0] * (len(kernel.params) - 1)
        assert binder(*args)[1][0] == binder(*ref_args)[1][0]
    assert ag._host_desc(dense, 64).layout is ag._host_desc(dense, 64).layout  # cached, not rebuilt
    assert ag._dq_acc_desc(acc, True, 64).layout is ag._dq_acc_desc(acc, True, 64).layout


def test_fused_chunk_bounds_the_dq_buffer():
    """(b, K/V head) pairs per launch of the fused backward: all when unbounded or when they fit; else the most that
    fit among the divisors of Hk and the whole batch rows dividing B; never 0."""
    per = 2 * 64 * 128 * 4  # group 2, D 64, 128 padded queries: 64 KiB a pair
    assert ag.fused_chunk(3, 4, 2, 64, 128, 0) == 12
    assert ag.fused_chunk(3, 4, 2, 64, 128, 12 * per) == 12
    assert ag.fused_chunk(3, 4, 2, 64, 128, 11 * per) == 4  # one batch row (12 does not fit, 8 does not divide)
    assert ag.fused_chunk(4, 4, 2, 64, 128, 11 * per) == 8  # two of four batch rows
    assert ag.fused_chunk(3, 4, 2, 64, 128, 3 * per) == 2  # within a row: a divisor of Hk
    assert ag.fused_chunk(3, 4, 2, 64, 128, 1) == 1
    # split: also at most 1 / split of the whole buffer (12 pairs), alone or under a budget
    assert ag.fused_chunk(3, 4, 2, 64, 128, 0, 2) == 4  # 6 fit, 4 the most that divides Hk or is whole rows
    assert ag.fused_chunk(4, 4, 2, 64, 128, 0, 2) == 8  # 16 pairs: two of four batch rows
    assert ag.fused_chunk(4, 4, 2, 64, 128, 3 * per, 2) == 2  # the budget below half
    assert ag.fused_chunk(1, 1, 2, 64, 128, 0, 2) == 1  # one pair: never 0


def test_acc_budget_halves_the_dq_buffer_under_gqa(monkeypatch):
    """The fp32 dQ buffer's bound: FB_ACC_MIB for MHA; under GQA also half the whole buffer (FB_ACC_GQA_SPLIT), so
    the goal grid's GQA 40/8 head_dim 64 (B16 T1024: 128 pairs, 160 MiB whole) runs 64 pairs a launch (80 MiB)
    where it ran all 128; an explicit acc_bytes or env HEARTH_ATTN_FB_ACC_MIB (0: none) replaces the rule."""
    monkeypatch.delenv("HEARTH_ATTN_FB_ACC_MIB", raising=False)
    mib = 2**20
    assert ag.FB_ACC_GQA_SPLIT == 2
    assert ag.acc_budget(None, {}, 1) == (ag.FB_ACC_MIB * mib, 1)
    assert ag.acc_budget(None, {}, 5) == (ag.FB_ACC_MIB * mib, 2)
    assert ag.acc_budget(7, {}, 5) == (7, 1)
    assert ag.acc_budget(None, {"HEARTH_ATTN_FB_ACC_MIB": "0"}, 5) == (0, 1)
    assert ag.acc_budget(None, {"HEARTH_ATTN_FB_ACC_MIB": "0.5"}, 1) == (mib // 2, 1)
    assert ag.fused_chunk(16, 8, 5, 64, 1024, *ag.acc_budget(None, {}, 5)) == 64  # 160 MiB whole: 80 a launch
    assert ag.fused_chunk(16, 8, 1, 64, 1024, *ag.acc_budget(None, {}, 1)) == 128  # MHA, 32 MiB: whole
    assert ag.fused_chunk(4, 8, 5, 128, 16384, *ag.acc_budget(None, {}, 5)) == 4  # 1280 MiB: FB_ACC_MIB's bound
    assert ag.fused_chunk(1, 1, 5, 64, 1024, *ag.acc_budget(None, {}, 5)) == 1  # one pair: whole
    assert ag.fused_chunk(16, 8, 5, 64, 1024, *ag.acc_budget(None, {"HEARTH_ATTN_FB_ACC_MIB": "0"}, 5)) == 128


def test_acc_budget_keeps_the_whole_buffer_at_short_causal_gqa():
    """Causal GQA at 1..FB_GQA_GROUP_MAX_KB key blocks a pair (the grouped grid order's sequences) holds the whole
    buffer up to FB_ACC_SHORT_MIB in one launch; longer sequences, non-causal and MHA keep the split / FB_ACC_MIB;
    acc_bytes and the env knob still replace the rule."""
    mib = 2**20
    short = ag.FB_GQA_GROUP_MAX_KB
    assert ag.acc_budget(None, {}, 5, causal=True, n_kb=short) == (ag.FB_ACC_SHORT_MIB * mib, 1)
    assert ag.acc_budget(None, {}, 5, causal=True, n_kb=1) == (ag.FB_ACC_SHORT_MIB * mib, 1)
    assert ag.acc_budget(None, {}, 5, causal=True, n_kb=short + 1) == (ag.FB_ACC_MIB * mib, ag.FB_ACC_GQA_SPLIT)
    assert ag.acc_budget(None, {}, 5, causal=False, n_kb=short) == (ag.FB_ACC_MIB * mib, ag.FB_ACC_GQA_SPLIT)
    assert ag.acc_budget(None, {}, 1, causal=True, n_kb=short) == (ag.FB_ACC_MIB * mib, 1)
    assert ag.acc_budget(None, {}, 5, causal=True, n_kb=0) == (ag.FB_ACC_MIB * mib, ag.FB_ACC_GQA_SPLIT)
    assert ag.acc_budget(7, {}, 5, causal=True, n_kb=short) == (7, 1)
    assert ag.acc_budget(None, {"HEARTH_ATTN_FB_ACC_MIB": "1"}, 5, causal=True, n_kb=short) == (mib, 1)
    # the suite's packed Qwen3-14B row: 40 query heads of 16384 tokens in 8 sequences, 330 MiB, one launch of all
    # 8 K/V heads (the split ran two of 4)
    n_pad = ag.dq_pad_columns(16384, 8, 64)
    assert ag.fused_chunk(1, 8, 5, 128, n_pad, *ag.acc_budget(None, {}, 5, causal=True, n_kb=16)) == 8
    assert ag.fused_chunk(1, 8, 5, 128, n_pad, *ag.acc_budget(None, {}, 5)) == 4
    # Qwen3-14B B16 T4096 (1280 MiB whole) is still bounded: launches of at most FB_ACC_SHORT_MIB
    per_pair = 5 * 128 * 4096 * 4
    chunk = ag.fused_chunk(16, 8, 5, 128, 4096, *ag.acc_budget(None, {}, 5, causal=True, n_kb=32))
    assert 1 <= chunk < 128 and chunk * per_pair <= ag.FB_ACC_SHORT_MIB * mib


DQ_CONVS = [None, "128,8", "32,2"]  # the shipped launch, and HEARTH_ATTN_DQ_CONV's blocks around it


@pytest.mark.parametrize("conv", DQ_CONVS)
@pytest.mark.parametrize("zero", [False, True])
def test_dq_from_acc_transposes_scales_casts_and_clears(monkeypatch, zero, conv):
    """The fused backward's epilogue (interpreter on the CPU): dq[b, h, t] = scale * acc[b * rows + h, :, t] into a
    strided view ([B, T, H, D] memory, heads 1..2 of 4), queries past T not written, acc cleared only with zero;
    at each launch config (n_pad 192: a 128-query block runs past it and is masked)."""
    if conv:
        monkeypatch.setenv("HEARTH_ATTN_DQ_CONV", conv)
    g = torch.Generator().manual_seed(3)
    heads, rows, d, t, n_pad = 4, 2, 16, 70, 192
    acc = torch.randn(heads, d, n_pad, generator=g)
    acc0 = acc.clone()
    dev = "cuda" if HAS_CUDA else "cpu"
    acc = acc.to(dev)
    full = torch.full((2, t, 4, d), 7.0, dtype=torch.bfloat16, device=dev).transpose(1, 2)  # [B, H, T, D] view
    ag.dq_from_acc(acc, full[:, 1:3], rows, t, 0.5, zero)
    want = (acc0[:, :, :t].transpose(-1, -2) * 0.5).reshape(2, rows, t, d)
    # one bf16 step (the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest)
    torch.testing.assert_close(full[:, 1:3].float().cpu(), want, rtol=2 ** -7, atol=0)
    assert (full[:, 0] == 7).all() and (full[:, 3] == 7).all()
    if zero:
        assert (acc == 0).all()
    else:
        assert torch.equal(acc.cpu(), acc0)
    with pytest.raises(ValueError, match="acc must be"):
        ag.dq_from_acc(acc[:, :, :100], full[:, 1:3], rows, t, 0.5, zero)
    with pytest.raises(ValueError, match="dq must be"):
        ag.dq_from_acc(acc, full[:, 1:4], rows, t, 0.5, zero)


def test_dq_conv_config_knob():
    """dq_from_acc's launch: the shipped one unset, the knob's when well formed, a named error otherwise."""
    assert ag.dq_conv_config({}) == (ag.DQ_CONV_BLOCK, ag.DQ_CONV_WARPS)
    assert ag.dq_conv_config({"HEARTH_ATTN_DQ_CONV": "128,8"}) == (128, 8)
    for bad in ("128", "96,4", "64,3", "a,b", "64,32"):
        with pytest.raises(ValueError, match="HEARTH_ATTN_DQ_CONV"):
            ag.dq_conv_config({"HEARTH_ATTN_DQ_CONV": bad})


def test_dq_pad_starts_place_sequences_apart():
    """DQ_PAD's placement: every sequence starts at a multiple of pad, its roundup(len, pad) columns end at or
    before the next one's start, and the last one within dq_pad_columns; brute force over ragged lengths,
    empty sequences included."""
    g = torch.Generator().manual_seed(5)
    for pad in (64, 128):
        for _ in range(200):
            lens = torch.randint(0, 300, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
            cu = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0)))
            starts = ag.dq_pad_starts(cu, pad)
            ends = starts + (lens + pad - 1) // pad * pad
            assert (starts % pad == 0).all()
            assert (ends[:-1] <= starts[1:]).all(), (lens, starts)
            n_pad = ag.dq_pad_columns(int(cu[-1]), len(lens), pad)
            assert n_pad % pad == 0 and int(ends[-1]) <= n_pad, (lens, n_pad)


@pytest.mark.parametrize("conv", DQ_CONVS)
@pytest.mark.parametrize("zero", [False, True])
def test_dq_from_acc_reads_padded_sequences(monkeypatch, zero, conv):
    """The packed form (pad, the fused kernel's DQ_PAD; interpreter on the CPU): sequence s's dQ^T is read from
    columns dq_pad_starts(cu_q, pad)[s] onwards into dq's packed rows cu_q[s] .. cu_q[s + 1]; with zero every
    column of each sequence's 64-column blocks is cleared (the padding too), columns between sequences are not
    touched, at each launch config (a 128-query block never clears past its sequence's 64-column boundary)."""
    if conv:
        monkeypatch.setenv("HEARTH_ATTN_DQ_CONV", conv)
    g = torch.Generator().manual_seed(4)
    lens = [70, 0, 1, 130, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    total, heads, d, pad = int(cu[-1]), 3, 16, 64
    n_pad = ag.dq_pad_columns(total, len(lens), pad)
    acc = torch.randn(heads, d, n_pad, generator=g)
    acc0 = acc.clone()
    dev = "cuda" if HAS_CUDA else "cpu"
    acc, cu_dev = acc.to(dev), cu.to(dev)
    dq = torch.full((total, heads, d), 7.0, dtype=torch.bfloat16, device=dev)
    dq4 = dq.unsqueeze(0).transpose(1, 2)  # [1, H, total, D]: the varlen backward's view
    ag.dq_from_acc(acc, dq4, heads, total, 0.5, zero, cu_q=cu_dev, max_q=max(lens), pad=pad)
    starts = ag.dq_pad_starts(cu.long(), pad)
    want = torch.empty(total, heads, d)
    cleared = torch.zeros(n_pad, dtype=torch.bool)
    for s, n in enumerate(lens):
        c0, r0 = int(starts[s]), int(cu[s])
        want[r0:r0 + n] = acc0[:, :, c0:c0 + n].permute(2, 0, 1) * 0.5
        cleared[c0:c0 + (n + 63) // 64 * 64] = True
    torch.testing.assert_close(dq.float().cpu(), want, rtol=2 ** -7, atol=0)
    acc = acc.cpu()
    if zero:
        assert (acc[:, :, cleared] == 0).all()
        assert torch.equal(acc[:, :, ~cleared], acc0[:, :, ~cleared])
    else:
        assert torch.equal(acc, acc0)
    with pytest.raises(ValueError, match="pad must be"):
        ag.dq_from_acc(acc.to(dev), dq4, heads, total, 0.5, zero, cu_q=cu_dev, max_q=max(lens), pad=96)


@hopper_only
@pytest.mark.parametrize("mib", [0.001, 0.125, 0.25])
def test_gpu_fused_backward_bounded_buffer(monkeypatch, mib):
    """HEARTH_ATTN_FB_ACC_MIB bounds the fp32 dQ buffer: one pair a launch (0.001), a whole batch row (0.125: Hk
    pairs), two rows (0.25); gradients within the 2x rule either way."""
    monkeypatch.setenv("HEARTH_ATTN_FB_ACC_MIB", str(mib))
    for causal in (False, True):
        _check_backward(2, 4, 2, 100, 64, causal, parts=("fused",))


@hopper_only
def test_gpu_fused_preprocess_clears_the_dq_buffer():
    """_fb_prepare (the fused backward's one-launch preprocess) on the GPU: delta = rowsum(dO * O) against fp64 for
    a [B, T, H, D]-ordered output, the dQ buffer's first acc_heads heads zero over every padded column, the rest
    untouched."""
    g = torch.Generator().manual_seed(11)
    B, H, T, D, n_pad, heads = 2, 4, 1000, 128, 1024, 5
    out = torch.randn(B, T, H, D, generator=g).to("cuda", torch.bfloat16).transpose(1, 2)
    do = torch.randn(B, H, T, D, generator=g).to("cuda", torch.bfloat16)
    delta = torch.full((B, H, T), float("nan"), device="cuda")
    acc = torch.full((B * H, D, n_pad), float("nan"), device="cuda")
    ag._fb_prepare(out, do, delta, acc, heads, n_pad)
    want = (out.double() * do.double()).sum(-1)
    torch.testing.assert_close(delta.double(), want, rtol=1e-5, atol=1e-4)
    assert (acc[:heads] == 0).all()
    assert acc[heads:].isnan().all()


@hopper_only
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_every_fused_backward_candidate_is_correct(monkeypatch, D):
    for cfg in ag.FB_CANDIDATES[D]:
        monkeypatch.setitem(ag.FB_CONFIGS, D, cfg)
        for causal in (False, True):
            _check_backward(1, 4, 2, 1000, D, causal, parts=("fused",))


@hopper_only
@pytest.mark.parametrize("D,forms", [(64, "atomics"), (64, "atomics_ss"), (64, "tma"), (64, "all_pairs"),
                                     (64, "one_pair"), (64, "four_pairs"), (128, "atomics"), (128, "atomics_ss"),
                                     (128, "tma"), (128, "no_split"), (128, "all_pairs"), (128, "one_pair"),
                                     (128, "four_pairs"), (128, "two_launch_pre"), (128, "dq_async"),
                                     (128, "early_release"), (128, "dq_bufs2"), (128, "dq_early"), (128, "dq_early2"),
                                     (64, "stats_ahead"), (128, "stats_ahead"), (64, "st_ahead"),
                                     (128, "st_ahead"), (128, "st_ahead_early_release")])
def test_gpu_backward_fused_other_forms_match_reference(monkeypatch, D, forms):
    """The fused backward's forms other than the shipped one (the tests above run that), each at the shipped config
    and at 32-query steps: dQ^T by fp32 atomics (HEARTH_ATTN_FB_DQ_TMA=0) with lse / delta loaded by the consumers
    (HEARTH_ATTN_FB_STATS_SMEM=0) or staged by the producer; by TMA reduce-add with the consumers' loads; the shipped
    forms without the dQ split (HEARTH_ATTN_FB_DQ_SPLIT=0) or in a forced grid order (HEARTH_ATTN_FB_PAIR_GROUP
    0 / 1 / 4: every pair's key blocks interleaved, none, groups of four (two groups at GQA 40/8); the default
    picks by causal and GQA: fb_pair_group). dK, dV and dQ within the 2x rule at ragged T, causal or
    not, GQA 40/8 in [B, T, H, D] order, fp16 with a key tail, and with the dQ buffer bounded to one (b, K/V head)
    pair a launch. two_launch_pre: the dQ buffer zeroed by a fill and delta by the plain preprocess
    (HEARTH_ATTN_FB_PRE_ZERO=0), not in one launch. dq_async: dQ^T's matmul issued behind dK's
    (HEARTH_ATTN_FB_DQ_ASYNC=1, with the dQ split). early_release: the Q / dO slot given back after dK's matmul,
    dS^T's buffer on its own mbarrier (HEARTH_ATTN_FB_LATE_RELEASE=0; the shipped form gives both back after dQ^T's). dq_bufs2: two dQ^T staging tiles a warpgroup
    (HEARTH_ATTN_FB_DQ_BUFS2=1, with the dQ split and the TMA reduce). dq_early / dq_early2: dQ^T's matmul issued
    before dK's, its reduce while dK's runs, with dV's after dS^T or as shipped (HEARTH_ATTN_FB_DQ_EARLY=1 / 2, with
    the dQ split). stats_ahead: the producer loads lse / delta a step ahead, before waiting for the slot
    (HEARTH_ATTN_FB_STATS_AHEAD=1). st_ahead: the next step's S^T computed during this step's dQ^T staging
    (HEARTH_ATTN_FB_ST_AHEAD=1, with the dQ split and the TMA reduce; at d64 the knob leaves the shipped form, which
    this also checks); st_ahead_early_release: the same with the Q / dO slot given back after dK's matmul."""
    env = {"atomics": dict(DQ_TMA="0", STATS_SMEM="0"), "atomics_ss": dict(DQ_TMA="0"),
           "tma": dict(STATS_SMEM="0"), "no_split": dict(DQ_SPLIT="0"),
           "all_pairs": dict(PAIR_GROUP="0"), "one_pair": dict(PAIR_GROUP="1"),
           "four_pairs": dict(PAIR_GROUP="4"), "two_launch_pre": dict(PRE_ZERO="0"),
           "dq_async": dict(DQ_ASYNC="1"), "early_release": dict(LATE_RELEASE="0"),
           "dq_bufs2": dict(DQ_BUFS2="1"), "dq_early": dict(DQ_EARLY="1"),
           "dq_early2": dict(DQ_EARLY="2"), "stats_ahead": dict(STATS_AHEAD="1"),
           "st_ahead": dict(ST_AHEAD="1"), "st_ahead_early_release": dict(ST_AHEAD="1", LATE_RELEASE="0")}[forms]
    for name, value in env.items():
        monkeypatch.setenv(f"HEARTH_ATTN_FB_{name}", value)
    for cfg in dict.fromkeys([ag.FB_CONFIGS[D], (32, 2)]):
        monkeypatch.setenv("HEARTH_ATTN_FB_CONFIG", f"{cfg[0]},{cfg[1]}")
        for causal in (False, True):
            for T in (1, 100, 1000):
                _check_backward(1, 4, 2, T, D, causal, parts=("fused",))
        _check_backward(1, 40, 8, 1500, D, True, bthd=True, parts=("fused",))
        _check_backward_lengths(200, 100, D, dtype=torch.float16, score_shift=32.0 * math.sqrt(D), parts=("fused",))
        _check_backward_lengths(300, 1111, D, parts=("fused",))
    monkeypatch.setenv("HEARTH_ATTN_FB_ACC_MIB", "0.001")
    _check_backward(2, 4, 2, 100, D, True, parts=("fused",))


@hopper_only
def test_gpu_inputs_tma_cannot_address_take_the_triton_kernel(monkeypatch):
    """HEARTH_ATTN_GLUON=1 with rows of 136 bytes (a [..., :64] slice of D=68 storage): not TMA-addressable,
    so attention() runs the Triton forward (the Gluon one is never called) and is still right."""
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "1")
    monkeypatch.setattr(ag, "forward", lambda *a, **k: pytest.fail("Gluon forward on non-TMA-addressable inputs"))
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 4, 200, 68, generator=g).to("cuda", torch.bfloat16)[..., :64] for _ in range(4))
    assert not ag.tma_addressable(q, k, v)
    # the leaves are the D=68 storages and attention() sees their [..., :64] views (a clone of the view, as
    # _assert_within_bound's own run makes, would be dense and TMA-addressable)
    bases = [t._base.detach().clone().requires_grad_() for t in (q, k, v)]
    views = [b[..., :64] for b in bases]
    assert not ag.tma_addressable(*views)
    out = attn.attention(*views, causal=True)
    out.backward(do)
    ours = [out.detach()] + [b.grad[..., :64] for b in bases]
    test_attention = importlib.import_module("tests.kernels.test_attention")
    test_attention._assert_within_bound(q, k, v, do, True, None, ours=ours)


@hopper_only
def test_gpu_gluon_and_triton_forward_agree(monkeypatch, variant):
    """Same inputs through both forwards: O within a bf16 ulp or two, lse to fp32 rounding."""
    q, k, v, _ = _inputs(2, 8, 2, 1000, 128, torch.bfloat16, seed=4)
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "0")
    o_t, lse_t = attn._attention_forward(q, k, v, True, 0.088)
    monkeypatch.setenv("HEARTH_ATTN_GLUON", "1")
    o_g, lse_g = attn._attention_forward(q, k, v, True, 0.088)
    torch.testing.assert_close(o_g, o_t, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse_g, lse_t, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------- GPU, ping-pong variant (subprocesses)
gluon_pp = pytest.mark.gluon_pp
PP_TIMEOUT_S = 90  # a case set compiles its kernels (seconds each) and checks a few shapes; a hang never ends
_REPO = os.path.join(os.path.dirname(__file__), "..", "..")
_PP_RUNNER = r"""
import json, sys, torch
from hearth.kernels import attention_gluon as ag
from tests.kernels import test_attention_gluon as t
assert ag.PING_PONG, "HEARTH_ATTN_GLUON_PP=1 did not select the ping-pong variant"
import os
assert ag.PERSISTENT == (os.environ.get("HEARTH_ATTN_GLUON_PERSIST") == "1")
if os.environ.get("HEARTH_TEST_NUM_SMS"):  # a small persistent grid: every program walks many tiles
    ag.num_sms = lambda device: int(os.environ["HEARTH_TEST_NUM_SMS"])
for name, args, config in json.loads(sys.argv[1]):
    if config is not None:  # one of PP_CANDIDATES: (head_dim, (BLOCK_M, BLOCK_N, NUM_STAGES))
        ag.PP_CONFIGS[config[0]] = tuple(config[1])
    args = [getattr(torch, a[6:]) if isinstance(a, str) and a.startswith("torch.") else a for a in args]
    print("running", name, args, ag.PP_CONFIGS, flush=True)
    getattr(t, name)(*args)
    print("passed", name, args, flush=True)
print("all passed")
"""


def _run_pp(calls, timeout=PP_TIMEOUT_S, extra_env=None):
    """Run [(helper name in this module, args, config or None)] with HEARTH_ATTN_GLUON_PP=1 in a fresh
    process; a hang (timeout) or any failure fails the calling test with the log of what ran."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # per-tile unless the caller asks for the persistent form (forward_kernel would pick it at short lengths)
    env.update(HEARTH_ATTN_GLUON="1", HEARTH_ATTN_GLUON_PP="1", HEARTH_ATTN_GLUON_PERSIST="0")
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(_REPO, "src"), _REPO, env.get("PYTHONPATH", "")])
    calls = [(n, [str(a) if isinstance(a, torch.dtype) else a for a in args], cfg) for n, args, cfg in calls]
    try:
        res = subprocess.run([sys.executable, "-c", _PP_RUNNER, json.dumps(calls)], cwd=_REPO, env=env,
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        log = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"ping-pong forward did not finish in {timeout} s (a barrier schedule that hangs?); "
                    f"log so far:\n{log[-3000:]}")
    assert res.returncode == 0 and "all passed" in res.stdout, (res.stdout[-3000:] + res.stderr[-3000:])


@gluon_pp
@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_pp_forward_matches_reference(D, causal):
    """Shipped PP_CONFIGS: T 1 / 100 / 128 (one CTA, the second tile partly or wholly past the end), 1000,
    4096 + 64 (ragged tails), GQA 40/8 on a [B, T, H, D] view, fp16; non-causal also Tq != Tk."""
    calls = [("_check_forward", [1, 4, 2, T, D, torch.bfloat16, causal], None) for T in (1, 100, 128, 1000, 4160)]
    calls.append(("_check_forward", [1, 40, 8, 1500, D, torch.bfloat16, causal, True], None))
    calls.append(("_check_forward", [2, 4, 4, 777, D, torch.float16, causal], None))
    calls.append(("_check_forward_without_lse", [2, 8, 2, 1024, D, causal], None))
    calls.append(("_check_forward_memory_is_its_output", [2, 8, 2, 1000, D, causal], None))
    if not causal:
        calls += [("_check_forward_lengths", [300, 1111, D], None), ("_check_forward_lengths", [1111, 300, D], None)]
    _run_pp(calls)


@gluon_pp
@hopper_only
@pytest.mark.parametrize("D,cfg", [(d, cfg) for d in ag.HEAD_DIMS for cfg in ag.PP_CANDIDATES[d]], ids=str)
def test_gpu_pp_every_candidate_config_is_correct(D, cfg):
    """Every ping-pong config the probe's --sweep may time, causal and not, T 300 and 1000 (GQA 4/2)."""
    _run_pp([("_check_forward", [1, 4, 2, T, D, torch.bfloat16, c], [D, list(cfg)])
             for c in (False, True) for T in (300, 1000)])


@gluon_pp
@hopper_only
@pytest.mark.parametrize("sms,balance", [(None, "1"), (7, "1"), (7, "0")],
                         ids=["all-sms", "7-programs", "7-programs-round-robin"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_pp_persistent_matches_reference(D, sms, balance):
    """The persistent ping-pong forward (HEARTH_ATTN_GLUON_PERSIST=1), at the shipped config and at 64-key blocks
    (where the two query tiles of a causal tile visit different numbers of blocks, so one warpgroup's empty
    turns follow its real ones), on the whole GPU and on a grid of 7 programs (every program walks many tiles,
    several wholly past the end in a row): ragged lengths, causal and not, GQA 40/8 on a [B, T, H, D] view,
    fp16, Tq != Tk, and the inference call without lse. Both schedules: balanced (shipped) and round robin."""
    configs = [None, [D, [64, 64, 3]]]
    calls = [("_check_forward", [B, H, H // 2, T, D, torch.bfloat16, c], cfg)
             for cfg in configs for c in (False, True)
             for B, H, T in ((1, 4, 1), (1, 4, 100), (1, 4, 128), (8, 32, 300), (2, 16, 1000), (1, 4, 4160))]
    calls += [("_check_forward", [1, 40, 8, 1500, D, torch.bfloat16, c, True], cfg) for cfg in configs for c in (False, True)]
    calls += [("_check_forward", [2, 4, 4, 777, D, torch.float16, c], cfg) for cfg in configs for c in (False, True)]
    calls += [("_check_forward_without_lse", [2, 8, 2, 1024, D, c], cfg) for cfg in configs for c in (False, True)]
    calls += [("_check_forward_lengths", [tq, tk, D], cfg) for cfg in configs for tq, tk in ((300, 1111), (1111, 300))]
    env = {"HEARTH_ATTN_GLUON_PERSIST": "1", "HEARTH_ATTN_PPS_BALANCE": balance}
    if sms:
        env["HEARTH_TEST_NUM_SMS"] = str(sms)
    _run_pp(calls, timeout=2 * PP_TIMEOUT_S, extra_env=env)  # under the suite's 200 s per test


_PPS_BUILD_SCRIPT = r"""
import json, torch
from hearth.kernels import attention_gluon as ag
from hearth import inspect as hi
out = []
for store in (True, False):
    for label, k in ag.offline_kernels(90, torch.bfloat16, variants=("pps",), store_lse=store):
        r = hi.report_compiled(label, k, sass=False)
        out.append(dict(label=label, d=int(label.split(" d")[1].split()[0]), causal="causal" in label,
                        spill=r.spill_bytes, wgmma=r.ptx["wgmma"], tma=r.ptx["tma"],
                        scratch=getattr(k.metadata, "global_scratch_size", None), shared=r.shared_bytes))
print(json.dumps(out))
"""


def test_sm90_persistent_ping_pong_builds():
    """The persistent forward builds for sm_90 at the shipped PP_CONFIGS, causal or not, with and without the lse
    store (Lse a None constexpr through the partitions' arguments): wgmma and TMA, no global scratch, within the
    H200's shared memory, and no spills. At head_dim 128 causal it had 16 bytes of stack with the lse store, 8
    without: the grid (num_programs, now the N_PROG argument) and the int64 lse row's sign word were loaded at the
    kernel's start and kept across the partitions' register changes, and the causal blocks' key-bound predicates
    (implied by the causal mask, T_q == T_k) were kept across the tile loop."""
    reports = run_offline(_PPS_BUILD_SCRIPT)
    assert len(reports) == 2 * len(ag.HEAD_DIMS) * 2, [r["label"] for r in reports]
    for r in reports:
        assert r["wgmma"] > 0 and r["tma"] > 0 and r["scratch"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        assert r["spill"] == 0, r



_ONES_BUILD_SCRIPT = r"""
import json, sys, torch
from hearth.kernels import attention_gluon as ag
ones, variants = sys.argv[1].split(","), tuple(sys.argv[2].split(","))
print(json.dumps([label for label, _ in ag.offline_kernels(90, torch.bfloat16, variants=variants, ones=ones)]))
"""


def test_sm90_builds_with_the_launch_constants_of_tiny_shapes():
    """A launch with an int argument equal to 1 compiles it as the constant 1 (Triton's specialization), so a
    one-row shape builds a different kernel than the offline builds above. Every variant builds at T_q = T_k = 1
    (one query block), and the forwards also at B = H = 1 (every count 1). The persistent forward failed this
    in Triton's LLVM lowering until N_M was kept out of specialization; the H200 suite found it at T = 1."""
    t1 = ("N_CTX_Q,N_CTX_K,N_M", "1part,ws,pp,pps,bwd,bwd_dq")
    all1 = ("N_CTX_Q,N_CTX_K,N_M,H_Q,H_K,GROUP,SECTION,N_PROG", "1part,ws,pp,pps")
    got = run_offline(_ONES_BUILD_SCRIPT, t1, all1)
    assert [len(g) for g in got] == [6 * len(ag.HEAD_DIMS) * 2, 4 * len(ag.HEAD_DIMS) * 2], got


def test_offline_ones_must_name_kernel_arguments():
    with pytest.raises(ValueError, match="ones must name kernel arguments.*N_CTX"):
        ag.offline_kernels(90, torch.bfloat16, ones=("N_CTX",))

# ---------------------------------------------------------------- the ping-pong turn protocol, modelled
def _pp_turn_program(w, n):
    """Consumer warpgroup w's turn-barrier operations in _pp_consumer, in order, for block counts n (one per
    tile of the program): ('wait', barrier, parity, pred) and ('arrive', barrier, pred)."""
    if n[w] == 0:
        return
    n_other = n[1 - w]
    for j in range(n[w]):
        if w == 1:
            yield ("wait", 1, j & 1, j < n_other)
        elif j >= 1:
            yield ("wait", 0, (j - 1) & 1, j - 1 < n_other)
        yield ("arrive", 1 - w, True)


def _pp_turns_run(n, rng):
    """Run the two warpgroups' turn operations under one random interleaving with mbarrier phase semantics
    (count 1; a wait on parity p passes once the barrier's completed-phase count has the other parity).
    Returns None, or what went wrong: a deadlock."""
    phases = [0, 0]
    progs = [_pp_turn_program(w, n) for w in range(2)]
    cur = [next(p, None) for p in progs]
    while any(c is not None for c in cur):
        ready = [w for w, c in enumerate(cur) if c is not None
                 and (c[0] == "arrive" or not c[3] or (phases[c[1]] & 1) != c[2])]
        if not ready:
            return f"deadlock at {cur}, phases {phases}"
        w = rng.choice(ready)
        op = cur[w]
        if op[0] == "arrive" and op[2]:
            phases[op[1]] += 1
        cur[w] = next(progs[w], None)
    return None


def test_pp_turn_rings_never_hang():
    """The turn protocol of the ping-pong forward's two consumer warpgroups over every program of ragged and
    long lengths, causal and not, under random interleavings: no deadlock."""
    import random

    def blocks(tile, T, causal, bm, bn):
        lo = tile * bm
        if lo >= T:
            return 0
        return -(-(min(lo + bm, T) if causal else T) // bn)

    rng = random.Random(0)
    for causal in (True, False):
        for T in [1, 63, 64, 65, 100, 128, 134, 192, 200, 300, 333, 500, 777, 1000, 4160]:
            for bm, bn in ((64, 64), (64, 128), (128, 64)):
                for start_m in range(-(-T // (2 * bm))):
                    n = [blocks(2 * start_m + w, T, causal, bm, bn) for w in range(2)]
                    for _ in range(5):
                        err = _pp_turns_run(n, rng)
                        assert err is None, (causal, T, bm, bn, n, err)


def _pps_agents(tiles, stages):
    """The persistent ping-pong forward's barrier operations (_pps_producer, _pps_consumer, _pps_empty_turns),
    per agent, for one program's tiles [(n0, n1), ...]: ('wait', barrier, target) waits for the barrier's
    target-th phase (the kernel waits on parity target & 1), ('arrive', barrier). Barriers: ('k'|'v', slot),
    ('empty', consumer, slot), ('turn', consumer), ('q', consumer). The producer's TMA completions are its
    arrivals on k / v."""
    def producer():
        r = 0
        for n in tiles:
            for _ in range(max(n)):
                if r >= stages:
                    for w in (0, 1):
                        yield ("wait", ("empty", w, r % stages), r // stages - 1)
                yield ("arrive", ("k", r % stages))
                yield ("arrive", ("v", r % stages))
                r += 1

    def consumer(w):
        r0 = g = 0
        for it, n in enumerate(tiles):
            n_w, n_max = n[w], max(n)
            yield ("arrive", ("q", w))  # the Q load's completion: every tile, also one past the end
            yield ("wait", ("q", w), it)

            def wait_turn():
                if w == 1:
                    yield ("wait", ("turn", 1), g)
                elif g > 0:
                    yield ("wait", ("turn", 0), g - 1)

            def turn():  # an empty turn: wait, pass it on
                nonlocal g
                yield from wait_turn()
                yield ("arrive", ("turn", 1 - w))
                g += 1

            if n_w > 0:
                for j in range(n_w):  # a real turn, in the kernel's order
                    r = r0 + j
                    assert g == r  # the kernel uses the ring position as the turn count
                    yield from wait_turn()
                    yield ("wait", ("k", r % stages), r // stages)  # QK^T(j)
                    if j >= 1:
                        yield ("wait", ("v", (r - 1) % stages), (r - 1) // stages)  # PV(j - 1)
                    yield ("arrive", ("turn", 1 - w))
                    g += 1
                    if j >= 1:
                        yield ("arrive", ("empty", w, (r - 1) % stages))
                r = r0 + n_w - 1
                yield ("wait", ("v", r % stages), r // stages)
                yield ("arrive", ("empty", w, r % stages))
            for j in range(n_w, n_max):
                r = r0 + j
                yield from turn()
                yield ("wait", ("k", r % stages), r // stages)
                yield ("wait", ("v", r % stages), r // stages)
                yield ("arrive", ("empty", w, r % stages))
            r0 += n_max

    return [producer(), consumer(0), consumer(1)]


@pytest.mark.parametrize("bh,n_m,section", [(1, 1, 1), (8, 3, 2), (160, 16, 80), (128, 32, 16), (10, 5, 10),
                                             (9, 4, 3), (7, 2, 1)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_pps_tile_order_visits_every_tile_once_longest_first(bh, n_m, section, causal):
    """The persistent forward's tile order (pps_tile_order, the host's spelling of _pps_tile): every (query block,
    batch * head) tile exactly once; sections of `section` rows in turn, each wholly before the next; within a section query blocks longest first under the causal mask,
    and the section's heads side by side (the programs running at once share their K/V)."""
    order = ag.pps_tile_order(bh, n_m, section, causal)
    assert sorted(order) == [(m, r) for m in range(n_m) for r in range(bh)]
    for i, (m, r) in enumerate(order):
        sec = r // section
        assert all(r2 // section <= sec for _, r2 in order[:i])  # sections never interleave
        size = section
        same = [o for o in order if o[1] // section == sec]
        pos = same.index((m, r))
        assert _longest_first_rank(same[pos], n_m, causal) == pos // size
        assert same[pos][1] == sec * section + pos % size


def _schedule_loads(per, bh, n_m, section, causal, tq, tk, bm=64, bn=128, cost=ag.PPS_TILE_COST):
    order = ag.pps_tile_order(bh, n_m, section, causal)
    return [sum(ag.pps_tile_turns(order[t][0], tq, tk, causal, bm, bn) + cost for t in tiles) for tiles in per]


@pytest.mark.parametrize("bh,n_m,section,causal,programs,tq", [
    (128, 16, 32, True, 132, 2048), (80, 32, 80, True, 132, 4096), (8, 3, 2, False, 5, 300), (1, 1, 1, True, 1, 1),
    (7, 2, 1, True, 14, 200), (160, 16, 80, False, 132, 2048), (9, 4, 3, True, 7, 500)])
@pytest.mark.parametrize("balance", [True, False], ids=["balanced", "round-robin"])
def test_pps_schedule_gives_every_tile_to_one_program_in_tile_order(bh, n_m, section, causal, programs, tq,
                                                                     balance):
    """pps_schedule: one list of tile ids per program; every tile id exactly once; each program's tiles ascending
    (the tile order, so programs running at once share a section's K/V); round robin is tile_id = p, p + grid, ...;
    every program gets a tile (grid <= tiles); the kernel's table holds each program's tiles by column, then -1."""
    per = ag.pps_schedule(bh, n_m, section, causal, programs, tq, tq, 64, 128, balance=balance)
    assert len(per) == programs
    assert sorted(t for tiles in per for t in tiles) == list(range(bh * n_m))
    for p, tiles in enumerate(per):
        assert tiles and tiles == sorted(tiles)
        if not balance:
            assert tiles == list(range(p, bh * n_m, programs))
    t = ag._pps_schedule_tensor(bh, n_m, section, causal, programs, tq, tq, 64, 128, balance, ag.PPS_TILE_COST,
                                torch.device("cpu"))
    assert t.dtype == torch.int32 and t.is_contiguous() and t.shape == (1 + max(map(len, per)), programs)
    for p, tiles in enumerate(per):  # column p: its tiles in order, then -1 (at least one)
        assert t[:, p].tolist() == tiles + [-1] * (t.shape[0] - len(tiles))


def test_pps_schedule_balances_the_causal_tail():
    """Under the causal mask round robin leaves the busiest program well over the mean (B4 H32 T2048 D128: 2048
    tiles of 1-16 key blocks on 132 SMs, 1.14x), the balanced schedule within 2% of it; non-causal tiles are
    equal, and both schedules are then even to a tile."""
    for bh, n_m, section, tq, rr_min in ((128, 16, 32, 2048, 1.10), (80, 32, 80, 4096, 1.04), (64, 32, 64, 4096, 1.04)):
        loads = {}
        for balance in (True, False):
            per = ag.pps_schedule(bh, n_m, section, True, 132, tq, tq, 64, 128, balance=balance)
            got = _schedule_loads(per, bh, n_m, section, True, tq, tq)
            loads[balance] = max(got) / (sum(got) / len(got))
        assert loads[True] <= 1.02 and loads[False] >= rr_min, (bh, n_m, loads)
    for balance in (True, False):
        counts = [len(tiles) for tiles in ag.pps_schedule(160, 16, 80, False, 132, 2048, 2048, 64, 128,
                                                          balance=balance)]
        assert max(counts) - min(counts) <= 1


def test_pps_tile_turns_spells_the_kernels_block_counts():
    """pps_tile_turns (the host's _pps_tile_turns): causal tile s streams s + 1 128-key blocks at 64-row query tiles
    (its second tile's diagonal), non-causal every key block; a ragged end counts the tile's live half; a tile
    wholly past the queries streams none; Tk < Tq clips the causal count."""
    assert [ag.pps_tile_turns(s, 2048, 2048, True, 64, 128) for s in range(16)] == list(range(1, 17))
    assert ag.pps_tile_turns(3, 2048, 1000, False, 64, 128) == 8
    assert ag.pps_tile_turns(0, 100, 100, True, 64, 128) == 1  # rows 0-63 and 64-99
    assert ag.pps_tile_turns(1, 100, 100, True, 64, 128) == 0  # rows 128-255: past the end
    assert ag.pps_tile_turns(2, 300, 300, True, 64, 64) == 5  # second tile rows 256-299: keys to 300
    assert ag.pps_tile_turns(7, 2048, 300, True, 64, 128) == 3


def test_pps_schedule_rejects_a_grid_over_the_tiles():
    with pytest.raises(ValueError, match="programs"):
        ag.pps_schedule(2, 2, 2, True, 5, 256, 256, 64, 128)
    with pytest.raises(ValueError, match="programs"):
        ag.pps_schedule(2, 2, 2, True, 0, 256, 256, 64, 128)


def _longest_first_rank(tile, n_m, causal):
    """A tile's rank in the longest-first walk of query blocks (causal: the last block first)."""
    return n_m - 1 - tile[0] if causal else tile[0]


def test_pps_section_holds_whole_kv_heads_within_the_budget():
    """Sections are whole GQA groups of the most K/V heads (K and V, tk x head_dim) that fit PPS_KV_BYTES and divide
    the K/V heads evenly: MHA B4 H32 T4096 D128 bf16 (2 MiB a head): 16 rows; GQA B4 40/8: 16 K/V heads = 80 rows;
    T 32768 (16 MiB a head): 2 K/V heads; a head over the budget still makes a section of one group; 7 K/V heads
    (prime) where 16 fit: one section of all 7."""
    assert ag.PPS_KV_BYTES == 32 * 2**20
    assert ag.pps_section(128, 1, 4096, 128, 2) == 16
    assert ag.pps_section(160, 5, 4096, 128, 2) == 80
    assert ag.pps_section(40, 5, 32768, 128, 2) == 10
    assert ag.pps_section(40, 5, 131072, 128, 2) == 5
    assert ag.pps_section(8, 1, 1024, 64, 2) == 8
    assert ag.pps_section(35, 5, 4096, 128, 2) == 35
    assert ag.pps_section(26, 1, 4096, 128, 2) == 13  # 16 fit, 13 the largest divisor of 26 below
    for bh, group, tk in ((640, 5, 1024), (64, 8, 8192), (3, 1, 100), (22, 2, 2048)):
        sec = ag.pps_section(bh, group, tk, 128, 2)
        assert bh % sec == 0 and sec % group == 0
        assert sec == group or (sec // group) * 2 * tk * 128 * 2 <= ag.PPS_KV_BYTES


def test_pps_barrier_phases_stay_exact_across_tiles():
    """The persistent forward carries every barrier's phase across a program's tiles. Modelled under random
    interleavings for tile sequences with unequal, zero and equal block counts (causal diagonals, ragged ends,
    non-causal): no deadlock, and no wait ever finds its barrier two or more phases past its target (the
    parity it waits on would then name the wrong phase: a hang or an early pass)."""
    import random

    rng = random.Random(1)
    sequences = [[(1, 2)], [(2, 3), (1, 2)], [(3, 4), (3, 3), (1, 0), (5, 6)], [(4, 4)] * 5,
                 [(1, 0), (1, 0), (2, 3)], [(7, 8), (1, 2), (2, 2), (0, 0)][:3]]
    sequences += [[(a, a + rng.choice((0, 1))) if rng.random() < 0.8 else (a, 0) for a in
                   (rng.randint(1, 9) for _ in range(rng.randint(1, 6)))] for _ in range(40)]
    for stages in (2, 3, 4):
        for tiles in sequences:
            for _ in range(10):
                done = {}
                agents = _pps_agents(tiles, stages)
                cur = [next(a, None) for a in agents]
                while any(c is not None for c in cur):
                    ready = []
                    for i, c in enumerate(cur):
                        if c is None:
                            continue
                        if c[0] == "wait":
                            # the hardware's rule: a wait on the target's parity passes while the completed-phase
                            # count has the other parity, so it must pass exactly when the target phase completed
                            have = done.get(c[1], 0)
                            if (have & 1) == (c[2] & 1):
                                continue
                            assert have == c[2] + 1, (stages, tiles, c, have)  # an early pass or two phases past
                        ready.append(i)
                    assert ready, f"deadlock: stages {stages}, tiles {tiles}, waiting {cur}"
                    i = rng.choice(ready)
                    if cur[i][0] == "arrive":
                        done[cur[i][1]] = done.get(cur[i][1], 0) + 1
                    cur[i] = next(agents[i], None)
