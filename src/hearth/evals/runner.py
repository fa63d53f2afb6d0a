"""`hearth eval`: run the envelope suites against any OpenAI-compatible endpoint and score them.

    hearth eval companion --base-url http://127.0.0.1:8000/v1 --model hearth-14b --json-schema --report r.json

Each case is one production-size prompt (hearth.prompts) sent as a non-streaming chat completion,
with at most ``concurrency`` calls in flight and a wall-clock timeout per call. Scores per case are
in hearth.evals.scoring; this module prints "k/n" per suite and the failures, writes the JSON
report, and returns exit code 1 when the pass fraction is below the threshold (2 on bad arguments).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from hearth.envelope import response_format
from hearth.evals.client import chat_completion
from hearth.evals.scoring import CHECKS, CaseScore, score
from hearth.evals.suites import SUITES, Case, load_suite


def request_body(case: Case, *, model: str, json_schema: bool, max_tokens: int | None,
                 extra_body: dict | None) -> dict:
    """The chat-completions body for one case; extra_body is merged last (it may override anything)."""
    body: dict[str, Any] = {"model": model, "messages": case.messages(), "stream": False}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if json_schema:
        body["response_format"] = response_format(case.kind)
    if extra_body:
        body.update(extra_body)
    return body


async def run_cases(cases: list[Case], *, base_url: str, model: str, api_key: str | None = None,
                    extra_body: dict | None = None, json_schema: bool = False, max_tokens: int | None = 1024,
                    timeout_s: float = 120.0, concurrency: int = 4, on_done=None,
                    transport: httpx.AsyncBaseTransport | None = None) -> list[CaseScore]:
    """Send every case (at most ``concurrency`` at once) and score the replies, in case order.

    ``transport`` replaces the network (tests use a real loopback server instead, but the seam exists).
    ``on_done(score)`` is called as each case finishes (progress display).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(limits=limits, transport=transport, trust_env=False) as client:
        async def one(case: Case) -> CaseScore:
            body = request_body(case, model=model, json_schema=json_schema, max_tokens=max_tokens,
                                extra_body=extra_body)
            async with gate:
                result = await chat_completion(client, base_url, body, timeout_s=timeout_s, api_key=api_key)
            scored = score(case, result)
            if on_done is not None:
                on_done(scored)
            return scored

        return list(await asyncio.gather(*(one(c) for c in cases)))


def summarize(scores: list[CaseScore]) -> dict:
    """Per-suite and overall pass counts and latency (seconds)."""
    def block(items: list[CaseScore]) -> dict:
        lat = sorted(s.latency_s for s in items)
        passed = sum(s.passed for s in items)
        return {
            "passed": passed, "total": len(items), "fraction": passed / len(items) if items else 0.0,
            "repaired": sum(s.repaired for s in items),
            "checks": {c: sum(s.checks.get(c) is True for s in items) for c in CHECKS},
            "latency_s": {"p50": round(statistics.median(lat), 4), "p95": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 4),
                          "max": round(lat[-1], 4)} if lat else {},
        }

    suites = {}
    for s in scores:
        suites.setdefault(s.suite, []).append(s)
    return {"suites": {name: block(items) for name, items in suites.items()}, "overall": block(scores)}


def _print(console, summary: dict, scores: list[CaseScore], threshold: float) -> None:
    from rich.table import Table

    for name, s in summary["suites"].items():
        lat = s["latency_s"]
        console.print(f"[bold]{name}[/bold] {s['passed']}/{s['total']}  "
                      f"(repaired {s['repaired']}, latency p50 {lat.get('p50', 0):.2f}s p95 {lat.get('p95', 0):.2f}s)")
    checks = Table(title="checks passed per suite")
    checks.add_column("suite")
    for c in CHECKS:
        checks.add_column(c, justify="right")
    for name, s in summary["suites"].items():
        checks.add_row(name, *(f"{s['checks'][c]}/{s['total']}" for c in CHECKS))
    console.print(checks)
    failures = [s for s in scores if not s.passed]
    if failures:
        table = Table(title="failures")
        for col in ("suite", "case", "status", "finish", "reason"):
            table.add_column(col, overflow="fold")
        for s in failures:
            table.add_row(s.suite, s.id, str(s.status), str(s.finish_reason), s.reason or "")
        console.print(table)
    o = summary["overall"]
    verdict = "[green]PASS[/green]" if o["fraction"] >= threshold else "[red]FAIL[/red]"
    console.print(f"overall {o['passed']}/{o['total']} = {o['fraction']:.3f} (threshold {threshold:g}) {verdict}")


def main(*, suite: str, base_url: str, model: str, api_key_env: str | None = None, extra_body: str | None = None,
         json_schema: bool = False, threshold: float = 1.0, report: Path | None = None, max_tokens: int | None = 1024,
         timeout_s: float = 120.0, concurrency: int = 4) -> int:
    """CLI entry: 0 when the overall pass fraction >= threshold, 1 below it, 2 on bad arguments."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console()

    def bad(message: str) -> int:
        console.print(f"[red]error:[/red] {message}")
        return 2

    names = list(SUITES) if suite == "all" else [suite]
    if any(n not in SUITES for n in names):
        return bad(f"suite must be one of {', '.join(SUITES)} or all, got {suite!r}")
    if not 0.0 <= threshold <= 1.0:
        return bad(f"--threshold must be in [0, 1], got {threshold}")
    if not base_url.startswith(("http://", "https://")):
        return bad(f"--base-url must be an http(s) URL, got {base_url!r}")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            return bad(f"--api-key-env: environment variable {api_key_env} is not set")
    extra = None
    if extra_body:
        try:
            extra = json.loads(extra_body)
        except json.JSONDecodeError as exc:
            return bad(f"--extra-body is not JSON: {exc.msg}")
        if not isinstance(extra, dict):
            return bad("--extra-body must be a JSON object")
    cases = [c for n in names for c in load_suite(n)]

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"eval {suite} on {model}", total=len(cases))
        try:
            scores = asyncio.run(run_cases(
                cases, base_url=base_url, model=model, api_key=api_key, extra_body=extra, json_schema=json_schema,
                max_tokens=max_tokens, timeout_s=timeout_s, concurrency=concurrency,
                on_done=lambda _: progress.advance(task)))
        except ValueError as exc:
            return bad(str(exc))

    summary = summarize(scores)
    _print(console, summary, scores, threshold)
    ok = summary["overall"]["fraction"] >= threshold
    if report is not None:
        doc = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "base_url": base_url, "model": model,
            "suite": suite, "json_schema": json_schema, "extra_body": extra, "max_tokens": max_tokens,
            "threshold": threshold, "ok": ok, "python": platform.python_version(), **summary,
            "cases": [s.to_json() for s in scores],
        }
        report = Path(report)
        report.parent.mkdir(parents=True, exist_ok=True)
        tmp = report.with_name(report.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(report)
        console.print(f"report: {report}")
    return 0 if ok else 1
