"""hearth.kernels.rope(..., inplace=True): the same kernel writing over q and k (and over the incoming gradients in
the backward), against the out-of-place op, with the guards that keep it from computing something wrong silently."""

from __future__ import annotations

import importlib

import pytest
import torch

from hearth.kernels.rope import rope
from tests.kernels.test_rope import make_qk, reference, tables
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only

# importlib: `hearth.kernels.rope` as an attribute is the function, not the module
rope_mod = importlib.import_module("hearth.kernels.rope")


def _tables(batch=2, t=5, d=16, dtype=torch.float32):
    return tables(batch, t, d, dtype, offset=3.0)


def _graph_inputs(q0, k0, hf_layout, base=False):
    """Non-leaf q, k (PyTorch refuses in-place ops on leaves that require grad) over leaves q0, k0; with hf_layout,
    q0 is [B, T, H, D] and q its transposed view, as a model's q_proj(x).view(...).transpose(1, 2). base: also
    the tensor q views, for torch.autograd.grad: after rope(inplace=True) bumps the version q shares with it, q
    (a view) takes a new history from its base, which rope's node does not lead to."""
    qb = q0.clone()
    q = qb.transpose(1, 2) if hf_layout else qb
    return (q, k0.clone(), qb) if base else (q, k0.clone())


def _leaves(dtype, hf_layout, hq=4, hk=2, t=5, d=16):
    q, k = make_qk(2, hq, hk, t, d, dtype, False)
    q0 = q.transpose(1, 2).contiguous() if hf_layout else q
    return q0.requires_grad_(), k.requires_grad_()


def _fwd_bwd(q0, k0, cos, sin, hf_layout, inplace, loss=None):
    """Leaf gradients of a loss through rope: by default a weighted sum, so that the upstream gradients are new
    (dense) tensors, the usual case."""
    q0.grad = k0.grad = None
    q, k = _graph_inputs(q0, k0, hf_layout)
    qo, ko = rope(q, k, cos, sin, inplace=inplace)
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    if loss is None:
        wq = torch.randn(qo.shape, generator=gen, device=DEVICE).to(qo.dtype)
        wk = torch.randn(ko.shape, generator=gen, device=DEVICE).to(ko.dtype)
        loss = lambda a, b: (a * wq).sum() + (b * wk).sum()  # noqa: E731
    loss(qo, ko).backward()
    return qo.detach().clone(), ko.detach().clone(), q0.grad.clone(), k0.grad.clone()


# ------------------------------------------------------------------------------------------ forward values
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cos_batch", [1, 2], ids=["cos_b1", "cos_bB"])
@pytest.mark.parametrize("hf_layout", [False, True], ids=["bhtd", "bthd_transposed"])
def test_values_equal_the_out_of_place_op_and_are_written_over_q_and_k(dtype, cos_batch, hf_layout):
    q, k = make_qk(2, 4, 2, 5, 16, dtype, hf_layout)  # GQA 4 / 2
    cos, sin = _tables(cos_batch, dtype=dtype)
    want_q, want_k = rope(q, k, cos, sin)
    qi, ki = q.clone(), k.clone()
    strides, ptrs, version = (qi.stride(), ki.stride()), (qi.data_ptr(), ki.data_ptr()), qi._version
    got_q, got_k = rope(qi, ki, cos, sin, inplace=True)
    assert got_q is qi and got_k is ki  # no graph recorded: q and k themselves
    assert torch.equal(qi, want_q) and torch.equal(ki, want_k)  # the same kernel: bit for bit
    assert (qi.stride(), ki.stride()) == strides and (qi.data_ptr(), ki.data_ptr()) == ptrs
    assert qi._version > version
    assert_close(qi, reference(q, cos, sin), dtype, msg="q_rot")


def test_fused_projection_slices_rotate_in_place():
    """q and k as head slices of one [B, T, (Hq + 2 Hk) * D] buffer (a fused qkv projection): their address ranges
    interleave, but no element is shared, so they are rotated in place; v (the rest of the row) is untouched."""
    b, t, hq, hk, d = 2, 5, 4, 2, 16
    qkv = torch.randn(b, t, (hq + 2 * hk) * d, device=DEVICE)
    before = qkv.clone()
    q = qkv[..., : hq * d].view(b, t, hq, d).transpose(1, 2)
    k = qkv[..., hq * d: (hq + hk) * d].view(b, t, hk, d).transpose(1, 2)
    cos, sin = _tables()
    want_q, want_k = rope(q, k, cos, sin)
    rope(q, k, cos, sin, inplace=True)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(qkv[..., (hq + hk) * d:], before[..., (hq + hk) * d:])


