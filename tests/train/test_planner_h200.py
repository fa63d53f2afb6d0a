"""The memory planner against every peak measured on the H200 (CPU test: arithmetic only).

Qwen3-14B shape (40 layers, H 5120, I 17408, 40/8 heads of 128, V 151936), random weights, batch 1, LoRA r=16 on
q,k,v,o,gate,up,down with fp32 adapters (peft's default), AdamW on the LoRA parameters, SDPA attention, peak =
torch.cuda.max_memory_allocated over one warm-up and the timed steps, PYTORCH_CUDA_ALLOC_CONF=expandable_segments.
Stack of the current rows: torch 2.11.0+cu130, triton 3.6.0, transformers 5.17.0, peft 0.21.0, liger-kernel 0.8.5,
bitsandbytes 0.50.2.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hearth.train import finetune

QWEN3_14B = SimpleNamespace(hidden_size=5120, intermediate_size=17408, num_attention_heads=40, num_key_value_heads=8,
                            head_dim=128, num_hidden_layers=40, vocab_size=151936)
# LoRA r=16 params: r * (in + out) for q, k, v, o, gate, up, down in each of 40 layers (fp32: x 4 bytes)
LORA_14B = 40 * 16 * sum(a + b for a, b in [(5120, 5120), (5120, 1024), (5120, 1024), (5120, 5120),
                                            (5120, 17408), (5120, 17408), (17408, 5120)])
KNOBS = {  # setup -> the knobs estimate_peak_gib takes for it
    "hf": {"patched": False},
    "liger": {"patched": False, "liger": True},
    "hearth": {"patched": True},  # the issue-16 rows: hearth's MLP then kept h
    "hearth_now": {"patched": True, "fused_mlp": True},  # main at c879067: hearth's swiglu recomputes h
    "qlora_hf": {"patched": False, "qlora": True},
    "qlora_hearth": {"patched": True, "qlora": True},
    "qlora_hearth_mlp": {"patched": True, "qlora": True, "fused_mlp": True},  # the MLP patched on the 4-bit base
    "hearth_2048": {"patched": True, "fused_mlp": True},
    "fused": {"patched": True, "fused_mlp": True, "fused_lora": True},  # patch kind "lora": hearth's fused LoRA nodes
}

# (setup, tokens, checkpointed layers, weights GiB, measured peak GiB, source)
ROWS = [
    # scripts/gpu/lora_e2e.py, benchmarks/e2e/lora_e2e.jsonl (2026-11-29, full checkpointing)
    ("hf", 4096, 40, 27.51, 36.89, "lora_e2e.jsonl"),
    ("liger", 4096, 40, 27.51, 31.50, "lora_e2e.jsonl"),
    ("hearth", 4096, 40, 27.51, 31.63, "lora_e2e.jsonl"),
    # the same script's 2026-12-01 run, as issue 16 tabulates it (its rows were not committed)
    ("hf", 16384, 40, 27.51, 62.68, "issue 16"),
    ("liger", 16384, 40, 27.51, 41.12, "issue 16"),
    ("hearth", 16384, 40, 27.51, 41.65, "issue 16"),
    ("hf", 4096, 0, 27.51, 94.43, "issue 16"),
    ("liger", 4096, 0, 27.51, 77.53, "issue 16"),
    ("hearth", 4096, 0, 27.51, 82.84, "issue 16"),
    ("hearth", 16384, 25, 27.51, 120.59, "issue 16"),  # the old planner's pick for 80 GiB: it said 78.0
    # scripts/gpu/lora_matrix.sh (lora_e2e.py --budget-gib 80 / 31.5), 2026-12-01, benchmarks/e2e/lora_e2e.jsonl
    ("hf", 4096, 11, 27.51, 78.70, "matrix"), ("liger", 4096, 0, 27.51, 77.53, "matrix"),
    ("hearth_now", 4096, 4, 27.51, 74.08, "matrix"), ("hf", 4096, 40, 27.51, 36.89, "matrix"),
    ("liger", 4096, 40, 27.51, 31.50, "matrix"), ("hearth_now", 4096, 40, 27.51, 31.50, "matrix"),
    ("hf", 16384, 37, 27.51, 80.12, "matrix"), ("liger", 16384, 32, 27.51, 78.97, "matrix"),
    ("hearth_now", 16384, 33, 27.51, 74.24, "matrix"), ("hf", 16384, 40, 27.51, 62.68, "matrix"),
    ("liger", 16384, 40, 27.51, 41.12, "matrix"), ("hearth_now", 16384, 40, 27.51, 41.12, "matrix"),
    # scripts/gpu/qlora_e2e.py, benchmarks/e2e/qlora_e2e.jsonl (2026-12-01, seq 2048, 4-bit NF4 base)
    ("qlora_hearth", 2048, 29, 9.051, 18.97, "qlora_e2e.jsonl"),  # the old planner said 15.8 for a 16 GiB budget
    ("qlora_hearth", 2048, 40, 9.051, 11.73, "qlora_e2e.jsonl"),
    ("qlora_hf", 2048, 40, 9.051, 14.39, "qlora_e2e.jsonl"),
    # the same script's later run (commit cbc25df; the MLP and rope patched on the 4-bit base), measured before
    # this planner was re-derived, so not fitted to: bf16 base without checkpointing, QLoRA at a 16 GiB budget
    ("hearth_2048", 2048, 0, 27.508, 52.92, "qlora_e2e.jsonl"),  # (qlora_hf measured 14.39 again: row above)
    ("qlora_hearth_mlp", 2048, 36, 9.051, 14.04, "qlora_e2e.jsonl"),
]


# The LoRA-aware fused nodes (hearth and hearth_fast: lora_compute "adapter" / "base" keep the same tensors),
# lora_matrix.sh / lora_e2e.py --budget-gib at c542486 (4096) and cd92f1e (16384), benchmarks/e2e/lora_e2e.jsonl.
# Measured after the planner was derived, not fitted to: the estimate is above each peak by 0.4-4.7%.
FUSED_ROWS = [
    ("fused", 4096, 0, 27.51, 51.10, "hearth"), ("fused", 4096, 0, 27.51, 51.19, "hearth_fast"),
    ("fused", 4096, 40, 27.51, 30.54, "hearth"), ("fused", 4096, 40, 27.51, 30.48, "hearth_fast"),
    ("fused", 16384, 21, 27.51, 77.00, "hearth_fast"), ("fused", 16384, 40, 27.51, 36.99, "hearth_fast"),
    # hearth's attention in place of SDPA (lora_fast_attn*-2026-12-03-{e76d7c6,80c757f}), and on one packed row of
    # 8 sequences through the varlen kernel (lora_pack-2026-12-04-823ff35): the same peaks as SDPA's dense rows
    ("fused", 4096, 0, 27.51, 51.22, "hearth_fast_attn"), ("fused", 16384, 21, 27.51, 77.00, "hearth_fast_attn"),
    ("fused", 16384, 21, 27.51, 77.00, "hearth_fast_attn packed"),
]
# SDPA with transformers' [T, T] block-diagonal mask on the same packed row (lora_pack-2026-12-04-823ff35): planned
# without the mask then; counted since (finetune.sdpa_mask_bytes_per_token, mask_rows)
PACKED_SDPA_ROW = ("fused", 16384, 21, 27.51, 92.25, "hearth_fast packed")


def estimate(setup, tokens, checkpointed, weights_gib, mask_rows=0):
    return finetune.estimate_peak_gib(QWEN3_14B, tokens, checkpointed, weights_bytes=int(weights_gib * finetune.GIB),
                                      trainable_bytes=LORA_14B * 4, bytes_per_el=2, mask_rows=mask_rows,
                                      **KNOBS[setup])


@pytest.mark.parametrize("setup, tokens, checkpointed, weights_gib, measured, source", ROWS,
                         ids=[f"{r[0]}-{r[1]}-c{r[2]}" for r in ROWS])
def test_estimate_is_within_10_percent_of_every_measured_peak(setup, tokens, checkpointed, weights_gib, measured, source):
    """Within 10% of each row (the issue's goal) -- in fact within 2% -- and never under it by more than 1%: an
    estimate below the truth is how a budget gets overrun."""
    est = estimate(setup, tokens, checkpointed, weights_gib)
    assert abs(est - measured) / measured <= 0.02, (est, measured, source)
    assert est >= 0.99 * measured, (est, measured, source)


@pytest.mark.parametrize("setup, tokens, checkpointed, weights_gib, measured, source", FUSED_ROWS,
                         ids=[f"{r[5]}-{r[1]}-c{r[2]}" for r in FUSED_ROWS])
def test_estimate_with_the_fused_lora_nodes_is_within_5_percent_above(setup, tokens, checkpointed, weights_gib,
                                                                      measured, source):
    est = estimate(setup, tokens, checkpointed, weights_gib)
    assert 0.99 * measured <= est <= 1.05 * measured, (est, measured, source)


# The first anchors (an earlier stack: weights 27.75 GiB; HF's loss then held more at 16384), full checkpointing
ANCHORS = [("hf", 4096, 38.05), ("hf", 16384, 67.32), ("liger", 4096, 31.51), ("liger", 16384, 41.13)]


@pytest.mark.parametrize("setup, tokens, measured", ANCHORS)
def test_estimate_is_within_10_percent_of_the_first_anchors(setup, tokens, measured):
    est = estimate(setup, tokens, 40, 27.75)
    assert abs(est - measured) / measured <= 0.10, (est, measured)


def test_the_old_planner_picks_now_fit_their_budgets():
    """The two overruns of issue 16 and the QLoRA note: at the budgets they were planned for, the planner now
    picks a setting whose estimate is within the budget, and the measured row of the old pick is over it."""
    kw = dict(weights_bytes=int(27.51 * finetune.GIB), trainable_bytes=LORA_14B * 4, bytes_per_el=2, patched=True)
    for tokens, old_pick in ((4096, 0), (16384, 25)):
        plan = finetune.plan_checkpointing(QWEN3_14B, tokens, budget_gib=80.0, **kw)
        assert plan.fits and plan.estimate_gib <= 80.0
        assert plan.checkpointed > old_pick  # the old pick measured 82.84 / 120.59 GiB
    q = finetune.plan_checkpointing(QWEN3_14B, 2048, weights_bytes=int(9.051 * finetune.GIB), trainable_bytes=LORA_14B * 4,
                                    bytes_per_el=2, budget_gib=16.0, patched=True, qlora=True)
    assert q.fits and q.checkpointed > 29  # 29 measured 18.97 GiB


def test_the_hf_pick_at_16384_that_overran_80_gib_by_0_12_is_not_picked_again():
    """lora_matrix.sh, 2026-12-01: HF + peft, 37 of 40 checkpointed, measured 80.12 GiB in an 80 GiB budget (its
    estimate 79.80 was 0.4% under). With the planning margin the planner checkpoints more."""
    plan = finetune.plan_checkpointing(QWEN3_14B, 16384, weights_bytes=int(27.51 * finetune.GIB),
                                       trainable_bytes=LORA_14B * 4, bytes_per_el=2, budget_gib=80.0, patched=False)
    assert plan.fits and plan.checkpointed > 37
    assert estimate("hf", 16384, plan.checkpointed, 27.51) <= 80.0 * (1 - finetune.PLAN_MARGIN)


def test_knobs_order_the_setups_as_measured():
    """Without checkpointing: HF > hearth > Liger > hearth with fused LoRA nodes (no fp32 input copies, no h)."""
    peaks = {name: finetune.estimate_peak_gib(QWEN3_14B, 4096, 0, weights_bytes=int(27.51 * finetune.GIB),
                                              trainable_bytes=LORA_14B * 4, bytes_per_el=2, **kw)
             for name, kw in {"hf": {"patched": False}, "hearth": {"patched": True},
                              "liger": {"patched": False, "liger": True},
                              "fused": {"patched": True, "fused_lora": True}}.items()}
    assert peaks["hf"] > peaks["hearth"] > peaks["liger"] > peaks["fused"]
    # fused_lora drops (5H + Q + I) x 4 bytes and h (I x 2) per layer and keeps the 2 bf16 normed outputs
    h, i, q = 5120, 17408, 5120
    per_layer = (5 * h + q + i) * 4 + i * 2 - 2 * h * 2
    assert peaks["hearth"] - peaks["fused"] == pytest.approx(40 * 4096 * per_layer / finetune.GIB, rel=1e-9)


@pytest.mark.parametrize("kwargs, needle", [({"tokens": 0}, "tokens"), ({"checkpointed": 41}, "checkpointed")])
def test_estimate_names_a_bad_argument(kwargs, needle):
    args = {"tokens": 4096, "checkpointed": 0, **kwargs}
    with pytest.raises(ValueError, match=needle):
        finetune.estimate_peak_gib(QWEN3_14B, args["tokens"], args["checkpointed"], weights_bytes=0, trainable_bytes=0,
                                   bytes_per_el=2, patched=True)


def test_packed_rows_on_sdpa_are_planned_with_their_mask_and_the_note_names_the_old_gap():
    """The packed row on SDPA's masked path peaked 14.9% above the estimate it was planned with, which left out the
    k / v repeated to the query heads and SDPA's copy of the mask in every layer. Counted (one masked row), the
    estimate is within the band of every other measured row and not under it; the start-up note still gives the
    old plan's figures beside the measured peak (the varlen row of the same step is inside the fused band above)."""
    setup, tokens, checkpointed, weights_gib, measured, _ = PACKED_SDPA_ROW
    old = estimate(setup, tokens, checkpointed, weights_gib)
    assert old < 0.9 * measured
    est = estimate(setup, tokens, checkpointed, weights_gib, mask_rows=1)
    assert abs(est - measured) / measured <= 0.02 and est >= 0.99 * measured, (est, measured)
    note = finetune.packed_mask_note(True, None, "cuda")
    assert f"{measured:.1f} GiB at peak against a {old:.1f} GiB plan" in note
