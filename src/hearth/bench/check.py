"""Correctness before timing: a provider's outputs (and gradients in bwd / full) against fp32.

Two measures per output and per gradient, both in fp32 against the fp32 reference from the same inputs:

1. whole tensor: ||out - ref||_2 / ||ref||_2 <= TOLERANCE[dtype] (METHOD: fp32 arithmetic lands far under 1e-3,
   tf32 near 3e-4, bf16 operands 1e-3..1e-2). Recorded as the row's rel_err.
2. slice by slice (since review 50): the same relative L2 error over every row along the last dim and over every
   column (each index of the last dim across all rows); a 1-D tensor, or one whose rows are shorter than MIN_ROW,
   in blocks of BLOCK consecutive elements. A slice's reference norm is taken no smaller than GUARD (one half) of
   a typical slice's (the rms slice norm of its tensor): a slice whose result is small because its terms cancel
   (causal attention's dq at a sequence's second token: 0.09 of a typical row) has a relative error 10x the
   others' in every low-precision implementation, PyTorch's SDPA included, and is held on the typical slice's
   scale instead; a slice at least GUARD / 5 of typical that is all wrong still reads >= 0.2. The worst slice of
   each kind must be within
       FACTOR x (PyTorch's own worst slice of that kind, the reference run in the case's dtype) + SLICE_TOLERANCE
   where PyTorch's own error is never taken below that of the reference rounded to the dtype (so without a
   baseline it is that rounding). FACTOR is the project's rule (hearth at most 2x PyTorch's error in the same
   dtype), 4 for bf16 / fp16 under the Triton interpreter, whose stores truncate. SLICE_TOLERANCE is twice the
   whole-tensor tolerance: the worst of many slices of an evenly spread rounding error lies within a small factor
   of the whole tensor's. The whole-tensor measure moves by only about sqrt(wrong rows / rows) for a kernel wrong
   in its last rows (a tail block, the last partial tile, a packed sequence's boundary): one zeroed row in 4096 is
   0.016, under bf16's 2e-2; its row check reads 1.0.

Any NaN or inf where the reference is finite fails. check() says which check failed, where and by how much.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

# max relative L2 error against the fp32 reference, per dtype name: of the whole tensor, and the floor of each
# slice's bound
TOLERANCE = {"float32": 1e-3, "bfloat16": 2e-2, "float16": 5e-3}
# the additive term of each slice's bound (module docstring)
SLICE_TOLERANCE = {k: 2 * v for k, v in TOLERANCE.items()}
FACTOR = 2.0  # a slice's error may be this many times PyTorch's own worst slice in the same dtype (+ SLICE_TOLERANCE)
BLOCK = 64  # 1-D tensors (and rows shorter than MIN_ROW) are checked in blocks of this many elements
MIN_ROW = 16
GUARD = 0.5  # a slice's reference norm is taken >= GUARD x the norm of a typical slice of its tensor

# the gate's procedure, written into every row's env ("check")
CHECK_METHOD = "rel L2 per tensor <= tol; per row / column / 1-D block (norm >= half typical) <= 2x torch same-dtype worst + 2 tol"


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _pair(actual, expected):
    import torch

    a = actual.detach()
    e = expected.detach().to(a.device)
    if e.dtype != torch.float32 and e.dtype != torch.float64:
        e = e.float()
    return a, e


def _nonfinite(a, e) -> bool:
    import torch

    return bool(not torch.isfinite(a).all() and torch.isfinite(e).all())


def rel_err(actual, expected) -> float:
    """||a - e|| / ||e|| in fp32 (inf when `actual` has a non-finite value `expected` lacks)."""
    import torch

    a, e = _pair(actual, expected)
    if tuple(a.shape) != tuple(e.shape):
        return math.inf
    if _nonfinite(a, e):
        return math.inf
    denom = torch.linalg.vector_norm(e.float()).item()
    num = torch.linalg.vector_norm(torch.sub(a, e).float()).item()  # a - e promotes: no fp32 copy of a first
    return num / denom if denom > 0 else num


def slice_kinds(shape) -> tuple[str, ...]:
    """The slice checks a tensor of `shape` gets: ("row", "col"), ("block",) or () for a single element."""
    n = math.prod(shape)
    if n <= 1:
        return ()
    if len(shape) >= 2 and shape[-1] >= MIN_ROW:
        return ("row", "col")
    return ("block",)


def slice_errors(actual, expected) -> dict[str, tuple[float, list[int]]]:
    """{kind: (worst relative L2 error over the slices of that kind, the worst slice's index)} (module docstring).

    row index: the position over the leading dims ([b, h, t] of a [B, H, T, D] tensor); col: [d]; block: [i] for
    elements i*BLOCK .. i*BLOCK+BLOCK-1 of the flattened tensor. Errors are inf where `actual` has a non-finite
    value `expected` lacks, or the shapes differ."""
    import torch

    a, e = _pair(actual, expected)
    kinds = slice_kinds(tuple(e.shape))
    if tuple(a.shape) != tuple(e.shape) or _nonfinite(a, e):
        return {k: (math.inf, []) for k in kinds}
    out: dict[str, tuple[float, list[int]]] = {}
    if not kinds:
        return out
    diff = torch.sub(a, e).float()  # promotes bf16 - fp32 elementwise: one fp32 temporary
    ef = e.float()
    n = ef.numel()
    total = torch.linalg.vector_norm(ef).item()

    def worst(d_norms, e_norms, per_slice: int, index_shape) -> tuple[float, list[int]]:
        typical = total * math.sqrt(per_slice / n)
        floor = GUARD * typical if typical > 0 else 1.0
        ratio = d_norms / e_norms.clamp_min(floor)
        ratio = torch.nan_to_num(ratio, nan=math.inf)
        i = int(torch.argmax(ratio.reshape(-1)).item())
        return float(ratio.reshape(-1)[i].item()), [int(x) for x in torch.unravel_index(torch.tensor(i), index_shape)]

    if kinds == ("row", "col"):
        lead = tuple(range(ef.dim() - 1))
        out["row"] = worst(torch.linalg.vector_norm(diff, dim=-1), torch.linalg.vector_norm(ef, dim=-1), ef.shape[-1],
                           tuple(ef.shape[:-1]))
        out["col"] = worst(torch.linalg.vector_norm(diff, dim=lead), torch.linalg.vector_norm(ef, dim=lead),
                           n // ef.shape[-1], (ef.shape[-1],))
    else:
        pad = (-n) % BLOCK
        d = torch.nn.functional.pad(diff.reshape(-1), (0, pad)).view(-1, BLOCK)
        r = torch.nn.functional.pad(ef.reshape(-1), (0, pad)).view(-1, BLOCK)
        out["block"] = worst(torch.linalg.vector_norm(d, dim=1), torch.linalg.vector_norm(r, dim=1), BLOCK, (d.shape[0],))
    return out


def rounding_errors(expected, dtype_name: str) -> dict[str, float]:
    """Slice errors of the reference itself rounded to the dtype (and, under the interpreter, truncated toward zero
    as its bf16 / fp16 stores are): the least error any result in that dtype can have."""
    import torch

    if dtype_name == "float32":
        return {k: 0.0 for k in slice_kinds(tuple(expected.shape))}
    dtype = getattr(torch, dtype_name)
    e = expected.detach()
    rounded = e.to(dtype)
    errs = {k: v for k, (v, _) in slice_errors(rounded, e).items()}
    if _interpreting():
        away = rounded.float().abs() > e.float().abs()
        truncated = torch.where(away, torch.nextafter(rounded, torch.zeros_like(rounded)), rounded)
        errs = {k: max(v, slice_errors(truncated, e)[k][0]) for k, v in errs.items()}
    return errs


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def factor(dtype_name: str) -> float:
    """FACTOR, doubled for bf16 / fp16 under the Triton interpreter (its stores truncate where the GPU rounds)."""
    return FACTOR * (2.0 if _interpreting() and dtype_name != "float32" else 1.0)


def _pairs(outputs, grads, ref_outputs, ref_grads) -> list[tuple[str, object, object]]:
    pairs = [(f"output{i}", o, r) for i, (o, r) in enumerate(zip(as_tuple(outputs), as_tuple(ref_outputs)))]
    pairs += [(f"grad{i}", g, r) for i, (g, r) in enumerate(zip(grads, ref_grads)) if r is not None]
    return pairs


def baseline_errors(outputs, grads, ref_outputs, ref_grads, dtype_name: str) -> dict[str, dict[str, float]]:
    """{tensor name: {kind: worst slice error}} of PyTorch's own same-dtype result (outputs, grads) against the
    reference, each never below the reference's rounding to the dtype: what check() scales its bounds by. Computed
    once per case, so the baseline's tensors can be freed before any provider runs."""
    out = {}
    for name, a, r in _pairs(outputs, grads or [], ref_outputs, ref_grads or []):
        least = rounding_errors(r, dtype_name)
        # a non-finite baseline (PyTorch's own run overflowed) says nothing about a bound: the rounding stands
        mine = {} if a is None else {k: v for k, (v, _) in slice_errors(a, r).items() if math.isfinite(v)}
        out[name] = {k: max(least[k], mine.get(k, 0.0)) for k in least}
    return out


@dataclass
class Check:
    ok: bool
    rel_err: float  # the worst whole-tensor relative error
    why: str  # what failed, '' when ok
    failed: list[dict] = field(default_factory=list)  # {"tensor", "check", "err", "bound", "over", "at"} per failure
    worst: dict | None = None  # the slice check nearest its bound (largest err / bound), failed or not


def check(outputs, grads, ref_outputs, ref_grads, dtype_name: str, baseline: dict | None = None) -> Check:
    """Both measures (module docstring) for a provider against the reference.

    outputs / ref_outputs: tensors or tuples; grads / ref_grads: lists aligned by leaf (a provider's missing
    gradient, None, fails). baseline: baseline_errors() of PyTorch's own same-dtype result; a tensor it lacks is
    held to the reference's rounding."""
    tol, slice_tol = TOLERANCE[dtype_name], SLICE_TOLERANCE[dtype_name]
    fac = factor(dtype_name)
    worst, bad, failed, nearest = 0.0, [], [], None
    outs, refs = as_tuple(outputs), as_tuple(ref_outputs)
    if len(outs) != len(refs):
        return Check(False, math.inf, f"{len(outs)} outputs, reference has {len(refs)}")
    if len(grads) != len(ref_grads):  # zip would skip the reference's extra gradients: never checked, yet ranked
        return Check(False, math.inf, f"{len(grads)} gradients, reference has {len(ref_grads)}")
    pairs = []
    for name, a, r in _pairs(outs, grads, refs, ref_grads):
        if a is None:
            bad.append(f"{name} missing")
            failed.append({"tensor": name, "check": "missing"})
            worst = math.inf
            continue
        pairs.append((name, a, r))
    for name, a, r in pairs:
        err = rel_err(a, r)
        worst = max(worst, err)
        if not err <= tol:  # NaN fails too
            bad.append(f"{name} rel err {err:.3g} > {tol:g}")
            failed.append({"tensor": name, "check": "tensor", "err": err, "bound": tol, "over": err / tol, "at": []})
        base = (baseline or {}).get(name) or rounding_errors(r, dtype_name)
        for kind, (e, at) in slice_errors(a, r).items():
            bound = fac * base.get(kind, 0.0) + slice_tol
            entry = {"tensor": name, "check": kind, "err": e, "bound": bound, "over": e / bound, "at": at}
            if nearest is None or not entry["over"] <= nearest["over"]:
                nearest = entry
            if not e <= bound:
                bad.append(f"{name} {kind} {at} rel err {e:.3g} > {bound:.3g} "
                           f"({fac:g} x torch's worst {kind} {base.get(kind, 0.0):.3g} + {slice_tol:g})")
                failed.append(entry)
    return Check(not bad, worst, "; ".join(bad), failed, nearest)


def compare(outputs, grads, ref_outputs, ref_grads, dtype_name: str, baseline: dict | None = None) -> tuple[bool, float, str]:
    """(ok, worst whole-tensor relative error, what failed or '') for a provider against the reference (check())."""
    c = check(outputs, grads, ref_outputs, ref_grads, dtype_name, baseline)
    return c.ok, c.rel_err, c.why
