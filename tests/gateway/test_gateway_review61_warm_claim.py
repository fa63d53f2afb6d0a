"""Review 61: a warm-up lease claimed while the gate closes is not left behind in the shared store.

The cold probe claims the warm-up's lease in the state store and then starts the warm-up. With Redis the claim is a
round trip: the script runs on the server, then the reply comes back. A worker shutting down (Chain.aclose cancels
the probe) while that reply was on its way lost the token, so nobody ran the warm-up and nobody gave the lease back:
every worker read the endpoint as "warming" and skipped it, without a probe and without any warm-up, until the lease
expired (warmup_budget_s + warmup_request_timeout_s + 5 s: 305 s with the example's settings).
"""

import asyncio

from hearth.gateway.chain import Chain
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, provider, scale_to_zero


class _SlowReplyStore(MemoryStore):
    """The claim lands in the store at once, its answer comes back a little later (a Redis round trip)."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed = asyncio.Event()

    async def claim_warmup(self, name, lease_s):
        token = await super().claim_warmup(name, lease_s)
        self.claimed.set()
        await asyncio.sleep(0.2)
        return token


def test_a_probe_cancelled_while_its_claim_comes_back_leaves_no_lease_behind():
    async def main():
        store = _SlowReplyStore()
        async with FakeOpenAI(Behavior.reply(CHAT_JSON), health=Behavior.status(503)) as ft:
            chain = Chain(make_config(scale_to_zero("ft", ft, warmup_budget_s=60.0, warmup_request_timeout_s=30.0)),
                          store=store)
            await chain.start()
            gate = chain.gates["ft"]
            asking = asyncio.create_task(gate.verdict())
            await store.claimed.wait()   # the lease is in the store, its token on the way back
            await chain.aclose()         # the worker shuts down: the probe is cancelled
            verdict = await asking
            return verdict, await store.warm("ft")

    verdict, snap = asyncio.run(main())
    assert verdict == (False, 0.0)
    # before: warming for the whole lease (95 s here) with no warm-up running anywhere
    assert not snap.warming, snap


class _SlowTrialStore(MemoryStore):
    """The half-open trial's claim lands at once, its answer comes back a little later (a Redis round trip)."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed = asyncio.Event()

    async def try_trial(self, name, lease_s):  # the claim the breaker makes (claim_trial is its token only)
        claim = await super().try_trial(name, lease_s)
        self.claimed.set()
        await asyncio.sleep(0.2)
        return claim


def test_a_request_cancelled_while_its_trial_claim_comes_back_leaves_no_trial_behind():
    """The same for the half-open trial: a client hanging up while the request claimed it left the lease (total_s +
    5 s) behind, and every request skipped the provider ("trial in flight") though no trial ran."""
    async def main():
        store = _SlowTrialStore()
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
            async with Chain(make_config(provider("a", a)), store=store) as chain:
                await store.failure("a", threshold=1, cooldown_s=0.01, open_s=None, why="x", status=None, trial=None)
                await asyncio.sleep(0.05)  # the cooldown is over: the next attempt is the trial
                request = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))
                await store.claimed.wait()
                request.cancel()           # the client hangs up
                await asyncio.gather(request, return_exceptions=True)
                return (await store.breakers(["a"]))[0]

    snap = asyncio.run(main())
    assert snap.tripped and not snap.trial, snap


class _SlowFailureStore(MemoryStore):
    """Recording a failure waits before it reaches the store (e.g. for a free connection of the Redis pool)."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = asyncio.Event()

    async def failure(self, name, **kw):
        self.recording.set()
        await asyncio.sleep(0.2)
        return await super().failure(name, **kw)


def test_a_request_cancelled_while_its_trials_failure_is_recorded_gives_the_trial_back():
    """The trial's attempt failed and the client hung up before the failure reached the store: the attempt was
    already marked settled, so nothing gave the trial back and the provider was skipped for the trial's lease."""
    async def main():
        store = _SlowFailureStore()
        async with FakeOpenAI(Behavior.status(500)) as a:
            async with Chain(make_config(provider("a", a)), store=store) as chain:
                await MemoryStore.failure(store, "a", threshold=1, cooldown_s=0.01, open_s=None, why="x", status=None,
                                          trial=None)
                await asyncio.sleep(0.05)  # the cooldown is over: the next attempt is the trial
                request = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))
                await store.recording.wait()
                request.cancel()           # the client hangs up
                await asyncio.gather(request, return_exceptions=True)
                return (await store.breakers(["a"]))[0]

    snap = asyncio.run(main())
    assert snap.tripped and not snap.trial, snap
