"""kernels.lora on a bitsandbytes 4-bit base (QLoRA): lora_linear and lora_swiglu_mlp against peft's own LoRA
layers on the SAME 4-bit modules (bitsandbytes' NF4 / FP4 path runs on the CPU in the pinned version).

THE RULE (tests/kernels/tolerance.py): hearth's error against an fp64 reference <= 2x peft's own error in the same
dtype (+ the floor); the reference of a 4-bit base is built from the DEQUANTISED weight (what both compute with,
as hearth.patch._dequantized_twin judges a 4-bit module). Also: the dequantised weight is never kept for the
backward (what autograd saves; every dequantised temporary tracked until it dies), the MLP holds one at a time,
lora_parts / the node refuse what they cannot read, and a GPU test at the Qwen3-14B MLP shape bounds
torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import importlib
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hearth.kernels.lora import base_compute_dtype, dequantize, is_4bit, lora_linear, lora_parts, lora_swiglu_mlp
from hearth.nn import SwiGLUMLP
from tests.kernels.test_lora import _factors, _mlp_leaves, peft_mlp_forward  # the same peft layout, 4-bit or not
from tests.kernels.tolerance import DEVICE, HAS_CUDA, assert_close, gpu_only

bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")
klora = importlib.import_module("hearth.kernels.lora")
swiglu_module = importlib.import_module("hearth.kernels.swiglu")


# ------------------------------------------------------------------------------- 4-bit modules under peft
def linear_4bit(k, n, dtype, *, bias=False, double_quant=True, quant_type="nf4", device=DEVICE):
    """A bitsandbytes Linear4bit [n, k] computing in `dtype`, quantised (on `device`) from a random weight of
    nn.Linear's scale; double_quant: the absmax quantised again (bnb_4bit_use_double_quant=True: nested)."""
    w = torch.randn(n, k) / k**0.5
    with torch.device("meta"):
        q = bnb.nn.Linear4bit(k, n, bias=bias, compute_dtype=dtype, compress_statistics=double_quant,
                              quant_type=quant_type)
    q.weight = bnb.nn.Params4bit(w.to(dtype), requires_grad=False, compress_statistics=double_quant,
                                 quant_type=quant_type)
    if bias:
        q.bias = nn.Parameter(torch.randn(n, dtype=dtype), requires_grad=False)
    q = q.to(device)  # quantises here
    assert q.weight.quant_state.nested == double_quant
    return q


class _Proj(nn.Module):
    def __init__(self, proj):
        super().__init__()
        self.proj = proj

    def forward(self, x):
        return self.proj(x)


def _peft(model, targets, *, loaded_in_4bit=True, r=4, alpha=8):
    # loaded_in_4bit: what a quantised transformers model says (peft then wraps with its bnb.Linear4bit class;
    # without it, its plain lora.Linear around the Linear4bit). init_lora_weights=False: B != 0.
    model.is_loaded_in_4bit = loaded_in_4bit
    return peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                      init_lora_weights=False))


def peft_linear_4bit(k, n, dtype, *, seed=0, loaded_in_4bit=True, r=4, **kw):
    torch.manual_seed(seed)
    model = _peft(_Proj(linear_4bit(k, n, dtype, **kw)), ["proj"], loaded_in_4bit=loaded_in_4bit, r=r)
    return model, model.base_model.model.proj


def peft_mlp_4bit(h, i, dtype, *, seed=0, r=4, bias=False, double_quant=True, device=DEVICE):
    torch.manual_seed(seed)
    with torch.device("meta"):
        mlp = SwiGLUMLP(h, i)
    kw = dict(bias=bias, double_quant=double_quant, device=device)
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = linear_4bit(h, i, dtype, **kw), linear_4bit(h, i, dtype, **kw), \
        linear_4bit(i, h, dtype, **kw)
    model = _peft(mlp, ["gate_proj", "up_proj", "down_proj"], r=r)
    for p in model.parameters():  # the LoRA factors fp32 on the device (peft's default beside a 16-bit compute)
        assert p.device.type == torch.device(device).type
    return model, mlp


