"""scripts/host_overhead.py runs in its CPU mode (interpreter, launches stubbed) and writes its JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_host_overhead_script_cpu_mode(tmp_path):
    out = tmp_path / "host.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "host_overhead.py"), "--device", "cpu", "--ops", "rms_norm,matmul",
         "--reps", "3", "--warmup", "1", "--jsonl", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TOTAL fwd" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["op"], r["direction"]) for r in rows] == [("rms_norm", "fwd"), ("rms_norm", "bwd"), ("matmul", "fwd"), ("matmul", "bwd")]
    for r in rows:
        assert r["us"] > 0 and r["impl"] > 0, r
        for key in ("checks", "dispatch", "config", "device", "alloc", "launch", "other"):
            assert r[key] >= 0, (key, r)
    by = {(r["op"], r["direction"]): r for r in rows}
    # the stub counts the Triton launches: rms_norm's forward kernel, its backward kernel and the dw partials'
    # sum (sum_partials), two GEMMs in matmul's backward
    assert by[("rms_norm", "fwd")]["launches"] == 1 and by[("rms_norm", "bwd")]["launches"] == 2
    assert by[("matmul", "bwd")]["launches"] == 2
    assert by[("rms_norm", "fwd")]["checks"] > 0  # the public function's checks are seen


def test_host_overhead_script_rejects_an_unknown_op():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "host_overhead.py"), "--ops", "nope"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--ops" in proc.stderr


def test_host_overhead_script_lora_rows_and_min_stat(tmp_path):
    """The LoRA nodes have rows too, and --stat min (the least disturbed call: before/after comparisons on a
    busy shared box) is named in the title and recorded in each row."""
    out = tmp_path / "host.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "host_overhead.py"), "--device", "cpu", "--ops", "lora_linear,lora_swiglu_mlp",
         "--reps", "5", "--warmup", "1", "--stat", "min", "--jsonl", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(min)" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["op"], r["direction"]) for r in rows] == [("lora_linear", "fwd"), ("lora_linear", "bwd"),
                                                         ("lora_swiglu_mlp", "fwd"), ("lora_swiglu_mlp", "bwd")]
    for r in rows:
        assert r["stat"] == "min" and r["us"] > 0 and r["impl"] > 0, r
    by = {(r["op"], r["direction"]): r for r in rows}
    assert by[("lora_swiglu_mlp", "fwd")]["launches"] >= 1  # the swiglu kernel per row chunk
    assert by[("lora_linear", "fwd")]["checks"] > 0


def _host_vs_peers(tmp_path, ops: tuple[str, ...], rounds: int):
    """scripts/host_vs_peers.py on `ops` (3 calls a round): its stdout, after checking one row per (op, provider) with
    hearth, Liger and eager PyTorch, each a positive host time a call over every sample."""
    out = tmp_path / "peers.jsonl"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "host_vs_peers.py"), "--ops", ",".join(ops),
         "--reps", "3", "--rounds", str(rounds), "--warmup", "1", "--jsonl", str(out)],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["op"], r["provider"]) for r in rows] == [(op, p) for op in ops for p in ("hearth", "liger", "torch")]
    for r in rows:
        assert 0 < r["min_us"] <= r["median_us"] and r["samples"] == 3 * rounds, r
    return proc.stdout


def test_host_vs_peers_script_times_every_provider(tmp_path):
    """scripts/host_vs_peers.py (CPU, launches stubbed); cross_entropy's target check sees valid targets through the
    stub."""
    assert "hearth / liger" in _host_vs_peers(tmp_path, ("softmax", "cross_entropy", "rope"), rounds=2)


def test_host_vs_peers_script_times_the_mlp_and_linear_cross_entropy(tmp_path):
    """The two ops whose Liger peers are an MLP around liger_swiglu and Liger's fused linear cross-entropy."""
    _host_vs_peers(tmp_path, ("swiglu_mlp", "linear_cross_entropy"), rounds=1)


def test_host_vs_peers_script_rejects_an_unknown_op():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "host_vs_peers.py"), "--ops", "nope"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown op" in proc.stderr


def test_host_trace_probe_rounds_and_profile_helpers(monkeypatch):
    """scripts/gpu/host_trace_probe.py's shared helpers (the GPU probe's A/B modes use them; the sync is stubbed on
    the CPU): one line a round naming every case with host / wall us, and a cProfile text of the function."""
    import runpy

    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    mod = runpy.run_path(str(ROOT / "scripts" / "gpu" / "host_trace_probe.py"), run_name="host_trace_probe")
    calls = []
    lines = mod["_rounds"]((("first", lambda: calls.append(1)), ("second", lambda: calls.append(2))), 4, 2)
    assert len(lines) == 2 and all("first " in line and "second " in line and " / " in line for line in lines)
    assert calls.count(1) == calls.count(2) == 2 * (3 + 4)  # 3 warm-up calls and 4 timed, each round
    text = mod["_cprofile"](lambda: sorted(range(50)), 3, 5)
    assert "function calls" in text and "sorted" in text


