"""Packed rows through hearth's "hearth" attention (hearth.patch.apply(attention=True)): a row of several
examples (hearth.train.batches.collate(pack=True): position ids restarting at 0 and transformers' varlen
kwargs cu_seq_lens_q/k, max_length_q/k) reaches hearth.kernels.attention_varlen, and no [T, T] mask is built.

CPU: a tiny random Qwen3 in fp32 under TRITON_INTERPRET=1 -- the packed row's loss and every weight gradient
equal the examples run one by one and the unpatched SDPA model on the same row (which reads the packing from
the position ids and builds the block-diagonal mask); the kernel calls and mask builds are counted. GPU
(test_gpu_*): a 4-layer Qwen3-14B-shaped model in bf16, a packed row of 8 examples of 200-2000 tokens, loss
and gradients against an fp32 reference under tests/kernels/tolerance.py's rule, SDPA-with-the-mask in bf16
as the baseline."""

from __future__ import annotations

import importlib

import pytest
import torch

from hearth import patch
from hearth.train.batches import IGNORE_INDEX, Example, collate
from tests.kernels.tolerance import HAS_CUDA, assert_close, gpu_only

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")
varlen_module = importlib.import_module("hearth.kernels.attention_varlen")
dense_module = importlib.import_module("hearth.kernels.attention")

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
TOL = dict(rtol=1e-4, atol=1e-5)  # fp32 against fp32: only summation order differs
VOCAB = 257
LENGTHS = (7, 12, 5)  # three examples in one row; 12 crosses the interpreter's 8/16-row blocks unevenly


def tiny_qwen3(seed: int = 0, attn: str = "sdpa"):
    cfg = transformers.Qwen3Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, vocab_size=VOCAB, attn_implementation=attn,
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg).float().to(DEVICE)


