"""hearth.train.finetune + `hearth train`: LoRA SFT of a tiny random Qwen3 on a corpus built by
hearth.train.corpus with the in-test tokenizer (CPU, TRITON_INTERPRET=1, few steps), and the
checkpointing planner against measured H200 peaks (the anchor runs and this repo's e2e rows)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import finetune
from hearth.train.corpus import build, read_corpus
from tests.train.envelope_tokenizer import build_tokenizer

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "hearth" / "train" / "data" / "example_corpus.jsonl"
SEQ = 40  # tokens per example: the interpreter is slow


def tiny_config(vocab: int) -> dict:
    return dict(model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, intermediate_size=96, vocab_size=vocab, max_position_embeddings=256)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    texts = [e.rendered.text for e in read_corpus(EXAMPLE.read_text(encoding="utf-8").splitlines()).examples]
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"), texts, vocab_size=300)
    out = tmp_path_factory.mktemp("corpus")
    build(EXAMPLE, out, tok)
    from transformers import AutoTokenizer

    return out, len(AutoTokenizer.from_pretrained(str(tok), local_files_only=True))


@pytest.fixture(scope="module")
def local_model(tmp_path_factory, corpus_dir):
    """A tiny random Qwen3 saved to a local directory, the way a downloaded model sits on disk."""
    _, vocab = corpus_dir
    cfg = tiny_config(vocab)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def one_example(tmp_path_factory, corpus_dir):
    """A single example of SEQ tokens (every step sees the same batch): the start of a real example's
    system prompt, then its trained reply's last tokens -- short, because the interpreter is slow."""
    out_dir, _ = corpus_dir
    row = json.loads((out_dir / "train.jsonl").read_text(encoding="utf-8").splitlines()[0])
    ids, labels = row["input_ids"], row["labels"]
    short = {"id": row["id"], "input_ids": ids[:SEQ - 12] + ids[-12:], "labels": [-100] * (SEQ - 12) + labels[-12:]}
    one = tmp_path_factory.mktemp("one") / "one.jsonl"
    one.write_text(json.dumps(short) + "\n", encoding="utf-8")
    return one


@pytest.fixture(scope="module")
def patched_run(tmp_path_factory, one_example, local_model):
    out = tmp_path_factory.mktemp("run") / "adapter"
    cfg = finetune.FinetuneConfig(corpus=one_example, model=local_model, out=out, max_steps=3, lr=2e-2,
                                  rank=4, alpha=8, seq_len=SEQ)
    return finetune.train_model(cfg)


def test_three_steps_on_a_repeated_batch(patched_run, local_model):
    model, metrics = patched_run
    adapter = Path(metrics["config"]["out"])
    losses = metrics["loss"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert all(b <= a + 1e-6 for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0]
    assert metrics["data"]["examples"] == 1 and metrics["data"]["rejected"] == []
    assert metrics["patch"]["replaced"]["loss"] == {"Qwen3ForCausalLM": 1}
    assert metrics["patch"]["replaced"]["lora"] == {"Linear": 14}  # patch.apply ran after peft: 7 projections x 2
    # the runner's default lora_compute ("base": the LoRA products in the base dtype) reached the fused nodes
    assert metrics["config"]["lora_compute"] == "base"
    fused = [m for m in model.modules() if getattr(m, "_hearth_lora", False)]
    assert len(fused) == 14 and {m.forward.compute for m in fused} == {"base"}
    assert metrics["checkpointing"]["mode"] == "none"  # CPU, no budget given

    # only LoRA parameters changed: every base weight equals the one on disk
    base = transformers.AutoModelForCausalLM.from_pretrained(str(local_model), local_files_only=True).state_dict()
    trained = model.get_base_model()
    changed_lora = 0
    for name, param in trained.named_parameters():
        if "lora_" in name:
            assert param.requires_grad
            changed_lora += int(bool(param.detach().abs().sum() > 0)) if "lora_B" in name else 0
            continue
        assert not param.requires_grad, name
        key = name.replace(".base_layer", "")
        torch.testing.assert_close(param.detach(), base[key], rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    assert changed_lora == 2 * 7  # every lora_B (zero at init) moved, in both layers, on all 7 targets

    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    saved = json.loads((adapter / "metrics.json").read_text())
    assert saved["loss"] == losses and saved["tokens_per_s"] > 0
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4


def test_unpatched_run_starts_from_the_same_loss(tmp_path, one_example, local_model, patched_run):
    cfg = finetune.FinetuneConfig(corpus=one_example, model=local_model, out=tmp_path / "plain", max_steps=1, lr=2e-2,
                                  rank=4, alpha=8, seq_len=SEQ, patch=False)
    _, metrics = finetune.train_model(cfg)
    assert metrics["patch"] is None
    # LoRA B starts at zero, so step 0's loss is the base model's: hearth's kernels must give the same number
    assert metrics["loss"][0] == pytest.approx(patched_run[1]["loss"][0], rel=1e-5)


def test_cli_random_init(tmp_path, one_example, corpus_dir):
    _, vocab = corpus_dir
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(tiny_config(vocab)))
    adapter = tmp_path / "adapter"
    result = CliRunner().invoke(app, [
        "train", "--corpus", str(one_example), "--model", str(config), "--random-init", "--out", str(adapter),
        "--max-steps", "1", "--seq-len", str(SEQ), "--rank", "2", "--alpha", "4", "--memory-budget-gib", "4",
    ])
    assert result.exit_code == 0, result.output
    metrics = json.loads((adapter / "metrics.json").read_text())
    ckpt = metrics["checkpointing"]
    assert ckpt["mode"] == "none" and "fits the 4.0 GiB budget" in ckpt["reason"]
    assert math.isfinite(metrics["loss"][0]) and metrics["patch"]["replaced"]["loss"] == {"Qwen3ForCausalLM": 1}
    assert (adapter / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("args, needle", [
    (["--corpus", "missing.jsonl"], "corpus"),
    (["--rank", "0"], "rank"),
])
def test_cli_bad_arguments_name_the_argument(tmp_path, corpus_dir, args, needle):
    out_dir, vocab = corpus_dir
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(tiny_config(vocab)))
    base = {"--corpus": str(out_dir / "train.jsonl"), "--model": str(config), "--out": str(tmp_path / "a"), "--rank": "2"}
    base.update(dict(zip(args[::2], args[1::2])))
    result = CliRunner().invoke(app, ["train", "--random-init", *[x for kv in base.items() for x in kv]])
    assert result.exit_code == 2 and needle in result.output


def test_text_only_corpus_is_refused(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "hi", "mask": [[0, 2]]}) + "\n")
    with pytest.raises(ValueError, match="corpus: line 1"):
        finetune.load_examples(path, 16)


