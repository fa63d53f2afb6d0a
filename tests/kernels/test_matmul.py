"""hearth.kernels.matmul against an fp32 PyTorch reference: odd shapes, every dtype, both kernels
(pointer and TMA descriptors; the interpreter runs both), transposed views, gradients, bad input,
torch.compile(fullgraph=True)."""

from __future__ import annotations

import importlib

import pytest
import torch

from hearth.kernels.matmul import matmul, matmul_into
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only


def _ref(a, b):
    return a.float() @ b.float()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (17, 33, 100), (33, 1, 17), (100, 17, 33)])
def test_odd_shapes_pointer_kernel(m, n, k, dtype):
    torch.manual_seed(0)
    a = torch.randn(m, k, device=DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=DEVICE, dtype=dtype)
    out = matmul(a, b)
    assert out.shape == (m, n) and out.dtype == dtype
    assert_close(out, _ref(a, b), dtype)


@pytest.mark.parametrize("desc", ["host", "device"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_tma_kernel_every_layout(a_t, b_t, dtype, desc, monkeypatch):
    # Shapes that are not tile multiples (tile 16x32x16 under the interpreter): TMA bounds-checks.
    # desc: host TensorDescriptors (the default) or the kernel that builds them on the device.
    monkeypatch.setenv("HEARTH_MATMUL_TMA_DESC", desc)
    torch.manual_seed(1)
    m, n, k = 40, 72, 24
    a = torch.randn(k, m, device=DEVICE, dtype=dtype).t() if a_t else torch.randn(m, k, device=DEVICE, dtype=dtype)
    b = torch.randn(n, k, device=DEVICE, dtype=dtype).t() if b_t else torch.randn(k, n, device=DEVICE, dtype=dtype)
    out = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    matmul_into(a, b, out, backend="tma")
    assert_close(out, _ref(a, b), dtype)


def test_tma_refuses_unaligned_rows():
    a = torch.randn(4, 3, device=DEVICE, dtype=torch.bfloat16)  # 6-byte rows
    b = torch.randn(3, 8, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="TMA"):
        matmul_into(a, b, torch.empty(4, 8, device=DEVICE, dtype=torch.bfloat16), backend="tma")


def test_tma_launch_plan_is_reused_but_alignment_is_checked_every_call():
    # The plan (layouts, descriptor shapes, grid) is cached per shapes / strides / dtype / device; the
    # data pointers change every call, so a view at a misaligned offset with a cached plan's shapes and
    # strides must still be refused, and a transposed view of the same shape gets a plan of its own.
    mm = importlib.import_module("hearth.kernels.matmul")
    torch.manual_seed(3)
    buf = torch.randn(40 * 24 + 1, device=DEVICE, dtype=torch.bfloat16)
    a = buf[: 40 * 24].view(40, 24)
    b = torch.randn(24, 72, device=DEVICE, dtype=torch.bfloat16)
    out = torch.empty(40, 72, device=DEVICE, dtype=torch.bfloat16)
    matmul_into(a, b, out, backend="tma")
    plan = mm._tma_plan(a, b, out)
    assert plan is not None and mm._tma_plan(a.clone(), b.clone(), out) is plan
    assert (plan.a_t, plan.lda, plan.b_t, plan.ldb, plan.a_shape, plan.b_shape) == (False, 24, False, 72, [40, 24], [24, 72])
    assert_close(out, _ref(a, b), torch.bfloat16)
    shifted = buf[1:].view(40, 24)  # same shape and strides, base 2 bytes off
    assert mm._tma_plan(shifted, b, out) is plan
    with pytest.raises(ValueError, match="TMA"):
        matmul_into(shifted, b, out, backend="tma")
    a_t = torch.randn(24, 40, device=DEVICE, dtype=torch.bfloat16).t()
    plan_t = mm._tma_plan(a_t, b, out)
    assert plan_t is not plan and (plan_t.a_t, plan_t.lda, plan_t.a_shape) == (True, 40, [24, 40])
    assert mm._tma_plan(a, b, out.t()) is None  # out must be row-major


def test_tma_desc_env_names_the_variable_on_a_bad_value(monkeypatch):
    monkeypatch.setenv("HEARTH_MATMUL_TMA_DESC", "both")
    a = torch.randn(16, 16, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="HEARTH_MATMUL_TMA_DESC"):
        matmul_into(a, a, torch.empty_like(a), backend="tma")


@pytest.mark.skipif(DEVICE.type == "cuda", reason="interpreter-only: runs the autotuner with a stub timer")
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_every_tma_config_gets_its_descriptor_block_shapes(a_t, b_t, monkeypatch):
    # The tuned launch path with the real config list, under the interpreter: the autotuner runs every
    # config once (the stub "benchmark" checks that run's output), each after its pre_hook set the host
    # descriptors' block shapes. A config whose descriptors kept another config's blocks would load
    # mismatched tiles (wrong C, or a shape error). fp16: the interpreter's bf16 dot needs UPCAST, which
    # the tuned path does not set.
    import triton

    mm = importlib.import_module("hearth.kernels.matmul")
    torch.manual_seed(4)
    m, n, k = 296, 264, 136  # > one tile of every config in each dimension, none a multiple (16-byte rows)
    a = torch.randn(k, m, device=DEVICE, dtype=torch.float16).t() if a_t else torch.randn(m, k, device=DEVICE, dtype=torch.float16)
    b = torch.randn(n, k, device=DEVICE, dtype=torch.float16).t() if b_t else torch.randn(k, n, device=DEVICE, dtype=torch.float16)
    out = torch.empty(m, n, device=DEVICE, dtype=torch.float16)
    ref = _ref(a, b)
    ran = []

    def bench(call, quantiles=None):
        out.fill_(float("nan"))
        call()
        assert_close(out, ref, torch.float16)
        ran.append(1)
        return [100.0 - len(ran)] * 3  # the last config "wins" (128x128, C stored whole)

    tuner = triton.autotune(configs=mm._TMA_HOST_CONFIGS, key=["M", "N", "K", "A_T", "B_T", "PRECISION"],
                            prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: configs},
                            do_bench=bench)(mm._matmul_tma_kernel)
    monkeypatch.setattr(mm, "_matmul_tma_tuned", tuner)
    monkeypatch.setattr(mm, "_PLANS", {})
    mm._launch_tma(a, b, out, tuned=True)
    winner = mm._TMA_HOST_CONFIGS[-1]
    assert len(ran) == len(mm._TMA_HOST_CONFIGS) and tuner.best_config is winner
    assert_close(out, ref, torch.float16)  # the final launch, after the winner's pre_hook
    # the plan's next launch skips the autotuner (no benchmark, no pre_hook): the winner's blocks, fixed
    monkeypatch.setattr(tuner, "best_config", None)
    out.fill_(float("nan"))
    mm._launch_tma(a, b, out, tuned=True)
    assert len(ran) == len(mm._TMA_HOST_CONFIGS) and tuner.best_config is winner and mm.LAST_TUNER is tuner
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_a_and_gradients(dtype):
    torch.manual_seed(2)
    a = torch.randn(2, 9, 21, device=DEVICE, dtype=dtype, requires_grad=True)
    b = torch.randn(21, 19, device=DEVICE, dtype=dtype, requires_grad=True)
    out = matmul(a, b)
    assert out.shape == (2, 9, 19)
    g = torch.randn_like(out)
    out.backward(g)
    a32, b32 = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    (a32 @ b32).backward(g.float())
    assert_close(out, a32 @ b32, dtype)
    assert_close(a.grad, a32.grad, dtype)
    assert_close(b.grad, b32.grad, dtype)


def test_only_needed_gradient_is_computed():
    a = torch.randn(5, 7, device=DEVICE)
    b = torch.randn(7, 3, device=DEVICE, requires_grad=True)
    matmul(a, b).sum().backward()
    assert a.grad is None
    assert_close(b.grad, a.t() @ torch.ones(5, 3, device=DEVICE), torch.float32)


@pytest.mark.parametrize(
    "a,b,exc,name",
    [
        ("x", torch.ones(2, 2), TypeError, "a"),
        (torch.ones(2, 2), torch.ones(2, 2, dtype=torch.int32), TypeError, "b"),
        (torch.ones(2, 2), torch.ones(2, 2, dtype=torch.float16), TypeError, "b"),
        (torch.ones(2, 3), torch.ones(4, 2), ValueError, "b"),
        (torch.ones(3), torch.ones(3, 2), ValueError, "a"),
        (torch.ones(2, 3), torch.ones(3, 2, 1), ValueError, "b"),
        (torch.ones(0, 3), torch.ones(3, 2), ValueError, "a"),
    ],
)
def test_bad_input_names_argument(a, b, exc, name):
    if isinstance(a, torch.Tensor):
        a = a.to(DEVICE)
    b = b.to(DEVICE)
    with pytest.raises(exc, match=rf"\b{name}\b"):
        matmul(a, b)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="CPU-device check only meaningful off the GPU")
