"""`python -m hearth.bench ...`: the same options as `hearth bench`, parsed with argparse.

For GPU machines without pydantic: recent typer versions import pydantic to coerce options, so
scripts/gpu/bench_all.sh calls this entry point instead of the typer CLI. The behaviour lives in
hearth.bench.runner.main; both front ends only parse arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse(argv: list[str]) -> dict:
    """Keyword arguments for runner.main from a command line; argparse exits 2 on bad input."""
    p = argparse.ArgumentParser(prog="python -m hearth.bench", description="Benchmark hearth's kernels against fused peers.")
    p.add_argument("ops", nargs="*", help="ops to run, or 'all' (default: all)")
    p.add_argument("--dtype", action="append", dest="dtypes", help="bfloat16, float16, float32 (repeatable)")
    p.add_argument("--mode", action="append", dest="modes", help="fwd, bwd or full (repeatable)")
    p.add_argument("--providers", action="append", help="hearth, eager, compile, liger, quack, vendor, ... (repeatable)")
    p.add_argument("--sizes", default=None, help="headline | models | sweep | small | goal (attention) | comma list of the op's size knob")
    p.add_argument("--out", type=Path, default=Path("benchmarks/latest"))
    p.add_argument("--check", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    p.add_argument("--report-only", action="store_true", help="rebuild reports from OUT/results.jsonl (+ --merge)")
    p.add_argument("--merge", action="append", type=Path, help="folder whose results.jsonl is merged (repeatable)")
    p.add_argument("--no-report", action="store_true", help="write results.jsonl only (build reports later with --report-only)")
    p.add_argument("--budget-s", type=float, default=None, help="seconds at most per op")
    p.add_argument("--total-budget-s", type=float, default=450.0, help="seconds for the whole run")
    a = p.parse_args(argv)
    return dict(ops=a.ops or None, dtypes=a.dtypes, modes=a.modes, providers=a.providers, sizes=a.sizes, out=a.out,
                check=a.check, report_only=a.report_only, merge=a.merge, budget_s=a.budget_s, total_budget_s=a.total_budget_s,
                write_report=not a.no_report)


if __name__ == "__main__":
    from hearth.bench.runner import main

    sys.exit(main(**parse(sys.argv[1:])))
