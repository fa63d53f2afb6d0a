"""Shared by the kernel tests: the device, and THE tolerance rule.

Import as `from tests.kernels.tolerance import DTYPES, assert_close, gpu_only, DEVICE`
(and `rows_past_int32` for the int64-offset tests, `truncate_to` for interpreter-aware baselines).

THE RULE (every kernel test, CPU and GPU, every dtype)
------------------------------------------------------
    err(t) = max_i |t_i - ref_i|, where `ref` is an fp32 (or fp64) PyTorch reference computed from
             the very same inputs (the low-precision inputs upcast, never a bf16-vs-bf16 comparison)
    pass   iff err(hearth) <= 2 * err(torch) + FLOOR[dtype] * max(1, max_i |ref_i|)

`torch` is PyTorch's own result for the same op and inputs in the same dtype (the `baseline=`
argument). Where a test passes no baseline, err(torch) is taken as the error of the correctly
rounded reference, `ref.to(dtype)`: no implementation that returns `dtype` can have less, so a test
without a baseline is never looser than the rule. The factor 2 is the rule FlashAttention's tests use.
FLOOR is a small absolute term for the case where err(torch) is ~0 (fp32 against an fp32 reference:
only summation order differs).

The interpreter (CPU, TRITON_INTERPRET=1) truncates fp32 -> bf16 casts where the GPU rounds to
nearest: each truncating store has up to twice the error of a rounding one, and PyTorch's CPU baseline
rounds. So under the interpreter, for bf16 only, the factor is 2 x 2 = 4 and err(torch) is never taken
below the truncation error: that of `truncate_to(ref, dtype)`, and at least half the truncation bound at
the largest magnitude (max |ref| * 2^-8; a realized error over a handful of large elements can be ~0 by
chance). That is the only place the backend changes a bound. CPU
bf16 numbers are therefore not GPU numbers: the GPU suite (scripts/gpu/test.sh), with the factor 2,
is what checks them.

No test scales these bounds. A test whose op rounds intermediates (matmuls whose [rows, I] results
are stored in bf16, attention's P and dS) passes PyTorch's own same-dtype computation as `baseline`,
which rounds the same intermediates.
"""

from __future__ import annotations

import pytest
import torch

from hearth.kernels._common import interpret_mode

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

FACTOR = 2.0
FLOOR = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}

gpu_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def truncate_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (fp32/fp64) cast to `dtype` rounding toward zero, as Triton's interpreter casts fp32 -> bf16."""
    rounded = x.to(dtype)
    if dtype == torch.float32 or x.dtype == dtype:
        return rounded
    away = rounded.double().abs() > x.double().abs()
    toward_zero = torch.nextafter(rounded, torch.zeros_like(rounded))
    return torch.where(away, toward_zero, rounded)


def max_err(t: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (t.detach().double() - ref.detach().double()).abs()
    if diff.numel() == 0:
        return 0.0
    if torch.isnan(diff).any():
        return float("nan")
    return float(diff.max())


def bound(expected: torch.Tensor, dtype: torch.dtype, baseline: torch.Tensor | None = None) -> tuple[float, float]:
    """(bound on err(hearth), err(torch) it was derived from) for reference `expected` in `dtype`."""
    exp = expected.detach()
    least = max_err(exp.to(dtype), exp)
    if interpret_mode() and dtype != torch.float32:
        least = max(least, max_err(truncate_to(exp, dtype), exp))
        if dtype == torch.bfloat16 and exp.numel():
            least = max(least, float(exp.double().abs().max()) * 2.0**-8)
    base = least if baseline is None else max(least, max_err(baseline.detach(), exp))
    scale = max(1.0, float(exp.double().abs().max())) if exp.numel() else 1.0
    factor = FACTOR * (2.0 if interpret_mode() and dtype == torch.bfloat16 else 1.0)
    return factor * base + FLOOR[dtype] * scale, base


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, msg: str = "",
                 *, baseline: torch.Tensor | None = None) -> None:
    """THE RULE (module docstring): err(actual) <= 2 * err(baseline or rounded reference) + floor.

    actual: hearth's result (any dtype; compared in fp64); expected: the fp32/fp64 reference from the
    same inputs; dtype: the dtype under test; baseline: PyTorch's own result in `dtype`, if any."""
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != reference {tuple(expected.shape)}"
    limit, base = bound(expected, dtype, baseline)
    err = max_err(actual.detach(), expected)
    assert err == err, f"{msg}: NaN in the result"
    assert err <= limit, (
        f"{msg}: max abs error {err:.3e} against the fp32 reference exceeds the rule's bound {limit:.3e} "
        f"(factor x torch's {base:.3e} + floor) in {str(dtype).replace('torch.', '')}"
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