def examples(lengths=LENGTHS, seed: int = 0) -> list[Example]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, VOCAB, (n,), generator=gen).tolist()
        labels = list(ids)
        labels[: n // 3] = [IGNORE_INDEX] * (n // 3)  # a prompt that is not trained
        out.append(Example(ids, labels, i))
    return out


@pytest.fixture(autouse=True)
def _original_rope(monkeypatch):
    """Another test's patch.apply may have left hearth's rope kernel as Qwen3's module-level function (it is
    process-wide by design): the models here run HF's own (only attention is under test, and the interpreter's
    rope would make these tests several times slower)."""
    from transformers.models.qwen3 import modeling_qwen3 as mq

    current = mq.apply_rotary_pos_emb
    monkeypatch.setattr(mq, "apply_rotary_pos_emb", getattr(current, "__hearth_original__", current))


@pytest.fixture
def counted(monkeypatch):
    """Counts of hearth's varlen and dense attention kernels and of the masks transformers' sdpa_mask builds."""
    calls = {"varlen": [], "dense": 0, "masks": []}
    varlen, dense, sdpa_mask = varlen_module.attention_varlen, dense_module.attention, masking_utils.sdpa_mask

    def count_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        calls["varlen"].append((cu_q.tolist(), max_q, tuple(q.shape), all(t._is_view() for t in (q, k, v))))
        return varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    def count_dense(*a, **k):
        calls["dense"] += 1
        return dense(*a, **k)

    def count_masks(*a, **k):
        mask = sdpa_mask(*a, **k)
        calls["masks"].append(None if mask is None else tuple(mask.shape))
        return mask

    monkeypatch.setattr(varlen_module, "attention_varlen", count_varlen)
    monkeypatch.setattr(dense_module, "attention", count_dense)
    monkeypatch.setattr(masking_utils, "sdpa_mask", count_masks)  # what the "hearth" mask function calls
    monkeypatch.setitem(masking_utils.AttentionMaskInterface._global_mapping, "sdpa", count_masks)  # unpatched models
    return calls


def patched(seed: int = 0):
    model = tiny_qwen3(seed)
    report = patch.apply(model, norm=False, rope=False, mlp=False, loss=False, attention=True)  # attention only
    assert report.replaced["attention"] == {"Qwen3Attention": 2}
    return model


def loss_and_grads(model, inputs):
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def one_by_one(model, batch):
    """The packed row's loss and gradients computed from each example alone: the token-weighted mean."""
    model.zero_grad(set_to_none=True)
    total = sum(e.targets for e in batch)
    loss = 0.0
    for e in batch:
        part = model(**collate([e], pack=False, device=DEVICE)).loss * (e.targets / total)
        part.backward()
        loss = loss + part.detach()
    return loss, {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(got, want):
    loss, grads = got
    ref_loss, ref_grads = want
    torch.testing.assert_close(loss, ref_loss, **TOL)
    assert grads.keys() == ref_grads.keys() and len(grads) > 10
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL, msg=lambda m: f"{name}: {m}")


# ------------------------------------------------------------------------------------------- collate
def test_collate_pack_gives_the_varlen_kwargs_from_the_lengths():
    batch = examples()
    packed = collate(batch, pack=True, device=DEVICE)
    assert packed["cu_seq_lens_q"].dtype == torch.int32 and packed["cu_seq_lens_q"].device.type == DEVICE.type
    assert packed["cu_seq_lens_q"].tolist() == [0, 7, 19, 24] and packed["cu_seq_lens_k"] is packed["cu_seq_lens_q"]
    assert packed["max_length_q"] == packed["max_length_k"] == 12 and type(packed["max_length_q"]) is int
    assert packed["position_ids"].tolist() == [[*range(7), *range(12), *range(5)]]
    padded = collate(batch, pack=False, device=DEVICE)
    assert not set(padded) & set(patch.VARLEN_KEYS)  # a padded batch keeps its attention mask only


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_unpatched_models_ignore_the_varlen_kwargs(attn):
    """transformers' SDPA and eager attention take the extra kwargs and read the packing from the position ids:
    the same logits with and without them, and not the logits of the row attended as one sequence."""
    model = tiny_qwen3(attn=attn).eval()
    inputs = collate(examples(), pack=True, device=DEVICE)
    plain = {k: v for k, v in inputs.items() if k not in patch.VARLEN_KEYS and k != "labels"}
    with torch.no_grad():
        with_kwargs = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
        without = model(**plain).logits
        as_one = model(input_ids=inputs["input_ids"]).logits  # no position ids: one 24-token sequence
    assert torch.equal(with_kwargs, without)
    assert (with_kwargs[0, 7:] - as_one[0, 7:]).abs().max() > 1e-3  # the control: packing changes the logits


# ------------------------------------------------------------------------------------------- the model
def test_packed_row_matches_one_by_one_and_sdpa_through_the_varlen_kernel(counted):
    batch = examples()
    inputs = collate(batch, pack=True, device=DEVICE)
    ref = tiny_qwen3()
    want_sdpa = loss_and_grads(ref, inputs)  # SDPA, the block-diagonal mask from the position ids
    assert counted["masks"] == [(1, 1, 24, 24)]  # the control: unpatched, the [T, T] mask is built
    alone = one_by_one(ref, batch)
    assert_same(want_sdpa, alone)  # the reference itself: packing attends within each example only
    counted["masks"].clear()

    model = patched()
    counted.update(varlen=[], dense=0, masks=[])  # the probe at apply ran the dense kernel once
    got = loss_and_grads(model, inputs)
    assert_same(got, want_sdpa)
    assert_same(got, alone)
    # both layers ran the varlen kernel with the collator's offsets, no dense kernel, and no mask was built
    # ([T, H, D] views of the layer's [1, H, T, D] q / k / v: no copy)
    assert counted["varlen"] == [([0, 7, 19, 24], 12, (24, 4, 16), True)] * 2
    assert counted["dense"] == 0 and counted["masks"] == []


def test_checkpointed_layers_recompute_through_the_varlen_kernel(counted):
    """hearth train's activation checkpointing (non-reentrant, per decoder layer): the backward re-runs each
    layer with the same kwargs, so the recomputation takes the varlen kernel too; loss and gradients unchanged."""
    from hearth.train.finetune import enable_checkpointing

    inputs = collate(examples(), pack=True, device=DEVICE)
    want = loss_and_grads(tiny_qwen3(), inputs)
    model = patched()
    enable_checkpointing(model)
    model.train()
    counted.update(varlen=[], dense=0, masks=[])
    assert_same(loss_and_grads(model, inputs), want)
    assert len(counted["varlen"]) == 4 and counted["masks"] == []  # 2 layers, forward and recomputation


def test_packed_position_ids_without_the_kwargs_derive_the_offsets_once(counted, monkeypatch):
    """A user's own loop passing only packed position ids: the decoder derives cu_seqlens once per forward
    (one host copy), every layer takes the varlen kernel, and the mask is not built either."""
    derived = []
    offsets = patch._packed_offsets
    monkeypatch.setattr(patch, "_packed_offsets", lambda pos: derived.append(1) or offsets(pos))
    inputs = {k: v for k, v in collate(examples(), pack=True, device=DEVICE).items() if k not in patch.VARLEN_KEYS}
    want = loss_and_grads(tiny_qwen3(), inputs)
    model = patched()
    counted.update(varlen=[], dense=0, masks=[])
    assert_same(loss_and_grads(model, inputs), want)
    assert len(derived) == 1 and [c[:2] for c in counted["varlen"]] == [([0, 7, 19, 24], 12)] * 2
    assert counted["masks"] == []
    # one sequence (position ids 0..T-1): not packed, the dense kernel as before
    counted.update(varlen=[], dense=0, masks=[])
    with torch.no_grad():
        model(input_ids=inputs["input_ids"], position_ids=torch.arange(24, device=DEVICE)[None], use_cache=False)
    assert counted["varlen"] == [] and counted["dense"] == 2


def test_padded_batches_keep_the_mask_and_sdpa(counted):
    batch = examples((9, 5, 7))
    inputs = collate(batch, pack=False, device=DEVICE)
    assert "attention_mask" in inputs
    want = loss_and_grads(tiny_qwen3(), inputs)
    model = patched()
    counted.update(varlen=[], dense=0, masks=[])
    assert_same(loss_and_grads(model, inputs), want)
    assert counted["varlen"] == [] and counted["dense"] == 0 and counted["masks"] == [(3, 1, 9, 9)]


def test_varlen_kwargs_must_come_together():
    model = patched()
    inputs = collate(examples(), pack=True, device=DEVICE)
    del inputs["max_length_k"]
    with pytest.raises(ValueError, match="max_length_k"):
        model(**inputs)


def test_a_packed_call_the_kernel_does_not_serve_falls_back_to_sdpa_with_the_block_mask():
    """sliding_window / dropout / softcap are not the varlen kernel's: SDPA runs with the block-diagonal mask
    built from the offsets (never attention across the boundary), and its numbers equal the kernel's."""
    module = tiny_qwen3().model.layers[0].self_attn
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, 24, 16, generator=gen).to(DEVICE) for h in (4, 2, 2))
    cu = torch.tensor([0, 7, 19, 24], dtype=torch.int32, device=DEVICE)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=12, max_length_k=12, scaling=0.25)
    fast, _ = patch.hearth_attention_forward(module, q, k, v, None, **kw)
    slow, _ = patch.hearth_attention_forward(module, q, k, v, None, sliding_window=4096, **kw)
    torch.testing.assert_close(slow, fast, **TOL)
    for a, b in ((0, 7), (7, 19), (19, 24)):  # each sequence alone, causal: what the packed call must equal
        alone = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b].repeat_interleave(2, 1), v[:, :, a:b].repeat_interleave(2, 1), is_causal=True,
            scale=0.25)
        torch.testing.assert_close(fast[:, a:b], alone.transpose(1, 2), **TOL)


