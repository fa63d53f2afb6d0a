"""scripts/gpu/lora_e2e.py (run on an H200 by scripts/gpu/lora_matrix.sh) keeps working: its CPU smoke modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "lora_e2e.py"), "--smoke", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_INTERPRET": "1"})


def test_best_mode_records_the_planner_estimate_and_skips_past_the_time_budget(tmp_path):
    out = tmp_path / "rows.jsonl"
    proc = _run("--seqs", "32,48", "--setups", "hf", "--steps", "1", "--budget-gib", "1", "--out", str(out),
                "--time-budget-s", "1000", "--min-child-s", "999")  # a child takes > 1 s
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "skipped"], rows  # the second child had no time left
    ck = rows[0]["checkpointing"]
    assert ck["mode"] == "none" and ck["estimate_gib"] > 0 and ck["knobs"]["patched"] is False
    assert rows[0]["budget_gib"] == 1.0 and rows[0]["tok_per_s"] > 0


def test_selective_needs_a_layer_count():
    proc = _run("--checkpointing", "selective", "--out", "unused.jsonl")
    assert proc.returncode == 2 and "--checkpointed" in proc.stderr


def test_match_steps_compares_hearth_with_hf_against_the_fp32_reference(tmp_path):
    out = tmp_path / "match.jsonl"
    proc = _run("--match-steps", "2", "--seqs", "16", "--layers", "1", "--setups", "hf,hearth", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["status"] == "ok", row
    assert {f.name for f in tmp_path.glob("match-*.pt")} == {"match-reference.pt", "match-hf.pt", "match-hearth.pt"}
    assert all(len(v) == 2 for v in row["losses"].values())
    assert row["err_vs_reference"]["hf"]["loss"] > 0  # a bf16 base is not the fp32 reference
    c = row["compared"]["hearth"]
    assert c["losses_within_rule"] and c["lora_within_rule"], c
    assert row["runs"]["hearth"]["patch"]["replaced"]["loss"] == {"Qwen3ForCausalLM": 1}
    digests = {name: run["lora_sha256"] for name, run in row["runs"].items()}
    assert all(len(d) == 64 for d in digests.values())
    assert digests["reference"] != digests["hf"]  # bf16 and fp32 training end in different weights


def test_profile_lora_step_smoke_writes_a_row_per_setup_with_categories(tmp_path):
    """scripts/gpu/profile_lora_step.py (the step profile behind BENCHMARKS.md) on the CPU: the child builds
    lora_e2e's model with hearth patched in, profiles one step, writes its kernel table and appends its row."""
    out = tmp_path / "prof"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "profile_lora_step.py"), "--smoke",
                           "--out", str(out), "--setups", "hearth", "--layers", "1", "--seq", "16"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "profile.jsonl").read_text().splitlines()]
    assert [r["setup"] for r in rows] == ["hearth"] and rows[0]["layers"] == 1 and rows[0]["seq"] == 16
    assert rows[0]["gpu_ms_total"] > 0 and rows[0]["host_step_s"] > 0 and rows[0]["versions"]["torch"]
    table = (out / "hearth.txt").read_text().splitlines()
    assert table[0].split() == ["us", "total", "calls", "kernel"] and len(table) > 5


def _rows(tmp_path_factory, setups: str, *args) -> list[dict]:
    out = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    proc = _run("--seqs", "24", "--layers", "1", "--steps", "1", "--setups", setups, *args, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def unpacked_rows(tmp_path_factory):
    """hearth_fast on one 24-token row (each setup is a child that pays the imports and the interpreter's step, so
    the two tests below share the runs; an unpacked hearth_fast_attn row is tests/train/test_e2e_review49_scripts.py's
    test_a_complete_hearth_patch_is_still_ok)."""
    return _rows(tmp_path_factory, "hearth_fast")


@pytest.fixture(scope="module")
def packed_rows(tmp_path_factory):
    """hearth_fast and hearth_fast_attn, the same 24 tokens packed as 3 sequences (--pack 3)."""
    return _rows(tmp_path_factory, "hearth_fast,hearth_fast_attn", "--pack", "3")


def test_hearth_fast_attn_setup_patches_attention_and_the_base_lora_path(packed_rows, unpacked_rows):
    """The hearth_fast_attn setup is hearth_fast (LoRA products on the base path) with hearth's attention
    in place of SDPA: the row's patch report says attention was replaced, hearth_fast's says it was not (packed or
    not: the patch does not depend on the batch)."""
    rows = {r["setup"]: r for r in packed_rows}
    assert rows["hearth_fast_attn"]["status"] == rows["hearth_fast"]["status"] == "ok", rows
    assert unpacked_rows[0]["setup"] == "hearth_fast" and unpacked_rows[0]["patch"]["replaced"]["attention"] == {}
    assert rows["hearth_fast_attn"]["patch"]["replaced"]["attention"] == {"Qwen3Attention": 1}
    assert rows["hearth_fast"]["patch"]["replaced"]["attention"] == {}
    assert rows["hearth_fast_attn"]["lora_compute"] == rows["hearth_fast"]["lora_compute"] == "base"


def test_pack_trains_one_packed_row_and_hearths_varlen_matches_sdpas_mask(packed_rows, unpacked_rows):
    """--pack N: the row is N packed sequences. SDPA (hearth_fast: transformers' block-diagonal mask from the
    position ids) and hearth's attention (hearth_fast_attn: the varlen kernel on the offsets) give the same first
    loss on the same weights and batch, and it differs from the unpacked row's (attention across the sequences)."""
    rows = packed_rows + unpacked_rows[:1]
    assert [(r["setup"], r.get("pack"), r["status"]) for r in rows] == [
        ("hearth_fast", 3, "ok"), ("hearth_fast_attn", 3, "ok"), ("hearth_fast", None, "ok")], rows
    sdpa, varlen, unpacked = (r["loss"][0] for r in rows)
    assert abs(sdpa - varlen) <= 1e-4 * abs(sdpa), (sdpa, varlen)
    assert abs(sdpa - unpacked) > 1e-3 * abs(sdpa), (sdpa, unpacked)
    assert rows[1]["patch"]["replaced"]["attention"] == {"Qwen3Attention": 1}


def test_pack_is_refused_with_match_steps():
    proc = _run("--pack", "2", "--match-steps", "2", "--out", "unused.jsonl")
    assert proc.returncode == 2 and "--pack" in proc.stderr
