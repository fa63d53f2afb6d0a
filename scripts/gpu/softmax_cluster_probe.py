"""GPU probe: the cluster softmax (hearth.kernels.softmax_gluon: the register form, not routed, and the
shared-memory form, which softmax() routes wide rows to on Hopper) against hearth's Triton kernels (the chunked
kernel reads a wide row twice) and torch.compile, at wide rows; then the cluster cross-entropy
(hearth.kernels.cross_entropy_gluon: loss and gradient in place, one pass) against the Triton row kernel and
Liger's fused cross-entropy where it imports; then the softmax backward (softmax_bwd_smem against the Triton
backward).

    python scripts/gpu/softmax_cluster_probe.py --out DIR/softmax_cluster.jsonl      # H200, about two minutes

Last, pick_check (skipped by --no-pick-check): hearth softmax with its launch config picked on a 64-row first
call and on a full one.

For each shape and provider (cluster: the register form at config's cluster size and at the sizes in --ctas;
smem: the shared-memory form at smem_config's cluster size, at the --ctas sizes and at 8 warps a CTA; hearth:
softmax() as routed; hearth-triton: its Triton kernel, softmax_gluon.ROUTE off; compile; --fwd-only-smem keeps
smem, hearth, hearth-triton and compile), after one call at the full shape:
  1. correctness: max abs error against softmax in fp64 of the same values, and PyTorch's own bf16 error
     beside it (a provider over 2x PyTorch's error is marked wrong and not timed);
  2. time: hearth.bench.timing.time_call (CUDA events, L2 flushed, median of >= 10 calls); GB/s = one read
     and one write of the rows over the median, next to the device copy bandwidth measured in the same run;
  3. memory: peak allocated during one call minus what was allocated before it.
Writes one JSON line per (shape, provider) with the GPU, versions and command; prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from hearth.bench.runner import env_info
from hearth.bench.timing import time_call
from hearth.kernels import cross_entropy_gluon as cg
from hearth.kernels import softmax_gluon as sg
from hearth.kernels.cross_entropy import ce_rows_
from hearth.kernels.softmax import softmax as hearth_softmax

SHAPES = [(4096, 262144), (4096, 151936), (8192, 131072), (16384, 65536)]
# the 4096 x 152064 row (Qwen2.5-7B in the model-shape suite) is the suite's lowest copy bandwidth: 16 CTAs of 20 KiB
# a row where 131072 takes 8 of 32 KiB (the --ctas sizes are timed too)
CE_SHAPES = [(8192, 131072), (16384, 151936), (4096, 262144), (4096, 152064)]
console = Console(width=160)


def _unrouted(fn):
    """fn with softmax_gluon.ROUTE off: hearth's Triton kernels, which Hopper's wide rows no longer reach."""
    def call(*args):
        sg.ROUTE = False
        try:
            return fn(*args)
        finally:
            sg.ROUTE = True
    return call


def _timing(tm, nbytes: int) -> dict:
    """A provider row's timing fields from time_call's result: median / p20 / p80 ms and GB/s for `nbytes`
    of traffic over the median."""
    return dict(ms=tm.median_ms, p20_ms=tm.p20_ms, p80_ms=tm.p80_ms, gbps=nbytes / (tm.median_ms * 1e-3) / 1e9)


def _write(f, row: dict) -> None:
    """One JSON line per provider row, flushed (a probe cut short by its time limit keeps its rows)."""
    f.write(json.dumps(row) + "\n")
    f.flush()


def _copy_gbps(device) -> float:
    a = torch.empty(2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t = time_call(lambda: b.copy_(a), [], device)
    return 2 * a.numel() / (t.median_ms * 1e-3) / 1e9


def _peak_extra_mib(fn, device) -> float:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    extra = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    del out
    return extra


def _liger_ce():
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception:  # noqa: BLE001 -- absent or broken: the probe runs without the peer
        return None
    return liger_cross_entropy


def ce_table(out: str, meta: dict, copy: float, device, ctas: list[int]) -> None:
    """Cross-entropy fwd+bwd at CE_SHAPES (bf16): the loss and the gradient of the mean, each provider on a
    fresh copy of the logits made outside the timed region (the hearth kernels write over them). smem: the
    shared-memory form at smem_config's cluster size, then at each of `ctas` (the --ctas sizes) besides it."""
    liger = _liger_ce()
    table = Table(title=f"cross-entropy fwd+bwd, bf16 (device copy {copy:.0f} GB/s)")
    for col in ("shape", "provider", "ms", "GB/s (read + write)", "loss err / torch", "grad err / torch"):
        table.add_column(col)
    with open(out, "a") as f:
        for n, v in CE_SHAPES:
            x = (torch.randn(n, v, device=device) * 3).to(torch.bfloat16)
            t = torch.randint(0, v, (n,), device=device)
            k = 64  # the reference on the first rows (fp64), PyTorch's bf16 error beside it
            ref_x = x[:k].double().requires_grad_()
            ref = torch.nn.functional.cross_entropy(ref_x, t[:k], reduction="none")
            (ref.sum() / n).backward()
            bx = x[:k].clone().requires_grad_()
            base = torch.nn.functional.cross_entropy(bx, t[:k], reduction="none")
            (base.sum() / n).backward()
            base_l = (base.double() - ref).abs().max().item()
            base_g = (bx.grad.double() - ref_x.grad).abs().max().item()
            work = torch.empty_like(x)
            # each provider takes the logits and their targets (the check runs on the first k rows)
            spick = sg.smem_config(v, x.element_size())[0]
            providers = [("cluster", lambda w, tt: cg.ce_rows_(w, tt, grad_scale=1.0 / n)),
                         ("smem", lambda w, tt: cg.ce_rows_smem_(w, tt, grad_scale=1.0 / n))]
            providers += [(f"smem-{c}", lambda w, tt, c=c: cg.ce_rows_smem_(w, tt, grad_scale=1.0 / n, ctas=c))
                          for c in ctas if c != spick]
            providers += [("smem-w8", lambda w, tt: cg.ce_rows_smem_(w, tt, grad_scale=1.0 / n, warps=8)),
                         ("hearth", lambda w, tt: ce_rows_(w, tt, grad_scale=1.0 / n)),
                         ("hearth-triton", _unrouted(lambda w, tt: ce_rows_(w, tt, grad_scale=1.0 / n)))]
            if liger is not None:
                providers.append(("liger", lambda w, tt: liger(w, tt).backward()))
            for name, fn in providers:
                row = {"op": "cross_entropy", "rows": n, "cols": v, "dtype": "bfloat16", "provider": name, **meta}
                try:
                    if name != "liger":  # first call at the full shape (hearth's pick: see the softmax table)
                        fn(x.clone(), t)
                    if name == "liger":  # a peer: timed, not checked here (the bench harness checks it)
                        l_err = g_err = float("nan")
                    else:
                        w = x[:k].clone()
                        l_err = (fn(w, t[:k]).double() - ref).abs().max().item()
                        g_err = (w.double() - ref_x.grad).abs().max().item()  # the kernel wrote d(mean)/dx
                    row.update(loss_err=l_err, grad_err=g_err, torch_loss_err=base_l, torch_grad_err=base_g,
                               ok=name == "liger" or (l_err <= 2 * base_l + 1e-6 and g_err <= 2 * base_g + 1e-9))
                    if row["ok"]:
                        def setup(name=name):
                            work.copy_(x)
                            return work.detach().requires_grad_(name == "liger")

                        tm = time_call(lambda w, fn=fn: fn(w, t), [], device, setup=setup)
                        row.update(_timing(tm, 2 * x.numel() * x.element_size()))
                except Exception as e:  # noqa: BLE001 -- a failing provider is a row, not the end of the probe
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
                _write(f, row)
                nan = float("nan")
                table.add_row(f"{n}x{v}", name, f"{row.get('ms', nan):.3f}", f"{row.get('gbps', 0):.0f}",
                              f"{row.get('loss_err', nan):.1e} / {base_l:.1e}",
                              f"{row.get('grad_err', nan):.1e} / {base_g:.1e}" + ("" if row.get("ok") else " WRONG"))
    console.print(table)


