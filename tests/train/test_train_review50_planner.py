"""Review 50, the memory plan under parallel = "fsdp": per rank it counted 1/N of the weights and LoRA state and
nothing else, as if FSDP never held an unsharded parameter. FSDP2 (torch.distributed.fsdp.fully_shard, as
hearth.train.distributed.wrap applies it) holds, on every rank:

  - the root group (every parameter outside the decoder layers: embeddings, final norm, lm_head) whole from the
    forward's start to the end of the backward: the root keeps its parameters unsharded after the forward
    (reshard_after_forward defaults to False for the root);
  - decoder layers in flight: a layer's unsharded parameters while it computes, plus one all-gather buffer of a
    whole layer (forward: this layer's, kept until the next layer's copy-in; backward: the previous layer's,
    prefetched). Two layers at the last layer's backward; one at the loss's backward (the root's pre-backward
    prefetches the last layer).

CPU tests against hand computations for the tiny Qwen3 of tests/train/tiny.py."""

from __future__ import annotations

import pytest
import torch

from hearth.train import distributed as D
from hearth.train import finetune
from tests.train.finetune_spies import spy_on_planner
from tests.train.tiny import run_config, tiny_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

GIB = finetune.GIB
# tiny_config: hidden 64, 2 layers, 4 query heads and 2 kv heads of 16, intermediate 96
H, L, Q, K, I = 64, 2, 4 * 16, 2 * 16, 96


def layer_params(rank: int) -> int:
    """One decoder layer by hand: the 7 projections, 4 norms (input, post-attention, q_norm, k_norm: head_dim each),
    and LoRA A (r x in) + B (out x r) on each of the 7 projections."""
    shapes = [(H, Q), (H, K), (H, K), (Q, H), (H, I), (H, I), (I, H)]  # q k v o gate up down as (in, out)
    base = sum(a * b for a, b in shapes) + H + H + 16 + 16
    return base + rank * sum(a + b for a, b in shapes)


def root_params(vocab: int, tied: bool) -> int:
    """Embeddings, the final norm and (untied) lm_head."""
    return vocab * H + H + (0 if tied else vocab * H)


def tiny_peft(vocab: int, tied: bool = False):
    cfg = tiny_config(vocab)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), tie_word_embeddings=tied, **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return config, finetune.add_lora(model, rank=4, alpha=8.0)


@pytest.mark.parametrize("tied", [False, True])
def test_fsdp_gathered_bytes_are_the_root_and_the_largest_layer(tied):
    _, model = tiny_peft(300, tied)
    assert layer_params(4) == 34592 and root_params(300, tied) == (19264 if tied else 38464)
    got = D.fsdp_gathered_bytes(model, bytes_per_el=2)  # gathered in the compute dtype (bf16 on CUDA)
    assert got == {"root": 2 * root_params(300, tied), "layer": 2 * layer_params(4)}


def test_the_estimate_counts_the_root_whole_and_two_layers_at_a_layer_s_backward():
    """Hand computation of estimate_peak_gib for the tiny shape, 100 tokens, full checkpointing, hearth's loss (the
    layer's backward sets the peak), fp32 (b = 4), weights and LoRA state as FSDP on 2 ranks keeps them."""
    config, _ = tiny_peft(300)
    b, tokens = 4, 100
    weights = (L * layer_params(0) + root_params(300, False)) * b // 2
    lora = L * (layer_params(4) - layer_params(0)) * 4 // 2
    root, layer = root_params(300, False) * b, layer_params(4) * b
    # LoRA in the base dtype (fp32 here): A = (2H + 3Q + 3K + 2I + 2H + I) x b, B = (H + 3I) x b, loss = H x b
    act = (2 * H + 3 * Q + 3 * K + 2 * I + 2 * H + I) * b
    backward = (H + 3 * I) * b
    assert act == 3328 and backward == 1408
    per_token = L * H * b + max(H * b, act + backward)  # c = L: each layer keeps its input
    want = (weights + 3 * lora + finetune.FIXED_BYTES + root + 2 * layer + tokens * per_token) / GIB
    got = finetune.estimate_peak_gib(config, tokens, L, weights_bytes=weights, trainable_bytes=lora, bytes_per_el=b,
                                     patched=True, fsdp_root_bytes=root, fsdp_layer_bytes=layer)
    assert got == pytest.approx(want, rel=1e-12)
    plain = finetune.estimate_peak_gib(config, tokens, L, weights_bytes=weights, trainable_bytes=lora,
                                       bytes_per_el=b, patched=True)
    assert (got - plain) * GIB == pytest.approx(root + 2 * layer)


