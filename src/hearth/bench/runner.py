"""`hearth bench` entry point: build the cases, check then time every provider, write the reports.

Per case (op x size x dtype x mode): make the inputs once, compute the fp32 reference once (and, in bf16 / fp16,
the reference run in that dtype: PyTorch's own error, which scales the gate's per-slice bounds, check.py), then
for each provider: bind, run once and compare with the reference (outputs, and gradients in
bwd / full); only a correct provider is timed and its memory measured. Rows are written to
results.jsonl after every case, so a run cut short keeps what it measured. A provider that leaves a sticky CUDA
error ends its case and the run: every later provider's row is skipped, naming it.

Time budget: the run gets `total_budget_s`; each op gets a share of what is left when it starts,
in proportion to its number of cases times CASE_COST (or `budget_s` if smaller). Cases left when an op's share is spent are written as
'skipped' with the reason, never dropped.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hearth.durable import folder_problem

OP_ORDER = ("softmax", "cross_entropy", "linear_cross_entropy", "rms_norm", "layer_norm", "rope", "rope_inplace",
            "swiglu", "swiglu_mlp", "attention", "attention_varlen", "matmul")


# relative time of one case (checks, torch.compile, timing) on the H200, from the headline run's
# setup and call times: the linear losses and attention call slowly, matmul has no compiled peer
CASE_COST = {"linear_cross_entropy": 2.5, "attention": 2.0, "attention_varlen": 2.0, "swiglu_mlp": 1.5, "matmul": 0.5}


def env_info(device) -> dict:
    """GPU name, driver, library versions, date and command line, written into every row."""
    import importlib.metadata as md
    import platform
    import subprocess

    import torch
    import triton

    from hearth.bench.check import CHECK_METHOD
    from hearth.bench.timing import TIMING_METHOD

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    driver = None
    if device.type == "cuda":
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:  # no nvidia-smi in the container: the row says so
            driver = "unknown"
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {platform.machine()} (TRITON_INTERPRET=1)",
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": version("liger_kernel") or version("liger-kernel"),
        # the other peers' libraries (None: not installed), and the CUDA / cuDNN under cuBLAS and SDPA's rows
        "quack": version("quack-kernels"),
        "cutlass_dsl": version("nvidia-cutlass-dsl"),
        "flash_attn": {d: v for d in ("flash-attn-4", "flash-attn-3", "flash-attn") if (v := version(d))} or None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "hearth": version("hearth"),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # the `hearth` console script's argv[1] is the subcommand ("bench") itself
        "command": " ".join(["hearth", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("hearth") else " ".join(sys.argv),
        # the harness's timing procedure (a peer row timed by another is not ranked against hearth's: report._setup)
        "timing": TIMING_METHOD,
        # the correctness gate's procedure (check.py): whole-tensor and per row / column / block errors
        "check": CHECK_METHOD,
        # hearth's own switches (HEARTH_ATTN_GLUON, HEARTH_ATTN_AUTOTUNE, ...): a row says which were set
        "hearth_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("HEARTH_")},
    }


def kernel_used(op: str, size: dict, dtype_name: str, device) -> str | None:
    """Which of hearth's kernels a hearth row of `op` ran, where an op has more than one: attention's forward
    ("gluon_pps" / "gluon_pp" / "gluon" / "triton", as attention.forward_kernel chooses for the case). None elsewhere."""
    if op != "attention":
        return None
    import importlib

    import torch

    attn = importlib.import_module("hearth.kernels.attention")  # the package exports the function of that name

    return attn.forward_kernel(attn.device_capability(device), getattr(torch, dtype_name), int(size["D"]),
                               bool(size["causal"]), seq_len=int(size["T"]))


def _outputs_needing_grad(out):
    from hearth.bench.check import as_tuple

    return [o for o in as_tuple(out) if getattr(o, "requires_grad", False)]


def _grad_outputs(ref_out, dtype, device, like=()):
    """dy for each output: ones for a scalar loss (as in training), seeded random otherwise; contiguous, or laid
    out as like[i] (an input of the output's shape: rope's q, k) where given, with the same values."""
    import torch

    from hearth.bench.check import as_tuple

    gen = torch.Generator(device=device).manual_seed(1234)
    gs = []
    for i, o in enumerate(as_tuple(ref_out)):
        if o.numel() == 1:
            g = torch.ones(o.shape, dtype=dtype, device=device)
        else:
            g = torch.randn(o.shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
        if i < len(like) and tuple(like[i].shape) == tuple(g.shape):
            g = torch.empty_like(like[i], dtype=dtype).copy_(g)  # empty_like keeps a dense input's strides
        gs.append(g)
    return gs


def _reference(spec, inputs, size, mode, dtype):
    """fp32 outputs, gradients (None where an input gets no gradient) and the dy used, in `dtype`."""
    import torch

    from hearth.bench.check import as_tuple

    grad_names = spec.grad_names(size) if mode != "fwd" else []
    ref_in = {k: (v.detach().float().requires_grad_(k in grad_names) if v.is_floating_point() else v) for k, v in inputs.items()}
    with torch.set_grad_enabled(mode != "fwd"):
        out = spec.reference(**ref_in, **spec.call_kwargs(size))
    grads, gouts = [], []
    if mode != "fwd":
        device = next(iter(inputs.values())).device
        gouts = _grad_outputs(out, dtype, device, [inputs[n] for n in getattr(spec, "grad_like", ())])
        torch.autograd.backward(list(as_tuple(out)), [g.float() for g in gouts])
        grads = [ref_in[n].grad for n in grad_names]
    out = tuple(o.detach() for o in out) if isinstance(out, tuple) else out.detach()
    return out, grads, gouts


def _baseline(spec, inputs, size, mode, dtype_name, ref_out, ref_grads, gouts) -> tuple[dict | None, str]:
    """PyTorch's own error in the case's dtype, slice by slice (check.baseline_errors), and what it came from: the
    reference run on the case's inputs in their own dtype, forward and (bwd / full) backward with the same dy. The
    correctness gate scales each provider's slice bounds by it. In fp32 that run is the reference itself (no error:
    None); if it fails, the gate falls back to the reference's rounding to the dtype and the row says so."""
    import torch

    from hearth.bench.check import as_tuple, baseline_errors

    if dtype_name == "float32":
        return None, "float32: the reference itself (no rounding)"
    try:
        grad_names = spec.grad_names(size) if mode != "fwd" else []
        mine = {k: (v.detach().requires_grad_(k in grad_names) if v.is_floating_point() else v) for k, v in inputs.items()}
        with torch.set_grad_enabled(mode != "fwd"):
            out = spec.reference(**mine, **spec.call_kwargs(size))
        grads = []
        if mode != "fwd":
            torch.autograd.backward(list(as_tuple(out)), [g.clone() for g in gouts])
            grads = [mine[n].grad for n in grad_names]
        errs = baseline_errors(out, grads, ref_out, ref_grads, dtype_name)
        return errs, f"torch {dtype_name}: the reference run in {dtype_name}"
    except Exception as e:  # the gate still runs, on the reference's rounding alone
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        return None, f"the reference rounded to {dtype_name} (its run in {dtype_name} failed: {why})"


