"""hearth.kernels.linear_cross_entropy against an fp32 PyTorch reference (full logits), every option,
gradients w.r.t. input, weight and bias, chunking, frozen weight, bf16 grad_W drift, bad input,
torch.compile. Runs hearth's own ce_rows_ (the Triton row kernel, interpreted on the CPU)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from hearth.kernels.linear_cross_entropy import chunk_rows_for, linear_cross_entropy
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only

# the module, not the function: hearth.kernels re-exports linear_cross_entropy under the same name
lce_mod = importlib.import_module("hearth.kernels.linear_cross_entropy")


def reference(x, w, target, bias=None, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0, softcap=None):
    """fp32 math of hearth's cross_entropy on the full logits (mean over non-ignored rows, 0 if none)."""
    logits = x.float() @ w.float().t()
    if bias is not None:
        logits = logits + bias.float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    valid = target != ignore_index
    safe_t = torch.where(valid, target, 0)
    rows = F.cross_entropy(logits, safe_t, reduction="none", label_smoothing=label_smoothing)
    if z_loss:
        rows = rows + z_loss * torch.logsumexp(logits, dim=-1) ** 2
    rows = torch.where(valid, rows, torch.zeros_like(rows))
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / valid.sum().clamp(min=1)


def _inputs(n, h, v, dtype, *, seed=0, bias=False, ignore_every=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g).to(DEVICE, dtype)
    w = (torch.randn(v, h, generator=g) * (2.0 / h ** 0.5)).to(DEVICE, dtype)
    t = torch.randint(0, v, (n,), generator=g).to(DEVICE)
    if ignore_every:
        t[::ignore_every] = -100
    b = (torch.randn(v, generator=g) * 0.5).to(DEVICE, dtype) if bias else None
    return x, w, t, b


