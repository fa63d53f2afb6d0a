"""Eager calls of every hearth op skip the torch.library dispatcher (a torch.autograd.Function over the
same launchers); under torch.compile the custom ops are the graph's opaque nodes, forward and backward."""

from __future__ import annotations

import pytest
import torch
import triton
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode

import hearth.kernels as hk
from hearth.kernels import _common
from hearth.kernels.lora import lora_linear, lora_swiglu_mlp
from hearth.kernels.swiglu import swiglu_mlp
from tests.kernels.tolerance import DEVICE


def _leaf(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).requires_grad_()


def _cases():
    """op -> (function of the leaves giving a scalar loss, leaves builder, forward / backward op names)."""
    w_lin = torch.randn(12, 8, device=DEVICE) * 0.3
    w_mlp = [torch.randn(*shape, device=DEVICE) * 0.3 for shape in ((16, 8), (16, 8), (8, 16))]
    return {
        "softmax": (lambda x: hk.softmax(x).square().sum(), lambda: [_leaf(4, 16)], {"softmax_fwd"}, {"softmax_bwd"}),
        "rms_norm": (lambda x, w: hk.rms_norm(x, w).square().sum(), lambda: [_leaf(4, 16), _leaf(16)],
                     {"rms_norm_fwd"}, {"rms_norm_bwd"}),
        "layer_norm": (lambda x, w, b: hk.layer_norm(x, w, b).square().sum(), lambda: [_leaf(4, 16), _leaf(16), _leaf(16)],
                       {"layer_norm_fwd"}, {"layer_norm_bwd"}),
        "rope": (lambda q, k: sum(t.square().sum() for t in hk.rope(q, k, *_rope_tables())),
                 lambda: [_leaf(1, 2, 4, 8), _leaf(1, 1, 4, 8)], {"rope"}, {"rope"}),
        "swiglu": (lambda g, u: hk.swiglu(g, u).square().sum(), lambda: [_leaf(4, 16), _leaf(4, 16)],
                   {"swiglu_fwd"}, {"swiglu_bwd"}),
        "swiglu_mlp": (lambda x, wg, wu, wd: swiglu_mlp(x, wg, wu, wd).square().sum(),
                       lambda: [_leaf(4, 8), _leaf(16, 8, scale=0.3), _leaf(16, 8, scale=0.3), _leaf(8, 16, scale=0.3)],
                       {"swiglu_mlp_fwd"}, {"swiglu_mlp_bwd"}),
        "attention": (lambda q, k, v: hk.attention(q, k, v, causal=True).square().sum(),
                      lambda: [_leaf(1, 2, 16, 16), _leaf(1, 1, 16, 16), _leaf(1, 1, 16, 16)],
                      {"attention_fwd"}, {"attention_bwd"}),
        "matmul": (lambda a, b: hk.matmul(a, b).square().sum(), lambda: [_leaf(8, 16), _leaf(16, 8)], {"matmul"}, {"matmul"}),
        "linear_cross_entropy": (lambda x, w: hk.linear_cross_entropy(x, w, _fixed_target(), chunk_rows=4) * 2,
                                 lambda: [_leaf(8, 8), _leaf(16, 8, scale=0.3)],
                                 {"linear_cross_entropy_fwd"}, {"linear_cross_entropy_scale_"}),
        "cross_entropy": (lambda x: hk.cross_entropy(x, _fixed_target()) * 2, lambda: [_leaf(8, 16)],
                          {"cross_entropy_fwd"}, {"cross_entropy_scale_grad"}),
        # frozen base (plain tensors made once, outside any compiled region), trainable x and LoRA factors
        "lora_linear": (lambda x, a, b: lora_linear(x, w_lin, None, a, b, 0.5).square().sum(),
                        lambda: [_leaf(4, 8), _leaf(2, 8, scale=0.3), _leaf(12, 2, scale=0.3)],
                        {"lora_linear_fwd"}, {"lora_linear_bwd"}),
        "lora_swiglu_mlp": (lambda x, ag, bg, au, bu, ad, bd: lora_swiglu_mlp(
                                x, *w_mlp, ag, bg, au, bu, ad, bd, 0.5, 0.5, 0.5).square().sum(),
                            lambda: [_leaf(4, 8), _leaf(2, 8, scale=0.3), _leaf(16, 2, scale=0.3), _leaf(2, 8, scale=0.3),
                                     _leaf(16, 2, scale=0.3), _leaf(2, 16, scale=0.3), _leaf(8, 2, scale=0.3)],
                            {"lora_swiglu_mlp_fwd"}, {"lora_swiglu_mlp_bwd"}),
    }