def test_cpu_tensor_refused_outside_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        matmul(torch.ones(2, 2), torch.ones(2, 2))


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    a = torch.randn(6, 10, device=DEVICE, requires_grad=True)
    b = torch.randn(10, 4, device=DEVICE, requires_grad=True)
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    f = torch.compile(lambda x, y: matmul(x, y).relu().sum(), fullgraph=True, backend=backend)
    f(a, b).backward()
    a32, b32 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    (a32 @ b32).relu().sum().backward()
    assert_close(a.grad, a32.grad, torch.float32)
    assert_close(b.grad, b32.grad, torch.float32)


@gpu_only
@pytest.mark.parametrize("size", [4096, (1000, 3001, 777)])
def test_gpu_real_shapes_bf16(size):
    m, n, k = (size, size, size) if isinstance(size, int) else size
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = matmul(a, b)
    ref = _ref(a, b)
    # bf16 output rounding (2^-9 relative) dominates; fp32 accumulation order adds ~1e-6*sqrt(K).
    torch.testing.assert_close(out.float(), ref, atol=0.05 * k ** 0.5 / 8, rtol=1.6e-2)


@gpu_only
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_gpu_tma_extra_memory_is_exactly_the_output(a_t, b_t, monkeypatch):
    # Host TensorDescriptors (the default): a bf16 matmul allocates its output and nothing else (cuBLAS's
    # figure), in every operand layout. The device-descriptor kernel (HEARTH_MATMUL_TMA_DESC=device) gives
    # the same product but allocates a global scratch buffer for its descriptors on every launch.
    mm = importlib.import_module("hearth.kernels.matmul")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the TMA kernel needs Hopper (sm_90+)")
    torch.manual_seed(5)
    m, n, k = 2048, 1536, 1024  # 6 MiB of output: a multiple of the allocator's 512-byte rounding
    a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if a_t else torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if b_t else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out_bytes = m * n * 2

    def extra_memory():
        warm = matmul(a, b)  # warm-up: autotuning (its benchmark runs allocate) is done for this shape
        assert mm.LAST_BACKEND == "tma"
        del warm
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = matmul(a, b)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out

    monkeypatch.delenv("HEARTH_MATMUL_TMA_DESC", raising=False)
    extra, out = extra_memory()
    assert extra == out_bytes, f"host descriptors: {extra} bytes allocated for a {out_bytes}-byte output"
    ref = _ref(a, b)
    tol = dict(atol=0.05 * k ** 0.5 / 8, rtol=1.6e-2)  # as test_gpu_real_shapes_bf16
    torch.testing.assert_close(out.float(), ref, **tol)

    monkeypatch.setenv("HEARTH_MATMUL_TMA_DESC", "device")
    extra_dev, out_dev = extra_memory()
    torch.testing.assert_close(out_dev.float(), ref, **tol)  # its own autotune: the tile may differ, not the product
    assert extra_dev > out_bytes, f"device descriptors: expected scratch beyond the output, got {extra_dev} bytes"


