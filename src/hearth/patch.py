"""apply(model) -> PatchReport: swap a Hugging Face causal LM's RMSNorm, rotary application, SwiGLU MLP
and loss for hearth's kernels, chosen by module type from ONE table (RULES), not one function per family.

    report = apply(model)               # Qwen3, Llama, Mistral, Qwen2... (same structure), before or after peft
    report.print()                      # rich table: what was replaced (counts per kind), what was left and why

What each rule does (a rule matches a module by its class name; its builder checks the structure and may
refuse with a reason, which the report lists):

    norm  r"RMSNorm$"       module swapped for hearth.nn.RMSNorm sharing the SAME weight Parameter
    mlp   r"(MLP|FeedForward)$" with gate_proj/up_proj/down_proj and a SiLU activation: swapped for
                            hearth.nn.SwiGLUMLP holding the SAME child modules. With plain nn.Linear children
                            the MLP is one fused autograd node; when peft has wrapped the projections (LoRA)
                            and they are in a plain state over a plain nn.Linear or a bitsandbytes 4-bit base
                            (QLoRA), it is one LoRA-aware node (kernels.lora.lora_swiglu_mlp, 4-bit weights
                            dequantised where used, never saved); otherwise the wrapped modules are called as
                            modules (their LoRA branches run) and only silu(g) * u is fused (hearth.nn.SwiGLUMLP
                            decides at each call).
    rope  r"Attention$"     the module-level `apply_rotary_pos_emb` of the attention class's modeling file is
                            replaced by one that calls hearth.kernels.rope for q/k [B, H, T, D] with cos/sin
                            [B, T, D] (and falls back to the original for any other call, e.g. partial rotary).
                            This is process-wide for that modeling file (every model of the family), as the
                            function is a module global.
    loss  r"ForCausalLM$"   the model instance's forward is wrapped: when labels are given, the decoder runs,
                            and the causal LM loss is hearth.kernels.linear_cross_entropy(final hidden states,
                            lm_head.weight, labels shifted by one) -- the [tokens, vocab] logits never exist,
                            and the output has logits=None. Without labels (or with a MoE router loss asked
                            for: output_router_logits; on in the config, the loss is left) the original runs.
                            Left when the model holds parameters outside the decoder and lm_head (a transform
                            between them, as RoBERTa-style heads' dense + LayerNorm, that the fused loss skips),
                            and when the class forward does not compute its loss through transformers'
                            ForCausalLMLoss (Bart-style decoders' unshifted labels, a user's loss_function).
    lora  r"^Linear(4bit|8bitLt)?$" (peft's LoRA Linear only: it has base_layer and lora_A) with a plain
                            nn.Linear base or a bitsandbytes 4-bit one (Linear4bit, NF4 / FP4, double-quantised
                            or not: QLoRA; dequantised per use, never kept for the backward), and no DoRA; an
                            8-bit (Linear8bitLt) or other base is left, with the reason in the report. The
                            INSTANCE's forward is replaced by one that calls hearth.kernels.lora_linear
                            (frozen base + LoRA in one autograd node, no fp32 copy of the input saved) while the
                            layer is in a plain state (kernels.lora.lora_parts, checked at every call: one active
                            adapter, not merged, not disabled, no dropout in effect), else peft's own forward.
                            Run apply AFTER get_peft_model for this kind (before it there are no LoRA Linears);
                            parameters, state-dict names, merge / unmerge / disable_adapter are peft's, unchanged.
                            Its probe runs with a random lora_B when the adapter's is all zeros (peft's init),
                            so that the LoRA term is checked, and puts the real one back.
    attention r"Attention$" BY DEVICE (attention=None, the default): switched in where hearth's fused attention
                            backward serves the module (kernels.attention.fused_backward_serves: Hopper,
                            bf16/fp16, head_dim 64 or 128), where the H200 measured it level with SDPA's
                            cuDNN backend in the dense LoRA step (1.01x at seq 4096, 0.994x at 16384) and 12x
                            faster than SDPA's masked path on packed rows; left on SDPA elsewhere, silently (the
                            Triton backward that serves other GPUs and head dims is slower than SDPA's).
                            attention=True switches it in wherever hearth's kernels run, False never. Switched
                            in, the module's config takes the "hearth" attention
                            implementation, registered with transformers' AttentionInterface: causal/full
                            attention without a mask goes to hearth.kernels.attention, anything else (a padding
                            mask, sliding window, dropout, a position_bias) to transformers' own SDPA function; an
                            attention whose math SDPA lacks (Gemma2's softcap, gpt-oss's sinks, Inkling's per-token
                            sink_proj) is left as loaded, with every attention sharing its config (MiMo's full layers
                            with its sliding ones); sinks that reach the function anyway raise (never dropped).
                            Packed rows (several sequences in one row, hearth.train.batches.collate(pack=True)):
                            a call with transformers' varlen kwargs (cu_seq_lens_q/k, max_length_q/k) and no
                            mask goes to hearth.kernels.attention_varlen on [B*T, H, D] views (no copy at B=1);
                            a forward pre-hook on the decoder (the module holding the layers) marks such a
                            forward, so that the "hearth" mask function returns None for its full-attention
                            mask instead of building the [T, T] block-diagonal one; with packed position_ids and
                            no varlen kwargs (batch 1), the hook derives the offsets from the position ids
                            once per forward (one host sync) and passes them on. A packed call the kernel does
                            not serve (dropout, softcap, sliding window) runs SDPA with the block-diagonal mask
                            built from the offsets. If a mask was skipped but no attention call received the
                            offsets (a family whose decoder does not pass its kwargs on), the forward raises.

Before a norm / MLP / rope replacement is kept it is PROBED (once per class, with the module's own weights, on
a fixed-seed random input, so the verdict is deterministic): the original runs in its own dtype and again in
fp32 (its parameters upcast through torch.func.functional_call: the high-precision reference), the replacement
in the module's dtype, and the replacement's max error against that reference must be at most 2x the
original's own error plus a small floor -- the rule hearth's kernel tests use. Comparing two bf16 results with
a per-element tolerance was wrong: a sum of 17,408 bf16 products differs by more than any fixed bound between
two correct implementations, and the verdict flipped with the random input. A look-alike with different math
(Gemma's RMSNorm scales by 1 + weight) still fails the rule and is left alone and reported, never silently
changed. Modules on the meta device are not probed (reported).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

IGNORE_INDEX = -100
KINDS = ("norm", "rope", "mlp", "loss", "lora", "attention")
# The probe's rule: err(hearth) <= _PROBE_FACTOR * err(original) + floor * max(1, max |reference|), errors
# measured against the original module run in fp32 (fp64 when it already is fp32).
_PROBE_FACTOR = 2.0
_PROBE_FLOOR = {torch.float32: 1e-5, torch.bfloat16: 1e-3, torch.float16: 1e-4}
# config attributes that scale the logits before the loss: the fused loss would not apply them.
_LOGIT_SCALES = ("logit_scale", "logits_scaling", "output_multiplier_scale", "lm_head_multiplier")
# config attributes of terms the fused loss does not compute when set: a z-loss (Bamba), logit softcaps under other
# names than final_logit_softcapping (RecurrentGemma, on by default; xLSTM)
_LOSS_TERMS = ("z_loss_coefficient", "logits_soft_cap", "output_logit_soft_cap")


class Leave(Exception):
    """A rule matched a module but must not replace it; str(self) is the reason shown in the report. quiet: the
    leave is expected and not reported (the default's own choice, or a wrapper whose inner module is patched)."""

    def __init__(self, reason: str, *, quiet: bool = False):
        super().__init__(reason)
        self.quiet = quiet


@dataclass
class PatchReport:
    """replaced: kind -> {class name: count}; left: (kind, class name, reason, count) rows."""

    replaced: dict[str, dict[str, int]] = field(default_factory=lambda: {k: {} for k in KINDS})
    left: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def add(self, kind: str, cls: str) -> None:
        self.replaced[kind][cls] = self.replaced[kind].get(cls, 0) + 1

    def leave(self, kind: str, cls: str, reason: str) -> None:
        self.left[(kind, cls, reason)] = self.left.get((kind, cls, reason), 0) + 1

    def count(self, kind: str) -> int:
        return sum(self.replaced[kind].values())

    def as_dict(self) -> dict:
        return {"replaced": {k: dict(v) for k, v in self.replaced.items()},
                "left": [{"kind": k, "class": c, "reason": r, "count": n} for (k, c, r), n in self.left.items()]}

    def print(self, console=None) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="hearth patch")
        for col in ("kind", "class", "result", "count"):
            table.add_column(col)
        for kind in KINDS:
            for cls, n in self.replaced[kind].items():
                table.add_row(kind, cls, "[green]replaced[/green]", str(n))
        for (kind, cls, reason), n in self.left.items():
            table.add_row(kind, cls, f"[yellow]left:[/yellow] {reason}", str(n))
        (console or Console()).print(table)

    def __str__(self) -> str:
        done = ", ".join(f"{k}={self.count(k)}" for k in KINDS)
        left = "; ".join(f"{k} {c} x{n}: {r}" for (k, c, r), n in self.left.items())
        return f"replaced {done}" + (f"; left {left}" if left else "")


