"""hearth.kernels.cross_entropy (and the ce_rows_ launcher) against an fp32 PyTorch reference.

CPU interpreter at tiny shapes; real vocabularies and the memory bound on CUDA only."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
import torch.nn.functional as F

# the module, not the function: hearth.kernels re-exports cross_entropy() under the submodule's name, so
# `import hearth.kernels.cross_entropy as ...` can bind the function (depending on import order)
ce = importlib.import_module("hearth.kernels.cross_entropy")
from hearth.kernels.cross_entropy import ce_rows_, cross_entropy
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only, rows_past_int32

IGNORE = -100


def reference(x, target, *, ignore_index=IGNORE, label_smoothing=0.0, reduction="mean", z_loss=0.0, softcap=None,
              upcast=True):
    """fp32 PyTorch: F.cross_entropy on softcapped logits + z_loss * logsumexp^2 on non-ignored rows.
    upcast=False: the same math in x's own dtype (PyTorch's error in that dtype: the rule's baseline)."""
    z = x.float() if upcast else x
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    valid = target != ignore_index
    rows = F.cross_entropy(z, target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="none")
    rows = rows + z_loss * torch.logsumexp(z, -1).pow(2) * valid
    if reduction == "none":
        return rows
    return rows.sum() / valid.sum().clamp(min=1) if reduction == "mean" else rows.sum()


def _inputs(n, v, dtype, *, n_ignored=0, scale=3.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=gen) * scale).to(DEVICE)
    t = torch.randint(0, v, (n,), generator=gen).to(DEVICE)
    t[:n_ignored] = IGNORE
    return x.to(dtype), t


def _check(n, v, dtype, *, grad_output=None, n_ignored=0, **opts):
    x_vals, t = _inputs(n, v, dtype, n_ignored=n_ignored)
    x = x_vals.clone().requires_grad_()
    loss = cross_entropy(x, t, **opts)
    x_ref = x_vals.float().requires_grad_()
    loss_ref = reference(x_ref, t, **opts)
    assert loss.dtype == torch.float32 and loss.shape == loss_ref.shape  # fp32 whatever the logits' dtype
    # the loss is computed and returned in fp32 from the same logits: judged as fp32, no baseline
    assert_close(loss, loss_ref, torch.float32, msg="loss")
    go = torch.randn(loss_ref.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE) if grad_output is None else grad_output
    loss.backward(go.to(dtype).float())
    loss_ref.backward(go.to(dtype).float())
    # the gradient's baseline: PyTorch's own cross-entropy in `dtype` (its softmax and gradient rounded)
    x_base = x_vals.detach().clone().requires_grad_()
    reference(x_base, t, upcast=False, **opts).backward(go.to(dtype))
    assert_close(x.grad, x_ref.grad, dtype, msg="grad", baseline=x_base.grad)
    return x, x_ref


@pytest.fixture(params=["one_chunk", "many_chunks"])
def chunking(request, monkeypatch):
    """Default chunk table (one 2048-wide chunk at V = 1031), or chunks of 256 columns so the online logsumexp
    crosses many chunks: at V = 1031 four full ones (a first, middle ones, the max moving between them in most
    rows) and a ragged 7-column tail. (It was 64-column chunks, 17 per row: the interpreter's time grows with
    the chunk count, not the width, and 5 chunks take every path 17 did: first, middle, last, masked tail.)"""
    if request.param == "many_chunks":
        monkeypatch.setattr(ce, "_CE_CONFIGS", ((1 << 62, 256, 4),))
        assert ce._config(1031)[0] == 256
    return request.param


