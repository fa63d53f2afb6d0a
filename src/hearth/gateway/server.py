"""`hearth gateway --config FILE`: the chain as an OpenAI-compatible HTTP API (aiohttp.web).

Routes:
    POST /v1/chat/completions   Content-Type application/json. JSON reply, or SSE when "stream": true
                                (a JSON boolean). The envelope kind comes from the body's
                                "hearth_kind" or the X-Hearth-Kind header (default [gateway].default_kind);
                                "hearth_deadline_s" may shorten the deadline; "max_tokens" and/or
                                "max_completion_tokens" cap the reply (the stricter wins); "n" must be 1
                                (one choice). "model": absent or "hearth"
                                = the whole chain; a provider's name or model id = those providers only
                                (in chain order); anything else -> 404 model_not_found.
                                The reply's message.content is the validated envelope (canonical JSON,
                                hearth.envelope.dumps); "model" is the answering provider's model id,
                                "hearth" (and X-Hearth-Provider) says which provider answered and how;
                                finish_reason is the provider's (null when it sent none, never made up);
                                "usage" is the answering provider's token counts, left out when it
                                reported none. SSE: with "stream_options": {"include_usage": true} every
                                chunk has "usage": null and a last chunk with empty "choices" carries the
                                usage before [DONE] (no such chunk when the provider reported none).
    GET  /v1/models             "hearth" (the whole chain) and each provider model id
    GET  /v1/providers          breaker and warm-gate state per provider
    GET  /healthz               liveness (the process answers; "pid" says which worker)
    GET  /readyz                ready = chain started and the state store answers (200, else 503); a
                                provider cooling down does not make the gateway unready (the body lists
                                each provider's state)
    GET  /metrics               Prometheus text format (of this worker)

When every provider failed, the status says whose problem it is:
    every provider that was tried refused the request itself (4xx other than 401/402/403/404/407/408/429,
        e.g. 400 context_length_exceeded)          -> that 4xx, with the provider's error message
    every provider is rate-limited / cooling down  -> 429 (all rate limits) or 503
    or cold (skipped)
    only timeouts                                  -> 504
    anything else                                  -> 502
A 429/502/503/504 carries Retry-After and "next_available" {provider, available_in_s} when no provider may be
tried again at once, as the breakers and warm gates stand once the chain gave up (an attempt may just have opened
its provider's breaker): Retry-After = the soonest wait known (a breaker's cooldown, a held-cold window, a warm-up's
end at the latest, an upstream's Retry-After), whole seconds rounded up, >= 1, <= max_retry_after_s. None when some
provider may be tried at once (a failure that opened nothing) or no wait is known (a half-open trial in flight).
Every error body is OpenAI-shaped JSON, {"error": {"message", "type", "param", "code", ...}}, also for
404/405/413/415/417/500, and carries X-Request-ID (the client's, when it sent one, else a new one); each
chat request logs one JSON line with it.

A client that hangs up cancels its request (aiohttp's handler_cancellation): the upstream connection
is closed at once and nothing counts against the provider. A request body that has not arrived within
[gateway].deadline_s is a 408 (aiohttp itself never times a body out); one aiohttp cannot decode while it is read
(a Content-Encoding it is not) is a 400 invalid_body, not a 500. A streaming client that takes no
bytes (connection open, receive window full) for [gateway].stream_write_timeout_s is disconnected: every
write of a stream is timed (aiohttp's never is), the upstream is closed, nothing counts against the
provider, and the outcome is client_stalled. Every other reply (JSON, errors) is written by the middleware
under the same limit (aiohttp would write it untimed after the handler): a client that leaves replies unread
is disconnected the same way, and the request keeps the outcome it had.

What aiohttp's parser refuses before any handler runs (a malformed request line or header, a line over 8190
bytes, more than 128 headers, a bad Content-Length or Transfer-Encoding, a broken chunked encoding that came with
the headers, TLS or HTTP/2 sent to the port) gets aiohttp's text/plain 400: no middleware sees it and aiohttp 3.14
has no supported hook for that reply (docs/gateway.md, Errors). An Expect other than 100-continue is a JSON 417 on
the gateway's routes (their expect handler, _expect, leaves it to the middleware); on a path or method no route
serves, aiohttp's own check answers it first (text/plain 417).

Metrics: every chat request ends in exactly one outcome of hearth_gateway_requests_total /
hearth_gateway_request_seconds (hearth.gateway.metrics.OUTCOMES): the chain records it for a request
it was given (ok, failed, interrupted, client_cancelled, client_stalled, error), the middleware for one
that never got there (rejected: 400/404/408/413/415/417; client_cancelled; error).

`hearth gateway --workers N` runs N processes on one port (SO_REUSEPORT); they share breaker,
cooldown and warm state through [gateway].state_url (Redis), which N > 1 requires.

Why aiohttp.web rather than FastAPI: the benchmark runs the same Chain behind both (rows "hearth
gateway (aiohttp.web)" and "fastapi gateway (same chain)" in benchmarks/gateway/results.md). On the
shared 2-core box they came out even within noise (server CPU 0.5-0.85 ms per request each, req/s
within +-30% either way between runs), even though the FastAPI variant there does less (no request
log, no request-id middleware). With no measured win for FastAPI, aiohttp.web keeps ONE HTTP stack in
the process (the client is aiohttp, chosen by measurement), and our six routes are validated by hand
anyway. If the lead's quiet-machine run shows FastAPI clearly ahead, create_app() is the only thing
to replace.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from aiohttp import HttpVersion11, hdrs, web

from hearth import envelope as env
from hearth.gateway.chain import Chain, StreamDelta, StreamDone, UnknownModel
from hearth.gateway.config import ConfigError, GatewayConfig, load_config
from hearth.gateway.errors import (
    AllProvidersFailed, ClientStalled, Cold, Cooldown, DeadlineExceeded, HeldCold, ProviderError, StreamInterrupted,
    Timeout, UpstreamStatus, label,
)
from hearth.gateway.metrics import UNKNOWN_KIND
from hearth.gateway.state import StateStoreError, make_store

log = logging.getLogger("hearth.gateway.server")
CHAIN: web.AppKey[Chain] = web.AppKey("chain", Chain)
REQUEST_ID = web.RequestKey("request_id", str)
PROVIDER = web.RequestKey("provider", str)
KIND = web.RequestKey("kind", str)             # the chat request's envelope kind, once read
CHAIN_OWNS = web.RequestKey("chain_owns", bool)  # the chain records this request's outcome (metrics)
STALLED = web.RequestKey("stalled", bool)        # a streaming client that took no bytes was disconnected
EXPECT_FAILED = web.RequestKey("expect_failed", str)  # an Expect header other than 100-continue (_expect)
_MAX_BODY = 4 * 1024 * 1024
# Generated request ids: 16 random hex digits per process + a 16-digit counter (32 hex, like a uuid4
# hex). Unique across processes like uuid4, without an os.urandom syscall on every request. A forked
# worker (e.g. a pre-loading process manager) draws its own prefix, so workers never share ids.
_RID_PREFIX = os.urandom(8).hex()
_rid_counter = itertools.count(1)


def _new_rid_prefix() -> None:
    global _RID_PREFIX, _rid_counter
    _RID_PREFIX = os.urandom(8).hex()
    _rid_counter = itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_rid_prefix)


def _new_request_id() -> str:
    return f"{_RID_PREFIX}{next(_rid_counter):016x}"


# ---------------------------------------------------------------------------------------- logging
class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus request_id/provider/... when given."""

    _EXTRA = ("request_id", "provider", "error", "method", "path", "status", "latency_ms", "kind")

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
               "pid": record.process, "msg": record.getMessage()}
        for key in self._EXTRA:
            if key in record.__dict__:
                out[key] = record.__dict__[key]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("hearth")
    root.handlers[:] = [handler]
    root.setLevel(level)


