"""Shared helpers for the gateway tests: configs pointing at loopback fakes, valid envelopes, the gateway on a
loopback socket, the state module's clock moved by hand (the `clock` fixture in conftest.py)."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from contextlib import asynccontextmanager, contextmanager

import aiohttp
import pytest
from aiohttp import web

from hearth.gateway import state as state_module
from hearth.gateway.config import GatewayConfig, config_from_dict
from hearth.gateway.state import MemoryStore, RedisStore

CHAT = {"message": "Hello there.", "mood": "warm", "memories": [], "affection": 1, "trust": 0, "suggested_actions": []}
CHAT_JSON = json.dumps(CHAT)
MESSAGES = [{"role": "user", "content": "hi"}]

# Fault budgets: small so the suite is fast. MARGIN_S is the slack a wall-clock bound allows on top of what the
# request should cost: the loaded 2-core CI machine once stalled a loopback burst by 0.87 s (2026-12-07), so the
# slack is well above that, and a test whose bound must tell two costs apart makes the wrong one cost SLOW_S or
# more (a long timeout, or an event the test sets), never a few tenths of a second. What a request did is
# asserted from its attempts and the fakes' counts; the clock only bounds it. The benchmark measures the real
# overhead (target <= 10 ms) on a quiet machine.
FIRST_TOKEN_S = 0.8
MARGIN_S = 1.5
SLOW_S = 6.0
# a provider's timeouts when the test's wrong behaviour is "waited for one of them": each costs SLOW_S or more
SLOW_TIMEOUTS = {"connect_s": SLOW_S, "first_token_s": SLOW_S, "total_s": 2 * SLOW_S}


def provider(name: str, server, **overrides) -> dict:
    """A provider table pointing at a FakeOpenAI `server`, with small timeouts."""
    p = {"name": name, "base_url": server.base_url, "model": f"{name}-model",
         "timeouts": {"connect_s": 1.0, "first_token_s": FIRST_TOKEN_S, "total_s": 2.5}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(p.get(key), dict):
            p[key] = {**p[key], **value}
        else:
            p[key] = value
    return p


# For a fallback whose timing is not under test: a burst of concurrent requests on a loaded 2-core CI box once
# took over 0.5 s to connect to it (a loopback fake sharing the event loop with the chain and a Redis client).
# Every second provider "b" takes these unless its test times it (2026-12-06); provider()'s short ones stay
# where the test times that provider (a hanging "b" whose first-token timeout it measures).
STEADY_TIMEOUTS = {"connect_s": 2.0, "first_token_s": 2.0, "total_s": 2.5}


def steady(name: str, server, **overrides) -> dict:
    """A provider on `server` with generous timeouts: the fallback a burst test relies on, not the one it times."""
    timeouts = {**STEADY_TIMEOUTS, **overrides.pop("timeouts", {})}
    return provider(name, server, timeouts=timeouts, **overrides)


# A scale-to-zero endpoint whose probe and warm-up end within a test's blink: a 0.1 s warm-up budget against a
# loopback fake (a health route answering 503 fails it at once and starts the back-off).
FAST_WARMUP = {"probe_timeout_s": 0.1, "ttl_s": 5.0, "warmup_budget_s": 0.1, "warmup_poll_s": 0.02,
               "warmup_request_timeout_s": 0.5}


def scale_to_zero(name: str, server, **warm) -> dict:
    """A warm-gated provider on a FakeOpenAI `server` (its /health is the probe), FAST_WARMUP unless `warm` says."""
    return provider(name, server, scale_to_zero=True, health_url=server.health_url, warm={**FAST_WARMUP, **warm})


def make_config(*providers: dict, env: dict | None = None, **gateway) -> GatewayConfig:
    data = {"gateway": {"deadline_s": 3.0, "cooldown_s": 30.0, "breaker_failures": 3, **gateway},
            "providers": list(providers)}
    return config_from_dict(data, env or {})


@contextmanager
def stopwatch():
    """`with stopwatch() as t: ...` then t() is the elapsed seconds."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


