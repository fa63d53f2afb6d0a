from tests.kernels.tolerance import DTYPES, FLOOR, assert_close, truncate_to

import pytest
import torch


def test_floor_covers_every_dtype():
    assert set(FLOOR) == set(DTYPES)


def test_rule_rejects_an_error_twice_torchs():
    ref = torch.linspace(-3, 3, 1001, dtype=torch.float64)
    torch_bf16 = ref.to(torch.bfloat16)
    err = (torch_bf16.double() - ref).abs().max()
    # 1.5x torch's error passes; 20x fails (also under the interpreter, whose bound is looser: see the rule)
    assert_close(ref + 1.5 * err, ref, torch.bfloat16, baseline=torch_bf16)
    with pytest.raises(AssertionError, match="exceeds the rule's bound"):
        assert_close(ref + 20 * err + 4e-3, ref, torch.bfloat16, baseline=torch_bf16)
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(torch.full_like(ref, float("nan")), ref, torch.bfloat16)


def test_truncate_rounds_toward_zero():
    x = torch.tensor([1.0 + 2**-8 + 2**-10, -(1.0 + 2**-8 + 2**-10)], dtype=torch.float32)
    t = truncate_to(x, torch.bfloat16)
    assert x.to(torch.bfloat16).tolist() == [1.0078125, -1.0078125]  # round to nearest: away from zero here
    assert t.tolist() == [1.0, -1.0]
    assert (t.double().abs() <= x.double().abs()).all()