# ---------------------------------------------------------------------------------------- helpers
# What aiohttp.web should do for this app; main() and tests' runners use the same options.
RUNNER_OPTIONS = {"access_log": None, "handler_cancellation": True}
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
          408: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          417: "invalid_request_error", 429: "rate_limit_error"}


def _error(status: int, message: str, request_id: str, *, param: str | None = None, code: str | None = None,
           type: str | None = None, headers: dict | None = None, **extra) -> web.Response:
    """An OpenAI-shaped error: {"error": {"message", "type", "param", "code", ...hearth extras}}."""
    body = {"error": {"message": message, "type": type or _TYPES.get(status, "hearth_gateway"), "param": param,
                      "code": code, **extra}}
    return web.json_response(body, status=status, headers={"X-Request-ID": request_id, **(headers or {})})


def _describe(e: BaseException) -> dict:
    d = {"provider": getattr(e, "provider", None), "error": type(e).__name__,
         "label": label(e) if isinstance(e, ProviderError) else None, "message": str(e)}
    if isinstance(e, UpstreamStatus):
        d["status"] = e.status
        d["retry_after"] = e.retry_after
    if isinstance(e, Cooldown):
        d["cooldown_left_s"] = round(e.remaining_s, 3)
    if isinstance(e, HeldCold):
        d["held_cold_s"] = round(e.held_s, 3)
    if isinstance(e, Timeout):
        d["timeout"] = e.kind
    return d


