"""hearth.patch's "lora" kind and the LoRA-aware MLP on a tiny random Qwen3 under peft (fp32 on the CPU):
patched after get_peft_model, every LoRA projection runs hearth's fused node and loss + LoRA gradients match
unpatched peft; peft still saves, merges and disables the adapter (and hearth falls back when it does); a
replacement with the wrong math is left by its probe; a model without peft gets no "lora" rows."""

from __future__ import annotations

import importlib

import pytest
import torch

from hearth import patch

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from tests.test_patch import DEVICE, LORA_TARGETS, batch, compare, tiny_qwen3, with_lora  # noqa: E402

klora = importlib.import_module("hearth.kernels.lora")
hnn = importlib.import_module("hearth.nn")


@pytest.fixture
def calls(monkeypatch):
    """Counts of calls into the fused nodes: {'linear': n, 'mlp': n}."""
    seen = {"linear": 0, "mlp": 0}
    real_linear, real_mlp = klora.lora_linear, hnn.lora_swiglu_mlp

    def linear(*a, **k):
        seen["linear"] += 1
        return real_linear(*a, **k)

    def mlp(*a, **k):
        seen["mlp"] += 1
        return real_mlp(*a, **k)

    monkeypatch.setattr(klora, "lora_linear", linear)
    monkeypatch.setattr(hnn, "lora_swiglu_mlp", mlp)
    return seen


def _loss(model, ids, labels):
    with torch.no_grad():
        return model(input_ids=ids, labels=labels).loss


def test_lora_then_patch_runs_fused_nodes_and_matches_peft(calls):
    ids, labels = batch()
    ref = with_lora(tiny_qwen3())
    model = with_lora(tiny_qwen3())
    model.load_state_dict(ref.state_dict())
    keys = list(model.state_dict())
    report = patch.apply(model)
    assert report.replaced["lora"] == {"Linear": 14}  # 2 layers x q, k, v, o, gate, up, down
    assert not [row for row in report.left if row[0] == "lora"]
    assert report.count("mlp") == 2
    assert list(model.state_dict()) == keys  # names unchanged: peft saves the same adapter
    calls.update(linear=0, mlp=0)
    compare(ref, model, ids, labels)
    # per layer: q, k, v, o through lora_linear, and the MLP as one LoRA node (gate/up/down not called)
    assert calls == {"linear": 8, "mlp": 2}
    assert "lora" in str(report)


def test_patch_before_peft_still_fuses_the_mlp_and_reports_no_lora(calls):
    ids, labels = batch()
    ref = with_lora(tiny_qwen3())
    model = tiny_qwen3()
    report = patch.apply(model)
    assert report.count("lora") == 0 and report.count("mlp") == 2
    model = with_lora(model)
    model.load_state_dict(ref.state_dict())
    compare(ref, model, ids, labels)
    assert calls == {"linear": 0, "mlp": 2}  # the MLP decides at each call; q/k/v/o stay peft's
    again = patch.apply(model)  # now after peft: the attention projections are routed too
    assert again.count("lora") == 14


def test_model_without_peft_has_no_lora_rows():
    report = patch.apply(tiny_qwen3())
    assert report.count("lora") == 0 and not [row for row in report.left if row[0] == "lora"]


def test_merge_and_disable_fall_back_to_peft(calls, tmp_path):
    ids, labels = batch()
    model = with_lora(tiny_qwen3())
    plain = tiny_qwen3()  # the same base weights (seed 0), no adapter
    patch.apply(model, norm=False, rope=False, loss=False)  # only what this test is about (the interpreter is slow)
    calls.update(linear=0, mlp=0)  # not the probes
    base_loss = _loss(plain, ids, labels)
    lora_loss = _loss(model, ids, labels)
    assert calls == {"linear": 8, "mlp": 2} and not torch.allclose(lora_loss, base_loss)
    calls.update(linear=0, mlp=0)
    with model.disable_adapter():
        torch.testing.assert_close(_loss(model, ids, labels), base_loss, rtol=1e-5, atol=1e-5)
    assert calls == {"linear": 0, "mlp": 0}
    model.merge_adapter()
    torch.testing.assert_close(_loss(model, ids, labels), lora_loss, rtol=1e-5, atol=1e-5)  # not added twice
    assert calls == {"linear": 0, "mlp": 0}
    model.unmerge_adapter()
    torch.testing.assert_close(_loss(model, ids, labels), lora_loss, rtol=1e-5, atol=1e-5)
    assert calls == {"linear": 8, "mlp": 2}
    # peft saves the adapter under its usual names and a fresh peft model loads it to the same loss
    model.save_pretrained(str(tmp_path / "adapter"))
    loaded = peft.PeftModel.from_pretrained(tiny_qwen3(), str(tmp_path / "adapter"))
    torch.testing.assert_close(_loss(loaded, ids, labels), lora_loss, rtol=1e-5, atol=1e-5)
    # a patched layer deep-copies and pickles with its own copy bound to the hearth forward
    import copy
    import io

    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, layer.in_features, device=DEVICE)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for twin in (copy.deepcopy(layer), torch.load(buf, weights_only=False)):
        assert twin.forward.layer is twin
        calls.update(linear=0)
        with torch.no_grad():
            torch.testing.assert_close(twin(x), layer(x))
        assert calls["linear"] == 2
    merged = model.merge_and_unload()
    assert not any(type(m).__module__.startswith("peft.") for m in merged.modules())


