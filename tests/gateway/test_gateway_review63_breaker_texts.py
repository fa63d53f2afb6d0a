"""Review 63: what a breaker skip or an opened breaker says is what happened (in-process store and real Redis).

1. A half-open trial claim refused because the breaker is open again (another worker's trial failed after this
   request read it half-open) was described as "half-open: one trial request is in flight", with 0 s left: the
   client's 502/503 and the log named a trial that was not running, and the time until the provider may be tried
   was unknown. The claim's own atomic step now says why it refused (no extra store round trip).
2. A failure of an attempt whose trial lease had expired (another request claimed a trial meanwhile, and closed the
   breaker) is an ordinary failure for the store, but the breaker described it as "the half-open trial failed" when
   it opened the breaker: the store now picks the text by what it found.
"""

import asyncio

import pytest

from hearth.gateway.breaker import Breaker
from hearth.gateway.chain import Chain
from hearth.gateway.errors import AllProvidersFailed, Cooldown, UpstreamStatus
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import BACKENDS, MESSAGES, backend_settings, make_config, scale_to_zero, \
    started_store, end_cooldown, expire_trial


def _a_failure() -> UpstreamStatus:
    return UpstreamStatus("a", 500)




@pytest.mark.parametrize("backend", BACKENDS)
def test_a_trial_claim_refused_by_a_reopened_breaker_says_it_is_open_again(backend, clock):
    async def main():
        probe_held, release_probe = asyncio.Event(), asyncio.Event()

        async def health():  # the probe of the request's plan waits here: its view of a's breaker ages meanwhile
            probe_held.set()
            await release_probe.wait()
            return Behavior.status(200, body={"status": "ok"})

        async with FakeOpenAI(Behavior.status(500), health=health) as a:
            cfg = make_config(scale_to_zero("a", a, probe_timeout_s=2.0), breaker_failures=1, cooldown_s=30.0,
                              deadline_s=10.0, **backend_settings(backend))
            shared = MemoryStore() if backend == "memory" else None
            async with Chain(cfg, store=shared) as chain, Chain(cfg, store=shared) as other_worker:
                await chain.breakers["a"].failure(_a_failure(), None)
                await end_cooldown(chain.store, backend, clock)
                half_open = (await chain.store.breakers(["a"]))[0]
                request = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))
                await probe_held.wait()
                breaker = other_worker.breakers["a"]
                token, refused = await breaker.trial(half_open)
                assert refused is None and await breaker.failure(_a_failure(), token)  # the other worker's trial failed: open
                release_probe.set()
                with pytest.raises(AllProvidersFailed) as caught:
                    await request
                return caught.value.exceptions[0], len(a.requests)

    skipped, a_calls = asyncio.run(main())
    assert a_calls == 0
    assert isinstance(skipped, Cooldown)
    assert "trial request is in flight" not in str(skipped), skipped
    assert "the half-open trial failed" in str(skipped), skipped  # why it is open: the other worker's trial
    assert skipped.remaining_s > 25


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failure_holding_an_expired_trial_is_not_described_as_the_trial(backend, clock):
    async def main():
        async with started_store(backend) as store:
            breaker = Breaker("a", store, threshold=1, cooldown_s=30.0, max_retry_after_s=300.0, trial_lease_s=30.0)
            await breaker.failure(_a_failure(), None)
            await end_cooldown(store, backend, clock)
            half_open = (await store.breakers(["a"]))[0]
            stale, refused = await breaker.trial(half_open)  # this attempt's lease runs out while it waits
            assert refused is None
            await expire_trial(store, backend, clock)
            token, refused = await breaker.trial(half_open)  # another request's trial, which closes the breaker
            assert refused is None and await breaker.success(token)
            opened = await breaker.failure(_a_failure(), stale)  # an ordinary failure now (threshold 1)
            return opened, (await store.breakers(["a"]))[0]

    opened, snap = asyncio.run(main())
    assert opened and snap.open_left_s > 25
    assert "half-open trial" not in snap.why, snap.why
    assert snap.why.startswith("1 consecutive failures"), snap.why
