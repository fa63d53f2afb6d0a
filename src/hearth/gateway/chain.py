"""The provider chain: warm gate, then ordered fallback under one request deadline, then the envelope.

    async with Chain(config) as chain:
        result = await chain.complete(messages, kind="chat")          # ChainResult
        async for ev in chain.stream(messages, kind="chat"): ...      # StreamDelta..., StreamDone

Order of one request: scale-to-zero providers that the warm gate calls warm go first, cold ones are
skipped (the gate starts their warm-up, unless their endpoint is held cold after failed warm-ups: then
the skip's message says for how long), then the rest in config order. A provider whose breaker is
open is skipped without a request (a scale-to-zero one's gate is still woken, WarmGate.wake: a cold
endpoint warms up during the cooldown); when its cooldown has ended, ONE request at a time (across
workers, with a shared store) gets to try it, the others skip it while that trial runs. The breakers
are read when the request starts and again before each attempt that follows one which went upstream
(it may have taken its whole timeout: a breaker that opened meanwhile is honoured by requests already
in flight). Each attempt gets min(its total_s, what is left of the deadline), so a hang costs at most
its own timeout and never the whole request past deadline_s.

`model` picks the providers: None or "hearth" (MODEL_ALIAS) means all of them; any other value the
providers whose name or model id it is (a provider group, in chain order); no match: UnknownModel.

Falls through on every ProviderError (timeouts, any non-2xx status incl. 429 whose Retry-After
becomes that provider's cooldown, connection failures, a reply that is not a chat completion, a
reply that fails hearth.envelope.parse_envelope, and, for a kind the app streams
(streamfilter.STREAMED_KINDS), a reply that a stream would fail: streamfilter.check_streamed, so
complete() and stream() accept the same replies). A client error (upstream 4xx other than
401/402/403/404/407/408/429, e.g. 400 context_length_exceeded) falls through too, since providers
differ in what they accept, but never counts toward the breaker (hearth.gateway.breaker); nor does a
deadline the request shortened itself (hearth_deadline_s) running out. When every
provider failed: AllProvidersFailed, one ProviderError per provider in chain order, and its available_in_s:
per provider, when it may be tried again as the state says once the request gave up (Chain._available_in_s),
so the reply can tell the client when to come back also after attempts that opened a breaker.

Streaming: deltas carry only the text of the reply's JSON object (hearth.envelope_stream.EnvelopeFilter: no
think block, no fences, no chatter). The chain falls back until the first such byte is yielded;
after it, a failure ends the stream with StreamInterrupted (no fallback: the client already shows
text from that provider). A reply past hearth.envelope.MAX_REPLY_CHARS fails as soon as it gets there
(InvalidEnvelope, as the JSON path refuses it), not when the provider stops. While the consumer holds a delta
(the server writing it to a slow client) the attempt's clock stops (ChatStream.away): total_s, the deadline's cap
on the attempt and attempt_seconds measure the provider; the request's own latency keeps all of it.

The result names the provider that answered and its configured model id (what the gateway's replies call
`model`), and carries that attempt's usage as the provider reported it (None when it reported none; a failed
attempt's usage is never the result's).

Cancellation (the client hung up): the upstream request is closed at once, nothing is counted
against the provider, and a half-open trial it held is given back.

Metrics: every complete() / stream() that gets past its argument checks records exactly ONE request
outcome with its duration (GatewayMetrics.request_done; outcomes in hearth.gateway.metrics.OUTCOMES):
ok, failed (AllProvidersFailed), interrupted (StreamInterrupted), client_cancelled (cancelled, or a
stream closed by its consumer before its end), client_stalled (the consumer threw ClientStalled into the stream
with athrow: its client took no bytes for stream_write_timeout_s) or error (anything else, e.g. StateStoreError).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator

from pydantic import BaseModel

from hearth import envelope as env
from hearth.envelope import REPLY_KINDS
from hearth.gateway.breaker import Breaker
from hearth.gateway.config import GatewayConfig
from hearth.gateway.errors import (
    AllProvidersFailed, ClientStalled, Cold, ConnectionFailed, Cooldown, DeadlineExceeded, GatewayError, HeldCold,
    InvalidEnvelope, ProviderError, StreamInterrupted, Timeout, for_log, label,
)
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.providers import Provider
from hearth.gateway.state import BreakerSnapshot, StateStore, StateStoreError, make_store
from hearth.gateway.streamfilter import STREAMED_KINDS, EnvelopeFilter, check_streamed
from hearth.gateway.transport.client import AiohttpTransport, Transport
from hearth.gateway.warm import WarmGate

__all__ = ["Chain", "ChainResult", "StreamDelta", "StreamDone", "UnknownModel", "MODEL_ALIAS"]
log = logging.getLogger("hearth.gateway.chain")
MODEL_ALIAS = "hearth"


class UnknownModel(GatewayError, ValueError):
    """`model` names no provider and no provider's model id."""

    def __init__(self, model: str, known: list[str]) -> None:
        self.model = model
        self.known = known
        super().__init__(f"model {model!r} is not served here; known: {known}")


