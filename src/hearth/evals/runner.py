"""`hearth eval`: run the envelope suites against any OpenAI-compatible endpoint and score them.

    hearth eval companion --base-url http://127.0.0.1:8000/v1 --model hearth-14b --json-schema --report r.json

Each case is one production-size prompt (hearth.prompts) sent ``samples`` times as a chat completion
(a chat case streamed by default, as the app streams it, so the time to the first token is measured; a feed
comment or an analyst's reading in one piece, as the app asks for them; usage asked for with
stream_options.include_usage), with the temperature and a per-sample seed when given, at most
``concurrency`` calls in flight and a wall-clock timeout per call; --extra-body adds keys to every request but
none that the eval sets (extra_body_error), and each reply records the parameters it was sent with. Each request
names its envelope kind in an X-Hearth-Kind header (hearth's gateway checks the reply as that kind; other servers
ignore it); through the gateway, each reply also records the provider that answered and the attempts before it
(and a reply no provider got right, the providers' failures from the gateway's error body). Replies that carried a
non-empty think block (thinking left on) are counted, and the console ends with a warning naming the fix.
The pass rate (overall and per suite) comes with a 95% interval: Wilson over replies, and with several samples
per case one that resamples cases (case_interval). Scores per case are in hearth.evals.scoring; this module
prints "k/n" per suite and the failures, writes the JSON report, and returns exit code 1 when the pass fraction
is below the threshold (2 on bad arguments; 130 on Ctrl-C, 143 on SIGTERM, after printing and writing what was measured).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import signal
import statistics
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from hearth.durable import write_file
from hearth.envelope import REPLY_DEADLINE_S, REPLY_KINDS, response_format
from hearth.envelope_stream import STREAMED_KINDS
from hearth.evals.client import ChatResult, chat_completion
from hearth.evals.scoring import CHECKS, CaseScore, score
from hearth.evals.suites import SUITES, Case, load_suite


# request keys --extra-body may not set: the messages are what the eval measures, model / stream are options of
# their own that the report records, and hearth_kind (hearth's gateway) is each case's own kind
_OWNED_KEYS = frozenset({"model", "messages", "stream", "stream_options", "hearth_kind"})
# request keys an option of the eval's sets: refused in --extra-body whether or not that option was given, so each
# parameter has one way in and the report's option fields are what the requests carried (an extra_body seed would
# also give every sample the same seed; n > 1 asks for several replies to one request, scored as one)
_OPTION_KEYS = {"max_tokens": "--max-tokens", "temperature": "--temperature", "seed": "--seed", "n": "--samples"}
# other names servers read for the reply limit, in preference to max_tokens (vLLM and SGLang:
# max_completion_tokens; llama.cpp: n_predict): refused while --max-tokens sends max_tokens
_LIMIT_ALIASES = ("max_completion_tokens", "n_predict")


def extra_body_error(extra: dict, *, max_tokens: int | None, json_schema: bool) -> str | None:
    """Why ``extra`` (--extra-body) cannot go into the eval's requests, naming the option and the key; None when
    it can. Refused: the eval's own keys (model, messages, stream, stream_options, hearth_kind); a key one of its
    options sets (max_tokens, temperature, seed, n), given or not; a second reply limit while --max-tokens sends
    one; response_format with --json-schema; NaN or Infinity (no server reads them, httpx refuses to send them)."""
    owned = sorted(set(extra) & _OWNED_KEYS)
    if owned:
        return (f"--extra-body must not set {', '.join(owned)}: the eval sends each case's production messages and "
                "envelope kind, and sets model and streaming from --model and --stream/--no-stream")
    flagged = [key for key in _OPTION_KEYS if key in extra]
    if flagged:
        return ("--extra-body must not set " + ", ".join(f"{key} (use {_OPTION_KEYS[key]})" for key in flagged)
                + ": the eval sets it from that option, and the report records the option")
    aliases = [key for key in _LIMIT_ALIASES if key in extra]
    if aliases and max_tokens is not None:
        return (f"--extra-body sets {', '.join(aliases)} while --max-tokens {max_tokens} sends max_tokens: the server "
                "would use one of the two limits; drop it, or pass --max-tokens 0 to send only yours")
    if json_schema and "response_format" in extra:
        return ("--extra-body must not set response_format with --json-schema, which sends the envelope's JSON "
                "schema as response_format: drop one of the two")
    try:
        json.dumps(extra, allow_nan=False)
    except ValueError:
        return "--extra-body holds NaN or Infinity, which is not JSON: every request would be refused"
    except TypeError as exc:  # run_cases(extra_body=...) from Python: a value json cannot write
        return f"--extra-body holds a value that is not JSON ({exc})"
    return None


def header_safe(value: str) -> bool:
    """Whether ``value`` (an API key) can go in an HTTP header as it is: printable ASCII, no whitespace."""
    return all("!" <= ch <= "~" for ch in value)


def _redacted(base_url: str) -> str:
    """base_url for the report, without any user:password@ in it (a report is shared; a credential is not)."""
    url = httpx.URL(base_url)
    return str(url.copy_with(userinfo=b"")) if url.userinfo else base_url


def _finite(value):
    """``value`` with every NaN or infinite float (a server's usage or attempts can carry them: Python's JSON reader
    takes NaN and Infinity) as None, so the report is strict JSON that any reader takes."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _temporary_beside(report: Path) -> str:
    """A new empty file of this run's own in report's folder (OSError when that folder cannot take one)."""
    fd, name = tempfile.mkstemp(dir=report.parent, prefix=f".{report.name}.", suffix=".tmp")
    os.close(fd)
    return name


