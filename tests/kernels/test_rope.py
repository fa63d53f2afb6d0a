"""hearth.kernels.rope (rotate-half) against an fp32 PyTorch reference, GQA and strided layouts."""

from __future__ import annotations

import pytest
import torch

from hearth.kernels.rope import rope
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference(x, cos, sin):
    # cos/sin [B or 1, T, D] broadcast over heads: [B or 1, 1, T, D]
    c, s = cos.float()[:, None], sin.float()[:, None]
    return x.float() * c + rotate_half(x.float()) * s


def tables(batch, t, d, dtype, offset=0.0):
    """Llama-style cos/sin tables (both halves equal), positions shifted per batch row by `offset`."""
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))
    pos = torch.arange(t, device=DEVICE).float()[None, :, None] + offset * torch.arange(batch, device=DEVICE)[:, None, None]
    freqs = pos * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def make_qk(b, hq, hk, t, d, dtype, hf_layout):
    if hf_layout:  # [B, T, H, D] transposed to [B, H, T, D]: non-contiguous, read through strides
        q = torch.randn(b, t, hq, d, device=DEVICE).to(dtype).transpose(1, 2)
    else:
        q = torch.randn(b, hq, t, d, device=DEVICE).to(dtype)
    k = torch.randn(b, hk, t, d, device=DEVICE).to(dtype)
    return q, k


def check_fwd_bwd(q, k, cos, sin, dtype):
    q = q.detach().requires_grad_()
    k = k.detach().requires_grad_()
    qo, ko = rope(q, k, cos, sin)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == q.dtype
    dq_out, dk_out = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (dq_out, dk_out))
    qr, kr = q.detach().float().requires_grad_(), k.detach().float().requires_grad_()
    qor, kor = reference(qr, cos, sin), reference(kr, cos, sin)
    dqr, dkr = torch.autograd.grad((qor, kor), (qr, kr), (dq_out.float(), dk_out.float()))
    assert_close(qo, qor, dtype, msg="q_rot")
    assert_close(ko, kor, dtype, msg="k_rot")
    assert_close(dq, dqr, dtype, msg="dq")
    assert_close(dk, dkr, dtype, msg="dk")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cos_batch", [1, 2], ids=["cos_b1", "cos_bB"])
@pytest.mark.parametrize("hf_layout", [False, True], ids=["bhtd", "bthd_transposed"])
def test_gqa_matches_fp32_reference(dtype, cos_batch, hf_layout):
    torch.manual_seed(0)
    q, k = make_qk(2, 4, 2, 5, 16, dtype, hf_layout)
    cos, sin = tables(cos_batch, 5, 16, dtype, offset=3.0)
    check_fwd_bwd(q, k, cos, sin, dtype)


def test_head_dim_not_a_power_of_two_and_one_token():
    torch.manual_seed(1)
    q, k = make_qk(1, 3, 1, 1, 12, torch.float32, False)
    check_fwd_bwd(q, k, *tables(1, 1, 12, torch.float32), torch.float32)


def test_general_tables_get_the_exact_transpose_in_backward():
    # cos/sin halves that differ (not a Llama table): the backward must still be R^T exactly.
    torch.manual_seed(2)
    q, k = make_qk(2, 2, 2, 3, 8, torch.float32, False)
    cos, sin = torch.randn(2, 3, 8, device=DEVICE), torch.randn(2, 3, 8, device=DEVICE)
    check_fwd_bwd(q, k, cos, sin, torch.float32)


def test_output_keeps_the_input_layout():
    q, k = make_qk(1, 2, 1, 4, 8, torch.float32, True)
    qo, _ = rope(q, k, *tables(1, 4, 8, torch.float32))
    assert qo.stride() == q.stride()