def _upstream_error(body: str) -> dict:
    """The provider's OpenAI error object from an error body, or {} when it sent none."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return {}
    return {k: err[k] for k in ("message", "type", "param", "code") if isinstance(err.get(k), (str, int))}


def _unavailable(e: ProviderError) -> bool:
    return isinstance(e, (Cooldown, Cold)) or (isinstance(e, UpstreamStatus) and (e.status == 429 or e.retry_after is not None))


def _rate_limited(e: ProviderError) -> bool:
    return (isinstance(e, UpstreamStatus) and e.status == 429) or (isinstance(e, Cooldown) and e.status == 429)


def _available_in_s(e: ProviderError, max_retry_after_s: float) -> float | None:
    """Seconds until the provider may be tried again, as far as `e` itself says: its breaker's cooldown left, its
    endpoint's held-cold window left, its Retry-After (capped as the breaker caps the cooldown it opens for it);
    0.0 for an attempt that failed without saying (it opened nothing it knows of). None when not known: a warm-up
    running, a half-open trial in flight."""
    if isinstance(e, Cooldown):
        return e.remaining_s if e.remaining_s > 0 else None
    if isinstance(e, HeldCold):
        return e.held_s
    if isinstance(e, UpstreamStatus) and e.retry_after is not None:
        return min(e.retry_after, max_retry_after_s)
    return None if isinstance(e, Cold) else 0.0


def _waits(exc: AllProvidersFailed, max_retry_after_s: float) -> list[float | None]:
    """Per failure: seconds until its provider may be tried again (0.0 at once, None not known). What the chain read
    from the breaker and warm state when it gave up (exc.available_in_s: a breaker this request's attempt opened, a
    skipped cooldown that ran out meanwhile, a warm-up's end); an upstream's own Retry-After as it said it, unless
    the breaker holds the provider longer (another worker lengthened it). Without that reading: what each error
    says (_available_in_s)."""
    own = [_available_in_s(e, max_retry_after_s) for e in exc.exceptions]
    if exc.available_in_s is None:
        return own
    out = []
    for e, said, now in zip(exc.exceptions, own, exc.available_in_s):
        if now is not None and now > 0 and isinstance(e, UpstreamStatus) and said is not None:
            now = max(said, now)
        out.append(now)
    return out


def _come_back(errors, waits: list[float | None], max_retry_after_s: float) -> tuple[dict | None, dict, str]:
    """(headers, body extras, message ending) telling the client when to come back: Retry-After = the soonest wait
    known, whole seconds rounded up, capped at max_retry_after_s like every Retry-After the gateway passes on, and
    next_available naming that provider. Nothing when a provider may be tried again at once (a retry now may get
    through) or when no wait is known (a client backs off on its own)."""
    if any(w == 0.0 for w in waits):
        return None, {}, ""
    known = [(w, e.provider) for e, w in zip(errors, waits) if w is not None]
    if not known:
        return None, {}, ""
    wait, name = min(known, key=lambda k: k[0])  # the first in chain order on a tie
    wait = round(min(wait, max_retry_after_s), 3)
    seconds = max(1, math.ceil(wait))
    return ({"Retry-After": str(seconds)}, {"next_available": {"provider": name, "available_in_s": wait}},
            f"; {name!r} may be tried again in {seconds} s")


def _failure(exc: AllProvidersFailed, request_id: str, max_retry_after_s: float) -> web.Response:
    """The response for a request every provider failed (see the module docstring for the statuses). When no
    provider may be tried again at once (all skipped or rate-limited, or every attempt left its provider
    unavailable for a while: a breaker it opened), a 429/502/503/504 carries Retry-After and next_available
    (_come_back); the body says each failure's own wait."""
    errors = exc.exceptions
    failures = [_describe(e) for e in errors]
    waits = _waits(exc, max_retry_after_s)
    for d, wait in zip(failures, waits):
        d["available_in_s"] = None if wait is None else round(wait, 3)
    tried = [e for e in errors if not isinstance(e, (Cooldown, Cold))]
    refused = [e for e in tried if isinstance(e, UpstreamStatus) and e.client_error]
    if tried and len(refused) == len(tried):
        first = refused[0]
        up = _upstream_error(first.body)
        message = up.get("message") or f"the provider refused the request (HTTP {first.status})"
        return _error(first.status, str(message), request_id, param=up.get("param"), code=up.get("code"),
                      type=up.get("type") or "invalid_request_error", failures=failures)
    headers, extra, when = _come_back(errors, waits, max_retry_after_s)
    if all(_unavailable(e) for e in errors):
        limits = [e for e in errors if not isinstance(e, Cold)]
        rate = bool(limits) and all(_rate_limited(e) for e in limits)
        message = ("every provider is rate-limited" if rate else "every provider is cooling down or cold") + when
        if rate:
            return _error(429, message, request_id, code="rate_limited", headers=headers, failures=failures, **extra)
        return _error(503, message, request_id, code="providers_unavailable", type="service_unavailable",
                      headers=headers, failures=failures, **extra)
    if tried and all(isinstance(e, (Timeout, DeadlineExceeded)) for e in tried):
        return _error(504, exc.message + when, request_id, code="upstream_timeout", headers=headers,
                      failures=failures, **extra)
    return _error(502, exc.message + when, request_id, code="upstream_failed", headers=headers, failures=failures,
                  **extra)


def _model(result) -> str:
    """`model` of a reply: the model id that answered (OpenAI clients and cost tools key on it); the provider's
    name is in the `hearth` block and X-Hearth-Provider."""
    return result.model if result.model is not None else result.provider


def _completion(result, kind: str, request_id: str) -> dict:
    out = {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": int(time.time()),
           "model": _model(result),
           "choices": [{"index": 0, "message": {"role": "assistant", "content": env.dumps_parsed(result.envelope)},
                        "finish_reason": result.finish_reason}],
           "hearth": {"kind": kind, "provider": result.provider, "latency_ms": round(result.latency_s * 1e3, 3),
                      "attempts": [list(a) for a in result.attempts]}}
    if result.usage is not None:  # the provider's own counts; none reported: no usage (never made up)
        out["usage"] = dict(result.usage)
    return out


def _chunk(request_id: str, model: str, delta: dict | None, finish: str | None = None, **extra) -> bytes:
    """One chat.completion.chunk; delta None: the usage chunk (no choices)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    obj = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
           "model": model, "choices": choices, **extra}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _include_usage(options) -> bool | tuple[str, str]:
    """A request's stream_options.include_usage; (param, message) when stream_options is not OpenAI's shape
    (absent/null, or an object whose include_usage is absent, null or a JSON boolean). Ignored unless streaming."""
    if options is None:
        return False
    if not isinstance(options, dict):
        return "stream_options", "stream_options must be an object"
    value = options.get("include_usage")
    if value is not None and not isinstance(value, bool):
        return "stream_options.include_usage", "stream_options.include_usage must be true or false (a JSON boolean)"
    return bool(value)


# ---------------------------------------------------------------------------------------- middleware
@web.middleware
async def request_context(request: web.Request, handler):
    rid = request.headers.get("X-Request-ID") or _new_request_id()
    if len(rid) > 128 or not rid.isprintable():
        rid = _new_request_id()
    request[REQUEST_ID] = rid
    start = time.perf_counter()
    status = 500
    answered = None  # the status of the reply made (a refused chat request's outcome), however its write goes
    try:
        try:
            expect = request.get(EXPECT_FAILED)
            if expect is not None:
                resp = _error(417, f"Expect {expect!r} is not supported (only 100-continue)", rid,
                              code="expectation_failed")
                resp.force_close()  # the client may still send the body it announced: no request to read after it
            else:
                resp = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                exc.headers["X-Request-ID"] = rid
                raise
            # aiohttp's own 404/405/413 are text/plain: every error leaves as OpenAI-shaped JSON
            resp = _error(exc.status, exc.reason if exc.status != 413 else
                          f"request body too large (limit {_MAX_BODY} bytes)", rid,
                          headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"})
        except StateStoreError as exc:
            log.error("state store failed: %s", exc, extra={"request_id": rid, "error": "state_store"})
            resp = _error(503, "the gateway's state store is unavailable", rid, code="state_store_unavailable",
                          type="service_unavailable")
        except (asyncio.CancelledError, ConnectionResetError):
            status = 499  # the client went away (nginx's code, for the log line only)
            raise
        except Exception:
            log.exception("unhandled error", extra={"request_id": rid, "error": "internal"})
            resp = _error(500, "internal gateway error", rid, code="internal_error", type="server_error")
        status = 499 if request.get(STALLED) else resp.status  # a stalled client was cut: nginx's 499 too
        if not resp.prepared:
            resp.headers["X-Request-ID"] = rid
            answered, status = status, 499  # 499 in the log until it is written: the client may go, or stall, first
            if await _write_reply(request, resp, request.app[CHAIN].settings.stream_write_timeout_s):
                status = resp.status
        return resp
    finally:
        if request.match_info.handler is chat and not request.get(CHAIN_OWNS):
            # a chat request that never reached the chain (refused, the client gone while it sent the body, a
            # bug): its one outcome is recorded here, from the reply made (as the chain's is); the chain records
            # every other (Chain._finish)
            code = status if answered is None else answered
            outcome = "client_cancelled" if code == 499 else ("rejected" if code < 500 else "error")
            request.app[CHAIN].metrics.request_done(request.get(KIND, UNKNOWN_KIND), outcome,
                                                    time.perf_counter() - start)
        # one line per chat request; probes and scrapes stay quiet (and no extra dict when INFO is off)
        if request.path.startswith("/v1/chat") and log.isEnabledFor(logging.INFO):
            extra = {"request_id": rid, "method": request.method, "path": request.path, "status": status,
                     "latency_ms": round((time.perf_counter() - start) * 1e3, 3), "provider": request.get(PROVIDER)}
            if request.get(STALLED):
                extra["error"] = "client_stalled"
            log.info("request", extra=extra)


# ---------------------------------------------------------------------------------------- routes
def _check_messages(messages) -> tuple[str, str] | None:
    """(param, message) of the first problem in `messages`, or None."""
    if not isinstance(messages, list) or not messages:
        return "messages", "messages must be a non-empty list of objects"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{i}]", f"messages[{i}] must be an object"
        role = m.get("role")
        if role not in _ROLES:
            return f"messages[{i}].role", f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}"
        content = m.get("content")
        if isinstance(content, str):
            continue
        if isinstance(content, list) and content and all(isinstance(part, dict) and isinstance(part.get("type"), str)
                                                         for part in content):
            continue
        if content is None and role == "assistant" and (m.get("tool_calls") or m.get("function_call")):
            continue
        return f"messages[{i}].content", f"messages[{i}].content must be a string or a list of content parts"
    return None


# levels of nesting a body's messages must still have to spare here: a provider encodes them deeper in the stack
# than this handler decoded them, and a body the decoder only just took failed there (a 500, not this 400)
_ENCODE_MARGIN = 32


def _encodable(messages: list) -> bool:
    """Whether ``messages`` can be encoded with _ENCODE_MARGIN levels of nesting to spare (one C-speed encode)."""
    wrapped = messages
    for _ in range(_ENCODE_MARGIN):
        wrapped = [wrapped]
    try:
        json.dumps(wrapped)  # the default (cached) encoder: the depth, not the bytes, is what is checked
    except RecursionError:
        return False
    return True


async def chat(request: web.Request) -> web.StreamResponse:
    rid = request[REQUEST_ID]
    chain = request.app[CHAIN]
    if request.content_type != "application/json":
        return _error(415, f"Content-Type must be application/json, got {request.content_type!r}", rid,
                      code="unsupported_media_type")
    try:
        # over client_max_size: HTTPRequestEntityTooLarge, made JSON by the middleware. A body that stops arriving
        # held the handler and its connection for good (aiohttp has no timeout on reading it): it gets deadline_s.
        async with asyncio.timeout(chain.settings.deadline_s):
            raw = await request.read()
    except TimeoutError:
        resp = _error(408, f"the request body did not arrive within {chain.settings.deadline_s:g} s", rid,
                      code="request_timeout")
        resp.force_close()  # the rest of the body may still come: not a connection to read the next request from
        return resp
    except web.RequestPayloadError as exc:
        # aiohttp could not decode the body it was reading (a Content-Encoding it is not, a chunk framing its parser
        # fails): the client's error, not the gateway's 500; the rest of the connection's bytes mean nothing
        resp = _error(400, f"the request body could not be read: {_last_line(exc)}", rid, code="invalid_body")
        resp.force_close()
        return resp
    try:
        body = json.loads(raw)
    except RecursionError:
        return _error(400, "body is nested too deeply", rid, code="invalid_json")
    except (ValueError, UnicodeDecodeError):
        return _error(400, "body must be JSON", rid, code="invalid_json")
    if not isinstance(body, dict):
        return _error(400, "body must be a JSON object", rid, code="invalid_json")
    messages = body.get("messages")
    problem = _check_messages(messages)
    if problem is not None:
        return _error(400, problem[1], rid, param=problem[0])
    if not _encodable(messages):
        return _error(400, "body is nested too deeply", rid, code="invalid_json")
    kind = body.get("hearth_kind") or request.headers.get("X-Hearth-Kind") or chain.settings.default_kind
    if kind not in env.REPLY_KINDS:
        return _error(400, f"hearth_kind must be one of {list(env.REPLY_KINDS)}, got {kind!r}", rid, param="hearth_kind")
    request[KIND] = kind
    max_tokens = None
    # max_completion_tokens is OpenAI's current name for the cap (the SDKs and LangChain send it instead of
    # max_tokens): either caps the reply, the stricter when both are given; it goes upstream as max_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return _error(400, f"{name} must be a positive integer", rid, param=name)
        max_tokens = value if max_tokens is None else min(max_tokens, value)
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        # one reply per request: n > 1 answered with one choice would be a silent lie to the client
        return _error(400, f"n must be 1 (the gateway returns one choice), got {n!r}", rid, param="n")
    deadline = body.get("hearth_deadline_s")
    if deadline is not None and (not isinstance(deadline, (int, float)) or isinstance(deadline, bool)
                                 or not 0 < deadline <= chain.settings.deadline_s):  # NaN fails this too
        return _error(400, f"hearth_deadline_s must be in (0, {chain.settings.deadline_s}]", rid, param="hearth_deadline_s")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return _error(400, f"stream must be true or false (a JSON boolean), got {stream!r}", rid, param="stream")
    include_usage = _include_usage(body.get("stream_options"))
    if isinstance(include_usage, tuple):
        return _error(400, include_usage[1], rid, param=include_usage[0])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return _error(400, "model must be a string", rid, param="model")
    try:
        chain.providers_for(model)
    except UnknownModel as exc:
        return _error(404, str(exc), rid, param="model", code="model_not_found")
    request[CHAIN_OWNS] = True  # from here on the chain records the request's outcome
    if stream:
        return await _chat_stream(request, chain, messages, kind, max_tokens, deadline, model, include_usage)
    try:
        result = await chain.complete(messages, kind=kind, deadline_s=deadline, max_tokens=max_tokens, request_id=rid,
                                      model=model)
    except AllProvidersFailed as exc:
        return _failure(exc, rid, chain.settings.max_retry_after_s)
    request[PROVIDER] = result.provider
    return web.json_response(_completion(result, kind, rid),
                             headers={"X-Request-ID": rid, "X-Hearth-Provider": result.provider})


def _last_line(exc: BaseException) -> str:
    """The reason aiohttp gives for a payload error ("400, message:\n  Can not decode content-encoding: gzip" -> the
    last line), at most 200 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:200]