def test_autotune_prune_keeps_configs_that_fill_the_sms():
    # num_sms is 4 for a CPU tensor: a 256 x 256 output gives 128x256 / 256x128 tiles only 2
    # tiles, 128x128 tiles 4 -> only the 128x128 configs are benchmarked; big outputs keep all.
    from triton.tools.tensor_descriptor import TensorDescriptor

    mm = importlib.import_module("hearth.kernels.matmul")
    t = torch.empty(16, 16)
    # the pointer and device-descriptor kernels take a_ptr, the host-descriptor one a_desc
    desc = TensorDescriptor(t, [16, 16], [16, 1], [16, 16])
    for configs, a in ((mm._TMA_CONFIGS, dict(a_ptr=t)), (mm._TMA_HOST_CONFIGS, dict(a_desc=desc)), (mm._PTR_CONFIGS, dict(a_ptr=t))):
        kept = mm._prune_few_tiles(configs, dict(M=256, N=256, **a))
        assert kept and all((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) in ((128, 128), (64, 128)) for c in kept)
        assert mm._prune_few_tiles(configs, dict(M=4096, N=4096, **a)) == configs
        # nothing fills the SMs (60 x 200 output): the configs with the most tiles, and only those
        tiles = {c: -(-60 // c.kwargs["BLOCK_M"]) * -(-200 // c.kwargs["BLOCK_N"]) for c in configs}
        assert max(tiles.values()) < 4
        tiny = mm._prune_few_tiles(configs, dict(M=60, N=200, **a))
        assert tiny == [c for c in configs if tiles[c] == max(tiles.values())] and len(tiny) < len(configs)


# ------------------------------------------------------------------------- audit additions (CPU-sized)
def test_row_and_column_offsets_past_int32_are_int64():
    # a's row stride and b's column stride are int32 arguments, but row * stride passes 2^31 elements:
    # the pointer kernel forms its M / N offsets in int64 (~4 GiB virtual each, few pages resident)
    stride = (1 << 30) + 64
    g = torch.Generator().manual_seed(13)

    def huge(shape, strides):
        t = torch.empty(2 * stride + 16, dtype=torch.float16, device=DEVICE).as_strided(shape, strides)
        return t.copy_(torch.randn(shape, generator=g).to(DEVICE))

    a = huge((3, 16), (stride, 1))
    b = huge((16, 3), (1, stride))
    assert_close(matmul(a, b), _ref(a, b), torch.float16)


def test_other_device_and_int_a_name_the_argument():
    with pytest.raises(ValueError, match=r"\bb\b"):
        matmul(torch.ones(2, 3, device=DEVICE), torch.ones(3, 2, device="meta"))
    with pytest.raises(TypeError, match=r"\ba\b"):
        matmul(torch.ones(2, 3, dtype=torch.int64, device=DEVICE), torch.ones(3, 2, device=DEVICE))


@pytest.mark.xdist_group("gpu_big")  # two 4 GiB operands: one at a time (scripts/gpu/test.sh)
def test_k_strides_past_int32_are_relaid_out():
    # K-direction strides of 2^30 + 64 elements: the pointer kernel's in-tile K offsets are int32, so
    # such operands are re-laid out (unit K stride) before launch instead of overflowing
    stride = (1 << 30) + 64
    g = torch.Generator().manual_seed(14)

    def huge(shape, strides):
        t = torch.empty(2 * stride + 16, dtype=torch.float16, device=DEVICE).as_strided(shape, strides)
        return t.copy_(torch.randn(shape, generator=g).to(DEVICE))

    a = huge((4, 3), (1, stride))  # a's K stride is huge
    b = huge((3, 5), (stride, 1))  # b's K stride is huge
    assert_close(matmul(a, b), _ref(a, b), torch.float16)
