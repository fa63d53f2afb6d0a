"""GPU probe: is pick_config's choice for rms_norm's backward stable, and is it the fastest in the whole op?

    python scripts/gpu/pick_stability_probe.py --out DIR/pick_stability.jsonl            # H200, about a minute
    python scripts/gpu/pick_stability_probe.py --smoke --out /tmp/pick_stability.jsonl  # tiny shapes (CPU: no picks)

Why (issue 17): the model-shape suite measured rms_norm fwd+bwd at Qwen3-1.7B 2048 x 16384 at 0.1036 ms in one
process and 0.1198 in another. Either the picker (pick_config: blocks of launches of each candidate, interleaved
rounds, median) ranks the backward's candidates differently from one pick to the next, or its ranking (the kernel
alone, on the same arguments again and again) is not the ranking of the whole op as the bench times it. For each
shape this probe
  1. lets the op pick (its first call), then drops the backward's pick and picks again, --repicks times, recording
     every pick's per-candidate times and winner (how often the winner changes, and by how much it was ahead);
  2. forces each backward candidate in turn (its entry in the pick cache) and times the whole op, forward + backward,
     with the bench's own timing (hearth.bench.timing.time_call: CUDA events, L2 flushed, median), twice, in
     interleaved passes over the candidates;
and prints, per shape, the picker's winners against the op's fastest candidate. One JSON line per (shape, candidate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported: the interpreter replaces @triton.jit at import time
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from hearth.bench.runner import env_info  # noqa: E402
from hearth.bench.timing import time_call  # noqa: E402
from hearth.kernels import _common  # noqa: E402
from hearth.kernels.rms_norm import rms_norm  # noqa: E402

SHAPES = {  # name: (rows M, width N), the model-shape suite's rms_norm cases
    "Qwen3-0.6B": (65536, 1024), "Qwen3-1.7B": (16384, 2048), "Qwen3-4B": (12289, 2560),
    "Llama-3.1-8B": (16384, 4096), "Qwen3-14B": (12289, 5120), "Llama-3.1-70B": (4096, 8192),
}
SMOKE_SHAPES = {"smoke": (8, 64)}


def _bwd_key() -> tuple | None:
    keys = [k for k in _common._PICKED if k[0][0] == "rms_norm_bwd"]
    return keys[-1] if keys else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
    ap.add_argument("--repicks", type=int, default=4)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = SMOKE_SHAPES if args.smoke else {n: SHAPES[n] for n in args.shapes.split(",")}
    env = env_info(device) | {"probe": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    picks: list = []
    real = _common._time_candidates

    def recording(candidates, launch, *a, **kw):
        timed = real(candidates, launch, *a, **kw)
        picks.append((tuple(candidates), list(timed)))
        return timed

    _common._time_candidates = recording
    console = Console()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for name, (m, n) in shapes.items():
            torch.manual_seed(0)
            x = torch.randn(m, n, device=device, dtype=torch.bfloat16, requires_grad=True)
            w = (1 + 0.1 * torch.randn(n, device=device, dtype=torch.bfloat16)).requires_grad_()
            dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)

            def call():
                rms_norm(x, w).backward(dy)

            picks.clear()
            call()
            key = _bwd_key()
            if key is None:  # CPU / interpreter: the default, no pick
                console.print(f"{name}: no pick on {device.type}")
                continue
            winners = []
            for r in range(args.repicks + 1):
                if r:
                    del _common._PICKED[key]
                    picks.clear()
                    call()
                bwd = [p for p in picks if p[0] == key[1]]
                timed = bwd[-1][1] if bwd else []
                winners.append((_common._PICKED[key], timed))
            cands = key[1]
            op_ms: dict = {c: [] for c in cands}
            for _ in range(2):  # two interleaved passes
                for c in cands:
                    _common._PICKED[key] = c
                    try:
                        op_ms[c].append(time_call(call, [x, w], device).median_ms)
                    except Exception as e:  # a candidate that does not launch here
                        op_ms[c].append(type(e).__name__)
            ok = {c: min(v) for c, v in op_ms.items() if all(isinstance(t, float) for t in v)}
            best = min(ok, key=ok.get)
            table = Table(title=f"rms_norm fwd+bwd {name} {n} x {m}: op ms per backward candidate, picker's ms per pick")
            table.add_column("candidate")
            table.add_column("op ms (2 passes)")
            for r in range(len(winners)):
                table.add_column(f"pick {r}")
            for i, c in enumerate(cands):
                row = [str(c) + (" <- op's fastest" if c == best else ""),
                       " / ".join(f"{t:.4f}" if isinstance(t, float) else t for t in op_ms[c])]
                for won, timed in winners:
                    t = timed[i] if i < len(timed) else None
                    row.append(("*" if won == c else "") + (f"{t:.4f}" if isinstance(t, float) else str(t)))
                table.add_row(*row)
                f.write(json.dumps({"shape": name, "M": m, "N": n, "candidate": list(c), "op_ms": op_ms[c],
                                    "picker_ms": [timed[i] if i < len(timed) else None for _, timed in winners],
                                    "picked": [won == c for won, _ in winners], "op_fastest": c == best,
                                    "env": env}) + "\n")
            console.print(table)
            won_ms = [ok.get(won) for won, _ in winners]
            console.print(f"PICKS {name}: winners' op ms {[round(t, 4) if t else t for t in won_ms]} "
                          f"vs fastest {ok[best]:.4f} ({best})")
            torch.cuda.empty_cache()
    _common._time_candidates = real
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