async def _expect(request: web.Request) -> None:
    """The routes' Expect handler, which aiohttp calls before the middleware. Its default raised an Expect other than
    100-continue as aiohttp's text/plain 417 there, which no middleware saw; here it is left to the middleware
    (EXPECT_FAILED), which refuses it as JSON with X-Request-ID, the log line and a chat request's outcome.
    100-continue gets its interim reply, which a client waits for before it sends a big body (curl does);
    HTTP/1.0 has no Expect (ignored, as aiohttp ignores it)."""
    if request.version != HttpVersion11:
        return
    expect = request.headers.get(hdrs.EXPECT, "")
    if expect.lower() != "100-continue":
        request[EXPECT_FAILED] = expect
        return
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")


async def _timed(aw, timeout_s: float):
    """Await a write to the client, at most timeout_s: a client that takes no bytes (socket open, receive window
    full) made `await resp.write()` wait for good, holding the upstream stream, its pool slot and the buffers."""
    try:
        async with asyncio.timeout(timeout_s):
            return await aw
    except TimeoutError:
        raise ClientStalled(timeout_s) from None


async def _write_reply(request: web.Request, resp: web.StreamResponse, timeout_s: float) -> bool:
    """Write a reply the handler returned unsent (every JSON reply and error), each write timed as a stream's are;
    False when the client did not take it. aiohttp would write it after the middleware with no time limit: once the
    replies a client leaves unread (pipelined requests, a big reply) filled the buffers, that write waited for good,
    holding the connection and its handler task."""
    try:
        await _timed(resp.prepare(request), timeout_s)
        await _timed(resp.write_eof(), timeout_s)
    except ClientStalled as exc:
        log.warning("the client did not take its reply within %g s: disconnected", exc.timeout_s,
                    extra={"request_id": request[REQUEST_ID], "error": "client_stalled"})
        request[STALLED] = True
        _drop(request)  # the connection's loss cancels this handler (handler_cancellation) at its next wait
        return False
    except ConnectionResetError:  # the client is gone; aiohttp's own write_eof after ours ends the connection
        return False
    return True


