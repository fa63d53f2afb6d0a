"""The planner's per-layer activation term with hearth's fused LoRA nodes (fused_lora=True): no fp32 copies of
the projection inputs and no h, but their bf16 inputs; without the keyword peft's fp32 copies are counted."""

from types import SimpleNamespace

from hearth.train.finetune import layer_activation_bytes_per_token

QWEN3_14B = SimpleNamespace(hidden_size=5120, intermediate_size=17408, num_attention_heads=40, num_key_value_heads=8,
                            head_dim=128)


def test_fused_lora_drops_the_fp32_input_copies_and_h():
    h, i, q, k = 5120, 17408, 40 * 128, 8 * 128
    old = layer_activation_bytes_per_token(QWEN3_14B, patched=True, bytes_per_el=2)
    # the norms' inputs, q/k-norm inputs, SDPA's q, k, v and output, g, u and h; peft's fp32 input copies
    assert old == (2 * h + 3 * q + 3 * k + 3 * i) * 2 + (5 * h + q + i) * 4 == 354_304
    fused = layer_activation_bytes_per_token(QWEN3_14B, patched=True, bytes_per_el=2, fused_lora=True)
    # no fp32 copies and no h; the nodes keep their bf16 inputs instead (the two normed outputs: + 2H)
    assert fused == (4 * h + 3 * q + 3 * k + 2 * i) * 2 == 147_456
    # an fp32 model has no fp32 copies to drop (peft's LoRA keeps the normed outputs and h themselves): only h goes
    assert (layer_activation_bytes_per_token(QWEN3_14B, patched=True, bytes_per_el=4)
            - layer_activation_bytes_per_token(QWEN3_14B, patched=True, bytes_per_el=4, fused_lora=True)) == i * 4


def test_patch_knobs_follow_the_patch_report():
    """The planner's knobs come from what hearth.patch.apply replaced: one derivation for `hearth train`,
    lora_e2e.py and qlora_e2e.py."""
    from hearth.train.finetune import patch_knobs

    class Report:
        def __init__(self, **counts):
            self.counts = counts

        def count(self, kind):
            return self.counts.get(kind, 0)

    assert patch_knobs(None) == {"patched": False, "fused_mlp": False, "fused_lora": False}
    assert patch_knobs(Report(loss=1, mlp=40)) == {"patched": True, "fused_mlp": True, "fused_lora": False}
    assert patch_knobs(Report(loss=1, mlp=40, lora=280)) == {"patched": True, "fused_mlp": True, "fused_lora": True}
    assert patch_knobs(Report(mlp=40)) == {"patched": False, "fused_mlp": True, "fused_lora": False}  # loss left
    # LoRA dropout in effect: every LoRA layer takes peft's own forward and the MLP keeps h (patch.py), so the
    # fused knobs would under-count what training keeps; without LoRA, dropout changes nothing
    assert patch_knobs(Report(loss=1, mlp=40, lora=280), 0.05) == {"patched": True, "fused_mlp": False,
                                                                  "fused_lora": False}
    assert patch_knobs(Report(loss=1, mlp=40), 0.05) == {"patched": True, "fused_mlp": True, "fused_lora": False}
