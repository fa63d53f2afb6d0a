"""hearth.patch, review 75: config terms of a family's causal LM loss that the fused loss (plain cross entropy of
decoder output @ lm_head.weight, optionally final_logit_softcapping) does not compute were dropped: Falcon-H1's
lm_head_multiplier (logits = lm_head(h) * multiplier), Bamba's z_loss_coefficient (loss + c * mean(lse^2)) and
RecurrentGemma's logits_soft_cap (on by default: 30). The loss is now left, with the config key as the reason.
Tiny random models (lm_head scaled up so that the logits are not all near zero), fp32 on the CPU under
TRITON_INTERPRET=1; the tolerance is tests.test_patch.TOL (fp32 against fp32)."""

from __future__ import annotations

import pytest
import torch

from hearth import patch

transformers = pytest.importorskip("transformers")

from tests.test_patch import DEVICE, TOL, batch  # noqa: E402

COMMON = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, vocab_size=257)
FAMILIES = {
    "lm_head_multiplier": ("FalconH1Config", dict(lm_head_multiplier=0.25, mamba_d_ssm=64, mamba_n_heads=4,
                                                  mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
                                                  mamba_chunk_size=8)),
    "z_loss_coefficient": ("BambaConfig", dict(z_loss_coefficient=0.1, mamba_n_heads=4, mamba_d_head=32,
                                               mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8)),
    "logits_soft_cap": ("RecurrentGemmaConfig", dict(num_hidden_layers=2, num_key_value_heads=1, lru_width=64,
                                                     attention_window_size=8, logits_soft_cap=2.0)),
}


def _model(config_name, extra):
    config = getattr(transformers, config_name)(**{**COMMON, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().to(DEVICE)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)
    return model


@pytest.mark.parametrize("key", FAMILIES)
def test_a_loss_term_the_fused_loss_lacks_keeps_the_models_loss(key):
    ids, labels = batch()
    ref, model = _model(*FAMILIES[key]), _model(*FAMILIES[key])
    report = patch.apply(model, attention=False)
    assert report.count("loss") == 0
    assert any(kind == "loss" and key in why for kind, _cls, why in report.left)
    with torch.no_grad():
        want = ref(input_ids=ids, labels=labels, use_cache=False).loss
        got = model(input_ids=ids, labels=labels, use_cache=False).loss
    torch.testing.assert_close(got, want, **TOL)