@dataclass(frozen=True)
class ChainResult:
    envelope: BaseModel                      # pydantic model of the requested kind
    text: str                                # the reply text as the provider sent it
    provider: str                            # name of the provider that answered
    latency_s: float                         # whole request, including skipped and failed attempts
    attempts: list[tuple[str, str]] = field(default_factory=list)   # (provider, outcome) in order; "ok" last
    finish_reason: str | None = None         # the provider's, never made up (None when it sent none)
    model: str | None = None                 # the answering provider's configured model id
    usage: dict[str, int] | None = None      # the answering attempt's prompt/completion/total_tokens, as the
                                             # provider reported them (None when it reported none)


@dataclass(frozen=True)
class StreamDelta:
    text: str
    provider: str
    model: str | None = None                 # the provider's configured model id


@dataclass(frozen=True)
class StreamDone:
    result: ChainResult


class _Attempt:
    """One provider's turn in one request (Chain._turn): its trial, whether its outcome was recorded, what it got."""

    __slots__ = ("provider", "snap", "trial", "settled", "t0", "upstream", "shown", "reply", "result")

    def __init__(self, provider: Provider, snap: BreakerSnapshot) -> None:
        self.provider = provider
        self.snap = snap
        self.trial: str | None = None
        self.settled = False
        self.t0 = time.monotonic()
        self.upstream = None                    # an open stream, closed when the turn ends
        self.shown = False                      # the client shows its text: a failure interrupts, no fallback
        self.reply: tuple | None = None         # (envelope, text, finish_reason, usage): it answered
        self.result: ChainResult | None = None  # the request's result: its success is recorded


@dataclass
class _Walk:
    """One request's walk down its plan (complete and stream share it): its clock and what each turn left."""

    kind: str
    deadline_s: float
    start: float
    plan: list[_Attempt]
    errors: list[ProviderError]
    attempts: list
    client_deadline: bool = False  # the request shortened the gateway's deadline (hearth_deadline_s)
    client_cap: bool = False       # the request capped the reply (max_tokens)
    recorded: bool = False         # its one request outcome is in the metrics (Chain._finish)
    sent: bool = False             # an attempt of it went to a provider (later ones re-read their breaker)

    def turns(self) -> Iterator[tuple[int, _Attempt, float]]:
        """(index, attempt, seconds left) while time is left; when it runs out, each attempt not made becomes a
        DeadlineExceeded in errors."""
        deadline_at = self.start + self.deadline_s
        for i, a in enumerate(self.plan):
            left = deadline_at - time.monotonic()
            if left <= 0:
                self.errors += [DeadlineExceeded(q.provider.name, self.deadline_s, self.client_deadline)
                                for q in self.plan[i:]]
                return
            yield i, a, left


