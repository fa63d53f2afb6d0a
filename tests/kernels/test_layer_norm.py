"""hearth.kernels.layer_norm against F.layer_norm in fp32 (interpreter on CPU, real shapes on GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hearth.kernels.layer_norm import layer_norm
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only


def check_fwd_bwd(x, w, b, dtype, eps=1e-5, grad_scale=2.0):
    """Forward and every gradient (x, weight, bias) vs fp32 F.layer_norm on the same inputs."""
    leaves = [t.detach().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    x, w = leaves[0], leaves[1]
    b = leaves[2] if b is not None else None
    y = layer_norm(x, w, b, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    yr = F.layer_norm(ref_leaves[0], (x.shape[-1],), ref_leaves[1], ref_leaves[2] if b is not None else None, eps)
    ref_grads = torch.autograd.grad(yr, ref_leaves, dy.float())
    assert_close(y, yr, dtype, msg="y")
    for name, g, gr, leaf in zip(("dx", "dweight", "dbias"), grads, ref_grads, leaves):
        assert g.dtype == leaf.dtype, name
        assert_close(g, gr, dtype, msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 80), (17, 130), (2, 3, 64)], ids=["1row", "17rows_130", "3d"])
def test_matches_fp32_reference(dtype, shape):
    torch.manual_seed(0)
    x = (torch.randn(shape, device=DEVICE) + 3.0).to(dtype)  # a non-zero mean, so centring matters
    n = shape[-1]
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    check_fwd_bwd(x, w, b, dtype)


def test_without_bias():
    torch.manual_seed(1)
    x = torch.randn(7, 40, device=DEVICE)
    check_fwd_bwd(x, torch.randn(40, device=DEVICE), None, torch.float32)


def test_many_rows_and_row_strided_view():
    torch.manual_seed(2)
    base = torch.randn(37, 30, device=DEVICE)
    check_fwd_bwd(base[:, :24], torch.randn(24, device=DEVICE), torch.randn(24, device=DEVICE), torch.float32)


def test_zero_rows_give_zero_param_grads():
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    b = torch.randn(8, device=DEVICE, requires_grad=True)
    layer_norm(x, w, b).sum().backward()
    assert torch.equal(w.grad, torch.zeros(8, device=DEVICE)) and torch.equal(b.grad, torch.zeros(8, device=DEVICE))


def test_wrong_dtype_names_x():
    with pytest.raises(TypeError, match=r"^x\b"):
        layer_norm(torch.ones(2, 4, dtype=torch.int64, device=DEVICE), torch.ones(4, device=DEVICE), None)


def test_bias_length_mismatch_names_bias():
    with pytest.raises(ValueError, match=r"^bias\b"):
        layer_norm(torch.ones(2, 4, device=DEVICE), torch.ones(4, device=DEVICE), torch.ones(3, device=DEVICE))


def test_bias_on_other_device_names_bias():
    with pytest.raises(ValueError, match=r"^bias\b"):
        layer_norm(torch.ones(2, 4, device=DEVICE), torch.ones(4, device=DEVICE), torch.ones(4, device="meta"))


def test_empty_weight_names_weight():
    with pytest.raises(ValueError, match=r"^weight\b"):
        layer_norm(torch.ones(2, 4, device=DEVICE), torch.ones(0, device=DEVICE), None)


def test_torch_compile_fullgraph():
    torch.manual_seed(3)
    args = [torch.randn(3, 48, device=DEVICE, requires_grad=True), torch.randn(48, device=DEVICE, requires_grad=True),
            torch.randn(48, device=DEVICE, requires_grad=True)]
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    fn = torch.compile(lambda a, b, c: layer_norm(a, b, c).square().sum(), backend=backend, fullgraph=True)
    got = torch.autograd.grad(fn(*args), args)
    want = torch.autograd.grad(layer_norm(*args).square().sum(), args)
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_opcheck():
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    b = torch.randn(8, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.hearth.layer_norm_fwd, (x, w, b, 1e-5))

@gpu_only
@pytest.mark.parametrize("n", [4096, 5120, 17408])
def test_real_shapes_bf16(n):
    torch.manual_seed(4)
    m = 32768 if n == 4096 else (12289 if n == 5120 else 4096)  # 12289: a multiple of no block
    x = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    check_fwd_bwd(x, w, b, torch.bfloat16, grad_scale=4.0)


# ------------------------------------------------------------------------- audit additions (CPU-sized)
def test_strided_weight_and_bias_are_read_correctly():
    # the kernels index weight / bias as ptr + col: strided views must not be read as contiguous
    torch.manual_seed(7)
    x = torch.randn(5, 24, device=DEVICE)
    p = torch.randn(24, 3, device=DEVICE)
    check_fwd_bwd(x, p[:, 0], p[:, 2], torch.float32)
    check_fwd_bwd(x, torch.randn(1, device=DEVICE).expand(24), torch.randn(1, device=DEVICE).expand(24), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_seventeen_rows_of_4099(dtype):
    torch.manual_seed(8)
    x = torch.randn(17, 4099, device=DEVICE, dtype=dtype)
    w = (1 + 0.1 * torch.randn(4099, device=DEVICE)).to(dtype)
    check_fwd_bwd(x, w, (0.1 * torch.randn(4099, device=DEVICE)).to(dtype), dtype, grad_scale=4.0)


def test_row_offsets_past_int32_are_int64():
    # last row starts past element 2^31 with an int32 row stride (~4 GiB virtual, few pages resident)
    stride = (1 << 30) + 64
    storage = torch.empty(2 * stride + 40, dtype=torch.float16, device=DEVICE)
    x = storage.as_strided((3, 40), (stride, 1))
    x.copy_(torch.randn(3, 40, generator=torch.Generator().manual_seed(9)).to(DEVICE))
    w = torch.randn(40, device=DEVICE, dtype=torch.float16)
    check_fwd_bwd(x, w, torch.randn(40, device=DEVICE, dtype=torch.float16), torch.float16)


@pytest.mark.parametrize(
    "x, w, b, exc, name",
    [
        (torch.ones(2, 4, dtype=torch.float64), torch.ones(4), None, TypeError, "x"),
        (torch.ones(2, 4), torch.ones(4, dtype=torch.int64), None, TypeError, "weight"),
        (torch.ones(2, 4), torch.ones(4), torch.ones(4, dtype=torch.int32), TypeError, "bias"),
        (torch.ones(2, 4), torch.ones(5), None, ValueError, "weight"),
        (torch.ones(2, 4), torch.ones(4), torch.ones(4, 1), ValueError, "bias"),
        (torch.ones(2, 4), torch.ones(4, device="meta"), None, ValueError, "weight"),
        (torch.ones(2, 0), torch.ones(0), None, ValueError, "x"),
    ],
)
def test_bad_input_names_the_argument(x, w, b, exc, name):
    to = lambda t: t if t is None or t.device.type == "meta" else t.to(DEVICE)  # noqa: E731
    with pytest.raises(exc, match=rf"^{name}\b"):
        layer_norm(to(x), to(w), to(b))