def test_bf16_base_with_fp32_adapter_passes_the_probe():
    model = peft.get_peft_model(tiny_qwen3().bfloat16(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.lora_A["default"].weight.dtype == torch.float32  # peft's autocast_adapter_dtype
    before = layer.lora_B["default"].weight.detach().clone()
    report = patch.apply(model, norm=False, rope=False, loss=False)
    assert report.count("lora") == 14, str(report)
    assert torch.equal(layer.lora_B["default"].weight, before)  # the probe's random B was put back (zeros)
    ids, labels = batch()
    assert torch.isfinite(model(input_ids=ids, labels=labels).loss)


@pytest.mark.parametrize("base", ["16bit", "4bit"])
def test_wrong_math_is_left_by_the_probe(monkeypatch, base):
    # peft's default init (B = 0) would hide a wrong LoRA term: the probe draws a random B to see it
    if base == "4bit":
        model = tiny_qwen3_4bit()
    else:
        model = peft.get_peft_model(tiny_qwen3(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))
    real = klora.lora_linear
    monkeypatch.setattr(klora, "lora_linear", lambda x, w, b, a, bb, s, c: real(x, w, b, a, bb, 2 * s, c))
    report = patch.apply(model, mlp=False)
    assert report.count("lora") == 0
    (reason, n), = [(r, n) for (k, _c, r), n in report.left.items() if k == "lora"]
    assert n == 14 and "lora probe: error" in reason
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert "forward" not in vars(layer)  # peft's own forward is kept


def test_dropout_in_training_uses_peft_and_matches(calls):
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.5, init_lora_weights=False)
    model = peft.get_peft_model(tiny_qwen3(), cfg)
    report = patch.apply(model, norm=False, rope=False, loss=False)
    assert report.count("lora") == 14
    ids, labels = batch()
    model.train()
    calls.update(linear=0, mlp=0)
    model(input_ids=ids, labels=labels)
    assert calls == {"linear": 0, "mlp": 0}  # dropout acts in training: peft's path (and its RNG use)
    model.eval()
    model(input_ids=ids, labels=labels)
    assert calls == {"linear": 8, "mlp": 2}


def test_base_compute_is_probed_and_switched_by_a_later_apply(calls):
    """apply(lora_compute="base") on a bf16 base with fp32 adapters: the probe passes (the 2x rule against peft
    in fp32), the loss stays within bf16 noise of peft's, an unknown value is refused, and a later apply can
    switch an already patched model back to the adapter dtype."""
    ref = peft.get_peft_model(tiny_qwen3().bfloat16(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                                                       init_lora_weights=False))
    model = peft.get_peft_model(tiny_qwen3().bfloat16(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                                                         init_lora_weights=False))
    model.load_state_dict(ref.state_dict())
    with pytest.raises(ValueError, match="lora_compute"):
        patch.apply(model, lora_compute="fp8")
    report = patch.apply(model, lora_compute="base")
    assert report.count("lora") == 14 and not [r for r in report.left if r[0] == "lora"], str(report)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    mlp = model.base_model.model.model.layers[0].mlp
    assert layer.forward.compute == "base" and mlp.lora_compute == "base"
    ids, labels = batch()
    want, got = _loss(ref, ids, labels).float(), _loss(model, ids, labels).float()
    assert calls["linear"] > 0 and calls["mlp"] > 0
    assert abs(got - want) <= 2e-2 * abs(want), (got, want)
    patch.apply(model)
    assert layer.forward.compute == "adapter" and mlp.lora_compute == "adapter"


# ------------------------------------------------------------------------------- QLoRA: a 4-bit base
def tiny_qwen3_4bit(seed: int = 0, dtype=torch.float32):
    """tests.test_patch's tiny Qwen3 with every decoder Linear in NF4 (double-quantised absmax), computing in
    `dtype`, as hearth.train.qlora builds a QLoRA model; LoRA (fp32, B != 0) from a fixed seed on top."""
    pytest.importorskip("bitsandbytes")
    from hearth.train import qlora

    config = tiny_qwen3().config
    model = qlora.prepare(qlora.random_4bit(config, dtype=dtype, device=DEVICE, seed=seed))
    torch.manual_seed(seed + 1)
    return with_lora(model)


def test_qlora_then_patch_runs_fused_nodes_on_the_4bit_base_and_matches_peft(calls):
    """peft's Linear4bit layers (NF4, nested absmax) are taken by the "lora" kind and the MLP's LoRA node, the
    report says so, and loss + LoRA gradients match unpatched peft on the same 4-bit model (fp32 compute:
    bitsandbytes and hearth dequantise to the same fp32 weights, so only summation order differs)."""
    ids, labels = batch()
    ref, model = tiny_qwen3_4bit(), tiny_qwen3_4bit()
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert type(layer).__name__ == "Linear4bit" and layer.base_layer.weight.quant_state.nested
    report = patch.apply(model)
    assert report.replaced["lora"] == {"Linear4bit [4-bit base]": 14}, str(report)
    assert report.replaced["mlp"] == {"Qwen3MLP [4-bit base, LoRA node]": 2}, str(report)
    assert not report.left, str(report)
    calls.update(linear=0, mlp=0)
    compare(ref, model, ids, labels)
    assert calls == {"linear": 8, "mlp": 2}  # q, k, v, o and one MLP node per layer
    # the frozen 4-bit base got no gradient; peft's forward still serves a disabled adapter
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)
    calls.update(linear=0, mlp=0)
    with model.disable_adapter(), torch.no_grad():
        model(input_ids=ids, labels=labels)
    assert calls == {"linear": 0, "mlp": 0}


