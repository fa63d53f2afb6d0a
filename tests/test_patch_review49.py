"""hearth.patch, review 49: defects found by reading patch.py against transformers' own forwards (tiny random
models built from configs, fp32 on the CPU under TRITON_INTERPRET=1; each test failed before its fix)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from hearth import patch

transformers = pytest.importorskip("transformers")

from tests.test_patch import DEVICE, batch, original_rope, tiny_qwen3  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=101)


def _from_config(config_cls, **kw):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config_cls(**SMALL, **kw)).float().to(DEVICE)


@pytest.mark.parametrize("loaded_on", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_attention_is_left_for_a_family_whose_math_sdpa_lacks(family, loaded_on):
    """Gemma2 (attention softcap) and gpt-oss (attention sinks): switched to "hearth", Gemma2's calls reached SDPA
    and raised on softcap, and gpt-oss's reached hearth's kernel with its sinks silently dropped (logits off by
    ~0.16). They are left on the implementation they were loaded with, reported, whichever that is: the decision
    once read the model's `_supports_sdpa` flag, and transformers versions differ on it (a version that loads
    such a family on SDPA got it switched)."""
    if family == "gemma2":
        model = _from_config(transformers.Gemma2Config)
    else:
        model = _from_config(transformers.GptOssConfig, num_local_experts=4, num_experts_per_tok=2)
    # transformers 5.24 refuses to load these on SDPA; an older one (the H200's 5.17) loaded Gemma2 there: the
    # config's attribute is what a version that does so leaves
    model.config._attn_implementation = loaded_on
    ids = torch.randint(0, 101, (1, 9), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    if loaded_on == "eager":
        with torch.no_grad():
            want = model(input_ids=ids).logits
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False, attention=True)
    assert report.count("attention") == 0
    what = "attention softcap" if family == "gemma2" else "attention sinks"
    assert any(k == "attention" and what in r and f"kept on {loaded_on}" in r for (k, _, r) in report.left), report.left
    assert {m.config._attn_implementation for m in model.modules() if hasattr(m, "config")} == {loaded_on}
    if loaded_on == "eager":
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=ids).logits, want)


def test_attention_module_without_a_config_is_left():
    """A *Attention module with no transformers config (torch's nn.MultiheadAttention, say in a projector) matched
    the attention rule and apply(attention=True) died on `None._attn_implementation`, the model half patched."""
    model = tiny_qwen3()
    model.model.pooler = nn.MultiheadAttention(64, 4, batch_first=True, device=DEVICE)
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False, attention=True)
    assert report.replaced["attention"] == {"Qwen3Attention": 2}
    assert ("attention", "MultiheadAttention", "no config whose attention implementation could be switched") in report.left


def _tiny_moe(output_router_logits: bool):
    return _from_config(transformers.Qwen3MoeConfig, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                        output_router_logits=output_router_logits, router_aux_loss_coef=0.5)


def test_moe_router_aux_loss_is_not_dropped():
    """Qwen3-MoE (Mixtral, ...) adds router_aux_loss_coef x the load-balancing loss when output_router_logits is
    on; the fused loss replaced the whole forward and dropped it (5.61 -> 4.60 here) while the report, which the
    memory plan reads, said the loss was fused. On in the config: the loss is left (reported); asked for in a
    call: that call runs the model's own forward."""
    ids, labels = batch()
    ids, labels = ids % 101, torch.where(labels < 0, labels, labels % 101)
    ref, model = _tiny_moe(True), _tiny_moe(True)
    report = patch.apply(model, norm=False, rope=False, mlp=False)
    assert report.count("loss") == 0
    assert any(k == "loss" and "output_router_logits" in r for (k, _, r) in report.left)
    with torch.no_grad(), original_rope():
        want = ref(input_ids=ids, labels=labels)
    with torch.no_grad():
        got = model(input_ids=ids, labels=labels)
    assert want.aux_loss is not None
    torch.testing.assert_close(got.loss, want.loss)

    ref, model = _tiny_moe(False), _tiny_moe(False)
    assert patch.apply(model, norm=False, rope=False, mlp=False).count("loss") == 1
    with torch.no_grad(), original_rope():
        want = ref(input_ids=ids, labels=labels, output_router_logits=True)
    with torch.no_grad():
        got = model(input_ids=ids, labels=labels, output_router_logits=True)
    torch.testing.assert_close(got.loss, want.loss)
    torch.testing.assert_close(got.aux_loss, want.aux_loss)


def test_loss_patched_model_deep_copies_and_pickles_with_its_copy():
    """The loss wrapper was a closure over the model it patched: a deepcopy (an EMA / reference model) computed its
    loss with the ORIGINAL's decoder and lm_head and sent the gradients there, and torch.save(model) failed to
    pickle. Now the copy's forward is bound to the copy."""
    ids, labels = batch()
    model = tiny_qwen3()
    patch.apply(model)
    with torch.no_grad():
        base = model(input_ids=ids, labels=labels).loss
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for twin in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        assert twin.forward.model is twin and twin.forward.decoder is twin.model and twin.forward.head is twin.lm_head
        with torch.no_grad():
            torch.testing.assert_close(twin(input_ids=ids, labels=labels).loss, base)
            twin.lm_head.weight.mul_(0.5)
            assert not torch.allclose(twin(input_ids=ids, labels=labels).loss, base)
            torch.testing.assert_close(model(input_ids=ids, labels=labels).loss, base)  # the original untouched
        model.zero_grad(set_to_none=True)
        twin(input_ids=ids, labels=labels).loss.backward()
        assert twin.lm_head.weight.grad is not None
        assert all(p.grad is None for p in model.parameters())
    # transformers' Trainer reads the forward's signature (columns to keep, loss kwargs)
    names = list(__import__("inspect").signature(model.forward).parameters)
    assert names[:2] == ["input_ids", "attention_mask"] and "labels" in names and "kwargs" in names


def test_attention_position_bias_goes_to_sdpa():
    """An additive score bias passed to the attention function (Inkling's relative position_bias, which transformers'
    SDPA function adds) was dropped by the "hearth" function's kernel path: silently different attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=gen).to(DEVICE) for s in ((1, 4, 7, 16), (1, 2, 7, 16), (1, 2, 7, 16)))
    bias = torch.randn(1, 4, 7, 7, generator=gen).to(DEVICE)
    want = sdpa_attention_forward(module, q, k, v, None, scaling=0.25, position_bias=bias)[0]
    got = patch.hearth_attention_forward(module, q, k, v, None, scaling=0.25, position_bias=bias)[0]
    torch.testing.assert_close(got, want)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_attention_is_left_on_every_layer_that_shares_a_config_with_a_layer_with_sinks():
    """MiMo-V2-Flash: its sliding-window layers have sinks, its full-attention layers none, and all of them read
    one config's _attn_implementation. The rule was decided per module: the sink layers were reported left, the
    full layers switched the shared config to "hearth" (report: switched AND left), and the sink layers then ran
    on SDPA with their sinks dropped (logits off by ~0.15). The decision is now per config."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("mimo_v2_flash", **SMALL, v_head_dim=16, sliding_window=4,
                                               layer_types=["sliding_attention", "full_attention"])
    model = transformers.AutoModelForCausalLM.from_config(config).float().to(DEVICE)
    assert model.config._attn_implementation == "eager"
    ids = torch.randint(0, 101, (1, 9), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    want = _logits(model, ids)
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False, attention=True)
    assert report.count("attention") == 0, report.replaced
    left = {r: n for (k, _, r), n in report.left.items() if k == "attention"}
    assert left == {"attention sinks (MiMoV2FlashAttention.sinks), which neither hearth's attention nor SDPA "
                    "computes; kept on eager": 2}, left
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(_logits(model, ids), want)


