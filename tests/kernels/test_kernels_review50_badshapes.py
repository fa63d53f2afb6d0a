"""Review 50: bad shapes and values never reach a kernel that reads out of bounds; each public op raises
ValueError / TypeError naming the argument, or serves the call. The gaps this review found (each test here failed
against the code before its fix), plus the data-dependent cases the kernels mask without a device sync."""

from __future__ import annotations

import importlib

import pytest
import torch

import hearth.kernels as hk
from hearth.kernels.swiglu import swiglu_mlp
from tests.kernels.tolerance import DEVICE, HAS_CUDA, assert_close

ce_mod = importlib.import_module("hearth.kernels.cross_entropy")
mm_mod = importlib.import_module("hearth.kernels.matmul")


def test_linear_cross_entropy_0d_input_names_input():
    # input [..., H] takes any rank but 0: input.shape[-1] raised a bare IndexError
    w = torch.randn(8, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"^input\b"):
        hk.linear_cross_entropy(torch.tensor(1.0, device=DEVICE), w, torch.zeros(1, dtype=torch.int64, device=DEVICE))


def test_swiglu_mlp_0d_x_names_x():
    w = torch.randn(3, 1, device=DEVICE)
    with pytest.raises(ValueError, match=r"^x\b"):
        swiglu_mlp(torch.tensor(1.0, device=DEVICE), w, w, w.t())


def test_lora_swiglu_mlp_0d_x_names_x():
    # it raised a ValueError naming w_gate ("w_gate must be [6, -1]"): the 0-D x's hidden size read as -1
    from hearth.kernels.lora import lora_swiglu_mlp

    def r(*shape):
        return torch.randn(*shape, device=DEVICE)

    with pytest.raises(ValueError, match=r"^x\b"):
        lora_swiglu_mlp(torch.tensor(1.0, device=DEVICE), r(6, 4), r(6, 4), r(4, 6), r(2, 4), r(6, 2), r(2, 4),
                        r(6, 2), r(2, 6), r(4, 2), 1.0, 1.0, 1.0)


@pytest.mark.parametrize("ignore_index", [2**63, -(2**63) - 1, 2**70])
def test_ignore_index_outside_int64_names_it(ignore_index):
    # the kernels take ignore_index as an int64 scalar: Triton raised OverflowError at the launch
    x = torch.randn(4, 8, device=DEVICE)
    t = torch.randint(0, 8, (4,), device=DEVICE)
    with pytest.raises(ValueError, match=r"^ignore_index\b"):
        hk.cross_entropy(x, t, ignore_index=ignore_index)
    with pytest.raises(ValueError, match=r"^ignore_index\b"):
        hk.linear_cross_entropy(torch.randn(4, 4, device=DEVICE), torch.randn(8, 4, device=DEVICE), t,
                                ignore_index=ignore_index)


def test_ignore_index_at_the_int64_limits_is_served():
    x = torch.randn(4, 8, device=DEVICE)
    t = torch.tensor([1, 2, 3, 4], device=DEVICE)
    want = torch.nn.functional.cross_entropy(x, t)
    for ii in (2**63 - 1, -(2**63)):
        torch.testing.assert_close(hk.cross_entropy(x.clone(), t, ignore_index=ii), want)


def test_matmul_tma_plan_refuses_a_zero_leading_stride():
    # TMA cannot describe a zero stride (a broadcast row, e.g. the gradient of (y * w).sum() with w [N] is
    # w.expand(M, N): strides (0, 1)); the attention path's tma_addressable refuses them, matmul's plan took one as
    # a leading stride of 0 (a failed descriptor would then turn TMA off for the whole process: _TMA_BROKEN)
    row = torch.randn(1, 64, dtype=torch.bfloat16, device=DEVICE)
    assert mm_mod._tma_strides(row.expand(32, 64)) is None
    assert mm_mod._tma_strides(row.expand(32, 64).t()) is None
    assert mm_mod._tma_strides(torch.randn(32, 64, dtype=torch.bfloat16, device=DEVICE)) == (False, 64)
    assert mm_mod._tma_strides(torch.randn(64, 32, dtype=torch.bfloat16, device=DEVICE).t()) == (True, 32)


def test_matmul_with_a_broadcast_operand_and_gradient_is_served():
    # bf16 at TMA-describable widths: on Hopper the operands and dC = w.expand(24, 8) (strides (0, 1)) would take
    # the TMA kernel; they must take the pointer kernel and leave TMA on for later calls (_TMA_BROKEN unset)
    a = torch.randn(1, 16, device=DEVICE).to(torch.bfloat16).expand(24, 16).requires_grad_()
    b = torch.randn(16, 8, device=DEVICE).to(torch.bfloat16).requires_grad_()
    w = torch.randn(8, device=DEVICE).to(torch.bfloat16)
    (hk.matmul(a, b) * w).sum().backward()
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ((a64 @ b64) * w.double()).sum().backward()
    a16, b16 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ((a16 @ b16) * w).sum().backward()
    assert_close(a.grad, a64.grad, torch.bfloat16, "dA", baseline=a16.grad)
    assert_close(b.grad, b64.grad, torch.bfloat16, "dB", baseline=b16.grad)
    assert mm_mod._TMA_BROKEN is None


# ------------------------------------------------------------------- data-dependent: masked in the kernel
def test_unchecked_out_of_range_target_reads_nothing_and_gives_nan(monkeypatch):
    # CHECK_TARGETS off (no host sync): the row kernel masks the target logit's load (in_range) and the gradient
    # compares columns only, so a target outside [0, V) reads nothing: its row's loss is nan, the others exact
    monkeypatch.setattr(ce_mod, "CHECK_TARGETS", False)
    x = torch.randn(4, 8, device=DEVICE)
    t = torch.tensor([1, 8, -5, 2**40], device=DEVICE)
    loss = hk.cross_entropy(x.clone(), t, reduction="none")
    assert torch.isnan(loss[1:]).all()
    torch.testing.assert_close(loss[0], torch.nn.functional.cross_entropy(x[:1], t[:1]))


HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.x (Hopper)")
def test_gpu_cluster_ce_register_form_reads_nothing_for_an_out_of_range_target():
    # cross_entropy_gluon.ce_rows_ (the register form, not routed, callable): its target-logit load took the
    # target unmasked, so a target outside [0, V) (its caller's check skipped) read outside the row; now it reads
    # nothing and the row's loss is nan, as the shared-memory form and the Triton kernel give
    cg = importlib.import_module("hearth.kernels.cross_entropy_gluon")
    v = 131072
    x = torch.randn(3, v, device="cuda").to(torch.bfloat16)
    t = torch.tensor([5, v + 3, -7], device="cuda")
    loss = cg.ce_rows_(x.clone(), t, grad_scale=1.0)
    torch.testing.assert_close(loss[0], torch.nn.functional.cross_entropy(x[:1].float(), t[:1]), atol=1e-2, rtol=1e-2)
    assert torch.isnan(loss[1:]).all(), loss
