"""Where the gateway keeps what several workers must agree on: breakers, cooldowns, warm state.

    store = make_store(settings)          # MemoryStore, or RedisStore when [gateway].state_url is set
    await store.start()                   # RedisStore: connects and PINGs (a wrong URL fails start-up)

Two backends behind one small async interface (StateStore):

    MemoryStore   this process only (the default: one worker, or a Chain inside the app)
    RedisStore    every process that loads the same TOML (same state_url and state_prefix) shares it:
                  `hearth gateway --workers N`, several hosts, the app and the gateway side by side

What is stored, per provider (Redis keys under "<state_prefix>:<provider>:"):

    b        hash {failures, tripped}: consecutive failures; tripped = opened since the last success that closed
             it (the half-open trial's: a success of any other attempt never closes a tripped breaker)
    open     "<status>\\x1f<why>" with a TTL: present while the provider cools down (TTL = time left)
    trial    a token with a TTL (the lease): the one half-open trial request in flight
    warm     "1" / "0" with TTL warm.ttl_s: the last health answer, trusted that long
    warmup   a token with a TTL (the lease): the one background warm-up running, across workers (the TTL
             left says when it ends at the latest: hearth.gateway.warm.WarmGate.available_in_s)
    backoff  the back-off window (ms) with that TTL: present while the endpoint is held cold after failed
             warm-ups (no probe, no warm-up: the warm-up's lease cannot be claimed)
    warmfails  failed warm-ups in a row: each doubles the next window; a warm answer deletes it and backoff

Time left is the key's TTL, so workers on different hosts need no synchronised clocks. Every lease
expires (a worker that dies holding a trial or a warm-up does not block the others for longer than
the lease). Updates that read and write are Lua scripts, atomic in Redis.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from hearth.gateway.errors import GatewayError

__all__ = ["StateStore", "MemoryStore", "RedisStore", "BreakerSnapshot", "WarmSnapshot", "StateStoreError",
           "check_redis_url", "make_store", "claim_lease"]

log = logging.getLogger("hearth.gateway.state")
T = TypeVar("T")


async def claim_lease(claim: Awaitable[T], release: Callable[[T], Awaitable[None]], what: str) -> T:
    """What a lease claim returns (claim_warmup: a token or None; try_trial: a TrialClaim, which `release` gives back
    only when it holds a token), awaited so that a caller cancelled
    while the claim's reply is on its way (a client hanging up, the gateway closing) does not lose a lease that may
    already have landed in the (shared) store: the claim is left to finish, the token it got is given back with
    `release`, and the cancellation goes on. A lease nobody holds otherwise stood until it expired, every request
    skipping what it guards (a half-open trial, a warm-up). `what` names the lease in the warning a failed give-back
    logs (the lease then expires by itself)."""
    task = asyncio.ensure_future(claim)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            token = await task
            if token is not None:
                await release(token)
        except Exception as exc:  # the lease expires by itself; say so rather than hide it
            log.warning("could not give back %s: %r", what, exc)
        raise


class StateStoreError(GatewayError):
    """The shared state store is unreachable or answered with an error."""


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    failures: int = 0            # consecutive failures
    open_left_s: float = 0.0     # > 0 while the provider cools down
    why: str = ""                # why it is open
    status: int | None = None    # the HTTP status whose Retry-After opened it (429, 503), else None
    tripped: bool = False        # opened since the trial success that last closed it: the next attempt is the trial
    trial: bool = False          # that trial request is in flight now


CLOSED = BreakerSnapshot()


@dataclass(frozen=True, slots=True)
class TrialClaim:
    """What a half-open trial claim got (StateStore.try_trial), read in the claim's own atomic step."""
    token: str | None = None     # the trial's lease, or None: refused
    open_left_s: float = 0.0     # refused because the breaker is open (again): time left of its cooldown; 0: the
                                 # trial is another request's
    why: str = ""                # why it is open (as BreakerSnapshot.why)
    status: int | None = None    # as BreakerSnapshot.status