def test_backward_of_forward_is_the_identity():
    # R^T R = I for rotations: feeding rope(x) back as the upstream gradient returns x.
    torch.manual_seed(3)
    q, k = make_qk(2, 4, 2, 6, 16, torch.float32, True)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = tables(2, 6, 16, torch.float32, offset=5.0)
    qo, ko = rope(q, k, cos, sin)
    q_back, k_back = torch.autograd.grad((qo, ko), (q, k), (qo.detach(), ko.detach()))
    assert_close(q_back, q, torch.float32)
    assert_close(k_back, k, torch.float32)


def test_odd_head_dim_names_q():
    q, k = torch.ones(1, 2, 3, 5, device=DEVICE), torch.ones(1, 1, 3, 5, device=DEVICE)
    cos = torch.ones(1, 3, 5, device=DEVICE)
    with pytest.raises(ValueError, match=r"^q\b"):
        rope(q, k, cos, cos)


def test_cos_wrong_length_names_cos():
    q, k = torch.ones(1, 2, 3, 4, device=DEVICE), torch.ones(1, 1, 3, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"^cos\b"):
        rope(q, k, torch.ones(1, 2, 4, device=DEVICE), torch.ones(1, 3, 4, device=DEVICE))


def test_sin_batch_mismatch_names_sin():
    q, k = torch.ones(2, 2, 3, 4, device=DEVICE), torch.ones(2, 1, 3, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"^sin\b"):
        rope(q, k, torch.ones(2, 3, 4, device=DEVICE), torch.ones(3, 3, 4, device=DEVICE))


def test_k_shape_mismatch_names_k():
    q, k = torch.ones(1, 2, 3, 4, device=DEVICE), torch.ones(1, 1, 2, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"^k\b"):
        rope(q, k, torch.ones(1, 3, 4, device=DEVICE), torch.ones(1, 3, 4, device=DEVICE))


def test_dtype_mismatch_names_k():
    q, k = torch.ones(1, 2, 3, 4, device=DEVICE), torch.ones(1, 1, 3, 4, device=DEVICE, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"^k\b"):
        rope(q, k, torch.ones(1, 3, 4, device=DEVICE), torch.ones(1, 3, 4, device=DEVICE))


def test_cos_on_other_device_names_cos():
    q, k = torch.ones(1, 2, 3, 4, device=DEVICE), torch.ones(1, 1, 3, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"^cos\b"):
        rope(q, k, torch.ones(1, 3, 4, device="meta"), torch.ones(1, 3, 4, device=DEVICE))


def test_empty_q_names_q():
    q, k = torch.ones(1, 2, 0, 4, device=DEVICE), torch.ones(1, 1, 0, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"^q\b"):
        rope(q, k, torch.ones(1, 0, 4, device=DEVICE), torch.ones(1, 0, 4, device=DEVICE))


def test_torch_compile_fullgraph():
    torch.manual_seed(4)
    q, k = make_qk(1, 4, 2, 3, 8, torch.float32, True)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = tables(1, 3, 8, torch.float32)
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"

    def loss(q, k, cos, sin):
        qo, ko = rope(q, k, cos, sin)
        return qo.square().sum() + (ko * 3).sum()

    got = torch.autograd.grad(torch.compile(loss, backend=backend, fullgraph=True)(q, k, cos, sin), (q, k))
    want = torch.autograd.grad(loss(q, k, cos, sin), (q, k))
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_sum_backward_with_expanded_gradients():
    torch.manual_seed(6)
    q, k = make_qk(1, 2, 1, 3, 8, torch.float32, True)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = tables(1, 3, 8, torch.float32, offset=1.0)
    qo, ko = rope(q, k, cos, sin)
    dq, dk = torch.autograd.grad(qo.sum() + ko.sum(), (q, k))
    want_q, want_k = torch.autograd.grad(reference(q, cos, sin).sum() + reference(k, cos, sin).sum(), (q, k))
    assert_close(dq, want_q, torch.float32)
    assert_close(dk, want_k, torch.float32)


def test_opcheck():
    q, k = make_qk(1, 3, 2, 3, 8, torch.float32, True)
    cos, sin = tables(1, 3, 8, torch.float32)
    torch.library.opcheck(torch.ops.hearth.rope, (q.requires_grad_(), k.requires_grad_(), cos, sin, False))


