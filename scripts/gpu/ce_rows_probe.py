"""GPU probe: cross_entropy's row kernel (ce_rows_, fwd+bwd in one in-place pass) at several launch configs,
across row counts, for the wide-vocabulary rule (_CE_WIDE_CONFIG and the row-count rule of _pick_rows_config).

    python scripts/gpu/ce_rows_probe.py --out DIR/ce_rows.jsonl        # H200, ~1-2 min
    python scripts/gpu/ce_rows_probe.py --smoke --out /tmp/ce_rows.jsonl   # tiny shapes (CPU interpreter; the GPU if there)

Why: linear_cross_entropy runs the row kernel on chunks of a few hundred rows (384 at V = 151936, 448 at
V = 128256), where 2 programs per SM (264 on an H200) leave the second wave of rows half empty. Each config is
(programs_per_SM, BLOCK, num_warps, num_stages); programs_per_SM 0 = one program per row. For each N x V and
config:
  1. correctness: the loss (mean over the rows) and the gradient of the first 64 rows against fp32 PyTorch;
  2. time: hearth.bench.timing.time_call (CUDA events, L2 flushed, median of >= 10 calls) of one ce_rows_ call
     (loss + gradient written over the logits, grad scale 1/N) on a fresh copy of the logits made outside the
     timed region; GB/s = read once + write once of the logits over the median;
and, where Liger-Kernel imports, its fused cross-entropy fwd+bwd at the same shape, timed the same way.
Prints a table, writes one JSON line per (shape, config) with the GPU name, versions and command.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported: the interpreter replaces @triton.jit at import time
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from hearth.bench.runner import env_info  # noqa: E402
from hearth.bench.timing import time_call  # noqa: E402
from hearth.kernels._common import next_power_of_2  # noqa: E402

ce = importlib.import_module("hearth.kernels.cross_entropy")
console = Console(width=160)

ROWS = [376, 384, 448, 512, 768, 1024, 4096, 16384]
VOCABS = [151936, 128256]
CONFIGS = [(2, 8192, 16, 3), (3, 4096, 8, 3), (4, 4096, 8, 3), (3, 8192, 8, 3), (4, 2048, 4, 3),
           (6, 2048, 4, 3), (3, 8192, 16, 2), (0, 4096, 8, 3), (0, 8192, 16, 3)]
SMOKE = ([7], [300], [(2, 128, 4, 1), (0, 64, 2, 1)])


def _liger():
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception:  # noqa: BLE001 -- absent or broken: the probe runs without the peer
        return None
    return liger_cross_entropy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--rows", default=None, help="comma list of row counts (default: %s)" % ",".join(map(str, ROWS)))
    p.add_argument("--vocabs", default=None, help="comma list of vocabularies (default: %s)" % ",".join(map(str, VOCABS)))
    p.add_argument("--configs", default=None,
                   help="semicolon list of programs_per_SM,BLOCK,num_warps,num_stages (default: the CONFIGS table)")
    args = p.parse_args(argv)
    rows_list, vocabs, configs = SMOKE if args.smoke else (ROWS, VOCABS, CONFIGS)
    if args.rows:
        rows_list = [int(x) for x in args.rows.split(",")]
    if args.vocabs:
        vocabs = [int(x) for x in args.vocabs.split(",")]
    if args.configs:
        configs = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";")]
        if any(len(c) != 4 for c in configs):
            p.error(f"--configs: each config is 4 integers, got {args.configs!r}")
    # --smoke: tiny shapes in fp32 on the CPU interpreter (CI), or on the GPU when one is there and the
    # interpreter is off (the GPU suite imports Triton before this script can ask for the interpreter)
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    device = torch.device("cuda" if not args.smoke or (torch.cuda.is_available() and not interpreting) else "cpu")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    liger = None if args.smoke else _liger()
    meta = {**env_info(device), "command": " ".join(["python", "scripts/gpu/ce_rows_probe.py", *(sys.argv[1:] if argv is None else argv)])}
    out_rows = []
    t0 = time.time()
    gen = torch.Generator(device=device).manual_seed(0)
    for v in vocabs:
        for n in rows_list:
            x_vals = (torch.randn(n, v, device=device, generator=gen) * 2).to(dtype)
            t = torch.randint(0, v, (n,), device=device, generator=gen)
            work = torch.empty_like(x_vals)
            k = min(64, n)
            ref_x = x_vals.float().requires_grad_()
            ref_loss = F.cross_entropy(ref_x, t)
            ref_loss.backward()
            ref_g, ref_l = ref_x.grad[:k].double(), float(ref_loss.detach())
            del ref_x
            kinds = [("liger", None)] if liger is not None else []
            kinds += [("rows", c) for c in configs]
            for kind, cfg in kinds:
                row = {"n": n, "v": v, "kind": kind, "config": list(cfg) if cfg else None,
                       "config_fields": "programs_per_sm,BLOCK,num_warps,num_stages", **meta}
                saved = ce._pick_rows_config
                try:
                    if kind == "rows":
                        ce._pick_rows_config = lambda logits, c=cfg: (c[0], min(c[1], next_power_of_2(logits.shape[1])), c[2], c[3])

                        def call(x):
                            ce.ce_rows_(x, t, grad_scale=1.0 / n)
                    else:
                        def call(x):
                            liger(x, t).backward()

                    def setup():
                        work.copy_(x_vals)
                        return work.detach().requires_grad_(kind == "liger")

                    # correctness on one fresh copy
                    x = setup()
                    if kind == "rows":
                        loss = float(ce.ce_rows_(x, t, grad_scale=1.0 / n).double().mean())
                        grad = x[:k].double()
                    else:
                        lv = liger(x, t)
                        lv.backward()
                        loss, grad = float(lv), x.grad[:k].double()
                    row["loss_err"] = abs(loss - ref_l)
                    row["grad_err"] = float((grad - ref_g).abs().max())
                    row["grad_scale"] = float(ref_g.abs().max())
                    # Liger returns the loss in bf16: half a bf16 ulp of the loss joins its bound
                    loss_bound = 2e-2 + (abs(ref_l) * 2.0**-8 if kind == "liger" else 0.0)
                    row["ok"] = row["grad_err"] <= 2e-2 * row["grad_scale"] + 1e-6 and row["loss_err"] <= loss_bound
                    timing = time_call(call, [], device, setup=setup)
                    row.update(median_ms=timing.median_ms, p20_ms=timing.p20_ms, p80_ms=timing.p80_ms, reps=timing.n,
                               gb_s=2 * n * v * x_vals.element_size() / (timing.median_ms * 1e-3) / 1e9)
                except Exception as e:  # noqa: BLE001 -- a config that fails is a result too
                    row.update(ok=False, error=f"{type(e).__name__}: {e}"[:400])
                finally:
                    ce._pick_rows_config = saved
                out_rows.append(row)
            x_vals = work = None  # free the logits before the next shape (the closures above are done with them)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            console.print(f"{n} x {v} done ({time.time() - t0:.0f} s)")
    table = Table(title=f"ce_rows_ fwd+bwd, {dtype} ({meta.get('gpu')})")
    for c in ("N x V", "kind", "config", "median ms", "p20-p80", "GB/s", "grad err/scale", "ok"):
        table.add_column(c)
    for r in out_rows:
        table.add_row(f"{r['n']} x {r['v']}", r["kind"], str(r["config"]), f"{r.get('median_ms', float('nan')):.3f}",
                      f"{r.get('p20_ms', float('nan')):.3f}-{r.get('p80_ms', float('nan')):.3f}",
                      f"{r.get('gb_s', 0):.0f}", f"{r.get('grad_err', float('nan')):.1e}/{r.get('grad_scale', float('nan')):.1e}",
                      "yes" if r.get("ok") else f"NO {r.get('error', '')[:60]}")
    console.print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for r in out_rows:
            f.write(json.dumps(r) + "\n")
    console.print(f"{len(out_rows)} rows in {time.time() - t0:.1f} s, wrote {out}")
    return 0 if all(r.get("ok") for r in out_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