@dataclass(frozen=True, slots=True)
class WarmSnapshot:
    warm: bool | None = None     # the last health answer while it is trusted (warm.ttl_s), else None
    warming: bool = False        # a warm-up is running, in any worker
    held_cold_s: float = 0.0     # > 0 while the endpoint is held cold after failed warm-ups (time left)
    failed_warmups: int = 0      # failed warm-ups in a row (since the last warm answer)
    warmup_left_s: float = 0.0   # while it runs: the time left of its lease (the warm gate's estimate of its end)


def backoff_window(failures: int, start_s: float, max_s: float) -> float:
    """How long the endpoint is held cold after its `failures`-th failed warm-up in a row: start_s, doubled for
    each earlier one, at most max_s."""
    return min(start_s * 2.0 ** min(failures - 1, 64), max_s)


def _token() -> str:
    return os.urandom(12).hex()


class StateStore(abc.ABC):
    """Shared breaker and warm state. Every method may raise StateStoreError."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        pass

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass

    async def ping(self) -> None:  # noqa: B027 - optional hook
        pass

    # breakers
    @abc.abstractmethod
    async def breakers(self, names: list[str]) -> list[BreakerSnapshot]: ...

    @abc.abstractmethod
    async def failure(self, name: str, *, threshold: int, cooldown_s: float, open_s: float | None, why: str,
                      status: int | None, trial: str | None, trial_why: str | None = None) -> bool:
        """Count a failure; open for open_s (a Retry-After: always), or for cooldown_s when the count
        reaches threshold or the failed attempt was the half-open trial. An open cooldown is only ever
        lengthened. Releases `trial`. Returns True when this opened (or re-opened) the breaker. `why` says why it
        opened; `trial_why`, when given, instead of it when `trial` still held the half-open trial (a lease that
        expired, or a breaker another trial closed, makes the failure an ordinary one)."""

    @abc.abstractmethod
    async def success(self, name: str, trial: str | None) -> bool:
        """Record a successful attempt, atomically. When `trial` holds the half-open trial's lease: close the breaker
        (zero failures, no cooldown, no trial). Otherwise (an ordinary attempt, or a trial whose lease expired): zero
        the consecutive failures only while the breaker is not tripped; an open or half-open one is left as it is
        (the attempt was admitted before it opened: stale evidence), its trial lease included. True when the breaker
        is closed now (closed, or reset, by this success); False when the success changed nothing."""

    @abc.abstractmethod
    async def try_trial(self, name: str, lease_s: float) -> TrialClaim:
        """The half-open trial for `name`, for at most lease_s, in one atomic step: its token, or no token and why:
        the breaker is open (again: another worker's trial failed after the caller read it half-open; with its time
        left and reason), or another request holds the trial."""

    async def claim_trial(self, name: str, lease_s: float) -> str | None:
        """try_trial's token: None when another holds the trial or the breaker is open."""
        return (await self.try_trial(name, lease_s)).token

    @abc.abstractmethod
    async def release_trial(self, name: str, token: str) -> None:
        """Give the trial back without a verdict (the attempt was abandoned)."""

    # warm state
    @abc.abstractmethod
    async def warm(self, name: str) -> WarmSnapshot:
        """The endpoint's trusted answer, whether a warm-up runs anywhere, and its back-off."""

    @abc.abstractmethod
    async def set_warm(self, name: str, warm: bool, ttl_s: float) -> None:
        """Trust `warm` for ttl_s. A warm answer also ends the back-off: no window, no failed warm-ups."""

    @abc.abstractmethod
    async def forget_warm(self, name: str) -> None: ...

    @abc.abstractmethod
    async def claim_warmup(self, name: str, lease_s: float) -> str | None:
        """The right to run the one warm-up of `name`: a token, or None when one runs already or the endpoint is
        held cold (a probe that was in flight when the window began starts no warm-up)."""

    @abc.abstractmethod
    async def release_warmup(self, name: str, token: str) -> None: ...

    @abc.abstractmethod
    async def warmup_failed(self, name: str, backoff_s: float, backoff_max_s: float) -> tuple[int, float]:
        """Count a failed warm-up and hold the endpoint cold for backoff_window(): (failed warm-ups in a row,
        seconds held). Call it while the warm-up's lease is still held, so no worker claims it in between."""


