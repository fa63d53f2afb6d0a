"""Review 75: create_graph=True through an op whose backward is not differentiable (the kernels' launchers: attention,
attention_varlen, swiglu, rms_norm, layer_norm, softmax) gave gradients with no history, so a second-order term
(a gradient penalty added to the loss, a Hessian-vector product) was silently dropped: the double backward ran and
returned the first-order part alone; cross_entropy's torch once_differentiable wrapper too (it raises only when the
incoming gradient requires grad). Now the second differentiation raises (rope and matmul, whose backward is the op
again, keep their double backward)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hearth.kernels as hk
from tests.kernels.tolerance import DEVICE


def _cu():
    return torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)


CASES = {
    "attention": ((1, 2, 4, 16), lambda x: hk.attention(x, x.detach() * 0.5, x.detach()),
                  lambda x: F.scaled_dot_product_attention(x, x.detach() * 0.5, x.detach())),
    "attention_varlen": ((7, 2, 16), lambda x: hk.attention_varlen(x, x.detach() * 0.5, x.detach(), _cu(), _cu(), 4, 4),
                         None),
    "swiglu": ((3, 8), lambda x: hk.swiglu(x, x.detach() + 1), lambda x: F.silu(x) * (x.detach() + 1)),
    "rms_norm": ((3, 8), lambda x: hk.rms_norm(x, torch.ones(8, device=DEVICE)),
                 lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),
    "layer_norm": ((3, 8), lambda x: hk.layer_norm(x, torch.ones(8, device=DEVICE), None),
                   lambda x: F.layer_norm(x, (8,), eps=1e-5)),
    "softmax": ((3, 8), lambda x: hk.softmax(x), lambda x: torch.softmax(x, -1)),
    # cross_entropy's backward was once_differentiable already, but torch's wrapper raises only when the incoming
    # gradient requires grad: the loss's constant one does not, so the penalty's term was dropped there too
    "cross_entropy": ((3, 8), lambda x: hk.cross_entropy(x.clone(), torch.tensor([1, 2, 3], device=DEVICE),
                                                         reduction="none")[:, None].expand(3, 8),
                      lambda x: F.cross_entropy(x, torch.tensor([1, 2, 3], device=DEVICE), reduction="none")[:, None].expand(3, 8)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_second_order_term_is_never_dropped_silently(name):
    shape, op, ref = CASES[name]
    gen = torch.Generator().manual_seed(75)
    x = torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_()
    w = torch.randn(*shape, generator=gen).to(DEVICE)
    (g,) = torch.autograd.grad((op(x) * w).sum(), x, create_graph=True)
    penalty = g.square().sum() + (op(x) * w).sum()  # a gradient penalty beside the loss
    try:
        (got,) = torch.autograd.grad(penalty, x)
    except RuntimeError as e:
        assert "once_differentiable" in str(e)
        return
    # served: then it must be the true second-order gradient (the dropped term made it the first-order one alone)
    assert ref is not None, "double backward ran without a reference to match"
    x64 = x.detach().double().requires_grad_()
    (g64,) = torch.autograd.grad((ref(x64) * w.double()).sum(), x64, create_graph=True)
    (want,) = torch.autograd.grad(g64.square().sum() + (ref(x64) * w.double()).sum(), x64)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", list(CASES))
def test_create_graph_first_order_gradient_unchanged(name):
    # create_graph=True alone (no second differentiation) still gives the first-order gradient
    shape, op, _ = CASES[name]
    gen = torch.Generator().manual_seed(76)
    x = torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_()
    w = torch.randn(*shape, generator=gen).to(DEVICE)
    (g1,) = torch.autograd.grad((op(x) * w).sum(), x, create_graph=True)
    (g0,) = torch.autograd.grad((op(x) * w).sum(), x)
    torch.testing.assert_close(g1, g0, atol=0, rtol=0)