# A real Redis for the shared-state tests: .ci/run starts one and exports HEARTH_TEST_REDIS_URL.
REDIS_URL = os.environ.get("HEARTH_TEST_REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="HEARTH_TEST_REDIS_URL is not set (.ci/run starts a Redis)")


def shared_state() -> dict:
    """[gateway] settings that share state through the test Redis, under a key prefix of its own."""
    return {"state_url": REDIS_URL, "state_prefix": f"hearth-test:{uuid.uuid4().hex}"}


# The backends a state test runs against: this process, and Redis (skipped without one).
BACKENDS = [pytest.param("memory", id="memory"), pytest.param("redis", id="redis", marks=needs_redis)]


def backend_settings(backend: str) -> dict:
    return shared_state() if backend == "redis" else {}


async def end_cooldown(store, backend: str, clock, name: str = "a") -> None:
    """End `name`'s cooldown now: the in-process store's clock moves on 31 s (past the tests' 30 s cooldowns); in
    Redis the key whose TTL it is goes."""
    if backend == "memory":
        clock.offset += 31.0
    else:
        await store._r.delete(store._k(name, "open"))


async def expire_trial(store, backend: str, clock, name: str = "a") -> None:
    """Let `name`'s half-open trial lease run out: the in-process store's clock moves on 31 s (past the tests' 30 s
    leases); in Redis the lease key, whose TTL it is, goes."""
    if backend == "memory":
        clock.offset += 31.0
    else:
        await store._r.delete(store._k(name, "trial"))


@asynccontextmanager
async def started_store(backend: str):
    """A started state store of `backend` (Redis under a prefix of its own), closed afterwards."""
    store = RedisStore(REDIS_URL, shared_state()["state_prefix"]) if backend == "redis" else MemoryStore()
    await store.start()
    try:
        yield store
    finally:
        await store.aclose()


class StateClock:
    """The state module's clock, moved forward by hand (a cooldown or a back-off window of a minute ends without
    waiting for it). Only the in-process store reads it: Redis keeps its own time (key TTLs)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


def move_state_clock(monkeypatch) -> StateClock:
    clock = StateClock()
    monkeypatch.setattr(state_module, "time", clock)
    return clock


async def post_chat(client, stream: bool = False, **body) -> tuple[int, str | None, dict]:
    """POST one chat request (JSON, or SSE that fails before its first byte): (status, Retry-After, JSON body)."""
    r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, **({"stream": True} if stream else {}),
                                                        **body})
    return r.status, r.headers.get("Retry-After"), await r.json()


def failure_waits(body: dict) -> dict:
    """{provider: available_in_s} of an all-failed error body."""
    return {f["provider"]: f.get("available_in_s") for f in body["error"]["failures"]}


@asynccontextmanager
async def served(cfg, *, chain=None, send_buffer: int | None = None, shutdown_timeout: float | None = None):
    """The gateway app on a real loopback socket, run as main() runs it; yields its port. send_buffer: SO_SNDBUF of
    the listening socket (accepted sockets inherit it: a client that stops reading fills it at once);
    shutdown_timeout: the runner's wait for open connections at cleanup (aiohttp's default otherwise)."""
    from hearth.gateway.server import RUNNER_OPTIONS, create_app

    options = RUNNER_OPTIONS if shutdown_timeout is None else {**RUNNER_OPTIONS, "shutdown_timeout": shutdown_timeout}
    runner = web.AppRunner(create_app(cfg, chain=chain), **options)
    await runner.setup()
    sock = socket.socket()
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield sock.getsockname()[1]
    finally:
        await runner.cleanup()


@asynccontextmanager
async def gateway(cfg, *, chain=None):
    """served(), with an aiohttp client for it."""
    async with served(cfg, chain=chain) as port:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
            yield client


@asynccontextmanager
async def gateway_url(cfg):
    """served(), as the base URL an OpenAI client is given."""
    async with served(cfg) as port:
        yield f"http://127.0.0.1:{port}/v1"


_HELD_SOCKETS: list[socket.socket] = []


def closed_port() -> int:
    """A loopback port with nothing listening: bound, never listened on, and held for the rest of the process, so a
    connection to it is refused at once and no other server can take the port meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD_SOCKETS.append(sock)
    return sock.getsockname()[1]
