"""hearth.patch.apply on a tiny random Qwen3 (built from a config, no download), fp32 on the CPU under
TRITON_INTERPRET=1: loss and every gradient match the unpatched model, with and without peft LoRA;
each replacement kind is in place and in use; an unknown architecture is reported as left alone."""

from __future__ import annotations

import importlib
import contextlib

import pytest
import torch
from torch import nn

from hearth import patch
from hearth.nn import RMSNorm, SwiGLUMLP

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TOL = dict(rtol=1e-4, atol=1e-5)  # fp32 against fp32: only summation order differs
# the GPU when there is one (the kernels refuse CPU tensors outside the interpreter), else the CPU
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_qwen3(seed: int = 0):
    cfg = transformers.Qwen3Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, vocab_size=257, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg).float().to(DEVICE)


@contextlib.contextmanager
def original_rope():
    """The rope replacement is a module global (process-wide): references run with HF's own function."""
    from transformers.models.qwen3 import modeling_qwen3 as mq

    current = mq.apply_rotary_pos_emb
    mq.apply_rotary_pos_emb = getattr(current, "__hearth_original__", current)
    try:
        yield
    finally:
        mq.apply_rotary_pos_emb = current


def batch():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 257, (2, 11), generator=gen)
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt that is not trained
    labels[1, -2:] = -100
    return ids.to(DEVICE), labels.to(DEVICE)


def loss_and_grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return out, grads


def with_lora(model):
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0, init_lora_weights=False)
    return peft.get_peft_model(model, cfg)  # init_lora_weights=False: B != 0, so the LoRA branch matters


def compare(ref_model, patched_model, ids, labels):
    with original_rope():
        ref_out, ref_grads = loss_and_grads(ref_model, ids, labels)
    out, grads = loss_and_grads(patched_model, ids, labels)
    torch.testing.assert_close(out.loss.float(), ref_out.loss.float(), **TOL)
    assert out.logits is None  # the [tokens, vocab] logits never existed
    assert grads.keys() == ref_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL, msg=lambda m: f"{name}: {m}")


@pytest.fixture(scope="module")
def plain():
    ref, model = tiny_qwen3(), tiny_qwen3()
    report = patch.apply(model)
    return ref, model, report


def test_every_kind_is_replaced_and_reported(plain):
    _, model, report = plain
    assert report.replaced["norm"] == {"Qwen3RMSNorm": 9}  # 2 layers x (input, post, q_norm, k_norm) + final
    assert report.replaced["mlp"] == {"Qwen3MLP": 2}
    assert report.replaced["rope"] == {"Qwen3Attention": 2}
    assert report.replaced["loss"] == {"Qwen3ForCausalLM": 1}
    assert report.left == {}
    layer = model.model.layers[0]
    assert type(layer.mlp) is SwiGLUMLP and layer.mlp._fusable()  # plain Linear: the one-node fused MLP
    assert all(type(m) is RMSNorm for m in (layer.input_layernorm, layer.self_attn.q_norm, model.model.norm))
    from transformers.models.qwen3 import modeling_qwen3 as mq

    assert mq.apply_rotary_pos_emb.__hearth_original__ is not None
    assert "norm=9" in str(report)


def test_patched_loss_and_grads_match_unpatched(plain):
    ref, model, _ = plain
    compare(ref, model, *batch())


def test_rope_replacement_matches_and_falls_back():
    from transformers.models.qwen3 import modeling_qwen3 as mq

    patch.apply(tiny_qwen3())
    fn = mq.apply_rotary_pos_emb
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 7, 16, generator=gen).to(DEVICE), torch.randn(2, 2, 7, 16, generator=gen).to(DEVICE)
    ang = torch.randn(2, 7, 8, generator=gen).to(DEVICE)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    for got, want in zip(fn(q, k, cos, sin), fn.__hearth_original__(q, k, cos, sin)):
        torch.testing.assert_close(got, want, **TOL)
    # [B, T, H, D] layout (unsqueeze_dim=2) is not hearth's: the original runs, results still right
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    for got, want in zip(fn(qt, kt, cos, sin, unsqueeze_dim=2), fn.__hearth_original__(qt, kt, cos, sin, unsqueeze_dim=2)):
        torch.testing.assert_close(got, want, **TOL)


def test_patch_then_lora_matches_lora():
    ids, labels = batch()
    ref = with_lora(tiny_qwen3())
    model = tiny_qwen3()
    report = patch.apply(model)  # before peft: peft then wraps the projections inside SwiGLUMLP
    model = with_lora(model)
    model.load_state_dict(ref.state_dict())
    mlp = model.base_model.model.model.layers[0].mlp
    assert type(mlp) is SwiGLUMLP and not mlp._fusable()  # LoRA layers are called as modules
    assert report.count("mlp") == 2
    compare(ref, model, ids, labels)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_lora_then_patch_matches_lora():
    ids, labels = batch()
    ref = with_lora(tiny_qwen3())
    model = with_lora(tiny_qwen3())
    model.load_state_dict(ref.state_dict())
    report = patch.apply(model)  # after peft: the PeftModel is walked, its inner causal LM gets the loss
    assert report.count("loss") == 1 and report.count("mlp") == 2 and report.count("norm") == 9
    compare(ref, model, ids, labels)