def test_at_the_loss_s_backward_one_layer_is_in_flight():
    """HF's unfused loss (V x (2b + 8) bytes per token) sets the peak at the start of the backward: the root whole and
    the last layer's all-gather, which the root's pre-backward prefetches."""
    config, _ = tiny_peft(300)
    b, tokens = 4, 1000
    root, layer = root_params(300, False) * b, layer_params(4) * b
    kw = dict(weights_bytes=10**6, trainable_bytes=10**5, bytes_per_el=b, patched=False)
    assert 300 * (2 * b + 8) * tokens > ((H + 3 * I) * b * tokens + 2 * layer)  # the loss branch is the larger
    plain = finetune.estimate_peak_gib(config, tokens, 0, **kw)
    got = finetune.estimate_peak_gib(config, tokens, 0, fsdp_root_bytes=root, fsdp_layer_bytes=layer, **kw)
    assert (got - plain) * GIB == pytest.approx(root + layer)


def test_the_plan_says_what_fsdp_costs():
    config, _ = tiny_peft(300)
    root, layer = 3 * GIB // 2, GIB // 2
    plan = finetune.plan_checkpointing(config, 100, weights_bytes=GIB, trainable_bytes=0, bytes_per_el=2,
                                       budget_gib=40.0, patched=True, fsdp_root_bytes=root, fsdp_layer_bytes=layer)
    text = " ".join(plan.reason.split())
    assert "FSDP" in text and "1.50 GiB" in text and "0.50 GiB" in text and "2 decoder layers" in text, text
    assert plan.estimate_gib > (GIB + finetune.FIXED_BYTES + root + 2 * layer) / GIB


def test_hearth_train_under_fsdp_plans_with_the_gathered_parameters(tmp_path, corpus, base, tok, monkeypatch):
    """What `hearth train --parallel fsdp` hands the planner on each of 2 ranks (the launch faked: the run stops
    after planning, before anything is sharded)."""
    calls = spy_on_planner(monkeypatch)

    class Planned(Exception):
        pass

    def stop(model, plan):
        calls.append(plan)
        raise Planned

    monkeypatch.setattr(finetune, "apply_checkpointing", stop)
    monkeypatch.setattr(D, "setup", lambda mode: D.Dist(mode, 0, 2, 0, torch.device("cpu"), False))
    c = run_config(corpus, base, tmp_path / "o", max_steps=1, memory_budget_gib=50.0, parallel="fsdp", grad_accum=2)
    with pytest.raises(Planned):
        finetune.train_model(c)
    kw, plan = calls
    vocab = len(tok)
    b = 4  # fp32 on the CPU
    assert kw["weights_bytes"] == (L * layer_params(4) + root_params(vocab, False)) * b // 2
    assert kw["trainable_bytes"] == L * (layer_params(4) - layer_params(0)) * 4 // 2
    assert kw["fsdp_root_bytes"] == root_params(vocab, False) * b
    assert kw["fsdp_layer_bytes"] == layer_params(4) * b
    assert "FSDP" in plan.reason


def test_one_process_and_ddp_plan_without_gathered_parameters(tmp_path, corpus, base, monkeypatch):
    calls = spy_on_planner(monkeypatch)
    finetune.run(run_config(corpus, base, tmp_path / "o", max_steps=1, memory_budget_gib=50.0))
    (kw,) = calls
    assert not kw.get("fsdp_root_bytes") and not kw.get("fsdp_layer_bytes")