def _finite(x):
    """JSON-safe: inf / NaN -> None (the row's reason says what failed)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _check_fields(c, baseline_text: str) -> dict:
    """The gate's record on a row: every failed check (tensor, kind, worst slice, its error, bound and err / bound),
    the slice check nearest its bound, and what the bounds were scaled by."""
    def clean(d):
        return None if d is None else {k: _finite(v) for k, v in d.items()}

    return {"check_failed": [clean(f) for f in c.failed], "check_worst": clean(c.worst), "check_baseline": baseline_text}


def _timed_fn(bound, mode, gouts):
    """(fn, setup) timed for `mode`: fwd times the forward; full forward + backward; bwd runs the
    forward in the untimed setup and times the backward alone."""
    import torch

    def backward(out):
        torch.autograd.backward(_outputs_needing_grad(out), gouts)

    if mode == "fwd":
        return bound.fn, None
    if mode == "full":
        return (lambda: backward(bound.fn())), None
    return backward, bound.fn


def run_provider(spec, provider, inputs, size, dtype_name, mode, ref, device, check, registry=None) -> dict:
    """Check, time and measure one provider on one case; returns the fields of its row."""
    import torch

    from hearth.bench import providers as P
    from hearth.bench.check import TOLERANCE, check as check_outputs
    from hearth.bench.timing import measure_memory, sol_percent, throughput, time_call, time_wall

    # ref: (outputs, gradients, dy, limits[, (baseline slice errors, what they came from)])
    ref_out, ref_grads, gouts, limits = ref[:4]
    baseline, baseline_text = ref[4] if len(ref) > 4 else (None, "the reference rounded to the dtype")
    row = {"status": "ok", "reason": "", "tolerance": TOLERANCE[dtype_name]}
    bound = None
    try:
        t0 = time.perf_counter()
        bound = P.bind(spec.name, provider, inputs, spec, size, mode != "fwd", check, registry)
        if getattr(bound, "impl", None):
            row["impl"] = bound.impl
        out = bound.fn()
        grads = []
        if mode != "fwd":
            # clones: some providers (Liger rms_norm) write the input gradient into dy in place
            torch.autograd.backward(_outputs_needing_grad(out), [g.clone() for g in gouts])
            grads = [getattr(t, "grad", None) for t in bound.leaves]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        row["setup_s"] = time.perf_counter() - t0  # first call: includes torch.compile / Triton JIT (not the check)
        c = check_outputs(out, grads, ref_out, ref_grads, dtype_name, baseline)
        row["rel_err"] = _finite(c.rel_err)
        row.update(_check_fields(c, baseline_text))
        del out, grads
        if not c.ok:
            row.update(status="wrong", reason=c.why)
            return row
        fn, setup = _timed_fn(bound, mode, gouts)
        t = time_call(fn, bound.leaves, device, setup=setup)
        row.update(ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, n_reps=t.n, sleep_ms=t.sleep_ms)
        if mode != "bwd":  # bwd's untimed forward cannot be taken out of a back-to-back wall time
            # on the CPU (--check, the harness's self-test: its timings mean nothing) one block of one call or more,
            # not five: each kernel call there is an interpreter run
            cuda = device.type == "cuda"
            row.update(time_wall(fn, bound.leaves, device, est_ms=t.median_ms, min_calls=5 if cuda else 1,
                                 blocks=5 if cuda else 1))
        row.update(measure_memory(fn, bound.leaves, device, setup=setup))
        row["value"] = throughput(spec.work(size, _itemsize(dtype_name), mode), t.median_ms, spec.metric)
        row["sol_pct"] = sol_percent(row["value"], spec.metric, limits)
        if provider == "hearth" and (kernel := kernel_used(spec.name, size, dtype_name, device)) is not None:
            row["kernel"] = kernel
    except P.Unavailable as e:
        row.update(status="unavailable", reason=str(e))
    except P.Refuses as e:
        row.update(status="refuses", reason=str(e))
    except P.Skipped as e:
        row.update(status="skipped", reason=str(e))
    except torch.OutOfMemoryError as e:
        row.update(status="oom", reason=str(e).splitlines()[0][:300])
    except Exception as e:  # any failure of a provider is a result, not a crash of the run
        row.update(status="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
    finally:
        del bound
        _free(device)
    return row


def _warm_compile(device) -> float:
    """Start torch.compile's machinery once (Inductor's compile workers, Triton's imports) before
    the per-op time shares are handed out, so the first op's share does not pay for it; returns
    the seconds it took. A failure here is left to the compile rows to report."""
    import torch

    t0 = time.perf_counter()
    try:
        torch._dynamo.reset()
        x = torch.randn(64, 256, device=device, requires_grad=True)
        f = torch.compile(lambda t: torch.softmax(t, dim=-1) * 2.0, dynamic=False)
        f(x).sum().backward()
        torch.cuda.synchronize(device)
        torch._dynamo.reset()
    except Exception:
        pass
    return time.perf_counter() - t0


def _base_row(spec, size, dtype_name, mode, limits, env, headline) -> dict:
    """The fields every provider row of a case shares. size_label: the case's name (a model
    case's name, else the shape); shape: the shape label either way."""
    return {"op": spec.name, "size": size, "size_label": spec.case_label(size), "shape": spec.label(size),
            "dtype": dtype_name, "mode": mode, "metric": spec.metric, "formula": spec.formula, "notes": spec.notes,
            "headline": headline, "preset": "models" if "name" in size else None,
            # the inputs' memory layout (cases.LAYOUTS): rows of different layouts are never ranked together
            "layout": getattr(spec, "layout", "contiguous"),
            "work": spec.work(size, _itemsize(dtype_name), mode), "limits": limits, "env": env}


