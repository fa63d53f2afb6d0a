"""Review 49b: rope's cases hand every provider q / k in the layout a Hugging Face attention module does.

HF Llama / Qwen build q as q_proj(x).view(B, T, H, D).transpose(1, 2): a [B, H, T, D] view of a [B, T, H, D]
tensor, and that is what apply_rotary_pos_emb (and so hearth's patch and Liger's) receives; the attention
backward hands the gradient back in the same layout. The bench made q, k (and dy) contiguous [B, H, T, D]:
hearth reads any strides, but Liger's kernel works in place on the physical [B, T, H, D] rows, so on those
inputs it copied q and k (q.transpose(1, 2).contiguous()) before its kernel, copied dy again in the
backward, and autograd copied its gradient once more into the leaf's layout: about three times the bytes it
moves in a model (the committed rope rows: Liger 4.7x torch.compile's time).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hearth.bench import cases, providers as P, runner

SIZE = dict(B=1, Hq=4, Hk=2, T=8, D=16)


def _hf_layout(t: torch.Tensor) -> bool:
    """[B, H, T, D] whose memory is [B, T, H, D] rows: the transpose back is contiguous."""
    return t.dim() == 4 and t.transpose(1, 2).is_contiguous() and not t.is_contiguous()


def test_rope_inputs_are_the_hf_transposed_layout():
    inputs = cases.SPECS["rope"].make(SIZE, torch.float32, torch.device("cpu"), True)
    for name in ("q", "k"):
        t = inputs[name]
        assert _hf_layout(t), (name, t.stride())
        assert t.is_leaf and t.requires_grad  # the harness resets and checks t.grad
    assert tuple(inputs["q"].shape) == (1, 4, 8, 16) and tuple(inputs["k"].shape) == (1, 2, 8, 16)


def test_rope_dy_comes_back_in_the_layout_of_q_and_k():
    spec = cases.SPECS["rope"]
    inputs = spec.make(SIZE, torch.float32, torch.device("cpu"), True)
    _, grads, gouts = runner._reference(spec, inputs, SIZE, "full", torch.float32)
    assert all(_hf_layout(g) for g in gouts), [g.stride() for g in gouts]
    assert [g.stride() for g in gouts] == [inputs["q"].stride(), inputs["k"].stride()]
    assert all(g is not None for g in grads)


def test_other_ops_keep_contiguous_dy():
    spec = cases.SPECS["softmax"]
    size = spec.check_sizes[0]
    inputs = spec.make(size, torch.float32, torch.device("cpu"), True)
    _, _, gouts = runner._reference(spec, inputs, size, "full", torch.float32)
    assert gouts[0].is_contiguous()


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="liger_kernel not installed")
def test_liger_rope_runs_in_place_without_copies_on_the_bench_inputs():
    """On the HF layout Liger rotates q / k where they lie (its output is q's storage) and writes dq into dy:
    no copy of either. On contiguous [B, H, T, D] inputs both were copies."""
    spec = cases.SPECS["rope"]
    inputs = spec.make(SIZE, torch.float32, torch.device("cpu"), True)
    _, ref_grads, gouts = runner._reference(spec, inputs, SIZE, "full", torch.float32)
    mine = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    assert _hf_layout(mine["q"])  # the runner's per-provider copies keep the layout
    q_ptr, k_ptr = mine["q"].data_ptr(), mine["k"].data_ptr()
    bound = P.bind("rope", "liger", mine, spec, SIZE, True, check=True)
    out = bound.fn()
    assert out[0].data_ptr() == q_ptr and out[1].data_ptr() == k_ptr
    dy = [g.clone() for g in gouts]
    torch.autograd.backward(list(out), dy)
    for leaf, d, ref in zip(bound.leaves, dy, ref_grads):
        torch.testing.assert_close(leaf.grad, ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(d, ref, rtol=1e-4, atol=1e-5)  # dq / dk were written into dy itself


@pytest.mark.parametrize("provider", ["hearth", "eager", "liger"])
def test_rope_case_is_correct_for_each_provider_on_the_hf_layout(provider):
    if provider == "liger" and importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger_kernel not installed")
    spec = cases.SPECS["rope"]
    rows = runner.run_case(spec, SIZE, "float32", "full", [provider], torch.device("cpu"),
                           {"copy_GBps": 1.0, "matmul_TFLOPs": 1.0}, {}, False, True)
    assert rows[0]["status"] == "ok", rows[0]