# --------------------------------------------------------------------------------------------- probes
def _param_of(module: nn.Module) -> torch.Tensor | None:
    return next(module.parameters(), None)


def _compute_like(module: nn.Module) -> torch.Tensor | None:
    """An empty tensor in the dtype and on the device `module` computes in, for making probe inputs: a quantised
    Linear's compute_dtype (bitsandbytes keeps 4-bit weights packed in uint8, which is no dtype to compute in;
    and under peft the first floating parameter of a 4-bit model is an fp32 LoRA factor, not what the base
    computes in), else its first floating parameter. None when it has neither."""
    for m in module.modules():
        dtype, w = getattr(m, "compute_dtype", None), m._parameters.get("weight")
        if (isinstance(dtype, torch.dtype) and dtype.is_floating_point and isinstance(w, torch.Tensor)
                and getattr(w, "quant_state", None) is not None):
            return torch.empty(0, dtype=dtype, device=w.device)
    for p in module.parameters():
        if p.is_floating_point():
            return p.new_empty(0)
    return None


def _dequantized_twin(module: nn.Module) -> nn.Module:
    """module itself, or (when it holds bitsandbytes 4-bit Linears) a copy whose quantised Linears are plain
    nn.Linears holding the dequantised weights: the reference a 4-bit base is judged against (the packed
    weights cannot be upcast, and bitsandbytes casts its input down to its compute dtype)."""
    # the modules that OWN a 4-bit weight Parameter: a peft LoRA layer around one only shows it through its
    # `weight` property, and replacing that layer would drop its LoRA branch from the reference
    quantised = [n for n, m in module.named_modules()
                 if getattr(m._parameters.get("weight"), "quant_state", None) is not None]
    if not quantised:
        return module
    import copy

    from bitsandbytes.functional import dequantize_4bit

    twin = copy.deepcopy(module)
    for name in quantised:
        q = twin.get_submodule(name)
        plain = nn.Linear(q.in_features, q.out_features, bias=q.bias is not None, device="meta")
        plain.weight = nn.Parameter(dequantize_4bit(q.weight.data, q.weight.quant_state), requires_grad=False)
        if q.bias is not None:
            plain.bias = nn.Parameter(q.bias.detach(), requires_grad=False)
        parent, _, child = name.rpartition(".")
        setattr(twin.get_submodule(parent) if parent else twin, child, plain)
    return twin