# ------------------------------------------------------------------------------------------ memory
class _MemBreaker:
    __slots__ = ("failures", "open_until", "why", "status", "tripped", "trial", "trial_until")

    def __init__(self) -> None:
        self.failures = 0
        self.open_until = 0.0
        self.why = ""
        self.status: int | None = None
        self.tripped = False
        self.trial: str | None = None
        self.trial_until = 0.0


class MemoryStore(StateStore):
    """State of this process (time.monotonic based)."""

    def __init__(self) -> None:
        self._b: dict[str, _MemBreaker] = {}
        self._warm: dict[str, tuple[bool, float]] = {}       # name -> (warm, trusted until)
        self._warmup: dict[str, tuple[str, float]] = {}      # name -> (token, lease until)
        self._backoff: dict[str, tuple[int, float]] = {}     # name -> (failed warm-ups in a row, held cold until)

    def _get(self, name: str) -> _MemBreaker:
        b = self._b.get(name)
        if b is None:
            b = self._b[name] = _MemBreaker()
        return b

    async def breakers(self, names: list[str]) -> list[BreakerSnapshot]:
        now = time.monotonic()
        out = []
        for name in names:
            b = self._b.get(name)
            if b is None or (not b.failures and not b.tripped):
                out.append(CLOSED)
                continue
            left = b.open_until - now
            out.append(BreakerSnapshot(b.failures, left if left > 0 else 0.0, b.why if left > 0 else "",
                                       b.status if left > 0 else None, b.tripped,
                                       b.trial is not None and b.trial_until > now))
        return out

    async def failure(self, name, *, threshold, cooldown_s, open_s, why, status, trial, trial_why=None) -> bool:
        now = time.monotonic()
        b = self._get(name)
        b.failures += 1
        was_trial = trial is not None and b.trial == trial
        if was_trial:
            b.trial = None
            # the half-open trial only while the breaker is tripped: another worker's trial may have closed it after
            # this attempt's request read it half-open (its failure is then one like any other); and only while its
            # lease holds, as in Redis, where the lease key is gone with its TTL
            was_trial = b.tripped and b.trial_until > now
        if open_s is None and (b.failures >= threshold or was_trial) and cooldown_s > 0:
            open_s, status = cooldown_s, None
        if open_s is None or open_s <= 0:
            return False
        if was_trial and trial_why is not None:
            why = trial_why
        if now + open_s > b.open_until:
            b.open_until, b.why, b.status = now + open_s, why, status
        b.tripped = True
        return True

    async def success(self, name: str, trial: str | None) -> bool:
        b = self._b.get(name)
        if b is None:
            return True
        if trial is not None and b.trial == trial and b.trial_until > time.monotonic():
            del self._b[name]                   # the trial's success, its lease still held (as Redis's TTL): closed
            return True
        if b.tripped or b.open_until > time.monotonic():
            return False                        # stale: admitted before the breaker opened
        b.failures = 0                          # closed: the failures are no longer consecutive
        return True

    async def try_trial(self, name: str, lease_s: float) -> TrialClaim:
        now = time.monotonic()
        b = self._get(name)
        if b.open_until > now:
            return TrialClaim(None, b.open_until - now, b.why, b.status)
        if b.trial is not None and b.trial_until > now:
            return TrialClaim()
        b.trial, b.trial_until = _token(), now + lease_s
        return TrialClaim(b.trial)

    async def release_trial(self, name: str, token: str) -> None:
        b = self._b.get(name)
        if b is not None and b.trial == token:
            b.trial = None

    async def warm(self, name: str) -> WarmSnapshot:
        now = time.monotonic()
        w = self._warm.get(name)
        u = self._warmup.get(name)
        failures, until = self._backoff.get(name, (0, 0.0))
        lease_left = u[1] - now if u is not None and u[1] > now else 0.0
        return WarmSnapshot(w[0] if w is not None and w[1] > now else None, lease_left > 0, max(until - now, 0.0),
                            failures, lease_left)

    async def set_warm(self, name: str, warm: bool, ttl_s: float) -> None:
        self._warm[name] = (warm, time.monotonic() + ttl_s)
        if warm:
            self._backoff.pop(name, None)

    async def forget_warm(self, name: str) -> None:
        self._warm.pop(name, None)

    async def claim_warmup(self, name: str, lease_s: float) -> str | None:
        now = time.monotonic()
        u = self._warmup.get(name)
        if (u is not None and u[1] > now) or self._backoff.get(name, (0, 0.0))[1] > now:
            return None
        token = _token()
        self._warmup[name] = (token, now + lease_s)
        return token

    async def release_warmup(self, name: str, token: str) -> None:
        u = self._warmup.get(name)
        if u is not None and u[0] == token:
            del self._warmup[name]

    async def warmup_failed(self, name: str, backoff_s: float, backoff_max_s: float) -> tuple[int, float]:
        failures = self._backoff.get(name, (0, 0.0))[0] + 1
        window = backoff_window(failures, backoff_s, backoff_max_s)
        self._backoff[name] = (failures, time.monotonic() + window)
        return failures, window


