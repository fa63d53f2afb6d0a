"""Review 62: a trial token whose breaker another worker's trial closed meanwhile is no half-open trial any more,
against the in-process store and a real Redis (loopback fake upstreams).

A request whose plan read the breaker half-open claims the trial; when another worker's trial succeeded between its
read and its claim, the breaker is closed and the claim still gets a lease (nothing holds one). Its failure counted as
"the half-open trial failed" and opened the breaker for cooldown_s at once: one failure on a breaker that had just
closed, not breaker_failures in a row, and the provider skipped for everyone for the cooldown. Now a failed attempt
re-opens the breaker as a trial only while the breaker is tripped; otherwise it is one failure like any other.
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import UpstreamStatus
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import BACKENDS, CHAT_JSON, MESSAGES, backend_settings, make_config, \
    scale_to_zero, steady

GOOD = Behavior.reply(CHAT_JSON)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_trial_claimed_after_another_closed_the_breaker_fails_as_one_failure(backend, clock):
    async def main():
        probe_held, release_probe = asyncio.Event(), asyncio.Event()

        async def health():  # the probe of R's plan waits here: its view of a's breaker ages meanwhile
            probe_held.set()
            await release_probe.wait()
            return Behavior.status(200, body={"status": "ok"})

        async with FakeOpenAI(Behavior.status(500), health=health) as a, FakeOpenAI(GOOD) as b:
            cfg = make_config(scale_to_zero("a", a, probe_timeout_s=2.0), steady("b", b), breaker_failures=3,
                              cooldown_s=30.0, deadline_s=10.0, **backend_settings(backend))
            shared = MemoryStore() if backend == "memory" else None  # Redis: each worker its own client
            async with Chain(cfg, store=shared) as chain, Chain(cfg, store=shared) as other_worker:
                store = chain.store
                for _ in range(3):                                              # 3 in a row: a opened
                    await chain.breakers["a"].failure(UpstreamStatus("a", 500), None)
                if backend == "memory":                                         # ... and its cooldown ends
                    clock.offset += 31.0
                else:
                    await store._r.delete(store._k("a", "open"))
                half_open = (await store.breakers(["a"]))[0]
                request = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))  # plan: a half-open
                await probe_held.wait()
                # meanwhile another worker's half-open trial succeeds: the breaker is closed
                breaker = other_worker.breakers["a"]
                token, refused = await breaker.trial(half_open)
                ok = refused is None
                closed = await breaker.success(token)
                release_probe.set()
                result = await request                                          # a: 500
                return half_open, ok, closed, result, (await store.breakers(["a"]))[0]

    half_open, ok, closed, result, snap = asyncio.run(main())
    assert half_open.tripped and half_open.open_left_s == 0 and not half_open.trial
    assert ok and closed
    assert result.attempts == [("a", "status_500"), ("b", "ok")]
    # before: "the half-open trial failed" opened the just-closed breaker for 30 s on this one failure
    assert snap.open_left_s == 0 and not snap.tripped and snap.failures == 1