@gpu_only
@pytest.mark.xdist_group("gpu_big")  # big fp32 references: one at a time (scripts/gpu/test.sh)
@pytest.mark.parametrize("hf_layout", [False, True], ids=["bhtd", "bthd_transposed"])
def test_real_shape_bf16(hf_layout):
    torch.manual_seed(5)
    q, k = make_qk(4, 32, 8, 4096, 128, torch.bfloat16, hf_layout)
    check_fwd_bwd(q, k, *tables(1, 4096, 128, torch.bfloat16), torch.bfloat16)


@gpu_only
@pytest.mark.parametrize("hq,hk,d", [(40, 8, 128), (32, 32, 64), (16, 4, 64), (40, 8, 80), (32, 4, 96), (8, 8, 256)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_model_head_shapes(hq, hk, d, dtype):
    """GQA 5/1/4/8, head_dim 64/80/96/128/256, a ragged T (a packed batch), every dtype."""
    torch.manual_seed(6)
    q, k = make_qk(1, hq, hk, 2049, d, dtype, True)
    check_fwd_bwd(q, k, *tables(1, 2049, d, dtype), dtype)


# ------------------------------------------------------------------------- audit additions (CPU-sized)
def test_head_and_batch_offsets_past_int32_are_int64():
    # a head stride and a batch stride that are int32 arguments while head * stride and b * stride pass
    # 2^31 elements: the kernel must form those offsets in int64 (~4 GiB virtual, few pages resident)
    stride = (1 << 30) + 64
    gen = torch.Generator().manual_seed(11)

    def huge(shape, strides):
        t = torch.empty(2 * stride + 16, dtype=torch.float16, device=DEVICE).as_strided(shape, strides)
        return t.copy_(torch.randn(shape, generator=gen).to(DEVICE))

    cos, sin = tables(1, 2, 8, torch.float32)
    for q, k in (
        (huge((1, 3, 2, 8), (0, stride, 8, 1)), torch.randn(1, 1, 2, 8, generator=gen).to(DEVICE, torch.float16)),
        (torch.randn(3, 2, 2, 8, generator=gen).to(DEVICE, torch.float16), huge((3, 1, 2, 8), (stride, 16, 8, 1))),
    ):
        qo, ko = rope(q, k, cos, sin)
        assert_close(qo, reference(q, cos, sin), torch.float16)
        assert_close(ko, reference(k, cos, sin), torch.float16)


@pytest.mark.parametrize(
    "which, value, exc",
    [
        ("q", torch.ones(1, 2, 3, 4, dtype=torch.float64), TypeError),
        ("k", torch.ones(1, 1, 3, 4, dtype=torch.int32), TypeError),
        ("cos", torch.ones(1, 3, 4, dtype=torch.int64), TypeError),
        ("sin", torch.ones(1, 3, 4, dtype=torch.float64), TypeError),
        ("k", torch.ones(1, 1, 3, 4, device="meta"), ValueError),
        ("sin", torch.ones(1, 3, 4, device="meta"), ValueError),
        ("q", torch.ones(2, 3, 4), ValueError),
        ("sin", torch.ones(1, 3, 6), ValueError),
    ],
)
def test_bad_input_names_the_argument(which, value, exc):
    args = dict(q=torch.ones(1, 2, 3, 4), k=torch.ones(1, 1, 3, 4), cos=torch.ones(1, 3, 4), sin=torch.ones(1, 3, 4))
    args = {n: t.to(DEVICE) for n, t in args.items()}
    args[which] = value if value.device.type == "meta" else value.to(DEVICE)
    with pytest.raises(exc, match=rf"\b{which}\b"):
        rope(**args)


def test_seventeen_positions_odd_heads_and_one_batch_row():
    q, k = make_qk(1, 5, 1, 17, 12, torch.bfloat16, True)  # Hq=5 (not a power of two), D/2 = 6
    check_fwd_bwd(q, k, *tables(1, 17, 12, torch.bfloat16), torch.bfloat16)