def test_no_grad_leaf_and_inference_tensors():
    """PyTorch allows in-place ops on a leaf that requires grad under no_grad (an optimizer step): so does rope,
    bumping the version; under inference_mode tensors have no version counter and rope still works."""
    q, k = make_qk(1, 2, 1, 3, 8, torch.float32, True)
    q.requires_grad_()
    cos, sin = _tables(1, 3, 8)
    want_q, want_k = rope(q.detach(), k, cos, sin)
    with torch.no_grad():
        version = q._version
        got_q, got_k = rope(q, k, cos, sin, inplace=True)
    assert got_q is q and torch.equal(q.detach(), want_q) and torch.equal(k, want_k) and q._version > version
    with torch.inference_mode():
        qi, ki = make_qk(1, 2, 1, 3, 8, torch.float32, True)
        want = rope(qi, ki, cos, sin)
        got = rope(qi, ki, cos, sin, inplace=True)
        assert got[0] is qi and torch.equal(qi, want[0]) and torch.equal(ki, want[1])


# ------------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cos_batch", [1, 2], ids=["cos_b1", "cos_bB"])
@pytest.mark.parametrize("hf_layout", [False, True], ids=["bhtd", "bthd_transposed"])
def test_gradients_equal_the_out_of_place_op(dtype, cos_batch, hf_layout):
    q0, k0 = _leaves(dtype, hf_layout)
    cos, sin = _tables(cos_batch, dtype=dtype)
    want = _fwd_bwd(q0, k0, cos, sin, hf_layout, inplace=False)
    got = _fwd_bwd(q0, k0, cos, sin, hf_layout, inplace=True)
    for g, w, name in zip(got, want, ("q_rot", "k_rot", "dq", "dk")):
        assert torch.equal(g, w), name


def test_outputs_are_new_objects_on_q_and_k_storage_when_a_graph_is_recorded():
    q0, k0 = _leaves(torch.float32, True)
    q, k = _graph_inputs(q0, k0, True)
    qo, ko = rope(q, k, *_tables(), inplace=True)
    assert qo is not q and qo.data_ptr() == q.data_ptr() and qo.stride() == q.stride()
    assert ko.data_ptr() == k.data_ptr() and qo._version == q._version  # one version counter
    assert type(qo.grad_fn).__name__ == "_RopeInPlaceFunctionBackward"


class _Hand(torch.autograd.Function):
    """Identity whose backward hands on the gradient popped from `box` (ignoring its own): a gradient object that
    only autograd holds, as a following op's backward (the attention's dq) makes."""

    @staticmethod
    def forward(ctx, x, box):
        ctx.box = box
        return x.detach()

    @staticmethod
    def backward(ctx, g):
        return ctx.box.pop(), None


def _handed(outputs, grads):
    """outputs passed through _Hand, each to receive a fresh copy of its grads entry; (outputs, their ptrs)."""
    boxes = [[g.clone()] for g in grads]
    ptrs = [b[0].data_ptr() for b in boxes]
    return [_Hand.apply(o, b) for o, b in zip(outputs, boxes)], ptrs


