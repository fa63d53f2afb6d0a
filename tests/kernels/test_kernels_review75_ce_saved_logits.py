"""Review 75: cross_entropy writes its gradient over logits that require grad (in place, by design). When another
autograd node saved those logits for its own backward (tanh saves its result, e.g. a softcap written by hand; exp and sigmoid do too), that
backward read the gradient instead of the logits and returned a silently wrong gradient. The write now bumps the
logits' version counter, so such a graph fails loudly, as rope(inplace=True) does."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import hearth.kernels as hk
from tests.kernels.tolerance import DEVICE


def test_logits_saved_by_another_node_fail_loudly():
    gen = torch.Generator().manual_seed(75)
    x = torch.randn(4, 8, generator=gen).to(DEVICE).requires_grad_()
    t = torch.tensor([1, 2, 3, 4], device=DEVICE)
    z = torch.tanh(x)  # TanhBackward saves its output z: the tensor cross_entropy overwrites
    loss = hk.cross_entropy(z, t)
    try:
        loss.backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
        return
    x64 = x.detach().double().requires_grad_()
    F.cross_entropy(torch.tanh(x64), t).backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-4)  # failed: a wrong gradient


def test_logits_of_a_matmul_still_served():
    # the usual call (lm_head logits: mm saves its inputs, not its output) is unaffected by the version bump
    gen = torch.Generator().manual_seed(76)
    h = torch.randn(4, 6, generator=gen).to(DEVICE).requires_grad_()
    w = torch.randn(8, 6, generator=gen).to(DEVICE).requires_grad_()
    t = torch.tensor([1, 2, -100, 4], device=DEVICE)
    hk.cross_entropy(h @ w.t(), t).backward()
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.cross_entropy(h64 @ w64.t(), t).backward()
    torch.testing.assert_close(h.grad.double(), h64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-5, rtol=1e-4)
