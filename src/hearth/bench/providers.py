"""Who runs each op: hearth, torch eager, torch.compile, Liger-Kernel, quack and vendor libraries.

bind(op, provider, inputs, size, ...) -> Bound(fn, leaves): fn() runs the op once on the case's
inputs and returns its output(s); leaves are the tensors whose .grad the backward fills (in the
spec's grad order), so the harness can check them against the reference and reset them.
A provider that cannot run a case raises Unavailable (not installed / not importable),
Refuses (a documented limit, with the reason) or Skipped (not applicable, or not run here).

Baselines run in the case's dtype: no .float() upcast (LESSON 7: an upcast baseline pays for an
fp32 copy that the kernel never makes, and inflates the speed-up).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

VENDOR = ("cublas", "sdpa_flash", "sdpa_cudnn", "torch_lce", "flash_attn")
PROVIDERS = ("hearth", "eager", "compile", "liger", "quack") + VENDOR
FUSED_PEERS = ("compile", "liger", "quack") + VENDOR  # the peers a verdict compares against
QUACK_OPS = ("softmax", "cross_entropy", "rms_norm")  # the quack-kernels ops with an autograd function
LIGER_SOFTMAX_MAX_N = 65536  # Liger refuses rows longer than its largest Triton block


class Unavailable(Exception):
    """The provider's code is not installed or does not import."""


class Refuses(Exception):
    """The provider declines this case by design (reason in the message)."""


class Skipped(Exception):
    """Not applicable to this op, or not run in this mode (reason in the message)."""


@dataclass
class Bound:
    fn: Callable[[], object]
    leaves: list
    impl: str | None = None  # which of a provider's libraries ran, where it tries several (flash_attn: its module)


def expand(names: list[str] | None) -> list[str]:
    """Provider names from the CLI: 'vendor' stands for every vendor library; unknown -> ValueError."""
    if not names:
        return list(PROVIDERS)
    out: list[str] = []
    for n in names:
        for part in n.split(","):
            part = part.strip()
            if not part:
                continue
            if part == "vendor":
                out += [v for v in VENDOR if v not in out]
            elif part in PROVIDERS:
                if part not in out:
                    out.append(part)
            else:
                raise ValueError(f"providers: unknown provider {part!r}; choose from {PROVIDERS + ('vendor',)}")
    return out


# ----------------------------------------------------------------------------- torch eager (native dtype)
def _rope_eager(q, k, cos, sin):
    from hearth.bench.cases import rotate_half

    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def _eager_table():
    import torch
    import torch.nn.functional as F

    return {
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "cross_entropy": lambda input, target: F.cross_entropy(input, target),
        "linear_cross_entropy": lambda input, linear_weight, target: F.cross_entropy(F.linear(input, linear_weight), target),
        "rms_norm": lambda x, weight: F.rms_norm(x, (x.shape[-1],), weight, 1e-6),
        "layer_norm": lambda x, weight, bias: F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5),
        "rope": _rope_eager,
        "swiglu": lambda gate, up: F.silu(gate) * up,
        "swiglu_mlp": lambda x, w_gate, w_up, w_down: F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down),
        "attention": lambda q, k, v, causal: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1]),
    }


def _tensor_bound(fn, inputs, grad_names, kwargs):
    return Bound(lambda: fn(**inputs, **kwargs), [inputs[n] for n in grad_names])


# ----------------------------------------------------------------------------- hearth
def _hearth_fn(op: str):
    try:
        module = importlib.import_module(f"hearth.kernels.{op}")
        return getattr(module, op)
    except Exception as e:  # a kernel being written may fail to import for any reason: report it
        raise Unavailable(f"hearth.kernels.{op} does not import: {type(e).__name__}: {e}") from None


def _mlp_module_bound(module, inputs, rg):
    """Copy the case's weights into an MLP module whose parameters are named like
    gate/up/down (hearth.nn.SwiGLUMLP, LigerSwiGLUMLP), so every provider sees one function."""
    import torch

    params = dict(module.named_parameters())
    picked = []
    for key in ("gate", "up", "down"):
        w = inputs[f"w_{key}"]
        found = [p for n, p in params.items() if key in n.split(".")[0] and tuple(p.shape) == tuple(w.shape)]
        if len(found) != 1:
            raise RuntimeError(f"cannot map w_{key} {tuple(w.shape)} onto the module's parameters {[(n, tuple(p.shape)) for n, p in params.items()]}")
        picked.append(found[0])
    with torch.no_grad():
        for p, key in zip(picked, ("gate", "up", "down")):
            p.data = inputs[f"w_{key}"].detach().clone()
            p.requires_grad_(rg)
    x = inputs["x"]
    return Bound(lambda: module(x), [x] + picked)