def test_backward_writes_over_the_incoming_gradients():
    """A gradient only autograd holds (what the next op's backward made) becomes dq (same memory), with the
    out-of-place op's values."""
    q0, k0 = _leaves(torch.float32, True)
    cos, sin = _tables()
    gq = torch.randn(2, 5, 4, 16, device=DEVICE).transpose(1, 2).clone()  # HF-layout strides, not a view
    gk = torch.randn(2, 2, 5, 16, device=DEVICE)
    q, k, qb = _graph_inputs(q0, k0, True, base=True)
    want = torch.autograd.grad(rope(q, k, cos, sin), (qb, k), (gq, gk))
    q, k, qb = _graph_inputs(q0, k0, True, base=True)
    outs, ptrs = _handed(rope(q, k, cos, sin, inplace=True), (gq, gk))
    got = torch.autograd.grad(outs, (qb, k), (torch.zeros_like(gq), torch.zeros_like(gk)))
    assert got[1].data_ptr() == ptrs[1]  # k: no view on the way to the leaf
    assert got[0].untyped_storage().data_ptr() == ptrs[0]  # q: through the transpose view of its base
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_gradient_someone_else_holds_is_not_written_over():
    """Autograd hands ONE gradient object to every input of an add: q_rot + y gave y the rotated values when the
    backward wrote over it (a wrong gradient, silently). A dy the caller passes to backward() and keeps is left as
    it was too. Both go to new gradients."""
    q0, k0 = _leaves(torch.float32, False)
    cos, sin = _tables()
    q, k = q0 * 1, k0 * 1
    y = torch.randn_like(q).requires_grad_()
    qo, ko = rope(q, k, cos, sin, inplace=True)
    dy = torch.randn_like(qo)
    keep = dy.clone()
    torch.autograd.backward([qo + y, ko], [dy, torch.randn_like(ko)])  # (ko.sum()'s gradient: expanded, see below)
    assert torch.equal(y.grad, keep) and torch.equal(dy, keep)
    want = torch.autograd.grad(rope(q0 * 1, k0 * 1, cos, sin)[0], q0, keep)[0]
    torch.testing.assert_close(q0.grad, want)


def test_a_leafs_gradient_is_taken_without_a_second_copy():
    """q and k one clone away from leaves (the bench's rope_inplace rows), dy held by the caller across calls: the
    caller's dy is left alone, so the backward rotates into new gradients, and the leaves' AccumulateGrad takes
    those as they are. Returning a gradient object that someone else also held made AccumulateGrad copy it whole
    (on the H200: +576 MiB and ~1.5x the time of Liger's in-place rope at Qwen3-32B T 32768)."""
    qb, k0 = _leaves(torch.float32, True)
    q0 = qb.detach().transpose(1, 2).requires_grad_()  # the HF layout as the leaf (the bench's make)
    cos, sin = _tables()
    qn, kn = q0.clone(), k0.clone()  # clone keeps the dense transposed strides
    dy = [torch.randn_like(q0), torch.randn_like(k0)]
    keep = [g.clone() for g in dy]
    seen = []
    real = rope_mod._new_outputs

    def spy(*args):
        out = real(*args)
        seen.append([t.data_ptr() for t in out])
        return out

    rope_mod._new_outputs = spy
    try:
        for _ in range(2):  # a second call: the same copies and dy again
            q0.grad = k0.grad = None
            seen.clear()
            torch.autograd.backward(rope(qn, kn, cos, sin, inplace=True), dy)
            assert seen == [[q0.grad.data_ptr(), k0.grad.data_ptr()]]  # the backward's own outputs, not copies
            assert torch.equal(dy[0], keep[0]) and torch.equal(dy[1], keep[1])
    finally:
        rope_mod._new_outputs = real


@pytest.mark.parametrize("case", ["q_sum", "both_sums"])
def test_gradient_of_a_sum_is_expanded_and_gets_new_gradients(case):
    """.sum()'s backward hands rope an expanded (zero-stride) gradient: rotating it in place would write every
    element over one memory location; rope allocates instead, and the gradients are the out-of-place op's.
    q_sum: dk_out a dense tensor apart from dq_out, so only the expanded-gradient check stands in the way;
    both_sums: the two expanded gradients are also one scalar's memory."""
    q0, k0 = _leaves(torch.float32, True)
    cos, sin = _tables()
    if case == "q_sum":
        loss = lambda a, b: a.sum() + (b * 2).sum()  # noqa: E731
    else:
        loss = lambda a, b: a.sum() + b.sum()  # noqa: E731
    want = _fwd_bwd(q0, k0, cos, sin, True, inplace=False, loss=loss)
    got = _fwd_bwd(q0, k0, cos, sin, True, inplace=True, loss=loss)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("case", ["same_tensor", "overlapping_heads"])
def test_gradients_sharing_memory_get_new_gradients(case):
    """dq_out and dk_out over the same memory: rotating one in place would corrupt the other."""
    q0, k0 = _leaves(torch.float32, False, hq=2, hk=2)
    cos, sin = _tables()
    if case == "same_tensor":
        gq = gk = torch.randn(2, 2, 5, 16, device=DEVICE)
    else:  # heads 1 of gq and 0 of gk are one memory
        buf = torch.randn(2, 3, 5, 16, device=DEVICE)
        gq, gk = buf[:, :2], buf[:, 1:]
    keep = (gq.clone(), gk.clone())
    q, k = _graph_inputs(q0, k0, False)
    want = torch.autograd.grad(rope(q, k, cos, sin), (q, k), keep)
    q, k = _graph_inputs(q0, k0, False)
    got = torch.autograd.grad(rope(q, k, cos, sin, inplace=True), (q, k), (gq, gk))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(gq, keep[0]) and torch.equal(gk, keep[1])  # not written over