def _grads(fn, x, w, b, grad_out):
    leaves = [x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
    if b is not None:
        leaves.append(b.detach().clone().requires_grad_())
    loss = fn(*leaves)
    loss.backward(grad_out)
    return loss.detach(), [leaf.grad for leaf in leaves]


OPTIONS = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(label_smoothing=0.1),
    dict(z_loss=1e-3),
    dict(softcap=5.0),
    dict(ignore_index=3, label_smoothing=0.2, z_loss=1e-2, softcap=3.0),
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("bias", [False, True])
def test_loss_and_all_gradients_fp32(opts, bias):
    n, h, v = 23, 16, 37
    x, w, t, b = _inputs(n, h, v, torch.float32, bias=bias)
    if opts.get("ignore_index") == 3:
        t[t == -100] = 3
        t[1::4] = 3
    reduction = opts.get("reduction", "mean")
    grad_out = torch.randn(n, device=DEVICE) if reduction == "none" else torch.tensor(1.7, device=DEVICE)
    # chunk_rows=8: three chunks, the last one partial.
    got, got_g = _grads(lambda x_, w_, *b_: linear_cross_entropy(x_, w_, t, linear_bias=b_[0] if b_ else None, chunk_rows=8, **opts), x, w, b, grad_out)
    ref, ref_g = _grads(lambda x_, w_, *b_: reference(x_, w_, t, b_[0] if b_ else None, **opts), x, w, b, grad_out)
    assert_close(got, ref, torch.float32, msg="loss")
    for name, a, e in zip(("input", "weight", "bias"), got_g, ref_g):
        assert_close(a, e, torch.float32, msg=f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_matches_fp32_reference(dtype):
    n, h, v = 40, 32, 4099 // 40  # vocab not a power of two
    x, w, t, b = _inputs(n, h, v, dtype, bias=True)
    grad_out = torch.tensor(1.0, device=DEVICE)
    got, got_g = _grads(lambda *a: linear_cross_entropy(a[0], a[1], t, linear_bias=a[2], chunk_rows=16), x, w, b, grad_out)
    ref, ref_g = _grads(lambda *a: reference(a[0], a[1], t, a[2]), x.float(), w.float(), b.float(), grad_out)
    assert_close(got, ref, dtype, msg="loss")
    # gradients are ~1/n_valid in size: compare relative to their scale
    for name, a, e in zip(("input", "weight", "bias"), got_g, ref_g):
        s = e.abs().max().item()
        torch.testing.assert_close(a.float() / s, e / s, atol=2e-2, rtol=0, msg=lambda m: f"grad {name}\n{m}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp16_stores_unscaled_gradient(dtype, monkeypatch):
    # LESSON 7: 1/n_valid folded into fp16 d/dlogits zeroes entries ~1/(V*n) (below fp16's smallest
    # subnormal at real sizes). fp16 must hand ce_rows_ grad_scale=1.0 and apply 1/n_valid to the
    # finished gradients; bf16 (fp32's exponent range) folds the device-side 1/n_valid in.
    seen = []
    real = lce_mod._ce_rows()

    def spy(logits, target, **kw):
        seen.append(kw["grad_scale"])
        return real(logits, target, **kw)

    monkeypatch.setattr(lce_mod, "_ce_rows", lambda: spy)
    x, w, t, _ = _inputs(24, 16, 40, dtype)
    _, (gx, gw) = _grads(lambda a, b_: linear_cross_entropy(a, b_, t, chunk_rows=8), x, w, None, torch.tensor(1.0, device=DEVICE))
    _, (rx, rw) = _grads(lambda a, b_: reference(a, b_, t), x.float(), w.float(), None, torch.tensor(1.0, device=DEVICE))
    assert len(seen) == 3
    if dtype == torch.float16:
        assert all(s == 1.0 and not isinstance(s, torch.Tensor) for s in seen)
    else:
        assert all(isinstance(s, torch.Tensor) and s.dim() == 0 for s in seen)
    for a, e in ((gx, rx), (gw, rw)):
        torch.testing.assert_close(a.float(), e, atol=2e-2 * e.abs().max().item(), rtol=0)


def test_all_ignored_gives_zero_loss_and_zero_grads():
    x, w, t, _ = _inputs(9, 8, 11, torch.float32)
    t[:] = -100
    loss, (gx, gw) = _grads(lambda a, b_: linear_cross_entropy(a, b_, t, chunk_rows=4), x, w, None, torch.tensor(1.0, device=DEVICE))
    assert loss.item() == 0.0
    assert gx.abs().max().item() == 0.0 and gw.abs().max().item() == 0.0


def test_frozen_weight_skips_weight_gradient_gemm(monkeypatch):
    x, w, t, _ = _inputs(12, 8, 19, torch.float32)
    seen = {}
    real = lce_mod._run_chunks

    def spy(*args, **kw):
        seen.update(need_gw=kw["need_gw"], need_gx=kw["need_gx"])
        return real(*args, **kw)

    monkeypatch.setattr(lce_mod, "_run_chunks", spy)
    xg = x.clone().requires_grad_()
    linear_cross_entropy(xg, w, t, chunk_rows=5).backward()
    assert seen == dict(need_gw=False, need_gx=True)
    assert w.grad is None
    ref_x = x.clone().requires_grad_()
    reference(ref_x, w, t).backward()
    assert_close(xg.grad, ref_x.grad, torch.float32)


def test_gradients_are_handed_over_without_a_copy(monkeypatch):
    # autograd must adopt the buffers computed in the forward as .grad (a clone of grad_W would
    # cost another [V, H] of memory and a pass over it)
    x, w, t, _ = _inputs(12, 8, 19, torch.float32)
    ptrs = {}
    real = lce_mod._run_chunks

    def spy(*args, **kw):
        out = real(*args, **kw)
        ptrs.update(gx=out[1].data_ptr(), gw=out[2].data_ptr())
        return out

    monkeypatch.setattr(lce_mod, "_run_chunks", spy)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    linear_cross_entropy(xg, wg, t, chunk_rows=5).backward()
    assert ptrs == dict(gx=xg.grad.data_ptr(), gw=wg.grad.data_ptr())


def test_no_grad_computes_loss_only(monkeypatch):
    x, w, t, _ = _inputs(12, 8, 19, torch.float32)
    x.requires_grad_()
    with torch.no_grad():
        loss = linear_cross_entropy(x, w, t, chunk_rows=5)
    assert_close(loss, reference(x.detach(), w, t), torch.float32)


def test_leading_dims_flattened():
    x, w, t, _ = _inputs(12, 8, 19, torch.float32)
    x3 = x.reshape(3, 4, 8).clone().requires_grad_()
    linear_cross_entropy(x3, w, t, chunk_rows=5).backward()
    assert x3.grad.shape == (3, 4, 8)


def test_second_backward_refused():
    x, w, t, _ = _inputs(6, 8, 9, torch.float32)
    loss = linear_cross_entropy(x.requires_grad_(), w, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()


def test_chunk_rows_from_budget():
    assert lce_mod.EXTRA_MEMORY_BUDGET == 224 << 20 and lce_mod.CHUNK_ROWS_MAX == 768
    assert chunk_rows_for(8192, 131072, 2) == 768  # the row cap: 11 chunks (the last 512 rows), 192 MiB
    assert chunk_rows_for(8192, 151936, 2) == 768  # 11 chunks, 222.6 MiB
    assert chunk_rows_for(12289, 151936, 2) == 768  # 17 chunks: ceil(12289/17) = 723 -> 768
    assert chunk_rows_for(4096, 128256, 2) == 768  # 6 chunks: ceil(4096/6) = 683 -> 768 (the last 256)
    assert chunk_rows_for(8192, 262144, 2) == 384  # the memory cap: 224 MiB / 512 KiB = 448 -> 384 (x128)
    assert chunk_rows_for(8192, 131072, 4) == 384  # fp32 logits: 512 KiB a row
    assert chunk_rows_for(600, 32000, 2) == 600  # under the cap: one chunk
    assert chunk_rows_for(1600, 32000, 2) == 768  # 3 chunks: ceil(1600/3) = 534 -> 768 (x256), the last 64
    assert chunk_rows_for(8192, 131072, 2, budget=64 << 20) == 256  # cap 256 -> x128
    assert chunk_rows_for(8192, 151936, 2, budget=64 << 20) == 192  # 220 -> 192 (x64)
    assert chunk_rows_for(8192, 131072, 2, max_rows=400) == 384  # 400 -> 384 (x128), 22 chunks
    assert chunk_rows_for(10, 131072, 2) == 10
    assert chunk_rows_for(100, 1 << 30, 4) == 1
    assert chunk_rows_for(100, 1 << 20, 4, budget=40 << 20) == 10  # cap 10: x1 (16 > 10)
    assert chunk_rows_for(100, 1 << 20, 4, budget=80 << 20) == 16  # cap 20 -> 16 (x8)
    for n, v, budget in ((8192, 151936, None), (777, 50000, 16 << 20), (5000, 4099, 1 << 20), (12345, 32000, None),
                         (8192, 262144, None), (20000, 128256, 200 << 20), (3000, 9000, 5 << 20)):
        rows = chunk_rows_for(n, v, 2, budget=budget)
        max_rows = min(lce_mod.CHUNK_ROWS_MAX, (budget or lce_mod.EXTRA_MEMORY_BUDGET) // (v * 2))
        step = next(m for m in lce_mod.CHUNK_ROW_STEPS if 2 * m <= max_rows or m == 1)
        cap = max_rows - max_rows % step
        assert rows <= lce_mod.CHUNK_ROWS_MAX
        assert rows * v * 2 <= (budget or lce_mod.EXTRA_MEMORY_BUDGET)  # the logits chunk fits the budget
        assert 2 * step <= max_rows  # the step is at most half the cap (so at most half of it is rounded away)
        assert rows % step == 0 and -(-n // rows) == -(-n // cap)  # full row tiles, fewest chunks at that cap


def test_backward_allocates_no_zero_gradient_buffers():
    # The op's carrier outputs (grad_x, grad_W, grad_b, factor) must not get materialised zero
    # gradients in the backward: at H=4096 V=131072 that was a 1 GiB [V, H] + 64 MiB [N, H] alloc.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocs(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.big = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else (out,):
                # a new buffer as large as grad_x (views such as detach share an input's storage)
                if isinstance(t, torch.Tensor) and t.numel() >= 12 * 8 and t.untyped_storage().data_ptr() not in inputs:
                    self.big.append((str(func), tuple(t.shape)))
            return out

    x, w, t, b = _inputs(12, 8, 19, torch.float32, bias=True)
    xg, wg, bg = (v.clone().requires_grad_() for v in (x, w, b))
    loss = linear_cross_entropy(xg, wg, t, linear_bias=bg, chunk_rows=5)
    with Allocs() as mode:
        loss.backward()
    assert mode.big == []
    assert xg.grad is not None and wg.grad is not None and bg.grad is not None


def _torch_ce_rows_(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, grad_scale=None):
    """PyTorch stand-in for ce_rows_ (CONTRACTS.md A), default options only: fp32 math, gradient
    written in place in logits' dtype."""
    assert label_smoothing == 0.0 and z_loss == 0.0 and softcap is None
    z = logits.float()
    valid = target != ignore_index
    lse = torch.logsumexp(z, dim=-1)
    rows = torch.where(valid, lse - z.gather(1, torch.where(valid, target, 0)[:, None])[:, 0], 0.0)
    if grad_scale is not None:
        g = torch.softmax(z, dim=-1)
        g[torch.arange(len(target)), torch.where(valid, target, 0)] -= 1.0
        g = g * valid[:, None] * (grad_scale[:, None] if isinstance(grad_scale, torch.Tensor) and grad_scale.dim() == 1 else grad_scale)
        logits.copy_(g)
    return rows


def test_bf16_weight_gradient_drift_many_chunks(monkeypatch):
    """grad_W accumulated in bf16 over k = 32 chunks vs the same chunk GEMMs accumulated in fp32.
    Each chunk adds one bf16 rounding (2^-9 relative): the bound asserted is 2 * sqrt(k) * 2^-9
    relative (Frobenius), with the measured value printed. V = 4099 (not a power of two)."""
    n, h, v, chunk = 512, 32, 4099, 16
    k = n // chunk
    monkeypatch.setattr(lce_mod, "_ce_rows", lambda: _torch_ce_rows_)  # fast on the CPU; same contract
    x, w, t, _ = _inputs(n, h, v, torch.bfloat16, seed=3, ignore_every=0)
    w = w.requires_grad_()
    linear_cross_entropy(x, w, t, chunk_rows=chunk).backward()
    # the fp32-accumulated twin: same bf16 chunk gradients from the row kernel, summed in fp32
    ce_rows_ = lce_mod._ce_rows()
    inv_n = torch.tensor(1.0 / n, device=DEVICE)
    acc = torch.zeros(v, h, dtype=torch.float32, device=DEVICE)
    for s in range(0, n, chunk):
        logits = x[s:s + chunk] @ w.detach().t()
        ce_rows_(logits, t[s:s + chunk], grad_scale=inv_n)
        acc += logits.float().t() @ x[s:s + chunk].float()
    drift = ((w.grad.float() - acc).norm() / acc.norm()).item()
    final_rounding = ((acc.bfloat16().float() - acc).norm() / acc.norm()).item()  # fp32 accumulation's floor
    bound = 2 * k ** 0.5 * 2.0 ** -9
    print(f"bf16 grad_W drift over {k} chunks: {drift:.2e} (bound {bound:.2e}; one final rounding {final_rounding:.2e})")
    assert drift < bound
    assert drift > 2 * final_rounding  # the accumulation really is in bf16: it adds more than one rounding


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(input="x"), TypeError, "input"),
        (dict(input=torch.ones(4, 8, dtype=torch.int32)), TypeError, "input"),
        (dict(linear_weight=torch.ones(5, 8, dtype=torch.float16)), TypeError, "linear_weight"),
        (dict(linear_weight=torch.ones(5, 7)), ValueError, "linear_weight"),
        (dict(target=torch.zeros(3, dtype=torch.int64)), ValueError, "target"),
        (dict(target=torch.zeros(4, dtype=torch.int32)), TypeError, "target"),
        (dict(target=torch.tensor([0, 1, 5, 2])), ValueError, "target"),
        (dict(target=torch.tensor([0, 1, -3, 2])), ValueError, "target"),
        (dict(linear_bias=torch.ones(4)), ValueError, "linear_bias"),
        (dict(linear_bias=torch.ones(5, dtype=torch.float16)), TypeError, "linear_bias"),
        (dict(reduction="avg"), ValueError, "reduction"),
        (dict(label_smoothing=1.5), ValueError, "label_smoothing"),
        (dict(z_loss=-1.0), ValueError, "z_loss"),
        (dict(softcap=0.0), ValueError, "softcap"),
        (dict(ignore_index=1.0), TypeError, "ignore_index"),
        (dict(chunk_rows=0), ValueError, "chunk_rows"),
    ],
)
def test_bad_input_names_argument(kwargs, exc, name):
    args = dict(input=torch.ones(4, 8), linear_weight=torch.ones(5, 8), target=torch.zeros(4, dtype=torch.int64))
    args.update(kwargs)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    pos = [args.pop("input"), args.pop("linear_weight"), args.pop("target")]
    with pytest.raises(exc, match=rf"\b{name}\b"):
        linear_cross_entropy(*pos, **args)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="needs a CPU tensor and no GPU")
def test_devices_must_match(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        linear_cross_entropy(torch.ones(4, 8), torch.ones(5, 8), torch.zeros(4, dtype=torch.int64))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_fullgraph(reduction):
    torch._dynamo.reset()
    x, w, t, b = _inputs(10, 8, 13, torch.float32, bias=True)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()]
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    f = torch.compile(lambda a, c, d: linear_cross_entropy(a, c, t, linear_bias=d, reduction=reduction, chunk_rows=4).sum() * 2,
                      fullgraph=True, backend=backend)
    f(*leaves).backward()
    ref = [x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()]
    (reference(*ref[:2], t, ref[2], reduction=reduction).sum() * 2).backward()
    for a, e in zip(leaves, ref):
        assert_close(a.grad, e.grad, torch.float32)


def torch_path(x, w, target, bias=None, **opts):
    """PyTorch's own computation in x's dtype (what Hugging Face does): lm_head logits in that dtype,
    upcast to fp32 for the loss. The rule's baseline for the GPU tests."""
    logits = x @ w.t()
    if bias is not None:
        logits = logits + bias
    return _fp32_loss(logits.float(), target, **opts)


def _fp32_loss(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0, softcap=None):
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    valid = target != ignore_index
    rows = F.cross_entropy(logits, torch.where(valid, target, 0), reduction="none", label_smoothing=label_smoothing)
    if z_loss:
        rows = rows + z_loss * torch.logsumexp(logits, dim=-1) ** 2
    rows = torch.where(valid, rows, torch.zeros_like(rows))
    if reduction == "none":
        return rows
    return rows.sum() if reduction == "sum" else rows.sum() / valid.sum().clamp(min=1)


def _gpu_rule(n, h, v, dtype, frozen=False, chunk_rows=None, **opts):
    x, w, t, _ = _inputs(n, h, v, dtype, ignore_every=7)
    if "ignore_index" in opts:  # the ignored rows carry the custom index (a real class id) instead of -100
        t[t == -100] = opts["ignore_index"]
    go = torch.tensor(1.0, device="cuda") if opts.get("reduction") != "none" else torch.rand(n, device="cuda")

    def run(fn, xx, ww):
        xl, wl = xx.detach().clone().requires_grad_(), ww.detach().clone().requires_grad_(not frozen)
        loss = fn(xl, wl)
        loss.backward(go)
        return loss.detach(), xl.grad, wl.grad

    got = run(lambda a, b: linear_cross_entropy(a, b, t, chunk_rows=chunk_rows, **opts), x, w)
    base = run(lambda a, b: torch_path(a, b, t, **opts), x, w)
    ref = run(lambda a, b: reference(a, b, t, **opts), x.float(), w.float())
    assert got[0].dtype == torch.float32, "the loss is fp32 whatever the input dtype"
    assert_close(got[0], ref[0], torch.float32, "loss", baseline=base[0])
    assert_close(got[1], ref[1], dtype, "grad input", baseline=base[1])
    if frozen:
        assert got[2] is None
    else:
        assert_close(got[2], ref[2], dtype, "grad linear_weight", baseline=base[2])


@gpu_only
@pytest.mark.xdist_group("gpu_big")  # a [tokens, 151936] fp32 reference per case: one at a time (scripts/gpu/test.sh)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_gpu_every_option_at_qwen_vocab(opts, dtype):
    """V = 152064 (Qwen2.5/3 lm_head, not a power of two), N = 2049 rows in chunks of 384, H = 1024."""
    _gpu_rule(2049, 1024, 152064, dtype, chunk_rows=384, **opts)


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("frozen", [False, True], ids=["trainable", "frozen"])
def test_gpu_qwen3_14b_shape(frozen):
    """N = 12289, H = 5120, V = 152064 bf16, default chunking: the loss the end-to-end LoRA log prints
    (it was returned in bf16: 13.0 where the fp32 reference said 12.98)."""
    _gpu_rule(12289, 5120, 152064, torch.bfloat16, frozen=frozen)


@pytest.mark.parametrize("s", [0.5, 1.0])
def test_scale_inplace_grid_stride_covers_every_element(s, monkeypatch):
    # The scaling grid is capped at 8 programs per SM; each program strides over the rest.
    monkeypatch.setattr(lce_mod, "SCALE_BLOCK", 64)
    n = 64 * 8 * lce_mod.num_sms(DEVICE) * 2 + 7  # > 2 strides per program, a partial last block
    x = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    before = x.clone()
    lce_mod._scale_inplace(x, torch.tensor(s, device=DEVICE, dtype=torch.float32))
    torch.testing.assert_close(x, (before.float() * s).to(torch.bfloat16), rtol=0, atol=0)


# ------------------------------------------------------------------------- audit additions (CPU-sized)
@pytest.mark.parametrize("which", ["linear_weight", "target", "linear_bias"])
def test_other_device_names_the_argument(which):
    args = dict(input=torch.ones(4, 8), linear_weight=torch.ones(5, 8), target=torch.zeros(4, dtype=torch.int64),
                linear_bias=torch.ones(5))
    args = {k: v.to(DEVICE) for k, v in args.items()}
    args[which] = args[which].to("meta")
    with pytest.raises(ValueError, match=rf"\b{which}\b"):
        linear_cross_entropy(args.pop("input"), args.pop("linear_weight"), args.pop("target"), **args)


def test_empty_input_and_weight_name_the_argument():
    with pytest.raises(ValueError, match=r"\binput\b"):
        linear_cross_entropy(torch.ones(0, 8, device=DEVICE), torch.ones(5, 8, device=DEVICE), torch.zeros(0, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match=r"\blinear_weight\b"):
        linear_cross_entropy(torch.ones(4, 8, device=DEVICE), torch.ones(0, 8, device=DEVICE), torch.zeros(4, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("bad", [5, 10**6, -2])
def test_out_of_range_target_raises_before_any_work(bad, monkeypatch):
    calls = []
    monkeypatch.setattr(lce_mod, "_run_chunks", lambda *a, **k: calls.append(1))
    x = torch.ones(4, 8, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match=r"\btarget\b"):
        linear_cross_entropy(x, torch.ones(5, 8, device=DEVICE), torch.tensor([0, 1, bad, 2], device=DEVICE))
    assert calls == []


def test_non_contiguous_input_and_weight_seventeen_rows_odd_vocab():
    # 17 rows (chunks of 8: the last one partial), vocab 131 (not a power of two), x and W read through
    # transposed views; values and all three gradients against the fp32 reference
    x, w, t, b = _inputs(17, 16, 131, torch.float32, bias=True, seed=3)
    xs = x.t().contiguous().t()  # [17, 16] with column stride 17
    ws = w.t().contiguous().t()  # [131, 16] with column stride 131 (e.g. a tied, transposed embedding)
    assert not xs.is_contiguous() and not ws.is_contiguous()
    grad_out = torch.tensor(0.7, device=DEVICE)
    got, got_g = _grads(lambda a, c, d: linear_cross_entropy(a, c, t, linear_bias=d, chunk_rows=8), xs, ws, b, grad_out)
    ref, ref_g = _grads(lambda a, c, d: reference(a, c, t, d), x, w, b, grad_out)
    assert_close(got, ref, torch.float32, msg="loss")
    for name, a, e in zip(("input", "weight", "bias"), got_g, ref_g):
        assert_close(a, e, torch.float32, msg=f"grad {name}")