def _free(device) -> None:
    """Return cached blocks between providers. Never raises: after a sticky CUDA error every
    CUDA call fails, and the run must still write its rows (see _poisoned)."""
    gc.collect()
    if device.type == "cuda":
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:
            pass


def _itemsize(dtype_name):
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype_name]


def run_case(spec, size, dtype_name, mode, providers, device, limits, env, headline, check, registry=None) -> list[dict]:
    """All provider rows of one case."""
    import torch

    from hearth.bench.providers import applies

    from hearth.bench.cases import MAX_CASE_GIB, estimate_gib

    dtype = getattr(torch, dtype_name)
    base = _base_row(spec, size, dtype_name, mode, limits, env, headline)
    rows = []
    est = estimate_gib(spec, size, _itemsize(dtype_name))
    if est > MAX_CASE_GIB:
        reason = f"estimated {est:.0f} GiB of device memory > {MAX_CASE_GIB:.0f} GiB (cases.estimate_gib): not run"
        return [{**base, "provider": p, "status": "skipped", "reason": reason} for p in providers if applies(spec.name, p)]
    try:
        inputs = spec.make(size, dtype, device, mode != "fwd")
        ref_out, ref_grads, gouts = _reference(spec, inputs, size, mode, dtype)
        baseline = _baseline(spec, inputs, size, mode, dtype_name, ref_out, ref_grads, gouts)
    except Exception as e:  # the harness's own reference failed: every provider row says so
        reason = f"reference failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        status = "oom" if isinstance(e, torch.OutOfMemoryError) else "error"
        return [{**base, "provider": p, "status": status, "reason": reason} for p in providers if applies(spec.name, p)]
    poisoned = ""
    for p in providers:
        if registry is None and not applies(spec.name, p):
            continue
        if poisoned and _sticky(device):  # every CUDA call fails now: the row says who left the error
            rows.append({**base, "provider": p, "status": "skipped", "reason": poisoned})
            continue
        # fresh copies per provider: some write into their inputs or dy in place (Liger's cross
        # entropy stores the gradient in the logits), which must not leak into the next provider
        mine = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
        my_gouts = [g.clone() for g in gouts]
        r = run_provider(spec, p, mine, size, dtype_name, mode, (ref_out, ref_grads, my_gouts, limits, baseline), device, check,
                         registry)
        rows.append({**base, "provider": p, **r})
        poisoned = _poisoned(rows[-1:])
        del mine, my_gouts
    del inputs, ref_out, ref_grads, gouts
    _free(device)
    return rows