def _drop(request: web.Request) -> None:
    """Close the client's connection at once with a reset (no FIN after data it will not read: the kernel would keep
    the unsent bytes and probe a zero window for minutes)."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


async def _chat_stream(request, chain: Chain, messages, kind, max_tokens, deadline, model,
                       include_usage: bool = False) -> web.StreamResponse:
    rid = request[REQUEST_ID]
    events = chain.stream(messages, kind=kind, deadline_s=deadline, max_tokens=max_tokens, request_id=rid, model=model)
    resp: web.StreamResponse | None = None
    write_s = chain.settings.stream_write_timeout_s

    async def send(data: bytes) -> None:
        await _timed(resp.write(data), write_s)

    # asked for usage: as OpenAI, "usage": null on every chunk but the last, which carries it (and no choices)
    nulls = {"usage": None} if include_usage else {}
    stalled: ClientStalled | None = None
    try:
        try:
            try:
                async for ev in events:
                    if resp is None:  # headers go out with the first delta: before it, a failure is still a clean error
                        if isinstance(ev, StreamDelta):
                            request[PROVIDER], model_id = ev.provider, ev.model if ev.model is not None else ev.provider
                        else:
                            request[PROVIDER], model_id = ev.result.provider, _model(ev.result)
                        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache", "X-Request-ID": rid,
                                                           "X-Hearth-Provider": request[PROVIDER]})
                        await _timed(resp.prepare(request), write_s)
                        await send(_chunk(rid, model_id, {"role": "assistant", "content": ""}, **nulls))
                    if isinstance(ev, StreamDelta):
                        await send(_chunk(rid, model_id, {"content": ev.text}, **nulls))
                    elif isinstance(ev, StreamDone):
                        r = ev.result
                        await send(_chunk(rid, model_id, {}, r.finish_reason, **nulls,
                                          hearth={"kind": kind, "provider": r.provider,
                                                  "envelope": r.envelope.model_dump(mode="json"),
                                                  "attempts": [list(a) for a in r.attempts]}))
                        if include_usage and r.usage is not None:  # none reported: no usage chunk (never made up)
                            await send(_chunk(rid, model_id, None, usage=dict(r.usage)))
                        await send(b"data: [DONE]\n\n")
            except AllProvidersFailed as exc:
                return _failure(exc, rid, chain.settings.max_retry_after_s)
            except ClientStalled:
                raise
            except StreamInterrupted as exc:
                assert resp is not None
                err = {"error": {"message": str(exc), "type": "hearth_gateway", "param": None,
                                 "code": "stream_interrupted", "provider": exc.provider,
                                 "cause": _describe(exc.__cause__) if exc.__cause__ else None}}
                await send(b"data: " + json.dumps(err).encode() + b"\n\n")
            except Exception as exc:
                if resp is None or isinstance(exc, ConnectionResetError):
                    raise  # nothing sent yet: the middleware's JSON error (503 state store, 500); or the client is gone
                # The SSE headers are out: the middleware cannot send its error any more (the stream would never
                # end), so the stream ends here with an error event and no [DONE], as an interruption does.
                if isinstance(exc, StateStoreError):
                    log.error("state store failed mid-stream: %s", exc,
                              extra={"request_id": rid, "error": "state_store"})
                    err = {"message": "the gateway's state store is unavailable", "type": "service_unavailable",
                           "code": "state_store_unavailable"}
                else:
                    log.exception("unhandled error mid-stream", extra={"request_id": rid, "error": "internal"})
                    err = {"message": "internal gateway error", "type": "server_error", "code": "internal_error"}
                await send(b"data: " + json.dumps({"error": {**err, "param": None}}).encode() + b"\n\n")
            assert resp is not None
            await _timed(resp.write_eof(), write_s)
        except ClientStalled as exc:
            # Tell the chain first (it closes the upstream, gives back a trial, counts nothing against the provider
            # and records client_stalled; a stream that already ended keeps the outcome it had), then drop the client.
            stalled = exc
            try:
                await events.athrow(exc)
            except ClientStalled:
                pass
    finally:
        await events.aclose()
    assert resp is not None
    if stalled is not None:
        log.warning("the client took no bytes for %g s: disconnected", stalled.timeout_s,
                    extra={"request_id": rid, "error": "client_stalled"})
        request[STALLED] = True
        _drop(request)  # last: the connection's loss cancels this handler (handler_cancellation)
    return resp


async def models(request: web.Request) -> web.Response:
    chain = request.app[CHAIN]
    owners = {}
    for p in chain.providers:
        owners.setdefault(p.config.model, p.name)
    data = [{"id": m, "object": "model", "created": 0, "owned_by": owners.get(m, "hearth")} for m in chain.models()]
    return web.json_response({"object": "list", "data": data})


async def providers(request: web.Request) -> web.Response:
    return web.json_response({"providers": await request.app[CHAIN].status()})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "pid": os.getpid()})  # pid: which worker answered


async def readyz(request: web.Request) -> web.Response:
    chain = request.app[CHAIN]
    try:
        await chain.store.ping()
        status = await chain.status()
    except StateStoreError as exc:
        return web.json_response({"ready": False, "why": str(exc)}, status=503)
    ready = chain.started
    return web.json_response({"ready": ready, "providers": status}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    chain = request.app[CHAIN]
    try:
        await chain.sync_breaker_gauge()
    except StateStoreError as exc:  # the rest of the scrape is worth having exactly then; /readyz says 503
        log.warning("metrics: breaker state not refreshed, state store failed: %s", exc, extra={"error": "state_store"})
    return web.Response(body=chain.metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# ---------------------------------------------------------------------------------------- app
def create_app(config: GatewayConfig, *, chain: Chain | None = None) -> web.Application:
    """The aiohttp application; the chain starts and closes with it. Run it with RUNNER_OPTIONS."""
    app = web.Application(middlewares=[request_context], client_max_size=_MAX_BODY)
    app[CHAIN] = chain or Chain(config)

    async def lifespan(app: web.Application):
        await app[CHAIN].start()
        yield
        await app[CHAIN].aclose()
        log.info("gateway stopped: chain closed")

    app.cleanup_ctx.append(lifespan)
    app.router.add_post("/v1/chat/completions", chat, expect_handler=_expect)
    for path, handler in (("/v1/models", models), ("/v1/providers", providers), ("/healthz", healthz),
                          ("/readyz", readyz), ("/metrics", metrics)):
        app.router.add_get(path, handler, expect_handler=_expect)
    return app


# ---------------------------------------------------------------------------------------- processes
def _fail(message: str, code: int) -> int:
    log.error(message, extra={"error": "startup"})
    print(f"hearth gateway: {message}", file=sys.stderr)
    return code


async def _check_store(cfg: GatewayConfig) -> None:
    store = make_store(cfg.gateway)
    try:
        await store.start()
    finally:
        await store.aclose()


def port_in_use(host: str, port: int) -> OSError | None:
    """The error a plain bind (no SO_REUSEPORT) to host:port gets now (in use, not an address of this machine, a
    host name that does not resolve), or None when it is free. `hearth serve` checks its port with it too."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:  # socket.gaierror: before, a traceback
        return exc
    for family, kind, proto, _, addr in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp does: TIME_WAIT is not "in use"
            try:
                s.bind(addr)
            except OSError as exc:
                return exc
    return None


