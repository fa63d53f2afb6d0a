"""GPU probe: what a pick costs the first call at a new key, with pick_config's holds and without them.

    python scripts/gpu/pick_cost_probe.py --out DIR/pick_cost.jsonl            # H200, well under a minute
    python scripts/gpu/pick_cost_probe.py --smoke --out /tmp/pick_cost.jsonl  # tiny shapes (CPU: no picks)

Each timed pick times its candidates in blocks of launches; since 1905dca each block waits behind a GPU hold of
about twice the host's queueing time of the block (at most 5 ms, `_common._hold_ms`). This probe measures what that
adds. For each op and shape it calls the op once (compiles and picks), then, --reps times, empties the pick cache
and calls it again, timing the call on the host (synchronised before and after): the kernels are compiled by then,
so the difference from a call with the cache full is the picks' cost (rope's launch plans, which keep their
pick, are emptied too). Run once with the holds and once with
`_hold_ms` returning 0 (a 1-cycle hold: the picker as it was before), interleaved. One JSON line per (op, holds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported: the interpreter replaces @triton.jit at import time
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from hearth.bench.runner import env_info  # noqa: E402
from hearth.kernels import _common  # noqa: E402
from hearth.kernels.rms_norm import rms_norm  # noqa: E402
from hearth.kernels.rope import rope  # noqa: E402
from hearth.kernels.softmax import softmax  # noqa: E402
from hearth.kernels.swiglu import swiglu  # noqa: E402

rope_mod = sys.modules["hearth.kernels.rope"]  # the module (hearth.kernels.rope names the function)


def cases(device, smoke: bool) -> dict:
    """name: a fwd+bwd call on fixed tensors (model shapes; tiny under --smoke)."""
    bf = dict(device=device, dtype=torch.float32 if smoke else torch.bfloat16)
    m, n = (8, 64) if smoke else (16384, 2048)
    x = torch.randn(m, n, **bf, requires_grad=True)
    w = torch.ones(n, **bf, requires_grad=True)
    dy = torch.randn(m, n, **bf)
    sm_m, sm_n = (8, 64) if smoke else (4096, 32000)
    s = torch.randn(sm_m, sm_n, **bf, requires_grad=True)
    sdy = torch.randn(sm_m, sm_n, **bf)
    g_m, g_n = (8, 64) if smoke else (4096, 14336)
    gate = torch.randn(g_m, g_n, **bf, requires_grad=True)
    up = torch.randn(g_m, g_n, **bf, requires_grad=True)
    gdy = torch.randn(g_m, g_n, **bf)
    b, hq, hk, t, d = (1, 4, 2, 8, 16) if smoke else (2, 40, 8, 2048, 128)
    q = torch.randn(b, t, hq, d, **bf).transpose(1, 2).requires_grad_()  # Hugging Face layout
    k = torch.randn(b, t, hk, d, **bf).transpose(1, 2).requires_grad_()
    ang = torch.randn(b, t, d, device=device, dtype=torch.float32)
    cos, sin = ang.cos().to(bf["dtype"]), ang.sin().to(bf["dtype"])
    qdy, kdy = torch.randn_like(q), torch.randn_like(k)
    return {
        f"rms_norm {m}x{n}": lambda: rms_norm(x, w).backward(dy),
        f"softmax {sm_m}x{sm_n}": lambda: softmax(s).backward(sdy),
        f"swiglu {g_m}x{g_n}": lambda: swiglu(gate, up).backward(gdy),
        f"rope B{b} {hq}/{hk} T{t} d{d}": lambda: torch.autograd.backward(rope(q, k, cos, sin), (qdy, kdy)),
    }


def forget() -> None:
    """Empty the pick cache, and rope's launch plans, which keep their layout's pick."""
    _common._PICKED.clear()
    rope_mod._PLANS.clear()


def timed(call, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = env_info(device) | {"probe": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    real_hold_ms = _common._hold_ms
    console = Console()
    table = Table(title="first call at a new key: ms on the host (median), picks' count")
    for col in ("op", "cached call", "with holds", "without holds", "picks"):
        table.add_column(col)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for name, call in cases(device, args.smoke).items():
            forget()
            call()  # compiles every candidate, picks
            picks = len(_common._PICKED)
            cached = statistics.median(timed(call, device) for _ in range(max(3, args.reps)))
            ms: dict = {True: [], False: []}
            for _ in range(args.reps):
                for holds in (True, False):
                    _common._hold_ms = real_hold_ms if holds else (lambda reps, host: 0.0)
                    forget()
                    try:
                        ms[holds].append(timed(call, device))
                    finally:
                        _common._hold_ms = real_hold_ms
            med = {h: statistics.median(v) for h, v in ms.items()}
            for holds in (True, False):
                f.write(json.dumps({"op": name, "holds": holds, "first_call_ms": ms[holds], "median_ms": med[holds],
                                    "cached_call_ms": cached, "picks": picks, "env": env}) + "\n")
            table.add_row(name, f"{cached:.2f}", f"{med[True]:.1f}", f"{med[False]:.1f}", str(picks))
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