def _selected_ops(ops):
    from hearth.bench.cases import SPECS

    if not ops:
        return list(OP_ORDER)
    # each op once: a repeated name put its cases in the plan twice, and the op loop ran them once per copy per name
    names = list(dict.fromkeys(p.strip() for o in ops for p in o.split(",") if p.strip()))
    if not names:  # ',' or '': no case would run, and the old rows' reports would be printed as this run's
        raise ValueError(f"ops: no op named in {ops!r}; choose from {list(OP_ORDER)} or 'all'")
    if names == ["all"]:
        return list(OP_ORDER)
    bad = [n for n in names if n not in SPECS]
    if bad:
        raise ValueError(f"ops: unknown op(s) {bad}; choose from {list(OP_ORDER)}")
    return names


def _selected_dtypes(dtypes, check):
    names = list(dict.fromkeys(p.strip() for d in (dtypes or []) for p in d.split(",") if p.strip())) or (
        ["float32"] if check else ["bfloat16"])  # each dtype once: a repeat ran its cases again
    bad = [n for n in names if n not in ("float32", "bfloat16", "float16")]
    if bad:
        raise ValueError(f"dtype: unknown dtype(s) {bad}; choose from float32, bfloat16, float16")
    return names


_STICKY = ("illegal memory access", "device-side assert", "unspecified launch failure", "CUDA error: an illegal")


def _poisoned(rows) -> str:
    """A reason to stop when a provider left a sticky CUDA error: every later call in this
    process would fail too, and its rows would blame the wrong provider."""
    for r in rows:
        if r["status"] == "error" and any(s in r.get("reason", "") for s in _STICKY):
            return (f"not run: {r['provider']} on {r['op']} {r['size_label']} {r['mode']} left a sticky CUDA error "
                    f"({r['reason'][:120]}); rerun this op in its own process")
    return ""


