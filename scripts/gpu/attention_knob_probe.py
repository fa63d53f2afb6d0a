"""H200 probe: the fused Gluon backward's env knobs at the model-shape suite's weakest attention cases.

    python scripts/gpu/attention_knob_probe.py --out $OUT/knobs.jsonl [--budget-s 200]
        [--cases "LABEL:B,Hq,Hk,T,D,causal;..."] [--settings "NAME=VAR=VALUE,VAR=VALUE;..."] [--pass fwd|full]

For each case (bf16; by default the causal cases of `hearth bench attention --sizes models` that ran furthest below cuDNN)
and each knob setting (env vars read by attention_gluon at call time: HEARTH_ATTN_FB_PAIR_GROUP,
HEARTH_ATTN_FB_CONFIG, HEARTH_ATTN_FB_DQ_SPLIT, HEARTH_ATTN_FB_SEQ_ORDER (packed rows), HEARTH_ATTN_GLUON_PERSIST, and the persistent forward's
HEARTH_ATTN_PPS_BALANCE / HEARTH_ATTN_PPS_TILE_COST, HEARTH_ATTN_FB_ACC_MIB, HEARTH_ATTN_FB_STEP_ORDER; and the pseudo-knob PP_CONFIG=BMxBNxSTAGES, which
this probe applies by setting attention_gluon.PP_CONFIGS[D] for the setting and restores after: the ping-pong forward's
launch config, e.g. at head_dim 64; run the probe with HEARTH_ATTN_GLUON_PP=1 exported for a setting
HEARTH_ATTN_GLUON=1 to reach the ping-pong forward where it is not the default), hearth.kernels.attention fwd+bwd (--pass fwd: the training
forward alone, inputs requiring grad, so lse is stored) is checked against the shipped setting's gradients (fwd: its
output) on the same inputs (max |diff| relative to the max magnitude, under 2e-2: a knob that breaks the kernel is
reported, not timed) and timed the harness's way
(hearth.bench.timing.time_call: L2 flushed and a device sleep at least one call long queued before each call, median
ms), cuDNN (SDPA) timed beside it. Until 2026-12-04 this probe used triton.testing.do_bench, calls back to back: at
small shapes that timed hearth's host path, not its GPU work (B8 H32 T1024: 0.79-1.32 ms between settings that
differ by a few percent on the GPU). Each timed row also carries extra_mib and act_mib: the peak memory one call
allocates beyond what was allocated before it (gradients reset to None), and that minus the gradients it returns
(the harness's "act"). One JSON object per line; settings past the
budget are skipped and say so. A probe of knobs, not a benchmark: the suite's figures come from hearth bench.

--varlen: each case "LABEL:S,Hq,Hk,L,D,causal" is S sequences of L tokens packed into one row and run through
hearth.kernels.attention_varlen (cu_seqlens 0, L, 2L, ...), the same work as a dense batch of S: the cuDNN row is
SDPA over that dense [S, H, L, D] batch, and the pseudo-knob DENSE=1 runs hearth's dense attention on it (its
gradients compared in the packed layout). "LABEL:S,Hq,Hk,L,D,causal,1" packs the same S * L tokens raggedly, as the
model-shape suite's attention_varlen cases do (hearth.bench.cases.varlen_lengths: alternately L / 2 and 3L / 2, the
last taking the rest): no cuDNN row and no DENSE setting then (no dense batch does that work), TFLOP/s by the
sequences' own lengths. Which kernels serve packed rows of a given length, and what packing
costs against the dense path, without the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import importlib
import json
import re
import os
import time

import torch
import torch.nn.functional as F

from hearth.bench.cases import parse_attention_case, varlen_lengths

CASES = [  # (label, B, Hq, Hk, T, D, causal)
    ("Llama-2-7B 32/32 d128 T2048 B4", 4, 32, 32, 2048, 128, True),
    ("Qwen3-14B 40/8 d128 T4096 B2", 2, 40, 8, 4096, 128, True),
    ("Llama-3.2-1B 32/8 d64 T8192 B1", 1, 32, 8, 8192, 64, True),
]
SETTINGS = [  # (label, env); the first is the shipped setting (no knob set)
    ("shipped", {}),
    ("pairs0", {"HEARTH_ATTN_FB_PAIR_GROUP": "0"}),
    ("pairs1", {"HEARTH_ATTN_FB_PAIR_GROUP": "1"}),
    ("pairs4", {"HEARTH_ATTN_FB_PAIR_GROUP": "4"}),
    ("pairs16", {"HEARTH_ATTN_FB_PAIR_GROUP": "16"}),
    ("cfg32x2", {"HEARTH_ATTN_FB_CONFIG": "32,2"}),
    ("nosplit", {"HEARTH_ATTN_FB_DQ_SPLIT": "0"}),
    ("persist", {"HEARTH_ATTN_GLUON_PERSIST": "1"}),
]


def _parse_cases(text: str) -> list:
    """--cases: 'LABEL:B,Hq,Hk,T,D,causal[,ragged];...' -> [(label, B, Hq, Hk, T, D, causal, ragged)]."""
    cases = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        try:
            label, dims = parse_attention_case(item, "--cases", ragged=True)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        cases.append((label, *dims))
    return cases


@contextlib.contextmanager
def jsonl_out(path: str):
    """emit(row): one JSON object a line to `path` (its folder made) and to stdout, flushed (a probe cut short keeps
    its rows)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        def emit(row):
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")
            f.flush()

        yield emit


