"""Review 49 of the end-to-end measurement scripts (scripts/gpu/lora_e2e.py, qlora_e2e.py, dist_e2e.py,
e2e_common.py): each test pins one methodology defect that made a row say something it did not measure.
All on the CPU (smoke dims; dist_e2e's children faked where a GPU or two are needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"


def _env(*extra_paths, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), *map(str, extra_paths)]), TRITON_INTERPRET="1", **extra)
    return env


def _script(name, *args, env, timeout=300):
    return subprocess.run([sys.executable, str(GPU / name), "--smoke", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------ a setup that did not patch is not that setup
def test_a_liger_row_whose_liger_patched_nothing_is_not_ok(tmp_path):
    """A liger_kernel that imports but puts none of its kernels in place (another transformers, a renamed class)
    used to give a row `ok`, labelled liger, with HF's own modules timed."""
    fake = tmp_path / "fake"
    (fake / "liger_kernel" / "transformers").mkdir(parents=True)
    (fake / "liger_kernel" / "__init__.py").write_text("")
    (fake / "liger_kernel" / "transformers" / "__init__.py").write_text(
        "def apply_liger_kernel_to_qwen3(**kwargs):\n    return None  # patches nothing\n")
    out = tmp_path / "rows.jsonl"
    proc = _script("lora_e2e.py", "--seqs", "16", "--layers", "1", "--steps", "1", "--setups", "liger", "--out",
                   str(out), env=_env(fake))
    (row,) = _rows(out)
    assert row["setup"] == "liger" and row["status"] != "ok", row
    assert any("rms_norm" in g for g in row["patch_gaps"]) and any("swiglu" in g for g in row["patch_gaps"]), row
    assert proc.returncode != 0  # the run says it did not measure what it was asked to


def _partial_hearth_patch(tmp_path) -> Path:
    """A sitecustomize that makes hearth.patch.apply leave rope on every layer (as a failed rope probe did in
    the 2026-12-01 QLoRA rows), without touching src/."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('R49_NO_ROPE'):\n"
        "    import hearth.patch as _p\n"
        "    _apply = _p.apply\n"
        "    def apply(model, **kw):\n"
        "        kw['rope'] = False\n"
        "        return _apply(model, **kw)\n"
        "    _p.apply = apply\n")
    return site


def test_a_hearth_row_with_fewer_modules_patched_is_not_ok(tmp_path):
    """hearth's report replaced rope in 0 of the layers: the row used to read `ok`, labelled hearth."""
    out = tmp_path / "rows.jsonl"
    _script("lora_e2e.py", "--seqs", "16", "--layers", "1", "--steps", "1", "--setups", "hearth", "--out", str(out),
            env=_env(_partial_hearth_patch(tmp_path), R49_NO_ROPE="1"))
    (row,) = _rows(out)
    assert row["patch"]["replaced"]["rope"] == {}, row["patch"]  # the fake did what it says
    assert row["status"] == "patch_incomplete", row
    assert any(g.startswith("rope: 0 of 1") for g in row["patch_gaps"]), row["patch_gaps"]


def test_a_qlora_script_hearth_row_with_fewer_modules_patched_is_not_ok(tmp_path):
    out = tmp_path / "rows.jsonl"
    _script("qlora_e2e.py", "--seq", "16", "--layers", "1", "--steps", "1", "--setups", "lora_hearth", "--out",
            str(out), env=_env(_partial_hearth_patch(tmp_path), R49_NO_ROPE="1"))
    (row,) = _rows(out)
    assert row["patch"]["replaced"]["rope"] == {}, row["patch"]
    assert row["status"] == "patch_incomplete", row


