"""hearth.kernels.cross_entropy_gluon, the cluster cross-entropy for wide rows (not routed: BENCHMARKS.md says
why): its offline sm_90 build is checked beside the softmax's (tests/kernels/test_softmax_gluon.py); its losses and
gradients on a Hopper GPU against fp64."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.tolerance import HAS_CUDA, assert_close

cg = importlib.import_module("hearth.kernels.cross_entropy_gluon")

def test_bad_input_names_the_argument():
    logits = torch.zeros(2, 65536)
    with pytest.raises(ValueError, match="logits: the cluster cross-entropy serves Hopper"):
        cg.ce_rows_(logits, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="target must be int64 of shape"):
        cg.ce_rows_(logits, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="logits must be 2-D"):
        cg.ce_rows_(torch.zeros(2, 2, 65536), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="logits: the cluster cross-entropy serves Hopper"):
        cg.ce_rows_smem_(logits, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="logits: the cluster cross-entropy \\(shared-memory form\\) needs 16-byte"):
        cg.ce_rows_smem_(torch.zeros(2, 65536 + 4), torch.zeros(2, dtype=torch.int64))


HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
hopper_only = pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.x (Hopper)")


@hopper_only
@pytest.mark.parametrize("form", ["registers", "smem"])
@pytest.mark.parametrize("rows, v, dtype", [(6, 131072, torch.bfloat16), (5, 151936, torch.bfloat16),
                                           (4, 65536 + 5, torch.float16), (4, 65536 + 16, torch.float16),
                                           (3, 40000, torch.float32)])
def test_gpu_loss_and_gradient_match_reference(rows, v, dtype, form):
    """Losses and the in-place gradient (scaled 1 / rows) against F.cross_entropy in fp64 of the same values,
    within 2x PyTorch's own error in `dtype`; one ignored row (loss and gradient 0), one target in the last
    column, one in the first."""
    g = torch.Generator(device="cpu").manual_seed(v)
    x = (torch.randn(rows, v, generator=g) * 3).to(dtype).cuda()
    t = torch.randint(0, v, (rows,), generator=g).cuda()
    t[0], t[1], t[2] = -100, v - 1, 0
    ref_x = x.double().requires_grad_()
    ref = F.cross_entropy(ref_x, t, reduction="none")
    (ref.sum() / rows).backward()
    base_x = x.clone().requires_grad_()
    base = F.cross_entropy(base_x, t, reduction="none")
    (base.sum() / rows).backward()
    work = x.clone()
    if form == "smem" and v % 16:  # not smem_aligned: refused by name, the logits untouched
        with pytest.raises(ValueError, match="needs 16-byte aligned rows"):
            cg.ce_rows_smem_(work, t, grad_scale=1.0 / rows)
        assert torch.equal(work, x)
        return
    loss = (cg.ce_rows_ if form == "registers" else cg.ce_rows_smem_)(work, t, grad_scale=1.0 / rows)
    assert loss[0].item() == 0.0 and torch.count_nonzero(work[0]).item() == 0
    assert_close(loss, ref.detach(), dtype, msg="loss", baseline=base.detach().float())
    assert_close(work, ref_x.grad, dtype, msg="grad", baseline=base_x.grad)