def test_opt_in_attention_matches_sdpa(monkeypatch):
    hka = importlib.import_module("hearth.kernels.attention")

    calls = []
    kernel = hka.attention
    monkeypatch.setattr(hka, "attention", lambda *a, **k: calls.append(k) or kernel(*a, **k))
    ids, labels = batch()
    ref, model = tiny_qwen3(), tiny_qwen3()
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False, attention=True)
    assert report.replaced["attention"] == {"Qwen3Attention": 2}
    assert model.config._attn_implementation == "hearth" and ref.config._attn_implementation == "sdpa"
    assert len(calls) == 1  # the probe against SDPA
    calls.clear()
    with original_rope():
        ref_out, ref_grads = loss_and_grads(ref, ids, labels)
        out, grads = loss_and_grads(model, ids, labels)
    torch.testing.assert_close(out.loss, ref_out.loss, **TOL)
    assert len(calls) == 2 and all(k["causal"] for k in calls)  # hearth's kernel ran in both layers (no mask)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL, msg=lambda m: f"{name}: {m}")
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: a real mask, so the SDPA fallback runs, still matching
    calls.clear()
    with original_rope(), torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits,
                                   ref(input_ids=ids, attention_mask=mask).logits, **TOL)
    assert calls == []


def test_attention_by_device_default(monkeypatch):
    """attention=None (the default) switches hearth's attention in only where its fused backward serves the module
    (Hopper, bf16/fp16, head_dim 64/128): this fp32 d16 model stays on SDPA, on any device, and the report says
    nothing about it; where fused_backward_serves says yes, the default patches as attention=True does; anything
    but a bool or None is refused, naming the argument."""
    hka = importlib.import_module("hearth.kernels.attention")
    model = tiny_qwen3()
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False)
    assert report.count("attention") == 0 and model.config._attn_implementation == "sdpa"
    assert not [key for key in report.left if key[0] == "attention"]
    asked = []
    monkeypatch.setattr(hka, "fused_backward_serves", lambda *a: asked.append(a) or True)
    model = tiny_qwen3()
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False)
    assert report.replaced["attention"] == {"Qwen3Attention": 2} and model.config._attn_implementation == "hearth"
    device, dtype, head_dim = asked[0]  # the module's own device, dtype and head_dim
    assert (device.type, dtype, head_dim) == (DEVICE.type, torch.float32, 16)
    assert patch.apply(tiny_qwen3(), attention=False).count("attention") == 0
    with pytest.raises(TypeError, match="attention must be True, False or None"):
        patch.apply(tiny_qwen3(), attention="auto")


def test_fused_backward_serves_rule(monkeypatch):
    """The by-device rule is backward_kernel's fused pick: Hopper, bf16/fp16, head_dim 64 or 128 (not a padded 80),
    not deterministic mode; never off CUDA."""
    hka = importlib.import_module("hearth.kernels.attention")
    cpu = torch.device("cpu")
    assert not hka.fused_backward_serves(cpu, torch.bfloat16, 128)
    monkeypatch.setattr(hka, "device_capability", lambda device: (9, 0))
    assert hka.fused_backward_serves(cpu, torch.bfloat16, 128) and hka.fused_backward_serves(cpu, torch.float16, 64)
    assert not hka.fused_backward_serves(cpu, torch.float32, 128) and not hka.fused_backward_serves(cpu, torch.bfloat16, 80)
    monkeypatch.setattr(hka, "device_capability", lambda device: (8, 0))
    assert not hka.fused_backward_serves(cpu, torch.bfloat16, 128)
    monkeypatch.setattr(hka, "device_capability", lambda device: (9, 0))
    monkeypatch.setenv("HEARTH_ATTN_GLUON_BWD_FUSED", "0")
    assert not hka.fused_backward_serves(cpu, torch.bfloat16, 128)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_attention_by_device_follows_the_gpu():
    """On the GPU the default patches a bf16 head_dim-128 model's attention exactly when the fused backward serves
    this GPU (Hopper), and the patched model's loss matches SDPA's within bf16 noise."""
    hka = importlib.import_module("hearth.kernels.attention")
    cfg = transformers.Qwen3Config(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=128, intermediate_size=96, vocab_size=257, attn_implementation="sdpa")
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).to(DEVICE, torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(DEVICE, torch.bfloat16)
    model.load_state_dict(ref.state_dict())
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False)
    serves = torch.cuda.get_device_capability()[0] == 9
    assert serves == hka.fused_backward_serves(DEVICE, torch.bfloat16, 128)
    assert report.count("attention") == (2 if serves else 0)
    ids = torch.randint(0, 257, (2, 300), device=DEVICE)
    with torch.no_grad():
        a, b = ref(input_ids=ids, labels=ids).loss.float(), model(input_ids=ids, labels=ids).loss.float()
    assert abs(a - b) < 2e-2 * abs(a)