def _parse_settings(text: str) -> list:
    settings = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        name, _, assigns = item.partition("=")
        # a comma starts the next VAR=VALUE only before a variable's name: a value may hold commas
        # (HEARTH_ATTN_FB_CONFIG=64,3)
        settings.append((name, dict(a.split("=", 1) for a in re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", assigns) if a)))
    return settings


def _gpu_ms(q, k, v, do, fn, fwd_only: bool = False) -> float:
    """Median GPU ms of one fwd+bwd (or forward) through `fn`, timed as the bench harness times (flush, sleep,
    events)."""
    from hearth.bench.timing import time_call

    call = (lambda: fn(q, k, v)) if fwd_only else (lambda: fn(q, k, v).backward(do))
    return time_call(call, [q, k, v], q.device).median_ms


def _extra_mib(q, k, v, do, fn, fwd_only: bool = False) -> tuple[float, float]:
    """(extra, act) MiB of one call: peak allocated during it minus allocated before it (grads reset to None),
    and that minus the gradients it leaves (the harness's memory columns)."""
    for t in (q, k, v):
        t.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = _step(q, k, v, do, fn, fwd_only)
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - before) / 2**20
    grads = 0 if fwd_only else sum(g.numel() * g.element_size() for g in out) / 2**20
    out = None
    for t in (q, k, v):
        t.grad = None
    return extra, extra - grads


def _packed(t: torch.Tensor) -> torch.Tensor:
    """A dense [B, H, T, D] tensor (or its gradient) as packed rows [B * T, H, D], detached: sequence b's tokens at
    rows b * T ... (b + 1) * T - 1."""
    B, H, T, D = t.shape
    return t.detach().transpose(1, 2).reshape(B * T, H, D).contiguous()


def _apply_pp_config(ag, head_dim: int, value: str | None, saved: tuple) -> None:
    """The PP_CONFIG pseudo-knob: attention_gluon.PP_CONFIGS[head_dim] = BMxBNxSTAGES, or the saved entry."""
    ag.PP_CONFIGS[head_dim] = tuple(int(x) for x in value.split("x")) if value else saved


def _step(q, k, v, do, fn, fwd_only: bool = False):
    if fwd_only:
        return (fn(q, k, v).detach(),)
    for t in (q, k, v):
        t.grad = None
    fn(q, k, v).backward(do)
    return q.grad, k.grad, v.grad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--cases", default=None, help='"LABEL:B,Hq,Hk,T,D,causal;..." (default: CASES)')
    ap.add_argument("--settings", default=None,
                    help='"NAME=VAR=VALUE,VAR=VALUE;..." (NAME= alone: no knob set; the first is the reference)')
    ap.add_argument("--pass", dest="which", choices=("fwd", "full"), default="full")
    ap.add_argument("--varlen", action="store_true",
                    help="cases are S sequences of L tokens packed (attention_varlen); DENSE=1 runs the dense batch")
    args = ap.parse_args()
    fwd_only = args.which == "fwd"
    cases = _parse_cases(args.cases) if args.cases else CASES
    if not args.varlen and any(c[7:] and c[7] for c in cases):
        ap.error("--cases: a ragged case (7th field 1) needs --varlen")
    settings = _parse_settings(args.settings) if args.settings else SETTINGS
    pseudo = ("PP_CONFIG", "DENSE")  # applied by this probe, not environment variables
    knobs = sorted({k for _, env in settings for k in env if k not in pseudo})
    attention = importlib.import_module("hearth.kernels.attention")  # the module (the package's name is a function)

    start = time.monotonic()
    with jsonl_out(args.out) as emit:
        ag = importlib.import_module("hearth.kernels.attention_gluon")
        for label, B, Hq, Hk, T, D, causal, *rest in cases:
            ragged = args.varlen and bool(rest and rest[0])
            saved_pp = ag.PP_CONFIGS[D] if D in ag.PP_CONFIGS else None
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, h, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                       for h in (Hq, Hk, Hk))
            do = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
            lens = varlen_lengths(B, B * T) if ragged else [T] * B
            flops = (1 if fwd_only else 3.5) * 4 * Hq * sum(n * n for n in lens) * D / (2 if causal else 1)  # fwd+bwd: 3.5x
            sdpa = (lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=Hq != Hk))
            if not ragged:
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                    ms = _gpu_ms(q, k, v, do, sdpa, fwd_only)
                    extra, act = _extra_mib(q, k, v, do, sdpa, fwd_only)
                emit(dict(case=label, setting="cudnn", which=args.which, ms=ms, tflops=flops / ms / 1e9,
                          extra_mib=round(extra, 1), act_mib=round(act, 1)))
            ours = (lambda a, b, c: attention.attention(a, b, c, causal=causal))
            dense = (q, k, v, do)
            if args.varlen:  # the same batch packed: S = B sequences of L = T tokens, [S * L, H, D] leaves
                varlen = importlib.import_module("hearth.kernels.attention_varlen")
                cu = torch.tensor([0, *itertools.accumulate(lens)], device="cuda", dtype=torch.int32)
                q, k, v, do = (_packed(t).requires_grad_(t.requires_grad) for t in (q, k, v, do))
                longest = max(lens)
                ours = (lambda a, b, c: varlen.attention_varlen(a, b, c, cu, cu, longest, longest, causal=causal))
            ref = None
            for i, (name, env) in enumerate(settings):
                if time.monotonic() - start > args.budget_s:
                    emit(dict(case=label, setting=name, status="skipped (budget)"))
                    continue
                if i and ref is None:  # the first setting is the reference: a knob never stands in for it
                    emit(dict(case=label, setting=name, status=f"skipped (no reference: {settings[0][0]} did not run)"))
                    continue
                if "PP_CONFIG" in env and saved_pp is None:  # nothing to apply it to: it would time the shipped form
                    emit(dict(case=label, setting=name, status=f"skipped (PP_CONFIG: no PP_CONFIGS entry at head_dim {D})"))
                    continue
                for key in knobs:
                    os.environ.pop(key, None)
                os.environ.update({k: val for k, val in env.items() if k not in pseudo})
                if saved_pp is not None:
                    _apply_pp_config(ag, D, env.get("PP_CONFIG"), saved_pp)
                on_dense = args.varlen and env.get("DENSE") == "1"  # the packed case's batch, unpacked
                if on_dense and ragged:
                    emit(dict(case=label, setting=name, status="skipped (DENSE with a ragged packing)"))
                    continue
                run = (*dense, (lambda a, b, c: attention.attention(a, b, c, causal=causal))) if on_dense \
                    else (q, k, v, do, ours)
                try:
                    grads = [(_packed(x) if on_dense else x).float() for x in _step(*run, fwd_only)]
                    if ref is None:
                        ref = grads
                    err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(grads, ref))
                    if err > 2e-2:
                        emit(dict(case=label, setting=name, status="mismatch", rel_err=err))
                        continue
                    ms = _gpu_ms(*run, fwd_only)
                    extra, act = _extra_mib(*run, fwd_only)
                    emit(dict(case=label, setting=name, which=args.which, env=env, ms=ms, tflops=flops / ms / 1e9, rel_err=err,
                              extra_mib=round(extra, 1), act_mib=round(act, 1), status="ok"))
                except Exception as e:  # a knob outside the kernel's forms: report it, go on
                    emit(dict(case=label, setting=name, status=f"error: {type(e).__name__}: {str(e)[:300]}"))
            for key in knobs:
                os.environ.pop(key, None)
            if saved_pp is not None:
                _apply_pp_config(ag, D, None, saved_pp)
            q = k = v = do = ref = dense = run = None  # free this case's tensors before the next one's
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
