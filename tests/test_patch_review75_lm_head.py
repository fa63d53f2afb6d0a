"""hearth.patch, review 75: the fused loss computes cross_entropy(decoder output @ lm_head.weight), so it may only
replace a causal LM whose logits are exactly that. A model with a prediction head between the decoder and the
output Linear (RoBERTa / BERT-style decoders: dense + GELU + LayerNorm, then the Linear that
get_output_embeddings returns) had that transform skipped and trained a different loss. Tiny random models,
fp32 on the CPU under TRITON_INTERPRET=1; the tolerance is tests.test_patch.TOL (fp32 against fp32)."""

from __future__ import annotations

import pytest
import torch

from hearth import patch

transformers = pytest.importorskip("transformers")

from tests.test_patch import DEVICE, TOL, batch, tiny_qwen3  # noqa: E402


def _roberta_decoder():
    config = transformers.RobertaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                        intermediate_size=96, vocab_size=257, is_decoder=True,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.RobertaForCausalLM(config).float().to(DEVICE)


def test_lm_head_transform_is_not_skipped():
    """RobertaForCausalLM's logits are lm_head.decoder(layer_norm(gelu(dense(h)))); the fused loss used h directly
    (5.557 against 5.588 before the fix). The loss is now left, with the reason, and the loss is the model's."""
    ids, labels = batch()
    ref, model = _roberta_decoder(), _roberta_decoder()
    report = patch.apply(model, attention=False)
    assert report.count("loss") == 0
    reasons = [r for (kind, cls, r) in report.left if kind == "loss" and cls == "RobertaForCausalLM"]
    assert reasons and "lm_head.dense" in reasons[0]
    with torch.no_grad():
        want = ref(input_ids=ids, labels=labels).loss
        got = model(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(got, want, **TOL)


def test_plain_and_tied_heads_keep_the_fused_loss():
    """The check must not leave the families it serves: decoder + lm_head, tied to the embeddings or not."""
    for tie in (False, True):
        model = tiny_qwen3()
        if tie:
            model.lm_head.weight = model.model.embed_tokens.weight
        assert patch.apply(model).replaced["loss"] == {"Qwen3ForCausalLM": 1}