def test_a_complete_hearth_patch_is_still_ok(tmp_path):
    """The check counts what a Qwen3 model has (4L+1 norms, L rope / MLP, 1 loss, 7L LoRA, L attention if asked)."""
    out = tmp_path / "rows.jsonl"
    proc = _script("lora_e2e.py", "--seqs", "16", "--layers", "2", "--steps", "1", "--setups", "hearth_fast_attn",
                   "--out", str(out), env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = _rows(out)
    assert row["status"] == "ok" and row["patch_gaps"] == [], row


# ------------------------------------------------------------------ every row says what it ran
def test_rows_carry_the_commit_and_the_kernel_switches_they_ran_under(tmp_path):
    """Rows of several commits share lora_e2e.jsonl, and BENCHMARKS tells rows apart by HEARTH_ATTN_GLUON=0 /
    HEARTH_ATTN_FB_DQ_TMA=0: neither the commit nor those variables were in the row."""
    out = tmp_path / "rows.jsonl"
    proc = _script("lora_e2e.py", "--seqs", "16", "--layers", "1", "--steps", "1", "--setups", "hf", "--out",
                   str(out), env=_env(HEARTH_ATTN_GLUON="0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = _rows(out)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head:
        assert row["commit"] == head and isinstance(row["dirty"], bool), row
    assert row["env"]["HEARTH_ATTN_GLUON"] == "0", row.get("env")
    assert row["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # what the child got


# ------------------------------------------------------------------ dist_e2e
def test_dist_e2e_writes_the_corpus_for_its_own_seq_when_work_is_reused(tmp_path):
    """The corpus in --work was kept when it existed: a second invocation at another --seq trained the first's
    rows while its row said the new seq."""
    work, out = tmp_path / "work", tmp_path / "rows.jsonl"
    env = _env()
    for seq in (64, 96):
        proc = subprocess.run([sys.executable, str(GPU / "dist_e2e.py"), "--smoke", "--out", str(out), "--work",
                               str(work), "--cases", "14b-single", "--steps", "2", "--seq", str(seq)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    steps = _rows(work / "14b-single" / "metrics.jsonl")
    assert [s["tokens"] for s in steps] == [96 * 2, 96 * 2], steps  # 2 micro-batches of 96 tokens, not of 64
    assert _rows(out)[-1]["seq"] == 96 and _rows(out)[-1]["status"] == "ok"


def _dist_module():
    spec = importlib.util.spec_from_file_location("dist_e2e_r49", GPU / "dist_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(GPU))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(GPU))
    return mod


PATCH = {"replaced": {"norm": {"Qwen3RMSNorm": 161}, "rope": {"Qwen3Attention": 40}, "mlp": {"Qwen3MLP": 40},
                      "loss": {"Qwen3ForCausalLM": 1}, "lora": {"Linear": 280}, "attention": {}}, "left": []}


def _fake_launches(monkeypatch, mod, work: Path, *, seq: int, micro: int, steps: int, smi: str):
    """subprocess.run in dist_e2e faked: `hearth train` writes its metrics as a 2-GPU run would; nvidia-smi prints
    `smi`. Returns the env each case was launched with."""
    launched, real = {}, subprocess.run

    def run(cmd, env=None, **kw):
        if cmd[0] == "git":  # the row's commit (subprocess is one module: e2e_common's calls come here too)
            return real(cmd, env=env, **kw)
        if cmd[0] == "nvidia-smi":
            return subprocess.CompletedProcess(cmd, 0, smi, "")
        toml = Path(next(c for c in cmd if c.endswith(".toml")))
        case = toml.stem
        launched[case] = dict(env)
        out = work / case
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "tokens": seq * micro}) + "\n"
                                                   for i in range(steps)))
        (out / "metrics.json").write_text(json.dumps({
            "tokens_per_s": 8000.0, "peak_gib": 70.0, "peak_rss_gib": None, "median_step_s": 1.0, "loss": [1.0],
            "checkpointing": {"mode": "none", "checkpointed_layers": 0}, "device": "NVIDIA H200",
            "versions": {"torch": "x"}, "patch": PATCH}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(mod.subprocess, "run", run)
    return launched


def test_dist_e2e_launches_every_case_with_the_same_threads_and_multicast_off(tmp_path, monkeypatch):
    """torchrun gives its workers OMP_NUM_THREADS=1 when it starts more than one; the single-GPU case ran at
    all cores. On the CPU smoke that alone made DDP's 'scaling' 1161%."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # a caller's setting does not turn multicast on
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    mod = _dist_module()  # forces both off in this process's environment at import
    work = tmp_path / "work"
    launched = _fake_launches(monkeypatch, mod, work, seq=4096, micro=2, steps=6, smi="")
    rc = mod.main(["--out", str(tmp_path / "rows.jsonl"), "--work", str(work), "--cases", "14b-single,14b-ddp,14b-fsdp"])
    assert rc == 0
    threads = {case: env.get("OMP_NUM_THREADS") for case, env in launched.items()}
    assert len(set(threads.values())) == 1 and None not in threads.values(), threads
    assert all(env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
               for env in launched.values())


def test_dist_e2e_rows_count_patched_modules_not_classes(tmp_path, monkeypatch):
    """`patched` was len() of kind -> {class: modules}: 1 for 161 norms, so a patch that replaced 1 of 40 layers
    read the same as a whole one."""
    mod = _dist_module()
    work = tmp_path / "work"
    _fake_launches(monkeypatch, mod, work, seq=4096, micro=2, steps=6, smi="")
    mod.main(["--out", str(tmp_path / "rows.jsonl"), "--work", str(work), "--cases", "14b-ddp"])
    (row,) = _rows(tmp_path / "rows.jsonl")
    assert row["patched"] == {"norm": 161, "rope": 40, "mlp": 40, "loss": 1, "lora": 280, "attention": 0}, row


def test_dist_e2e_judges_fits_80gib_on_the_device_not_the_allocated_peak(tmp_path, monkeypatch):
    """peak_gib_per_gpu is max_memory_allocated: 70 GiB allocated can need more than 80 on the card (allocator
    reserve, context, NCCL buffers, the whole-model build). The row now carries what nvidia-smi saw in use and
    judges fits_80gib on that."""
    mod = _dist_module()
    work = tmp_path / "work"
    _fake_launches(monkeypatch, mod, work, seq=4096, micro=2, steps=6, smi="0, 83968\n1, 80000\n")
    mod.main(["--out", str(tmp_path / "rows.jsonl"), "--work", str(work), "--cases", "32b-fsdp"])
    (row,) = _rows(tmp_path / "rows.jsonl")
    assert row["peak_gib_per_gpu"] == 70.0 and row["peak_api"] == "torch.cuda.max_memory_allocated"
    assert row["device_used_gib_max"] == 82.0 and row["fits_80gib"] is False, row


def test_dist_e2e_fits_80gib_is_what_an_80gb_card_holds_not_80_gib(tmp_path, monkeypatch):
    """An H100 80GB reports 81559 MiB in all (79.6 GiB): 81800 MiB in use (79.9 GiB) was judged to fit against 80.0
    GiB, on a card that cannot hold it; 81000 MiB does fit."""
    mod = _dist_module()
    for used_mib, fits in ((81800, False), (81000, True)):
        work, rows = tmp_path / f"work{used_mib}", tmp_path / f"rows{used_mib}.jsonl"
        _fake_launches(monkeypatch, mod, work, seq=4096, micro=2, steps=6, smi=f"0, {used_mib}\n1, 1000\n")
        mod.main(["--out", str(rows), "--work", str(work), "--cases", "32b-fsdp"])
        (row,) = _rows(rows)
        assert row["fits_80gib"] is fits, (used_mib, row)


def test_dist_e2e_refuses_a_row_whose_steps_trained_other_token_counts(tmp_path, monkeypatch):
    """A step that trained fewer tokens than --micro x --seq (a short corpus, a stale one) is an error row."""
    mod = _dist_module()
    work = tmp_path / "work"
    _fake_launches(monkeypatch, mod, work, seq=2048, micro=2, steps=6, smi="")  # the child trained seq 2048
    mod.main(["--out", str(tmp_path / "rows.jsonl"), "--work", str(work), "--cases", "14b-single"])  # row: 4096
    (row,) = _rows(tmp_path / "rows.jsonl")
    assert row["status"] == "error" and "4096" in row["error"], row
