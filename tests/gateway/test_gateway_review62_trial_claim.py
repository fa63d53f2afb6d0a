"""Review 62: a half-open trial is claimed only while the breaker is not open again, against the in-process store and
a real Redis (loopback fake upstreams).

The claim was a bare "take the lease if free" (Redis SET NX, the in-process store alike). A request whose plan read the
breaker half-open (its cooldown over, no trial in flight) and which claimed the trial after another worker's trial
had failed and opened the breaker again got a lease (the failed trial had released its own) and sent its request to
the provider in the middle of its new cooldown: a second "single" trial, and with a provider that fails fast, every
request whose view of the breaker was that old went through. Now the claim refuses while the breaker is open, in the
same atomic step (a Lua script in Redis).
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import UpstreamStatus
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import BACKENDS, CHAT_JSON, MESSAGES, backend_settings, make_config, \
    scale_to_zero, started_store, steady, end_cooldown

GOOD = Behavior.reply(CHAT_JSON)


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_refuses_a_trial_while_the_breaker_is_open(backend, clock):
    async def main():
        async with started_store(backend) as s:
            await s.failure("a", threshold=1, cooldown_s=30.0, open_s=None, why="x", status=None, trial=None)
            while_open = await s.claim_trial("a", lease_s=30.0)
            await end_cooldown(s, backend, clock)
            half_open = await s.claim_trial("a", lease_s=30.0)
            return while_open, half_open

    while_open, half_open = asyncio.run(main())
    assert while_open is None and half_open


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_trial_is_claimed_once_another_workers_trial_reopened_the_breaker(backend, clock):
    async def main():
        probe_held, release_probe = asyncio.Event(), asyncio.Event()

        async def health():  # the probe of R's plan waits here: its view of a's breaker ages meanwhile
            probe_held.set()
            await release_probe.wait()
            return Behavior.status(200, body={"status": "ok"})

        async with FakeOpenAI(Behavior.status(500), health=health) as a, FakeOpenAI(GOOD) as b:
            cfg = make_config(scale_to_zero("a", a, probe_timeout_s=2.0), steady("b", b), breaker_failures=1,
                              cooldown_s=30.0, deadline_s=10.0, **backend_settings(backend))
            shared = MemoryStore() if backend == "memory" else None  # Redis: each worker its own client
            async with Chain(cfg, store=shared) as chain, Chain(cfg, store=shared) as other_worker:
                store = chain.store
                await chain.breakers["a"].failure(_a_failure(), None)         # a opened, then its cooldown ends
                await end_cooldown(store, backend, clock)
                half_open = (await store.breakers(["a"]))[0]
                request = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))  # plan: a half-open
                await probe_held.wait()
                # meanwhile another worker's half-open trial fails at once: the breaker is open for 30 s again
                breaker = other_worker.breakers["a"]
                token, refused = await breaker.trial(half_open)
                ok = refused is None
                reopened = await breaker.failure(_a_failure(), token)
                release_probe.set()
                result = await request
                return half_open, ok, reopened, result, len(a.requests), (await store.breakers(["a"]))[0]

    half_open, ok, reopened, result, a_calls, snap = asyncio.run(main())
    assert half_open.tripped and half_open.open_left_s == 0 and not half_open.trial
    assert ok and reopened
    # before: the request claimed a second trial (the failed one had released its lease) and sent it to a, which was
    # cooling down again
    assert a_calls == 0
    assert result.attempts == [("a", "cooldown"), ("b", "ok")]
    assert snap.open_left_s > 25 and not snap.trial


def _a_failure() -> UpstreamStatus:
    return UpstreamStatus("a", 500)

