"""Warm gate for a scale-to-zero provider: is a container warm right now?

A scale-to-zero endpoint (vLLM on Modal and the like) can take minutes to cold-start, and nobody
waits minutes for a chat reply. So before each request the chain asks `await gate.verdict()` (is_warm(), and
how long the endpoint is still held cold):

    * a cached answer younger than warm.ttl_s is returned at once;
    * otherwise ONE probe (GET health_url, warm.probe_timeout_s) runs and every concurrent caller
      awaits that same probe (no stampede); 2xx = warm;
    * cold (refused, non-2xx, timeout) -> the caller skips the provider, and a background warm-up
      starts: it knocks on health_url (each knock may wait warm.warmup_request_timeout_s, refused
      knocks are retried every warm.warmup_poll_s) until the endpoint answers 2xx or
      warm.warmup_budget_s has passed. Knocking is what wakes a scale-to-zero platform up, so the
      probe doubles as the warm-up. While it runs, callers get "cold" without another probe; when it
      succeeds the gate is warm and later requests go to the provider first.
    * a warm-up that fails (no 2xx within warm.warmup_budget_s) holds the endpoint cold for a back-off:
      warm.warmup_backoff_s, doubled after each failed warm-up in a row, at most warm.warmup_backoff_max_s.
      Meanwhile callers get "cold" at once, without a probe, and no warm-up starts; a broken endpoint (a bad
      deploy, a quota) is no longer knocked on every warmup_poll_s for as long as traffic comes. The first
      warm answer (a probe's or a warm-up's) ends the back-off and its count.
    * a provider whose breaker is open is not tried, but the chain still wakes its gate (wake(): the same decision,
      in the background, without holding the request): a cold endpoint's warm-up runs during the cooldown instead
      of after it. See wake() for why.

When a request could not use the endpoint, available_in_s() says when it may be tried again: 0 when warm (or
unknown: the next request probes), the back-off's window left, or while a warm-up runs the time left of its
budget (the latest it ends: warm, or failed and held cold). No cold-start figure is configured or assumed: the
budget is the one the operator sets for a cold start (docs/gateway.md, Errors: When to come back).

The probe carries the provider's own headers (Authorization from api_key_env, its `headers`) when health_url is
the same origin (scheme, host, port) as base_url, so a health route behind the endpoint's key reads warm; to any
other origin it carries none. A probe with headers follows redirects only within its origin (the transport's
rule): a 3xx to anywhere else is "not warm".

Background tasks are tracked (aclose() cancels and awaits them) and their failures are logged at
ERROR (with the back-off it started) and counted in hearth_gateway_warmups_total{outcome="failed"}, never
swallowed. Decisions the back-off made are counted in hearth_gateway_warm_backoff_skips_total; the time left of
a back-off is hearth_gateway_warm_backoff_seconds (set from the shared store on every scrape).

The answer and the warm-up live in the chain's StateStore (hearth.gateway.state): with Redis every
worker trusts the same answer, and only the worker that claims the warm-up's lease knocks (one
warm-up per endpoint across workers); the others answer "cold" without a probe until it ends. The back-off
lives there too: a window one worker starts holds the endpoint cold for all of them.
Concurrent callers inside one process still share one probe.
"""

from __future__ import annotations

import asyncio
import logging
import time

from hearth.gateway.config import ProviderConfig
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.state import MemoryStore, StateStore, claim_lease
from hearth.gateway.transport.client import BodyTooLarge, Transport, TransportError

log = logging.getLogger("hearth.gateway.warm")
_HEALTH_BODY_BYTES = 64 * 1024


class WarmupFailed(RuntimeError):
    """The endpoint never answered 2xx within warm.warmup_budget_s."""


