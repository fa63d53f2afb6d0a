"""scripts/gpu/attention_ncu.py: the case parser names bad input, the table reads ncu's raw CSV (header, units row,
one row per kernel; lines before the header skipped) and ranks the stall reasons, and the run path works at a tiny
shape on the CPU (TRITON_INTERPRET=1)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.commands import fake_command, path_with

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "attention_ncu.py"
spec = importlib.util.spec_from_file_location("attention_ncu", SCRIPT)
ncu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu)

RAW = '''==PROF== Connected to process 123
hearth smoke: one profiled fwd+bwd
"ID","Process ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed",\
"launch__registers_per_thread","launch__shared_mem_per_block",\
"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","ns","%","register/thread","byte/block","ratio","ratio","ratio"
"0","123","_attn_bwd_fused","1,234,567","71.5","168","197632","0.25","1.50","0.75"
"1","123","_dq_from_acc","20,000","40","32","0","n/a","0.1","0.2"
'''


def test_case_parser_reads_and_names_bad_input():
    """The script's --case parser (hearth.bench.cases.parse_attention_case, shared with the knob probe's --cases)."""
    parse = ncu.parse_attention_case
    assert parse("Qwen3-32B T8192:1,64,8,8192,128,1") == ("Qwen3-32B T8192", (1, 64, 8, 8192, 128, True))
    for bad, word in [("1,2,3", "LABEL"), ("x:1,2,3", "6 numbers"), ("x:1,a,8,8,8,1", "whole numbers"),
                      ("x:1,6,4,8,8,1", "multiple of Hk"), ("x:1,8,8,8,8,2", "causal 0 or 1"),
                      ("x:1,8,8,8,8,1,1", "6 numbers")]:
        with pytest.raises(ValueError, match=word):
            parse(bad)


def test_table_reads_raw_csv_and_ranks_stalls(tmp_path, capsys):
    rows = ncu.read_raw(RAW)
    assert [r["Kernel Name"] for r in rows] == ["_attn_bwd_fused", "_dq_from_acc"]  # units row dropped
    s = ncu.summarize(rows[0])
    assert s["dur_us"] == pytest.approx(1234.567) and s["regs"] == 168 and s["smem_kib"] == pytest.approx(193.0)
    assert list(s["stalls"]) == ["long_scoreboard", "wait", "barrier"]
    assert s["tensor_pct"] is None  # a metric the dump lacks reads as missing, not zero
    assert ncu.summarize(rows[1])["stalls"] == {"wait": 0.2, "long_scoreboard": 0.1}  # "n/a" left out
    path = tmp_path / "raw.csv"
    path.write_text(RAW)
    ncu.table([str(path)], as_json=False)
    out = capsys.readouterr().out
    assert "2 kernel(s)" in out and "1234.6 us" in out and "long_scoreboard 1.50, wait 0.75, barrier 0.25" in out
    assert ncu.read_raw("==PROF== no kernels were profiled\n") == []
    # ncu's scaled units (without --print-units base) are read from the units row
    scaled = RAW.replace('"ns"', '"msecond"').replace('"byte/block"', '"Kbyte"')
    s = ncu.summarize(ncu.read_raw(scaled)[0])
    assert s["dur_us"] == pytest.approx(1234567e3) and s["smem_kib"] == pytest.approx(197632 * 1000 / 1024)
    with pytest.raises(ValueError, match="furlong"):
        ncu.summarize(ncu.read_raw(RAW.replace('"ns"', '"furlong"'))[0])


def test_run_smoke_on_cpu():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(SCRIPT.parents[2] / "src"))
    res = subprocess.run([sys.executable, str(SCRIPT), "run", "--smoke"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "hearth smoke: one profiled fwd+bwd" in res.stdout
    res = subprocess.run([sys.executable, str(SCRIPT), "run", "--provider", "x", "--smoke"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "--provider must be hearth or fa4" in res.stderr


def test_fa4_provider_calls_flash_attn_cute_in_its_layout(monkeypatch):
    """The fa4 provider is flash_attn.cute's flash_attn_func (no older FlashAttention stands in) through the bench's
    [B, H, T, D] wrapper: q / k / v reach it as [B, T, H, D] views and its (out, lse) comes back as out [B, H, T, D]."""
    import types

    import torch

    seen = []

    def fake(q, k, v, causal):
        seen.append((tuple(q.shape), tuple(k.shape), causal))
        return q * 2, None

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = fake
    pkg = types.ModuleType("flash_attn")
    pkg.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    q, kv = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    out = ncu._fa4()(q, kv, kv, causal=True)
    assert seen == [((1, 8, 4, 16), (1, 8, 2, 16), True)] and torch.equal(out, q * 2)


def test_shell_script_with_every_run_left_out_exits_zero(tmp_path):
    """attention_ncu.sh where every provider / case is left out (here: past BUDGET_S=0) writes a table file that says
    so and exits 0: an empty run is not a failure (it used to end on `[ no files ] && ...`, status 1). Run from a copy
    of the scripts in a scratch tree, with a stand-in `ncu` on PATH, so no carried wheels are installed."""
    import shutil

    tree = tmp_path / "repo"
    (tree / "scripts" / "gpu").mkdir(parents=True)
    for name in ("attention_ncu.sh", "attention_ncu.py", "carried_env.sh"):
        shutil.copy(SCRIPT.parent / name, tree / "scripts" / "gpu" / name)
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "ncu", "#!/bin/sh\necho fake ncu\n")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PROVIDERS="hearth", BUDGET_S="0", HEARTH_SITE=str(tmp_path / "site"),
               PATH=path_with(bin_dir))
    done = subprocess.run(["bash", str(tree / "scripts" / "gpu" / "attention_ncu.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "left out (past BUDGET_S=0 s)" in done.stdout
    assert "no ncu runs" in (out / "ncu-table.txt").read_text()


def test_shell_script_creates_a_missing_out_folder(tmp_path):
    """OUT=$OUT/a (a folder under the one that comes back, as the staged 0021 row's commands had it) did not exist,
    and the script wrote into it without creating it: every ncu run refused its log file and the table step raised
    FileNotFoundError (2026-12-07). It now creates OUT first, as scripts/gpu/test.sh does."""
    import shutil

    tree = tmp_path / "repo"
    (tree / "scripts" / "gpu").mkdir(parents=True)
    for name in ("attention_ncu.sh", "attention_ncu.py", "carried_env.sh"):
        shutil.copy(SCRIPT.parent / name, tree / "scripts" / "gpu" / name)
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "ncu", "#!/bin/sh\necho fake ncu\n")
    out = tmp_path / "out" / "a"
    env = dict(os.environ, OUT=str(out), PROVIDERS="hearth", BUDGET_S="0", HEARTH_SITE=str(tmp_path / "site"),
               PATH=path_with(bin_dir))
    done = subprocess.run(["bash", str(tree / "scripts" / "gpu" / "attention_ncu.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "fake ncu" in (out / "ncu-metrics.txt").read_text()
    assert "no ncu runs" in (out / "ncu-table.txt").read_text()


SOURCE = '''==PROF== Connected to process 7
"Kernel Name","_attn_bwd_fused_gluon_kernel",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_barrier",\
"stall_long_sb","stall_barrier (Not Issued)"
"0x10","HGMMA.64x64x16.F32.BF16 R152, gdesc[UR36].tnspA.tnspB, R152, gsb0","5","4","0","0","0"
"0x20","WARPGROUP.DEPBAR.LE gsb0, 0x0","40","40","40","0","40"
"0x30","SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0+URZ+0x30550], R13","1","1","0","1","0"
"0x40","@!P0  BRA 0x90","30","30","0","30","0"
"0x50","BAR.SYNC.DEFER_BLOCKING 0x1","2","2","2","0","2"
"0x60","NOP","100","100","100","0","100"
"0x70","USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x78","0","0","0","0","0"
"0x80","FFMA R13, R152, UR60, -R16","7","3","0","0","0"
"0x90","SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0+URZ+0x30550], R13","0","0","0","0","0"
'''


def test_source_sorts_stall_samples_by_kind(tmp_path, capsys):
    """`source` reads ncu's --page source SASS dump and puts each instruction's samples under what the warp waited at:
    the idle warps' NOP before the setmaxnreg retry (not a stall of working warps, though the raw page's barrier figure
    counts it), a wgmma wait, an mbarrier wait (the try-wait, and a branch into its retry loop, named by the barrier's
    address), the instruction just after a named barrier, the rest."""
    name, rows = ncu.read_source(SOURCE)
    assert name == "_attn_bwd_fused_gluon_kernel" and [r["Address"] for r in rows][:2] == ["0x10", "0x20"]
    s = ncu.source_summary(rows)
    assert s["total"] == 185
    kinds = {k: v["samples"] for k, v in s["kinds"].items()}
    assert kinds == {"idle warps (setmaxnreg retry loop)": 100, "wgmma wait (WARPGROUP.DEPBAR)": 40,
                     "mbarrier wait [R0+URZ+0x30550]": 31, "other": 7, "wgmma issue (HGMMA)": 5,
                     "named barrier (BAR.SYNC, or just after one)": 2}
    assert s["kinds"]["idle warps (setmaxnreg retry loop)"]["reasons"] == {"barrier": 100}  # "Not Issued" left out
    path = tmp_path / "src.csv"
    path.write_text(SOURCE)
    ncu.main(["source", str(path), "--top", "2"])
    out = capsys.readouterr().out
    assert "9 SASS instructions, 185 stall samples" in out
    assert "barrier samples 142, of them at idle warps 100 (70%)" in out
    assert out.rstrip().splitlines()[-2:][0].split()[:2] == ["100", "0x60"]
    assert ncu.read_source("==PROF== nothing\n") == ("?", [])
    # one dump, several kernels (no --kernel-name filter): each its own table
    two = SOURCE + SOURCE.split("\n", 1)[1].replace("_attn_bwd_fused_gluon_kernel", "flash_bwd_sm90")
    assert [(n, len(r)) for n, r in ncu.read_sources(two)] == [("_attn_bwd_fused_gluon_kernel", 9), ("flash_bwd_sm90", 9)]
    path.write_text(two)
    ncu.main(["source", str(path)])
    out = capsys.readouterr().out
    assert out.count("9 SASS instructions") == 2 and "flash_bwd_sm90" in out


def test_shell_script_source_mode_tabulates_the_per_instruction_pages(tmp_path):
    """SOURCE=1: per provider and case a second ncu run with --page source, its dump compressed beside the raw one
    and tabulated by kind of instruction in ncu-source-table.txt. A stand-in `ncu` on PATH writes a raw page or a
    source page (SOURCE above) to its --log-file, as the real one would; the run itself is never started."""
    import shutil

    tree = tmp_path / "repo"
    (tree / "scripts" / "gpu").mkdir(parents=True)
    for name in ("attention_ncu.sh", "attention_ncu.py", "carried_env.sh"):
        shutil.copy(SCRIPT.parent / name, tree / "scripts" / "gpu" / name)
    (tree / "src").symlink_to(SCRIPT.parents[2] / "src")  # the script puts the tree's src on PYTHONPATH
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "raw.csv").write_text(RAW)
    (pages / "src.csv").write_text(SOURCE)
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "ncu", f"""#!/bin/sh
log=""; page=raw
while [ $# -gt 0 ]; do
  case "$1" in --log-file) log="$2"; shift ;; --page) page="$2"; shift ;; esac
  shift
done
[ -n "$log" ] || {{ echo fake ncu; exit 0; }}
if [ "$page" = source ]; then cp {pages / "src.csv"} "$log"; else cp {pages / "raw.csv"} "$log"; fi
""")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PROVIDERS="hearth", SOURCE="1", CASES="one:1,4,2,128,64,1",
               HEARTH_SITE=str(tmp_path / "site"), PATH=path_with(bin_dir))
    done = subprocess.run(["bash", str(tree / "scripts" / "gpu" / "attention_ncu.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert (out / "ncu-hearth-1.csv").is_file() and (out / "ncu-src-hearth-1.csv.xz").is_file()
    table = (out / "ncu-source-table.txt").read_text()
    assert "_attn_bwd_fused_gluon_kernel, 9 SASS instructions, 185 stall samples" in table
    assert "idle warps (setmaxnreg retry loop)" in table
