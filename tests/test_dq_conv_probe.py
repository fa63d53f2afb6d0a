"""scripts/gpu/dq_conv_probe.py on the CPU (--smoke: TRITON_INTERPRET=1, toy dense and packed forms): one row per
(case, clearing, config), every config's dQ bitwise the shipped one's, and a malformed config refused up front."""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the kernels run interpreted here")


def _main():
    return runpy.run_path(str(ROOT / "scripts" / "gpu" / "dq_conv_probe.py"), run_name="dq_conv_probe")["main"]


def test_smoke_rows_agree_across_configs(tmp_path, monkeypatch):
    monkeypatch.delenv("HEARTH_ATTN_DQ_CONV", raising=False)
    out = tmp_path / "dq.jsonl"
    _main()(["--smoke", "--reps", "1", "--configs", "64,4;128,8;32,2", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * 2 * 3  # two toy cases, with and without clearing, three configs
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {r["config"] for r in rows} == {"64,4", "128,8", "32,2"}
    assert {r["case"] for r in rows} == {"dense toy", "packed toy"}
    assert all(r["us"] > 0 for r in rows)
    assert "HEARTH_ATTN_DQ_CONV" not in os.environ  # the probe leaves the shipped launch behind it


def test_malformed_config_is_refused_before_any_work(tmp_path):
    out = tmp_path / "dq.jsonl"
    with pytest.raises(ValueError, match="HEARTH_ATTN_DQ_CONV"):
        _main()(["--smoke", "--configs", "64,4;96,4", "--out", str(out)])
    assert not out.exists()
