"""hearth.patch, review 75: the fused loss is transformers' causal LM loss (labels shifted by one, mean over the
tokens not -100, or a sum over num_items_in_batch), so it may only replace a model whose forward computes exactly
that: through self.loss_function, and that being transformers' ForCausalLMLoss. The decoders of encoder-decoder
families (BartForCausalLM, Whisper, TrOCR, Marian, ...) compute CrossEntropyLoss on UNshifted labels, and a
model given its own loss_function computes that; the fused loss replaced both. Tiny random models, fp32 on the
CPU under TRITON_INTERPRET=1; the tolerance is tests.test_patch.TOL (fp32 against fp32)."""

from __future__ import annotations

import pytest
import torch

from hearth import patch

transformers = pytest.importorskip("transformers")

from tests.test_patch import DEVICE, TOL, batch, tiny_qwen3  # noqa: E402


def _bart_decoder():
    config = transformers.BartConfig(d_model=64, decoder_layers=1, encoder_layers=1, decoder_attention_heads=4,
                                     encoder_attention_heads=4, decoder_ffn_dim=96, encoder_ffn_dim=96,
                                     vocab_size=257, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(0)
    return transformers.BartForCausalLM(config).float().to(DEVICE)


def _losses(ref, model, ids, labels):
    with torch.no_grad():
        return ref(input_ids=ids, labels=labels).loss, model(input_ids=ids, labels=labels).loss


def test_a_decoder_whose_loss_is_not_shifted_keeps_its_loss():
    """BartForCausalLM: CrossEntropyLoss(logits, labels) without the shift; the fused loss shifted them."""
    ids, labels = batch()
    ref, model = _bart_decoder(), _bart_decoder()
    report = patch.apply(model, attention=False)
    assert report.count("loss") == 0
    assert any(kind == "loss" and cls == "BartForCausalLM" and "loss_function" in why
               for kind, cls, why in report.left)
    torch.testing.assert_close(*_losses(ref, model, ids, labels)[::-1], **TOL)


def test_a_model_given_its_own_loss_function_keeps_it():
    """model.loss_function set by the user (transformers' setter): the fused loss would train another loss."""
    ids, labels = batch()

    def weighted(logits, labels, vocab_size, **kwargs):  # e.g. a re-weighted causal LM loss
        return 2.0 * transformers.loss.loss_utils.ForCausalLMLoss(logits, labels, vocab_size, **kwargs)

    ref, model = tiny_qwen3(), tiny_qwen3()
    for m in (ref, model):
        m.loss_function = weighted
    report = patch.apply(model)
    assert report.count("loss") == 0
    torch.testing.assert_close(*_losses(ref, model, ids, labels)[::-1], **TOL)
    assert patch.apply(tiny_qwen3()).count("loss") == 1  # the default loss function keeps the fused loss
