"""Review 50: the correctness gate catches errors confined to a few rows, columns or blocks.

The gate was one relative L2 error per tensor (||out - ref|| / ||ref|| <= 2e-2 in bf16). A kernel wrong only in its
last rows (a tail block, the last partial tile, a packed sequence's boundary) moves that ratio by about
sqrt(wrong rows / rows): one zeroed row in 4096 is 0.016, and it passed. Each tensor is now also held slice by slice
(every row along the last dim and every column; 1-D tensors in blocks of 64): each slice's relative L2 error at most
2x PyTorch's own worst slice in the case's dtype (the reference run in that dtype; never below the rounding of the
reference to it) plus the old per-dtype tolerance. The row says which check failed, where, and by how much.
"""

from __future__ import annotations

import pytest
import torch

from hearth.bench import cases, check, providers as P, runner

CPU = torch.device("cpu")
LIMITS = {"copy_GBps": 10.0, "matmul_TFLOPs": 1.0}


@pytest.fixture(autouse=True)
def _fast_harness(monkeypatch):
    """These tests are about the check: skip the harness's gc passes between providers and its back-to-back wall
    timing (hundreds of calls on the CPU), which dominate a tiny case's time under pytest."""
    from hearth.bench import timing

    monkeypatch.setattr(runner, "_free", lambda device: None)
    monkeypatch.setattr(timing, "time_wall", lambda *a, **k: {})


def _run(op, size, dtype, mode, reg):
    rows = runner.run_case(cases.SPECS[op], size, dtype, mode, list(reg), CPU, LIMITS, {"gpu": "test"}, False, True, reg)
    return {r["provider"]: r for r in rows}


def _softmax_bound(transform):
    """A provider computing softmax right (fp32, rounded once to the input dtype), then `transform`ed."""
    def bind(op, inputs, spec, size, rg, check_):
        x = inputs["x"]

        def fn():
            y = torch.softmax(x.float(), dim=-1).to(x.dtype)
            return transform(y)
        return P.Bound(fn, [x])
    return bind


class _TailGrad(torch.autograd.Function):
    """softmax whose backward is right except in dx's last row (zeroed: a missed tail block)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x.float(), dim=-1)
        ctx.save_for_backward(y)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = y * (dy.float() - (y * dy.float()).sum(-1, keepdim=True))
        dx[-1] = 0
        return dx.to(dy.dtype)


def _zero_last_row(y):
    y = y.clone()
    y[-1] = 0
    return y


def _zero_last_col(y):
    y = y.clone()
    y[:, -1] = 0
    return y


def test_output_with_a_wrong_last_row_is_wrong():
    size = dict(M=4096, N=64)
    rows = _run("softmax", size, "bfloat16", "fwd", {"hearth": _softmax_bound(_zero_last_row),
                                                      "eager": _softmax_bound(lambda y: y)})
    h = rows["hearth"]
    assert h["rel_err"] < check.TOLERANCE["bfloat16"]  # the whole-tensor measure alone passes it
    assert h["status"] == "wrong", h
    assert "output0 row" in h["reason"] and "4095" in h["reason"]
    failed = h["check_failed"]
    assert failed and failed[0]["tensor"] == "output0" and failed[0]["check"] == "row"
    assert failed[0]["at"] == [4095] and failed[0]["err"] == pytest.approx(1.0)
    assert failed[0]["err"] > failed[0]["bound"] and failed[0]["over"] == pytest.approx(failed[0]["err"] / failed[0]["bound"])
    assert "ms" not in h  # not timed
    assert rows["eager"]["status"] == "ok", rows["eager"]


def test_gradient_with_a_wrong_last_row_is_wrong():
    def bind(op, inputs, spec, size, rg, check_):
        return P.Bound(lambda: _TailGrad.apply(inputs["x"]), [inputs["x"]])

    rows = _run("softmax", dict(M=8192, N=64), "bfloat16", "full", {"hearth": bind, "eager": _softmax_bound(lambda y: y)})
    h = rows["hearth"]
    assert h["rel_err"] < check.TOLERANCE["bfloat16"]
    assert h["status"] == "wrong", h
    got = [(f["tensor"], f["check"], f["at"]) for f in h["check_failed"]]
    assert got[0] == ("grad0", "row", [8191]) and {t for t, _, _ in got} == {"grad0"}, got
    assert rows["eager"]["status"] == "ok", rows["eager"]


def test_output_with_a_wrong_last_column_is_wrong():
    """A missed last column tile: every row is off in one element of 8192 (row errors small), the column is all off."""
    rows = _run("softmax", dict(M=64, N=8192), "bfloat16", "fwd", {"hearth": _softmax_bound(_zero_last_col)})
    h = rows["hearth"]
    assert h["rel_err"] < check.TOLERANCE["bfloat16"]
    assert h["status"] == "wrong", h
    assert ("output0", "col", [8191]) in [(f["tensor"], f["check"], f["at"]) for f in h["check_failed"]]


def test_attention_with_wrong_last_query_rows_is_wrong():
    """Causal attention's late rows average many values and are small; four wrong rows at the end of T=4096 hardly
    move the whole-tensor error (the reference's and the provider's in bf16), but each of those rows is all wrong."""
    size = cases._attn(1, 1, 1, 4096, D=16, causal=1)

    def bind(op, inputs, spec, size, rg, check_):
        q, k, v = inputs["q"], inputs["k"], inputs["v"]

        def fn():
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return torch.cat([o[:, :, :-4], torch.zeros_like(o[:, :, -4:])], dim=2)
        return P.Bound(fn, [q, k, v])

    rows = _run("attention", size, "bfloat16", "fwd", {"hearth": bind})
    h = rows["hearth"]
    assert h["rel_err"] < check.TOLERANCE["bfloat16"]
    assert h["status"] == "wrong", h
    assert h["check_failed"][0]["check"] == "row" and h["check_failed"][0]["at"] in ([0, 0, t] for t in range(4092, 4096))


def test_correct_bf16_computations_pass_with_their_margins_recorded():
    """PyTorch's own bf16 computation (the eager provider) and one rounding once from fp32 stay ok; the row records
    the check nearest its bound and what the bounds came from."""
    rows = _run("softmax", dict(M=4096, N=64), "bfloat16", "full", {"hearth": _softmax_bound(lambda y: y),
                                                                      "eager": P.BINDERS["eager"]})
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["check_failed"] == []
        w = r["check_worst"]
        assert w["tensor"] in ("output0", "grad0") and w["check"] in ("row", "col") and w["err"] <= w["bound"]
        assert "bfloat16" in r["check_baseline"]


@pytest.mark.parametrize("op", ["softmax", "cross_entropy", "linear_cross_entropy", "rms_norm", "layer_norm", "rope",
                                "swiglu", "swiglu_mlp", "attention", "attention_varlen"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_pytorch_in_low_precision_passes_every_op(op, dtype):
    spec = cases.SPECS[op]
    for size in spec.check_sizes:
        r = runner.run_case(spec, size, dtype, "full", ["eager"], CPU, LIMITS, {"gpu": "test"}, False, True)[0]
        assert r["status"] == "ok", (size, r)


def test_matmul_in_bf16_passes():
    def mm(op, inputs, spec, size, rg, check_):
        return P.Bound(lambda: inputs["a"] @ inputs["b"], [inputs["a"], inputs["b"]])

    for mode in ("fwd", "full"):
        rows = _run("matmul", dict(M=96, N=80, K=512), "bfloat16", mode, {"hearth": mm})
        assert rows["hearth"]["status"] == "ok", rows["hearth"]


@pytest.mark.parametrize("op", ["softmax", "rms_norm", "rope", "swiglu", "attention"])
def test_hearth_kernels_in_bf16_pass(op):
    """hearth's own kernels (the Triton interpreter on the CPU: its bf16 stores truncate) at the CPU check sizes."""
    spec = cases.SPECS[op]
    r = runner.run_case(spec, spec.check_sizes[0], "bfloat16", "full", ["hearth"], CPU, LIMITS, {"gpu": "test"}, True, True)[0]
    assert r["status"] == "ok", r


