"""hearth.kernels.matmul against an fp32 PyTorch reference: odd shapes, every dtype, both kernels
(pointer and TMA descriptors; the interpreter runs both), transposed views, gradients, bad input,
torch.compile(fullgraph=True)."""

from __future__ import annotations

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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_tma_kernel_every_layout(a_t, b_t, dtype):
    # Shapes that are not tile multiples (tile 16x32x16 under the interpreter): TMA bounds-checks.
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


def test_autotune_prune_keeps_configs_that_fill_the_sms():
    # num_sms is 4 for a CPU tensor: a 256 x 256 output gives 128x256 / 256x128 tiles only 2
    # tiles, 128x128 tiles 4 -> only the 128x128 configs are benchmarked; big outputs keep all.
    import importlib

    mm = importlib.import_module("hearth.kernels.matmul")
    t = torch.empty(1)
    for configs in (mm._TMA_CONFIGS, mm._PTR_CONFIGS):
        kept = mm._prune_few_tiles(configs, dict(M=256, N=256, a_ptr=t))
        assert kept and all((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) in ((128, 128), (64, 128)) for c in kept)
        assert mm._prune_few_tiles(configs, dict(M=4096, N=4096, a_ptr=t)) == configs
        # nothing fills the SMs (60 x 200 output): the configs with the most tiles, and only those
        tiles = {c: -(-60 // c.kwargs["BLOCK_M"]) * -(-200 // c.kwargs["BLOCK_N"]) for c in configs}
        assert max(tiles.values()) < 4
        tiny = mm._prune_few_tiles(configs, dict(M=60, N=200, a_ptr=t))
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
