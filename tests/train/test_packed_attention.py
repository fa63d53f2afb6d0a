"""`hearth train --pack --attention`: packing and hearth's attention (forced on) together. Each packed micro-batch
reaches hearth.kernels.attention_varlen with the collator's offsets (counted), and the step's loss and LoRA
gradient norm equal plain transformers' (SDPA with the block-diagonal mask). Tiny random Qwen3, fp32, CPU under
TRITON_INTERPRET=1, short examples (the interpreter is slow)."""

from __future__ import annotations

import importlib
import json

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import finetune
from tests.train.tiny import save_tiny_model, tiny_tokenizer, write_corpus

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
LENGTHS = (21, 34, 27, 30)  # four short examples: packed rows of two at batch_tokens=64 (one step: the first)


@pytest.fixture(scope="module")
def short_corpus(tmp_path_factory):
    """Four examples cut to LENGTHS: the start of each system prompt, then the last tokens of its trained reply."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer(tmp_path_factory.mktemp("tok"))), local_files_only=True)
    full = write_corpus(tmp_path_factory.mktemp("full") / "train.jsonl", tok, range(4))
    rows = []
    for n, line in zip(LENGTHS, full.read_text().splitlines()):
        row = json.loads(line)
        ids, labels = row["input_ids"], row["labels"]
        rows.append(json.dumps({"id": row["id"], "input_ids": ids[:n - 10] + ids[-10:],
                                "labels": [-100] * (n - 10) + labels[-10:]}))
    path = tmp_path_factory.mktemp("short") / "train.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path, save_tiny_model(tmp_path_factory.mktemp("model"), len(tok))


def test_pack_with_attention_runs_the_varlen_kernel_and_trains_as_sdpa(tmp_path, short_corpus, monkeypatch):
    corpus, model = short_corpus
    module = importlib.import_module("hearth.kernels.attention_varlen")
    kernel, calls = module.attention_varlen, []
    monkeypatch.setattr(module, "attention_varlen",
                        lambda q, k, v, cu_q, *a, **kw: calls.append(cu_q.tolist()) or kernel(q, k, v, cu_q, *a, **kw))
    # plain transformers first (the patched run below swaps Qwen3's rope for hearth's, process-wide)
    _, plain = finetune.train_model(finetune.FinetuneConfig(
        corpus=corpus, model=model, out=tmp_path / "plain", max_steps=1, seq_len=40, batch_tokens=64, pack=True,
        shuffle=False, rank=4, alpha=8, lr=1e-2, patch=False))
    common = ["--corpus", str(corpus), "--model", str(model), "--max-steps", "1", "--seq-len", "40",
              "--batch-tokens", "64", "--pack", "--no-shuffle", "--rank", "4", "--alpha", "8", "--lr", "1e-2"]
    result = CliRunner().invoke(app, ["train", *common, "--out", str(tmp_path / "hearth"), "--attention"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "hearth" / "metrics.json").read_text())
    assert metrics["config"]["attention"] is True and metrics["config"]["pack"] is True
    assert metrics["patch"]["replaced"]["attention"] == {"Qwen3Attention": 2}
    assert finetune.read_toml(tmp_path / "hearth" / "run.toml")["attention"] is True
    # the step's packed row (two examples), both layers on the varlen kernel with its offsets
    assert calls == [[0, 21, 55]] * 2

    # SDPA with the block-diagonal mask: the same loss, and the same LoRA gradients (their norm, before clipping)
    assert plain["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    norms = [[json.loads(r)["grad_norm"] for r in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
             for run in ("plain", "hearth")]
    assert norms[0] == pytest.approx(norms[1], rel=1e-4) and norms[0][0] > 0


def test_attention_without_the_patch_is_refused_at_start_up(tmp_path, short_corpus):
    corpus, model = short_corpus
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(model), "--out",
                                      str(tmp_path / "o"), "--attention", "--no-patch"])
    assert result.exit_code == 2 and "attention:" in result.output
    assert not (tmp_path / "o").exists()
