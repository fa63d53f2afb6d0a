"""`hearth train` as a practitioner runs it: RUN.toml + flags, schedules, token-budget batches with gradient
accumulation and packing, history-dropping truncation, validation loss, metrics.jsonl + loss.png,
checkpoints and an exact resume, the memory-budget refusal and exit codes. Tiny random Qwen3 on the CPU,
plain transformers (hearth's kernels are covered by test_finetune.py under the interpreter)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import batches, finetune
from tests.train.finetune_spies import cut_after_checkpoint
from tests.train.tiny import run_config as cfg

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- 1: config
def test_toml_with_flags_over_it_and_the_resolved_config_beside_the_adapter(tmp_path, corpus, base):
    run_toml = tmp_path / "run.toml"
    run_toml.write_text(f'corpus = "{corpus}"\nmodel = "{base}"\nout = "{tmp_path / "a"}"\nmax_steps = 3\n'
                        'rank = 8\nalpha = 16.0\ndropout = 0.05\ntargets = ["q_proj", "v_proj"]\nseed = 3\n'
                        'lr_schedule = "linear"\nwarmup_steps = 1\nmax_grad_norm = 0.5\nseq_len = 512\n')
    result = CliRunner().invoke(app, ["train", str(run_toml), "--no-patch", "--rank", "4", "--seed", "5",
                                      "--targets", "q_proj,o_proj"])
    assert result.exit_code == 0, result.output
    adapter = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 16 and adapter["lora_dropout"] == 0.05  # flag beat file
    assert sorted(adapter["target_modules"]) == ["o_proj", "q_proj"]
    saved = finetune.read_toml(tmp_path / "a" / "run.toml")
    assert saved["seed"] == 5 and saved["rank"] == 4 and saved["max_steps"] == 3 and saved["max_grad_norm"] == 0.5
    assert saved["lr_schedule"] == "linear" and saved["patch"] is False
    assert finetune.resolve(tmp_path / "a" / "run.toml", {}) == finetune.resolve(run_toml, {
        "rank": 4, "seed": 5, "targets": "q_proj,o_proj", "patch": False})
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    # warm-up 1 step then linear decay over 3 steps: 1, 1 - 1/2, 1 - 2/2... of the peak 2e-4
    assert [r["lr"] for r in rows] == pytest.approx([2e-4, 2e-4 * 1.0, 2e-4 * 0.5])


@pytest.mark.parametrize("text, needle", [
    ('nonsense_key = 1\n', "unknown key(s) nonsense_key"),
    ('rank = 0\n', "rank must be a positive int"),
    ('lr_schedule = "step"\n', "lr_schedule must be one of"),
    ('lora_compute = "fp8"\n', "lora_compute must be one of"),
    ('attention = "auto"\n', "attention must be true, false or left out"),
    ('corpus = [\n', "is not TOML"),
])
def test_bad_config_files_exit_2_naming_the_key(tmp_path, corpus, base, text, needle):
    run_toml = tmp_path / "bad.toml"
    run_toml.write_text(text)
    result = CliRunner().invoke(app, ["train", str(run_toml), "--corpus", str(corpus), "--model", str(base),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and needle in " ".join(result.output.split())


def test_lr_schedules():
    f = lambda s, sched: finetune.lr_factor(s, total=10, warmup=2, schedule=sched)  # noqa: E731
    assert [f(s, "constant") for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    cos = [f(s, "cosine") for s in range(10)]
    assert cos[:3] == [0.5, 1.0, 1.0] and all(b < a for a, b in zip(cos[2:], cos[3:])) and cos[-1] > 0
    assert f(6, "linear") == pytest.approx(0.5)


def test_epochs_are_reshuffled_from_the_seed(corpus):
    examples, _ = batches.load_examples(corpus, 512)
    c = finetune.FinetuneConfig(corpus=corpus, model=corpus, out=corpus, epochs=3, seed=1, seq_len=512)
    steps = finetune.step_plan(examples, c)
    orders = [[i for e, _, mbs in steps if e == epoch for mb in mbs for i in mb] for epoch in range(3)]
    assert all(sorted(o) == list(range(12)) for o in orders)  # each epoch sees every example once
    assert len({tuple(o) for o in orders}) == 3  # in a new order each epoch
    assert finetune.step_plan(examples, c) == steps  # from the seed: repeatable
    c.seed = 2
    assert finetune.step_plan(examples, c) != steps
    c.shuffle = False
    assert [i for e, _, mbs in finetune.step_plan(examples, c) if e == 0 for mb in mbs for i in mb] == list(range(12))


# ------------------------------------------------------------------------------------------- 2: batching
def test_micro_batches_respect_the_token_budget(corpus):
    examples, _ = batches.load_examples(corpus, 512)
    order = list(range(len(examples)))
    for pack in (False, True):
        mbs = batches.micro_batches(examples, order, 700, pack)
        assert sorted(i for mb in mbs for i in mb) == order
        for mb in mbs:
            lens = [len(examples[i]) for i in mb]
            assert (sum(lens) if pack else max(lens) * len(lens)) <= 700
        assert len(mbs) < len(order)  # it did group


def test_packed_and_padded_losses_match(corpus, base):
    examples, _ = batches.load_examples(corpus, 512)
    group = examples[:4]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True, attn_implementation="sdpa")
    model.eval()
    with torch.no_grad():
        padded = model(**batches.collate(group, pack=False)).loss
        packed_inputs = batches.collate(group, pack=True)
        packed = model(**packed_inputs).loss
        # the token-weighted mean of each example alone
        alone = [(model(**batches.collate([e], pack=False)).loss, e.targets) for e in group]
        mean = sum(loss * n for loss, n in alone) / sum(n for _, n in alone)
        # the second example's logits: packed, alone, and packed WITH attention across the boundary
        # (an explicit all-ones mask turns the block-diagonal mask off), the control that shows the test can fail
        a, b = len(group[0]), len(group[0]) + len(group[1])
        inputs = {k: v for k, v in packed_inputs.items() if k != "labels"}
        in_pack = model(**inputs).logits[0, a:b]
        alone_logits = model(input_ids=torch.tensor([group[1].ids])).logits[0]
        leaky = model(**inputs, attention_mask=torch.ones_like(inputs["input_ids"])).logits[0, a:b]
    assert packed_inputs["input_ids"].shape[0] == 1 and packed_inputs["position_ids"][0, a] == 0
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(in_pack, alone_logits, rtol=1e-4, atol=1e-5)
    assert (leaky - alone_logits).abs().max() > 1e-2


def test_accumulation_padding_and_packing_train_identically(tmp_path, corpus, base):
    """4 examples per optimizer step as one padded micro-batch, as 4 accumulated ones, and packed in one row:
    the same losses step after step, so the same gradients."""
    runs = {
        "padded": dict(batch_tokens=4 * 512),
        "accumulated": dict(batch_tokens=512, grad_accum=4),
        "packed": dict(batch_tokens=4 * 512, pack=True),
    }
    losses = {}
    small = tmp_path / "four.jsonl"
    small.write_text("".join(corpus.read_text().splitlines(keepends=True)[:4]))
    for name, kw in runs.items():
        _, metrics = finetune.train_model(cfg(small, base, tmp_path / name, max_steps=3, shuffle=False, **kw))
        losses[name] = metrics["loss"]
    assert losses["padded"][-1] < losses["padded"][0]
    assert losses["accumulated"] == pytest.approx(losses["padded"], rel=1e-5)
    assert losses["packed"] == pytest.approx(losses["padded"], rel=1e-5)


# ------------------------------------------------------------------------------------------- 3: truncation
def test_truncation_drops_the_oldest_history_and_keeps_system_and_reply(tmp_path, corpus):
    rows = [json.loads(x) for x in corpus.read_text().splitlines()]
    longest = max(rows, key=lambda r: len(r["input_ids"]))
    turns, ids, labels = longest["turns"], longest["input_ids"], longest["labels"]
    assert len(turns) == 9  # system + 3 history exchanges + user + reply
    system, tail = ids[:turns[1]], ids[turns[-2]:]
    oldest_pair = turns[3] - turns[1]
    fit_ids, fit_labels, dropped = batches.fit_example(ids, labels, turns, len(ids) - 1)
    assert dropped == 2 and len(fit_ids) == len(ids) - oldest_pair
    assert fit_ids[:len(system)] == system and fit_ids[-len(tail):] == tail  # system prompt and reply intact
    assert fit_ids[len(system):len(system) + 5] == ids[turns[3]:turns[3] + 5]  # the second exchange follows
    assert [x for x in fit_labels if x != -100] == [x for x in labels if x != -100]  # the trained reply whole
    # only system + last exchange fits
    minimal = len(system) + len(tail)
    fit_ids, _, dropped = batches.fit_example(ids, labels, turns, minimal)
    assert dropped == 6 and fit_ids == system + tail
    with pytest.raises(batches.TooLong, match=f"{minimal} tokens > seq_len={minimal - 1}"):
        batches.fit_example(ids, labels, turns, minimal - 1)


def test_examples_that_cannot_fit_are_rejected_with_their_line(tmp_path, corpus, base):
    rows = [json.loads(x) for x in corpus.read_text().splitlines()]
    # every example fits once its history is gone; the longer ones must drop some
    seq = max(r["turns"][1] + len(r["input_ids"]) - r["turns"][-2] for r in rows)
    examples, stats = batches.load_examples(corpus, seq)
    assert len(examples) == 12 and all(len(e) <= seq for e in examples) and stats["truncated"] > 0
    short = sorted(r["turns"][1] + len(r["input_ids"]) - r["turns"][-2] for r in rows)[6]  # about half fit
    examples, stats = batches.load_examples(corpus, short)
    assert stats["rejected"] and all("seq_len" in r["reason"] for r in stats["rejected"])
    assert {r["line"] for r in stats["rejected"]} <= set(range(1, 13)) and stats["rejected"][0]["id"].startswith("c")
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out",
                                      str(tmp_path / "r"), "--no-patch", "--max-steps", "1", "--seq-len", str(short),
                                      "--rank", "2"])
    assert result.exit_code == 0, result.output
    first = stats["rejected"][0]
    assert first["conversation_line"] == first["line"]  # write_corpus numbers its conversations like its rows
    assert f"line {first['line']} ({first['id']}, conversation line {first['line']})" in " ".join(result.output.split())
    no_turns = tmp_path / "old.jsonl"
    no_turns.write_text(json.dumps({k: v for k, v in rows[3].items() if k != "turns"}) + "\n")
    with pytest.raises(ValueError, match=r"corpus: .*line 1: .*no 'turns'"):
        batches.load_examples(no_turns, 100)


# ------------------------------------------------------------------------------------------- 4 + 5
def test_eval_split_metrics_plot_checkpoints_and_an_exact_resume(tmp_path, corpus, base):
    kw = dict(max_steps=6, eval_fraction=0.25, eval_every=2, save_every=2, dropout=0.1, batch_tokens=1024,
              warmup_steps=2)
    _, full = finetune.train_model(cfg(corpus, base, tmp_path / "full", **kw))
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert set(rows[0]) >= {"step", "loss", "eval_loss", "lr", "grad_norm", "tok_per_s", "peak_gib"}
    assert [r["step"] for r in rows if r["eval_loss"] is not None] == [2, 4, 6]
    assert all(r["grad_norm"] > 0 and r["tok_per_s"] > 0 and r["peak_gib"] > 0 for r in rows)
    assert full["data"]["train_examples"] == 9 and full["data"]["eval_examples"] == 3
    assert (tmp_path / "full" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "full" / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    ckpt = tmp_path / "full" / "checkpoints" / "step-000004"
    assert {p.name for p in ckpt.iterdir()} >= {"adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt",
                                                "state.json"}

    # the eval loss is the held-out examples' loss under the saved adapter
    from peft import PeftModel

    model = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(str(base)), str(tmp_path / "full"))
    examples, _ = batches.load_examples(corpus, 512)
    _, held = batches.split_eval(examples, 0.25, 0)
    assert finetune.evaluate(model, held, cfg(corpus, base, tmp_path), torch.device("cpu")) == pytest.approx(
        rows[-1]["eval_loss"], rel=1e-5)

    # a run that dies right after its step-2 checkpoint, then resumed from its folder
    cut_after_checkpoint(cfg(corpus, base, tmp_path / "cut", **kw))
    assert len((tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()) == 2
    _, resumed = finetune.train_model(cfg(corpus, base, tmp_path / "cut", resume=tmp_path / "cut", **kw))
    assert resumed["resumed_from"].endswith("step-000002")
    assert resumed["loss"] == full["loss"]  # exactly: adapter, AdamW, scheduler, RNG (dropout) and data position
    assert resumed["eval_loss"] == full["eval_loss"]
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("full", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    with pytest.raises(ValueError, match="resume: .* seed=0, this run has seed=1"):
        finetune.train_model(cfg(corpus, base, tmp_path / "x", resume=tmp_path / "cut", **{**kw, "seed": 1}))


def test_resuming_an_earlier_checkpoint_in_the_same_folder_replaces_the_later_ones(tmp_path, corpus, base):
    kw = dict(max_steps=3, save_every=1, batch_tokens=1024)
    _, full = finetune.train_model(cfg(corpus, base, tmp_path / "r", **kw))
    _, again = finetune.train_model(cfg(corpus, base, tmp_path / "r", resume=tmp_path / "r" / "checkpoints" / "step-000001",
                                        **kw))
    assert again["loss"] == full["loss"]  # steps 1 (kept) + 2, 3 replayed exactly
    assert [p.name for p in finetune.run_checkpoints(tmp_path / "r")] == ["step-000001", "step-000002"]
    # the first run's step 2 (of the line the resume left) is moved aside, not deleted (review 76)
    aside = [p for p in (tmp_path / "r" / "checkpoints").iterdir() if p.name.startswith("superseded-")]
    assert len(aside) == 1 and (aside[0] / "step-000002" / "state.json").is_file()


# ------------------------------------------------------------------------------------------- 8: refusals, exits
def test_a_budget_below_the_weights_is_refused_naming_qlora(tmp_path, corpus, base):
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out", str(tmp_path / "o"),
                                      "--no-patch", "--memory-budget-gib", "0.00001"])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "weights and LoRA state alone need" in text and "--qlora" in text and "more memory" in text
    assert not (tmp_path / "o").exists()  # refused before loading anything


def test_qwen3_14b_at_24_gib_is_refused_and_fits_with_qlora():
    from transformers import Qwen3Config

    config = Qwen3Config(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                         head_dim=128, intermediate_size=17408, vocab_size=151936, tie_word_embeddings=False)
    sizes = finetune.weight_bytes(config, dtype=torch.bfloat16, targets=finetune.LORA_TARGETS, rank=16)
    assert 27 < sizes["weights"] / finetune.GIB < 28.5  # the bf16 weights alone
    assert sizes["weights_4bit"] / finetune.GIB < 10
    with pytest.raises(finetune.RunError, match="--qlora"):
        finetune.refuse_over_budget(sizes["weights"], sizes["lora_fp32"], 24 * 0.9, qlora=False,
                                    qlora_weights_bytes=sizes["weights_4bit"])
    finetune.refuse_over_budget(sizes["weights_4bit"], sizes["lora_fp32"], 24 * 0.9, qlora=True)


def test_over_budget_even_fully_checkpointed_is_refused(tmp_path, corpus, base):
    # the weights fit 0.2 GiB, but the planner's fixed 0.25 GiB allowance (finetune.FIXED_BYTES) does not: refused, exit 1
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out", str(tmp_path / "o"),
                                      "--no-patch", "--memory-budget-gib", "0.2", "--max-steps", "1"])
    assert result.exit_code == 1 and "even full checkpointing" in " ".join(result.output.split())


def test_a_diverging_loss_exits_1(tmp_path, corpus, base):
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out", str(tmp_path / "o"),
                                      "--no-patch", "--max-steps", "4", "--lr", "1e30", "--max-grad-norm", "1e30"])
    assert result.exit_code == 1 and "loss became" in result.output


def test_cpu_without_the_interpreter_patches_only_what_was_probed(tmp_path, corpus, base):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + str(ROOT)
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "hearth.cli", "train", "--corpus", str(corpus), "--model", str(base),
                           "--out", str(out), "--max-steps", "1", "--rank", "2"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert all(metrics["patch"]["replaced"][k] == {} for k in ("norm", "rope", "mlp", "loss")), metrics["patch"]
    assert any(row["kind"] == "loss" and "probe" in row["reason"] for row in metrics["patch"]["left"])
    assert "TRITON_INTERPRET=1" in " ".join(proc.stdout.split()) and math.isfinite(metrics["loss"][0])
