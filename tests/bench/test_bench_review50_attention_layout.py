"""Review 50: attention's cases hand every provider q, k, v (and dy) in the layout a Hugging Face model does.

In HF Llama / Qwen, q = q_proj(x).view(B, T, H, D).transpose(1, 2) (rope keeps that memory order), k and v the
same: [B, H, T, D] views of [B, T, H, D] memory, and the backward hands the attention output's gradient back the
same way (o.transpose(1, 2).reshape(B, T, H * D) -> o_proj). The bench made contiguous [B, H, T, D] tensors, which
changes every kernel's memory access and whether a provider copies (FlashAttention's own [B, T, H, D] layout came
in as a transposed view). Rows now carry the layout ("layout": "hf"); a row without it was measured on contiguous
inputs, and the verdict never ranks rows of different layouts against each other. attention_varlen's packed
[total_tokens, H, D] inputs are contiguous, as a model's packed batch is, and say so.
"""

from __future__ import annotations

import sys

import pytest
import torch

from hearth.bench import cases, providers as P, report, runner

CPU = torch.device("cpu")
SIZE = cases._attn(1, 4, 2, 16, D=16, causal=1)
ATTN_PROVIDERS = ["hearth", "eager", "sdpa_flash", "sdpa_cudnn", "flash_attn"]


def _hf_strides(shape):
    """The strides of a [B, H, T, D] view of a contiguous [B, T, H, D] tensor."""
    B, H, T, D = shape
    return (T * H * D, D, H * D, 1)


def _is_hf(t) -> bool:
    return t.dim() == 4 and tuple(t.stride()) == _hf_strides(tuple(t.shape)) and not t.is_contiguous()


@pytest.fixture(autouse=True)
def _fast_harness(monkeypatch):
    from hearth.bench import timing

    monkeypatch.setattr(runner, "_free", lambda device: None)
    monkeypatch.setattr(timing, "time_wall", lambda *a, **k: {})


def test_attention_inputs_are_hf_views_and_leaves():
    for rg in (False, True):
        inputs = cases.SPECS["attention"].make(SIZE, torch.float32, CPU, rg)
        for name, heads in (("q", 4), ("k", 2), ("v", 2)):
            t = inputs[name]
            assert tuple(t.shape) == (1, heads, 16, 16)
            assert _is_hf(t), (name, t.stride())
            assert t.is_leaf and t.requires_grad == rg


def test_attention_dy_comes_back_in_the_output_layout():
    spec = cases.SPECS["attention"]
    inputs = spec.make(SIZE, torch.float32, CPU, True)
    _, grads, gouts = runner._reference(spec, inputs, SIZE, "full", torch.float32)
    assert len(gouts) == 1 and _is_hf(gouts[0]) and gouts[0].stride() == inputs["q"].stride()
    assert all(g is not None for g in grads)


class _SeeDy(torch.autograd.Function):
    """Identity that records the layout of the gradient handed to it."""
    seen: list = []

    @staticmethod
    def forward(ctx, o):
        return o.view_as(o)

    @staticmethod
    def backward(ctx, dy):
        _SeeDy.seen.append(tuple(dy.stride()))
        return dy


@pytest.mark.parametrize("mode", ["fwd", "full"])
def test_every_provider_is_handed_hf_views(mode):
    """The harness hands each provider's binder (the real one is called after the spy looks) the same HF views,
    fresh copies that keep the layout, and in full mode a dy in the output's layout."""
    seen = {}

    def spy(name):
        real = P.BINDERS[name]

        def bind(op, inputs, spec, size, rg, check):
            seen[name] = {k: (tuple(v.shape), tuple(v.stride()), v.requires_grad) for k, v in inputs.items()}
            if name == "eager":  # one provider through the whole path: dy in the layout of q
                q, k, v = inputs["q"], inputs["k"], inputs["v"]
                return P.Bound(lambda: _SeeDy.apply(torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=True)), [q, k, v])
            return real(op, inputs, spec, size, rg, check)
        return bind

    _SeeDy.seen = []
    reg = {p: spy(p) for p in ATTN_PROVIDERS}
    rows = runner.run_case(cases.SPECS["attention"], SIZE, "float32", mode, ATTN_PROVIDERS, CPU, {}, {}, False, True, reg)
    assert set(seen) == set(ATTN_PROVIDERS)
    for name, got in seen.items():
        for t in ("q", "k", "v"):
            shape, stride, rg = got[t]
            assert stride == _hf_strides(shape), (name, t, stride)
            assert rg == (mode == "full")
    by = {r["provider"]: r for r in rows}
    assert by["eager"]["status"] == "ok", by["eager"]
    assert all(r["layout"] == "hf" for r in rows)
    if mode == "full":
        assert _SeeDy.seen and all(s == _hf_strides((1, 4, 16, 16)) for s in _SeeDy.seen), _SeeDy.seen