INPLACE_ROPE = ("hearth", "liger")  # the providers of rope_inplace (cases.py)


def _inplace_rope_bound(rope, inputs, rg) -> Bound:
    """rope_inplace: `rope(q, k, cos, sin)` writes over q and k, which PyTorch (and hearth) refuse for a leaf that
    requires grad or a view of one; a model's q and k are a projection's outputs. So the call gets non-leaf copies
    of the case's q and k, made once here (outside the timed call and its memory), whose backward hands the
    gradient on to the leaves unchanged (a clone's). Each timed call rotates the same copies again: rotations keep
    norms, so the values stay in range; the check runs on the first call."""
    import torch

    q, k = inputs["q"], inputs["k"]
    with torch.set_grad_enabled(rg):
        qn, kn = q.clone(), k.clone()  # same strides: clone keeps a dense layout (the HF transpose)
    cos, sin = inputs["cos"], inputs["sin"]
    return Bound(lambda: rope(qn, kn, cos, sin), [q, k])


def _hearth(op, inputs, spec, size, rg, check):
    if op == "rope_inplace":
        rope = _hearth_fn("rope")
        return _inplace_rope_bound(lambda q, k, cos, sin: rope(q, k, cos, sin, inplace=True), inputs, rg)
    if op == "swiglu_mlp":
        try:
            from hearth.nn import SwiGLUMLP
        except Exception as e:
            raise Unavailable(f"hearth.nn.SwiGLUMLP does not import: {type(e).__name__}: {e}") from None
        with inputs["x"].device:  # initialise on the device: a 14336-wide MLP takes seconds on the host
            module = SwiGLUMLP(size["H"], size["I"]).to(dtype=inputs["x"].dtype)
        return _mlp_module_bound(module, inputs, rg)
    return _tensor_bound(_hearth_fn(op), inputs, spec.grad_names(size), spec.call_kwargs(size))