def test_qlora_bf16_compute_passes_the_probe_and_trains():
    ids, labels = batch()
    model = tiny_qwen3_4bit(dtype=torch.bfloat16)
    report = patch.apply(model, norm=False, rope=False, loss=False)
    assert report.count("lora") == 14 and report.count("mlp") == 2, str(report)
    assert not [row for row in report.left if row[0] in ("lora", "mlp")], str(report)
    assert report.replaced["mlp"] == {"Qwen3MLP [4-bit base, LoRA node]": 2}, str(report)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    a = model.base_model.model.model.layers[1].mlp.down_proj.lora_A["default"].weight
    assert torch.isfinite(out.loss) and a.grad is not None and a.grad.dtype == torch.float32


def test_8bit_base_is_left_with_the_reason():
    """peft's Linear8bitLt (an int8 bitsandbytes base) is reported as left, not silently skipped."""
    bnb = pytest.importorskip("bitsandbytes")
    from torch import nn

    holder = nn.Module()
    holder.proj = bnb.nn.Linear8bitLt(64, 32, bias=False, has_fp16_weights=False)
    holder.proj.weight = bnb.nn.Int8Params(torch.randn(32, 64), requires_grad=False, has_fp16_weights=False)
    holder = holder.to(DEVICE)
    holder.is_loaded_in_8bit = True
    model = peft.get_peft_model(holder, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["proj"]))
    assert type(model.base_model.model.proj).__name__ == "Linear8bitLt"
    report = patch.apply(model)
    assert report.count("lora") == 0
    (row,) = [(c, r) for (k, c, r) in report.left if k == "lora"]
    assert row[0] == "Linear8bitLt" and "Linear8bitLt" in row[1] and "4-bit" in row[1], row


def test_probe_reference_of_a_peft_4bit_layer_keeps_its_lora_branch():
    """The probes' fp32 reference of a LoRA layer over a 4-bit base: _dequantized_twin swaps only the module that
    owns the 4-bit weight (base_layer), not the peft layer that shows it through its `weight` property (that
    registered a stray root module and dropped the LoRA branch), and probe inputs take the base's compute dtype
    (bf16), not the first floating parameter's (an fp32 LoRA factor)."""
    model = tiny_qwen3_4bit(dtype=torch.bfloat16)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    twin = patch._dequantized_twin(layer)
    assert type(twin.base_layer) is torch.nn.Linear and twin is not layer
    assert sorted(n for n, _ in twin.named_parameters()) == [
        "base_layer.weight", "lora_A.default.weight", "lora_B.default.weight"]
    x = torch.randn(3, layer.in_features, device=DEVICE).bfloat16()
    a, b = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()
    w = twin.base_layer.weight.double()
    lora = layer.scaling["default"] * (x.double() @ a.t()) @ b.t()
    assert lora.abs().max() > 0.5  # a LoRA term the comparison below would miss if it were dropped
    with torch.no_grad():
        torch.testing.assert_close(twin(x).double(), x.double() @ w.t() + lora, rtol=2e-2, atol=5e-2)
    assert patch._compute_like(model.base_model.model.model.layers[0].mlp).dtype == torch.bfloat16