def test_the_kernels_themselves_receive_hf_views(monkeypatch):
    """Inside the calls: hearth's kernel and SDPA (eager, sdpa_flash) get the [B, H, T, D] views; FlashAttention's
    function, whose layout is [B, T, H, D], gets contiguous tensors (no copy either way)."""
    got = {}
    attn_mod = sys.modules[P._hearth_fn("attention").__module__]
    real_hearth = attn_mod.attention

    def hearth_spy(q, k, v, **kw):
        got.setdefault("hearth", []).append([tuple(t.stride()) for t in (q, k, v)])
        return real_hearth(q, k, v, **kw)

    monkeypatch.setattr(attn_mod, "attention", hearth_spy)
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa_spy(q, k, v, **kw):
        got.setdefault("sdpa", []).append([tuple(t.stride()) for t in (q, k, v)])
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_spy)

    def fake_fa(inputs, attr):
        def dense(q, k, v, causal):
            got.setdefault("flash_attn", []).append([(t.is_contiguous(), tuple(t.shape)) for t in (q, k, v)])
            o = real_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True)
            return o.transpose(1, 2)
        return "fake_flash_attn", dense

    monkeypatch.setattr(P, "_flash_attn_function", fake_fa)
    providers = ["hearth", "eager", "sdpa_flash", "flash_attn"]
    rows = runner.run_case(cases.SPECS["attention"], SIZE, "float32", "full", providers, CPU, {}, {}, True, True)
    by = {r["provider"]: r for r in rows}
    for p in providers:
        assert by[p]["status"] == "ok", by[p]
    hf = [_hf_strides((1, 4, 16, 16)), _hf_strides((1, 2, 16, 16)), _hf_strides((1, 2, 16, 16))]
    assert got["hearth"] and all(s == hf for s in got["hearth"])
    assert len(got["sdpa"]) >= 2 and all(s == hf for s in got["sdpa"])  # eager and sdpa_flash
    assert got["flash_attn"] and all(c == [(True, (1, 16, 4, 16)), (True, (1, 16, 2, 16)), (True, (1, 16, 2, 16))]
                                     for c in got["flash_attn"])


def test_rows_record_the_layout_and_varlen_stays_packed_contiguous():
    base = runner._base_row(cases.SPECS["attention"], SIZE, "bfloat16", "full", {}, {}, False)
    assert base["layout"] == "hf" and "Hugging Face" in base["notes"]
    assert runner._base_row(cases.SPECS["rope"], dict(B=1, Hq=4, Hk=2, T=8, D=16), "bfloat16", "full", {}, {}, False)["layout"] == "hf"
    vl = cases._varlen(3, 21, 2, 1, D=16)
    assert runner._base_row(cases.SPECS["attention_varlen"], vl, "bfloat16", "full", {}, {}, False)["layout"] == "contiguous"
    inputs = cases.SPECS["attention_varlen"].make(vl, torch.float32, CPU, True)
    assert all(inputs[n].is_contiguous() and inputs[n].dim() == 3 for n in ("q", "k", "v"))
    assert runner._base_row(cases.SPECS["softmax"], dict(M=5, N=100), "bfloat16", "full", {}, {}, False)["layout"] == "contiguous"


def _row(p, ms, **kw):
    return {"provider": p, "ms": ms, "status": "ok", "op": "attention", "size_label": "s", "dtype": "bfloat16",
            "mode": "full", "p20_ms": ms, "p80_ms": ms, **kw}


def test_rows_of_another_layout_are_not_ranked_against_each_other():
    """Committed attention rows (no layout field: contiguous inputs) merged with new HF-layout rows: a peer timed
    on the other layout is named, not ranked; rope rows are placed by their notes (49b wrote the layout there)."""
    old_cudnn = _row("sdpa_cudnn", 0.5)
    new = [_row("hearth", 1.0, layout="hf"), _row("flash_attn", 2.0, layout="hf")]
    v = report.verdict(new + [old_cudnn])
    assert v["peer"] == "flash_attn" and v["ratio"] == pytest.approx(2.0)
    assert "sdpa_cudnn in another input layout" in v["text"]
    assert report.row_layout(old_cudnn) == "contiguous"
    assert report.row_layout({"op": "rope", "notes": "q, k and dy in the Hugging Face layout: ..."}) == "hf"
    assert report.row_layout({"op": "rope", "notes": ""}) == "contiguous"
    # rows of one layout (old with old, new with new) still compare
    assert report.verdict([_row("hearth", 1.0), old_cudnn])["peer"] == "sdpa_cudnn"
    lines = report.attention_goal_lines(new + [old_cudnn])
    assert lines and "cuDNN not measured" in lines[0]


def test_plots_draw_rows_of_two_layouts_as_separate_lines():
    """A merged folder can hold a provider's old contiguous rows beside its new HF-layout ones: one line through both
    would present them as one series. Each layout gets its own line, named with it; one layout keeps plain names."""
    from hearth.bench import plots

    def r(p, label, layout=None):
        row = {"provider": p, "size_label": label, "status": "ok", "value": 1.0, "work": 1.0}
        return {**row, "layout": layout} if layout else row

    mixed = [r("hearth", "a"), r("hearth", "b", "hf"), r("sdpa_cudnn", "a"), r("sdpa_cudnn", "b", "hf")]
    series = plots.plot_series(mixed)
    assert sorted(series) == ["hearth [contiguous]", "hearth [hf]", "sdpa_cudnn [contiguous]", "sdpa_cudnn [hf]"]
    assert [x["size_label"] for x in series["hearth [hf]"]] == ["b"]
    assert sorted(plots.plot_series([r("hearth", "a", "hf"), r("eager", "a", "hf")])) == ["eager", "hearth"]
