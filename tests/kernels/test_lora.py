"""kernels.lora: lora_linear and lora_swiglu_mlp against peft's own lora.Linear on the same weights.

Every comparison uses THE rule (tests/kernels/tolerance.py): hearth's max error against an fp64 reference built
from the same inputs is at most 2x peft's own error (the `baseline`) plus the floor. The base runs in fp32 or bf16;
the LoRA factors are fp32 as peft keeps them (autocast_adapter_dtype=True). Also: what autograd saves (bytes,
counted with saved_tensors_hooks), merged / disabled adapters fall back to peft, errors name the argument.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hearth.kernels.lora import lora_linear, lora_parts, lora_swiglu_mlp
from hearth.nn import SwiGLUMLP
from tests.kernels.tolerance import DEVICE, assert_close, gpu_only

peft = pytest.importorskip("peft")
swiglu_module = importlib.import_module("hearth.kernels.swiglu")

BASE_DTYPES = [torch.float32, torch.bfloat16]


class _Proj(nn.Module):
    def __init__(self, k, n, bias):
        super().__init__()
        self.proj = nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.proj(x)


def _peft(model: nn.Module, targets, r=4, alpha=8, dropout=0.0, **kw):
    # init_lora_weights=False: B != 0, so the LoRA term matters
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=dropout,
                          init_lora_weights=False, **kw)
    return peft.get_peft_model(model, cfg)


def peft_linear(k, n, dtype, bias=False, r=4, seed=0):
    torch.manual_seed(seed)
    model = _peft(_Proj(k, n, bias).to(DEVICE, dtype), ["proj"], r=r)
    layer = model.base_model.model.proj
    with torch.no_grad():  # a base bias of the size of real ones (nn.Linear's init is tiny)
        if bias:
            layer.base_layer.bias.normal_()
    return model, layer


def peft_mlp(h, i, dtype, r=4, seed=0, bias=False):
    torch.manual_seed(seed)
    mlp = SwiGLUMLP(h, i, bias=bias).to(DEVICE, dtype)
    model = _peft(mlp, ["gate_proj", "up_proj", "down_proj"], r=r)
    return model, mlp


def _factors(layer):
    name = layer.active_adapters[0]
    return layer.lora_A[name].weight, layer.lora_B[name].weight, layer.scaling[name]


def ref_linear(x, layer):
    """fp64 y = x W^T + b + s (x A^T) B^T from the same tensors."""
    a, b, s = _factors(layer)
    base = layer.base_layer
    y = F.linear(x.double(), base.weight.double(), None if base.bias is None else base.bias.double())
    return y + s * (x.double() @ a.double().t()) @ b.double().t()


def _leaves_grads(out, dy, leaves):
    return torch.autograd.grad(out, leaves, dy)


@pytest.mark.parametrize("dtype", BASE_DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_lora_linear_matches_peft(dtype, bias):
    _model, layer = peft_linear(24, 40, dtype, bias=bias)
    a, b, _s = _factors(layer)
    assert a.dtype == torch.float32 and layer.base_layer.weight.dtype == dtype
    x = torch.randn(2, 5, 24, device=DEVICE).to(dtype).requires_grad_()
    dy = torch.randn(2, 5, 40, device=DEVICE).to(dtype)

    want = layer(x)  # peft's forward: the rule's baseline
    want_grads = _leaves_grads(want, dy, [x, a, b])
    parts = lora_parts(layer, x)
    assert parts is not None
    got = lora_linear(x, *parts)
    assert type(got.grad_fn).__name__ == "LoraLinearFwdFunctionBackward"  # the fused node
    got_grads = _leaves_grads(got, dy, [x, a, b])

    rx, ra, rb = (t.detach().double().requires_grad_() for t in (x, a, b))
    base = layer.base_layer
    ref = F.linear(rx, base.weight.double(), None if base.bias is None else base.bias.double())
    ref = ref + layer.scaling["default"] * (rx @ ra.t()) @ rb.t()
    ref_grads = torch.autograd.grad(ref, [rx, ra, rb], dy.double())

    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, ref, dtype, "out", baseline=want)
    assert_close(got_grads[0], ref_grads[0], dtype, "dx", baseline=want_grads[0])
    # the LoRA gradients are fp32 numbers (fp32 factors, exact upcasts of the bf16 x and dy): the fp32 rule
    assert got_grads[1].dtype == got_grads[2].dtype == torch.float32
    assert_close(got_grads[1], ref_grads[1], torch.float32, "dA", baseline=want_grads[1])
    assert_close(got_grads[2], ref_grads[2], torch.float32, "dB", baseline=want_grads[2])


def test_lora_linear_trainable_base_gets_its_gradients():
    torch.manual_seed(2)
    x = torch.randn(7, 12, device=DEVICE, requires_grad=True)
    w, bias = torch.randn(9, 12, device=DEVICE, requires_grad=True), torch.randn(9, device=DEVICE, requires_grad=True)
    a, b = torch.randn(3, 12, device=DEVICE, requires_grad=True), torch.randn(9, 3, device=DEVICE, requires_grad=True)
    leaves = [x, w, bias, a, b]
    dy = torch.randn(7, 9, device=DEVICE)
    got = torch.autograd.grad(lora_linear(x, w, bias, a, b, 0.5), leaves, dy)
    r = [t.detach().double().requires_grad_() for t in leaves]
    ref = torch.autograd.grad(F.linear(r[0], r[1], r[2]) + 0.5 * (r[0] @ r[3].t()) @ r[4].t(), r, dy.double())
    for n, (g, rg) in enumerate(zip(got, ref)):
        assert_close(g, rg, torch.float32, f"grad of leaf {n}")


def test_lora_linear_frozen_base_and_frozen_x_get_no_gradient():
    _model, layer = peft_linear(8, 6, torch.float32)
    x = torch.randn(3, 8, device=DEVICE)  # no grad for x
    out = lora_linear(x, *lora_parts(layer, x))
    out.sum().backward()
    a, b, _ = _factors(layer)
    assert a.grad is not None and b.grad is not None
    assert layer.base_layer.weight.grad is None


def mlp_reference(x, mlp, dtype_ref=torch.float64):
    """fp64 down(silu(gate(x)) * up(x)) with each projection base + s (x A^T) B^T, on fresh leaves."""
    leaves = {"x": x.detach().to(dtype_ref).requires_grad_()}
    outs = {}

    def proj(name, inp):
        layer = getattr(mlp, name)
        a, b, s = _factors(layer)
        ra, rb = a.detach().to(dtype_ref).requires_grad_(), b.detach().to(dtype_ref).requires_grad_()
        leaves[f"{name}.A"], leaves[f"{name}.B"] = ra, rb
        base = layer.base_layer
        y = F.linear(inp, base.weight.to(dtype_ref), None if base.bias is None else base.bias.to(dtype_ref))
        return y + s * (inp @ ra.t()) @ rb.t()

    xr = leaves["x"]
    outs = proj("down_proj", F.silu(proj("gate_proj", xr)) * proj("up_proj", xr))
    return outs, leaves


def _mlp_leaves(x, mlp):
    leaves = {"x": x}
    for name in ("gate_proj", "up_proj", "down_proj"):
        a, b, _ = _factors(getattr(mlp, name))
        leaves[f"{name}.A"], leaves[f"{name}.B"] = a, b
    return leaves


def peft_mlp_forward(mlp, x):
    """What Qwen3MLP does under peft: each LoRA Linear called as a module, silu(g) * u in torch."""
    return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))


@pytest.mark.parametrize("dtype", BASE_DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("recompute_up", [False, True], ids=["save_up", "recompute_up"])
def test_lora_mlp_matches_peft(dtype, recompute_up, monkeypatch):
    # tiny chunks: the forward's row chunks and the backward's column chunks both iterate, ragged at the end
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", 200)
    _model, mlp = peft_mlp(16, 40, dtype, bias=recompute_up)  # biases on one of the two variants
    mlp.recompute_up = recompute_up
    x = torch.randn(13, 16, device=DEVICE).to(dtype).requires_grad_()
    dy = torch.randn(13, 16, device=DEVICE).to(dtype)
    leaves = _mlp_leaves(x, mlp)

    want = peft_mlp_forward(mlp, x)
    want_grads = dict(zip(leaves, torch.autograd.grad(want, list(leaves.values()), dy)))
    got = mlp(x)  # hearth.nn.SwiGLUMLP: peft projections in a plain state -> the fused LoRA node
    assert type(got.grad_fn).__name__ == "LoraSwigluMlpFwdFunctionBackward"
    got_grads = dict(zip(leaves, torch.autograd.grad(got, list(leaves.values()), dy)))
    ref, ref_leaves = mlp_reference(x, mlp)
    ref_grads = dict(zip(ref_leaves, torch.autograd.grad(ref, list(ref_leaves.values()), dy.double())))

    assert_close(got, ref, dtype, "out", baseline=want)
    assert_close(got_grads["x"], ref_grads["x"], dtype, "dx", baseline=want_grads["x"])
    for name in leaves:
        if name == "x":
            continue
        assert got_grads[name].dtype == torch.float32
        # A/B grads are fp32 results of bf16-rounded [rows, I] intermediates (g, u, h, dh, dg, du) when the
        # base is bf16: the rule in the base dtype with peft's own result as the baseline
        assert_close(got_grads[name], ref_grads[name], dtype, f"d{name}", baseline=want_grads[name])


# ------------------------------------------------------------------------------- what autograd saves
def saved_bytes(fn, params) -> tuple[torch.Tensor, list[tuple[tuple, torch.dtype, int]]]:
    """Run fn; return its output and the (shape, dtype, bytes) of every distinct non-parameter storage that
    autograd saved for the backward."""
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (seen.append(t), t)[1], lambda t: t):
        out = fn()
    skip = {p.untyped_storage().data_ptr() for p in params}
    rows, ptrs = [], set()
    for t in seen:
        ptr = t.untyped_storage().data_ptr()
        if ptr in skip or ptr in ptrs or t.untyped_storage().nbytes() == 0:
            continue
        ptrs.add(ptr)
        rows.append((tuple(t.shape), t.dtype, t.untyped_storage().nbytes()))
    return out, rows


def test_lora_linear_saves_bf16_x_and_the_rank_r_product_only():
    t, k, n, r = 6, 32, 48, 4
    model, layer = peft_linear(k, n, torch.bfloat16, r=r)
    x = torch.randn(t, k, device=DEVICE).to(torch.bfloat16).requires_grad_()
    _, peft_saved = saved_bytes(lambda: layer(x), model.parameters())
    _, ours = saved_bytes(lambda: lora_linear(x, *lora_parts(layer, x)), model.parameters())
    assert sorted(ours) == sorted([((t, k), torch.bfloat16, t * k * 2), ((t, r), torch.float32, t * r * 4)]), ours
    # peft keeps the fp32 copy of x for lora_A
    assert ((t, k), torch.float32, t * k * 4) in peft_saved, peft_saved
    assert sum(b for *_, b in ours) < sum(b for *_, b in peft_saved)


@pytest.mark.parametrize("recompute_up", [False, True], ids=["save_up", "recompute_up"])
def test_lora_mlp_saves_x_g_u_and_rank_r_products_not_h(recompute_up):
    t, h, i, r = 5, 16, 40, 4
    model, mlp = peft_mlp(h, i, torch.bfloat16, r=r)
    mlp.recompute_up = recompute_up
    x = torch.randn(t, h, device=DEVICE).to(torch.bfloat16).requires_grad_()
    _, peft_saved = saved_bytes(lambda: peft_mlp_forward(mlp, x), model.parameters())
    _, ours = saved_bytes(lambda: mlp(x), model.parameters())
    want = [((t, h), torch.bfloat16, t * h * 2), ((t, i), torch.bfloat16, t * i * 2),
            ((t, 2 * r), torch.float32, t * 2 * r * 4), ((t, r), torch.float32, t * r * 4)]
    if not recompute_up:
        want.append(((t, i), torch.bfloat16, t * i * 2))
    assert sorted(ours, key=str) == sorted(want, key=str), ours
    assert not any(dt == torch.float32 and shape[-1] in (h, i) for shape, dt, _ in ours)
    # peft keeps fp32 copies of x and of h (down_proj's lora_A input), and h itself
    assert ((t, h), torch.float32, t * h * 4) in peft_saved and ((t, i), torch.float32, t * i * 4) in peft_saved
    assert sum(b for *_, b in ours) < sum(b for *_, b in peft_saved)


# ------------------------------------------------------------------------------- fallbacks
def _fused_count(monkeypatch):
    import hearth.nn as hnn

    calls = []
    real = hnn.lora_swiglu_mlp
    monkeypatch.setattr(hnn, "lora_swiglu_mlp", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def test_mlp_falls_back_when_merged_disabled_or_dropout_trains(monkeypatch):
    model, mlp = peft_mlp(8, 24, torch.float32)
    calls = _fused_count(monkeypatch)
    x = torch.randn(3, 8, device=DEVICE)
    with torch.no_grad():
        lora_out = mlp(x)
        assert len(calls) == 1
        base = F.linear(F.silu(F.linear(x, mlp.gate_proj.base_layer.weight)) * F.linear(x, mlp.up_proj.base_layer.weight),
                        mlp.down_proj.base_layer.weight)
        assert not torch.allclose(lora_out, base)
        with model.disable_adapter():
            torch.testing.assert_close(mlp(x), base)
        assert len(calls) == 1  # disabled: peft's path
        model.merge_adapter()
        torch.testing.assert_close(mlp(x), lora_out, rtol=1e-5, atol=1e-5)
        assert len(calls) == 1  # merged: the base layers hold W + s B A; the LoRA node must not add it again
        model.unmerge_adapter()
        torch.testing.assert_close(mlp(x), lora_out, rtol=1e-5, atol=1e-5)
        assert len(calls) == 2
    # a trainable base, and dropout in training mode, are not plain either
    mlp.gate_proj.base_layer.weight.requires_grad_(True)
    assert mlp._lora_parts(x) is None
    mlp.gate_proj.base_layer.weight.requires_grad_(False)
    model2 = _peft(SwiGLUMLP(8, 24).to(DEVICE), ["gate_proj", "up_proj", "down_proj"], dropout=0.1)
    inner = model2.base_model.model
    inner.train()
    assert inner._lora_parts(x) is None
    inner.eval()
    assert inner._lora_parts(x) is not None


def test_lora_parts_refuses_what_is_not_plain():
    model, layer = peft_linear(8, 6, torch.bfloat16)
    x = torch.randn(2, 8, device=DEVICE).to(torch.bfloat16)
    assert lora_parts(layer, x) is not None
    assert lora_parts(layer, x.float()) is None  # input dtype is not the base's: peft decides what happens
    assert lora_parts(layer.base_layer) is None  # not a LoRA layer
    model.add_adapter("second", peft.LoraConfig(r=2, target_modules=["proj"]))
    model.base_model.set_adapter(["default", "second"])
    assert lora_parts(layer, x) is None  # two active adapters
    model.base_model.set_adapter("second")
    assert lora_parts(layer, x) is not None
    dmodel = _peft(_Proj(8, 6, False).to(DEVICE), ["proj"], use_dora=True)
    assert lora_parts(dmodel.base_model.model.proj) is None


# ------------------------------------------------------------------------------- errors
def test_lora_linear_names_the_bad_argument():
    x, w = torch.randn(3, 8, device=DEVICE), torch.randn(6, 8, device=DEVICE)
    a, b = torch.randn(2, 8, device=DEVICE), torch.randn(6, 2, device=DEVICE)
    with pytest.raises(ValueError, match=r"^lora_b\b"):
        lora_linear(x, w, None, a, b[:, :1], 1.0)
    with pytest.raises(ValueError, match=r"^lora_a\b"):
        lora_linear(x, w, None, a[:, :5], b, 1.0)
    with pytest.raises(ValueError, match=r"^x\b"):
        lora_linear(x[:, :5], w, None, a, b, 1.0)
    with pytest.raises(TypeError, match=r"^lora_a\b"):
        lora_linear(x.half(), w.half(), None, a.bfloat16(), b.bfloat16(), 1.0)
    with pytest.raises(TypeError, match=r"^scale\b"):
        lora_linear(x, w, None, a, b, "2")


def test_lora_mlp_refuses_a_trainable_base_naming_it():
    _model, mlp = peft_mlp(8, 24, torch.float32)
    ws = [getattr(mlp, n).base_layer.weight for n in ("gate_proj", "up_proj", "down_proj")]
    lora = [t for n in ("gate_proj", "up_proj", "down_proj") for t in _factors(getattr(mlp, n))[:2]]
    x = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"^w_up requires grad"):
        lora_swiglu_mlp(x, ws[0], ws[1].detach().requires_grad_(), ws[2], *lora, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^b_down\b"):
        lora_swiglu_mlp(x, *ws, *lora[:5], lora[5][:, :1], 1.0, 1.0, 1.0)


def test_torch_compile_fullgraph():
    torch.manual_seed(3)
    _model, layer = peft_linear(8, 12, torch.float32)
    w, _b, a, b, s, _ = lora_parts(layer)
    x = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"

    def loss(x, a, b):
        return lora_linear(x, w, None, a, b, s).square().sum()

    got = torch.autograd.grad(torch.compile(loss, backend=backend, fullgraph=True)(x, a, b), (x, a, b))
    want = torch.autograd.grad(loss(x, a, b), (x, a, b))
    for g, wv in zip(got, want):
        assert_close(g, wv, torch.float32)


def test_torch_compile_fullgraph_lora_mlp():
    _model, mlp = peft_mlp(8, 24, torch.float32, seed=4)
    parts = mlp._lora_parts(torch.empty(0, 8, device=DEVICE))
    (wg, _, ag, bg, sg, _), (wu, _, au, bu, su, _), (wd, _, ad, bd, sd, _) = parts
    x = torch.randn(5, 8, device=DEVICE, requires_grad=True)
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"

    def loss(x, ag, bg, au, bu, ad, bd):
        return lora_swiglu_mlp(x, wg, wu, wd, ag, bg, au, bu, ad, bd, sg, su, sd).square().sum()

    leaves = (x, ag, bg, au, bu, ad, bd)
    got = torch.autograd.grad(torch.compile(loss, backend=backend, fullgraph=True)(*leaves), leaves)
    want = torch.autograd.grad(loss(*leaves), leaves)
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_torch_compile_fullgraph_base_compute_matches_eager():
    """compute="base" through torch.compile (the custom ops with cast=True) against the eager Function route: a bf16
    base with fp32 factors, the same outputs and the same fp32 factor gradients, for lora_linear and the MLP."""
    _model, layer = peft_linear(8, 12, torch.bfloat16, seed=5)
    w, _b, a, b, s, _ = lora_parts(layer)
    x = torch.randn(4, 8, device=DEVICE).to(torch.bfloat16).requires_grad_()
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"

    def loss(x, a, b):
        return lora_linear(x, w, None, a, b, s, "base").float().square().sum()

    got = torch.autograd.grad(torch.compile(loss, backend=backend, fullgraph=True)(x, a, b), (x, a, b))
    want = torch.autograd.grad(loss(x, a, b), (x, a, b))
    assert got[1].dtype == got[2].dtype == torch.float32
    for g, wv in zip(got, want):
        torch.testing.assert_close(g, wv, rtol=2e-2, atol=2e-2)

    _model, mlp = peft_mlp(8, 24, torch.bfloat16, seed=6)
    (wg, _, ag, bg, sg, _), (wu, _, au, bu, su, _), (wd, _, ad, bd, sd, _) = mlp._lora_parts(None)
    xm = torch.randn(5, 8, device=DEVICE).to(torch.bfloat16).requires_grad_()

    def mlp_loss(x, ag, bg, au, bu, ad, bd):
        out = lora_swiglu_mlp(x, wg, wu, wd, ag, bg, au, bu, ad, bd, sg, su, sd, compute="base")
        return out.float().square().sum()

    leaves = (xm, ag, bg, au, bu, ad, bd)
    got = torch.autograd.grad(torch.compile(mlp_loss, backend=backend, fullgraph=True)(*leaves), leaves)
    want = torch.autograd.grad(mlp_loss(*leaves), leaves)
    assert all(g.dtype == torch.float32 for g in got[1:])
    for g, wv in zip(got, want):
        torch.testing.assert_close(g, wv, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("cast", [False, True], ids=["adapter", "base"])
def test_opcheck_lora_linear_ops(cast):
    """The ops as torch.compile sees them; cast (compute="base"): a bf16 x and base with fp32 factors."""
    dt = torch.bfloat16 if cast else torch.float32
    x, w = torch.randn(3, 8, device=DEVICE).to(dt), torch.randn(6, 8, device=DEVICE).to(dt)
    a, b = torch.randn(2, 8, device=DEVICE), torch.randn(6, 2, device=DEVICE)
    torch.library.opcheck(torch.ops.hearth.lora_linear_fwd, (x, w, None, a, b, 0.5, cast))
    xa = x @ a.to(dt).t()
    torch.library.opcheck(torch.ops.hearth.lora_linear_bwd, (torch.randn(3, 6, device=DEVICE).to(dt), x, xa, w, a, b,
                                                            0.5, True, True, True, cast))


@pytest.mark.parametrize("cast", [False, True], ids=["adapter", "base"])
def test_opcheck_lora_mlp_backward_op(cast):
    # the forward op is left out as in test_swiglu: it returns g and u only to save them, and the backward
    # reuses them as its gradient buffers; cast (compute="base"): bf16 activations and base, fp32 factors
    m, h, i, r = 3, 8, 24, 2
    dt = torch.bfloat16 if cast else torch.float32
    rnd = lambda *shape: torch.randn(*shape, device=DEVICE).to(dt)  # noqa: E731
    f32 = lambda *shape: torch.randn(*shape, device=DEVICE)  # noqa: E731
    args = (rnd(m, h), rnd(m, h), rnd(m, i), rnd(m, i), rnd(m, 2 * r), rnd(m, r), rnd(i, h), rnd(i, h), rnd(h, i), None,
            f32(r, h), f32(i, r), f32(r, h), f32(i, r), f32(r, i), f32(h, r), 0.5, 2.0, 1.5, False, cast)
    torch.library.opcheck(torch.ops.hearth.lora_swiglu_mlp_bwd, args)


# ------------------------------------------------------------------------------- GPU, realistic shapes
@pytest.mark.xdist_group("gpu_big")
@gpu_only
def test_gpu_lora_linear_real_shape_bf16():
    _model, layer = peft_linear(1024, 2816, torch.bfloat16, r=16, bias=False, seed=5)
    a, b, s = _factors(layer)
    x = torch.randn(512, 1024, device=DEVICE).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(512, 2816, device=DEVICE).to(torch.bfloat16)
    want = layer(x)
    want_grads = _leaves_grads(want, dy, [x, a, b])
    got = lora_linear(x, *lora_parts(layer, x))
    got_grads = _leaves_grads(got, dy, [x, a, b])
    rx, ra, rb = (t.detach().float().requires_grad_() for t in (x, a, b))
    ref = F.linear(rx, layer.base_layer.weight.float()) + s * (rx @ ra.t()) @ rb.t()  # fp32 (TF32 is off)
    ref_grads = torch.autograd.grad(ref, [rx, ra, rb], dy.float())
    assert_close(got, ref, torch.bfloat16, "out", baseline=want)
    assert_close(got_grads[0], ref_grads[0], torch.bfloat16, "dx", baseline=want_grads[0])
    assert_close(got_grads[1], ref_grads[1], torch.float32, "dA", baseline=want_grads[1])
    assert_close(got_grads[2], ref_grads[2], torch.float32, "dB", baseline=want_grads[2])


@pytest.mark.xdist_group("gpu_big")
@gpu_only
@pytest.mark.parametrize("recompute_up", [False, True], ids=["save_up", "recompute_up"])
def test_gpu_lora_mlp_real_shape_bf16(recompute_up):
    _model, mlp = peft_mlp(1024, 2816, torch.bfloat16, r=16, seed=6)
    mlp.recompute_up = recompute_up
    x = torch.randn(512, 1024, device=DEVICE).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(512, 1024, device=DEVICE).to(torch.bfloat16)
    leaves = _mlp_leaves(x, mlp)
    want = peft_mlp_forward(mlp, x)
    want_grads = dict(zip(leaves, torch.autograd.grad(want, list(leaves.values()), dy)))
    got = mlp(x)
    assert type(got.grad_fn).__name__ == "LoraSwigluMlpFwdFunctionBackward"
    got_grads = dict(zip(leaves, torch.autograd.grad(got, list(leaves.values()), dy)))
    ref, ref_leaves = mlp_reference(x, mlp, dtype_ref=torch.float32)
    ref_grads = dict(zip(ref_leaves, torch.autograd.grad(ref, list(ref_leaves.values()), dy.float())))
    assert_close(got, ref, torch.bfloat16, "out", baseline=want)
    for name in leaves:
        assert_close(got_grads[name], ref_grads[name], torch.bfloat16, f"d{name}", baseline=want_grads[name])


# ------------------------------------------------------------------------------- the GPU probe script
def test_lora_layer_probe_smoke(tmp_path):
    import json
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "lora_layer_probe.py"
    main = runpy.run_path(str(script), run_name="lora_layer_probe")["main"]
    out = tmp_path / "probe.jsonl"
    assert main(["--smoke", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["case"], r["provider"]) for r in rows] == [
        ("mlp", "peft"), ("mlp", "hearth"), ("mlp", "hearth_recompute_up"), ("mlp", "hearth_base"),
        ("q_proj", "peft"), ("q_proj", "hearth"), ("q_proj", "hearth_base"),
        ("o_proj", "peft"), ("o_proj", "hearth"), ("o_proj", "hearth_base")]
    saved = {(r["case"], r["provider"]): r["saved_mib"] for r in rows}
    for r in rows:
        assert r["ms"] > 0 and r["max_diff"] < 0.1
        if r["provider"] in ("hearth", "hearth_recompute_up"):
            assert r["saved_vs_peft"] < 1  # the fused nodes keep less than peft
        if r["provider"] == "hearth_base":
            # the node casts the factors inside itself and saves the fp32 parameters, not bf16 copies of them, and
            # its rank-r products are bf16: it keeps no more than the adapter-dtype node
            assert r["saved_mib"] <= saved[(r["case"], "hearth")], (r["case"], r["saved_mib"])


def test_lora_linear_base_compute_matches_pytorch_in_bf16():
    """lora_compute="base": the fp32 factors are cast to the bf16 base dtype and every LoRA GEMM runs in bf16.
    PyTorch's own bf16 computation of the same layer (factors cast to bf16, eager) is the rule's baseline; the
    reference is fp64 from the fp32 factors; the factors' gradients still arrive in fp32."""
    _model, layer = peft_linear(48, 40, torch.bfloat16)
    a, b, s = _factors(layer)
    x = torch.randn(3, 7, 48, device=DEVICE).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(3, 7, 40, device=DEVICE).to(torch.bfloat16)
    w = layer.base_layer.weight

    want = F.linear(x, w) + s * (x @ a.to(torch.bfloat16).t()) @ b.to(torch.bfloat16).t()
    want_grads = _leaves_grads(want, dy, [x, a, b])
    parts = lora_parts(layer, x, "base")
    assert parts[2].dtype == parts[3].dtype == torch.float32 and parts[5] == "base"  # cast in the node
    got = lora_linear(x, *parts)
    got_grads = _leaves_grads(got, dy, [x, a, b])
    assert got_grads[1].dtype == got_grads[2].dtype == torch.float32

    rx, ra, rb = (t.detach().double().requires_grad_() for t in (x, a, b))
    ref = F.linear(rx, w.double()) + s * (rx @ ra.t()) @ rb.t()
    ref_grads = torch.autograd.grad(ref, [rx, ra, rb], dy.double())
    for name, g, r, base in (("out", got, ref, want), ("dx", got_grads[0], ref_grads[0], want_grads[0]),
                             ("dA", got_grads[1], ref_grads[1], want_grads[1]),
                             ("dB", got_grads[2], ref_grads[2], want_grads[2])):
        assert_close(g, r, torch.bfloat16, name, baseline=base)
    # and it is a different computation from the adapter-dtype one (the test would pass vacuously otherwise)
    assert not torch.equal(got_grads[1], _leaves_grads(lora_linear(x, *lora_parts(layer, x)), dy, [x, a, b])[1])


def test_swiglu_mlp_base_compute_runs_the_lora_node_in_bf16():
    """With lora_compute="base" the fused node's rank-r products are bf16 (saved xa: [M, r_g + r_u]); with the
    default they are fp32; the fp32 factors get fp32 gradients either way."""
    model, mlp = peft_mlp(16, 24, torch.bfloat16)
    x = torch.randn(5, 16, device=DEVICE).to(torch.bfloat16).requires_grad_()
    for compute, want in (("adapter", torch.float32), ("base", torch.bfloat16)):
        mlp.lora_compute = compute
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = mlp(x)
        assert [t.dtype for t in saved if tuple(t.shape) == (5, 8)] == [want], compute  # x [A_gate; A_up]^T
        out.float().sum().backward()
        a = mlp.gate_proj.lora_A["default"].weight
        assert a.dtype == torch.float32 and a.grad is not None and a.grad.dtype == torch.float32
        a.grad = None
