"""Write the gateway benchmark's results: JSONL (every row + environment), Markdown tables, a PNG plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

DIRECT = "aiohttp direct"


def _f(x, nd=2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _overheads(load: list[dict]) -> None:
    base = {r["concurrency"]: r for r in load if r["row"] == DIRECT}
    for r in load:
        b = base.get(r["concurrency"])
        if b and r["row"] != DIRECT:
            r["overhead_p50_ms"] = r["p50_ms"] - b["p50_ms"]
            r["overhead_p99_ms"] = r["p99_ms"] - b["p99_ms"]


def _verdicts(load: list[dict], faults: list[dict]) -> list[str]:
    """Plain statements computed from the rows (no claim that the data does not support)."""
    out = []
    by = {(r["row"], r["concurrency"]): r for r in load}
    top = max((r["concurrency"] for r in load), default=None)
    hx, ah = by.get(("httpx direct", top)), by.get((DIRECT, top))
    if hx and ah:
        better = "aiohttp" if ah["req_s"] > hx["req_s"] else "httpx"
        out.append(f"Client at {top} concurrent: aiohttp {ah['req_s']:.0f} req/s, p99 {ah['p99_ms']:.1f} ms; "
                   f"httpx {hx['req_s']:.0f} req/s, p99 {hx['p99_ms']:.1f} ms -> {better} is faster here "
                   f"(hearth's transport uses aiohttp).")
    for name in ("hearth chain (in process)", "hearth gateway (aiohttp.web)"):
        for c in sorted({r["concurrency"] for r in load}):
            r = by.get((name, c))
            if r and "overhead_p50_ms" in r:
                out.append(f"{name} at {c} concurrent: overhead p50 {r['overhead_p50_ms']:+.2f} ms, "
                           f"p99 {r['overhead_p99_ms']:+.2f} ms, {r['req_s']:.0f} req/s.")
    hg, fa = by.get(("hearth gateway (aiohttp.web)", top)), by.get(("fastapi gateway (same chain)", top))
    if hg and fa:
        out.append(f"Server at {top} concurrent: aiohttp.web {hg['req_s']:.0f} req/s vs FastAPI+uvicorn "
                   f"{fa['req_s']:.0f} req/s (p99 {hg['p99_ms']:.1f} vs {fa['p99_ms']:.1f} ms).")
    lr = by.get(("LiteLLM Router (in process)", top))
    ch = by.get(("hearth chain (in process)", top))
    if lr and ch and lr["req_s"]:
        out.append(f"In process at {top} concurrent: hearth chain {ch['req_s']:.0f} req/s vs LiteLLM Router "
                   f"{lr['req_s']:.0f} req/s ({ch['req_s'] / lr['req_s']:.1f}x).")
    for r in faults:
        if r.get("cost_over_timeout_p50_ms") is not None and r["system"] == "hearth" and "breaker off" in r["row"]:
            out.append(f"{r['row']}: a hang costs the timeout + {r['cost_over_timeout_p50_ms']:.1f} ms (p50).")
    return out


def write_reports(rows: list[dict], env: dict, args: dict, out: Path) -> None:
    load = [r for r in rows if r["section"] == "load"]
    faults = [r for r in rows if r["section"] == "fault"]
    _overheads(load)
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in args.items()}
    with (out / "results.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps({**r, "env": env, "args": args}) + "\n")

    md = ["# Gateway benchmark (loopback)", "",
          f"Date {env['date']}, Python {env['python']}, {env['cpus']} CPUs, load average at start {env['load_avg_1m']:.2f}; "
          f"aiohttp {env['aiohttp']}, httpx {env['httpx']}, fastapi {env['fastapi']}, uvicorn {env['uvicorn']}, "
          f"litellm {env['litellm']}. Arguments: `{json.dumps({k: args[k] for k in ('quick', 'requests', 'concurrency', 'fault_requests', 'hang_timeout_s', 'cold_s')})}`.",
          "", "Produced by `benchmarks/gateway/bench_gateway.py`; the upstream is tests/fakes' FakeOpenAI in its own process.",
          "Overhead = row minus aiohttp direct at the same concurrency. Client CPU is the load generator's process "
          "(for in-process rows it includes the chain's or router's own work); server CPU is the gateway process.", "",
          "## Load", "",
          "| row | concurrency | requests | errors | p50 ms | p99 ms | overhead p50 ms | overhead p99 ms | req/s | client CPU ms/req | server CPU ms/req |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in load:
        md.append(f"| {r['row']} | {r['concurrency']} | {r['requests']} | {r['errors']} | {_f(r['p50_ms'])} | {_f(r['p99_ms'])} | "
                  f"{_f(r.get('overhead_p50_ms'))} | {_f(r.get('overhead_p99_ms'))} | {r['req_s']:.0f} | "
                  f"{_f(r['client_cpu_ms_per_req'])} | {_f(r.get('server_cpu_ms_per_req'))} |")
    if faults:
        md += ["", "## Faults (sequential requests)", "",
               "| scenario | system | requests | timeout ms | first ms | p50 ms | max ms | cost over timeout p50 ms | answered by |",
               "|---|---|---|---|---|---|---|---|---|"]
        for r in faults:
            md.append(f"| {r['row']} | {r['system']} | {r['requests']} | {_f(r['timeout_ms'], 0)} | {_f(r['first_ms'], 1)} | "
                      f"{_f(r['p50_ms'], 1)} | {_f(r['max_ms'], 1)} | {_f(r.get('cost_over_timeout_p50_ms'), 1)} | "
                      f"{', '.join(f'{k}: {v}' for k, v in r['answered_by'].items())} |")
    md += ["", "## What the rows say", ""] + [f"- {v}" for v in _verdicts(load, faults)]
    (out / "results.md").write_text("\n".join(md) + "\n")
    _plot(load, faults, out / "results.png", env)


def _plot(load: list[dict], faults: list[dict], path: Path, env: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["row"] for r in load))
    concs = sorted({r["concurrency"] for r in load})
    by = {(r["row"], r["concurrency"]): r for r in load}
    fig, axes = plt.subplots(1, 3 if faults else 2, figsize=(18 if faults else 12, 5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(concs))]
        axes[0].bar(xs, [by.get((name, c), {}).get("req_s", 0) for c in concs], width, label=name)
        axes[1].bar(xs, [by.get((name, c), {}).get("p99_ms", 0) for c in concs], width, label=name)
    for ax, title in ((axes[0], "throughput (req/s, higher is better)"), (axes[1], "p99 latency (ms, log, lower is better)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(concs))], [f"c={c}" for c in concs])
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    if faults:
        labels = [f"{r['row']}\n({r['system']})" for r in faults]
        axes[2].barh(labels, [r["p50_ms"] for r in faults], label="p50")
        axes[2].barh(labels, [r["max_ms"] - r["p50_ms"] for r in faults], left=[r["p50_ms"] for r in faults],
                     alpha=0.4, label="max")
        axes[2].set_xscale("log")
        axes[2].set_title("fault scenarios (ms, log)")
        axes[2].tick_params(axis="y", labelsize=7)
        axes[2].legend(fontsize=7)
    fig.suptitle(f"hearth gateway on loopback, {env['cpus']} CPUs, {env['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