def _sticky(device) -> bool:
    """Whether an error _poisoned names leaves `device` unusable for the rest of the process: on CUDA it does (the
    case's later providers are then skipped, not run into the same error and recorded as failing); under --check on
    the CPU nothing is sticky, and the case's other providers run (the run still stops after the case)."""
    return device.type == "cuda"


def _line(rows) -> str:
    from hearth.bench.report import verdict

    r0 = rows[0]
    parts = []
    for r in rows:
        if r["status"] != "ok":
            parts.append(f"{r['provider']} {r['status']}")
        elif r.get("wall_ms") is not None:
            parts.append(f"{r['provider']} {r['ms']:.4g} ms (wall {r['wall_ms']:.3g})")
        else:
            parts.append(f"{r['provider']} {r['ms']:.4g} ms")
    return f"{r0['op']} {r0['size_label']} {r0['dtype']} {r0['mode']}: " + " | ".join(parts) + f" -> {verdict(rows)['text']}"


def _print_geomeans(rows) -> None:
    """The per-op GEOMEAN lines (and, with attention rows, the ATTENTION-GOAL lines), last, on plain stdout
    (scripts grep them from the tail)."""
    from hearth.bench.report import attention_goal_lines, geomean_lines

    for line in geomean_lines(rows) + attention_goal_lines(rows):
        print(line, flush=True)


def _check_out(out: Path, merge) -> None:
    """ValueError naming --out or --merge when OUT cannot take results.jsonl and the reports (a file in its place or
    on the way to it, a folder without write permission, a folder named results.jsonl), or a --merge folder's
    results.jsonl is a folder."""
    problem = folder_problem(out)
    if problem:
        raise ValueError(f"--out: {problem}")
    if (out / "results.jsonl").is_dir():
        raise ValueError(f"--out: {out / 'results.jsonl'} is a folder, where the run writes its results.jsonl file")
    for d in merge or []:
        if (Path(d) / "results.jsonl").is_dir():
            raise ValueError(f"--merge: {Path(d) / 'results.jsonl'} is a folder, not a results.jsonl file")


