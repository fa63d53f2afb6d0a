"""Review 49b, the memory planner: a micro-batch that reaches SDPA WITH a mask (a padded micro-batch with padding; a
packed row of several sequences off hearth's varlen attention) was planned as if it took SDPA's mask-free path. With
a mask transformers repeats k / v to the query heads and torch keeps an additive copy of the mask in every layer,
which the plan did not count: the H200's packed row on SDPA peaked 15.25 GiB over its plan, and a padded micro-batch
(the documented seq_len 4096 / batch_tokens 8192 run) was under-planned the same way. CPU tests: arithmetic, what
transformers hands SDPA, and what `hearth train` passes the planner."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from hearth.train import finetune
from hearth.train.batches import Example, collate
from tests.train.finetune_spies import spy_on_planner
from tests.train.tiny import run_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

QWEN3_14B = SimpleNamespace(hidden_size=5120, intermediate_size=17408, num_attention_heads=40, num_key_value_heads=8,
                            head_dim=128, num_hidden_layers=40, vocab_size=151936)
LORA_14B = 40 * 16 * sum(a + b for a, b in [(5120, 5120), (5120, 1024), (5120, 1024), (5120, 5120),
                                            (5120, 17408), (5120, 17408), (17408, 5120)])
FUSED = dict(weights_bytes=int(27.51 * finetune.GIB), trainable_bytes=LORA_14B * 4, bytes_per_el=2, patched=True,
             fused_mlp=True, fused_lora=True)


def test_the_h200_packed_row_on_sdpa_is_estimated_with_its_mask():
    """lora_pack-2026-12-04-823ff35: one row of 16384 tokens in 8 sequences, 21 of 40 layers checkpointed, SDPA with
    transformers' block-diagonal mask: 92.25 GiB measured; the plan said 78.5 (the varlen row of the same step: 77.00).
    Counted as one masked row it lands in the fused rows' band (0.99..1.05 of the peak)."""
    unmasked = finetune.estimate_peak_gib(QWEN3_14B, 16384, 21, **FUSED)
    masked = finetune.estimate_peak_gib(QWEN3_14B, 16384, 21, mask_rows=1, **FUSED)
    assert unmasked < 0.9 * 92.25
    assert 0.99 * 92.25 <= masked <= 1.05 * 92.25, masked


def test_a_padded_micro_batch_with_padding_is_planned_with_its_mask():
    """docs/training.md's run (seq_len 4096, batch_tokens 8192): two rows of up to 4096 tokens, padded. At an 80 GiB
    budget the plan for 8192 mask-free tokens is 7+ GiB under what the padded micro-batch keeps at c=0."""
    kw = dict(FUSED, budget_gib=80.0)
    flat = finetune.plan_checkpointing(QWEN3_14B, 8192, **kw)
    padded = finetune.plan_checkpointing(QWEN3_14B, 8192, batches=[(8192, 2)], **kw)
    gap = (finetune.estimate_peak_gib(QWEN3_14B, 8192, 0, mask_rows=2, **FUSED)
           - finetune.estimate_peak_gib(QWEN3_14B, 8192, 0, **FUSED))
    # 40 layers x 8192 tokens x (4096 + 2 x (5120 - 1024)) x 2 bytes, + the 64 MiB bool mask
    assert gap == pytest.approx((40 * 8192 * (4096 + 8192) * 2 + 8192 * 4096) / finetune.GIB)
    assert gap > 7
    assert padded.fits and padded.checkpointed > flat.checkpointed
    assert finetune.estimate_peak_gib(QWEN3_14B, 8192, flat.checkpointed, mask_rows=2, **FUSED) > 80.0