def test_gradients_that_are_views_of_one_buffer_get_new_gradients():
    """dq_out / dk_out as head slices of one [B, T, H, D] buffer (a packed attention backward): views, whose memory
    their base (or another view of it) may show to someone else, so they are not written over (_sole); the values
    are the out-of-place op's and the buffer is left as it was."""
    q0, k0 = _leaves(torch.float32, True)
    cos, sin = _tables()
    buf = torch.randn(2, 5, 6, 16, device=DEVICE)
    keep = buf.clone()
    gq, gk = buf[:, :, :4].transpose(1, 2), buf[:, :, 4:].transpose(1, 2)
    q, k, qb = _graph_inputs(q0, k0, True, base=True)
    want = torch.autograd.grad(rope(q, k, cos, sin), (qb, k), (gq.clone(), gk.clone()))
    q, k, qb = _graph_inputs(q0, k0, True, base=True)
    got = torch.autograd.grad(rope(q, k, cos, sin, inplace=True), (qb, k), (gq, gk))
    assert torch.equal(buf, keep)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_double_backward_matches_the_out_of_place_op():
    q0, k0 = _leaves(torch.float32, False)
    cos, sin = _tables()

    def run(inplace):
        q, k = _graph_inputs(q0, k0, False)
        qo, ko = rope(q, k, cos, sin, inplace=inplace)
        dq, dk = torch.autograd.grad(qo.square().sum() + (ko * 3).square().sum(), (q0, k0), create_graph=True)
        return torch.autograd.grad((dq * dq.detach()).sum() + dk.square().sum(), (q0, k0))

    want, got = run(False), run(True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_one_input_requiring_grad_and_one_output_unused():
    q0, _ = _leaves(torch.float32, True)
    k = torch.randn(2, 2, 5, 16, device=DEVICE)  # no grad
    cos, sin = _tables()
    grads = []
    for inplace in (False, True):
        q0.grad = None
        qo, _ko = rope(q0.clone().transpose(1, 2), k.clone(), cos, sin, inplace=inplace)
        (qo * 2).sum().backward()
        grads.append(q0.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_outputs_can_be_modified_in_place_afterwards():
    """The outputs are plain tensors to autograd (detach() aliases), not views made inside a custom Function:
    a later in-place op on them is allowed and differentiated."""
    q0, k0 = _leaves(torch.float32, True)
    cos, sin = _tables()

    def loss(a, b):
        a.mul_(3)
        return a.square().sum() + b.sum()

    want = _fwd_bwd(q0, k0, cos, sin, True, inplace=False, loss=loss)
    got = _fwd_bwd(q0, k0, cos, sin, True, inplace=True, loss=loss)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


# ---------------------------------------------------------------------------------------------------- guards
def test_a_graph_that_saved_q_fails_loudly():
    """q * w saves q for w's gradient; rope then rotates q in place: the backward must raise, not use the rotated
    values (rope bumps q's version counter)."""
    x = torch.randn(1, 2, 3, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(1, 2, 3, 8, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, device=DEVICE)
    q = x * 1
    s = (q * w).sum()
    qo, ko = rope(q, k, *_tables(1, 3, 8), inplace=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (s + qo.sum() + ko.sum()).backward()


def test_a_leaf_that_requires_grad_is_refused():
    q, k = make_qk(1, 2, 1, 3, 8, torch.float32, False)
    cos, sin = _tables(1, 3, 8)
    q.requires_grad_()
    with pytest.raises(ValueError, match=r"^q is a leaf tensor that requires grad"):
        rope(q, k, cos, sin, inplace=True)
    with pytest.raises(ValueError, match=r"^q is a view of a leaf tensor that requires grad"):
        rope(q.transpose(2, 3).transpose(2, 3), k, cos, sin, inplace=True)
    with pytest.raises(ValueError, match=r"^k is a leaf tensor"):
        rope(q.clone(), k.requires_grad_(), cos, sin, inplace=True)
    assert torch.equal(q, q.detach())  # nothing written before the refusal
    rope(q.clone(), k.clone(), cos, sin, inplace=True)  # non-leaves: fine


@pytest.mark.parametrize("which", ["q", "k"])
def test_an_expanded_input_is_refused(which):
    q, k = make_qk(1, 2, 2, 3, 8, torch.float32, False)
    args = dict(q=q, k=k)
    args[which] = args[which][:, :1].expand(1, 2, 3, 8)  # two heads on one memory
    with pytest.raises(ValueError, match=rf"^{which} has elements that share memory"):
        rope(**args, cos=_tables(1, 3, 8)[0], sin=_tables(1, 3, 8)[1], inplace=True)


@pytest.mark.parametrize("case", ["same_tensor", "overlapping_heads"])
def test_q_and_k_sharing_memory_is_refused(case):
    cos, sin = _tables(1, 3, 8)
    if case == "same_tensor":
        q = k = torch.randn(1, 2, 3, 8, device=DEVICE)
    else:
        buf = torch.randn(1, 3, 3, 8, device=DEVICE)
        q, k = buf[:, :2], buf[:, 1:]
    before = (q.clone(), k.clone())
    with pytest.raises(ValueError, match=r"^k shares memory with q"):
        rope(q, k, cos, sin, inplace=True)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    rope(q, k, cos, sin)  # out of place: fine


@pytest.mark.parametrize("which", ["cos", "sin"])
def test_a_table_sharing_memory_with_q_is_refused(which):
    q, k = make_qk(1, 2, 1, 3, 8, torch.float32, False)
    cos, sin = _tables(1, 3, 8)
    table = q[:, 0]  # [1, 3, 8] over q's first head
    args = dict(cos=cos, sin=sin)
    args[which] = table
    with pytest.raises(ValueError, match=rf"^{which} shares memory with q or k"):
        rope(q, k, **args, inplace=True)


def test_inplace_must_be_a_bool():
    q, k = make_qk(1, 2, 1, 3, 8, torch.float32, False)
    with pytest.raises(TypeError, match=r"^inplace must be a bool"):
        rope(q, k, *_tables(1, 3, 8), inplace="yes")


@pytest.mark.parametrize(
    "which, value, exc",
    [
        ("q", torch.ones(1, 2, 3, 4, dtype=torch.float64), TypeError),
        ("k", torch.ones(1, 1, 2, 4), ValueError),
        ("cos", torch.ones(1, 3, 6), ValueError),
        ("sin", torch.ones(1, 3, 4, device="meta"), ValueError),
        ("q", torch.ones(1, 2, 0, 4), ValueError),  # empty
    ],
)
def test_the_usual_checks_name_the_argument(which, value, exc):
    args = dict(q=torch.ones(1, 2, 3, 4), k=torch.ones(1, 1, 3, 4), cos=torch.ones(1, 3, 4), sin=torch.ones(1, 3, 4))
    args = {n: t.to(DEVICE) for n, t in args.items()}
    if which == "q" and value.numel() == 0:
        args["k"] = torch.ones(1, 1, 0, 4, device=DEVICE)
        args["cos"] = args["sin"] = torch.ones(1, 0, 4, device=DEVICE)
    args[which] = value if value.device.type == "meta" else value.to(DEVICE)
    with pytest.raises(exc, match=rf"^{which}\b"):
        rope(**args, inplace=True)


def test_the_warp_pick_never_launches_over_the_callers_tensors(monkeypatch):
    """pick_config launches every candidate dozens of times on the GPU: rotating in place, those launches go to
    scratch tensors, so q and k are rotated exactly once. Under the interpreter pick_config does not time, so a
    stand-in that launches each candidate three times plays the GPU's part."""
    def timing_pick(key, candidates, launch, device, rows=None, memory=None):
        for cfg in candidates:
            for _ in range(3):
                launch(cfg)
        return candidates[0]

    monkeypatch.setattr(rope_mod, "pick_config", timing_pick)
    monkeypatch.setattr(rope_mod, "_PLANS", {})  # a miss: the pick runs
    q, k = make_qk(2, 4, 2, 5, 16, torch.float32, True)
    cos, sin = _tables()
    want_q, want_k = rope(q, k, cos, sin)
    monkeypatch.setattr(rope_mod, "_PLANS", {})
    rope(q, k, cos, sin, inplace=True)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


def test_torch_compile_runs_out_of_place():
    """Under torch.compile inplace=True takes the out-of-place custom op: same values and gradients, q and k keep
    theirs (documented: use the returned tensors)."""
    q0, k0 = _leaves(torch.float32, True)
    cos, sin = _tables()
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"

    def loss(q0, k0, inplace):
        q, k = _graph_inputs(q0, k0, True)
        qo, ko = rope(q, k, cos, sin, inplace=inplace)
        return qo.square().sum() + (ko * 3).sum(), q

    out, q = torch.compile(lambda a, b: loss(a, b, True), backend=backend, fullgraph=True)(q0, k0)
    got = torch.autograd.grad(out, (q0, k0))
    assert torch.equal(q, q0.detach().transpose(1, 2))  # not rotated
    want = torch.autograd.grad(loss(q0, k0, False)[0], (q0, k0))
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


# ------------------------------------------------------------------------------------------ the plan cache
def test_checks_still_run_for_a_signature_seen_with_other_devices():
    q, k = make_qk(1, 2, 1, 3, 8, torch.float32, False)
    cos, sin = _tables(1, 3, 8)
    rope(q, k, cos, sin)
    with pytest.raises(ValueError, match=r"^cos\b"):
        rope(q, k, torch.ones(1, 3, 8, device="meta"), sin)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="CPU tensors: the interpreter's case")
@pytest.mark.parametrize("how", ["env", "_common.interpret_mode"])
def test_cpu_tensors_are_refused_again_once_the_interpreter_is_off(monkeypatch, how):
    """A checked plan for CPU tensors does not outlive the interpreter: by the environment variable, or by
    _common.interpret_mode itself (what tests/test_patch.py replaces, and check_tensor reads)."""
    from hearth.kernels import _common

    q, k = make_qk(1, 2, 1, 3, 8, torch.float32, False)
    cos, sin = _tables(1, 3, 8)
    rope(q, k, cos, sin)  # a checked plan for this signature
    if how == "env":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    else:
        monkeypatch.setattr(_common, "interpret_mode", lambda: False)
    with pytest.raises(ValueError, match=r"^q must be a CUDA tensor"):
        rope(q, k, cos, sin)


def test_the_plan_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(rope_mod, "_PLANS", {})
    monkeypatch.setattr(rope_mod, "_PLAN_CAP", 2)
    for t in (1, 2, 3, 4):
        q, k = make_qk(1, 2, 1, t, 8, torch.float32, False)
        rope(q, k, *tables(1, t, 8, torch.float32))
        assert len(rope_mod._PLANS) <= 2


# ------------------------------------------------------------------------------------------------------ GPU
@gpu_only
@pytest.mark.xdist_group("gpu_big")
def test_no_q_or_k_sized_allocation_forward_or_backward():
    """Qwen-like GQA in the HF layout: the in-place forward + backward allocates nothing of q's or k's size (the
    out-of-place op allocates both outputs, then both gradients)."""
    torch.manual_seed(8)
    b, t, hq, hk, d = 1, 4096, 32, 8, 128
    q0 = torch.randn(b, t, hq, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k0 = torch.randn(b, hk, t, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    cos, sin = tables(1, t, d, torch.bfloat16)
    k_bytes = k0.numel() * k0.element_size()

    def peak(inplace):
        qn = q0.detach().clone().requires_grad_()
        kn = k0.detach().clone().requires_grad_()
        q, k = qn.transpose(1, 2) * 1, kn * 1  # non-leaves (in place refuses leaves), made before the measurement
        # the gradients an attention backward would hand on: fresh tensors in q's and k's layouts that only
        # autograd holds (a caller-held dy is never written over: test_a_gradient_someone_else_holds_...)
        boxes = [[torch.empty_like(q).normal_()], [torch.empty_like(k).normal_()]]
        ignored = [torch.empty_like(q), torch.empty_like(k)]  # _Hand's own incoming gradients, made up front
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        outs = [_Hand.apply(o, box) for o, box in zip(rope(q, k, cos, sin, inplace=inplace), boxes)]
        torch.autograd.grad(outs, (q, k), ignored)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start

    for inplace in (True, False):  # first calls: compiles and warp picks (whose scratch is once per layout)
        peak(inplace)
    assert peak(True) < k_bytes  # less than the smaller of the two tensors
    assert peak(False) >= 2 * k_bytes  # the measurement does see the out-of-place op's outputs