def test_attention_with_per_token_sinks_is_left():
    """Inkling-2 computes its sinks per token (sink_proj, passed as `sinks=`): the module has no `sinks` tensor,
    so the rule switched it, and the calls (with a position_bias) went to SDPA, which ignores sinks: logits off by
    ~0.07, nothing reported. Before the rule read the config and module, the model's _supports_sdpa=False left
    it."""
    pytest.importorskip("transformers.models.inkling2", reason="a transformers without Inkling-2 (5.17 has none)")
    from transformers.models.inkling2 import configuration_inkling2, modeling_inkling2

    config = configuration_inkling2.Inkling2TextConfig(
        vocab_size=101, unpadded_vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
        sliding_window_size=4, d_rel=4, rel_extent=16, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_layers_per_attn_res_block=1, eos_token_id=None,
        layer_types=["hybrid_sliding", "hybrid"])
    torch.manual_seed(0)
    model = modeling_inkling2.Inkling2ForCausalLM(config).float().to(DEVICE)
    ids = torch.randint(0, 101, (1, 9), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    want = _logits(model, ids)
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False, attention=True)
    assert report.count("attention") == 0, report.replaced
    assert any(k == "attention" and "attention sinks" in r and "sink_proj" in r for (k, _, r) in report.left), \
        report.left
    torch.testing.assert_close(_logits(model, ids), want)


@pytest.mark.parametrize("key", ["s_aux", "sinks"])
def test_sinks_reaching_the_hearth_function_raise_instead_of_being_dropped(key):
    """The "hearth" function's kernels and its SDPA fallback both ignore attention sinks (gpt-oss's s_aux,
    Inkling's sinks): a family the rule above misses would train on silently different attention. They raise,
    naming the argument; None (a layer without sinks) is served as before."""
    module = nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=gen).to(DEVICE) for s in ((1, 4, 7, 16), (1, 2, 7, 16), (1, 2, 7, 16)))
    with pytest.raises(ValueError, match=rf"^{key}: attention sinks reached hearth's attention function"):
        patch.hearth_attention_forward(module, q, k, v, None, scaling=0.25, **{key: torch.zeros(4)})
    out, _ = patch.hearth_attention_forward(module, q, k, v, None, scaling=0.25, **{key: None})
    assert out.shape == (1, 7, 4, 16)