# ------------------------------------------------------------------------------------------ Redis
_FAILURE = """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local was_trial = 0
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) == ARGV[6] then
  redis.call('DEL', KEYS[3])
  -- the half-open trial only while tripped: another worker's trial may have closed the breaker since it was claimed
  if redis.call('HGET', KEYS[1], 'tripped') == '1' then was_trial = 1 end
end
local ms = tonumber(ARGV[3])
local status = ARGV[5]
if ms < 0 and (failures >= tonumber(ARGV[1]) or was_trial == 1) and tonumber(ARGV[2]) > 0 then
  ms = tonumber(ARGV[2])
  status = ''
end
if ms <= 0 then return 0 end
local why = ARGV[4]
if was_trial == 1 and ARGV[7] ~= '' then why = ARGV[7] end
if redis.call('PTTL', KEYS[2]) < ms then
  redis.call('SET', KEYS[2], status .. '\\31' .. why, 'PX', ms)
end
redis.call('HSET', KEYS[1], 'tripped', 1)
return 1
"""

# KEYS: trial (the lease), open. ARGV: token, lease ms. No trial while the breaker is open: a caller that read it
# half-open may claim after another worker's trial failed and opened it again (that failure released its lease).
# Returns {1} (claimed), {0} (another holds the trial) or {0, open ms left, open value} (open).
_CLAIM_TRIAL = """
local left = redis.call('PTTL', KEYS[2])
if left ~= -2 then return {0, left, redis.call('GET', KEYS[2]) or ''} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
return {0}
"""

# KEYS: warmup (the lease), backoff. ARGV: token, lease ms. No lease while the endpoint is held cold.
_CLAIM_WARMUP = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""

# KEYS: backoff, warmfails. ARGV: first window ms, longest window ms. The window doubles per failure in a row
# (backoff_window; the exponent is bounded, so it never overflows). Returns {failures, window ms}.
_WARMUP_FAILED = """
local failures = redis.call('INCR', KEYS[2])
local ms = math.min(tonumber(ARGV[1]) * 2 ^ math.min(failures - 1, 64), tonumber(ARGV[2]))
ms = math.max(1, math.floor(ms))
redis.call('SET', KEYS[1], ms, 'PX', ms)
return {failures, ms}
"""

# KEYS: b, open, trial. ARGV: the attempt's trial token ('' for none). Returns 1 when the breaker is closed now.
# Only the trial's own success closes a tripped breaker; any other success resets the count only while it is not
# tripped (and not open), and leaves an open or half-open breaker, its trial's lease included, as it is.
_SUCCESS = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return 1
end
if redis.call('HGET', KEYS[1], 'tripped') == '1' or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _read_open(value: str) -> tuple[int | None, str]:
    """(status, why) of the Redis open key's value, "<status>\\x1f<why>" (the module docstring; status "" for none)."""
    s, _, why = value.partition("\x1f")
    return (int(s) if s else None), why