# ----------------------------------------------------------------------------- torch eager / compile
def _varlen_sdpa(inputs, spec, size):
    """attention_varlen in plain PyTorch: SDPA over the packed axis as one batch, with a block-diagonal
    (causal within each block) boolean mask built once here from cu_seqlens, outside the timed call;
    K/V heads are repeated for GQA inside it (SDPA's masked kernels take equal head counts)."""
    import torch
    import torch.nn.functional as F

    q, k, cu_q, cu_k = inputs["q"], inputs["k"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"]

    def segments(cu, n):
        rows = torch.arange(n, dtype=cu.dtype, device=cu.device)
        seg = torch.searchsorted(cu, rows, right=True) - 1
        return seg, rows - cu[seg]

    seg_q, pos_q = segments(cu_q, q.shape[0])
    seg_k, pos_k = segments(cu_k, k.shape[0])
    keep = seg_q[:, None] == seg_k[None, :]
    if size["causal"]:
        keep &= pos_q[:, None] >= pos_k[None, :]

    def fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        heads = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # [1, H, T, D]
        return F.scaled_dot_product_attention(*heads, attn_mask=keep)[0].transpose(0, 1)

    return _tensor_bound(fn, inputs, spec.grad_names(size), spec.call_kwargs(size))


def _no_inplace_rope(op, who):
    if op == "rope_inplace":
        raise Skipped(f"rope_inplace compares the in-place ropes ({', '.join(INPLACE_ROPE)}); {who}'s rope is in the "
                      "rope rows")


def _eager(op, inputs, spec, size, rg, check):
    _no_inplace_rope(op, "eager")
    table = _eager_table()
    if op == "matmul":
        raise Skipped("torch.matmul is the cuBLAS (vendor) row")
    if op == "attention_varlen":
        return _varlen_sdpa(inputs, spec, size)
    return _tensor_bound(table[op], inputs, spec.grad_names(size), spec.call_kwargs(size))


def _compile(op, inputs, spec, size, rg, check):
    _no_inplace_rope(op, "torch.compile")
    if check:
        raise Skipped("torch.compile on the CPU takes tens of seconds per graph: not run under --check")
    if op in ("matmul", "attention", "attention_varlen"):
        raise Skipped("torch.compile lowers this to the same cuBLAS / SDPA call as the vendor rows")
    import torch

    # A fresh start per case: dynamo caches graphs per code object and falls back to eager
    # silently after its recompile limit, which a sweep over many shapes would reach.
    torch._dynamo.reset()
    # dynamic=False: one graph specialised to this shape, compiled during the correctness check
    # (the first call), which runs before timing starts.
    fn = torch.compile(_eager_table()[op], dynamic=False)
    return _tensor_bound(fn, inputs, spec.grad_names(size), spec.call_kwargs(size))


# ----------------------------------------------------------------------------- Liger-Kernel
def _liger(op, inputs, spec, size, rg, check):
    if op in ("matmul", "attention", "attention_varlen"):
        raise Skipped(f"Liger-Kernel has no {op} op")
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is None:
        raise Unavailable("liger_kernel is not installed")
    if op == "softmax" and size["N"] > LIGER_SOFTMAX_MAX_N:
        raise Refuses(f"Liger softmax refuses n = {size['N']} > {LIGER_SOFTMAX_MAX_N} (its largest Triton block size)")
    try:
        lf = importlib.import_module("liger_kernel.transformers.functional")
    except Exception as e:
        raise Unavailable(f"liger_kernel does not import: {type(e).__name__}: {e}") from None
    if op == "swiglu_mlp":
        from types import SimpleNamespace

        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

        cfg = SimpleNamespace(hidden_size=size["H"], intermediate_size=size["I"], hidden_act="silu")
        with inputs["x"].device:
            module = LigerSwiGLUMLP(cfg).to(dtype=inputs["x"].dtype)
        bound = _mlp_module_bound(module, inputs, rg)
        if check:
            bound.fn = _interpreter_guard(bound.fn, "Liger")
        return bound
    if op == "rope_inplace":
        fn = lf.liger_rope
        return _inplace_rope_bound(_interpreter_guard(fn, "Liger") if check else fn, inputs, rg)
    table = {
        "softmax": lambda x: lf.liger_softmax(x),
        "cross_entropy": lambda input, target: lf.liger_cross_entropy(input, target),
        "linear_cross_entropy": lambda input, linear_weight, target: lf.liger_fused_linear_cross_entropy(input, linear_weight, target),
        # Liger's defaults as its model patches use them (casting_mode llama, in_place backward)
        "rms_norm": lambda x, weight: lf.liger_rms_norm(x, weight, 1e-6),
        "layer_norm": lambda x, weight, bias: lf.liger_layer_norm(x, weight, bias, 1e-5),
        "rope": lambda q, k, cos, sin: lf.liger_rope(q, k, cos, sin),
        "swiglu": lambda gate, up: lf.liger_swiglu(gate, up),
    }
    fn = table[op]
    if check:
        fn = _interpreter_guard(fn, "Liger")
    return _tensor_bound(fn, inputs, spec.grad_names(size), spec.call_kwargs(size))


def _interpreter_guard(fn, who):
    """Under --check, a peer whose kernels the Triton CPU interpreter cannot execute is shown
    as skipped with the interpreter's complaint, not as a failure of that peer."""
    def guarded(*args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as e:
            if type(e).__name__ != "InterpreterError":
                raise
            raise Skipped(f"{who}'s kernel does not run under the Triton CPU interpreter: {str(e)[:160]}") from None
    return guarded


# ----------------------------------------------------------------------------- quack (CuTe-DSL kernels)
def _quack(op, inputs, spec, size, rg, check):
    """quack-kernels (Dao-AILab's CuTe-DSL kernels) where it imports: softmax, cross entropy
    (its default out-of-place backward: a new gradient buffer) and RMSNorm. Needs CUDA, an
    SM90+ GPU and nvidia-cutlass-dsl; elsewhere the row says unavailable."""
    if op not in QUACK_OPS:
        raise Skipped(f"quack has no autograd {op} here (only {', '.join(QUACK_OPS)})")
    first = next(iter(inputs.values()))
    if first.device.type != "cuda":
        raise Unavailable("quack's CuTe-DSL kernels need CUDA")
    try:
        quack = importlib.import_module("quack")
    except Exception as e:  # not installed, or nvidia-cutlass-dsl missing / off the path
        raise Unavailable(f"quack does not import: {type(e).__name__}: {str(e)[:200]}") from None
    table = {
        "softmax": lambda x: quack.softmax(x),
        "cross_entropy": lambda input, target: quack.cross_entropy(input, target, reduction="mean"),
        "rms_norm": lambda x, weight: quack.rmsnorm(x, weight, eps=1e-6),
    }
    return _tensor_bound(table[op], inputs, spec.grad_names(size), spec.call_kwargs(size))


# ----------------------------------------------------------------------------- vendor libraries
def _vendor(name):
    def bind(op, inputs, spec, size, rg, check):
        import torch
        import torch.nn.functional as F

        if name == "cublas":
            if op != "matmul":
                raise Skipped("cuBLAS row is for matmul only")
            if inputs["a"].device.type != "cuda":
                raise Skipped("cuBLAS needs CUDA (torch.matmul on the CPU is not cuBLAS)")
            return _tensor_bound(lambda a, b: torch.matmul(a, b), inputs, spec.grad_names(size), {})
        if name == "sdpa_flash" and op == "attention_varlen":
            return _torch_varlen(inputs, spec, size)
        if name in ("sdpa_flash", "sdpa_cudnn"):
            if op != "attention":
                raise Skipped("SDPA rows are for attention only (sdpa_flash: attention_varlen too)")
            from torch.nn.attention import SDPBackend, sdpa_kernel

            if name == "sdpa_cudnn" and inputs["q"].device.type != "cuda":
                raise Unavailable("the cuDNN SDPA backend needs CUDA")
            backend = SDPBackend.FLASH_ATTENTION if name == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION
            eager = _eager_table()["attention"]

            def fn(q, k, v, causal):
                with sdpa_kernel(backend):
                    return eager(q, k, v, causal)

            return _tensor_bound(fn, inputs, spec.grad_names(size), spec.call_kwargs(size))
        if name == "flash_attn":
            return (_flash_attn_varlen if op == "attention_varlen" else _flash_attn_dense)(op, inputs, spec, size)
        if name == "torch_lce":
            if op != "linear_cross_entropy":
                raise Skipped("torch's fused linear cross entropy is for linear_cross_entropy only")
            if not hasattr(F, "linear_cross_entropy"):
                raise Unavailable(f"torch {torch.__version__} has no F.linear_cross_entropy")
            return _tensor_bound(lambda input, linear_weight, target: F.linear_cross_entropy(input, linear_weight, target),
                                 inputs, spec.grad_names(size), {})
        raise AssertionError(name)

    return bind


# FlashAttention's packages, newest first: FlashAttention-4 (flash_attn.cute, CuTe DSL; its SM90 path on
# Hopper), FlashAttention-3 (flash_attn_interface, Hopper only), FlashAttention-2 (flash_attn)
FLASH_ATTN_MODULES = ("flash_attn.cute", "flash_attn_interface", "flash_attn")


def _flash_attn_function(inputs, attr: str):
    """(module name, function) of the first FlashAttention package whose `attr` imports, else Unavailable."""
    if inputs["q"].device.type != "cuda":
        raise Unavailable("flash-attn needs CUDA")
    missing = []
    for module in FLASH_ATTN_MODULES:
        try:
            return module, getattr(importlib.import_module(module), attr)
        except Exception as e:  # not installed, or its CUDA / CuTe libraries do not load
            missing.append(f"{module}: {type(e).__name__}")
    raise Unavailable(f"no flash-attn {attr} imports ({'; '.join(missing)})")


def flash_attn_bhtd(dense):
    """FlashAttention's dense function `dense` as fn(q, k, v, causal) on [B, H, T, D] tensors: its layout is
    [B, T, H, D], so q, k, v go in as transposed views (last dim still contiguous: no copy) and the output comes
    back the same way; GQA natively (k / v keep their Hk heads)."""
    def fn(q, k, v, causal):
        out = dense(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)  # FlashAttention-3/4 also return lse

    return fn


def _flash_attn_dense(op, inputs, spec, size):
    """FlashAttention's dense function on the bench's [B, H, T, D] tensors (flash_attn_bhtd)."""
    if op != "attention":
        raise Skipped("the dense flash_attn row is for attention only")
    module, dense = _flash_attn_function(inputs, "flash_attn_func")
    fn = flash_attn_bhtd(dense)
    bound = _tensor_bound(fn, inputs, spec.grad_names(size), spec.call_kwargs(size))
    bound.impl = module  # FlashAttention-4, -3 or -2: the row says which it timed
    return bound


def varlen_attn_kwargs(params, causal: bool, gqa: bool) -> dict:
    """The keywords of torch's varlen_attn (its signature's `params`) for a causal / grouped-query call."""
    kw = {"enable_gqa": True} if gqa and "enable_gqa" in params else {}
    if "window_size" in params:
        kw["window_size"] = (-1, 0) if causal else (-1, -1)
    elif "is_causal" in params:
        kw["is_causal"] = causal
    elif causal:
        raise Unavailable("this torch's varlen_attn has neither window_size nor is_causal: no causal mask")
    return kw


def _torch_varlen(inputs, spec, size):
    """PyTorch's own packed attention, torch.nn.attention.varlen.varlen_attn (its FlashAttention kernels: the
    sdpa_flash row of attention_varlen). Its keywords moved between releases: causal masking is window_size
    (-1, 0) where the function has window_size, else is_causal; grouped-query K / V go in with their own head
    count, with enable_gqa where the function has it (torch 2.11's has not, and its FlashAttention kernels took
    8 query heads on 2 K/V heads on the H200; the bench's correctness check holds every row to the reference)."""
    import inspect

    import torch

    if inputs["q"].device.type != "cuda":
        raise Unavailable("torch's varlen_attn runs FlashAttention's CUDA kernels")
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as e:
        raise Unavailable(f"torch {torch.__version__} has no torch.nn.attention.varlen: {type(e).__name__}") from None
    params = inspect.signature(varlen_attn).parameters
    gqa = inputs["q"].shape[1] != inputs["k"].shape[1]

    def fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        return varlen_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           **varlen_attn_kwargs(params, causal, gqa))

    return _tensor_bound(fn, inputs, spec.grad_names(size), spec.call_kwargs(size))


def _flash_attn_varlen(op, inputs, spec, size):
    """FlashAttention's own varlen function where one imports (FLASH_ATTN_MODULES, first found)."""
    if op != "attention_varlen":
        raise Skipped("the flash_attn varlen row is for attention_varlen only")
    module, varlen = _flash_attn_function(inputs, "flash_attn_varlen_func")

    def fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        out = varlen(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                     max_seqlen_k=max_seqlen_k, causal=causal)
        return out[0] if isinstance(out, tuple) else out  # FlashAttention-3/4 also return the lse

    bound = _tensor_bound(fn, inputs, spec.grad_names(size), spec.call_kwargs(size))
    bound.impl = module
    return bound


BINDERS = {"hearth": _hearth, "eager": _eager, "compile": _compile, "liger": _liger, "quack": _quack}
BINDERS.update({v: _vendor(v) for v in VENDOR})


def applies(op: str, provider: str) -> bool:
    """False for provider rows that can never apply to an op (a vendor library for another op);
    those are left out of the tables instead of filling them with 'skipped'."""
    only = {"cublas": "matmul", "sdpa_flash": ("attention", "attention_varlen"), "sdpa_cudnn": "attention",
            "torch_lce": "linear_cross_entropy",
            "flash_attn": ("attention", "attention_varlen")}
    if provider in only:
        return op in only[provider] if isinstance(only[provider], tuple) else only[provider] == op
    if provider == "quack":
        return op in QUACK_OPS
    if op == "rope_inplace":
        return provider in INPLACE_ROPE
    if provider == "compile" and op in ("matmul", "attention", "attention_varlen"):
        return False
    if provider == "liger" and op in ("matmul", "attention", "attention_varlen"):
        return False
    return not (provider == "eager" and op == "matmul")


def bind(op, provider, inputs, spec, size, rg, check=False, registry=None) -> Bound:
    """Bind `provider` to a case. `registry` (tests) maps provider -> binder to replace BINDERS."""
    binders = registry if registry is not None else BINDERS
    if provider not in binders:
        raise Unavailable(f"no binder for provider {provider!r}")
    return binders[provider](op, inputs, spec, size, rg, check)