def _high_precision(fn: Callable, inputs: tuple) -> Callable:
    """fn run with its module's floating parameters and buffers, and the inputs, upcast (fp32; fp64 for fp32)."""
    def wide(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            return t
        return t.to(torch.float64 if t.dtype == torch.float32 else torch.float32)

    if isinstance(fn, nn.Module):
        fn = _dequantized_twin(fn)
        state = {n: wide(t) for n, t in list(fn.named_parameters()) + list(fn.named_buffers())}
        return lambda: torch.func.functional_call(fn, state, tuple(wide(x) for x in inputs))
    return lambda: fn(*(wide(x) for x in inputs))


def _probe(kind: str, original: Callable, replacement: Callable, *inputs: torch.Tensor) -> None:
    """Leave(...) unless replacement(*inputs) has original's dtype and shape and meets the rule against the
    original run in higher precision: max err(replacement) <= 2 x max err(original) + floor."""
    with torch.no_grad():
        try:
            want = original(*inputs)
        except Exception as exc:  # the original cannot run on this input: nothing to compare against
            raise Leave(f"{kind} probe: the original raised {type(exc).__name__}: {exc}") from exc
        try:
            got = replacement(*inputs)
        except Exception as exc:  # e.g. no GPU and no TRITON_INTERPRET: leave the module, say why
            raise Leave(f"{kind} probe: hearth's kernel raised {type(exc).__name__}: {exc}") from exc
        ref = _high_precision(original, inputs)()
    want, got, ref = ((t if isinstance(t, tuple) else (t,)) for t in (want, got, ref))
    for w, g, r in zip(want, got, ref):
        if w.dtype != g.dtype or w.shape != g.shape:
            raise Leave(f"{kind} probe: output {g.dtype}{tuple(g.shape)} differs from {w.dtype}{tuple(w.shape)}")
        r = r.double()
        err_hearth = (g.double() - r).abs().max().item()
        err_orig = (w.double() - r).abs().max().item()
        limit = _PROBE_FACTOR * err_orig + _PROBE_FLOOR.get(w.dtype, 1e-3) * max(1.0, r.abs().max().item())
        if not err_hearth <= limit:  # NaN fails too
            raise Leave(f"{kind} probe: error {err_hearth:.3g} against the fp32 reference exceeds 2x the original's "
                        f"({err_orig:.3g}); different math")


def _randn(shape, like: torch.Tensor) -> torch.Tensor:
    # A private generator: probing must not move the global RNG that training relies on.
    gen = torch.Generator(device=like.device).manual_seed(0)
    return torch.randn(shape, generator=gen, device=like.device, dtype=torch.float32).to(like.dtype)


def _probe_input(shape, module: nn.Module) -> torch.Tensor:
    like = _compute_like(module)
    if like is None:
        raise Leave("no floating parameter or compute dtype to probe in")
    return _randn(shape, like)


# ------------------------------------------------------------------------------------------- builders
def _rms_norm(module: nn.Module, state: dict) -> nn.Module:
    from hearth.nn import RMSNorm

    weight = getattr(module, "weight", None)
    eps = next((getattr(module, a) for a in ("variance_epsilon", "eps") if isinstance(getattr(module, a, None), float)), None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or eps is None:
        raise Leave("no 1-D weight Parameter and float eps / variance_epsilon")
    new = RMSNorm(weight.shape[0], eps, device="meta")
    new.weight = weight  # the same Parameter: optimizer state, tying and checkpoints keep working
    _probe_once(state, "norm", module, new, lambda: (_randn((3, weight.shape[0]), weight),))
    return new


def _silu_act(module: nn.Module) -> bool:
    act = getattr(module, "act_fn", None) or getattr(module, "act", None)
    if isinstance(act, nn.SiLU):
        return True
    hidden_act = getattr(getattr(module, "config", None), "hidden_act", None)
    return hidden_act in ("silu", "swish") or type(act).__name__ in ("SiLUActivation", "SiLU")


def _swiglu_mlp(module: nn.Module, state: dict) -> nn.Module:
    from hearth.nn import SwiGLUMLP

    projs = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if any(p is None for p in projs):
        raise Leave("no gate_proj / up_proj / down_proj")
    if not _silu_act(module):
        raise Leave("activation is not SiLU")
    base = [getattr(p, "base_layer", p) for p in projs]  # peft keeps the nn.Linear as base_layer
    if not all(isinstance(b, nn.Linear) for b in base):
        raise Leave("projections are not (LoRA-wrapped) nn.Linear")
    new = SwiGLUMLP(base[0].in_features, base[0].out_features, device="meta")
    new.lora_compute = state["lora_compute"]
    new.gate_proj, new.up_proj, new.down_proj = projs  # the same modules (LoRA wrappers included)
    from hearth.kernels.lora import is_bnb_4bit_linear

    # a 4-bit base: an input that requires grad keeps bitsandbytes from repacking the weights in place for CPU
    # inference (an eval-mode no-grad forward does on AVX512-BF16 CPUs), a layout dequantize_4bit does not read
    grad = any(is_bnb_4bit_linear(b) for b in base)
    _probe_once(state, "mlp", module, new,
                lambda: (_probe_input((3, base[0].in_features), module).requires_grad_(grad),))
    if grad:  # the report says which MLPs compute on a 4-bit base, and whether the LoRA node takes them now
        fused = all(_is_peft_lora_linear(p) for p in projs) and new._lora_parts(None) is not None
        state["label"] = " [4-bit base, LoRA node]" if fused else " [4-bit base]"
    return new


def _probe_once(state: dict, kind: str, old: nn.Module, new: nn.Module, make_inputs: Callable) -> None:
    key = (kind, type(old))
    if key not in state["probed"]:
        p = _param_of(old)
        if p is None or p.device.type == "meta":
            state["probed"][key] = "not probed (meta device)"
        else:
            try:
                _probe(kind, old, new, *make_inputs())
                state["probed"][key] = None
            except Leave as why:
                state["probed"][key] = str(why)
    if state["probed"][key] and not state["probed"][key].startswith("not probed"):
        raise Leave(state["probed"][key])


def _hearth_rope_for(original: Callable) -> Callable:
    from hearth.kernels.rope import rope

    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[0] if args else 1)
        if (unsqueeze_dim == 1 and len(args) <= 1 and set(kwargs) <= {"unsqueeze_dim"} and q.dim() == 4
                and k.dim() == 4 and cos.dim() == 3 and cos.shape == sin.shape and cos.shape[-1] == q.shape[-1]
                and q.dtype == k.dtype):
            return rope(q, k, cos, sin)
        return original(q, k, cos, sin, *args, **kwargs)  # partial rotary, other layouts: unchanged

    apply_rotary_pos_emb.__hearth_original__ = original
    return apply_rotary_pos_emb


def _rope(module: nn.Module, state: dict) -> None:
    mod = sys.modules.get(type(module).__module__)
    original = getattr(mod, "apply_rotary_pos_emb", None)
    if original is None:
        raise Leave(f"{type(module).__module__} has no apply_rotary_pos_emb")
    if getattr(original, "__hearth_original__", None) is not None:
        return None  # already patched (another layer, or an earlier apply)
    if mod.__name__ not in state["rope_checked"]:
        replacement = _hearth_rope_for(original)
        head_dim = getattr(module, "head_dim", None) or 16
        like = _compute_like(module)
        if like is None or like.device.type == "meta":
            like = torch.empty(0)
        angles = _randn((1, 5, head_dim // 2), torch.empty(0, device=like.device)).float()
        emb = torch.cat((angles, angles), dim=-1)
        try:
            _probe("rope", original, replacement, _randn((1, 2, 5, head_dim), like), _randn((1, 1, 5, head_dim), like),
                   emb.cos().to(like.dtype), emb.sin().to(like.dtype))
        except Leave as why:
            state["rope_checked"][mod.__name__] = str(why)
        else:
            state["rope_checked"][mod.__name__] = None
            mod.apply_rotary_pos_emb = replacement
            return None
    if state["rope_checked"][mod.__name__]:
        raise Leave(state["rope_checked"][mod.__name__])
    return None


HEARTH_ATTENTION = "hearth"
# transformers' FlashAttention kwargs for a packed (padding-free) row, as a collator passes them to the model's
# forward (hearth.train.batches.collate(pack=True) does): they reach every attention call through **kwargs
VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@dataclass
class _PackedForward:
    """One decoder forward of a packed row (set by the decoder's pre-hook, read by the "hearth" mask function).
    width: tokens per row, the q / kv length of the mask that is skipped; skipped / served: how many masks the
    mask function skipped and how many attention calls took the packed kwargs (checked when the forward ends)."""

    width: int
    skipped: int = 0
    served: int = 0


_PACKED: contextvars.ContextVar[_PackedForward | None] = contextvars.ContextVar("hearth_packed_forward", default=None)


def _varlen_kwargs(kwargs: dict):
    """(cu_q, cu_k, max_q, max_k) when every FlashAttention varlen kwarg is present, else None."""
    values = [kwargs.get(k) for k in VARLEN_KEYS]
    return None if any(v is None for v in values) else values


def _tokens_major(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] -> [B * T, H, D]: a view for B == 1 (any strides; attention_varlen takes them), else a reshape."""
    x = x.transpose(1, 2)
    return x[0] if x.shape[0] == 1 else x.reshape(-1, x.shape[2], x.shape[3])


def _block_diagonal_mask(cu_q: torch.Tensor, cu_k: torch.Tensor, batch: int, tq: int, tk: int,
                         causal: bool) -> torch.Tensor:
    """The boolean [B, 1, Tq, Tk] mask of a packed call (True: attend), built from the offsets on the device (no
    host sync): a query sees the keys of its own sequence only, causally aligned at the sequence's start. Only
    the fallback (a packed call the varlen kernel does not serve: dropout, softcap...) builds it."""
    cu_q, cu_k = cu_q.long(), cu_k.long()
    iq = torch.arange(batch * tq, device=cu_q.device)
    ik = torch.arange(batch * tk, device=cu_k.device)
    sq = torch.searchsorted(cu_q[1:], iq, right=True)  # the sequence of each packed row
    sk = torch.searchsorted(cu_k[1:], ik, right=True)
    mask = sq.view(batch, tq, 1) == sk.view(batch, 1, tk)
    if causal:
        rq, rk = iq - cu_q[sq], ik - cu_k[sk]  # positions within the sequence
        mask &= rq.view(batch, tq, 1) >= rk.view(batch, 1, tk)
    return mask.unsqueeze(1)


# the attention-interface kwargs transformers' families pass their sinks in (gpt-oss & co: s_aux; Inkling: sinks)
SINK_KWARGS = ("s_aux", "sinks")


def hearth_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                             **kwargs):
    """transformers attention-interface function: q [B, Hq, T, D], k/v [B, Hk, T, D] -> ([B, T, Hq, D], None).

    No mask: hearth.kernels.attention. No mask and the varlen kwargs (cu_seq_lens_q/k, max_length_q/k: a packed
    row): hearth.kernels.attention_varlen on [B * T, H, D] views (no copy at B = 1). Anything else (a mask,
    dropout, sliding window, a position_bias, an unsupported head dim): transformers' SDPA function -- for a packed call
    with the block-diagonal mask built from the offsets, so no token ever attends across a sequence boundary."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from hearth.kernels.attention import attention, padded_head_dim

    for arg in SINK_KWARGS:  # neither the kernels nor SDPA (which ignores them) compute these: never drop them
        if kwargs.get(arg) is not None:
            raise ValueError(f"{arg}: attention sinks reached hearth's attention function, which cannot compute them "
                             f"({type(module).__name__}); patch this model with attention=False")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and query.shape[2] > 1)
    plain = (not dropout and kwargs.get("sliding_window") is None and kwargs.get("softcap") is None
             and kwargs.get("position_bias") is None  # an additive score bias (Inkling): SDPA adds it, the kernels not
             and padded_head_dim(query.shape[-1]) is not None and query.shape[1] % key.shape[1] == 0)
    packed = _varlen_kwargs(kwargs) if attention_mask is None else None
    if packed is not None:
        from hearth.kernels.attention_varlen import attention_varlen

        state = _PACKED.get()
        if state is not None:
            state.served += 1
        cu_q, cu_k = (t if t.dtype == torch.int32 else t.to(torch.int32) for t in packed[:2])
        max_q, max_k = packed[2:]
        batch, heads, tq, dim = query.shape
        if plain and (not causal or tq == key.shape[2]):
            out = attention_varlen(_tokens_major(query), _tokens_major(key), _tokens_major(value), cu_q, cu_k,
                                   int(max_q), int(max_k), causal=causal, scale=scaling)
            return out.view(batch, tq, heads, dim), None
        attention_mask = _block_diagonal_mask(cu_q, cu_k, batch, tq, key.shape[2], causal)
        is_causal = False
    elif attention_mask is None and plain and (not causal or query.shape[2] == key.shape[2]):
        return attention(query, key, value, causal=causal, scale=scaling).transpose(1, 2), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def hearth_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                          attention_mask=None, local_size=None, *, use_vmap: bool = False, **kwargs):
    """The "hearth" mask function (transformers' AttentionMaskInterface; sdpa_mask's signature): SDPA's (None,
    is_causal, when nothing is padded), except in a packed forward that carries the varlen kwargs (the decoder's
    pre-hook marks it): its causal full-attention mask -- block-diagonal, [T, T] per row -- is not built at all
    (None), as that forward's attention calls take the offsets instead. Sliding-window, bidirectional, padded
    and custom (vmap) masks are built as SDPA's."""
    from transformers.masking_utils import sdpa_mask

    state = _PACKED.get()
    if (state is not None and attention_mask is None and not use_vmap and local_size is None
            and "allow_is_bidirectional_skip" not in kwargs and q_length == kv_length == state.width
            and isinstance(q_offset, int) and q_offset == 0 and isinstance(kv_offset, int) and kv_offset == 0):
        state.skipped += 1
        return None
    if mask_function is not None:
        kwargs["mask_function"] = mask_function
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, local_size=local_size, use_vmap=use_vmap,
                     **kwargs)