# ----------------------------------------------------------------------------- the measure itself
def test_slice_errors_rows_columns_blocks():
    ref = torch.randn(6, 32, generator=torch.Generator().manual_seed(0))
    a = ref.clone()
    a[4, :] *= 1.5
    e = check.slice_errors(a, ref)
    assert set(e) == {"row", "col"}
    assert e["row"][0] == pytest.approx(0.5, rel=1e-5) and e["row"][1] == [4]
    v = torch.randn(200, generator=torch.Generator().manual_seed(1))
    b = v.clone()
    b[-3:] = 0  # the last, partial block of 64
    e1 = check.slice_errors(b, v)
    assert set(e1) == {"block"} and e1["block"][1] == [3]
    assert check.slice_errors(torch.tensor(2.0), torch.tensor(2.0)) == {}


def test_slice_errors_of_a_zero_reference_row_use_a_typical_row_scale():
    """A row whose reference is zero (or tiny: its terms cancel) is measured against half a typical row's norm:
    rounding noise there does not read as an infinite (or 10x) relative error."""
    ref = torch.randn(8, 32, generator=torch.Generator().manual_seed(2))
    ref[3] = 0
    a = ref.clone()
    a[3] = 1e-9
    assert check.slice_errors(a, ref)["row"][0] < 1e-3


def test_compare_without_a_baseline_uses_the_rounding_of_the_reference():
    ref = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    ok, err, why = check.compare(ref.bfloat16(), [], ref, [], "bfloat16")
    assert ok and why == ""
    bad = ref.bfloat16()
    bad[-1] = 0
    ok, _, why = check.compare(bad, [], ref, [], "bfloat16")
    assert not ok and "output0 row [63]" in why


def test_a_non_finite_baseline_does_not_lift_the_bound():
    """PyTorch's own run overflowing (inf) must not make every slice bound infinite: the rounding stands."""
    ref = torch.randn(32, 32, generator=torch.Generator().manual_seed(4))
    base = check.baseline_errors(torch.full_like(ref, float("inf")), [], ref, [], "bfloat16")
    assert all(v < 0.01 for v in base["output0"].values()), base
    bad = ref.bfloat16()
    bad[-1] = 0
    assert not check.compare(bad, [], ref, [], "bfloat16", base)[0]