def main(ops=None, dtypes=None, modes=None, providers=None, sizes=None, out=Path("benchmarks/latest"), check=False,
         report_only=False, merge=None, budget_s=None, total_budget_s=450.0, plots=True, registry=None,
         write_report=True) -> int:
    """Run the benchmark (or only regenerate reports) and return a process exit code.

    ops / dtypes / modes / providers: lists of names (None = defaults: every op, bfloat16 (float32
    under --check), the size preset's modes, every provider). sizes: headline | models | sweep |
    small | a comma list of the op's knob (default headline). out: folder for results.jsonl, <op>.md,
    summary.md and PNGs. check: tiny sizes on the CPU under TRITON_INTERPRET=1. report_only:
    rebuild the reports from out/results.jsonl merged with each folder in `merge`. write_report=False:
    only results.jsonl (a script running op by op builds the reports once at the end).
    Exit codes: 0 done; 1 under --check when an eager baseline row is not ok (the harness's own
    checks are broken); 2 bad arguments or no CUDA without --check."""
    if check:
        # must precede the first import of triton, which reads it once
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from rich.console import Console

    from hearth.bench.report import merge_rows, read_rows, write_reports, write_rows

    console = Console(stderr=False)
    out = Path(out)
    results = out / "results.jsonl"
    try:
        # before anything runs: the first write (results.jsonl after the first case) met a file on the way, or a
        # folder named results.jsonl, with a traceback
        _check_out(out, merge)
        extra = [read_rows(Path(d) / "results.jsonl") for d in (merge or [])]
        for d in merge or []:
            if not (Path(d) / "results.jsonl").exists():
                raise ValueError(f"merge: {d} has no results.jsonl")
        rows = merge_rows(read_rows(results), *extra)
    except ValueError as e:
        console.print(f"[red]{e}[/red]")
        return 2
    if report_only:
        if not rows:  # a mistyped --out, or a folder without its rows: never overwrite its reports with 'no results'
            where = f"{results}" + (" or the --merge folders" if merge else "")
            console.print(f"[red]--report-only: no rows in {where}: nothing to report, {out} left as it was[/red]")
            return 2
        write_rows(results, rows)
        paths = write_reports(out, rows, plots=plots)
        console.print(f"{len(rows)} rows -> {len(paths)} report files in {out}")
        _print_geomeans(rows)
        return 0

    import torch

    from hearth.bench.cases import SPECS, cases_for
    from hearth.bench.providers import applies, expand
    from hearth.bench.timing import measure_limits

    try:
        for name, value in (("total_budget_s", total_budget_s), ("budget_s", budget_s)):
            # a negative budget would skip every case as 'time budget spent'; NaN would lift the limit silently
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be a number >= 0 (seconds), got {value!r}")
        op_names = _selected_ops(ops)
        dtype_names = _selected_dtypes(dtypes, check)
        provider_names = expand(providers)
        if not provider_names:  # --providers '' (an empty shell variable): every case would run no provider
            raise ValueError(f"--providers: no provider named in {providers!r}")
        if registry is None and not any(applies(n, p) for n in op_names for p in provider_names):
            raise ValueError(f"--providers: none of {provider_names} runs {', '.join(op_names)} (providers.applies)")
        preset = sizes or "headline"
        plan = [(name, s, m, d) for name in op_names for s, m in cases_for(SPECS[name], preset, modes, check) for d in dtype_names]
    except ValueError as e:
        console.print(f"[red]{e}[/red]")
        return 2
    if check:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        console.print("[red]no CUDA device: run with --check for the CPU self-test[/red]")
        return 2
    env = env_info(device)
    limits = measure_limits(device)
    console.print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}, liger {env['liger']}; "
                  f"copy {limits['copy_GBps']:.0f} GB/s, matmul {limits['matmul_TFLOPs']:.3g} TFLOP/s; {len(plan)} cases")
    headline = preset == "headline" and not check
    new_rows: list[dict] = []
    poisoned = ""
    start = time.perf_counter()
    if "compile" in provider_names and device.type == "cuda" and any(applies(n, "compile") for n in op_names):
        warm = _warm_compile(device)
        console.print(f"torch.compile start-up (compile workers, Triton imports): {warm:.1f} s, counted in the total budget")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("bench", total=len(plan))
        for i_op, name in enumerate(op_names):
            op_plan = [p for p in plan if p[0] == name]
            left = max(0.0, total_budget_s - (time.perf_counter() - start))
            # share of what is left, in proportion to the op's cases weighted by their cost
            remaining = sum(CASE_COST.get(p[0], 1.0) for p in plan if p[0] in op_names[i_op:])
            share = left * len(op_plan) * CASE_COST.get(name, 1.0) / max(1e-9, remaining)
            if budget_s is not None:
                share = min(share, budget_s)
            op_start = time.perf_counter()
            for _, size, mode, dtype_name in op_plan:
                spec = SPECS[name]
                progress.update(task, description=f"{name} {spec.case_label(size)} {dtype_name} {mode}")
                spent = time.perf_counter() - op_start
                if poisoned or spent > share:
                    reason = poisoned or f"time budget spent: {spent:.0f} s of this op's {share:.0f} s share (--budget-s / --total-budget-s)"
                    base = _base_row(spec, size, dtype_name, mode, limits, env, headline)
                    # the providers run_case would have run: one that can never apply to this op gets no row
                    case_rows = [{**base, "provider": p, "status": "skipped", "reason": reason} for p in provider_names
                                 if registry is not None or applies(name, p)]
                else:
                    case_rows = run_case(spec, size, dtype_name, mode, provider_names, device, limits, env, headline, check, registry)
                    if case_rows:  # none when no selected provider applies to this op (--providers vendor: softmax)
                        progress.console.print(_line(case_rows), highlight=False, soft_wrap=True)
                    poisoned = _poisoned(case_rows)
                new_rows += case_rows
                rows = merge_rows(rows, case_rows)
                write_rows(results, rows)
                progress.advance(task)
    paths = write_reports(out, rows, plots=plots) if write_report else []
    console.print(f"{len(new_rows)} rows this run, {len(rows)} in {results}; {len(paths)} report files; "
                  f"{time.perf_counter() - start:.0f} s")
    if write_report:
        _print_geomeans(rows)
    if check:
        broken = [r for r in new_rows if r["provider"] == "eager" and r["status"] not in ("ok", "skipped")]
        for r in broken:
            console.print(f"[red]self-test: eager {r['op']} {r['size_label']} {r['mode']}: {r['status']}: {r['reason']}[/red]")
        return 1 if broken else 0
    return 0
