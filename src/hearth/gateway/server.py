"""`hearth gateway --config FILE`: the chain as an OpenAI-compatible HTTP API (aiohttp.web).

Routes:
    POST /v1/chat/completions   JSON, or SSE when "stream": true. The envelope kind comes from the
                                body's "hearth_kind" or the X-Hearth-Kind header (default
                                [gateway].default_kind); "hearth_deadline_s" may shorten the deadline.
                                The reply's message.content is the validated envelope (canonical JSON,
                                hearth.envelope.dumps); "hearth" says which provider answered and how.
                                All providers failed -> 502 (504 when only deadlines/timeouts), body lists each.
    GET  /v1/models             the configured providers' models
    GET  /v1/providers          breaker and warm-gate state per provider
    GET  /healthz               liveness (the process answers)
    GET  /readyz                config loaded and at least one provider not cooling down (else 503)
    GET  /metrics               Prometheus text format

Every response carries X-Request-ID (the client's, when it sent one, else a new one) and each request
logs one JSON line with it.

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

import itertools
import json
import logging
import os
import sys
import time
from pathlib import Path

from aiohttp import web

from hearth import envelope as env
from hearth.gateway.chain import Chain, StreamDelta, StreamDone
from hearth.gateway.config import ConfigError, GatewayConfig, load_config
from hearth.gateway.errors import AllProvidersFailed, DeadlineExceeded, ProviderError, StreamInterrupted, Timeout, UpstreamStatus, label

log = logging.getLogger("hearth.gateway.server")
CHAIN: web.AppKey[Chain] = web.AppKey("chain", Chain)
REQUEST_ID = web.RequestKey("request_id", str)
PROVIDER = web.RequestKey("provider", str)
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
               "msg": record.getMessage()}
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
def _error(status: int, message: str, request_id: str, **extra) -> web.Response:
    body = {"error": {"message": message, "type": "hearth_gateway", **extra}}
    return web.json_response(body, status=status, headers={"X-Request-ID": request_id})


def _describe(e: BaseException) -> dict:
    d = {"provider": getattr(e, "provider", None), "error": type(e).__name__,
         "label": label(e) if isinstance(e, ProviderError) else None, "message": str(e)}
    if isinstance(e, UpstreamStatus):
        d["status"] = e.status
        d["retry_after"] = e.retry_after
    if isinstance(e, Timeout):
        d["timeout"] = e.kind
    return d


def _failure_status(exc: AllProvidersFailed) -> int:
    tried = [e for e in exc.exceptions if e.outcome not in ("cooldown", "cold")]
    if tried and all(isinstance(e, (Timeout, DeadlineExceeded)) for e in tried):
        return 504
    return 502


def _completion(result, kind: str, request_id: str) -> dict:
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": int(time.time()),
            "model": result.provider,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": env.dumps_parsed(result.envelope)},
                         "finish_reason": result.finish_reason or "stop"}],
            "hearth": {"kind": kind, "provider": result.provider, "latency_ms": round(result.latency_s * 1e3, 3),
                       "attempts": [list(a) for a in result.attempts]}}


def _chunk(request_id: str, model: str, delta: dict, finish: str | None = None, **extra) -> bytes:
    obj = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
           "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


# ---------------------------------------------------------------------------------------- middleware
@web.middleware
async def request_context(request: web.Request, handler):
    rid = request.headers.get("X-Request-ID") or _new_request_id()
    if len(rid) > 128 or not rid.isprintable():
        rid = _new_request_id()
    request[REQUEST_ID] = rid
    start = time.perf_counter()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        if not resp.prepared:
            resp.headers["X-Request-ID"] = rid
        return resp
    except web.HTTPException as exc:
        status = exc.status
        exc.headers["X-Request-ID"] = rid
        raise
    finally:
        # one line per chat request; probes and scrapes stay quiet (and no extra dict when INFO is off)
        if request.path.startswith("/v1/chat") and log.isEnabledFor(logging.INFO):
            log.info("request", extra={"request_id": rid, "method": request.method, "path": request.path,
                                       "status": status, "latency_ms": round((time.perf_counter() - start) * 1e3, 3),
                                       "provider": request.get(PROVIDER)})


# ---------------------------------------------------------------------------------------- routes
async def chat(request: web.Request) -> web.StreamResponse:
    rid = request[REQUEST_ID]
    chain = request.app[CHAIN]
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return _error(400, "body must be JSON", rid)
    if not isinstance(body, dict):
        return _error(400, "body must be a JSON object", rid)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return _error(400, "messages must be a non-empty list of objects", rid, field="messages")
    kind = body.get("hearth_kind") or request.headers.get("X-Hearth-Kind") or chain.settings.default_kind
    if kind not in env.REPLY_KINDS:
        return _error(400, f"hearth_kind must be one of {list(env.REPLY_KINDS)}, got {kind!r}", rid, field="hearth_kind")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        return _error(400, "max_tokens must be a positive integer", rid, field="max_tokens")
    deadline = body.get("hearth_deadline_s")
    if deadline is not None and (not isinstance(deadline, (int, float)) or isinstance(deadline, bool) or deadline <= 0
                                 or deadline > chain.settings.deadline_s):
        return _error(400, f"hearth_deadline_s must be in (0, {chain.settings.deadline_s}]", rid, field="hearth_deadline_s")
    if body.get("stream"):
        return await _chat_stream(request, chain, messages, kind, max_tokens, deadline)
    try:
        result = await chain.complete(messages, kind=kind, deadline_s=deadline, max_tokens=max_tokens, request_id=rid)
    except AllProvidersFailed as exc:
        return _error(_failure_status(exc), str(exc.message), rid, failures=[_describe(e) for e in exc.exceptions])
    request[PROVIDER] = result.provider
    return web.json_response(_completion(result, kind, rid),
                             headers={"X-Request-ID": rid, "X-Hearth-Provider": result.provider})


async def _chat_stream(request, chain: Chain, messages, kind, max_tokens, deadline) -> web.StreamResponse:
    rid = request[REQUEST_ID]
    events = chain.stream(messages, kind=kind, deadline_s=deadline, max_tokens=max_tokens, request_id=rid)
    resp: web.StreamResponse | None = None
    try:
        async for ev in events:
            if resp is None:  # headers go out with the first delta: before it, failures are still a clean 502
                request[PROVIDER] = ev.provider if isinstance(ev, StreamDelta) else ev.result.provider
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                   "X-Request-ID": rid, "X-Hearth-Provider": request[PROVIDER]})
                await resp.prepare(request)
                await resp.write(_chunk(rid, request[PROVIDER], {"role": "assistant", "content": ""}))
            if isinstance(ev, StreamDelta):
                await resp.write(_chunk(rid, ev.provider, {"content": ev.text}))
            elif isinstance(ev, StreamDone):
                r = ev.result
                await resp.write(_chunk(rid, r.provider, {}, r.finish_reason or "stop",
                                        hearth={"kind": kind, "provider": r.provider,
                                                "envelope": r.envelope.model_dump(mode="json"),
                                                "attempts": [list(a) for a in r.attempts]}))
                await resp.write(b"data: [DONE]\n\n")
    except AllProvidersFailed as exc:
        return _error(_failure_status(exc), str(exc.message), rid, failures=[_describe(e) for e in exc.exceptions])
    except StreamInterrupted as exc:
        assert resp is not None
        err = {"error": {"message": str(exc), "type": "hearth_gateway", "provider": exc.provider,
                         "cause": _describe(exc.__cause__) if exc.__cause__ else None}}
        await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
    finally:
        await events.aclose()
    assert resp is not None
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    chain = request.app[CHAIN]
    return web.json_response({"object": "list", "data": [
        {"id": p.config.model, "object": "model", "created": 0, "owned_by": p.name} for p in chain.providers]})


async def providers(request: web.Request) -> web.Response:
    return web.json_response({"providers": request.app[CHAIN].status()})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    chain = request.app[CHAIN]
    status = chain.status()
    ready = chain.started and any(p["state"] != "open" for p in status)
    return web.json_response({"ready": ready, "providers": status}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[CHAIN].metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# ---------------------------------------------------------------------------------------- app
def create_app(config: GatewayConfig, *, chain: Chain | None = None) -> web.Application:
    """The aiohttp application; the chain starts and closes with it."""
    app = web.Application(middlewares=[request_context], client_max_size=_MAX_BODY)
    app[CHAIN] = chain or Chain(config)

    async def lifespan(app: web.Application):
        await app[CHAIN].start()
        yield
        await app[CHAIN].aclose()

    app.cleanup_ctx.append(lifespan)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/providers", providers)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def main(config: Path, host: str = "127.0.0.1", port: int = 8400) -> int:
    """Entry point of `hearth gateway`. Returns the process exit code (2 for a configuration error)."""
    setup_logging()
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        log.error("configuration error: %s", exc, extra={"error": "config"})
        print(f"hearth gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    log.info("gateway starting on %s:%d with providers %s", host, port, [p.name for p in cfg.providers])
    web.run_app(create_app(cfg), host=host, port=port, access_log=None, print=None, handle_signals=True)
    return 0