def _dequantised(layer, dtype=torch.float64):
    base = layer.base_layer
    return bnb.functional.dequantize_4bit(base.weight.data, base.weight.quant_state).to(dtype)


def _ref_proj(layer, inp, leaves, name, dtype_ref):
    a, b, s = _factors(layer)
    ra, rb = a.detach().to(dtype_ref).requires_grad_(), b.detach().to(dtype_ref).requires_grad_()
    leaves[f"{name}.A"], leaves[f"{name}.B"] = ra, rb
    bias = layer.base_layer.bias
    y = F.linear(inp, _dequantised(layer, dtype_ref), None if bias is None else bias.to(dtype_ref))
    return y + s * (inp @ ra.t()) @ rb.t()


def _grads(out, dy, leaves: dict) -> dict:
    return dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()), dy)))


# ------------------------------------------------------------------------------- lora_linear
CASES = [  # (compute dtype, double quant, quant type, bias, peft's 4-bit class or its plain Linear around it)
    (torch.bfloat16, True, "nf4", False, True),
    (torch.bfloat16, False, "nf4", True, True),
    (torch.bfloat16, True, "fp4", False, True),
    (torch.bfloat16, True, "nf4", False, False),
    (torch.float32, True, "nf4", True, True),
]


@pytest.mark.parametrize("dtype, double_quant, quant_type, bias, loaded_in_4bit", CASES,
                         ids=["bf16-nested-nf4", "bf16-nf4-bias", "bf16-nested-fp4", "bf16-nested-nf4-peftLinear",
                              "fp32-nested-nf4-bias"])
def test_lora_linear_4bit_matches_peft(dtype, double_quant, quant_type, bias, loaded_in_4bit):
    _model, layer = peft_linear_4bit(64, 96, dtype, bias=bias, double_quant=double_quant, quant_type=quant_type,
                                     loaded_in_4bit=loaded_in_4bit)
    assert type(layer).__name__ == ("Linear4bit" if loaded_in_4bit else "Linear")
    a, b, s = _factors(layer)
    x = torch.randn(2, 5, 64, device=DEVICE).to(dtype).requires_grad_()
    dy = torch.randn(2, 5, 96, device=DEVICE).to(dtype)
    leaves = {"x": x, "A": a, "B": b}

    want = layer(x)  # peft's forward on bitsandbytes: the rule's baseline
    want_grads = _grads(want, dy, leaves)
    parts = lora_parts(layer, x)
    assert parts is not None and is_4bit(parts[0])
    got = lora_linear(x, *parts)
    assert type(got.grad_fn).__name__ == "_LoraLinear4bitBackward"  # the fused node
    got_grads = _grads(got, dy, leaves)
    assert layer.base_layer.weight.grad is None

    ref_leaves = {"x": x.detach().double().requires_grad_()}
    ref = _ref_proj(layer, ref_leaves["x"], ref_leaves, "proj", torch.float64)
    ref_leaves["A"], ref_leaves["B"] = ref_leaves.pop("proj.A"), ref_leaves.pop("proj.B")
    ref_grads = _grads(ref, dy.double(), ref_leaves)

    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, ref, dtype, "out", baseline=want)
    assert_close(got_grads["x"], ref_grads["x"], dtype, "dx", baseline=want_grads["x"])
    for name in ("A", "B"):  # fp32 numbers from exact upcasts of x and dy: the fp32 rule, as on a 16-bit base
        assert got_grads[name].dtype == torch.float32
        assert_close(got_grads[name], ref_grads[name], torch.float32, f"d{name}", baseline=want_grads[name])