def _packed_offsets(position_ids: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(cu_seqlens int32 on position_ids' device, longest sequence) of a packed [1, T] row, split where the
    position ids do not step by +1 (transformers' own rule for its packed mask); None for one sequence.
    One device->host copy (a sync) of the sequence starts, once per forward."""
    pos = position_ids.reshape(-1)
    starts = ((pos[1:] != pos[:-1] + 1).nonzero().flatten() + 1).tolist()
    if not starts:
        return None
    bounds = [0, *starts, pos.numel()]
    return (torch.tensor(bounds, dtype=torch.int32, device=pos.device),
            max(b - a for a, b in zip(bounds, bounds[1:])))


def _packed_pre_hook(module: nn.Module, args: tuple, kwargs: dict):
    """forward pre-hook of a decoder whose attention is "hearth": in a packed forward (no attention mask, no KV
    cache) it normalises the varlen kwargs (int32 offsets, int lengths) or, without them, derives them from packed
    position ids of a single row, and marks the forward so that the mask function skips its [T, T] mask."""
    inputs = kwargs.get("input_ids", args[0] if args else None)
    if inputs is None:
        inputs = kwargs.get("inputs_embeds")
    position_ids = kwargs.get("position_ids")
    use_cache = kwargs.get("use_cache")
    if use_cache is None:  # the model's forward takes the config's default
        use_cache = getattr(getattr(module, "config", None), "use_cache", False)
    if (len(args) > 1 or inputs is None or inputs.dim() < 2 or kwargs.get("attention_mask") is not None
            or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None or use_cache
            or torch.compiler.is_compiling()):
        module._hearth_packed_tokens.append(None)
        return None  # padded, generating, positional arguments, traced: transformers builds its mask as ever
    batch, width = inputs.shape[0], inputs.shape[1]
    given = _varlen_kwargs(kwargs)
    if given is None:
        if any(kwargs.get(k) is not None for k in VARLEN_KEYS):
            missing = [k for k in VARLEN_KEYS if kwargs.get(k) is None]
            raise ValueError(f"{', '.join(missing)}: the packed-row kwargs go together ({', '.join(VARLEN_KEYS)})")
        derived = None
        if (batch == 1 and width > 1 and isinstance(position_ids, torch.Tensor)
                and tuple(position_ids.shape) == (1, width)):
            derived = _packed_offsets(position_ids)
        if derived is None:  # one sequence (the dense kernel, no mask), or not a row we derive offsets for
            module._hearth_packed_tokens.append(None)
            return None
        cu, longest = derived
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    else:
        for k in ("cu_seq_lens_q", "cu_seq_lens_k"):
            if kwargs[k].dtype != torch.int32:
                kwargs[k] = kwargs[k].to(torch.int32)
        for k in ("max_length_q", "max_length_k"):
            kwargs[k] = int(kwargs[k])
    module._hearth_packed_tokens.append(_PACKED.set(_PackedForward(width)))
    return args, kwargs


def _packed_post_hook(module: nn.Module, args: tuple, kwargs: dict, output):
    token = module._hearth_packed_tokens.pop() if module._hearth_packed_tokens else None
    if token is None:
        return None
    state = _PACKED.get()
    _PACKED.reset(token)
    if output is not None and state is not None and state.skipped and not state.served:
        raise RuntimeError(f"{type(module).__name__}: the packed row's mask was skipped but no attention call received "
                           f"the varlen kwargs ({', '.join(VARLEN_KEYS)}); this model family does not pass the "
                           "forward's kwargs to its attention function. Patch without attention=True.")
    return None


def _hook_decoders(model: nn.Module) -> None:
    """The packed-forward hooks on each decoder (a module holding the layers: a ModuleList child and a config) whose
    attention implementation is hearth's; once per module."""
    for m in model.modules():
        config = getattr(m, "config", None)
        if (getattr(config, "_attn_implementation", None) != HEARTH_ATTENTION or getattr(m, "_hearth_packed_tokens", None)
                is not None or not any(isinstance(c, nn.ModuleList) for c in m.children())):
            continue
        m._hearth_packed_tokens = []
        m.register_forward_pre_hook(_packed_pre_hook, with_kwargs=True)
        m.register_forward_hook(_packed_post_hook, with_kwargs=True, always_call=True)


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(HEARTH_ATTENTION, hearth_attention_forward)
    AttentionMaskInterface.register(HEARTH_ATTENTION, hearth_attention_mask)


def _attention_math_beyond_sdpa(module: nn.Module, config) -> str | None:
    """What this attention module computes that scaled-dot-product attention does not, or None: a softcap
    (config.attn_logit_softcapping: Gemma2, T5Gemma, VaultGemma), sinks held as a tensor (module.sinks: gpt-oss,
    MiMo's sliding layers, DeepSeek-V4, ...) or computed per token by a child module (Inkling's sink_proj)."""
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return f"attention softcap (config.attn_logit_softcapping={config.attn_logit_softcapping})"
    if isinstance(getattr(module, "sinks", None), torch.Tensor):
        return f"attention sinks ({type(module).__name__}.sinks)"
    for name, _ in module.named_children():
        if name.startswith("sink"):
            return f"attention sinks ({type(module).__name__}.{name})"
    return None


def _attention_left_by_config(named: dict[str, nn.Module]) -> dict[int, str]:
    """config id -> why every attention module reading that config is left: the implementation is the config's, so
    one layer whose math SDPA lacks (MiMo's sliding layers have sinks, its full layers none) decides for all of
    them; switching the others would switch it too."""
    out: dict[int, str] = {}
    for module in named.values():
        config = getattr(module, "config", None)
        if config is not None and id(config) not in out and _ATTENTION_CLASS.search(type(module).__name__):
            why = _attention_math_beyond_sdpa(module, config)
            if why is not None:
                out[id(config)] = why
    return out


def _attention(module: nn.Module, state: dict) -> None:
    # the compute dtype / device, looked up only where it is used: the by-device choice, and the first module's probe
    p = (_compute_like(module) if state["attention"] is None or "attention" not in state["attention_checked"]
         else None)
    if state["attention"] is None:  # by device: only where the fused backward serves (not reported otherwise)
        from hearth.kernels.attention import fused_backward_serves

        head_dim = getattr(module, "head_dim", None)
        if (p is None or p.device.type == "meta" or not isinstance(head_dim, int)
                or not fused_backward_serves(p.device, p.dtype, head_dim)):
            raise Leave("attention=None keeps SDPA off Hopper / bf16-fp16 / head_dim 64-128", quiet=True)
    config = getattr(module, "config", None)
    if config is None:  # e.g. torch's nn.MultiheadAttention: no attention implementation to switch
        raise Leave("no config whose attention implementation could be switched")
    current = getattr(config, "_attn_implementation", None)
    if current == HEARTH_ATTENTION:
        return None
    if current not in ("sdpa", "eager", None):
        raise Leave(f"attention implementation {current!r} is kept (only sdpa / eager are switched)")
    beyond = state["beyond_sdpa"].get(id(config))
    if beyond is not None:
        # Gemma2's attention softcap, gpt-oss's sinks: hearth's kernels cannot do that math, and SDPA, the "hearth"
        # function's fallback, raises on it or silently drops it. Decided by the config and the modules reading it
        # (_attention_left_by_config), not by the implementation the model was loaded with: transformers versions
        # differ on whether such a family loads on eager or on SDPA (where it is already wrong, and stays the user's
        # choice)
        raise Leave(f"{beyond}, which neither hearth's attention nor SDPA computes; kept on {current or 'eager'}")
    from hearth.kernels.attention import padded_head_dim

    if padded_head_dim(getattr(module, "head_dim", None)) is None:
        raise Leave(f"head_dim {getattr(module, 'head_dim', None)} is not one hearth's attention supports")
    _register_attention()
    if "attention" not in state["attention_checked"]:
        state["attention_checked"]["attention"] = None
        if p is not None and p.device.type != "meta":
            groups = getattr(module, "num_key_value_groups", 1)
            hk, d = 1, module.head_dim
            q, k, v = _randn((1, hk * groups, 7, d), p), _randn((1, hk, 7, d), p) * 0.5, _randn((1, hk, 7, d), p) * 2
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            def ref(q, k, v):
                return sdpa_attention_forward(module, q, k, v, None, scaling=d ** -0.5, is_causal=True)[0]

            def new(q, k, v):
                return hearth_attention_forward(module, q, k, v, None, scaling=d ** -0.5, is_causal=True)[0]

            try:
                _probe("attention", ref, new, q, k, v)
            except Leave as why:
                state["attention_checked"]["attention"] = str(why)
    if state["attention_checked"]["attention"]:
        raise Leave(state["attention_checked"]["attention"])
    config._attn_implementation = HEARTH_ATTENTION
    return None


def _kernels_can_run_on(t: torch.Tensor | None) -> str | None:
    """None when hearth's kernels can run on t's device, else the reason (for the report)."""
    from hearth.kernels._common import interpret_mode

    if t is None or t.device.type in ("cuda", "meta") or (t.device.type == "cpu" and interpret_mode()):
        return None
    return (f"hearth's kernels need a CUDA GPU; the model is on {t.device.type} (on a CPU, set TRITON_INTERPRET=1 "
            f"to run them in Triton's interpreter, slowly, or train without the patch)")


def _loss(model: nn.Module, state: dict) -> None:
    if hasattr(model, "get_base_model"):
        raise Leave("peft wrapper: its inner causal LM is patched instead", quiet=True)
    if getattr(model, "_hearth_loss", False):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # the loss is the one replacement with no probe (it needs labels): check the device instead, so that
    # a model on the CPU without the interpreter is left alone rather than dying at step 0
    why = _kernels_can_run_on(getattr(head, "weight", None))
    if why:
        raise Leave(why)
    decoder = getattr(model, getattr(model, "base_model_prefix", "") or "model", None)
    if type(head) is not nn.Linear:
        raise Leave(f"lm_head is {type(head).__name__}, not a plain nn.Linear (e.g. LoRA on lm_head)")
    if not isinstance(decoder, nn.Module):
        raise Leave("no decoder at base_model_prefix")
    # the fused loss is CE(decoder output @ head.weight): a parameter outside both is a transform it would skip
    # (RoBERTa / BERT-style decoders: lm_head.dense + layer_norm before the Linear get_output_embeddings returns)
    own = {id(p) for p in decoder.parameters()} | {id(p) for p in head.parameters()}
    extra = [n for n, p in model.named_parameters() if id(p) not in own]
    if extra:
        raise Leave(f"parameters outside the decoder and the output Linear ({', '.join(extra[:3])}"
                    f"{', ...' if len(extra) > 3 else ''}): the logits are not lm_head(decoder output)")
    why = _not_causal_lm_loss(model)
    if why:
        raise Leave(why)
    config = getattr(model, "config", None)
    for name in _LOGIT_SCALES:
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise Leave(f"config.{name} scales the logits")
    for name in _LOSS_TERMS:
        if getattr(config, name, None) not in (None, 0, 0.0):
            raise Leave(f"config.{name}: a term of the model's loss that the fused loss does not compute")
    if getattr(config, "output_router_logits", False):  # MoE (Qwen3-MoE, Mixtral...): the loss has an aux term
        raise Leave("config.output_router_logits: the loss adds the router's load-balancing loss")
    softcap = getattr(config, "final_logit_softcapping", None)
    _wrap_forward(model, decoder, head, softcap)
    return None


def _not_causal_lm_loss(model: nn.Module) -> str | None:
    """None when the model's forward computes its loss as the fused one does (transformers' causal LM loss: labels
    shifted by one), else why not: its class forward computes the loss itself (the decoders of encoder-decoder
    families -- Bart, Whisper, TrOCR... -- on UNshifted labels), or its loss_function is not ForCausalLMLoss (set
    by the user, or a loss_type of another task)."""
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        source = ""
    if "self.loss_function(" not in source:
        return (f"{type(model).__name__}.forward computes its loss itself, not through transformers' loss_function "
                "(e.g. on unshifted labels)")
    from transformers.loss.loss_utils import ForCausalLMLoss

    fn = getattr(model, "loss_function", None)
    if fn is not ForCausalLMLoss:
        return f"model.loss_function is {getattr(fn, '__name__', fn)!s}, not transformers' ForCausalLMLoss"
    return None


def _wrap_forward(model: nn.Module, decoder: nn.Module, head: nn.Linear, softcap: float | None) -> None:
    model.forward = _HearthLossForward(model, decoder, head, softcap)
    model._hearth_loss = True


class _HearthLossForward:
    """The instance forward that the "loss" kind installs: with labels, the decoder and the fused linear cross
    entropy (no logits); without, the model's own forward. A plain object holding its model (not a closure), so
    that a patched model deep-copies and pickles with its copy (as _HearthLoraForward)."""

    def __init__(self, model: nn.Module, decoder: nn.Module, head: nn.Linear, softcap: float | None):
        self.model, self.decoder, self.head, self.softcap = model, decoder, head, softcap
        self.original = model.__dict__.get("forward")  # an instance forward installed before ours, else None

    @property
    def __wrapped__(self):  # inspect.signature(model.forward) (transformers' Trainer reads it) sees the original's
        return self.original if self.original is not None else type(self.model).forward.__get__(self.model)

    def __call__(self, *args, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        from hearth.kernels.linear_cross_entropy import linear_cross_entropy

        original = self.__wrapped__
        signature = inspect.signature(original)
        var_kw = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
        bound = signature.bind_partial(*args, **kwargs).arguments
        call = {k: v for k, v in bound.items() if k != var_kw}
        call.update(bound.get(var_kw, {}) if var_kw else {})
        labels, shift_labels = call.pop("labels", None), call.pop("shift_labels", None)
        if (labels is None and shift_labels is None) or call.get("output_router_logits"):
            return original(*args, **kwargs)  # no labels, or a MoE router loss to add: the model's own forward
        num_items = call.pop("num_items_in_batch", None)
        return_dict = call.pop("return_dict", None)
        call.pop("logits_to_keep", None)
        head = self.head
        out = self.decoder(**call)
        hidden = out[0]  # last_hidden_state [B, T, H]
        if shift_labels is None:
            # position t predicts token t + 1; the last position has no target
            shift_labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        loss = linear_cross_entropy(
            hidden.reshape(-1, hidden.shape[-1]), head.weight, shift_labels.reshape(-1).to(hidden.device),
            linear_bias=head.bias, ignore_index=IGNORE_INDEX, softcap=self.softcap,
            reduction="mean" if num_items is None else "sum",
        )
        if num_items is not None:  # the HF trainer's token-count normalisation across accumulation steps
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
        result = CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=getattr(out, "hidden_states", None),
                                        attentions=getattr(out, "attentions", None))
        return result.to_tuple() if return_dict is False else result


def _is_peft_lora_linear(module: nn.Module) -> bool:
    return type(module).__module__.startswith("peft.") and hasattr(module, "base_layer") and hasattr(module, "lora_A")


class _HearthLoraForward:
    """The instance forward that the "lora" kind installs: hearth's fused node while the layer is plain, else
    the class's (peft's) forward. A plain object holding its layer (not a bound function), so that a patched
    layer deep-copies and pickles with its copy."""

    def __init__(self, layer: nn.Module, compute: str = "adapter"):
        self.layer = layer
        self.compute = compute  # kernels.lora.lora_parts(compute=...): "adapter" (peft's numbers) or "base"

    def __call__(self, x, *args, **kwargs):
        from hearth.kernels.lora import lora_linear, lora_parts

        layer = self.layer
        parts = None if args or kwargs or not isinstance(x, torch.Tensor) else lora_parts(layer, x, self.compute)
        if parts is None:
            return type(layer).forward(layer, x, *args, **kwargs)  # peft's own (merged, disabled, dropout...)
        return lora_linear(x, *parts)


def _lora(module: nn.Module, state: dict) -> None:
    from hearth.kernels.lora import base_compute_dtype, is_bnb_4bit_linear, lora_linear, lora_parts

    compute = state["lora_compute"]
    if getattr(module, "_hearth_lora", False):
        module.forward.compute = compute  # an earlier apply: only the compute choice may change
        return None
    base = module.base_layer
    if base_compute_dtype(base) is None:
        if is_bnb_4bit_linear(base):
            raise Leave(f"4-bit base layer {type(base).__name__} whose quant state the node does not read "
                        "(not nf4 / fp4 of a 2-D weight, or in bitsandbytes' CPU inference packing)")
        raise Leave(f"base layer is {type(base).__name__}, not a plain nn.Linear or a bitsandbytes 4-bit Linear "
                    f"(e.g. 8-bit Linear8bitLt)")
    if any(getattr(module, "use_dora", {}).values()) or getattr(module, "lora_variant", None):
        raise Leave("a LoRA variant (DoRA, ...) is kept on peft's forward")
    if getattr(module, "fan_in_fan_out", False):
        raise Leave("fan_in_fan_out weights")
    key = ("lora", type(module), type(base))  # a 4-bit base is probed apart from a 16-bit one
    if key not in state["probed"]:
        if base.weight.device.type == "meta":
            state["probed"][key] = "not probed (meta device)"
        else:
            state["probed"][key] = _probe_lora(module, lora_linear, lora_parts, compute)
    if state["probed"][key] and not state["probed"][key].startswith("not probed"):
        raise Leave(state["probed"][key])
    module.forward = _HearthLoraForward(module, compute)
    module._hearth_lora = True
    if is_bnb_4bit_linear(base):
        state["label"] = " [4-bit base]"
    return None


def _probe_lora(module: nn.Module, lora_linear: Callable, lora_parts: Callable, compute: str) -> str | None:
    """None when lora_linear on the module's weights passes the probe rule against peft's own forward, else why.
    A layer that is not plain right now (dropout in training mode, merged...) is probed as if it were: in eval
    mode, with its adapter's own factors; an all-zero lora_B (peft's init) is replaced by a random one for the
    probe and put back, so that the LoRA term is part of what is checked."""
    was_training = module.training
    module.eval()
    try:
        parts = lora_parts(module)
        if parts is None:
            if module.merged or module.disable_adapters:
                return "not probed (adapters merged or disabled at patch time)"
            return "LoRA layer is not plain (a trainable base, several active adapters, a LoRA bias...); kept on peft's forward"
        _weight, _bias, lora_a, lora_b, _scale, _compute = parts
        saved = None
        with torch.no_grad():
            if not lora_b.any():
                saved = lora_b.detach().clone()
                gen = torch.Generator(device=lora_b.device).manual_seed(1)
                lora_b.copy_(torch.randn(lora_b.shape, generator=gen, device=lora_b.device) * 0.1)
        try:
            from hearth.kernels.lora import base_compute_dtype

            base = module.base_layer
            like = torch.empty(0, dtype=base_compute_dtype(base), device=base.weight.device)
            # requires_grad: a 4-bit base in eval mode would otherwise repack its weight in place for CPU
            # inference (bitsandbytes does on AVX512-BF16 CPUs), which dequantize_4bit does not read
            x = _randn((3, base.in_features), like).requires_grad_()
            _probe("lora", module, lambda t: lora_linear(t, *lora_parts(module, compute=compute)), x)
        except Leave as why:
            return str(why)
        finally:
            if saved is not None:
                with torch.no_grad():
                    lora_b.copy_(saved)
        return None
    finally:
        module.train(was_training)


# ------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern
    build: Callable[[nn.Module, dict], nn.Module | None]  # a module to swap in, None (patched in place) or Leave
    applies: Callable[[nn.Module], bool] | None = None  # narrows a class-name match (e.g. peft's "Linear")


_ATTENTION_CLASS = re.compile(r"Attention$")
RULES: tuple[Rule, ...] = (
    Rule("norm", re.compile(r"RMSNorm$"), _rms_norm),
    Rule("mlp", re.compile(r"(MLP|FeedForward)$"), _swiglu_mlp),
    Rule("rope", re.compile(r"Attention$"), _rope),
    Rule("loss", re.compile(r"ForCausalLM$"), _loss),
    # peft's LoRA Linear ("Linear"; "Linear4bit" / "Linear8bitLt" around bitsandbytes bases of a quantised model)
    Rule("lora", re.compile(r"^Linear(4bit|8bitLt)?$"), _lora, applies=_is_peft_lora_linear),
    Rule("attention", _ATTENTION_CLASS, _attention),
)
# Class names that look like a candidate but match no rule are reported as left (nothing is guessed).
_LOOKS_LIKE = {"norm": re.compile(r"Norm"), "mlp": re.compile(r"MLP|FeedForward"),
               "rope": re.compile(r"Attention$"), "loss": re.compile(r"(LMHead|CausalLM)")}


def apply(model: nn.Module, *, norm: bool = True, rope: bool = True, mlp: bool = True, loss: bool = True,
          lora: bool = True, attention: bool | None = None, lora_compute: str = "adapter") -> PatchReport:
    """Patch `model` (a transformers causal LM, optionally wrapped by peft) in place; returns the report.

    Call it before or after peft's get_peft_model; the replacements keep the same parameters and child
    modules, so state dicts, LoRA targets and optimizer state are unaffected. Calling it twice is a no-op.
    The "lora" kind (fused LoRA projections) needs the LoRA layers to exist: call apply AFTER get_peft_model
    (the MLP's fused LoRA node is chosen at each call, so it works in either order).
    lora_compute: "adapter" (default) runs the fused LoRA nodes' low-rank math in the adapter weights' dtype
    (fp32 under peft's defaults: peft's own numbers); "base" runs it in the base dtype on the tensor cores
    (fp32 accumulation; faster, its LoRA products and gradients rounded to bf16 once each).
    attention: None (default) switches hearth's attention in where its fused backward serves the module's device,
    dtype and head_dim (see the module docstring), True wherever hearth's kernels run, False never.
    Raises TypeError when model is not an nn.Module or attention is not a bool or None, ValueError for an unknown
    lora_compute.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    from hearth.kernels.lora import check_compute

    check_compute(lora_compute, "lora_compute")
    if attention is not None and not isinstance(attention, bool):
        raise TypeError(f"attention must be True, False or None (by device), got {attention!r}")
    enabled = {"norm": norm, "rope": rope, "mlp": mlp, "loss": loss, "lora": lora, "attention": attention is not False}
    report, state = PatchReport(), {"probed": {}, "rope_checked": {}, "attention_checked": {},
                                    "lora_compute": lora_compute, "attention": attention}
    swaps: list[tuple[nn.Module, str, nn.Module]] = []
    named = dict(model.named_modules())
    state["beyond_sdpa"] = _attention_left_by_config(named) if enabled["attention"] else {}
    for name, module in named.items():
        cls = type(module).__name__
        if type(module).__module__.startswith("hearth."):
            if hasattr(type(module), "lora_compute"):  # an MLP an earlier apply swapped in (e.g. before peft)
                module.lora_compute = lora_compute
            continue  # already hearth's
        rules = [r for r in RULES if r.pattern.search(cls) and (r.applies is None or r.applies(module))]
        if not rules:
            kind = next((k for k, rx in _LOOKS_LIKE.items() if rx.search(cls)), None)
            if kind is not None and not cls.startswith("Peft") and cls not in ("LoraModel",):
                report.leave(kind, cls, "no hearth rule for this class")
            continue
        for rule in rules:  # e.g. an attention class: its rope, and (by device) its attention function
            if not enabled[rule.kind]:
                if rule.kind != "attention":  # attention=False: not asking for it is not news
                    report.leave(rule.kind, cls, "disabled by the caller")
                continue
            state.pop("label", None)
            try:
                new = rule.build(module, state)
            except Leave as why:
                if not why.quiet:
                    report.leave(rule.kind, cls, str(why))
                continue
            report.add(rule.kind, cls + state.pop("label", ""))  # e.g. "Linear4bit [4-bit base]"
            if new is not None:
                parent_name, _, child = name.rpartition(".")
                swaps.append((named[parent_name] if name else None, child, new))
    for parent, child, new in swaps:
        if parent is None:
            raise ValueError("model: the top-level module itself cannot be swapped; pass its parent")
        setattr(parent, child, new)
    if report.count("attention"):
        _hook_decoders(model)  # packed rows: the varlen kernel, and no [T, T] mask
    for (kind, cls, *_), why in state["probed"].items():
        if why and why.startswith("not probed"):
            report.leave(kind, cls.__name__, why + ": replaced without a numerics check")
    return report