class RedisStore(StateStore):
    """State shared through Redis (redis.asyncio); see the module docstring for the keys."""

    def __init__(self, url: str, prefix: str = "hearth:gateway") -> None:
        self.url = url
        self.prefix = prefix
        self._r = None
        self._failure = self._success = self._release = self._claim_trial = self._claim_warmup = None
        self._warmup_failed = None

    def _k(self, name: str, what: str) -> str:
        return f"{self.prefix}:{name}:{what}"

    async def start(self) -> None:
        import redis.asyncio as aioredis

        if self._r is None:
            self._r = aioredis.Redis.from_pool(_pool(self.url))
            self._failure = self._r.register_script(_FAILURE)
            self._success = self._r.register_script(_SUCCESS)
            self._release = self._r.register_script(_RELEASE)
            self._claim_trial = self._r.register_script(_CLAIM_TRIAL)
            self._claim_warmup = self._r.register_script(_CLAIM_WARMUP)
            self._warmup_failed = self._r.register_script(_WARMUP_FAILED)
        try:
            await self.ping()
        except StateStoreError:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._r is not None:
            await self._r.aclose()
            self._r = None

    async def _call(self, coro):
        import redis

        if self._r is None:
            coro.close()
            raise StateStoreError("state store not started (call await store.start())")
        try:
            return await coro
        except (redis.RedisError, OSError) as exc:
            raise StateStoreError(f"Redis at {self._safe_url()}: {exc}") from exc

    def _safe_url(self) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"

    async def ping(self) -> None:
        await self._call(self._r.ping() if self._r is not None else _nothing())

    async def breakers(self, names: list[str]) -> list[BreakerSnapshot]:
        async def run():
            pipe = self._r.pipeline(transaction=False)
            for n in names:
                pipe.hgetall(self._k(n, "b"))
                pipe.pttl(self._k(n, "open"))
                pipe.get(self._k(n, "open"))
                pipe.exists(self._k(n, "trial"))
            return await pipe.execute()

        raw = await self._call(run())
        out = []
        for i in range(len(names)):
            h, pttl, opened, trial = raw[4 * i:4 * i + 4]
            if not h and not opened:
                out.append(CLOSED)
                continue
            status, why = _read_open(opened) if opened is not None and pttl > 0 else (None, "")
            out.append(BreakerSnapshot(int(h.get("failures", 0)), pttl / 1000 if opened is not None and pttl > 0 else 0.0,
                                       why, status, h.get("tripped") == "1", bool(trial)))
        return out

    async def failure(self, name, *, threshold, cooldown_s, open_s, why, status, trial, trial_why=None) -> bool:
        ms = -1 if open_s is None else max(1, int(open_s * 1000))  # a window under 1 ms is still one (not "none")
        keys = [self._k(name, "b"), self._k(name, "open"), self._k(name, "trial")]
        args = [threshold, int(cooldown_s * 1000), ms, why[:500], "" if status is None else status, trial or "",
                (trial_why or "")[:500]]
        return bool(await self._call(self._failure(keys=keys, args=args)))

    async def success(self, name: str, trial: str | None) -> bool:
        keys = [self._k(name, "b"), self._k(name, "open"), self._k(name, "trial")]
        return bool(await self._call(self._success(keys=keys, args=[trial or ""])))

    async def _give_back(self, key: str, token: str) -> None:
        """End the lease on `key` if `token` still holds it (an expired and re-claimed one is left alone)."""
        await self._call(self._release(keys=[key], args=[token]))

    async def try_trial(self, name: str, lease_s: float) -> TrialClaim:
        token = _token()
        keys = [self._k(name, "trial"), self._k(name, "open")]
        got = await self._call(self._claim_trial(keys=keys, args=[token, max(1, int(lease_s * 1000))]))
        if got[0]:
            return TrialClaim(token)
        if len(got) < 3:
            return TrialClaim()
        status, why = _read_open(got[2])
        # PTTL -1 (a key without a TTL: never set so) reads as open for an unknown while: 1 ms, still "open"
        return TrialClaim(None, got[1] / 1000 if got[1] > 0 else 0.001, why, status)

    async def release_trial(self, name: str, token: str) -> None:
        await self._give_back(self._k(name, "trial"), token)

    async def warm(self, name: str) -> WarmSnapshot:
        async def run():
            pipe = self._r.pipeline(transaction=False)
            pipe.get(self._k(name, "warm"))
            pipe.pttl(self._k(name, "warmup"))
            pipe.pttl(self._k(name, "backoff"))
            pipe.get(self._k(name, "warmfails"))
            return await pipe.execute()

        w, lease_ms, held_ms, failures = await self._call(run())
        # PTTL: -2 no key, -1 no TTL (never set so: every lease has one); either way no warm-up to wait for
        return WarmSnapshot(None if w is None else w == "1", lease_ms > 0, held_ms / 1000 if held_ms > 0 else 0.0,
                            int(failures or 0), lease_ms / 1000 if lease_ms > 0 else 0.0)

    async def set_warm(self, name: str, warm: bool, ttl_s: float) -> None:
        key = self._k(name, "warm")

        async def run():
            # one transaction: a worker never reads "warm" beside a back-off that the same answer ended
            pipe = self._r.pipeline(transaction=True)
            if ttl_s <= 0:
                pipe.delete(key)
            else:
                pipe.set(key, "1" if warm else "0", px=max(1, int(ttl_s * 1000)))
            if warm:
                pipe.delete(self._k(name, "backoff"), self._k(name, "warmfails"))
            return await pipe.execute()

        await self._call(run())

    async def forget_warm(self, name: str) -> None:
        await self._call(self._r.delete(self._k(name, "warm")))

    async def claim_warmup(self, name: str, lease_s: float) -> str | None:
        token = _token()
        keys = [self._k(name, "warmup"), self._k(name, "backoff")]
        ok = await self._call(self._claim_warmup(keys=keys, args=[token, max(1, int(lease_s * 1000))]))
        return token if ok else None

    async def release_warmup(self, name: str, token: str) -> None:
        await self._give_back(self._k(name, "warmup"), token)

    async def warmup_failed(self, name: str, backoff_s: float, backoff_max_s: float) -> tuple[int, float]:
        keys = [self._k(name, "backoff"), self._k(name, "warmfails")]
        failures, ms = await self._call(self._warmup_failed(
            keys=keys, args=[max(1, int(backoff_s * 1000)), max(1, int(backoff_max_s * 1000))]))
        return int(failures), int(ms) / 1000


async def _nothing() -> None:
    return None


def _pool(url: str):
    """The Redis connection pool of RedisStore for `url`: bounded, and callers wait for a connection (the plain pool
    raises past its size), so 500 concurrent requests share at most 64 connections to Redis."""
    import redis.asyncio as aioredis

    return aioredis.BlockingConnectionPool.from_url(
        url, max_connections=64, timeout=2.0, decode_responses=True, socket_connect_timeout=2.0, socket_timeout=2.0,
        health_check_interval=30)


def check_redis_url(url: str) -> None:
    """ValueError when the Redis client cannot use `url`: an option in its query that it does not take (a typo such
    as socket_timout, an ssl_ option on redis://) or whose value it cannot read (socket_timeout=abc). Found without
    connecting: the pool is built and one connection object made, as RedisStore.start() makes them. Before, the
    client raised it from the chain's start (a TypeError with a traceback, exit 1), not as a start-up error naming
    gateway.state_url."""
    try:
        _pool(url).make_connection()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the Redis client cannot use it: {exc}") from None


def make_store(settings) -> StateStore:
    """RedisStore for settings.state_url (GatewaySettings), else MemoryStore."""
    if settings.state_url:
        return RedisStore(settings.state_url, settings.state_prefix)
    return MemoryStore()