class _Tracker:
    """Wraps kernels.lora.dequantize: counts the calls and follows every dequantised temporary until it dies
    (weakref), recording the most alive at once."""

    def __init__(self, monkeypatch):
        self.calls, self.alive, self.peak = 0, 0, 0
        real = klora.dequantize

        def tracked(weight, dtype):
            out = real(weight, dtype)
            if out is not weight:
                self.calls += 1
                self.alive += 1
                self.peak = max(self.peak, self.alive)
                weakref.finalize(out, self._died)
            return out

        monkeypatch.setattr(klora, "dequantize", tracked)

    def _died(self):
        self.alive -= 1


def test_lora_linear_4bit_dequantises_per_use_and_saves_only_the_packed_weight(monkeypatch):
    _model, layer = peft_linear_4bit(64, 96, torch.bfloat16)
    x = torch.randn(7, 64, device=DEVICE).to(torch.bfloat16).requires_grad_()
    track = _Tracker(monkeypatch)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
        out = lora_linear(x, *lora_parts(layer, x))
    assert track.calls == 1 and track.alive == 0  # the forward's temporary died with the forward
    packed = layer.base_layer.weight
    assert any(t is packed for t in saved)
    assert not any(t.is_floating_point() and t.dim() == 2 and tuple(t.shape) == (96, 64) for t in saved), \
        [(tuple(t.shape), t.dtype) for t in saved]
    out.float().sum().backward()
    assert track.calls == 2 and track.peak == 1 and track.alive == 0  # dequantised again for dx, then freed
    # no dx wanted: the backward does not dequantise at all
    x2 = torch.randn(3, 64, device=DEVICE).to(torch.bfloat16)
    lora_linear(x2, *lora_parts(layer, x2)).float().sum().backward()
    assert track.calls == 3


# ------------------------------------------------------------------------------- lora_swiglu_mlp
def mlp_reference(x, mlp, dtype_ref=torch.float64):
    leaves = {"x": x.detach().to(dtype_ref).requires_grad_()}

    def proj(name, inp):
        return _ref_proj(getattr(mlp, name), inp, leaves, name, dtype_ref)

    xr = leaves["x"]
    return proj("down_proj", F.silu(proj("gate_proj", xr)) * proj("up_proj", xr)), leaves