class Chain:
    """Ordered fallback over the configured providers. Call start() (or use `async with`) first."""

    def __init__(self, config: GatewayConfig, *, transport: Transport | None = None,
                 metrics: GatewayMetrics | None = None, store: StateStore | None = None) -> None:
        if not isinstance(config, GatewayConfig):
            raise TypeError(f"config must be a GatewayConfig, got {type(config).__name__}")
        self.config = config
        self.settings = config.gateway
        self.transport = transport or AiohttpTransport(config.gateway.max_connections)
        self.metrics = metrics or GatewayMetrics()
        self.store = store if store is not None else make_store(config.gateway)
        self.providers = [Provider(p, self.transport) for p in config.providers]
        self.names = [p.name for p in self.providers]
        s = config.gateway
        self.breakers = {p.name: Breaker(p.name, self.store, threshold=s.breaker_failures, cooldown_s=s.cooldown_s,
                                         max_retry_after_s=s.max_retry_after_s,
                                         trial_lease_s=p.timeouts.total_s + 5.0) for p in config.providers}
        # one gate per endpoint (health_url), not per provider: two providers on one scale-to-zero server (two
        # LoRA adapters a vLLM serves, one model at two settings) share its warm state, its probe and ONE warm-up;
        # the first of them in the TOML gives the gate its name, warm settings and probe headers (health_headers)
        by_endpoint: dict[str, WarmGate] = {}
        self.gates = {}
        for p in config.providers:
            if p.scale_to_zero:
                gate = by_endpoint.get(p.health_url)
                if gate is None:
                    gate = by_endpoint[p.health_url] = WarmGate(p, self.transport, self.metrics, self.store)
                self.gates[p.name] = gate
        self.started = False

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> "Chain":
        """Connect the state store (a wrong state_url fails here, StateStoreError) and the HTTP client."""
        await self.store.start()
        await self.transport.start()
        self.started = True
        return self

    async def aclose(self) -> None:
        for gate in {id(g): g for g in self.gates.values()}.values():  # a shared gate once
            await gate.aclose()
        await self.transport.aclose()
        await self.store.aclose()
        self.started = False

    async def __aenter__(self) -> "Chain":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def status(self) -> list[dict]:
        """Per provider: breaker state and (scale-to-zero only) warm state, for /readyz and /v1/providers."""
        snaps = await self.store.breakers(self.names)
        out = []
        for p, snap in zip(self.providers, snaps):
            row = {"name": p.name, "model": p.config.model, **self.breakers[p.name].state(snap)}
            if p.name in self.gates:
                row["warm_gate"] = await self.gates[p.name].state()
            out.append(row)
        return out

    async def sync_breaker_gauge(self) -> None:
        """Set hearth_gateway_breaker_open (and each endpoint's hearth_gateway_warm_backoff_seconds) from the
        (shared) store, for a scrape. The failure and success paths set them too, but only in the worker where they
        happen: a breaker another worker's trial closed, or a cooldown that simply ran out, left this worker's gauge
        at 1 for good. StateStoreError when it is down."""
        snaps = await self.store.breakers(self.names)
        for name, snap in zip(self.names, snaps):
            self.metrics.breaker_open.labels(name).set(1 if snap.open_left_s > 0 else 0)
        for gate in {id(g): g for g in self.gates.values()}.values():  # a shared gate once
            await gate.sync_backoff_gauge()

    def models(self) -> list[str]:
        """Model names a request may use: the alias for the whole chain, then each distinct model id."""
        out = [MODEL_ALIAS]
        for p in self.providers:
            if p.config.model not in out:
                out.append(p.config.model)
        return out

    # ------------------------------------------------------------------ ordering
    def providers_for(self, model: str | None) -> list[Provider]:
        """The providers a request naming `model` goes to, in chain order; UnknownModel when none."""
        if model is None or model == MODEL_ALIAS:
            return self.providers
        group = [p for p in self.providers if model in (p.name, p.config.model)]
        if not group:
            raise UnknownModel(model, self.models())
        return group

    async def _plan(self, providers: list[Provider], deadline_at: float) -> tuple[list[_Attempt], list[ProviderError]]:
        """Providers to try in order, plus the skipped ones' errors (cooldown, cold) in the order of `providers`."""
        snaps = await self.store.breakers([p.name for p in providers])
        # by provider, put back in config order at the end: the breaker skips are decided before the cold ones, and
        # a result's attempts and the failure's list named them in that order, one no config has
        skipped: dict[str, ProviderError] = {}
        open_ok: list[_Attempt] = []
        for p, snap in zip(providers, snaps):
            cooling = self.breakers[p.name].skip(snap)
            if cooling is not None:
                self._skipped(cooling)
                skipped[p.name] = cooling
                if p.name in self.gates:  # not tried now, but wanted: a cold endpoint warms up meanwhile
                    self.gates[p.name].wake()
            else:
                open_ok.append(_Attempt(p, snap))
        gated = [a for a in open_ok if a.provider.name in self.gates]
        if not gated:
            return open_ok, list(skipped.values())
        left = deadline_at - time.monotonic()
        warm_by_name: dict[str, tuple[bool, float]] = {}

        async def decide(a: _Attempt) -> None:
            # kept as each verdict comes back: the deadline's cut below must not take the ones already in with it
            gate = self.gates[a.provider.name]
            # a gate whose probe may take the whole deadline left (a request's own short hearth_deadline_s; the
            # gateway's deadline_s is checked against probe_timeout_s at start-up) is not waited for: a hung
            # health route spent the deadline here and no provider, the hosted fallback included, was tried
            warm_by_name[a.provider.name] = await gate.verdict(a.provider.name,
                                                               wait=gate.settings.probe_timeout_s < left)

        try:
            async with asyncio.timeout(max(left, 0.0)):
                await asyncio.gather(*(decide(a) for a in gated))
        except TimeoutError:
            # the deadline ran out before some verdicts came back (the state store stalled on a read, a probe ran
            # past probe_timeout_s with the store writes after its GET): those count as cold, as verdict() would
            # have counted them, and their gates are woken, since a verdict cut before its probe started none and
            # the cold endpoint would stay cold for the next request too. A verdict already in is kept: a warm
            # endpoint is then skipped for the deadline (DeadlineExceeded), not reported cold.
            for a in gated:
                name = a.provider.name
                if name not in warm_by_name:
                    warm_by_name[name] = self.gates[name].cut(name)
        first = [a for a in gated if warm_by_name[a.provider.name][0]]
        for a in gated:
            is_warm, held_s = warm_by_name[a.provider.name]
            if not is_warm:
                skipped[a.provider.name] = HeldCold(a.provider.name, held_s) if held_s > 0 else Cold(a.provider.name)
        rest = [a for a in open_ok if a.provider.name not in self.gates]
        return first + rest, [skipped[p.name] for p in providers if p.name in skipped]

    def _walk(self, messages: list[dict], kind: str, deadline_s: float | None, model: str | None,
              max_tokens: int | None = None, request_id: str | None = None) -> tuple[_Walk, list[Provider]]:
        """Check the arguments (ValueError, TypeError, UnknownModel: refused, not a request), pick the providers
        for `model` and start the request's clock; _plan_walk() plans the attempts."""
        deadline_s = self._check(messages, kind, deadline_s, max_tokens, request_id)
        providers = self.providers_for(model)
        return _Walk(kind, deadline_s, time.monotonic(), [], [], [],
                     client_deadline=deadline_s < self.settings.deadline_s, client_cap=max_tokens is not None), providers

    async def _plan_walk(self, w: _Walk, providers: list[Provider]) -> None:
        w.plan, w.errors = await self._plan(providers, w.start + w.deadline_s)
        w.attempts = [(e.provider, label(e)) for e in w.errors]

    def _check(self, messages: list[dict], kind: str, deadline_s: float | None, max_tokens: int | None = None,
               request_id: str | None = None) -> float:
        """The request's arguments checked (ValueError / TypeError naming the bad one) before any provider sees them
        (a bad max_tokens went out to each, each refused it with a 400, and the caller got AllProvidersFailed naming
        no argument); returns the deadline in seconds."""
        if kind not in REPLY_KINDS:
            raise ValueError(f"kind must be one of {REPLY_KINDS}, got {kind!r}")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise TypeError("messages must be a non-empty list of dicts ({'role': ..., 'content': ...})")
        if deadline_s is not None:
            if not isinstance(deadline_s, (int, float)) or isinstance(deadline_s, bool):
                raise TypeError(f"deadline_s must be a number of seconds or None, got {type(deadline_s).__name__}")
            if not deadline_s > 0:
                raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        if max_tokens is not None:
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
                raise TypeError(f"max_tokens must be a positive int or None, got {type(max_tokens).__name__}")
            if max_tokens < 1:
                raise ValueError(f"max_tokens must be a positive int or None, got {max_tokens}")
        if request_id is not None and not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str or None, got {type(request_id).__name__}")
        return self.settings.deadline_s if deadline_s is None else float(deadline_s)

    # ------------------------------------------------------------------ outcomes
    async def _begin(self, a: _Attempt, w: _Walk) -> bool:
        """Claim the half-open trial when the provider needs one; False (and a Cooldown) when another has it, or
        when its breaker opened since the plan read it."""
        breaker = self.breakers[a.provider.name]
        if w.sent:
            # An earlier attempt of this request ran (up to its timeout): the plan's view of this breaker is that
            # old. Read it again, or a breaker that opened meanwhile sheds none of the requests in flight, and a
            # half-open one gets a second "single" trial (a stale CLOSED snapshot claims no trial).
            a.snap = (await self.store.breakers([a.provider.name]))[0]
            cooling = breaker.skip(a.snap)
            if cooling is not None:
                self._skipped(cooling)
                w.errors.append(cooling)
                w.attempts.append((a.provider.name, label(cooling)))
                return False
        a.trial, skipped = await breaker.trial(a.snap)
        if skipped is not None:
            self._skipped(skipped)
            w.errors.append(skipped)
            w.attempts.append((a.provider.name, label(skipped)))
            return False
        w.sent = True
        a.t0 = time.monotonic()
        return True

    def _skipped(self, cooling: Cooldown) -> None:
        """Count a request that skipped a provider for its breaker (errors_total{error="cooldown"}): the plan's skip,
        the re-read's before a later attempt and a refused trial claim alike, once per request and provider."""
        self.metrics.child(self.metrics.errors, cooling.provider, label(cooling)).inc()

    async def _abandon(self, a: _Attempt) -> None:
        """The attempt ended without a verdict (cancelled): give its trial back, count nothing."""
        if not a.settled and a.trial is not None:
            a.settled = True
            try:
                await asyncio.shield(self.store.release_trial(a.provider.name, a.trial))
            except Exception as exc:  # the lease expires by itself
                log.warning("could not give back the trial of %s: %r", a.provider.name, exc)

    async def _failed(self, a: _Attempt, error: ProviderError, request_id: str | None, w: _Walk) -> None:
        # Settled only once the failure is recorded (as _succeeded): a request cancelled before (its client hung up
        # while the gate forgot its answer or the failure waited for the store) left its half-open trial held, and
        # the provider skipped for the trial's lease. Giving back a trial the failure already released does nothing.
        if isinstance(error, DeadlineExceeded) and w.client_deadline:
            error.client_set = True  # the request's own short deadline: not the provider's failure (breaker.counts)
        if isinstance(error, InvalidEnvelope) and error.finish_reason == "length" and w.client_cap:
            # cut short by the max_tokens the request asked for: three requests for a few tokens opened the breaker
            # of every provider they reached, for everyone (breaker.counts)
            error.client_capped = True
        name = error.provider
        lab = label(error)
        self.metrics.child(self.metrics.errors, name, lab).inc()
        self.metrics.child(self.metrics.attempt_seconds, name, "error").observe(time.monotonic() - a.t0)
        if name in self.gates and isinstance(error, (ConnectionFailed, Timeout, DeadlineExceeded)):
            # a "warm" answer is stale once the endpoint stops answering (scaled back to zero): re-probe. Also when
            # the request's deadline cut the wait (a short deadline: the app's, below first_token_s): "warm" stayed
            # trusted for the rest of ttl_s and every request spent its wait on the cold endpoint first
            await self.gates[name].invalidate()
        opened = await self.breakers[name].failure(error, a.trial)
        a.settled = True
        if opened:
            self.metrics.breaker_open.labels(name).set(1)
            log.warning("provider %s cooling down: %s", name, for_log(error),
                        extra={"request_id": request_id, "provider": name})
        log.info("attempt failed: %s", for_log(error), extra={"request_id": request_id, "provider": name, "error": lab})

    async def _succeeded(self, w: _Walk, a: _Attempt) -> None:
        """Record `a`'s success and the request's result from its reply (a.result, with `a`'s usage only)."""
        # Settled only once the success is recorded: _turn's finally (_abandon) gives a half-open trial back
        # only when recording it failed. Giving it back first let another request/worker claim a second
        # "single" trial in the gap before the breaker closed.
        name = a.provider.name
        self.metrics.child(self.metrics.attempt_seconds, name, "ok").observe(time.monotonic() - a.t0)
        # recorded also when the plan read no failures (a CLOSED snapshot): failures of requests admitted after this
        # one may have landed meanwhile, and this success ends their run (skipping the store here let failures with
        # successes between them open the breaker as if in a row). Only the trial's own success closes a tripped
        # breaker: a request admitted before it opened, whose success lands after, leaves it (and its gauge) as it is
        if await self.breakers[name].success(a.trial):
            self.metrics.child(self.metrics.breaker_open, name).set(0)  # every success now: the memoised child
        a.settled = True
        now = time.monotonic()
        self._finish(w, "ok", now)
        w.attempts.append((name, "ok"))
        envelope, text, finish_reason, usage = a.reply
        a.result = ChainResult(envelope, text, name, now - w.start, w.attempts, finish_reason, a.provider.config.model,
                               usage)

    def _finish(self, w: _Walk, outcome: str, now: float | None = None) -> None:
        """The request's one outcome (hearth.gateway.metrics.OUTCOMES) and its duration; later calls do nothing."""
        if not w.recorded:
            w.recorded = True
            self.metrics.request_done(w.kind, outcome, (time.monotonic() if now is None else now) - w.start)

    def _ended(self, w: _Walk, exc: BaseException) -> None:
        """Record how a request that raised `exc` ended (unless its outcome is recorded already)."""
        if isinstance(exc, AllProvidersFailed):
            outcome = "failed"
        elif isinstance(exc, StreamInterrupted):
            outcome = "interrupted"
        elif isinstance(exc, ClientStalled):
            # the server's write to a client that takes no bytes timed out (stream_write_timeout_s): the client's
            # doing, not the provider's, and not a hang-up either
            outcome = "client_stalled"
        elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            # cancelled (the client hung up: aiohttp cancels its handler), or a stream closed before its end
            # (its consumer stopped reading: the client went away)
            outcome = "client_cancelled"
        else:
            outcome = "error"  # the gateway's own failure: the state store, a bug
        self._finish(w, outcome)

    async def _all_failed(self, errors: list[ProviderError]) -> AllProvidersFailed:
        # one error per provider, in config order: the walk's list has the plan's skips first, then the attempts in
        # the order they were made (warm gated endpoints first), and the reply's failures, the log and the server's
        # tie-break of next_available ("the first in chain order") read it as the chain's order
        order = {name: i for i, name in enumerate(self.names)}
        errors = sorted(errors, key=lambda e: order.get(e.provider, len(order)))
        exc = AllProvidersFailed(f"all {len(errors)} providers failed", errors)
        try:
            exc.available_in_s = await self._available_in_s([e.provider for e in errors])
        except StateStoreError as err:  # the failure is still the answer; the reply falls back to what errors say
            log.warning("could not read when the providers may be tried again: %s", err, extra={"error": "state_store"})
        return exc

    async def _available_in_s(self, names: list[str]) -> list[float | None]:
        """Per provider, read now (after its attempt, which may have opened its breaker): seconds until a request
        may try it again. 0.0: at once. None: not known (its half-open trial is in flight; a gate with nothing to
        wait for). A provider that both cools down and is cold gets the longer wait; an unknown part with a known
        one gives the known one (a lower bound)."""
        snaps = await self.store.breakers(names)
        gated = {id(self.gates[n]): self.gates[n] for n in names if n in self.gates}  # a shared gate once
        gate_waits = dict(zip(gated, await asyncio.gather(*(g.available_in_s() for g in gated.values()))))
        out: list[float | None] = []
        for name, snap in zip(names, snaps):
            parts: list[float | None] = []
            if snap.open_left_s > 0:
                parts.append(snap.open_left_s)
            elif snap.tripped and snap.trial:
                parts.append(None)
            if name in self.gates:
                parts.append(gate_waits[id(self.gates[name])])
            known = [w for w in parts if w]
            out.append(max(known) if known else (None if None in parts else 0.0))
        return out

    @asynccontextmanager
    async def _turn(self, w: _Walk, i: int, a: _Attempt, request_id: str | None) -> AsyncIterator[None]:
        """One attempt's body (complete's, stream's) and its verdict, in the order both need: a ProviderError is
        recorded and falls through (once a.shown: StreamInterrupted); a.reply is recorded as the success while the
        trial is still held; then the upstream is closed and a trial left without a verdict given back."""
        try:
            try:
                yield
            except ProviderError as exc:
                await self._failed(a, exc, request_id, w)
                if a.shown:  # the client shows this provider's text: no fallback
                    raise StreamInterrupted(a.provider.name, exc) from exc
                w.errors.append(exc)
                w.attempts.append((exc.provider, label(exc)))
                if i + 1 < len(w.plan):
                    self.metrics.child(self.metrics.fallbacks, exc.provider).inc()
                return
            await self._succeeded(w, a)
        finally:
            if a.upstream is not None:
                a.upstream.close()
            await self._abandon(a)  # gives back a trial only if no verdict was recorded

    # ------------------------------------------------------------------ JSON
    async def complete(self, messages: list[dict], *, kind: str, deadline_s: float | None = None,
                       max_tokens: int | None = None, request_id: str | None = None,
                       model: str | None = None) -> ChainResult:
        """One envelope of `kind`. Raises AllProvidersFailed, UnknownModel, or ValueError/TypeError for bad arguments."""
        w, providers = self._walk(messages, kind, deadline_s, model, max_tokens, request_id)
        try:
            await self._plan_walk(w, providers)
            for i, a, left in w.turns():
                if not await self._begin(a, w):
                    continue
                async with self._turn(w, i, a, request_id):
                    done = await a.provider.complete(messages, kind, budget_s=left, max_tokens=max_tokens,
                                                     request_id=request_id)
                    if kind in STREAMED_KINDS:
                        # the app streams this kind: a reply its stream would fail (a draft shown, then refused)
                        # is no answer here either, so the next provider gets the turn and the breaker counts it
                        check_streamed(done.text, a.provider.name)
                    a.reply = (done.envelope, done.text, done.finish_reason, done.usage)
                if a.result is not None:
                    return a.result
            raise await self._all_failed(w.errors)
        except BaseException as exc:  # every way out records the request's one outcome (ok did in _succeeded)
            self._ended(w, exc)
            raise

    # ------------------------------------------------------------------ SSE
    async def stream(self, messages: list[dict], *, kind: str, deadline_s: float | None = None,
                     max_tokens: int | None = None, request_id: str | None = None, model: str | None = None
                     ) -> AsyncIterator[StreamDelta | StreamDone]:
        """Yield StreamDelta(text) as they arrive (the envelope's JSON text only), then one StreamDone(result).

        Raises AllProvidersFailed (or UnknownModel) before the first delta, StreamInterrupted after it.
        """
        w, providers = self._walk(messages, kind, deadline_s, model, max_tokens, request_id)
        try:
            await self._plan_walk(w, providers)
            for i, a, left in w.turns():
                if not await self._begin(a, w):
                    continue
                p = a.provider
                cut = EnvelopeFilter()
                raw: list[str] = []
                async with self._turn(w, i, a, request_id):
                    a.upstream, delta = await p.open_stream(messages, kind, budget_s=left, max_tokens=max_tokens,
                                                            request_id=request_id)
                    size = 0
                    while delta is not None:
                        raw.append(delta)
                        size += len(delta)
                        if size > env.MAX_REPLY_CHARS:  # refused at the end anyway: stop reading (showing) it now
                            a.upstream.envelope("".join(raw), kind)  # raises InvalidEnvelope: over the limit
                        shown = cut.feed(delta)
                        if shown:
                            a.shown = True
                            away = time.monotonic()
                            yield StreamDelta(shown, p.name, p.config.model)
                            # the consumer's time with the delta (the server writing it to a slow client): neither
                            # the provider's total_s / deadline (providers.py) nor its attempt_seconds
                            away = time.monotonic() - away
                            a.upstream.away(away)
                            a.t0 += away
                        delta = await a.upstream.next_delta()
                    text = "".join(raw)
                    envelope = a.upstream.envelope(text, kind)
                    check_streamed(text, p.name, shown=cut.text)
                    a.reply = (envelope, text, a.upstream.finish_reason, a.upstream.usage)
                if a.result is not None:  # the turn is over (upstream closed) before the consumer gets the end
                    yield StreamDone(a.result)
                    return
            raise await self._all_failed(w.errors)
        except BaseException as exc:  # every way out records the request's one outcome (ok did in _succeeded), also
            self._ended(w, exc)      # GeneratorExit: the consumer closed the stream before its end
            raise


# GatewayError is re-exported for callers that catch everything the chain raises on purpose.
__all__ += ["GatewayError"]