def request_body(case: Case, *, model: str, json_schema: bool, max_tokens: int | None,
                 extra_body: dict | None, temperature: float | None = None, seed: int | None = None,
                 stream: bool = False) -> dict:
    """The chat-completions body for one case: extra_body, then the eval's own keys over it (extra_body_error
    refuses an extra_body that sets one of them; this order makes sure none is sent over an option's value)."""
    body: dict[str, Any] = dict(extra_body or {})
    body.update({"model": model, "messages": case.messages(), "stream": stream})
    if stream:
        body["stream_options"] = {"include_usage": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if seed is not None:
        body["seed"] = seed
    if json_schema:
        body["response_format"] = response_format(case.kind)
    return body


def sent_parameters(body: dict, *, json_schema: bool) -> dict:
    """A request body as a report row records it: everything but the messages (the case's production prompt), the
    eval's own response_format (--json-schema) by its type and schema name (the schema is
    hearth.envelope.response_format(kind))."""
    out = {k: v for k, v in body.items() if k != "messages"}
    if json_schema:
        fmt = out["response_format"]
        out["response_format"] = {"type": fmt["type"], "name": fmt["json_schema"]["name"]}
    return out


async def run_cases(cases: list[Case], *, base_url: str, model: str, api_key: str | None = None,
                    extra_body: dict | None = None, json_schema: bool = False, max_tokens: int | None = 1024,
                    timeout_s: float | None = None, concurrency: int = 4, on_done=None,
                    transport: httpx.AsyncBaseTransport | None = None, samples: int = 1,
                    temperature: float | None = None, seed: int | None = None,
                    stream: bool = False) -> list[CaseScore]:
    """Send every case ``samples`` times (at most ``concurrency`` calls at once) and score the replies, in
    case order then sample order. Sample i of every case is sent with seed + i (when a seed is given), so
    the samples differ under temperature > 0 and a run is repeatable on servers that honour the seed. ``stream``
    streams the kinds the app streams (STREAMED_KINDS: chat); the others are asked for in one piece, as the app
    asks for them.

    ``transport`` replaces the network (tests use a real loopback server instead, but the seam exists).
    ``on_done(score)`` is called as each case finishes (progress display).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if timeout_s is not None and not 0 < timeout_s < math.inf:  # NaN fails too: every call must have a timeout
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (or None: not sent), got {max_tokens}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if temperature is not None and not 0 <= temperature <= 2:
        raise ValueError(f"temperature must be in [0, 2], got {temperature}")
    if extra_body and (error := extra_body_error(extra_body, max_tokens=max_tokens, json_schema=json_schema)):
        raise ValueError(error)
    # as main checks --api-key-env's value: a key that cannot go in a header failed every call with an error that
    # quotes the header, the key in it, into each reply's reason (the console and the report); the key never shown
    if api_key and not header_safe(api_key):
        raise ValueError("api_key must be printable ASCII with no whitespace (a trailing newline?), without 'Bearer '")
    for i, case in enumerate(cases):  # now, not from the scorer once the calls were made
        if case.kind not in REPLY_KINDS:
            raise ValueError(f"cases[{i}].kind must be one of {REPLY_KINDS}, got {case.kind!r} (case {case.id!r})")
    gate = asyncio.Semaphore(concurrency)

    def call_timeout(case: Case) -> float:
        # by default as long as the app waits for a reply of this kind: a later one is lost in production
        return timeout_s if timeout_s is not None else REPLY_DEADLINE_S[case.kind]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(limits=limits, transport=transport, trust_env=False) as client:
        async def one(case: Case, sample: int) -> CaseScore:
            sample_seed = None if seed is None else seed + sample
            # streamed only where the app streams (chat): the app asks for a feed comment or a reading in one piece,
            # and hearth's gateway holds a stream to the streamed rule (and no fallback after the first delta)
            body = request_body(case, model=model, json_schema=json_schema, max_tokens=max_tokens,
                                extra_body=extra_body, temperature=temperature, seed=sample_seed,
                                stream=stream and case.kind in STREAMED_KINDS)
            async with gate:
                start = time.perf_counter()
                try:
                    # the kind as a header: hearth's gateway checks the reply as that kind (its default, chat,
                    # otherwise); any other server ignores it, where a body key could be refused (OpenAI)
                    result = await chat_completion(client, base_url, body, timeout_s=call_timeout(case),
                                                   api_key=api_key, headers={"X-Hearth-Kind": case.kind})
                except Exception as exc:  # noqa: BLE001 - one call's surprise is its failure, not the end of the run
                    result = ChatResult("", None, None, f"{type(exc).__name__}: {str(exc)[:200]}",
                                        time.perf_counter() - start)
            scored = score(case, result)
            scored.sample, scored.seed = sample, body.get("seed")
            scored.prompt_chars = sum(len(m["content"]) for m in body["messages"])
            scored.request = sent_parameters(body, json_schema=json_schema)
            if on_done is not None:
                on_done(scored)
            return scored

        return list(await asyncio.gather(*(one(c, i) for c in cases for i in range(samples))))


def wilson(passed: int, total: int, z: float = 1.959964) -> list[float]:
    """The 95% Wilson score interval of a pass rate (sound at 0/n and n/n, unlike the normal one)."""
    if total == 0:
        return [0.0, 1.0]
    p = passed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def case_interval(scores: list[CaseScore]) -> list[float]:
    """95% interval of the overall pass rate that resamples CASES with all their samples (the samples of one
    case are not independent: one prompt, one model), for --samples > 1.

    The variance of the rate under resampling cases is sum_c (k_c - p m_c)^2 / n^2 (k_c of m_c replies of case
    c passed; the ideal case bootstrap, exactly, with no resampling noise); it gives the effective number of
    independent replies n_eff = p(1-p) / variance (Kish's design effect), which lies between the number of
    cases (the samples of each case alike) and the number of replies (samples no more alike than chance);
    the interval is Wilson's at n_eff. At 0/n and n/n nothing says how alike the samples are, so each case
    counts once. (It was the percentile interval of 2000 case resamples: [1, 1] at n/n, and near 0 and 1
    narrower than the cases can support, e.g. 0.822-0.978 for 45 cases answered twice alike, 4 failing, where
    Wilson over those 45 cases is 0.793-0.965.)
    """
    by_case: dict[tuple[str, str], list[bool]] = {}
    for s in scores:
        by_case.setdefault((s.suite, s.id), []).append(s.passed)
    groups = [(sum(v), len(v)) for v in by_case.values()]
    if not groups:
        return [0.0, 1.0]
    passed, total, cases = sum(k for k, _ in groups), sum(m for _, m in groups), len(groups)
    p = passed / total
    variance = sum((k - p * m) ** 2 for k, m in groups) / (total * total)
    if passed in (0, total):
        n_eff = float(cases)
    elif variance <= 0:  # every case scored alike: nothing beyond chance ties a case's samples together
        n_eff = float(total)
    else:
        n_eff = min(max(p * (1 - p) / variance, cases), total)
    return wilson(p * n_eff, n_eff)


def summarize(scores: list[CaseScore]) -> dict:
    """Per-suite and overall pass counts, intervals (``ci95_by_case`` too when a case was sent more than once),
    latency (seconds) and prompt sizes (characters sent; the server's token counts, smallest and largest)."""
    def dist(values: list[float]) -> dict:
        values = sorted(values)
        rank95 = math.ceil(0.95 * len(values))  # nearest rank: with 20 values the 19th, not the slowest
        return {"p50": round(statistics.median(values), 4), "p95": round(values[rank95 - 1], 4),
                "max": round(values[-1], 4)} if values else {}

    def count(usage: dict, key: str) -> int | None:
        """A token count the server reported, or None when it is not a count ("n/a", {...}, true, -1)."""
        value = usage.get(key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    def gateway(items: list[CaseScore]) -> dict:
        """hearth's gateway only: replies per answering provider, how many came after a fallback (answered, "ok"
        last, after another attempt), how many no provider got right (its error listed only failures), and the
        failed attempts per provider and outcome."""
        if not any(s.provider is not None or s.attempts is not None for s in items):
            return {}
        providers: dict[str, int] = {}
        failed: dict[str, dict[str, int]] = {}
        for s in items:
            if s.provider is not None:
                providers[s.provider] = providers.get(s.provider, 0) + 1
            for attempt in s.attempts or []:
                if isinstance(attempt, (list, tuple)) and len(attempt) == 2 and attempt[1] != "ok":
                    per = failed.setdefault(str(attempt[0]), {})
                    per[str(attempt[1])] = per.get(str(attempt[1]), 0) + 1

        def answered(s: CaseScore) -> bool:
            return bool(s.attempts) and isinstance(s.attempts[-1], (list, tuple)) and list(s.attempts[-1][-1:]) == ["ok"]

        return {"providers": providers, "fallbacks": sum(answered(s) and len(s.attempts) > 1 for s in items),
                "unanswered": sum(bool(s.attempts) and not answered(s) for s in items), "failed_attempts": failed}

    def block(items: list[CaseScore]) -> dict:
        passed = sum(s.passed for s in items)
        usage = [s.usage for s in items if s.usage]
        counts = {k: [c for u in usage if (c := count(u, k)) is not None] for k in ("prompt_tokens", "completion_tokens")}
        tokens = {k: sum(v) for k, v in counts.items()}
        prompts = counts["prompt_tokens"]  # the server's count of each prompt, by its model's tokenizer
        chars = [s.prompt_chars for s in items]
        return {**gateway(items),
            "passed": passed, "total": len(items), "fraction": passed / len(items) if items else 0.0,
            "ci95": wilson(passed, len(items)),
            "cases": len({(s.suite, s.id) for s in items}),  # an id is a case within its suite
            "repaired": sum(s.repaired for s in items),
            "thinking": sum(s.thinking for s in items),
            "thinking_truncated": sum(s.thinking and s.finish_reason == "length" for s in items),
            "checks": {c: sum(s.checks.get(c) is True for s in items) for c in CHECKS},
            "latency_s": dist([s.latency_s for s in items]),
            "ttft_s": dist([s.ttft_s for s in items if s.ttft_s is not None]),
            "prompt_chars": {"min": min(chars), "max": max(chars)} if chars else {},
            "usage": {**tokens, "replies_with_usage": len(usage),
                      "prompt_tokens_min": min(prompts) if prompts else None,
                      "prompt_tokens_max": max(prompts) if prompts else None,
                      "completion_tokens_mean": (round(tokens["completion_tokens"] / len(counts["completion_tokens"]), 1)
                                                 if counts["completion_tokens"] else None)},
        }

    suites = {}
    for s in scores:
        suites.setdefault(s.suite, []).append(s)

    def with_cases(items: list[CaseScore]) -> dict:
        out = block(items)
        if len(items) > out["cases"]:  # several samples per case: the interval that respects that
            out["ci95_by_case"] = case_interval(items)
        return out

    return {"suites": {name: with_cases(items) for name, items in suites.items()}, "overall": with_cases(scores)}


def _shown(value: object) -> str:
    """Server text (and names) for the console: never read as markup, and a lone surrogate (valid JSON as
    "\\ud800", not encodable to stdout) written as its escape instead of raising after the whole run."""
    from rich.markup import escape

    return escape(str(value).encode("utf-8", "backslashreplace").decode("utf-8"))


def _print(console, summary: dict, scores: list[CaseScore], threshold: float, interrupted: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table

    for name, s in summary["suites"].items():
        lat = s["latency_s"]
        ttft = s["ttft_s"]
        console.print(f"[bold]{_shown(name)}[/bold] {s['passed']}/{s['total']}  "
                      f"(repaired {s['repaired']}, " + (f"thinking {s['thinking']}, " if s["thinking"] else "")
                      + f"latency p50 {lat.get('p50', 0):.2f}s p95 {lat.get('p95', 0):.2f}s"
                      + (f", first token p50 {ttft['p50']:.2f}s" if ttft else "")
                      + (f", {s['usage']['completion_tokens_mean']} completion tokens/reply" if s["usage"]["completion_tokens_mean"] is not None else "")
                      + ")")
    checks = Table(title="checks passed per suite")
    checks.add_column("suite")
    for c in CHECKS:
        checks.add_column(c, justify="right")
    for name, s in summary["suites"].items():
        checks.add_row(_shown(name), *(f"{s['checks'][c]}/{s['total']}" for c in CHECKS))
    console.print(checks)
    o = summary["overall"]
    if o.get("providers") or o.get("fallbacks") or o.get("unanswered"):  # hearth's gateway: who answered, how
        answered = ", ".join(f"{_shown(name)} {n}" for name, n in o["providers"].items())
        console.print(f"answered by (gateway): {answered or 'not named'}; {o['fallbacks']} of {o['total']} replies "
                      "came after another provider had failed or was skipped"
                      + (f"; {o['unanswered']} of {o['total']} replies no provider got right" if o["unanswered"] else ""))
        if o["failed_attempts"]:
            console.print("failed attempts (gateway): " + "; ".join(
                f"{_shown(name)}: " + ", ".join(f"{_shown(outcome)} {n}" for outcome, n in outcomes.items())
                for name, outcomes in o["failed_attempts"].items()))
    failures = [s for s in scores if not s.passed]
    if failures:
        table = Table(title="failures")
        for col in ("suite", "case", "status", "finish", "reason"):
            table.add_column(col, overflow="fold")
        for s in failures:
            table.add_row(*(_shown(str(v)) for v in (s.suite, s.id, s.status, s.finish_reason, s.reason or "")))
        console.print(table)
    o = summary["overall"]
    verdict = ("[yellow]INTERRUPTED[/yellow]" if interrupted  # what a part of the cases scored is no verdict
               else "[green]PASS[/green]" if o["fraction"] >= threshold else "[red]FAIL[/red]")
    interval = o.get("ci95_by_case", o["ci95"])
    console.print(f"overall {o['passed']}/{o['total']} = {o['fraction']:.3f} (95% CI {interval[0]:.3f}-{interval[1]:.3f}"
                  f"{', resampling cases' if 'ci95_by_case' in o else ''}; threshold {threshold:g}) {verdict}")
    if o["thinking"]:  # last, where it is seen: the likeliest cause of the truncations above, and the fix
        cut = o["thinking_truncated"]
        console.print(f"[bold yellow]warning:[/bold yellow] {o['thinking']} of {o['total']} replies carried a non-empty "
                      f"<think> block: the model is thinking before it answers"
                      + (f", and {cut} of them were cut off by the token limit (--max-tokens)" if cut else "")
                      + ". Turn thinking off: for Qwen3 on vLLM (or SGLang) pass "
                      + escape("""--extra-body '{"chat_template_kwargs": {"enable_thinking": false}}'""") + ".")


class _SigtermStop:
    """SIGTERM (a CI job's time limit, `timeout`, a container stop) handled as Ctrl-C is: the run stops, and what it
    measured is printed and written to the report. The default handler killed the process with nothing written."""

    def __init__(self) -> None:
        self.terminated = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.terminated = True
        raise KeyboardInterrupt  # asyncio.run cancels the calls in flight, as it does for Ctrl-C

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


def main(*, suite: str, base_url: str, model: str, api_key_env: str | None = None, extra_body: str | None = None,
         json_schema: bool = False, threshold: float = 1.0, report: Path | None = None, max_tokens: int | None = 1024,
         timeout_s: float | None = None, concurrency: int = 4, samples: int = 1, temperature: float | None = None,
         seed: int | None = None, stream: bool = True) -> int:
    """CLI entry: 0 when the overall pass fraction >= threshold, 1 below it, 2 on bad arguments, 130 when stopped
    with Ctrl-C, 143 with SIGTERM (the replies scored by then are printed and written to the report, marked
    interrupted)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress

    console = Console()

    def bad(message: str) -> int:
        console.print(f"[red]error:[/red] {escape(message)}")
        return 2

    names = list(SUITES) if suite == "all" else [suite]
    if any(n not in SUITES for n in names):
        return bad(f"suite must be one of {', '.join(SUITES)} or all, got {suite!r}")
    if not model.strip():
        return bad("--model must not be empty")
    if not 0.0 <= threshold <= 1.0:
        return bad(f"--threshold must be in [0, 1], got {threshold}")
    # the options' own names (run_cases checks the same, naming its parameters); 0 tokens: none sent, as the CLI's
    max_tokens = max_tokens or None
    if samples < 1:
        return bad(f"--samples must be >= 1, got {samples}")
    if concurrency < 1:
        return bad(f"--concurrency must be >= 1, got {concurrency}")
    if timeout_s is not None and not 0 < timeout_s < math.inf:
        return bad(f"--timeout must be a finite number of seconds > 0, got {timeout_s:g}")
    if max_tokens is not None and max_tokens < 1:
        return bad(f"--max-tokens must be >= 1 (0: no max_tokens sent), got {max_tokens}")
    if temperature is not None and not 0 <= temperature <= 2:
        return bad(f"--temperature must be in [0, 2], got {temperature:g}")
    if not base_url.startswith(("http://", "https://")):
        return bad(f"--base-url must be an http(s) URL, got {base_url!r}")
    try:  # here, not at the first request: a URL httpx cannot use fails every call (or crashes the run)
        url = httpx.URL(base_url)
        port = url.port
    except httpx.InvalidURL as exc:
        return bad(f"--base-url is not a valid URL ({exc}): {base_url!r}")
    if not url.host or (port is not None and not 0 < port < 65536):
        return bad(f"--base-url needs a host and a port in 1..65535, got {base_url!r}")
    if url.query or url.fragment or "?" in base_url or "#" in base_url:
        # /chat/completions is appended to the URL as text: "/v1?x=1" would post to /v1 with the query garbled
        return bad(f"--base-url must not have a query or fragment (/chat/completions is appended to it), got "
                   f"{_redacted(base_url)!r}")
    # an empty value (a shell variable that was empty) is a mistake to report, not "no such option": the run would
    # go out without the key, or without the extra body, and measure something else than asked
    if api_key_env is not None and not api_key_env.strip():
        return bad("--api-key-env is empty: give the name of the environment variable holding the key, or leave the "
                   "option out")
    if extra_body is not None and not extra_body.strip():
        return bad("--extra-body is empty: give a JSON object, or leave the option out")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            return bad(f"--api-key-env: environment variable {api_key_env} is not set")
        if not header_safe(api_key):
            return bad(f"--api-key-env: the value of {api_key_env} has whitespace or a non-ASCII character "
                       "(a trailing newline?)")
    extra = None
    if extra_body:
        try:
            extra = json.loads(extra_body)
        except json.JSONDecodeError as exc:
            return bad(f"--extra-body is not JSON: {exc.msg}")
        except (ValueError, RecursionError) as exc:  # an integer over 4300 digits; nesting deeper than the stack
            return bad(f"--extra-body is not JSON Python can read: {type(exc).__name__}: {str(exc)[:200]}")
        if not isinstance(extra, dict):
            return bad("--extra-body must be a JSON object")
        error = extra_body_error(extra, max_tokens=max_tokens, json_schema=json_schema)
        if error:  # the eval's subject (the production messages) and what its own options set
            return bad(error)
    if report is not None:  # found out now, not after the run: a report that cannot be written loses the run
        report = Path(report)
        try:
            if report.is_dir():
                raise IsADirectoryError(f"{report} is a directory")
            report.parent.mkdir(parents=True, exist_ok=True)
            os.unlink(_temporary_beside(report))
        except OSError as exc:
            return bad(f"--report: cannot write {str(report)!r} ({exc})")
    cases = [c for n in names for c in load_suite(n)]
    planned = len(cases) * max(samples, 1)
    finished: list[CaseScore] = []  # as each reply is scored: what a run stopped half-way has measured
    interrupted = False

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(escape(f"eval {suite} on {model}"), total=planned)

        def on_done(scored: CaseScore) -> None:
            finished.append(scored)
            progress.advance(task)

        stopped_by = _SigtermStop()
        try:
            scores = asyncio.run(run_cases(
                cases, base_url=base_url, model=model, api_key=api_key, extra_body=extra, json_schema=json_schema,
                max_tokens=max_tokens, timeout_s=timeout_s, concurrency=concurrency, samples=samples,
                temperature=temperature, seed=seed, stream=stream, on_done=on_done))
        except ValueError as exc:
            return bad(str(exc))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: asyncio.run cancelled the calls in flight; keep what was scored
            interrupted = True
            order = {(c.suite, c.id): i for i, c in enumerate(cases)}
            scores = sorted(finished, key=lambda s: (order[(s.suite, s.id)], s.sample))
        finally:
            stopped_by.restore()

    summary = summarize(scores)
    _print(console, summary, scores, threshold, interrupted)
    ok = summary["overall"]["fraction"] >= threshold and not interrupted  # part of a run is no verdict
    if interrupted:
        console.print(f"[bold yellow]interrupted:[/bold yellow] {len(scores)} of {planned} replies measured; "
                      "the figures above are theirs alone")
    if report is not None:
        doc = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "base_url": _redacted(base_url), "model": model,
            "suite": suite, "json_schema": json_schema, "extra_body": extra, "max_tokens": max_tokens,
            "threshold": threshold, "samples": samples, "temperature": temperature, "seed": seed, "stream": stream,
            "timeout_s": timeout_s, "timeouts_s": {kind: timeout_s if timeout_s is not None else REPLY_DEADLINE_S[kind]
                                                   for kind in dict.fromkeys(c.kind for c in cases)},
            "ok": ok, "interrupted": interrupted, "planned": planned, "python": platform.python_version(), **summary,
            "cases": [s.to_json() for s in scores],
        }
        report.parent.mkdir(parents=True, exist_ok=True)  # checked at start-up; recreated if removed since
        # a temporary of this run's own (two runs writing one report must not share one), then one rename;
        # backslashreplace: a lone surrogate (a reply cut inside an emoji) is written as its JSON escape
        text = json.dumps(_finite(doc), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

        def write(tmp: Path) -> None:
            tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
            # mkstemp made it 0600: the report gets the mode any file the user writes gets (0666 less the umask)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)

        # flushed before it takes the name, the folder after (a rename alone is not a flush: a host crash could
        # leave an empty report.json in place of the run's); the temporary removed if anything fails
        write_file(report, write, tmp=Path(_temporary_beside(report)))
        console.print(f"report: {escape(str(report))}")
    if interrupted:
        return 143 if stopped_by.terminated else 130  # the shell's codes for SIGTERM / SIGINT
    return 0 if ok else 1
