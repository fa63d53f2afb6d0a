"""The rope_inplace bench op: hearth's rope(inplace=True) against Liger's in-place rope, like for like, on non-leaf
copies of the case's q and k (PyTorch and hearth refuse to write over a leaf that requires grad)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hearth.bench import cases
from hearth.bench import providers as P

SIZE = dict(B=1, Hq=4, Hk=2, T=8, D=16)


def test_bound_writes_over_copies_and_hands_the_gradient_to_the_leaves():
    """The case's q and k (the leaves the harness checks and resets) are never written; the gradient reaches them
    through the copies unchanged."""
    inputs = cases.SPECS["rope_inplace"].make(SIZE, torch.float32, torch.device("cpu"), True)
    q0, k0 = inputs["q"].detach().clone(), inputs["k"].detach().clone()
    bound = P._inplace_rope_bound(lambda q, k, c, s: _scaled(q, k), inputs, True)
    assert bound.leaves[0] is inputs["q"] and bound.leaves[1] is inputs["k"]
    out_q, out_k = bound.fn()
    assert not out_q.is_leaf and out_q.data_ptr() != inputs["q"].data_ptr()
    torch.autograd.backward([out_q, out_k], [torch.ones_like(out_q), torch.ones_like(out_k)])
    torch.testing.assert_close(inputs["q"].grad, torch.full_like(q0, 2.0))
    torch.testing.assert_close(inputs["k"].grad, torch.full_like(k0, 3.0))
    torch.testing.assert_close(inputs["q"].detach(), q0)
    torch.testing.assert_close(inputs["k"].detach(), k0)


def _scaled(q, k):
    return q * 2, k * 3


def test_only_the_in_place_ropes_apply():
    assert P.applies("rope_inplace", "hearth") and P.applies("rope_inplace", "liger")
    for other in ("eager", "compile", "quack", "cublas", "sdpa_flash", "flash_attn"):
        assert not P.applies("rope_inplace", other)
    with pytest.raises(P.Skipped, match="in-place ropes"):
        P.bind("rope_inplace", "eager", {}, cases.SPECS["rope_inplace"], SIZE, True, True)


def test_check_run_ranks_hearths_in_place_rope(tmp_path):
    """`python -m hearth.bench rope_inplace --check`: hearth's row is checked against the fp32 reference (values
    and the leaves' gradients) and timed; no eager / compile row."""
    out = tmp_path / "bench"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "hearth.bench", "rope_inplace", "--check", "--mode", "full",
                           "--providers", "hearth,eager", "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["provider"] for r in rows} == {"hearth"}, rows
    for r in rows:
        assert r["op"] == "rope_inplace" and r["status"] == "ok", r
        assert r["rel_err"] < 1e-5 and r["ms"] > 0