def check_mlp_against_peft(mlp, x, dy, dtype, dtype_ref):
    leaves = _mlp_leaves(x, mlp)
    want = peft_mlp_forward(mlp, x)
    want_grads = _grads(want, dy, leaves)
    got = mlp(x)  # hearth.nn.SwiGLUMLP: peft LoRA over 4-bit bases in a plain state -> the fused LoRA node
    assert type(got.grad_fn).__name__ == "_LoraMlp4bitBackward"
    got_grads = _grads(got, dy, leaves)
    ref, ref_leaves = mlp_reference(x, mlp, dtype_ref)
    ref_grads = _grads(ref, dy.to(dtype_ref), ref_leaves)
    assert_close(got, ref, dtype, "out", baseline=want)
    for name in leaves:
        if name != "x":
            assert got_grads[name].dtype == torch.float32
        # the A/B grads pass through bf16-rounded [rows, I] intermediates (g, u, h, dg, du): the rule in the base
        # dtype with peft's own result as the baseline, as for a 16-bit base (tests/kernels/test_lora.py)
        assert_close(got_grads[name], ref_grads[name], dtype, f"d{name}", baseline=want_grads[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("recompute_up", [False, True], ids=["save_up", "recompute_up"])
def test_lora_mlp_4bit_matches_peft(dtype, recompute_up, monkeypatch):
    # tiny chunks: the forward's row chunks and the backward's column chunks both iterate, ragged at the end
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", 1500)
    _model, mlp = peft_mlp_4bit(64, 96, dtype, bias=recompute_up, double_quant=not recompute_up)
    mlp.recompute_up = recompute_up
    x = torch.randn(13, 64, device=DEVICE).to(dtype).requires_grad_()
    dy = torch.randn(13, 64, device=DEVICE).to(dtype)
    check_mlp_against_peft(mlp, x, dy, dtype, torch.float64)


@pytest.mark.parametrize("recompute_up", [False, True], ids=["save_up", "recompute_up"])
def test_lora_mlp_4bit_holds_one_dequantised_weight_at_a_time(recompute_up, monkeypatch):
    """Three dequantisations in the forward and three in the backward, none alive between them; one at a time
    (W_up beside W_down with recompute_up, whose re-formed u needs both); nothing dequantised is saved."""
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", 1500)
    _model, mlp = peft_mlp_4bit(64, 96, torch.bfloat16)
    mlp.recompute_up = recompute_up
    x = torch.randn(2, 9, 64, device=DEVICE).to(torch.bfloat16).requires_grad_()
    track = _Tracker(monkeypatch)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
        out = mlp(x)
    assert track.calls == 3 and track.alive == 0
    assert track.peak == (2 if recompute_up else 1)
    shapes = {(96, 64), (64, 96)}
    assert not any(t.is_floating_point() and tuple(t.shape) in shapes for t in saved), \
        [(tuple(t.shape), t.dtype) for t in saved]
    track.peak = 0
    out.float().sum().backward()
    assert track.calls == 6 and track.alive == 0
    assert track.peak == (2 if recompute_up else 1)
    assert mlp.gate_proj.lora_A["default"].weight.grad is not None and x.grad is not None


def test_lora_mlp_4bit_backward_runs_once():
    _model, mlp = peft_mlp_4bit(64, 96, torch.float32)
    x = torch.randn(5, 64, device=DEVICE, requires_grad=True)
    out = mlp(x).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()  # g and u became dg and du in place


def test_mixed_16bit_and_4bit_projections():
    """One 4-bit projection among 16-bit ones: each weight is taken as it is (dequantised or not)."""
    _model, mlp = peft_mlp_4bit(64, 96, torch.float32, seed=3)
    q = mlp.up_proj.base_layer
    x = torch.randn(6, 64, device=DEVICE, requires_grad=True)
    parts = mlp._lora_parts(x)
    (wg, _, ag, bg, sg, _), (wu, _, au, bu, su, _), (wd, _, ad, bd, sd, _) = parts
    plain_g, plain_d = dequantize(wg, torch.float32), dequantize(wd, torch.float32)
    got = lora_swiglu_mlp(x, plain_g, wu, plain_d, ag, bg, au, bu, ad, bd, sg, su, sd)
    assert type(got.grad_fn).__name__ == "_LoraMlp4bitBackward" and is_4bit(q.weight)
    want = lora_swiglu_mlp(x, plain_g, dequantize(wu, torch.float32), plain_d, ag, bg, au, bu, ad, bd, sg, su, sd)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    gx = torch.autograd.grad(got.sum(), x)[0]
    torch.testing.assert_close(gx, torch.autograd.grad(want.sum(), x)[0], rtol=1e-6, atol=1e-6)


def test_base_compute_on_a_4bit_base_runs_the_lora_products_in_bf16():
    """lora_compute="base": the factors cast to the compute dtype (bf16), on a 4-bit base as on a 16-bit one:
    the saved rank-r products are bf16, the fp32 factors still get fp32 gradients, and the output stays within
    the rule against the fp64 reference (PyTorch's own bf16 computation with bf16 factors as the baseline)."""
    _model, mlp = peft_mlp_4bit(64, 96, torch.bfloat16, seed=5)
    mlp.lora_compute = "base"
    x = torch.randn(5, 64, device=DEVICE).to(torch.bfloat16).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = mlp(x)
    assert type(out.grad_fn).__name__ == "_LoraMlp4bitBackward"
    assert [t.dtype for t in saved if tuple(t.shape) == (5, 8)] == [torch.bfloat16]  # x [A_gate; A_up]^T
    out.float().sum().backward()
    a = mlp.gate_proj.lora_A["default"].weight
    assert a.grad is not None and a.grad.dtype == torch.float32
    _model, layer = peft_linear_4bit(64, 96, torch.bfloat16, seed=6)
    parts = lora_parts(layer, x, "base")
    assert parts[2].dtype == parts[3].dtype == torch.float32 and parts[5] == "base"  # cast in the node
    got = lora_linear(x, *parts)
    a, b, s = _factors(layer)
    w = _dequantised(layer, torch.bfloat16)
    want = F.linear(x, w) + s * (x @ a.to(torch.bfloat16).t()) @ b.to(torch.bfloat16).t()
    ref = F.linear(x.double(), w.double()) + s * (x.double() @ a.double().t()) @ b.double().t()
    assert_close(got, ref, torch.bfloat16, "out", baseline=want)


# ------------------------------------------------------------------------------- what is refused
def test_lora_parts_4bit_refuses_what_the_node_cannot_read():
    _model, layer = peft_linear_4bit(64, 96, torch.bfloat16)
    x = torch.randn(2, 64, device=DEVICE).to(torch.bfloat16)
    assert lora_parts(layer, x) is not None
    assert base_compute_dtype(layer.base_layer) == torch.bfloat16
    assert lora_parts(layer, x.float()) is None  # x is not in the compute dtype: bitsandbytes casts, peft decides
    qs = layer.base_layer.weight.quant_state
    qs.packing_format_for_cpu = True  # bitsandbytes' CPU inference layout (set by an eval no-grad CPU forward)
    try:
        assert lora_parts(layer, x) is None
        with pytest.raises(ValueError, match=r"^weight is in bitsandbytes' CPU inference packing"):
            lora_linear(x, layer.base_layer.weight, None, *_factors(layer))
    finally:
        qs.packing_format_for_cpu = False
    # 8-bit bases are left to peft
    with torch.device("meta"):
        q8 = bnb.nn.Linear8bitLt(64, 96, bias=False, has_fp16_weights=False)
    assert base_compute_dtype(q8) is None


def test_lora_linear_4bit_names_the_bad_argument():
    _model, layer = peft_linear_4bit(64, 96, torch.bfloat16)
    a, b, s = _factors(layer)
    w = layer.base_layer.weight
    x = torch.randn(3, 64, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^x must be \[\.\.\., 64\]"):
        lora_linear(x[:, :32], w, None, a, b, s)
    with pytest.raises(ValueError, match=r"^lora_b\b"):
        lora_linear(x, w, None, a, b[:48], s)
    with pytest.raises(TypeError, match=r"^bias\b"):
        lora_linear(x, w, torch.zeros(96, device=DEVICE), a, b, s)  # fp32 bias beside a bf16 x
    _model, mlp = peft_mlp_4bit(64, 96, torch.bfloat16)
    (wg, _, ag, bg, sg, _), (wu, _, au, bu, su, _), (wd, _, ad, bd, sd, _) = mlp._lora_parts(x)
    with pytest.raises(ValueError, match=r"^w_down must be \[64, 96\]"):
        lora_swiglu_mlp(x, wg, wu, wu, ag, bg, au, bu, ad, bd, sg, su, sd)


def test_torch_compile_graph_breaks_around_the_4bit_node():
    _model, layer = peft_linear_4bit(64, 96, torch.float32, seed=2)
    w, bias, a, b, s, _ = lora_parts(layer)
    x = torch.randn(4, 64, device=DEVICE, requires_grad=True)

    def loss(x, a, b):
        return lora_linear(x, w, bias, a, b, s).square().sum()

    got = torch.autograd.grad(torch.compile(loss, backend="aot_eager")(x, a, b), (x, a, b))
    want = torch.autograd.grad(loss(x, a, b), (x, a, b))
    for g, wv in zip(got, want):
        assert_close(g, wv, torch.float32)


# ------------------------------------------------------------------------------- GPU, the Qwen3-14B MLP shape
HIDDEN, INTER, TOKENS = 5120, 17408, 384


@pytest.mark.xdist_group("gpu_big")
@gpu_only
def test_gpu_qlora_mlp_real_shape_matches_peft_and_keeps_no_dequantised_weight():
    """hidden 5120, intermediate 17408 (Qwen3-14B), NF4 double-quantised, bf16 compute, r=16 fp32 adapters, 384
    tokens: against peft on the same 4-bit modules (fp32 reference from the dequantised weights), and memory:
    after the forward nothing of a weight's size is held; the forward and backward peaks stay below one
    dequantised [I, H] bf16 weight (178 MB) plus the activations' working set (two would not fit)."""
    assert HAS_CUDA
    _model, mlp = peft_mlp_4bit(HIDDEN, INTER, torch.bfloat16, r=16, seed=7)
    gen = torch.Generator(device=DEVICE).manual_seed(8)
    x = torch.randn(TOKENS, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(TOKENS, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16)
    check_mlp_against_peft(mlp, x, dy, torch.bfloat16, torch.float32)

    w_bytes = HIDDEN * INTER * 2
    act_bytes = TOKENS * INTER * 2  # one [T, I] bf16 activation (g, u, a chunk of h / dh): 13 MB
    slack = 8 * act_bytes + (32 << 20)  # g, u, the fp32 upcasts of [T, I] chunks, dx, cuBLAS workspace
    assert 2 * w_bytes > w_bytes + slack  # the bound tells one dequantised weight from two
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = mlp(x)
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - start
    held = torch.cuda.memory_allocated() - start
    assert held <= 3 * act_bytes + (8 << 20), held  # out, g, u and the rank-r products; no weight
    assert fwd_peak <= w_bytes + slack, (fwd_peak, w_bytes)
    before_bwd = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(out, [x] + [p for p in mlp.parameters() if p.requires_grad], dy)
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - before_bwd
    assert bwd_peak <= w_bytes + slack, (bwd_peak, w_bytes)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.xdist_group("gpu_big")
@gpu_only
def test_gpu_qlora_linear_real_shape_matches_peft_and_keeps_no_dequantised_weight():
    """gate_proj's shape (17408 x 5120, NF4 double-quantised, bf16, r=16): peft's numbers and its memory rule."""
    _model, layer = peft_linear_4bit(HIDDEN, INTER, torch.bfloat16, r=16, seed=9)
    a, b, s = _factors(layer)
    gen = torch.Generator(device=DEVICE).manual_seed(10)
    x = torch.randn(TOKENS, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(TOKENS, INTER, device=DEVICE, generator=gen).to(torch.bfloat16)
    leaves = {"x": x, "A": a, "B": b}
    want = layer(x)
    want_grads = _grads(want, dy, leaves)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = lora_linear(x, *lora_parts(layer, x))
    torch.cuda.synchronize()
    w_bytes, out_bytes = HIDDEN * INTER * 2, TOKENS * INTER * 2
    assert torch.cuda.memory_allocated() - start <= out_bytes + (4 << 20)  # out and x A^T; no weight
    assert torch.cuda.max_memory_allocated() - start <= w_bytes + 2 * out_bytes + (32 << 20)
    torch.cuda.reset_peak_memory_stats()
    before_bwd = torch.cuda.memory_allocated()
    got_grads = _grads(got, dy, leaves)
    assert torch.cuda.max_memory_allocated() - before_bwd <= w_bytes + 3 * out_bytes + (32 << 20)
    ref_leaves = {"x": x.detach().float().requires_grad_()}
    ref = _ref_proj(layer, ref_leaves["x"], ref_leaves, "proj", torch.float32)  # fp32 (TF32 is off)
    ref_leaves["A"], ref_leaves["B"] = ref_leaves.pop("proj.A"), ref_leaves.pop("proj.B")
    ref_grads = _grads(ref, dy.float(), ref_leaves)
    assert_close(got, ref, torch.bfloat16, "out", baseline=want)
    assert_close(got_grads["x"], ref_grads["x"], torch.bfloat16, "dx", baseline=want_grads["x"])
    for name in ("A", "B"):
        assert_close(got_grads[name], ref_grads[name], torch.float32, f"d{name}", baseline=want_grads[name])
