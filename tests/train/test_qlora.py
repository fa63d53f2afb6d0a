"""QLoRA: bitsandbytes' NF4 base runs on the CPU in the pinned version, so the 4-bit path is trained here
for real (tiny random Qwen3, plain transformers); the GPU test (skipped without CUDA) checks the memory
saving and hearth's kernels on a 4-bit base."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import finetune
from tests.train.tiny import save_tiny_model, tiny_config, tiny_tokenizer, write_corpus

bnb = pytest.importorskip("bitsandbytes")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer(tmp_path_factory.mktemp("tok"))), local_files_only=True)
    corpus = write_corpus(tmp_path_factory.mktemp("c") / "train.jsonl", tok, [0])  # one example: a repeated batch
    return corpus, save_tiny_model(tmp_path_factory.mktemp("m"), len(tok)), len(tok)


def test_qlora_trains_a_4bit_base_from_a_local_folder(tmp_path, setup):
    corpus, base, _ = setup
    cfg = finetune.FinetuneConfig(corpus=corpus, model=base, out=tmp_path / "q", max_steps=4, lr=2e-2, rank=4, alpha=8,
                                  seq_len=512, patch=False, qlora=True)
    model, metrics = finetune.train_model(cfg)
    losses = metrics["loss"]
    assert losses[-1] < losses[0] and all(b <= a + 1e-6 for a, b in zip(losses, losses[1:])), losses
    inner = model.get_base_model().model.layers[0]
    assert isinstance(inner.mlp.down_proj.base_layer, bnb.nn.Linear4bit)
    assert inner.mlp.down_proj.base_layer.weight.quant_type == "nf4"
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    plain = finetune.FinetuneConfig(corpus=corpus, model=base, out=tmp_path / "p", max_steps=1, rank=4, alpha=8,
                                    seq_len=512, patch=False)
    _, full = finetune.train_model(plain)
    assert metrics["weights_gib"] < full["weights_gib"]  # the decoder's Linears in 4 bits
    assert metrics["versions"]["bitsandbytes"] == bnb.__version__
    assert (tmp_path / "q" / "adapter_model.safetensors").is_file()
    # the QLoRA adapter is a plain peft adapter: it merges into the 16-bit base
    result = CliRunner().invoke(app, ["export", "--adapter", str(tmp_path / "q"), "--model", str(base),
                                      "--out", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.output


def test_qlora_random_init_from_a_config_json(tmp_path, setup):
    corpus, _, vocab = setup
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(tiny_config(vocab)))
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(config), "--random-init",
                                      "--qlora", "--no-patch", "--out", str(tmp_path / "o"), "--max-steps", "2",
                                      "--seq-len", "512", "--rank", "2"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["config"]["qlora"] is True and len(metrics["loss"]) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_qlora_on_the_gpu_with_hearth_kernels(tmp_path, setup):  # pragma: no cover - GPU only
    corpus, base, _ = setup
    out = {}
    for name, q in (("bf16", False), ("nf4", True)):
        cfg = finetune.FinetuneConfig(corpus=corpus, model=base, out=tmp_path / name, max_steps=3, lr=2e-2, rank=4,
                                      alpha=8, seq_len=512, qlora=q)
        _, out[name] = finetune.train_model(cfg)
    assert out["nf4"]["loss"][-1] < out["nf4"]["loss"][0]
    assert out["nf4"]["weights_gib"] < out["bf16"]["weights_gib"]
    assert out["nf4"]["patch"]["replaced"]["loss"] == {"Qwen3ForCausalLM": 1}
    # the probes build their inputs in the compute dtype on a 4-bit base: rope and the MLP are patched too
    assert out["nf4"]["patch"]["replaced"]["mlp"] and out["nf4"]["patch"]["replaced"]["rope"]


@pytest.fixture(scope="module")
def gpu_script_rows(tmp_path_factory):
    """scripts/gpu/qlora_e2e.py's CPU smoke mode, run once for both tests below: one parent process, one child per
    setup (qlora_hf, then qlora_hearth), each child's row appended to the same JSONL; {setup: row}."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path_factory.mktemp("qlora_e2e") / "rows.jsonl"
    proc = subprocess.run([sys.executable, str(root / "scripts" / "gpu" / "qlora_e2e.py"), "--smoke", "--setups",
                           "qlora_hf,qlora_hearth", "--seq", "16", "--steps", "1", "--out", str(out)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["setup"] for r in rows] == ["qlora_hf", "qlora_hearth"], rows
    return {r["setup"]: r for r in rows}


def test_the_gpu_script_runs_its_smoke_mode(gpu_script_rows):
    """scripts/gpu/qlora_e2e.py (run by hand on an H200) keeps working: its CPU smoke mode, the plain-HF setup."""
    row = gpu_script_rows["qlora_hf"]
    assert row["status"] == "ok", row
    assert row["tok_per_s"] > 0 and row["versions"]["bitsandbytes"] == bnb.__version__


def test_the_gpu_script_patches_after_peft_so_the_4bit_projections_take_the_lora_nodes(gpu_script_rows):
    """qlora_e2e.py's qlora_hearth setup patches as `hearth train --qlora` does, after peft: every 4-bit LoRA
    projection is taken by hearth's LoRA-aware nodes (it patched before peft, where the "lora" kind finds no LoRA
    layer and the planner was told fused_lora=False)."""
    row = gpu_script_rows["qlora_hearth"]
    assert row["status"] == "ok", row
    assert row["patch"]["replaced"]["lora"] == {"Linear4bit [4-bit base]": 14}, row["patch"]
    assert row["patch"]["replaced"]["mlp"] == {"Qwen3MLP [4-bit base, LoRA node]": 2}, row["patch"]
    assert row["patch"]["left"] == [], row["patch"]


def test_patch_probes_a_4bit_base_in_its_compute_dtype():
    """bitsandbytes keeps 4-bit weights packed in uint8: the MLP and rope probes must build their inputs in the
    compute dtype and judge against the dequantised weights in fp32 (they used the uint8 weight's dtype, and the
    MLP probe crashed inside the original's SiLU), and a 4-bit model is patched and still trains."""
    from transformers import Qwen3Config

    from hearth import patch
    from hearth.train import qlora
    from tests.train.tiny import tiny_config

    model = qlora.prepare(qlora.random_4bit(Qwen3Config(**tiny_config(300)), dtype=torch.bfloat16, device="cpu"))
    report = patch.apply(model)
    assert report.count("mlp") == 2 and report.count("rope") == 2 and report.count("norm") == 9, str(report)
    assert not report.left, str(report)
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


def test_a_probe_whose_original_cannot_run_leaves_the_module_with_the_reason():
    from hearth import patch

    class BrokenMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = (torch.nn.Linear(8, 12), torch.nn.Linear(8, 12),
                                                            torch.nn.Linear(12, 8))
            self.act_fn = torch.nn.SiLU()

        def forward(self, x):
            raise RuntimeError("this original cannot run")

    holder = torch.nn.Module()
    holder.mlp = BrokenMLP()
    report = patch.apply(holder)
    assert report.count("mlp") == 0
    assert any(k == "mlp" and "original raised RuntimeError" in r for (k, _, r) in report.left), str(report)