def test_the_largest_estimate_over_the_run_s_micro_batches_sets_the_plan():
    """A masked micro-batch of fewer tokens can need more than the longest mask-free one: the plan takes the max."""
    kw = dict(FUSED, budget_gib=80.0)
    both = finetune.plan_checkpointing(QWEN3_14B, 16384, batches=[(16384, 0), (8192, 1)], **kw)
    alone = [finetune.plan_checkpointing(QWEN3_14B, t, mask_rows=r, **kw) for t, r in ((16384, 0), (8192, 1))]
    assert both.checkpointed == max(p.checkpointed for p in alone)
    assert both.estimate_gib == pytest.approx(max(
        finetune.estimate_peak_gib(QWEN3_14B, t, both.checkpointed, mask_rows=r, **FUSED) for t, r in ((16384, 0), (8192, 1))))


def _ex(n: int) -> Example:
    return Example(ids=list(range(1, n + 1)), labels=list(range(1, n + 1)), line=1)


def test_micro_batch_shapes():
    examples = [_ex(10), _ex(10), _ex(7), _ex(30), _ex(4)]
    # padded: [10, 10] has no padding (no mask); [10, 7] does (2 masked rows of 10); [30] alone
    assert sorted(finetune.micro_batch_shapes(examples, [[0, 1], [1, 2], [3]], pack=False, varlen=False)) == [(20, 2), (30, 0)]
    # packed: several sequences in a row take the mask off the varlen kernel; one sequence never does
    assert finetune.micro_batch_shapes(examples, [[0, 2], [3]], pack=True, varlen=False) == [(30, 0), (17, 1)]
    assert finetune.micro_batch_shapes(examples, [[0, 2], [3]], pack=True, varlen=True) == [(30, 0)]
    # dominated shapes go: (20, 2) has fewer tokens and a smaller mask than (30, 1)
    assert finetune.micro_batch_shapes(examples, [[0, 2], [3], [4, 1, 2]], pack=True, varlen=False) == [(30, 0), (21, 1)]
    assert finetune.micro_batch_shapes(examples, [[3, 4], [0, 2]], pack=True, varlen=False) == [(34, 1)]


def test_transformers_hands_sdpa_the_mask_and_repeated_kv_exactly_where_the_plan_says(tmp_path, monkeypatch):
    """What the estimate assumes about the installed transformers: mask-free micro-batches reach SDPA with the K-wide
    k / v (its GQA path) and no mask; a padded one with padding and a packed row of two sequences reach it with a
    [rows, 1, T, T] mask and k / v repeated to the query heads."""
    from tests.train.tiny import tiny_config

    cfg = tiny_config(64)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config)
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((k.shape[1], None if attn_mask is None else tuple(attn_mask.shape)))
        return original(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    cases = {"padded, no padding": ([_ex(12), _ex(12)], False), "padded": ([_ex(12), _ex(7)], False),
             "packed": ([_ex(12), _ex(7)], True)}
    got = {}
    for name, (batch, pack) in cases.items():
        seen.clear()
        rows = finetune.micro_batch_shapes(batch, [list(range(len(batch)))], pack=pack, varlen=False)
        with torch.no_grad():
            model(**collate(batch, pack=pack))
        got[name] = (rows, set(seen))
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    assert got["padded, no padding"] == ([(24, 0)], {(kv_heads, None)})
    assert got["padded"] == ([(24, 2)], {(heads, (2, 1, 12, 12))})
    assert got["packed"] == ([(19, 1)], {(heads, (1, 1, 19, 19))})


def test_hearth_train_plans_for_its_masked_micro_batches(tmp_path, corpus, base, monkeypatch):
    """The run's padded micro-batches (examples of different lengths share one) reach the planner as masked rows."""
    calls = spy_on_planner(monkeypatch)
    c = run_config(corpus, base, tmp_path / "o", batch_tokens=1024, max_steps=1, memory_budget_gib=50.0)
    metrics = finetune.run(c)
    (kw,) = calls
    assert kw.get("batches"), kw
    assert all(rows > 1 for _, rows in kw["batches"])  # every micro-batch of 1024 tokens here is padded
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["checkpointing"]["mode"] == metrics["checkpointing"]["mode"]