def test_disabled_kinds_are_left_and_reported():
    model = tiny_qwen3()
    report = patch.apply(model, norm=False, mlp=False, rope=True, loss=False)
    assert report.count("norm") == report.count("mlp") == report.count("loss") == 0
    assert report.left[("norm", "Qwen3RMSNorm", "disabled by the caller")] == 9
    assert type(model.model.layers[0].mlp).__name__ == "Qwen3MLP"
    ids, _ = batch()
    assert model(input_ids=ids).logits.shape == (2, 11, 257)  # without labels: the original forward


def test_lookalike_norm_with_other_math_is_left_alone():
    class OffsetRMSNorm(nn.Module):  # Gemma-style: scales by (1 + weight), so hearth's rms_norm differs
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(n))
            self.eps = 1e-6

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)

    holder = nn.Sequential(OffsetRMSNorm(8)).to(DEVICE)
    report = patch.apply(holder)
    assert type(holder[0]) is OffsetRMSNorm
    ((kind, cls, reason),) = report.left
    assert (kind, cls) == ("norm", "OffsetRMSNorm") and "different math" in reason


def test_bf16_mlp_probe_judges_against_a_high_precision_reference():
    """The H200 LoRA run left Qwen3MLP unpatched: its probe compared hearth's bf16 result with HF's bf16
    result per element, and two correct sums of thousands of bf16 products differ by more than any fixed
    tolerance. The probe now measures both against the module run in fp32 (the 2x rule): a wide bf16 MLP is
    replaced, every time (the verdict must not depend on the call), and a look-alike with other math is not."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=2048)
    torch.manual_seed(0)
    verdicts = set()
    for _ in range(3):
        holder = nn.Sequential(Qwen3MLP(cfg)).to(DEVICE, torch.bfloat16)
        with torch.no_grad():  # weights large enough that bf16 rounding of g, u and h dominates
            for p in holder.parameters():
                p.mul_(8.0)
        report = patch.apply(holder, norm=False, rope=False, loss=False)
        verdicts.add((type(holder[0]).__name__, str(report)))
    assert len(verdicts) == 1, verdicts
    ((cls, text),) = verdicts
    assert cls == "SwiGLUMLP", text

    class GeluMLP(Qwen3MLP):  # same structure, other activation hidden inside forward
        def forward(self, x):
            return self.down_proj(nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))

    holder = nn.Sequential(GeluMLP(cfg)).to(DEVICE, torch.bfloat16)
    report = patch.apply(holder, norm=False, rope=False, loss=False)
    assert type(holder[0]) is GeluMLP
    assert any(kind == "mlp" and "different math" in reason for (kind, _, reason) in report.left), str(report)


def test_unknown_architecture_is_reported_as_left_alone():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=97, n_positions=32)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()  # eval: no dropout
    ids = torch.randint(0, 97, (1, 9))
    before = model(input_ids=ids, labels=ids).loss
    report = patch.apply(model)
    assert all(report.count(k) == 0 for k in patch.KINDS)
    left = {(k, c): r for (k, c, r) in report.left}
    assert left[("mlp", "GPT2MLP")] == "no gate_proj / up_proj / down_proj"
    assert "no apply_rotary_pos_emb" in left[("rope", "GPT2Attention")]
    assert left[("norm", "LayerNorm")] == "no hearth rule for this class"
    assert left[("loss", "GPT2LMHeadModel")] == "no hearth rule for this class"
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, before)  # untouched and still working


def test_apply_rejects_non_modules():
    with pytest.raises(TypeError, match="model"):
        patch.apply("Qwen/Qwen3-14B")


def test_cpu_without_the_interpreter_patches_nothing_unprobed(monkeypatch):
    """On a CPU without TRITON_INTERPRET the norm / rope / MLP probes fail (the kernels refuse CPU tensors)
    and leave those modules; the loss has no probe and was patched anyway, so step 0 died. It must be left
    too, with a reason that says how to run on the CPU."""
    import hearth.kernels._common as common

    monkeypatch.setattr(common, "interpret_mode", lambda: False)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, vocab_size=257)).float()  # on the CPU
    with original_rope():
        report = patch.apply(model)
        assert report.count("loss") == 0 and report.count("norm") == 0 and report.count("mlp") == 0
        left = {(k, c): r for (k, c, r) in report.left}
        assert "TRITON_INTERPRET=1" in left[("loss", "Qwen3ForCausalLM")]
        ids = torch.randint(0, 257, (1, 6))
        assert torch.isfinite(model(input_ids=ids, labels=ids).loss)  # and training can start
