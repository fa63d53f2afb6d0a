"""Thin nn.Modules over hearth.kernels: parameters and arguments only, no math of their own.

    RMSNorm(hidden_size, eps=1e-6)                  -> kernels.rms_norm
    LayerNorm(hidden_size, eps=1e-5, bias=True)     -> kernels.layer_norm
    SwiGLUMLP(hidden_size, intermediate_size, bias=False)
                                                    -> kernels.swiglu.swiglu_mlp (one autograd node), or
                                                       kernels.lora.lora_swiglu_mlp under peft LoRA
    CrossEntropyLoss(...)                           -> kernels.cross_entropy
    LinearCrossEntropyLoss(...)                     -> kernels.linear_cross_entropy

Parameter names follow Hugging Face (weight / bias; gate_proj, up_proj, down_proj), so a
Hugging Face state dict loads into these modules unchanged.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from hearth.kernels.layer_norm import layer_norm
from hearth.kernels.lora import lora_parts, lora_swiglu_mlp
from hearth.kernels.rms_norm import rms_norm
from hearth.kernels.swiglu import swiglu, swiglu_mlp


class RMSNorm(nn.Module):
    """RMSNorm over the last dim; `weight` [hidden_size] starts at ones."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class LayerNorm(nn.Module):
    """LayerNorm over the last dim; `weight` starts at ones, `bias` (if any) at zeros."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True, *, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(hidden_size, device=device, dtype=dtype)) if bias else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


class SwiGLUMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), the Llama / Qwen MLP.

    With plain nn.Linear projections the whole MLP is ONE autograd node (kernels.swiglu_mlp): only
    x, g and u are saved and h = silu(g) * u is recomputed in the backward (LESSON 9).
    recompute_up=True saves only x and g (u is recomputed in the backward: one more matmul), for
    when memory matters more than ~10% of the MLP's time.

    When all three projections are peft LoRA Linears in a plain state (one active adapter, not merged, not
    disabled, no dropout in effect, no DoRA, a frozen plain nn.Linear or bitsandbytes 4-bit base:
    kernels.lora.lora_parts, checked at every call), the MLP is ONE LoRA-aware node
    (kernels.lora.lora_swiglu_mlp): it saves x, g, u and the rank-r products, not h and not peft's fp32 copies
    of the projection inputs; a 4-bit base is dequantised where it is used, never saved.

    Otherwise, when a projection is not a plain nn.Linear (e.g. a merged or disabled LoRA layer, dropout in
    training, an 8-bit base, or a 4-bit one without LoRA), the modules are called as they are, so their own forward (LoRA branches, dropout,
    scaling) runs unchanged, and only the elementwise silu(g) * u goes through the fused swiglu
    kernel. That path saves what the wrappers save (LoRA keeps h for its A matrix) and so holds
    more memory than the fused node.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, *, recompute_up: bool = False,
                 device=None, dtype=None):
        super().__init__()
        self.recompute_up = recompute_up
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def _fusable(self) -> bool:
        # Exact type: a subclass (or a peft LoRA wrapper, which is not an nn.Linear) may change forward.
        return all(type(m) is nn.Linear for m in (self.gate_proj, self.up_proj, self.down_proj))

    lora_compute = "adapter"  # or "base": see kernels.lora.lora_parts (hearth.patch.apply(lora_compute=...) sets it)

    def _lora_parts(self, x: torch.Tensor):
        parts = [lora_parts(m, x, self.lora_compute) for m in (self.gate_proj, self.up_proj, self.down_proj)]
        if any(p is None for p in parts) or len({p[2].dtype for p in parts}) != 1:
            return None
        return parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fusable():
            g, u, d = self.gate_proj, self.up_proj, self.down_proj
            return swiglu_mlp(x, g.weight, u.weight, d.weight, g.bias, u.bias, d.bias, recompute_up=self.recompute_up)
        lora = self._lora_parts(x)
        if lora is not None:
            (wg, bg, ag, bbg, sg, _), (wu, bu, au, bbu, su, _), (wd, bd, ad, bbd, sd, _) = lora
            return lora_swiglu_mlp(x, wg, wu, wd, ag, bbg, au, bbu, ad, bbd, sg, su, sd, bg, bu, bd,
                                   recompute_up=self.recompute_up, compute=self.lora_compute)
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def _op(name: str):
    # Imported when first called, so hearth.nn imports even before that op module exists.
    return getattr(importlib.import_module(f"hearth.kernels.{name}"), name)


class CrossEntropyLoss(nn.Module):
    """Like nn.CrossEntropyLoss (input [N, V] logits, target [N] int64) over kernels.cross_entropy."""

    def __init__(self, *, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                 z_loss: float = 0.0, softcap: float | None = None):
        super().__init__()
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction
        self.z_loss, self.softcap = z_loss, softcap

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _op("cross_entropy")(
            input, target, ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
            reduction=self.reduction, z_loss=self.z_loss, softcap=self.softcap,
        )


class LinearCrossEntropyLoss(nn.Module):
    """Cross-entropy of (input @ linear_weight.T + linear_bias) without materialising the logits,
    over kernels.linear_cross_entropy. forward(input [N, H], linear_weight [V, H], target [N])."""

    def __init__(self, *, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                 z_loss: float = 0.0, softcap: float | None = None):
        super().__init__()
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction
        self.z_loss, self.softcap = z_loss, softcap

    def forward(self, input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                linear_bias: torch.Tensor | None = None) -> torch.Tensor:
        return _op("linear_cross_entropy")(
            input, linear_weight, target, linear_bias=linear_bias, ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing, reduction=self.reduction, z_loss=self.z_loss, softcap=self.softcap,
        )