# ------------------------------------------------------------------------------------------- GPU, real-ish shape
GPU_LENGTHS = (200, 1536, 417, 2000, 256, 999, 640, 1313)  # 8 examples, 7361 tokens


def qwen3_14b_shaped(layers: int = 4):
    cfg = transformers.Qwen3Config(
        hidden_size=5120, num_hidden_layers=layers, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        intermediate_size=17408, vocab_size=4096, max_position_embeddings=4096, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


@gpu_only
@pytest.mark.xdist_group("gpu_big")  # an fp32 copy of four 14B-shaped layers: one at a time (scripts/gpu/test.sh)
def test_gpu_packed_row_bf16_matches_sdpa_with_the_mask_by_the_rule(counted):
    """Loss and every gradient of the packed row: hearth's varlen path in bf16 against the same (bf16-rounded)
    weights in fp32 with the block-diagonal mask (the reference), SDPA-with-the-mask in bf16 the baseline."""
    import copy

    inputs = collate(examples(GPU_LENGTHS, seed=1), pack=True, device="cuda")
    model = qwen3_14b_shaped()
    reference = copy.deepcopy(model).float()
    ref_loss, ref_grads = loss_and_grads(reference, inputs)
    del reference
    sdpa_loss, sdpa_grads = loss_and_grads(model, inputs)
    assert counted["masks"] == [(1, 1, 7361, 7361)] * 2 and counted["varlen"] == []
    patch.apply(model, norm=False, rope=False, mlp=False, loss=False, attention=True)
    counted.update(varlen=[], dense=0, masks=[])
    loss, grads = loss_and_grads(model, inputs)
    assert len(counted["varlen"]) == 4 and counted["dense"] == 0 and counted["masks"] == []
    assert_close(loss.float().reshape(1), ref_loss.reshape(1), torch.bfloat16, "loss",
                 baseline=sdpa_loss.float().reshape(1))
    for name in ref_grads:
        assert_close(grads[name].float(), ref_grads[name], torch.bfloat16, name, baseline=sdpa_grads[name].float())
