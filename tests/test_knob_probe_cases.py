"""scripts/gpu/attention_knob_probe.py's --cases parser: uniform and ragged packings, and a clear error otherwise."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _parse_cases(text: str) -> list:
    return runpy.run_path(str(ROOT / "scripts" / "gpu" / "attention_knob_probe.py"), run_name="knob_probe")["_parse_cases"](text)


def test_cases_parse_uniform_and_ragged():
    """Six fields: a uniform case (ragged False); a seventh, 1, packs the suite's 1:3 lengths; a label may hold ':'."""
    cases = _parse_cases("Qwen3-14B 1:3:8,40,8,2048,128,1,1; dense:2,40,8,4096,128,0")
    assert cases == [("Qwen3-14B 1:3", 8, 40, 8, 2048, 128, True, True), ("dense", 2, 40, 8, 4096, 128, False, False)]


def test_cases_with_a_wrong_field_count_name_the_format():
    with pytest.raises(SystemExit, match="B,Hq,Hk,T,D,causal"):
        _parse_cases("x:8,40,8,2048")


def test_cases_with_bad_numbers_are_named():
    """The shared parser's checks (hearth.bench.cases.parse_attention_case): numbers, sizes, the 0 / 1 flags."""
    for bad, word in [("x:8,40,8,2048,128,one", "whole numbers"), ("x:8,40,6,2048,128,1", "multiple of Hk"),
                      ("x:8,40,8,2048,128,1,2", "ragged 0 or 1"), ("8,40,8,2048,128,1", "LABEL")]:
        with pytest.raises(SystemExit, match=word):
            _parse_cases(bad)


def test_settings_keep_commas_inside_a_value():
    """--settings: a comma starts the next VAR=VALUE only before a variable's name, so a value that holds a comma
    (HEARTH_ATTN_FB_CONFIG=64,3, "BLOCK_M,NUM_STAGES") reaches the kernel whole; it was cut at the comma, and the
    probe stopped on the stray "3" before timing anything."""
    parse = runpy.run_path(str(ROOT / "scripts" / "gpu" / "attention_knob_probe.py"), run_name="knob_probe")["_parse_settings"]
    assert parse("s=;c3=HEARTH_ATTN_FB_CONFIG=64,3;two=A=1,B_2=x,y") == [
        ("s", {}), ("c3", {"HEARTH_ATTN_FB_CONFIG": "64,3"}), ("two", {"A": "1", "B_2": "x,y"})]