def bwd_table(out: str, meta: dict, shapes, copy: float, device) -> None:
    """The softmax backward (dx from y and dy) at `shapes` (bf16): softmax_bwd_smem against the chunked Triton
    backward (softmax_gluon.ROUTE off), each checked against fp64 on the first rows beside PyTorch's own bf16
    error, then timed; GB/s = two reads and one write."""
    from hearth.kernels.softmax import _softmax_bwd

    table = Table(title=f"softmax bwd, bf16 (device copy {copy:.0f} GB/s)")
    for col in ("shape", "provider", "ms", "GB/s (2 reads + write)", "max err (torch bf16)"):
        table.add_column(col)
    with open(out, "a") as f:
        for m, n in shapes:
            x = (torch.randn(m, n, device=device) * 3).to(torch.bfloat16)
            y = torch.softmax(x, -1)
            dy = torch.randn_like(y)
            yd, dyd = y[:64].double(), dy[:64].double()
            ref = yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
            xb = x[:64].clone().requires_grad_()
            torch.softmax(xb, -1).backward(dy[:64])
            base_err = (xb.grad.double() - ref).abs().max().item()

            for name, fn in (("smem-bwd", lambda a, b: sg.softmax_bwd_smem(a, b)),
                             ("hearth-triton", _unrouted(_softmax_bwd))):
                row = {"op": "softmax_bwd", "rows": m, "cols": n, "dtype": "bfloat16", "provider": name, **meta}
                try:
                    fn(y, dy)  # first call at the full shape (the Triton kernel picks its config here)
                    err = (fn(y[:64], dy[:64]).double() - ref).abs().max().item()
                    row.update(max_err=err, torch_err=base_err, ok=err <= 2 * base_err + 1e-9)
                    if row["ok"]:
                        t = time_call(lambda fn=fn: fn(y, dy), [], device)
                        row.update(_timing(t, 3 * y.numel() * y.element_size()))
                except Exception as e:  # noqa: BLE001 -- a failing provider is a row, not the end of the probe
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
                _write(f, row)
                nan = float("nan")
                table.add_row(f"{m}x{n}", name, f"{row.get('ms', nan):.3f}", f"{row.get('gbps', 0):.0f}",
                              f"{row.get('max_err', nan):.2e} ({base_err:.2e})" + ("" if row["ok"] else " WRONG"))
    console.print(table)


