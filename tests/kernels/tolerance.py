"""Shared by the kernel tests: the device, and THE per-dtype tolerance table.

Import as `from tests.kernels.tolerance import TOL, DTYPES, assert_close, gpu_only, DEVICE`
(and `rows_past_int32` for the int64-offset tests).

Every kernel test compares against an fp32 (or fp64) PyTorch reference computed from the
same inputs, with the tolerance for the dtype under test taken from TOL below.
Without CUDA the kernels run in Triton's CPU interpreter (tests/conftest.py sets
TRITON_INTERPRET=1): keep shapes small there. Tests at real shapes use `gpu_only`.
"""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")

# One table: (atol, rtol) for comparing an op's output (or gradient) in `dtype` with an fp32
# reference. bf16 keeps 8 mantissa bits (eps 2^-8), fp16 11 (eps 2^-11).
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

gpu_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0, msg: str = "") -> None:
    """assert_close with the table's tolerance for `dtype` (scaled by `scale` for ops that
    accumulate more rounding, e.g. reductions over long rows); compares in fp32."""
    tol = TOL[dtype]
    torch.testing.assert_close(
        actual.float(), expected.float(), atol=tol["atol"] * scale, rtol=tol["rtol"] * scale, msg=(lambda m: f"{msg}\n{m}") if msg else None
    )


def rows_past_int32(n_rows: int, n_cols: int, dtype: torch.dtype) -> torch.Tensor:
    """[n_rows, n_cols] view whose last row starts past element 2^31 while the row stride stays below
    2^31 (so Triton passes it as int32): `row * stride` wraps unless the kernel widens it to int64.
    The storage is ~4 GiB of virtual memory of which only the touched rows are ever resident."""
    stride = (1 << 30) + 64
    storage = torch.empty(stride * (n_rows - 1) + n_cols, dtype=dtype, device=DEVICE)
    view = storage.as_strided((n_rows, n_cols), (stride, 1))
    view.copy_(torch.randn(n_rows, n_cols, generator=torch.Generator().manual_seed(0)).to(DEVICE) * 3)
    assert (n_rows - 1) * stride >= 2**31 > stride
    return view
