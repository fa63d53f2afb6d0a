"""scripts/gpu/attention_knob_probe.py's main loop on the CPU: the kernels, the GPU timing and the memory figures are
faked (no CUDA here); what is checked is which setting the others are compared against, and that a setting the
probe cannot apply is not timed under its name."""

from __future__ import annotations

import json
import os
import runpy
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


class _CpuTorch:
    """torch with the probe's CUDA tensors made on the CPU."""

    cuda = types.SimpleNamespace(empty_cache=lambda: None)

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def Generator(device=None):  # noqa: N802
        return torch.Generator(device="cpu")

    @staticmethod
    def randn(*shape, device=None, **kw):
        return torch.randn(*shape, device="cpu", **kw)


def _fake_attention(q, k, v, causal=False):
    """A stand-in kernel: FAKE_BAD=1 makes it raise, FAKE_SCALE changes its result."""
    if os.environ.get("FAKE_BAD") == "1":
        raise RuntimeError("this knob is outside the kernel's forms")
    return q * (1.0 + float(os.environ.get("FAKE_SCALE", "0"))) + k + v


def _probe(tmp_path, monkeypatch, cases: str, settings: str) -> list[dict]:
    main = runpy.run_path(str(ROOT / "scripts" / "gpu" / "attention_knob_probe.py"), run_name="knob_probe")["main"]
    g = main.__globals__
    mods = {"hearth.kernels.attention": types.SimpleNamespace(attention=_fake_attention),
            "hearth.kernels.attention_gluon": types.SimpleNamespace(PP_CONFIGS={64: (64, 128, 3)})}
    monkeypatch.setitem(g, "torch", _CpuTorch())
    monkeypatch.setitem(g, "importlib", types.SimpleNamespace(import_module=mods.__getitem__))
    monkeypatch.setitem(g, "_gpu_ms", lambda *a, **k: 1.0)
    monkeypatch.setitem(g, "_extra_mib", lambda *a, **k: (0.0, 0.0))
    for key in ("FAKE_BAD", "FAKE_SCALE"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "knobs.jsonl"
    monkeypatch.setattr(sys, "argv", ["probe", "--out", str(out), "--cases", cases, "--settings", settings])
    main()
    return [json.loads(line) for line in out.read_text().splitlines()]


def _rows(rows, case):
    return {r["setting"]: r for r in rows if r["case"] == case and r["setting"] != "cudnn"}


def test_a_failed_first_setting_leaves_no_knob_as_the_reference(tmp_path, monkeypatch):
    """The first setting is the reference ('shipped'). When it raised, the next setting (a knob) became the
    reference: that knob was reported with rel_err 0 and the shipped form behind it as a 'mismatch'."""
    rows = _rows(_probe(tmp_path, monkeypatch, "c:1,2,2,8,64,1", "first=FAKE_BAD=1;knob=FAKE_SCALE=0.5;plain="), "c")
    assert rows["first"]["status"].startswith("error")
    for name in ("knob", "plain"):
        assert rows[name]["status"] not in ("ok", "mismatch") and "ms" not in rows[name], rows[name]
        assert "reference" in rows[name]["status"], rows[name]


def test_the_reference_is_still_the_first_setting_when_it_runs(tmp_path, monkeypatch):
    rows = _rows(_probe(tmp_path, monkeypatch, "c:1,2,2,8,64,1", "shipped=;knob=FAKE_SCALE=0.5;same=FAKE_SCALE=0"), "c")
    assert rows["shipped"]["status"] == "ok" and rows["shipped"]["rel_err"] == 0
    assert rows["knob"]["status"] == "mismatch"
    assert rows["same"]["status"] == "ok"


def test_pp_config_at_a_head_dim_without_one_is_not_timed_as_that_setting(tmp_path, monkeypatch):
    """PP_CONFIG at a head_dim that attention_gluon.PP_CONFIGS has no entry for was dropped silently: the row, named
    for the config, timed the shipped kernel."""
    rows = _rows(_probe(tmp_path, monkeypatch, "d32:1,2,2,8,32,1;d64:1,2,2,8,64,1",
                        "shipped=;pp=PP_CONFIG=64x64x3"), "d32")
    assert rows["shipped"]["status"] == "ok"
    assert rows["pp"]["status"].startswith("skipped") and "ms" not in rows["pp"], rows["pp"]