def test_host_trace_probe_packed_attention_case_and_kernel_times(monkeypatch):
    """host_trace_probe's attention_varlen case (S causal sequences of L tokens packed): hearth's packed attention
    runs fwd+bwd on the case's leaves (interpreter, CPU), and each sequence's output is the dense causal attention of
    that sequence alone; the flash_attn provider (the bench's binding) stops on the CPU with the bench's reason;
    _kernel_times lists device-only profile entries by device time per call, longest first."""
    import runpy
    import types

    import torch

    mod = runpy.run_path(str(ROOT / "scripts" / "gpu" / "host_trace_probe.py"), run_name="host_trace_probe")
    leaves, step, dy = mod["_case"]("attention_varlen", [2, 16, 2, 1, 16], "hearth", device="cpu")
    q, k, v = leaves
    assert q.shape == (32, 2, 16) and k.shape == v.shape == (32, 1, 16) and dy.shape == q.shape
    out = step()
    out.backward(dy)
    assert all(t.grad is not None and t.grad.shape == t.shape for t in leaves)
    for i in range(2):  # sequence i alone, dense causal attention in fp32 (GQA 2/1: K/V repeated)
        sl = slice(16 * i, 16 * (i + 1))
        qi, ki, vi = (t.detach()[sl].float().transpose(0, 1) for t in (q, k, v))
        ki, vi = ki.repeat_interleave(2, 0), vi.repeat_interleave(2, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True).transpose(0, 1)
        assert (out.detach()[sl].float() - ref).abs().max() < 3e-2
    try:  # the bench's flash_attn binding: CUDA only, said before any import is tried
        mod["_case"]("attention_varlen", [2, 16, 2, 1, 16], "flash_attn", device="cpu")
    except SystemExit as e:
        assert str(e) == "--provider flash_attn: flash-attn needs CUDA"
    else:
        raise AssertionError("no SystemExit for flash_attn on the CPU")
    ev = lambda key, dev_us, cpu_us, count: types.SimpleNamespace(  # noqa: E731
        key=key, self_device_time_total=dev_us, self_cpu_time_total=cpu_us, count=count)
    lines = mod["_kernel_times"]([ev("bwd_kernel", 400.0, 0, 2), ev("cudaLaunchKernel", 0, 90.0, 8),
                                   ev("fwd_kernel", 200.0, 0, 2), ev("aten::empty", 0, 10.0, 4)], 2)
    assert len(lines) == 3 and "bwd_kernel" in lines[0] and "fwd_kernel" in lines[1]
    assert lines[0].split()[0] == "200.0"  # per call: 400 us over 2 calls
    assert lines[2].split()[:3] == ["300.0", "all", "2"] and "2.0 launches a call" in lines[2]  # the device total


def test_host_trace_probe_torch_and_compile_peers_for_mlp_and_lce():
    """--provider torch / compile for swiglu_mlp and linear_cross_entropy: the bench's eager function (compiled for
    compile, not called here: the CPU takes tens of seconds a graph) on the case's own leaves; a peer name the op
    has not got stops with a message naming the provider."""
    import runpy

    import torch
    import torch.nn.functional as F

    mod = runpy.run_path(str(ROOT / "scripts" / "gpu" / "host_trace_probe.py"), run_name="host_trace_probe")
    (x, wg, wu, wd), step, dy = mod["_case"]("swiglu_mlp", [6, 8, 12], "torch", device="cpu")
    out = step()
    ref = F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)
    assert out.shape == dy.shape == (6, 8) and torch.equal(out, ref)
    out.backward(dy)
    assert all(t.grad is not None for t in (x, wg, wu, wd))
    (x, w), step, grad = mod["_case"]("linear_cross_entropy", [6, 8, 20], "torch", device="cpu")
    loss = step()
    assert loss.dim() == 0 and grad is None and torch.isfinite(loss)
    assert callable(mod["_peer_fn"]("swiglu_mlp", "compile")) and mod["_peer_fn"]("swiglu_mlp", "hearth") is None
    with pytest.raises(SystemExit, match="--provider liger"):
        mod["_peer_fn"]("swiglu_mlp", "liger")
    with pytest.raises(SystemExit, match="--provider compile"):
        mod["_case"]("matmul", [4, 4, 4], "compile", device="cpu")


@pytest.mark.parametrize("args", [["--op", "rope", "--mlp-chunk-elems", "5"], ["--mlp-chunk-elems", "0"]])
def test_host_trace_probe_refuses_a_bad_mlp_chunk_override(args):
    """--mlp-chunk-elems (gemm_gap_probe.sh's one-chunk MLP trace) is checked before anything runs: a positive count,
    and only with --op swiglu_mlp (the default op); the error names the argument."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "host_trace_probe.py"), *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "--mlp-chunk-elems" in proc.stderr, proc.stderr