def pick_check(out: str, meta: dict, device, rows: int = 4096, n: int = 200000) -> None:
    """hearth's softmax at rows x n, its launch config picked (a) on a first call with 64 rows and (b) on a
    first call at the full shape, the pick cache emptied before each: with the row count's bucket in the
    pick's key the two match; with the width alone in it, (a) ran 4096 x 262144 at 3.06 ms against 1.59."""
    from hearth.kernels import _common

    x = (torch.randn(rows, n, device=device) * 3).to(torch.bfloat16)
    table = Table(title=f"hearth softmax {rows}x{n} bf16 by where its launch config was picked")
    for col in ("first call", "ms", "GB/s"):
        table.add_column(col)
    with open(out, "a") as f:
        for first in (64, rows):
            _common._PICKED.clear()
            unrouted = _unrouted(hearth_softmax)  # the Triton kernel and its pick (Hopper routes 200000 wide rows)
            unrouted(x[:first])
            tm = time_call(lambda: unrouted(x), [], device)
            gbps = 2 * x.numel() * x.element_size() / (tm.median_ms * 1e-3) / 1e9
            f.write(json.dumps({"op": "softmax_pick_check", "rows": rows, "cols": n, "first_rows": first,
                                "ms": tm.median_ms, "gbps": gbps, **meta}) + "\n")
            table.add_row(f"{first} rows", f"{tm.median_ms:.3f}", f"{gbps:.0f}")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ctas", default="8,16", help="extra cluster sizes to time beside config's pick")
    p.add_argument("--shapes", default=None, help="semicolon list of ROWSxCOLS (default: %s)" %
                   ";".join(f"{m}x{n}" for m, n in SHAPES))
    p.add_argument("--fwd-only-smem", action="store_true",
                   help="forward table: only smem (config's pick), hearth and compile (no register form, no variants)")
    p.add_argument("--no-pick-check", action="store_true")
    p.add_argument("--no-ce", action="store_true", help="skip the cross-entropy table")
    p.add_argument("--min-cols", type=int, default=None,
                   help="lower softmax_gluon.MIN_COLS for this run, so the shared-memory forms take rows that "
                        "softmax() keeps on its one-pass kernels (rows up to 32768: whether routing them would pay)")
    args = p.parse_args(argv)
    if args.min_cols is not None:
        sg.MIN_COLS = args.min_cols
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("softmax_cluster_probe needs a Hopper GPU (compute capability 9.x)")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(";")] if args.shapes else SHAPES
    device = torch.device("cuda")
    meta = {**env_info(device), "command": " ".join(["python", "scripts/gpu/softmax_cluster_probe.py",
                                                     *(sys.argv[1:] if argv is None else argv)])}
    copy = _copy_gbps(device)
    compiled = torch.compile(lambda t: torch.softmax(t, -1))
    table = Table(title=f"softmax fwd, bf16, GB/s (device copy {copy:.0f})")
    for col in ("shape", "provider", "ms", "GB/s", "% copy", "max err (torch bf16)", "extra MiB"):
        table.add_column(col)
    t0 = time.time()
    with open(args.out, "a") as f:
        for m, n in shapes:
            x = (torch.randn(m, n, device=device) * 3).to(torch.bfloat16)
            ref = torch.softmax(x[:64].double(), -1)
            base_err = (torch.softmax(x[:64], -1).double() - ref).abs().max().item()
            providers = [] if args.fwd_only_smem else [("cluster", lambda t: sg.softmax_fwd(t))]
            pick = sg.config(n)[0]
            if not args.fwd_only_smem:
                providers += [(f"cluster-{c}", lambda t, c=c: sg.softmax_fwd(t, ctas=c))
                              for c in map(int, args.ctas.split(",")) if c != pick]
            # the shared-memory form: smem_config's cluster size, the --ctas sizes, and 8 warps a CTA
            spick = sg.smem_config(n, x.element_size())[0]
            providers.append(("smem", lambda t: sg.softmax_fwd_smem(t)))
            if not args.fwd_only_smem:
                providers += [(f"smem-{c}", lambda t, c=c: sg.softmax_fwd_smem(t, ctas=c))
                              for c in map(int, args.ctas.split(",")) if c != spick]
                providers.append(("smem-w8", lambda t: sg.softmax_fwd_smem(t, warps=8)))
            providers += [("hearth", hearth_softmax), ("hearth-triton", _unrouted(hearth_softmax)),
                          ("compile", compiled)]
            for name, fn in providers:
                row = {"rows": m, "cols": n, "dtype": "bfloat16", "provider": name, **meta}
                if name.startswith("cluster"):
                    row["ctas"] = int(name.split("-")[1]) if "-" in name else pick
                if name.startswith("smem"):
                    row.update(form="smem", warps=8 if name == "smem-w8" else sg.SMEM_WARPS,
                               ctas=int(name.split("-")[1]) if name[5:].isdigit() else spick)
                try:
                    # first call at the full shape: hearth picks its launch config on its first call for a
                    # width and row-count bucket (pick_config); before the bucket joined the key, a pick made
                    # on the 64-row check slice was reused at 4096 rows (hearth timed 1.97 and 3.06 ms)
                    fn(x)
                    err = (fn(x[:64]).double() - ref).abs().max().item()
                    row.update(max_err=err, torch_err=base_err, ok=err <= 2 * base_err + 1e-6)
                    if row["ok"]:
                        t = time_call(lambda fn=fn, x=x: fn(x), [], device)
                        row.update(**_timing(t, 2 * x.numel() * x.element_size()),
                                   extra_mib=_peak_extra_mib(lambda fn=fn, x=x: fn(x), device))
                except Exception as e:  # noqa: BLE001 -- a failing provider is a row, not the end of the probe
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
                _write(f, row)
                err_text = f"{row.get('max_err', float('nan')):.2e} ({base_err:.2e})" + ("" if row["ok"] else " WRONG")
                nan = float("nan")
                table.add_row(f"{m}x{n}", name, f"{row.get('ms', nan):.3f}", f"{row.get('gbps', 0):.0f}",
                              f"{100 * row.get('gbps', 0) / copy:.0f}", err_text, f"{row.get('extra_mib', nan):.0f}")
    console.print(table)
    if not args.no_ce:
        ce_table(args.out, meta, copy, device, [int(c) for c in args.ctas.split(",")])
    bwd_table(args.out, meta, shapes, copy, device)
    if not args.no_pick_check:
        pick_check(args.out, meta, device)
    console.print(f"{time.time() - t0:.0f} s; rows appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
