"""Gateway benchmark: overhead, throughput and fault costs of hearth's chain, on loopback only.

    python benchmarks/gateway/bench_gateway.py                 # full run (lead, on a quiet machine)
    python benchmarks/gateway/bench_gateway.py --quick         # smoke run: small counts, short timeouts

Bounded: at most --requests per row and --time-limit-s per row; everything on 127.0.0.1.

Load rows (each: N requests at concurrency C in {1, 50, 500}; upstream = FakeOpenAI in its own process):
    aiohttp direct        client -> upstream, aiohttp.ClientSession (the fastest direct client)
    httpx direct          client -> upstream, httpx.AsyncClient
    hearth chain          Chain.complete in the client process (the library API the app uses)
    hearth gateway        client -> `hearth gateway` (aiohttp.web, own process) -> upstream
    fastapi gateway       client -> the same Chain behind FastAPI + uvicorn (own process) -> upstream
    litellm router        Router.acompletion in the load generator's process (LiteLLM, imported only by
                          this benchmark, never by hearth or CI). LiteLLM's rows (load and faults) run in a
                          child process: once LiteLLM ran, its background threads slowed every later
                          measurement in the same process.
Per row: p50 / p99 latency (ms), req/s, client CPU ms per request (the load generator's process; for
in-process rows it includes the chain's or router's own work) and server CPU ms per request (gateway
process, HTTP rows only). Overhead = row p50/p99 minus aiohttp direct at the same concurrency.

Fault rows (sequential requests; primary and hosted are FakeOpenAIs in threads; hearth's chain and
LiteLLM's Router each with the same timeout T and no retries):
    hung primary          primary never answers; timeout T; cost over T is the chain's overhead
    500 primary           primary answers 500; hearth cools it down after 3 failures
    cold fine-tune        primary (scale_to_zero) is cold for --cold-s seconds, then serves; requests
                          are spread over 2 x cold-s; who answered and what the first one cost

Writes results.jsonl, results.md and results.png next to this file (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch LiteLLM's cost map from the internet

from servers import CHAT_JSON, cpu_seconds, start_gateway, start_upstream  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say hello in the envelope."}]
BODY = {"model": "fake-model", "messages": MESSAGES}


# ---------------------------------------------------------------------------------------- load
async def _drive(call, n: int, concurrency: int, time_limit_s: float, progress=None, task=None) -> dict:
    """Run `call()` n times with `concurrency` workers; stop issuing after time_limit_s."""
    latencies: list[float] = []
    errors = 0
    issued = 0
    stop_at = time.monotonic() + time_limit_s

    async def worker() -> None:
        nonlocal issued, errors
        while issued < n and time.monotonic() < stop_at:
            issued += 1
            t0 = time.perf_counter()
            try:
                await call()
            except Exception:  # counted and reported: a benchmark row with errors is not a result
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if progress is not None:
                progress.advance(task)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    latencies.sort()
    done = len(latencies)

    def pct(q: float) -> float:
        return latencies[min(done - 1, int(q * done))] * 1e3 if done else float("nan")

    return {"requests": done, "errors": errors, "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(latencies) * 1e3 if done else float("nan"),
            "req_s": done / wall if wall else 0.0, "client_cpu_ms_per_req": cpu / max(done, 1) * 1e3,
            "wall_s": wall}


def _aiohttp_caller(base_url: str, concurrency: int):
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))
    url = base_url + "/chat/completions"

    async def call() -> None:
        async with session.post(url, json=BODY) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            await r.read()

    return call, session.close


def _httpx_caller(base_url: str, concurrency: int):
    import httpx

    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
                               timeout=120)
    url = base_url + "/chat/completions"

    async def call() -> None:
        r = await client.post(url, json=BODY)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}")

    return call, client.aclose


def _chain_config(upstream: str, **provider_extra):
    from hearth.gateway.config import config_from_dict

    p = {"name": "upstream", "base_url": upstream, "model": "fake-model",
         "timeouts": {"connect_s": 10, "first_token_s": 60, "total_s": 120}, **provider_extra}
    return config_from_dict({"gateway": {"deadline_s": 120, "max_connections": 2048}, "providers": [p]}, {})


async def _chain_caller(upstream: str, concurrency: int):
    from hearth.gateway.chain import Chain

    chain = await Chain(_chain_config(upstream)).start()

    async def call() -> None:
        await chain.complete(MESSAGES, kind="chat")

    return call, chain.aclose


def _litellm_router(model_list, **kw):
    import litellm
    from litellm import Router

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return Router(model_list=model_list, **kw)


def _litellm_deployment(name: str, base_url: str, timeout: float) -> dict:
    return {"model_name": name, "litellm_params": {"model": "openai/fake-model", "api_base": base_url,
                                                   "api_key": "sk-bench", "timeout": timeout}}


async def _litellm_caller(upstream: str, concurrency: int):
    router = _litellm_router([_litellm_deployment("hearth", upstream, 120)], num_retries=0)

    async def call() -> None:
        await router.acompletion(model="hearth", messages=MESSAGES)

    return call, (lambda: asyncio.sleep(0))


async def load_rows(args, work: Path, progress) -> list[dict]:
    rows: list[dict] = []
    up_proc, upstream = start_upstream(work)
    config = work / "gateway.toml"
    config.write_text(
        "[gateway]\ndeadline_s = 120.0\nmax_connections = 2048\n[[providers]]\nname = \"upstream\"\n"
        f"base_url = \"{upstream}\"\nmodel = \"fake-model\"\n"
        "[providers.timeouts]\nconnect_s = 10.0\nfirst_token_s = 60.0\ntotal_s = 120.0\n")
    gateways = {}
    try:
        for kind in ("hearth", "fastapi"):
            if kind in args.rows:
                gateways[kind] = start_gateway(kind, config, work)
        for client in args.rows:
            for c in args.concurrency:
                n = max(args.requests, c)
                task = progress.add_task(f"{client:>16} c={c:<4}", total=n)
                if client == "aiohttp":
                    call, close = _aiohttp_caller(upstream, c)
                elif client == "httpx":
                    call, close = _httpx_caller(upstream, c)
                elif client == "chain":
                    call, close = await _chain_caller(upstream, c)
                elif client == "litellm":
                    call, close = await _litellm_caller(upstream, c)
                else:
                    call, close = _aiohttp_caller(gateways[client][1], c)
                server_pid = gateways[client][0].pid if client in gateways else None
                s0 = cpu_seconds(server_pid) if server_pid else None
                await _drive(call, min(n, max(c, 20)), c, args.time_limit_s)   # warm-up: pools, imports
                if server_pid:
                    s0 = cpu_seconds(server_pid)
                r = await _drive(call, n, c, args.time_limit_s, progress, task)
                if server_pid:
                    r["server_cpu_ms_per_req"] = (cpu_seconds(server_pid) - s0) / max(r["requests"], 1) * 1e3
                await close()
                rows.append({"section": "load", "row": LABELS[client], "concurrency": c, **r})
                progress.update(task, description=f"{client:>16} c={c:<4} p50 {r['p50_ms']:.2f} ms")
    finally:
        for proc, _ in gateways.values():
            proc.stop()
        up_proc.stop()
    return rows


LABELS = {"aiohttp": "aiohttp direct", "httpx": "httpx direct", "chain": "hearth chain (in process)",
          "hearth": "hearth gateway (aiohttp.web)", "fastapi": "fastapi gateway (same chain)",
          "litellm": "LiteLLM Router (in process)"}


# ---------------------------------------------------------------------------------------- faults
async def fault_rows(args, progress) -> list[dict]:
    from hearth.gateway.chain import Chain
    from hearth.gateway.config import config_from_dict
    from tests.fakes.openai_server import Behavior, FakeOpenAI

    T = args.hang_timeout_s
    rows = []
    hosted = FakeOpenAI(Behavior.reply(CHAT_JSON), model="hosted-model").start_in_thread()

    def hearth_cfg(primary: dict, **gw) -> object:
        hp = {"name": "hosted", "base_url": hosted.base_url, "model": "m"}
        return config_from_dict({"gateway": {"deadline_s": 4 * T + 5, **gw}, "providers": [primary, hp]}, {})

    async def run(label: str, system: str, call, n: int, spacing_s: float = 0.0, timeout_s: float = 0.0) -> None:
        task = progress.add_task(f"{label[:28]:>28} {system}", total=n)
        lat, who = [], []
        for i in range(n):
            t0 = time.perf_counter()
            try:
                who.append(await call())
            except Exception as exc:  # reported in the row
                who.append(f"error:{type(exc).__name__}")
            lat.append((time.perf_counter() - t0) * 1e3)
            progress.advance(task)
            if spacing_s:
                await asyncio.sleep(spacing_s)
        row = {"section": "fault", "row": label, "system": system, "requests": n, "first_ms": lat[0],
               "p50_ms": statistics.median(lat), "max_ms": max(lat), "timeout_ms": timeout_s * 1e3,
               "answered_by": {k: who.count(k) for k in dict.fromkeys(who)}}
        if timeout_s:
            row["cost_over_timeout_p50_ms"] = statistics.median(x - timeout_s * 1e3 for x in lat if x >= timeout_s * 1e3) \
                if any(x >= timeout_s * 1e3 for x in lat) else 0.0
        rows.append(row)

    def primary(server, **extra) -> dict:
        return {"name": "primary", "base_url": server.base_url, "model": "m",
                "timeouts": {"connect_s": T, "first_token_s": T, "total_s": T + 1}, **extra}

    async def hearth_call(chain):
        return (await chain.complete(MESSAGES, kind="chat")).provider

    def litellm_call(router):
        async def call():
            r = await router.acompletion(model="primary", messages=MESSAGES)
            return "hosted" if "hosted-model" in str(r.model) else "primary"  # the fakes name their model
        return call

    def litellm_for(server, **kw):
        return _litellm_router([_litellm_deployment("primary", server.base_url, T),
                                _litellm_deployment("hosted", hosted.base_url, 30)],
                               fallbacks=[{"primary": ["hosted"]}], num_retries=0, **kw)

    systems = ["litellm"] if args.rows == ["litellm"] else ["hearth"]
    try:
        for system in systems:
            # 1. hung primary
            with FakeOpenAI(Behavior.hang()) as hung:
                if system == "hearth":
                    for label, gw in (("hung primary (breaker off)", {"breaker_failures": 1_000_000}),
                                      ("hung primary (breaker 3)", {"breaker_failures": 3, "cooldown_s": 60})):
                        async with Chain(hearth_cfg(primary(hung), **gw)) as chain:
                            await run(label, "hearth", lambda: hearth_call(chain), args.fault_requests, timeout_s=T)
                else:
                    await run("hung primary", "litellm", litellm_call(litellm_for(hung)), args.fault_requests, timeout_s=T)
            # 2. failing primary
            with FakeOpenAI(Behavior.status(500)) as failing:
                if system == "hearth":
                    async with Chain(hearth_cfg(primary(failing), breaker_failures=3, cooldown_s=60)) as chain:
                        await run("500 primary (breaker 3)", "hearth", lambda: hearth_call(chain), args.fault_requests)
                else:
                    await run("500 primary", "litellm", litellm_call(litellm_for(failing)), args.fault_requests)
            # 3. cold fine-tune: health and chat wait until ready_at (a cold start), then answer at once
            ready_at = time.monotonic() + args.cold_s

            def wait_left() -> float:
                return max(0.0, ready_at - time.monotonic())

            with FakeOpenAI(lambda body: Behavior.reply(CHAT_JSON, delay_s=wait_left()),
                            health=lambda: Behavior.raw(b'{"status":"ok"}', delay_s=wait_left())) as cold:
                spacing = 2 * args.cold_s / args.fault_requests
                if system == "hearth":
                    ft = primary(cold, scale_to_zero=True, health_url=cold.health_url,
                                 warm={"ttl_s": 5, "warmup_budget_s": args.cold_s + 30,  # default probe_timeout_s
                                       "warmup_poll_s": 0.5, "warmup_request_timeout_s": args.cold_s + 30})
                    async with Chain(hearth_cfg(ft)) as chain:
                        await run("cold fine-tune", "hearth", lambda: hearth_call(chain), args.fault_requests, spacing)
                else:
                    await run("cold fine-tune", "litellm", litellm_call(litellm_for(cold)), args.fault_requests, spacing)
    finally:
        hosted.stop()
    return rows


# ---------------------------------------------------------------------------------------- main
def environment() -> dict:
    def v(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
            **{pkg: v(pkg) for pkg in ("aiohttp", "httpx", "fastapi", "uvicorn", "litellm")}}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts and short timeouts (smoke run)")
    ap.add_argument("--requests", type=int, default=None, help="requests per load row, at least the concurrency (2000; --quick 200)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 50, 500])
    ap.add_argument("--rows", nargs="+", default=list(LABELS), choices=list(LABELS))
    ap.add_argument("--time-limit-s", type=float, default=60.0, help="stop issuing requests in a row after this")
    ap.add_argument("--fault-requests", type=int, default=None, help="requests per fault row (20; --quick 6)")
    ap.add_argument("--hang-timeout-s", type=float, default=None, help="hung provider's timeout (1.0; --quick 0.3)")
    ap.add_argument("--cold-s", type=float, default=None, help="cold-start length (4.0; --quick 1.0)")
    ap.add_argument("--skip-faults", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--emit", type=Path, help=argparse.SUPPRESS)  # child mode: write rows as JSON here
    args = ap.parse_args(argv)
    defaults = ((200, 6, 0.3, 1.0) if args.quick else (2000, 20, 1.0, 4.0))
    for name, value in zip(("requests", "fault_requests", "hang_timeout_s", "cold_s"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.time_limit_s = min(args.time_limit_s, 20.0)
    if args.requests < 1 or args.fault_requests < 1 or args.hang_timeout_s <= 0 or args.cold_s <= 0:
        ap.error("--requests, --fault-requests, --hang-timeout-s and --cold-s must be positive")
    return args


async def amain(args) -> list[dict]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with tempfile.TemporaryDirectory(prefix="hearth-gw-bench-") as tmp, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        rows = await load_rows(args, Path(tmp), progress)
        if not args.skip_faults:
            rows += await fault_rows(args, progress)
    return rows


def _litellm_in_child(args) -> list[dict]:
    """LiteLLM's rows in a separate process: once imported and run, LiteLLM's background threads and
    tasks slow every later measurement in the process (seen: +0.7 s on a 0.3 s timeout), so it must
    not share one with hearth's rows."""
    with tempfile.TemporaryDirectory(prefix="hearth-gw-litellm-") as tmp:
        emit = Path(tmp) / "rows.json"
        argv = [sys.executable, __file__, "--rows", "litellm", "--emit", str(emit),
                "--requests", str(args.requests), "--fault-requests", str(args.fault_requests),
                "--hang-timeout-s", str(args.hang_timeout_s), "--cold-s", str(args.cold_s),
                "--time-limit-s", str(args.time_limit_s), "--concurrency", *map(str, args.concurrency)]
        if args.skip_faults:
            argv.append("--skip-faults")
        subprocess.run(argv, check=True)
        return json.loads(emit.read_text())


def main(argv=None) -> int:
    from report import write_reports

    args = parse_args(argv)
    # the chain logs fallbacks and cooldowns at WARNING; in a benchmark they would only scramble the progress bars
    logging.getLogger("hearth").setLevel(logging.ERROR)
    env = environment()
    if args.emit:  # child: run what was asked, hand the rows back
        args.emit.write_text(json.dumps(asyncio.run(amain(args))))
        return 0
    want_litellm = "litellm" in args.rows
    args.rows = [r for r in args.rows if r != "litellm"]
    rows = asyncio.run(amain(args)) if args.rows else []
    if want_litellm:
        rows += _litellm_in_child(args)
        args.rows.append("litellm")
    args.out.mkdir(parents=True, exist_ok=True)
    write_reports(rows, env, vars(args), args.out)
    print(f"wrote {args.out / 'results.jsonl'}, results.md, results.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
