"""hearth.kernels.cross_entropy_gluon, the cluster cross-entropy for wide rows (the shared-memory form is routed on
Hopper, the register form is not: BENCHMARKS.md says why): its offline sm_90 build is checked beside the softmax's
(tests/kernels/test_softmax_gluon.py); its losses and gradients on a Hopper GPU against fp64."""

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


@hopper_only
def test_gpu_cross_entropy_routes_the_plain_loss_at_wide_aligned_vocabularies(monkeypatch):
    """cross_entropy() sends the plain loss at a wide aligned vocabulary to ce_rows_smem_: in place in eager
    mode (the gradient over the logits, the mean's 1 / n_valid read from the device), into a separate buffer
    through the functional op torch.compile uses (the logits untouched), the losses alone with
    reduction="none" and no gradient; label smoothing, z-loss, a softcap or an unaligned vocabulary keep
    the Triton kernel. Values against fp64 within the rule."""
    ce = importlib.import_module("hearth.kernels.cross_entropy")  # the package's cross_entropy is the function

    calls = []
    real = cg.ce_rows_smem_
    monkeypatch.setattr(cg, "ce_rows_smem_", lambda *a, **k: calls.append(k.get("grad") is None) or real(*a, **k))
    g = torch.Generator(device="cpu").manual_seed(7)
    rows, v = 37, 131072
    x = (torch.randn(rows, v, generator=g) * 3).to(torch.bfloat16).cuda()
    t = torch.randint(0, v, (rows,), generator=g).cuda()
    t[::5] = -100
    ref_x = x.double().requires_grad_()
    ref = F.cross_entropy(ref_x, t)
    ref.backward()
    base_x = x.clone().requires_grad_()
    base = F.cross_entropy(base_x, t)
    base.backward()
    # eager, in place
    work = x.clone().requires_grad_()
    loss = ce.cross_entropy(work, t)
    loss.backward()
    assert calls == [False] and work.grad.data_ptr() == work.data_ptr()
    assert_close(loss, ref.detach(), torch.bfloat16, msg="loss", baseline=base.detach().float())
    assert_close(work.grad, ref_x.grad, torch.bfloat16, msg="grad", baseline=base_x.grad)
    assert torch.count_nonzero(work.grad[::5]).item() == 0
    # the functional op: the gradient into its own buffer, the logits left as they were
    calls.clear()
    kept = x.clone()
    loss2, grad, factor = torch.ops.hearth.cross_entropy_fwd(kept, t, -100, 0.0, "mean", 0.0, 0.0, True)
    assert calls == [False] and torch.equal(kept, x) and float(factor) == 1.0
    assert_close(grad, ref_x.grad, torch.bfloat16, msg="functional grad", baseline=base_x.grad)
    # losses only
    calls.clear()
    none = ce.cross_entropy(x, t, reduction="none")
    assert len(calls) == 1
    assert_close(none, F.cross_entropy(x.double(), t, reduction="none"), torch.bfloat16, msg="none",
                 baseline=F.cross_entropy(x, t, reduction="none").float())
    # not routed
    for opts in (dict(label_smoothing=0.1), dict(z_loss=1e-4), dict(softcap=30.0)):
        calls.clear()
        ce.cross_entropy(x.clone().requires_grad_(), t, **opts).backward()
        assert not calls, opts
    calls.clear()
    ce.cross_entropy(torch.randn(4, v + 8, device="cuda", dtype=torch.bfloat16), t[:4])
    assert not calls


@hopper_only
def test_gpu_smem_out_of_range_targets_and_non_finite_ignored_rows():
    """ce_rows_smem_ called with targets the caller did not check: one past V and one at 2^32 + 5 (which int32
    would wrap onto column 5) give a nan loss and a gradient of plain softmax * scale (no -scale written
    anywhere); an ignored row whose logits hold inf and nan gets loss 0 and a zero gradient; the other rows
    stay within the rule."""
    g = torch.Generator(device="cpu").manual_seed(11)
    rows, v = 6, 131072
    x = (torch.randn(rows, v, generator=g) * 3).to(torch.bfloat16)
    x[2, 7], x[2, 9] = float("inf"), float("nan")
    x = x.cuda()
    t = torch.randint(0, v, (rows,), generator=g).cuda()
    t[0], t[1], t[2] = v, 2**32 + 5, -100
    work = x.clone()
    loss = cg.ce_rows_smem_(work, t, grad_scale=0.5)
    assert torch.isnan(loss[:2]).all() and loss[2].item() == 0.0
    assert torch.count_nonzero(work[2]).item() == 0
    soft = torch.softmax(x[:2].double(), -1) * 0.5
    assert_close(work[:2], soft, torch.bfloat16, msg="out-of-range rows: softmax only",
                 baseline=(torch.softmax(x[:2].float(), -1) * 0.5).to(torch.bfloat16))
    ref_x = x[3:].double().requires_grad_()
    ref = F.cross_entropy(ref_x, t[3:], reduction="none")
    (ref.sum() * 0.5).backward()
    base_x = x[3:].clone().requires_grad_()
    base = F.cross_entropy(base_x, t[3:], reduction="none")
    (base.sum() * 0.5).backward()
    assert_close(loss[3:], ref.detach(), torch.bfloat16, msg="loss", baseline=base.detach().float())
    assert_close(work[3:], ref_x.grad, torch.bfloat16, msg="grad", baseline=base_x.grad)


@hopper_only
def test_gpu_smem_gate_writes_nothing_and_a_routed_bad_target_loses_no_logits():
    """The routed kernel reads cross_entropy's gate: non-zero, no gradient is written (in place or into a
    separate buffer); zero, the result is the ungated one bit for bit. Through cross_entropy at a routed width,
    a bad target raises and the logits are as they were (the kernel was queued before the check was awaited)."""
    from hearth.kernels import cross_entropy as ce_fn

    g = torch.Generator(device="cpu").manual_seed(12)
    rows, v = 8, 131072
    x = (torch.randn(rows, v, generator=g) * 3).to(torch.bfloat16).cuda()
    t = torch.randint(0, v, (rows,), generator=g).cuda()
    t[3] = -100
    one = torch.ones((), dtype=torch.int32, device="cuda")
    zero = torch.zeros((), dtype=torch.int32, device="cuda")
    work = x.clone()
    cg.ce_rows_smem_(work, t, grad_scale=0.5, gate=one)
    assert torch.equal(work, x)
    sep = torch.full_like(x, 7.0)
    cg.ce_rows_smem_(x, t, grad_scale=0.5, grad=sep, gate=one)
    assert torch.equal(sep, torch.full_like(x, 7.0))
    ungated, gated = x.clone(), x.clone()
    loss_u = cg.ce_rows_smem_(ungated, t, grad_scale=0.5)
    loss_g = cg.ce_rows_smem_(gated, t, grad_scale=0.5, gate=zero)
    torch.cuda.synchronize()
    assert torch.equal(loss_u, loss_g) and torch.equal(ungated, gated) and not torch.equal(gated, x)
    bad_t = t.clone()
    bad_t[5] = v
    leaf = x.clone().requires_grad_()
    with pytest.raises(ValueError, match=f"found {v}"):
        ce_fn(leaf, bad_t)
    torch.cuda.synchronize()
    assert torch.equal(leaf.detach(), x)
