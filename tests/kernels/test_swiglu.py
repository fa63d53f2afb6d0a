"""hearth.kernels.swiglu and swiglu_mlp against fp32 PyTorch references."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

# the module, not the function: hearth.kernels re-exports swiglu() under the submodule's name, so
# `import hearth.kernels.swiglu as ...` can bind the function (depending on import order)
swiglu_module = importlib.import_module("hearth.kernels.swiglu")
from hearth.kernels.swiglu import swiglu, swiglu_mlp
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only


def check_swiglu(g, u, dtype):
    g, u = g.detach().requires_grad_(), u.detach().requires_grad_()
    h = swiglu(g, u)
    assert h.shape == g.shape and h.dtype == g.dtype
    dh = torch.randn_like(h)
    dg, du = torch.autograd.grad(h, (g, u), dh)
    gr, ur = g.detach().float().requires_grad_(), u.detach().float().requires_grad_()
    hr = F.silu(gr) * ur
    dgr, dur = torch.autograd.grad(hr, (gr, ur), dh.float())
    assert_close(h, hr, dtype, msg="h")
    assert_close(dg, dgr, dtype, msg="dgate")
    assert_close(du, dur, dtype, msg="dup")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 80), (17, 130), (2, 3, 1100)], ids=["1row", "17x130", "3d_two_col_blocks"])
def test_swiglu_matches_fp32_reference(dtype, shape):
    torch.manual_seed(0)
    g = (2 * torch.randn(shape, device=DEVICE)).to(dtype)
    u = torch.randn(shape, device=DEVICE).to(dtype)
    check_swiglu(g, u, dtype)


def test_swiglu_strided_views():
    torch.manual_seed(1)
    gu = torch.randn(9, 2 * 40, device=DEVICE)
    check_swiglu(gu[:, :40], gu[:, 40:], torch.float32)  # a fused gate_up output split in two: row-strided
    check_swiglu(torch.randn(40, 9, device=DEVICE).t(), torch.randn(9, 40, device=DEVICE), torch.float32)


def test_swiglu_empty_gives_empty():
    g = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    assert swiglu(g, torch.randn(0, 8, device=DEVICE)).shape == (0, 8)


def test_swiglu_shape_mismatch_names_up():
    with pytest.raises(ValueError, match=r"^up\b"):
        swiglu(torch.ones(2, 4, device=DEVICE), torch.ones(2, 5, device=DEVICE))


def test_swiglu_dtype_mismatch_names_up():
    with pytest.raises(TypeError, match=r"^up\b"):
        swiglu(torch.ones(2, 4, device=DEVICE), torch.ones(2, 4, device=DEVICE, dtype=torch.bfloat16))


def test_swiglu_wrong_dtype_names_gate():
    with pytest.raises(TypeError, match=r"^gate\b"):
        swiglu(torch.ones(2, 4, device=DEVICE, dtype=torch.int32), torch.ones(2, 4, device=DEVICE))


def test_swiglu_other_device_names_up():
    with pytest.raises(ValueError, match=r"^up\b"):
        swiglu(torch.ones(2, 4, device=DEVICE), torch.ones(2, 4, device="meta"))


# ----------------------------------------------------------------------------------------------
# swiglu_mlp: one autograd node
# ----------------------------------------------------------------------------------------------
def mlp_params(h, i, dtype, bias):
    torch.manual_seed(2)
    ws = [torch.randn(i, h, device=DEVICE) / h**0.5, torch.randn(i, h, device=DEVICE) / h**0.5,
          torch.randn(h, i, device=DEVICE) / i**0.5]
    bs = [0.1 * torch.randn(n, device=DEVICE) for n in (i, i, h)] if bias else [None] * 3
    return [w.to(dtype) for w in ws], [b.to(dtype) if b is not None else None for b in bs]


def check_mlp(x, ws, bs, dtype, frozen=False, recompute_up=False):
    x = x.detach().requires_grad_()
    ws = [w.detach().requires_grad_(not frozen) for w in ws]
    bs = [b.detach().requires_grad_(not frozen) if b is not None else None for b in bs]
    leaves = [x] + ([] if frozen else ws + [b for b in bs if b is not None])
    out = swiglu_mlp(x, *ws, *bs, recompute_up=recompute_up)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    rx = ref_leaves[0]
    rws = ref_leaves[1:4] if not frozen else [w.detach().float() for w in ws]
    rbs = iter(ref_leaves[4:]) if not frozen else iter([b.float() for b in bs if b is not None])
    rbs = [next(rbs) if b is not None else None for b in bs]
    ref = F.linear(F.silu(F.linear(rx, rws[0], rbs[0])) * F.linear(rx, rws[1], rbs[1]), rws[2], rbs[2])
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.float())
    # The matmuls round their [rows, I] results (g, u, h, dh) to the low precision: twice the table.
    assert_close(out, ref, dtype, scale=2.0, msg="out")
    for n, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(g, r, dtype, scale=2.0, msg=f"grad of leaf {n}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias,recompute_up", [(False, False), (True, False), (True, True)],
                         ids=["nobias", "bias", "bias_recompute_up"])
def test_mlp_matches_fp32_reference(dtype, bias, recompute_up, monkeypatch):
    # Tiny chunks so the forward's row chunks (5, 5, 3 of 13 rows) and the backward's column
    # chunks (15, 15, 10 of I = 40) both iterate, with ragged last chunks.
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", 200)
    ws, bs = mlp_params(16, 40, dtype, bias)
    x = torch.randn(13, 16, device=DEVICE).to(dtype)
    check_mlp(x, ws, bs, dtype, recompute_up=recompute_up)


@pytest.mark.parametrize("recompute_up", [False, True])
def test_mlp_frozen_weights_give_only_dx(recompute_up):
    ws, bs = mlp_params(8, 24, torch.float32, True)
    check_mlp(torch.randn(2, 5, 8, device=DEVICE), ws, bs, torch.float32, frozen=True, recompute_up=recompute_up)


def test_mlp_second_backward_is_refused():
    ws, _ = mlp_params(8, 24, torch.float32, False)
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    out = swiglu_mlp(x, *ws).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError):
        out.backward()


def test_mlp_w_down_shape_names_w_down():
    ws, _ = mlp_params(8, 24, torch.float32, False)
    with pytest.raises(ValueError, match=r"^w_down\b"):
        swiglu_mlp(torch.randn(3, 8, device=DEVICE), ws[0], ws[1], ws[2][:, :20])


def test_mlp_weight_dtype_names_w_up():
    ws, _ = mlp_params(8, 24, torch.float32, False)
    with pytest.raises(TypeError, match=r"^w_up\b"):
        swiglu_mlp(torch.randn(3, 8, device=DEVICE), ws[0], ws[1].half(), ws[2])


def test_torch_compile_fullgraph():
    torch.manual_seed(3)
    ws, _ = mlp_params(8, 24, torch.float32, False)
    leaves = [torch.randn(3, 8, device=DEVICE, requires_grad=True), torch.randn(3, 24, device=DEVICE, requires_grad=True),
              torch.randn(3, 24, device=DEVICE, requires_grad=True)] + [w.requires_grad_() for w in ws]
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"

    def loss(x, g, u, wg, wu, wd):
        mlp = swiglu_mlp(x, wg, wu, wd).square().sum() + swiglu_mlp(x, wg, wu, wd, recompute_up=True).square().sum()
        return swiglu(g, u).square().sum() + mlp

    got = torch.autograd.grad(torch.compile(loss, backend=backend, fullgraph=True)(*leaves), leaves)
    want = torch.autograd.grad(loss(*leaves), leaves)
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_opcheck_swiglu():
    g = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    u = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.hearth.swiglu_fwd, (g, u))


def test_opcheck_mlp_backward_op():
    # The forward op is left out on purpose: it returns g and u only so they can be saved, and its
    # backward reuses them as gradient buffers, which opcheck's "outputs are user-visible" tests
    # reject. swiglu_mlp never hands g or u to the caller.
    ws, _ = mlp_params(8, 24, torch.float32, False)
    args = (torch.randn(3, 8, device=DEVICE), torch.randn(3, 8, device=DEVICE), torch.randn(3, 24, device=DEVICE),
            torch.randn(3, 24, device=DEVICE), *ws, None, True, False)
    torch.library.opcheck(torch.ops.hearth.swiglu_mlp_bwd, args)

@gpu_only
@pytest.mark.parametrize("n", [14336, 17408])
def test_swiglu_real_shapes_bf16(n):
    torch.manual_seed(4)
    check_swiglu(torch.randn(4096, n, device=DEVICE, dtype=torch.bfloat16),
                 torch.randn(4096, n, device=DEVICE, dtype=torch.bfloat16), torch.bfloat16)


@gpu_only
def test_mlp_real_shape_bf16_numerics():
    ws, _ = mlp_params(4096, 14336, torch.bfloat16, False)
    for recompute_up in (False, True):
        check_mlp(torch.randn(2048, 4096, device=DEVICE, dtype=torch.bfloat16), ws, [None] * 3, torch.bfloat16,
                  recompute_up=recompute_up)