def _serve(cfg: GatewayConfig, host: str, port: int, reuse_port: bool) -> int:
    try:
        web.run_app(create_app(cfg), host=host, port=port, print=None, handle_signals=True, reuse_port=reuse_port,
                    **RUNNER_OPTIONS)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return _fail(f"cannot listen on {host}:{port}: the port is in use", 1)
        raise
    except StateStoreError as exc:  # the chain's start, before the port is bound: the start-up check of one process
        return _fail(f"configuration error: gateway.state_url: {exc}", 2)
    return 0


def _die_with_parent(parent: int) -> None:
    """Linux: SIGTERM this worker when the supervisor dies (SIGKILL, the OOM killer). Orphaned workers kept
    serving without a supervisor and held the port, so a restarted gateway refused to start ("port in use")."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no such call
        return
    if os.getppid() != parent:  # the supervisor died before the call above
        sys.exit(1)


def _worker(config: str, host: str, port: int, parent: int | None = None) -> None:
    """One of --workers N processes: same config, same port through SO_REUSEPORT."""
    setup_logging()
    for sig in (signal.SIGTERM, signal.SIGINT):  # not the supervisor's handlers (inherited by fork); run_app sets its own
        signal.signal(sig, signal.SIG_DFL)
    if parent is not None and sys.platform.startswith("linux"):
        _die_with_parent(parent)
    sys.exit(_serve(load_config(Path(config)), host, port, reuse_port=True))


def _supervise(config: Path, host: str, port: int, workers: int) -> int:
    """Start `workers` processes and wait; SIGTERM/SIGINT stop them all; one dying stops the rest (exit 1)."""
    wake_r, wake_w = os.pipe()
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)
        os.write(wake_w, b"x")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    # fork where there is one: the parent holds no threads or loops by now and has imported everything,
    # so a worker starts in milliseconds (spawn re-imports the gateway: seconds on a loaded 2-core box)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    procs = [ctx.Process(target=_worker, args=(str(config), host, port, os.getpid()), name=f"hearth-gateway-{i}", daemon=False)
             for i in range(workers)]
    try:
        for p in procs:
            p.start()
        log.info("gateway supervising %d workers on %s:%d: pids %s", workers, host, port, [p.pid for p in procs])
        ready = multiprocessing.connection.wait([p.sentinel for p in procs] + [wake_r])
        died = [p for p in procs if p.sentinel in ready]
        for p in died:
            p.join(timeout=5)  # its sentinel closes a moment before the process can be reaped
        # A stop signal sent to the whole process group (systemd's default, a container runtime, Ctrl-C) reaches
        # the workers too: one may be gone before this process ran its handler. A worker that stopped cleanly
        # then is part of the stop, not a death (on_signal has run by now: the joins above wait in Python).
        stopped_cleanly = {0, -signal.SIGTERM, -signal.SIGINT}
        if stopping and all(p.exitcode in stopped_cleanly for p in died):
            died = []
        for p in died:
            log.error("worker %s (pid %d) exited with %s; stopping the others", p.name, p.pid, p.exitcode,
                      extra={"error": "worker"})
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=15)
            if p.is_alive():
                p.kill()
                p.join()
        for s, h in previous.items():
            signal.signal(s, h)
        os.close(wake_r)
        os.close(wake_w)
    return 0 if stopping and not died else 1


def main(config: Path, host: str = "127.0.0.1", port: int = 8400, workers: int = 1) -> int:
    """Entry point of `hearth gateway`. Returns the process exit code: 2 for a configuration error
    (including an unreachable state_url), 1 when the port is taken or a worker died."""
    setup_logging()
    if not isinstance(workers, int) or workers < 1:
        return _fail(f"--workers must be >= 1, got {workers!r}", 2)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        # before: 70000 passed the port check (getaddrinfo wraps it) and died in aiohttp's bind with an
        # OverflowError traceback; -1 was 'cannot listen on 127.0.0.1:-1: Servname not supported', exit 1
        return _fail(f"--port must be 0-65535, got {port!r}", 2)
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        log.error("configuration error: %s", exc, extra={"error": "config"})
        print(f"hearth gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    if workers > 1 and not cfg.gateway.state_url:
        return _fail(f"--workers {workers} needs [gateway] state_url (Redis): breaker, cooldown and warm state "
                     "must be shared by the workers", 2)
    if workers > 1 and port == 0:
        return _fail("--workers > 1 needs a fixed --port (port 0 would give each worker its own)", 2)
    taken = port_in_use(host, port)
    if taken is not None:
        return _fail(f"cannot listen on {host}:{port}: {taken.strerror or taken}", 1)
    log.info("gateway starting on %s:%d with providers %s (%d worker%s)", host, port, [p.name for p in cfg.providers],
             workers, "s" if workers > 1 else "")
    if workers == 1:  # the chain's start checks the state store, before the port is bound (_serve)
        return _serve(cfg, host, port, reuse_port=False)
    try:  # once here, rather than N workers failing one by one
        asyncio.run(_check_store(cfg))
    except StateStoreError as exc:
        return _fail(f"configuration error: gateway.state_url: {exc}", 2)
    return _supervise(config, host, port, workers)
