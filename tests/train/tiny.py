"""Small, fast training fixtures: short chat examples (a short system prompt, 0-3 history exchanges)
rendered with hearth's Qwen3 renderer and tokenized with the in-test tokenizer, and a tiny random Qwen3
saved to a local folder -- so runner tests take seconds on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

from hearth.train.chat_format import render
from hearth.train.corpus import tokenize_row
from tests.train.envelope_tokenizer import build_tokenizer

SYSTEM = "You are Wren, a warm companion. Reply with one JSON object."
TOPICS = ["the exam", "my brother", "the roof", "a new job", "the dog", "my dad", "the garden", "a long run",
          "the move", "my sister", "the bakery", "a late bus"]


def conversation(i: int) -> list[dict]:
    """Example i: 0-3 history exchanges, then the trained reply (lengths vary with i)."""
    turns = []
    for h in range(i % 4):
        turns.append({"role": "user", "content": f"Earlier I told you about {TOPICS[(i + h) % len(TOPICS)]}."})
        turns.append({"role": "assistant", "content": json.dumps({"message": f"I remember {TOPICS[h]}.", "mood": "calm"})})
    turns.append({"role": "user", "content": f"Today it is {TOPICS[i % len(TOPICS)]} again, number {i}."})
    turns.append({"role": "assistant", "content": json.dumps({"message": f"Tell me more about {TOPICS[i % len(TOPICS)]}.",
                                                              "mood": ["calm", "warm", "curious"][i % 3]})})
    return turns


def tiny_tokenizer(path: Path, n: int = 12) -> Path:
    texts = [render(SYSTEM, conversation(i)).text for i in range(n)]
    return build_tokenizer(path, texts, vocab_size=300)


def write_corpus(path: Path, tokenizer, indices) -> Path:
    """A train.jsonl as `hearth corpus build --tokenizer` writes it (input_ids, labels, turns)."""
    rows = []
    for line, i in enumerate(indices, 1):
        row = {"id": f"c{i}", "line": line, "kind": "chat"}
        row.update(tokenize_row(tokenizer, render(SYSTEM, conversation(i))))
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def tiny_config(vocab: int, layers: int = 2) -> dict:
    return dict(model_type="qwen3", hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=vocab,
                max_position_embeddings=512)


def save_tiny_model(path: Path, vocab: int, seed: int = 0) -> Path:
    import torch
    import transformers

    cfg = tiny_config(vocab)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    return path


def tiny_adapter(tmp_path_factory, targets=("q_proj", "v_proj")) -> tuple[Path, Path, Path, int]:
    """(tokenizer folder, base model folder (weights and config only, no tokenizer files), LoRA adapter folder,
    vocab) for export tests: an adapter on `targets` whose B is not zero (as after training: random init of both
    LoRA matrices, seed 1)."""
    import peft
    import torch
    import transformers

    tok_dir = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    vocab = len(transformers.AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True))
    base = save_tiny_model(tmp_path_factory.mktemp("base"), vocab)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True)
    torch.manual_seed(1)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(targets),
                                                      init_lora_weights=False, task_type="CAUSAL_LM"))
    adapter = tmp_path_factory.mktemp("adapter")
    lora.save_pretrained(str(adapter))
    return tok_dir, base, adapter, vocab


def run_config(corpus: Path, base: Path, out: Path, **kw):
    """A FinetuneConfig for the tiny run: rank 4, seq_len 512, plain transformers (no patch); kw override."""
    from hearth.train import finetune

    values = dict(corpus=corpus, model=base, out=out, rank=4, alpha=8, lr=1e-2, seq_len=512, patch=False)
    values.update(kw)
    return finetune.FinetuneConfig(**values)