OPTIONS = [
    dict(),
    dict(reduction="sum", label_smoothing=0.1),
    dict(reduction="none", z_loss=1e-2),
    dict(reduction="mean", softcap=5.0),
    dict(reduction="mean", label_smoothing=0.2, z_loss=1e-3, softcap=8.0),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_matches_reference(chunking, opts, dtype):
    _check(17, 1031, dtype, n_ignored=3, **opts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, v", [(1, 7), (3, 4099)])
def test_odd_shapes(n, v, dtype):
    _check(n, v, dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_is_zero_not_nan(reduction):
    x = torch.randn(5, 33, device=DEVICE, requires_grad=True)
    t = torch.full((5,), IGNORE, device=DEVICE)
    loss = cross_entropy(x, t, reduction=reduction)
    assert torch.all(loss == 0)
    loss.sum().backward()
    assert torch.all(x.grad == 0)


def test_custom_ignore_index():
    _check(9, 50, torch.float32, ignore_index=3)


def test_gradient_overwrites_logits_in_place():
    """Documented behaviour: with requires_grad the logits buffer becomes the gradient (no 2nd [N, V])."""
    x, t = _inputs(6, 40, torch.float32)
    x.requires_grad_()
    cross_entropy(x, t).backward()
    assert x.grad.data_ptr() == x.data_ptr()
    x_ref = x.detach().clone()  # now the gradient values; recompute the reference from fresh logits
    fresh, _ = _inputs(6, 40, torch.float32)
    fresh.requires_grad_()
    reference(fresh, t).backward()
    assert_close(x_ref, fresh.grad, torch.float32)


def test_without_grad_leaves_logits_alone():
    x, t = _inputs(6, 40, torch.float32)
    before = x.clone()
    with torch.no_grad():
        loss = cross_entropy(x.requires_grad_(), t)
    assert torch.equal(x.detach(), before)
    assert_close(loss, reference(before, t), torch.float32)


def test_second_backward_through_the_same_graph_raises():
    x, t = _inputs(4, 20, torch.float32)
    x.requires_grad_()
    loss = cross_entropy(x, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once"):
        loss.backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_low_precision(reduction, dtype):
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    torch._dynamo.reset()
    x_vals, t = _inputs(6, 301, dtype, n_ignored=2)
    x = x_vals.clone().requires_grad_()
    f = torch.compile(lambda x, t: cross_entropy(x, t, reduction=reduction, softcap=20.0), fullgraph=True, backend=backend)
    loss = f(x, t)
    x_ref = x_vals.float().requires_grad_()
    ref = reference(x_ref, t, reduction=reduction, softcap=20.0)
    go = torch.linspace(0.5, 3.0, ref.numel(), device=DEVICE).reshape(ref.shape)
    loss.backward(go.to(dtype))
    ref.backward(go.to(dtype).float())
    assert_close(loss, ref, dtype)
    assert_close(x.grad, x_ref.grad, dtype)
    with torch.no_grad():  # no gradient wanted: no gradient buffer, logits untouched
        assert_close(f(x_vals, t), ref.detach(), dtype)


def test_non_contiguous_input_is_copied_not_overwritten():
    x_vals, t = _inputs(8, 30, torch.float32)
    xt = x_vals.t().contiguous().requires_grad_()  # [V, N]
    x = xt.t()  # [N, V] with column stride N
    loss = cross_entropy(x, t)
    loss.backward()
    assert torch.equal(xt.detach().t(), x_vals)  # the caller's memory still holds the logits
    x_ref = x_vals.clone().requires_grad_()
    reference(x_ref, t).backward()
    assert_close(xt.grad.t(), x_ref.grad, torch.float32)


def test_fp16_gradscaler_scale_recovers_gradient():
    """LESSON 7: at vocab 32k in fp16 with mean over the rows, many gradient entries p/n fall below
    fp16's smallest subnormal. A GradScaler-like grad_output of 2**15 must give non-zero gradients
    matching the fp32 reference (hearth stores g without 1/n and scales in fp32 in the backward)."""
    n, v = 64, 32768
    x_vals, t = _inputs(n, v, torch.float16, scale=2.0)
    go = torch.tensor(2.0**15, device=DEVICE)  # 2**16 is inf in fp16
    x = x_vals.clone().requires_grad_()
    cross_entropy(x, t).backward(go.half())
    x_ref = x_vals.float().requires_grad_()
    reference(x_ref, t).backward(go)
    # what storing (softmax - onehot) / n in fp16 would have kept: a large share flushes to zero
    naive = (x_ref.grad / go).half().float() * go
    assert (naive == 0).float().mean() > 0.2
    assert (x.grad == 0).float().mean() < 1e-3
    assert_close(x.grad, x_ref.grad, torch.float16)
    # entries the naive store zeroed are recovered to fp16 precision, not just "non-zero"
    lost = naive == 0
    torch.testing.assert_close(x.grad.float()[lost], x_ref.grad[lost], rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("bad", [-1, 50, 10**6])
def test_out_of_range_target_raises(bad):
    x = torch.randn(4, 50, device=DEVICE, requires_grad=True)
    t = torch.tensor([1, 2, bad, 3], device=DEVICE)
    before = x.detach().clone()
    with pytest.raises(ValueError, match=r"\btarget\b"):
        cross_entropy(x, t)
    assert torch.equal(x.detach(), before)  # raised before anything was written


def _x():
    return torch.randn(4, 10, device=DEVICE)


def _t():
    return torch.tensor([0, 1, 2, 3], device=DEVICE)


@pytest.mark.parametrize(
    "call, exc, name",
    [
        (lambda: cross_entropy(_x().tolist(), _t()), TypeError, "input"),
        (lambda: cross_entropy(_x().double(), _t()), TypeError, "input"),
        (lambda: cross_entropy(_x().long(), _t()), TypeError, "input"),
        (lambda: cross_entropy(_x(), _t().float()), TypeError, "target"),
        (lambda: cross_entropy(_x(), _t().int()), TypeError, "target"),
        (lambda: cross_entropy(_x()[None], _t()), ValueError, "input"),
        (lambda: cross_entropy(_x(), _t()[:3]), ValueError, "target"),
        (lambda: cross_entropy(_x(), _t()[None]), ValueError, "target"),
        (lambda: cross_entropy(torch.empty(0, 10, device=DEVICE), _t()[:0]), ValueError, "input"),
        (lambda: cross_entropy(torch.empty(4, 0, device=DEVICE), _t()), ValueError, "input"),
        (lambda: cross_entropy(_x(), _t().to("meta")), ValueError, "target"),
        (lambda: cross_entropy(_x(), _t(), reduction="avg"), ValueError, "reduction"),
        (lambda: cross_entropy(_x(), _t(), label_smoothing=1.5), ValueError, "label_smoothing"),
        (lambda: cross_entropy(_x(), _t(), label_smoothing="0.1"), TypeError, "label_smoothing"),
        (lambda: cross_entropy(_x(), _t(), z_loss=-1.0), ValueError, "z_loss"),
        (lambda: cross_entropy(_x(), _t(), softcap=0.0), ValueError, "softcap"),
        (lambda: cross_entropy(_x(), _t(), softcap="30"), TypeError, "softcap"),
        (lambda: cross_entropy(_x(), _t(), ignore_index=1.0), TypeError, "ignore_index"),
    ],
)
def test_bad_input_names_the_argument(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


@gpu_only
def test_different_devices_raise():
    with pytest.raises(ValueError, match=r"\btarget\b"):
        cross_entropy(_x().cuda(), _t().cpu())


# ---------------------------------------------------------------------------- ce_rows_ (contract A)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "float", "scalar_tensor", "row_tensor"])
def test_ce_rows_contract(kind, dtype):
    n, v = 7, 300
    x_vals, t = _inputs(n, v, dtype, n_ignored=2)
    opts = dict(label_smoothing=0.1, z_loss=1e-3, softcap=10.0)
    scale = {
        "none": None,
        "float": 0.5,
        "scalar_tensor": torch.tensor(0.25, device=DEVICE),
        "row_tensor": torch.linspace(-1.0, 2.0, n, device=DEVICE),
    }[kind]
    logits = x_vals.clone()
    rows = ce_rows_(logits, t, **opts, grad_scale=scale)
    assert rows.dtype == torch.float32 and rows.shape == (n,)
    x_ref = x_vals.float().requires_grad_()
    rows_ref = reference(x_ref, t, reduction="none", **opts)
    assert_close(rows, rows_ref, dtype)
    assert torch.all(rows[:2] == 0)
    if scale is None:
        assert torch.equal(logits, x_vals)  # no gradient requested: logits untouched
        return
    go = scale if isinstance(scale, torch.Tensor) and scale.dim() == 1 else torch.full((n,), float(scale), device=DEVICE)
    rows_ref.backward(go)
    assert_close(logits, x_ref.grad, dtype)
    assert torch.all(logits[:2] == 0)


# -------------------------------------------------------------------------------------- compile
def test_compile_fullgraph_is_correct_and_leaves_logits_intact():
    """Under torch.compile the functional op returns the gradient in one extra buffer (see module doc)."""
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    torch._dynamo.reset()

    def f(h, t):
        return cross_entropy(h * 2.0, t, z_loss=1e-3, label_smoothing=0.1) + cross_entropy(h, t, reduction="sum")

    h_vals, t = _inputs(5, 67, torch.float32, n_ignored=1)
    h = h_vals.clone().requires_grad_()
    out = torch.compile(f, fullgraph=True, backend=backend)(h, t)
    out.backward()
    assert torch.equal(h.detach(), h_vals)
    h_ref = h_vals.clone().requires_grad_()
    ref = reference(h_ref * 2.0, t, z_loss=1e-3, label_smoothing=0.1) + reference(h_ref, t, reduction="sum")
    ref.backward()
    assert_close(out, ref, torch.float32)
    assert_close(h.grad, h_ref.grad, torch.float32)


def test_compile_out_of_range_target_still_raises():
    torch._dynamo.reset()
    f = torch.compile(lambda x, t: cross_entropy(x, t), fullgraph=True, backend="aot_eager" if DEVICE.type != "cuda" else "inductor")
    with pytest.raises(ValueError, match=r"\btarget\b"):
        f(torch.randn(3, 9, device=DEVICE), torch.tensor([0, 9, 1], device=DEVICE))


# ------------------------------------------------------------------------------- real shapes (GPU)
def _peak_extra_bytes(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("n, v", [(8192, 131072), (16384, 151936)])
def test_real_shape_bf16_memory_and_values(n, v):
    torch.manual_seed(0)
    x_vals = (torch.randn(n, v, device="cuda") * 2).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device="cuda")
    t[::7] = IGNORE
    x = x_vals.clone().requires_grad_()

    def step():
        cross_entropy(x, t).backward()

    extra = _peak_extra_bytes(step)
    assert extra <= 1 << 20, f"extra peak {extra / 2**20:.2f} MiB > 1 MiB (a second [N, V] tensor?)"
    assert x.grad.data_ptr() == x.data_ptr()
    # values: fp32 reference on a slice of rows (the full fp32 reference would need ~2x[N, V] fp32)
    rows = slice(0, 1024)
    x_ref = x_vals[rows].float().requires_grad_()
    n_valid = (t != IGNORE).sum()
    (reference(x_ref, t[rows], reduction="sum") / n_valid).backward()
    assert_close(x.grad[rows], x_ref.grad, torch.bfloat16, msg="grad")
    loss = cross_entropy(x_vals, t)
    assert_close(loss, reference(x_vals.float(), t), torch.float32, msg="loss")


# Every option alone and together, every dtype, at a real vocabulary that is not a power of two and a
# row count that is a multiple of no block; the plain case with every reduction.
GPU_OPTIONS = OPTIONS + [dict(reduction="sum"), dict(reduction="none")]


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", GPU_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_gpu_every_option_at_a_real_vocab(opts, dtype):
    _check(2049, 152064, dtype, n_ignored=11, **opts)


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
def test_gpu_grad_scaler_fp16_at_32k_vocab():
    """The GradScaler case at N=4096, V=32768 (fp16 logits, loss x 65536): finite, within 2e-2 of the
    fp32 reference, and zeros only where the reference itself is below fp16's smallest subnormal (2^-24).
    (Not "no more zeros than ref.half()": the fp16 path rounds twice -- the stored g * 2^12, then the
    backward's scale -- so a value within one rounding of the underflow threshold may land on either side.)"""
    torch.manual_seed(0)
    x_vals = (torch.randn(4096, 32768, device="cuda") * 2).half()
    t = torch.randint(0, 32768, (4096,), device="cuda")
    x = x_vals.clone().requires_grad_()
    (cross_entropy(x, t) * 65536.0).backward()
    x_ref = x_vals.float().requires_grad_()
    (reference(x_ref, t) * 65536.0).backward()
    g, g_ref = x.grad.float(), x_ref.grad
    assert torch.isfinite(g).all()
    assert (g - g_ref).norm() / g_ref.norm() <= 2e-2
    assert not ((g == 0) & (g_ref.abs() >= 2.0**-24)).any(), "a representable gradient value was flushed to zero"


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
def test_gpu_packed_batch_rows_at_qwen_vocab():
    """12289 rows (a packed batch's odd count) x 151936 bf16: loss fp32 within the rule, in place."""
    torch.manual_seed(1)
    x_vals = (torch.randn(12289, 151936, device="cuda") * 2).to(torch.bfloat16)
    t = torch.randint(0, 151936, (12289,), device="cuda")
    t[::5] = IGNORE
    x = x_vals.clone().requires_grad_()
    loss = cross_entropy(x, t)
    loss.backward()
    assert loss.dtype == torch.float32 and x.grad.data_ptr() == x.data_ptr()
    rows = slice(12289 - 2048, 12289)  # the last rows (past every block boundary); fp32 ref of a slice
    x_ref = x_vals[rows].float().requires_grad_()
    (reference(x_ref, t[rows], reduction="sum") / (t != IGNORE).sum()).backward()
    assert_close(x.grad[rows], x_ref.grad, torch.bfloat16, msg="grad")
    assert_close(loss, reference(x_vals.float(), t), torch.float32, msg="loss")


@gpu_only
def test_real_vocab_fp16_and_fp32():
    for dtype in (torch.float16, torch.float32):
        _check(512, 151936, dtype, n_ignored=5, z_loss=1e-4, label_smoothing=0.05)


# ------------------------------------------------------------------------- audit additions (CPU-sized)
def test_expanded_input_rows_sharing_memory_get_their_own_gradient():
    # an expanded [1, V] -> [N, V] input has row stride 0: writing each row's gradient in place over
    # the shared memory would race (the rows overwrite each other); it must be copied first
    row = torch.randn(1, 10, device=DEVICE)
    t = torch.tensor([0, 1, 2, 3], device=DEVICE)
    leaf = row.clone().requires_grad_()
    cross_entropy(leaf.expand(4, 10), t).backward()
    ref = row.clone().requires_grad_()
    F.cross_entropy(ref.expand(4, 10), t).backward()
    assert_close(leaf.grad, ref.grad, torch.float32)
    # loss-only (no gradient wanted): read in place, same value
    assert_close(cross_entropy(row.expand(4, 10), t), F.cross_entropy(row.expand(4, 10), t), torch.float32)


@pytest.mark.xdist_group("gpu_big")  # a ~4 GiB storage: one at a time (an 80 GiB H100 ran out beside 13 workers)
def test_row_offsets_past_int32_are_int64():
    x = rows_past_int32(3, 70, torch.float16)
    t = torch.tensor([5, -100, 69], device=DEVICE)
    x_ref = x.detach().float().requires_grad_()
    loss_ref = reference(x_ref, t, reduction="none")
    loss_ref.backward(torch.full((3,), 2.0, device=DEVICE))
    x.requires_grad_()
    # the row kernel reads and writes the gradient in place through the huge row stride; the backward's
    # scaling kernel (fp16 always scales; grad_output 2) walks the same rows
    loss = cross_entropy(x, t, reduction="none")
    assert_close(loss, loss_ref, torch.float16)
    loss.backward(torch.full((3,), 2.0, device=DEVICE, dtype=torch.float16))
    # the gradient was written (and scaled) over the caller's strided buffer itself, rows past 2^31
    # included (autograd then hands .grad over as a dense copy of it)
    assert torch.equal(x.detach(), x.grad)
    assert_close(x.grad, x_ref.grad, torch.float16)


def test_fp16_loss_scaled_like_a_grad_scaler_gives_a_finite_gradient():
    """torch.amp.GradScaler multiplies the loss by 65536 before backward(). An fp16 loss of ~7 times
    65536 overflows fp16 (65504): the loss was returned in fp16, so the whole gradient became inf. The
    loss is fp32 now; the gradient must be finite, within 2e-2 relative (Frobenius) of the fp32 reference,
    and be zero only where the reference is below fp16's smallest subnormal (LESSON 7: no underflow)."""
    x_vals, t = _inputs(64, 1031, torch.float16, n_ignored=3)
    x = x_vals.clone().requires_grad_()
    loss = cross_entropy(x, t)
    assert loss.dtype == torch.float32
    (loss * 65536.0).backward()
    x_ref = x_vals.float().requires_grad_()
    (reference(x_ref, t) * 65536.0).backward()
    g, g_ref = x.grad.float(), x_ref.grad
    assert torch.isfinite(g).all(), "non-finite logits gradient under a GradScaler-sized loss scale"
    rel = (g - g_ref).norm() / g_ref.norm()
    assert rel <= 2e-2, f"relative error {rel:.3e}"
    assert not ((g == 0) & (g_ref.abs() >= 2.0**-24)).any(), "a representable gradient value was flushed to zero"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loss_is_fp32_for_every_reduction(dtype, reduction):
    x_vals, t = _inputs(9, 100, dtype)
    with torch.no_grad():
        assert cross_entropy(x_vals, t, reduction=reduction).dtype == torch.float32
    x = x_vals.clone().requires_grad_()
    assert cross_entropy(x, t, reduction=reduction).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen_vocab_and_seventeen_rows(dtype):
    _check(2, 151936, dtype, n_ignored=0, label_smoothing=0.1)  # vocab 151,936: not a power of two
    _check(17, 257, dtype, n_ignored=2)


def test_wrong_target_dtypes_and_devices_name_the_argument():
    x = torch.randn(4, 10, device=DEVICE)
    for bad in (torch.int32, torch.int16, torch.uint8, torch.bool, torch.float16):
        with pytest.raises(TypeError, match=r"\btarget\b"):
            cross_entropy(x, torch.zeros(4, dtype=bad, device=DEVICE))
    with pytest.raises(ValueError, match=r"\binput\b"):
        cross_entropy(x.to("meta"), torch.zeros(4, dtype=torch.int64, device=DEVICE))


def test_ce_rows_probe_smoke_mode_checks_each_config_against_fp32(tmp_path):
    """scripts/gpu/ce_rows_probe.py (run by hand on an H200 to choose _CE_WIDE_CONFIG) keeps working: its smoke
    mode (the CPU interpreter in CI, the GPU in the GPU suite, where Triton is imported uninterpreted) runs the row kernel at each config given (persistent and one program per row), checks it against fp32 and
    writes one row per (shape, config); a malformed --configs is refused naming the option."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "ce_rows_probe.py"
    main = runpy.run_path(str(script), run_name="ce_rows_probe")["main"]
    out = tmp_path / "rows.jsonl"
    assert main(["--smoke", "--out", str(out), "--configs", "2,128,4,1;0,64,2,2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["n"], r["v"], r["config"]) for r in rows] == [(7, 300, [2, 128, 4, 1]), (7, 300, [0, 64, 2, 2])]
    assert all(r["ok"] and r["grad_err"] <= 1e-5 and r["median_ms"] > 0 for r in rows), rows
    with pytest.raises(SystemExit):
        main(["--smoke", "--out", str(out), "--configs", "2,128,4"])


@pytest.mark.parametrize("path", ["eager", "functional"])
def test_target_check_gates_the_kernel_and_is_awaited_after_its_launch(monkeypatch, path):
    """The target check is queued as the kernel's gate after 1 / n_valid, the kernel is launched, and only then
    does the host wait for the check (so the GPU is not left idle while the host prepares the launch). A bad
    target still raises, and the gated kernel leaves the logits untouched (it ran, and wrote nothing)."""
    order = []
    for name in ("_plan", "_queue_check", "_launch_rows", "_finish_check"):
        real = getattr(ce, name)
        monkeypatch.setattr(ce, name, lambda *a, real=real, name=name, **k: order.append(name) or real(*a, **k))
    x = torch.randn(4, 40, device=DEVICE)
    t = torch.tensor([1, 2, -100, 39], device=DEVICE)
    if path == "eager":
        cross_entropy(x.clone().requires_grad_(), t).backward()
    else:
        torch.ops.hearth.cross_entropy_fwd(x, t, -100, 0.0, "mean", 0.0, 0.0, True)
    assert order == ["_plan", "_queue_check", "_launch_rows", "_finish_check"], order
    order.clear()
    bad = x.clone().requires_grad_()
    with pytest.raises(ValueError, match="target values must be in"):
        cross_entropy(bad, torch.tensor([1, 2, 40, 0], device=DEVICE))
    assert order == ["_plan", "_queue_check", "_launch_rows", "_finish_check"] and torch.equal(bad.detach(), x)


def test_functional_op_with_a_bad_target_raises_and_leaves_the_input():
    """The torch.compile route (hearth::cross_entropy_fwd, a separate gradient buffer) with a bad target: the
    same ValueError, and the input as it was."""
    x = torch.randn(4, 40, device=DEVICE)
    before = x.clone()
    with pytest.raises(ValueError, match="found 40"):
        torch.ops.hearth.cross_entropy_fwd(x, torch.tensor([1, 2, 40, 0], device=DEVICE), -100, 0.0, "mean", 0.0, 0.0, True)
    assert torch.equal(x, before)
    f = torch.compile(lambda a, t: cross_entropy(a, t), fullgraph=True)
    leaf = before.clone().requires_grad_()
    with pytest.raises(ValueError, match="found -3"):
        f(leaf, torch.tensor([1, -3, 2, 0], device=DEVICE))
    assert torch.equal(leaf.detach(), before)


@pytest.mark.parametrize("n_cols", [40, 9000])  # one chunk a row, and the wide config's several
def test_gated_row_kernel_writes_nothing(n_cols):
    """The row kernel with a non-zero gate writes no gradient over the logits (nor a separate buffer); with a
    zero gate it gives exactly the ungated result."""
    torch.manual_seed(0)
    x = torch.randn(5, n_cols, device=DEVICE)
    t = torch.tensor([1, 2, -100, n_cols - 1, 0], device=DEVICE)
    kw = dict(ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, grad_scale=0.5)
    work = x.clone()
    ce._launch_rows(work, work, t, gate=torch.ones((), dtype=torch.int32, device=DEVICE), **kw)
    assert torch.equal(work, x)
    grad = torch.full_like(x, 7.0)
    ce._launch_rows(x, grad, t, gate=torch.ones((), dtype=torch.int32, device=DEVICE), **kw)
    assert torch.equal(grad, torch.full_like(x, 7.0))
    ungated, gated = x.clone(), x.clone()
    loss_u = ce._launch_rows(ungated, ungated, t, **kw)
    loss_g = ce._launch_rows(gated, gated, t, gate=torch.zeros((), dtype=torch.int32, device=DEVICE), **kw)
    assert torch.equal(loss_u, loss_g) and torch.equal(ungated, gated) and not torch.equal(gated, x)


# ------------------------------------------------------------------ host trims: the same behaviour, less host time
def test_gradient_through_create_graph_is_once_differentiable():
    """The backward skips once_differentiable's wrapper only where grad mode is off (a plain backward): under
    create_graph=True the gradient is the same, and differentiating it again raises as the wrapper makes it."""
    x_vals, t = _inputs(4, 30, torch.float32, n_ignored=1)
    x = x_vals.clone().requires_grad_()
    plain, = torch.autograd.grad(cross_entropy(x.clone(), t), x)
    graph, = torch.autograd.grad(cross_entropy(x.clone(), t), x, create_graph=True)
    torch.testing.assert_close(graph, plain, rtol=0, atol=0)
    go = torch.tensor(2.0, device=DEVICE, requires_grad=True)
    twice, = torch.autograd.grad(cross_entropy(x.clone(), t), x, go, create_graph=True)
    torch.testing.assert_close(twice, 2 * plain)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        twice.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # fp16: the backward's saved factor
def test_rows_loss_backward_through_an_expanded_grad_output(dtype):
    """reduction="none" then .sum(): the backward's [N] grad_output is an expanded (stride 0) tensor, made
    contiguous before the kernel reads it by pointer; the same gradient as a dense one."""
    x_vals, t = _inputs(5, 40, dtype, n_ignored=1)
    x = x_vals.clone().requires_grad_()
    cross_entropy(x, t, reduction="none").sum().backward()
    y = x_vals.clone().requires_grad_()
    cross_entropy(y, t, reduction="none").backward(torch.ones(5, device=DEVICE))
    torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)


def test_unusual_valid_options_give_the_usual_result():
    """Options the checks' one-test fast path does not take (ints for the float options, an int softcap) run the
    checks one by one and pass, with the float options' result."""
    x_vals, t = _inputs(4, 30, torch.float32, n_ignored=1)
    cases = ((dict(label_smoothing=0, z_loss=0), dict()), (dict(label_smoothing=1), dict(label_smoothing=1.0)),
             (dict(softcap=30, z_loss=1), dict(softcap=30.0, z_loss=1.0)))
    for ints, floats in cases:
        torch.testing.assert_close(cross_entropy(x_vals, t, **ints), cross_entropy(x_vals, t, **floats), rtol=0, atol=0)


@pytest.mark.parametrize("kw, exc, message", [
    (dict(target=[0, 1, 2, 3]), TypeError, "target must be a torch.Tensor, got list"),
    (dict(target=_t().int()), TypeError, "target must have dtype in (int64), got int32"),
    (dict(target=_t()[None]), ValueError, "target must have 1 dimensions, got shape (1, 4)"),
    (dict(target=_t()[:3]), ValueError, "target must have shape [4] to match input (4, 10), got (3,)"),
    (dict(target=_t().to("meta")), ValueError,
     "target must be a CUDA tensor (CPU tensors run only under TRITON_INTERPRET=1), got device meta"),
    (dict(ignore_index=True), TypeError, "ignore_index must be an int, got bool"),
    (dict(reduction="avg"), ValueError, "reduction must be one of ('mean', 'sum', 'none'), got 'avg'"),
    (dict(label_smoothing=float("nan")), ValueError, "label_smoothing must be in [0, 1], got nan"),
    (dict(label_smoothing=-0.5), ValueError, "label_smoothing must be in [0, 1], got -0.5"),
    (dict(z_loss=True), TypeError, "z_loss must be a float, got bool"),
    (dict(z_loss=float("nan")), ValueError, "z_loss must be >= 0, got nan"),
    (dict(softcap=-1.0), ValueError, "softcap must be > 0, got -1.0"),
    (dict(softcap=True), TypeError, "softcap must be None or a float, got bool"),
])
def test_bad_arguments_raise_the_checks_messages(kw, exc, message):
    """Anything the fast path's one test refuses goes through the checks one by one: their exact messages."""
    kw = dict(kw)
    target = kw.pop("target", _t())
    with pytest.raises(exc) as err:
        cross_entropy(_x(), target, **kw)
    assert str(err.value) == message
