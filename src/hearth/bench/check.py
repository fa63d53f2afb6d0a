"""Correctness before timing: a provider's outputs (and gradients in bwd / full) against fp32.

Error measure: ||out - ref||_2 / ||ref||_2 over each output and each gradient, in fp32
(METHOD: fp32 arithmetic lands far under 1e-3, tf32 near 3e-4, bf16 operands 1e-3..1e-2).
Any NaN or inf where the reference is finite fails. One tolerance per dtype, in one table.
"""

from __future__ import annotations

import math

# max relative L2 error against the fp32 reference, per dtype name
TOLERANCE = {"float32": 1e-3, "bfloat16": 2e-2, "float16": 5e-3}


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def rel_err(actual, expected) -> float:
    """||a - e|| / ||e|| in fp32 (inf when `actual` has a non-finite value `expected` lacks)."""
    import torch

    a = actual.detach().float()
    e = expected.detach().float().to(a.device)
    if tuple(a.shape) != tuple(e.shape):
        return math.inf
    if not torch.isfinite(a).all() and torch.isfinite(e).all():
        return math.inf
    denom = torch.linalg.vector_norm(e).item()
    num = torch.linalg.vector_norm(a - e).item()
    return num / denom if denom > 0 else num


def compare(outputs, grads, ref_outputs, ref_grads, dtype_name: str) -> tuple[bool, float, str]:
    """(ok, worst relative error, what failed or '') for a provider against the reference.

    outputs / ref_outputs: tensors or tuples; grads / ref_grads: lists aligned by leaf (a
    provider's missing gradient, None, fails)."""
    tol = TOLERANCE[dtype_name]
    worst, bad = 0.0, []
    outs, refs = as_tuple(outputs), as_tuple(ref_outputs)
    if len(outs) != len(refs):
        return False, math.inf, f"{len(outs)} outputs, reference has {len(refs)}"
    if len(grads) != len(ref_grads):  # zip would skip the reference's extra gradients: never checked, yet ranked
        return False, math.inf, f"{len(grads)} gradients, reference has {len(ref_grads)}"
    pairs = [(f"output{i}", o, r) for i, (o, r) in enumerate(zip(outs, refs))]
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        if r is None:
            continue
        if g is None:
            bad.append(f"grad{i} missing")
            worst = math.inf
            continue
        pairs.append((f"grad{i}", g, r))
    for name, a, r in pairs:
        err = rel_err(a, r)
        worst = max(worst, err)
        if not err <= tol:  # NaN fails too
            bad.append(f"{name} rel err {err:.3g} > {tol:g}")
    return not bad, worst, "; ".join(bad)
