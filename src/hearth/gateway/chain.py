"""The provider chain: warm gate, then ordered fallback under one request deadline, then the envelope.

    async with Chain(config) as chain:
        result = await chain.complete(messages, kind="chat")          # ChainResult
        async for ev in chain.stream(messages, kind="chat"): ...      # StreamDelta..., StreamDone

Order of one request: scale-to-zero providers that the warm gate calls warm go first, cold ones are
skipped (the gate starts their warm-up), then the rest in config order. A provider whose breaker is
open is skipped without a request. Each attempt gets min(its total_s, what is left of the deadline),
so a hang costs at most its own timeout and never the whole request past deadline_s.

Falls through on every ProviderError (timeouts, any non-2xx status incl. 429 whose Retry-After
becomes that provider's cooldown, connection failures, a reply that is not a chat completion, and a
reply that fails hearth.envelope.parse_envelope). A 4xx falls through too: providers differ in
what they accept, so one's 400 can be the next one's 200. When every provider failed:
AllProvidersFailed, one ProviderError per provider in chain order.

Streaming falls back only before the first content delta; once a byte was yielded, a failure ends
the stream with StreamInterrupted (no fallback: the client already shows text from that provider).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from pydantic import BaseModel

from hearth.envelope import REPLY_KINDS
from hearth.gateway.breaker import Breaker
from hearth.gateway.config import GatewayConfig
from hearth.gateway.errors import (
    AllProvidersFailed, Cold, ConnectionFailed, DeadlineExceeded, GatewayError, ProviderError, StreamInterrupted,
    Timeout, label,
)
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.providers import Provider
from hearth.gateway.transport.client import AiohttpTransport, Transport
from hearth.gateway.warm import WarmGate

__all__ = ["Chain", "ChainResult", "StreamDelta", "StreamDone"]
log = logging.getLogger("hearth.gateway.chain")


@dataclass(frozen=True)
class ChainResult:
    envelope: BaseModel                      # pydantic model of the requested kind
    text: str                                # the reply text as the provider sent it
    provider: str                            # name of the provider that answered
    latency_s: float                         # whole request, including skipped and failed attempts
    attempts: list[tuple[str, str]] = field(default_factory=list)   # (provider, outcome) in order; "ok" last
    finish_reason: str | None = None


@dataclass(frozen=True)
class StreamDelta:
    text: str
    provider: str


@dataclass(frozen=True)
class StreamDone:
    result: ChainResult


class Chain:
    """Ordered fallback over the configured providers. Call start() (or use `async with`) first."""

    def __init__(self, config: GatewayConfig, *, transport: Transport | None = None,
                 metrics: GatewayMetrics | None = None) -> None:
        if not isinstance(config, GatewayConfig):
            raise TypeError(f"config must be a GatewayConfig, got {type(config).__name__}")
        self.config = config
        self.settings = config.gateway
        self.transport = transport or AiohttpTransport(config.gateway.max_connections)
        self.metrics = metrics or GatewayMetrics()
        self.providers = [Provider(p, self.transport) for p in config.providers]
        s = config.gateway
        self.breakers = {p.name: Breaker(p.name, threshold=s.breaker_failures, cooldown_s=s.cooldown_s,
                                         max_retry_after_s=s.max_retry_after_s) for p in config.providers}
        self.gates = {p.name: WarmGate(p, self.transport, self.metrics) for p in config.providers if p.scale_to_zero}
        self.started = False

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> "Chain":
        await self.transport.start()
        self.started = True
        return self

    async def aclose(self) -> None:
        for gate in self.gates.values():
            await gate.aclose()
        await self.transport.aclose()
        self.started = False

    async def __aenter__(self) -> "Chain":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def status(self) -> list[dict]:
        """Per provider: breaker state and (scale-to-zero only) warm state, for /readyz and /v1/providers."""
        now = time.monotonic()
        out = []
        for p in self.providers:
            row = {"name": p.name, "model": p.config.model, **self.breakers[p.name].state(now)}
            if p.name in self.gates:
                row["warm_gate"] = self.gates[p.name].state()
            out.append(row)
        return out

    # ------------------------------------------------------------------ ordering
    async def _plan(self, deadline_at: float) -> tuple[list[Provider], list[ProviderError]]:
        """Providers to try in order, plus the skipped ones' errors (cooldown, cold)."""
        now = time.monotonic()
        skipped: list[ProviderError] = []
        open_ok: list[Provider] = []
        for p in self.providers:
            cooling = self.breakers[p.name].check(now)
            if cooling is not None:
                skipped.append(cooling)
            else:
                open_ok.append(p)
        gated = [p for p in open_ok if p.name in self.gates]
        if not gated:
            return open_ok, skipped
        try:
            async with asyncio.timeout(max(deadline_at - time.monotonic(), 0.0)):
                warm = await asyncio.gather(*(self.gates[p.name].is_warm() for p in gated))
        except TimeoutError:  # the request deadline is shorter than a probe: treat them as cold
            warm = [False] * len(gated)
        warm_by_name = {p.name: w for p, w in zip(gated, warm)}
        first = [p for p in gated if warm_by_name[p.name]]
        skipped += [Cold(p.name) for p in gated if not warm_by_name[p.name]]
        rest = [p for p in open_ok if p.name not in self.gates]
        return first + rest, skipped

    def _check(self, messages: list[dict], kind: str, deadline_s: float | None) -> float:
        if kind not in REPLY_KINDS:
            raise ValueError(f"kind must be one of {REPLY_KINDS}, got {kind!r}")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise TypeError("messages must be a non-empty list of dicts ({'role': ..., 'content': ...})")
        if deadline_s is None:
            return self.settings.deadline_s
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        return float(deadline_s)

    def _failed(self, error: ProviderError, elapsed: float | None, request_id: str | None) -> None:
        name = error.provider
        lab = label(error)
        self.metrics.child(self.metrics.errors, name, lab).inc()
        if elapsed is None:  # skipped: no request was made, the breaker learns nothing
            return
        self.metrics.child(self.metrics.attempt_seconds, name, "error").observe(elapsed)
        if name in self.gates and isinstance(error, (ConnectionFailed, Timeout)):
            # a "warm" answer is stale once the endpoint stops answering (scaled back to zero): re-probe
            self.gates[name].invalidate()
        if self.breakers[name].failure(error):
            self.metrics.breaker_open.labels(name).set(1)
            log.warning("provider %s cooling down: %s", name, self.breakers[name].why,
                        extra={"request_id": request_id, "provider": name})
        log.info("attempt failed: %s", error, extra={"request_id": request_id, "provider": name, "error": lab})

    def _attempt_failed(self, error: ProviderError, t0: float, request_id: str | None,
                        errors: list[ProviderError], attempts: list, *, fell_back: bool) -> None:
        """Record one failed attempt (metrics, breaker, the request's error list) before falling back."""
        self._failed(error, time.monotonic() - t0, request_id)
        errors.append(error)
        attempts.append((error.provider, label(error)))
        if fell_back:
            self.metrics.child(self.metrics.fallbacks, error.provider).inc()

    def _succeeded(self, name: str, kind: str, elapsed: float, request_s: float) -> None:
        self.metrics.child(self.metrics.requests, kind, "ok").inc()
        self.metrics.child(self.metrics.request_seconds, kind).observe(request_s)
        self.metrics.child(self.metrics.attempt_seconds, name, "ok").observe(elapsed)
        breaker = self.breakers[name]
        if breaker.failures:
            breaker.success()
            self.metrics.breaker_open.labels(name).set(0)

    def _all_failed(self, errors: list[ProviderError], kind: str, start: float, outcome: str = "failed") -> AllProvidersFailed:
        self.metrics.child(self.metrics.requests, kind, outcome).inc()
        self.metrics.child(self.metrics.request_seconds, kind).observe(time.monotonic() - start)
        return AllProvidersFailed(f"all {len(self.providers)} providers failed", errors)

    # ------------------------------------------------------------------ JSON
    async def complete(self, messages: list[dict], *, kind: str, deadline_s: float | None = None,
                       max_tokens: int | None = None, request_id: str | None = None) -> ChainResult:
        """One envelope of `kind`. Raises AllProvidersFailed, or ValueError/TypeError for bad arguments."""
        deadline_s = self._check(messages, kind, deadline_s)
        start = time.monotonic()
        deadline_at = start + deadline_s
        plan, errors = await self._plan(deadline_at)
        attempts = [(e.provider, label(e)) for e in errors]
        for i, p in enumerate(plan):
            left = deadline_at - time.monotonic()
            if left <= 0:
                errors += [DeadlineExceeded(q.name, deadline_s) for q in plan[i:]]
                break
            t0 = time.monotonic()
            try:
                done = await p.complete(messages, kind, budget_s=left, max_tokens=max_tokens, request_id=request_id)
            except ProviderError as exc:
                self._attempt_failed(exc, t0, request_id, errors, attempts, fell_back=i + 1 < len(plan))
                continue
            now = time.monotonic()
            self._succeeded(p.name, kind, now - t0, now - start)
            attempts.append((p.name, "ok"))
            return ChainResult(done.envelope, done.text, p.name, now - start, attempts, done.finish_reason)
        raise self._all_failed(errors, kind, start)

    # ------------------------------------------------------------------ SSE
    async def stream(self, messages: list[dict], *, kind: str, deadline_s: float | None = None,
                     max_tokens: int | None = None, request_id: str | None = None
                     ) -> AsyncIterator[StreamDelta | StreamDone]:
        """Yield StreamDelta(text) as they arrive, then one StreamDone(result).

        Raises AllProvidersFailed before the first delta, StreamInterrupted after it.
        """
        deadline_s = self._check(messages, kind, deadline_s)
        start = time.monotonic()
        deadline_at = start + deadline_s
        plan, errors = await self._plan(deadline_at)
        attempts = [(e.provider, label(e)) for e in errors]
        for i, p in enumerate(plan):
            left = deadline_at - time.monotonic()
            if left <= 0:
                errors += [DeadlineExceeded(q.name, deadline_s) for q in plan[i:]]
                break
            t0 = time.monotonic()
            try:
                upstream, first = await p.open_stream(messages, kind, budget_s=left, max_tokens=max_tokens,
                                                      request_id=request_id)
            except ProviderError as exc:
                self._attempt_failed(exc, t0, request_id, errors, attempts, fell_back=i + 1 < len(plan))
                continue
            # committed to this provider: from here on a failure cannot fall back
            parts = [first]
            try:
                yield StreamDelta(first, p.name)
                while (delta := await upstream.next_delta()) is not None:
                    parts.append(delta)
                    yield StreamDelta(delta, p.name)
                text = "".join(parts)
                envelope = upstream.envelope(text, kind)
            except ProviderError as exc:
                self._failed(exc, time.monotonic() - t0, request_id)
                self.metrics.child(self.metrics.requests, kind, "interrupted").inc()
                raise StreamInterrupted(p.name, exc) from exc
            finally:
                upstream.close()
            now = time.monotonic()
            self._succeeded(p.name, kind, now - t0, now - start)
            attempts.append((p.name, "ok"))
            yield StreamDone(ChainResult(envelope, text, p.name, now - start, attempts, upstream.finish_reason))
            return
        raise self._all_failed(errors, kind, start)


# GatewayError is re-exported for callers that catch everything the chain raises on purpose.
__all__ += ["GatewayError"]