class WarmGate:
    def __init__(self, provider: ProviderConfig, transport: Transport, metrics: GatewayMetrics,
                 store: StateStore | None = None) -> None:
        if not provider.scale_to_zero or not provider.health_url:
            raise ValueError(f"provider {provider.name!r} is not scale_to_zero with a health_url")
        self.provider = provider
        self.name = provider.name
        self.settings = provider.warm
        self.transport = transport
        self.metrics = metrics
        self.store = store if store is not None else MemoryStore()
        # the provider's key and headers when health_url is its own origin (a health route behind the key), else none
        self._headers = provider.health_headers
        self._probe: asyncio.Task[bool] | None = None
        self._warmup: asyncio.Task[None] | None = None
        self._waking: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False  # aclose() ran: a request still in flight wakes nothing (no task outlives the gate)
        self.last_error: str | None = None

    # ------------------------------------------------------------------ public
    @property
    def warming(self) -> bool:
        """Whether THIS process runs the warm-up (state() says whether any worker does)."""
        return self._warmup is not None and not self._warmup.done()

    async def state(self) -> dict:
        snap = await self.store.warm(self.name)
        return {"warm": snap.warm, "warming": snap.warming, "warming_here": self.warming, "last_error": self.last_error,
                "held_cold_s": round(snap.held_cold_s, 3), "failed_warmups": snap.failed_warmups}

    async def is_warm(self, provider: str | None = None) -> bool:
        """True when the provider may be tried now. Waits at most probe_timeout_s (shared probe). provider: whose
        decision it is, for the metric (a gate shared by the providers of one endpoint); default the gate's."""
        return (await self.verdict(provider))[0]

    async def verdict(self, provider: str | None = None, *, wait: bool = True) -> tuple[bool, float]:
        """(is_warm(), seconds the endpoint is still held cold after failed warm-ups: > 0 only when that is why it
        is cold). Once the gate is closed (aclose), a request still in flight gets what the store already says and
        otherwise "cold": no probe starts (as wake() starts nothing), and one that aclose() cancelled under a waiting
        caller answers it "cold". wait=False: a caller that cannot wait for a probe (its deadline is no longer than
        probe_timeout_s) gets "cold" when no answer is known, and the probe runs in the background as for anyone."""
        name = provider or self.provider.name
        decision, held_s = await self._decide(wait)
        self.metrics.child(self.metrics.warm_decisions, name, "warm" if decision else "cold").inc()
        if held_s > 0:
            self.metrics.child(self.metrics.warm_backoff_skips, name).inc()
        return decision, held_s

    def cut(self, provider: str | None = None) -> tuple[bool, float]:
        """The verdict of a caller whose deadline ran out before verdict() answered: "cold", counted as verdict()
        counts a cold decision, and the endpoint woken (wake) since a verdict cut before its probe started none."""
        self.metrics.child(self.metrics.warm_decisions, provider or self.provider.name, "cold").inc()
        self.wake()
        return False, 0.0

    async def sync_backoff_gauge(self) -> None:
        """Set hearth_gateway_warm_backoff_seconds from the (shared) store: another worker may have started or ended
        the back-off, and a window simply runs out."""
        held_s = (await self.store.warm(self.name)).held_cold_s
        self.metrics.warm_backoff_seconds.labels(self.name).set(round(held_s, 3))

    async def invalidate(self) -> None:
        """Forget the trusted answer (the chain calls this when a warm-gated provider stops answering)."""
        await self.store.forget_warm(self.name)

    async def available_in_s(self) -> float | None:
        """Seconds until a request may try the endpoint, from the (shared) store: 0.0 when warm, or when no answer is
        trusted (the next request probes); the back-off's window left; while a warm-up runs, the time left of its
        budget, or of its lease once the budget is spent (a warm-up whose worker died holds the lease until it runs
        out). None when cold with nothing running to wait for (a cold answer still trusted for ttl_s).

        The warm-up's end is the one time the gateway knows: by then the endpoint is warm (earlier, when it wakes
        sooner) or held cold for a window that the next reply names. A shorter guess (a typical cold start) would
        send clients back to the same 503 whenever the endpoint is slower than the guess."""
        snap = await self.store.warm(self.name)
        if snap.warm:
            return 0.0
        if snap.held_cold_s > 0:
            return snap.held_cold_s
        if snap.warming:
            budget_left = snap.warmup_left_s - (self._lease_s - self.settings.warmup_budget_s)
            return budget_left if budget_left > 0 else snap.warmup_left_s
        return 0.0 if snap.warm is None else None

    def wake(self) -> None:
        """Make the decision a request would make (probe when no answer is trusted; cold: start the warm-up), in the
        background, for a provider the request skips anyway (its breaker is open). Nothing new is knocked on: a
        trusted answer, a running warm-up or a back-off window decide without a probe, as for any request.

        Why wake it during the cooldown: the request wanted this endpoint, and the first request after the cooldown
        would probe it and start this same warm-up (the same GPU start) anyway, only later; overlapping the cold
        start with the cooldown lets that half-open trial find it warm. A breaker that opened while the endpoint is
        warm (it answers 5xx) finds the health route warm: no warm-up starts, and the probe (one GET per ttl_s) is
        all it costs. A broken health route fails one warm-up and the back-off holds it cold as before. Once the gate
        is closed (aclose), a request still in flight wakes nothing: no task outlives it."""
        if not self._closed and (self._waking is None or self._waking.done()):
            self._waking = self._track(self._decide(), "wake")

    async def wait_warmup(self) -> None:
        """Wait until the decision in flight (a wake, a probe) and the warm-up it started (if any) end. A failure is
        logged, not raised here."""
        for attr in ("_waking", "_probe", "_warmup"):  # each may start the next
            task = getattr(self, attr)
            if task is not None and not task.done():
                await asyncio.wait([task])

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ internals
    @property
    def _lease_s(self) -> float:
        """The warm-up's lease: it outlives the warm-up's own budget (its last knock may start just before the budget
        ends), so a worker that dies holding it blocks no one for long."""
        s = self.settings
        return s.warmup_budget_s + s.warmup_request_timeout_s + 5.0

    async def _decide(self, wait: bool = True) -> tuple[bool, float]:
        snap = await self.store.warm(self.name)
        if snap.warm:  # a warm answer ended any back-off (set_warm)
            return True, 0.0
        if snap.held_cold_s > 0:  # failed warm-ups: no probe, no warm-up until the window ends
            return False, snap.held_cold_s
        if snap.warm is not None or snap.warming or self.warming:
            return False, 0.0
        if self._closed:
            # aclose() ran (a request still in flight during shutdown): no probe, which nothing would cancel any
            # more; with no trusted answer the endpoint counts as cold, as wake() starts nothing either
            return False, 0.0
        if self._probe is None or self._probe.done():
            self._probe = self._track(self._run_probe(), "probe")
        probe = self._probe
        if not wait:  # the caller's deadline cannot cover the probe: it decides later requests, not this one
            return False, 0.0
        try:
            # shield: one caller giving up (its own deadline) must not cancel the probe the others share
            return await asyncio.shield(probe), 0.0
        except asyncio.CancelledError:
            # aclose() cancelled the probe this caller shared: it gets "cold", not a CancelledError its own task
            # never asked for
            if self._closed and probe.cancelled() and not asyncio.current_task().cancelling():
                return False, 0.0
            raise

    def _track(self, coro, what: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=f"warm-{what}-{self.provider.name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieving it marks it handled; we log it instead of dropping it
        if exc is not None:
            log.error("%s for provider %s failed: %r", task.get_name(), self.provider.name, exc, exc_info=exc)

    async def _set(self, warm: bool) -> None:
        await self.store.set_warm(self.name, warm, self.settings.ttl_s)
        if warm:  # the store ended the back-off with it
            self.metrics.warm_backoff_seconds.labels(self.name).set(0)

    async def _knock(self, timeout_s: float) -> bool | None:
        """One GET of the health URL: True (2xx), False (answered otherwise, or refused), None (no answer
        within timeout_s). last_error says why when it is not True."""
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self.transport.open("GET", self.provider.health_url, headers=self._headers, body=None,
                                                 connect_timeout_s=timeout_s)
                try:
                    await resp.read(_HEALTH_BODY_BYTES)
                except BodyTooLarge:
                    pass  # the status is the answer; the body is not kept (nor buffered whole)
                finally:
                    resp.close()
        except TimeoutError:
            self.last_error = f"no answer within {timeout_s:g} s"
            return None
        except TransportError as exc:
            self.last_error = str(exc)
            return False
        if 200 <= resp.status < 300:
            self.last_error = None
            return True
        self.last_error = f"health answered HTTP {resp.status}"
        return False

    async def _run_probe(self) -> bool:
        warm = await self._knock(self.settings.probe_timeout_s) is True
        await self._set(warm)
        if not warm and not self.warming:
            # refused while the endpoint is held cold (this probe may have started before the back-off did)
            # aclose() while the claim is on its way gives the lease back: one no warm-up holds kept every worker
            # "cold" without a probe or a warm-up until it expired (lease_s)
            token = await claim_lease(self.store.claim_warmup(self.name, self._lease_s),
                                      lambda t: self.store.release_warmup(self.name, t),
                                      f"the warm-up lease of {self.provider.name}")
            if token is not None:
                log.info("provider %s is cold (%s); starting warm-up", self.provider.name, self.last_error)
                self._warmup = self._track(self._run_warmup(token), "warmup")
        return warm

    async def _run_warmup(self, token: str) -> None:
        try:
            try:
                await self._warm_up()
            except WarmupFailed as exc:
                # before the lease is given back: no worker may start the next warm-up in between
                raise WarmupFailed(f"{exc}; {await self._back_off()}") from None
        finally:
            try:
                await asyncio.shield(self.store.release_warmup(self.name, token))
            except Exception as exc:  # the lease expires by itself; say so rather than hide it
                log.warning("could not release the warm-up lease of %s: %r", self.provider.name, exc)

    async def _back_off(self) -> str:
        """Hold the endpoint cold after a failed warm-up; what the failure's log line says about it."""
        s = self.settings
        try:
            failures, held_s = await asyncio.shield(
                self.store.warmup_failed(self.name, s.warmup_backoff_s, s.warmup_backoff_max_s))
        except Exception as exc:  # the failure is still reported; without the window the next request re-probes
            log.warning("could not start the warm-up back-off of %s: %r", self.provider.name, exc)
            return "no back-off (the state store failed)"
        self.metrics.warm_backoff_seconds.labels(self.name).set(held_s)
        return (f"held cold for {held_s:g} s ({failures} failed warm-up{'' if failures == 1 else 's'} in a row; "
                "no probe or warm-up until then)")

    async def _warm_up(self) -> None:
        s = self.settings
        start = time.monotonic()
        try:
            while True:
                left = s.warmup_budget_s - (time.monotonic() - start)
                if left <= 0:
                    raise WarmupFailed(f"{self.provider.name} not warm after {s.warmup_budget_s:g} s: {self.last_error}")
                knock_start = time.monotonic()
                timeout = min(s.warmup_request_timeout_s, left)
                before = self.last_error
                outcome = await self._knock(timeout)
                if outcome:
                    await self._set(True)
                    self.metrics.warmups.labels(self.provider.name, "ok").inc()
                    log.info("provider %s is warm after %.2f s", self.provider.name, time.monotonic() - start)
                    return
                await self._set(False)
                if outcome is None and timeout < s.warmup_request_timeout_s and before is not None:
                    # cut short by the budget's end, not by the provider: what the provider itself last said
                    # (e.g. HTTP 503) is the reason worth reporting, not the shortened wait
                    self.last_error = before
                # A refused knock returns at once: pause before the next; a knock that waited long did not.
                pause = s.warmup_poll_s - (time.monotonic() - knock_start)
                if pause > 0:
                    await asyncio.sleep(min(pause, max(0.0, left)))
        except Exception:  # not warm within the budget, or the state store failed under it: either is a failed
            # warm-up (cancellation, a BaseException, is neither)
            self.metrics.warmups.labels(self.provider.name, "failed").inc()
            raise