def _rope_tables():
    pos = torch.arange(4, device=DEVICE, dtype=torch.float32)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001], device=DEVICE)
    freqs = torch.cat([pos, pos], dim=-1)[None]
    return freqs.cos(), freqs.sin()


def _fixed_target():
    return torch.tensor([0, 3, 5, 1, 15, 2, 7, 9], device=DEVICE)


class _HearthOps(TorchDispatchMode):
    """Names of the hearth:: custom ops that reach the dispatcher while the mode is on."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "hearth":
            self.seen.append(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


CASES = _cases()


@pytest.mark.parametrize("op", sorted(CASES))
def test_eager_call_does_not_dispatch_the_custom_op(op):
    loss_fn, leaves_fn, _, _ = CASES[op]
    leaves = leaves_fn()
    with _HearthOps() as mode:
        loss = loss_fn(*leaves)
        loss.backward()
    assert mode.seen == [], f"eager {op} went through torch.ops.hearth: {mode.seen}"
    assert all(t.grad is not None for t in leaves)


def test_the_dispatch_probe_sees_a_custom_op_call():
    """The probe above can fail: a call that does go through torch.ops.hearth is recorded."""
    x = _leaf(4, 16)
    with _HearthOps() as mode:
        torch.ops.hearth.softmax_fwd(x).sum().backward()
    assert mode.seen == ["softmax_fwd", "softmax_bwd"]


@pytest.mark.parametrize("op", sorted(CASES))
def test_compiled_graph_holds_the_custom_ops(op):
    """torch.compile(fullgraph=True): the forward graph calls the op's forward custom op and the backward
    graph its backward op (opaque nodes, no graph break); gradients match the eager route."""
    loss_fn, leaves_fn, fwd_ops, bwd_ops = CASES[op]
    graphs = {"fwd": set(), "bwd": set()}

    def collect(kind):
        def compiler(gm, _inputs):
            for node in gm.graph.nodes:
                if node.op != "call_function":
                    continue
                # a mutating op (the in-place gradient scaling) is wrapped: auto_functionalized(op, ...)
                for target in (node.target, *node.args[:1]):
                    if isinstance(target, torch._ops.OpOverload) and target.namespace == "hearth":
                        graphs[kind].add(target._schema.name.split("::")[-1])
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=collect("fwd"), bw_compiler=collect("bwd"))
    leaves = leaves_fn()
    compiled = torch.compile(loss_fn, backend=backend, fullgraph=True)
    got = torch.autograd.grad(compiled(*leaves), leaves)
    assert fwd_ops <= graphs["fwd"], f"{op}: forward graph has {graphs['fwd']}"
    assert bwd_ops <= graphs["bwd"], f"{op}: backward graph has {graphs['bwd']}"
    eager_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    want = torch.autograd.grad(loss_fn(*eager_leaves), eager_leaves)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_eager_grad_fn_is_the_shared_function():
    x, w = _leaf(4, 16), _leaf(16)
    y = hk.rms_norm(x, w)
    assert type(y.grad_fn).__name__ == "RmsNormFwdFunctionBackward"


def test_mlp_eager_backward_bumps_the_overwritten_saved_tensors():
    """The eager MLP backward overwrites g and u with Triton (invisible to autograd); it bumps their
    version counters as the custom op's mutates_args did, so a second backward is refused."""
    x = _leaf(4, 8)
    ws = [_leaf(16, 8, scale=0.3), _leaf(16, 8, scale=0.3), _leaf(8, 16, scale=0.3)]
    out = swiglu_mlp(x, *ws)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_host_int_helpers_match_triton():
    for n in list(range(0, 300)) + [2**20 - 1, 2**20, 2**20 + 1, 12289 * 40]:
        assert _common.next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 128, 1000):
            assert _common.cdiv(n, b) == triton.cdiv(n, b), (n, b)


def test_records_graph_is_grad_mode_and_any_input_needing_a_gradient():
    plain, leaf = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert _common.records_graph(plain, leaf) and _common.records_graph(leaf)
    assert not _common.records_graph(plain, plain) and not _common.records_graph()
    with torch.no_grad():
        assert not _common.records_graph(plain, leaf)
    with torch.inference_mode():
        assert not _common.records_graph(leaf)


def test_compiled_or_eager_runs_the_launcher_eagerly_and_the_op_while_compiling(monkeypatch):
    calls = []
    call = _common.compiled_or_eager(lambda *a: calls.append(("op", a)) or "op",
                                     lambda *a: calls.append(("fn", a)) or "fn")
    assert call(1, 2) == "fn" and calls == [("fn", (1, 2))]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert call(3) == "op" and calls[-1] == ("op", (3,))