def test_planner_says_when_even_full_checkpointing_does_not_fit():
    kw = dict(weights_bytes=WEIGHTS_14B, trainable_bytes=LORA_14B * 4, bytes_per_el=2, patched=True)
    plan = finetune.plan_checkpointing(QWEN3_14B, 16384, budget_gib=35.0, **kw)
    assert plan.mode == "full" and not plan.fits and "--qlora" in plan.reason
    assert finetune.plan_checkpointing(QWEN3_14B, 4096, budget_gib=60.0, **kw).fits


QWEN3_14B = SimpleNamespace(hidden_size=5120, intermediate_size=17408, num_attention_heads=40, num_key_value_heads=8,
                            head_dim=128, num_hidden_layers=40, vocab_size=151936)
WEIGHTS_14B = int(27.75 * finetune.GIB)  # the H200 anchor run's weights_gib
# LoRA r=16 params: r * (in + out) for q, k, v, o, gate, up, down in each of 40 layers
LORA_14B = 40 * 16 * sum(a + b for a, b in [(5120, 5120), (5120, 1024), (5120, 1024), (5120, 5120),
                                            (5120, 17408), (5120, 17408), (17408, 5120)])


# the measured H200 rows the estimate is pinned to: tests/train/test_planner_h200.py


def test_planner_picks_the_fewest_checkpointed_layers_that_fit():
    kw = dict(weights_bytes=WEIGHTS_14B, trainable_bytes=LORA_14B * 4, bytes_per_el=2, patched=True)
    none = finetune.plan_checkpointing(QWEN3_14B, 4096, budget_gib=None, **kw)
    assert none.mode == "none"
    big = finetune.plan_checkpointing(QWEN3_14B, 4096, budget_gib=none.estimate_gib / (1 - finetune.PLAN_MARGIN) + 0.01, **kw)
    assert big.mode == "none" and "fastest" in big.reason
    mid_budget = (none.estimate_gib + big.table[-1]["estimate_gib"]) / 2
    mid = finetune.plan_checkpointing(QWEN3_14B, 4096, budget_gib=mid_budget, **kw)
    assert mid.mode == "selective" and 0 < mid.checkpointed < 40 and mid.estimate_gib <= mid_budget * (1 - finetune.PLAN_MARGIN)
    tight = finetune.plan_checkpointing(QWEN3_14B, 4096, budget_gib=mid.estimate_gib / (1 - finetune.PLAN_MARGIN) - 0.01, **kw)
    assert tight.checkpointed > mid.checkpointed  # the planner took the least recompute that fits
    estimates = [row["estimate_gib"] for row in mid.table]
    assert estimates == sorted(estimates, reverse=True)  # more checkpointing, less memory


def test_apply_checkpointing_switches_the_last_layers(corpus_dir):
    _, vocab = corpus_dir
    cfg = tiny_config(vocab)
    cfg["num_hidden_layers"] = 4
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config)
    plan = finetune.CheckpointPlan(checkpointed=1, layers=4, estimate_gib=0.0, budget_gib=1.0, reason="test")
    assert finetune.apply_checkpointing(model, plan) == 1
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [False, False, False, True]


def test_lora_compute_choices_are_the_kernels_own():
    """The run file's lora_compute choices are the ones patch.apply / the fused LoRA nodes take."""
    from hearth.kernels.lora import LORA_COMPUTE as kernels_choices
    from hearth.train.finetune import LORA_COMPUTE as run_choices

    assert sorted(run_choices) == sorted(kernels_choices) and run_choices[0] == "base"


def test_packed_mask_note_only_where_packed_rows_take_sdpa():
    """The start-up note about transformers' [T, T] mask: packed rows on CUDA without hearth's attention (no patch,
    or a patch that left attention on SDPA), and nowhere else."""
    from hearth.patch import PatchReport

    on_sdpa, on_hearth = PatchReport(), PatchReport()
    on_hearth.add("attention", "Qwen3Attention")
    note = finetune.packed_mask_note(True, on_sdpa, "cuda")
    assert note and "mask" in note and "--memory-budget-gib" in note and "--attention" in note
    assert finetune.packed_mask_note(True, None, "cuda") == note  # --no-patch
    assert finetune.packed_mask_note(True, on_hearth, "cuda") is None  # the varlen kernel, no mask
    assert finetune.packed_mask_note(False, on_sdpa, "cuda") is None  # padded rows: SDPA's own causal path
    assert finetune.packed_mask_note(True, on_sdpa, "cpu") is None  # no memory plan off the GPU
