"""A success that is stale evidence must not close a tripped breaker (hearth.gateway.breaker).

Before: Breaker.success() / StateStore.success(name) closed the breaker unconditionally (MemoryStore popped the
state, RedisStore deleted its keys). A slow request admitted while the breaker was closed that succeeded after
concurrent requests' failures had opened it closed it at once, although the provider had just failed
breaker_failures times in a row, and it wiped the lease of the half-open trial another request held (so a second
"single" trial went through). Now only the attempt holding the trial token closes a tripped breaker; a success
from any other attempt resets the consecutive-failure count while the breaker is closed and changes nothing while
it is open or half-open. Each test runs against the in-process store and against a real Redis.
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import BACKENDS, CHAT_JSON, MESSAGES, backend_settings, make_config, provider, \
    started_store, steady

GOOD = Behavior.reply(CHAT_JSON)
FAIL = dict(threshold=3, cooldown_s=30.0, open_s=None, why="x", status=None)


# ------------------------------------------------------------------ the store
@pytest.mark.parametrize("backend", BACKENDS)
def test_store_a_success_without_the_trial_leaves_an_open_breaker_open(backend):
    async def main():
        async with started_store(backend) as s:
            for _ in range(3):
                await s.failure("a", **FAIL, trial=None)            # 3 in a row: open for 30 s
            closed_it = await s.success("a", None)                  # a request admitted before it opened
            return closed_it, (await s.breakers(["a"]))[0]

    closed_it, snap = asyncio.run(main())
    assert closed_it is False
    assert snap.failures == 3 and snap.tripped and 29 < snap.open_left_s <= 30 and snap.why == "x"


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_only_the_trial_holder_closes_a_half_open_breaker(backend):
    async def main():
        async with started_store(backend) as s:
            await s.failure("a", threshold=1, cooldown_s=0.05, open_s=None, why="x", status=None, trial=None)
            await asyncio.sleep(0.08)                               # the cooldown ended: half-open
            token = await s.claim_trial("a", lease_s=30.0)
            stale = await s.success("a", None)                      # an attempt admitted before it opened
            stranger = await s.success("a", "not-the-token")        # a token that does not hold the lease
            after_stale = (await s.breakers(["a"]))[0]
            second_trial = await s.claim_trial("a", lease_s=30.0)   # the lease must still be held
            closed_it = await s.success("a", token)                 # the trial's own success
            return token, stale, stranger, after_stale, second_trial, closed_it, (await s.breakers(["a"]))[0]

    token, stale, stranger, after_stale, second_trial, closed_it, closed = asyncio.run(main())
    assert token and stale is False and stranger is False
    assert after_stale.tripped and after_stale.trial and after_stale.failures == 1
    assert second_trial is None
    assert closed_it is True
    assert closed.failures == 0 and not closed.tripped and not closed.trial and closed.open_left_s == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_a_success_while_closed_resets_the_consecutive_failures(backend):
    async def main():
        async with started_store(backend) as s:
            await s.failure("a", **FAIL, trial=None)
            await s.failure("a", **FAIL, trial=None)
            reset = await s.success("a", None)
            after_reset = (await s.breakers(["a"]))[0]
            opened = await s.failure("a", **FAIL, trial=None)     # one failure, not the third in a row
            return reset, after_reset, opened, (await s.breakers(["a"]))[0]

    reset, after_reset, opened, snap = asyncio.run(main())
    assert reset is True and after_reset.failures == 0 and not after_reset.tripped
    assert opened is False and snap.failures == 1 and snap.open_left_s == 0 and not snap.tripped


# ------------------------------------------------------------------ through the chain (loopback fake upstream)
def _scripted():
    """A handler for `a`: requests 2 and 4 wait for their events and then answer well, every other one is a 500."""
    go = {2: asyncio.Event(), 4: asyncio.Event()}
    seen = 0

    async def handler(body):
        nonlocal seen
        seen += 1
        if seen in go:
            await go[seen].wait()
            return GOOD
        return Behavior.status(500)

    return handler, go


async def _until(server, n: int) -> None:
    for _ in range(1000):                                   # bounded: 10 s
        if len(server.requests) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the fake saw {len(server.requests)} requests, not {n}")


def _config(a, b, backend, cooldown_s):
    slow = {"connect_s": 2.0, "first_token_s": 5.0, "total_s": 5.0}   # the held requests are not timeouts
    return make_config(provider("a", a, timeouts=slow), steady("b", b), breaker_failures=2, cooldown_s=cooldown_s,
                       deadline_s=10.0, **backend_settings(backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slow_success_that_lands_after_the_breaker_opened_leaves_it_open(backend):
    async def main():
        handler, go = _scripted()
        async with FakeOpenAI(handler) as a, FakeOpenAI(GOOD) as b:
            async with Chain(_config(a, b, backend, cooldown_s=30.0)) as chain:
                first = await chain.complete(MESSAGES, kind="chat")                 # a: 500 (1 failure)
                slow = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))  # a: admitted, held
                await _until(a, 2)
                second = await chain.complete(MESSAGES, kind="chat")                # a: 500, 2 in a row: open
                go[2].set()
                slow = await slow                                                   # a answers well, late
                state = (await chain.status())[0]
                metrics = chain.metrics.render().decode()
                after = await chain.complete(MESSAGES, kind="chat")
                return first, slow, second, state, metrics, after, len(a.requests)

    first, slow, second, state, metrics, after, a_calls = asyncio.run(main())
    assert first.attempts == [("a", "status_500"), ("b", "ok")] == second.attempts
    assert slow.attempts == [("a", "ok")]
    # before: the late success closed the breaker (state "closed", 0 failures, gauge 0) and `after` went to a
    assert state["state"] == "open" and state["consecutive_failures"] == 2 and 29 < state["cooldown_left_s"] <= 30
    assert 'hearth_gateway_breaker_open{provider="a"} 1.0' in metrics
    assert after.attempts == [("a", "cooldown"), ("b", "ok")] and a_calls == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slow_success_during_the_half_open_trial_keeps_the_single_trial(backend):
    cooldown_s = 0.3

    async def main():
        handler, go = _scripted()
        async with FakeOpenAI(handler) as a, FakeOpenAI(GOOD) as b:
            async with Chain(_config(a, b, backend, cooldown_s=cooldown_s)) as chain:
                await chain.complete(MESSAGES, kind="chat")                         # a: 500 (1 failure)
                slow = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))  # a: admitted, held
                await _until(a, 2)
                await chain.complete(MESSAGES, kind="chat")                         # a: 500: open
                await asyncio.sleep(cooldown_s + 0.05)                              # the cooldown ended: half-open
                trial = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))  # a: the one trial, held
                await _until(a, 4)
                go[2].set()
                slow = await slow                                                   # the stale success lands
                during = (await chain.status())[0]
                other = await chain.complete(MESSAGES, kind="chat")                 # must not be a second trial
                go[4].set()
                trial = await trial                                                 # the trial's success closes
                closed = (await chain.status())[0]
                return slow, during, other, trial, closed, len(a.requests)

    slow, during, other, trial, closed, a_calls = asyncio.run(main())
    assert slow.attempts == [("a", "ok")]
    # before: the stale success closed the breaker and wiped the trial's lease: `other` went to a as a second trial
    assert during["state"] == "half_open" and during["trial_in_flight"] and during["consecutive_failures"] == 2
    assert other.attempts == [("a", "cooldown"), ("b", "ok")]
    assert trial.attempts == [("a", "ok")]
    assert closed["state"] == "closed" and closed["consecutive_failures"] == 0 and not closed["trial_in_flight"]
    assert a_calls == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_a_trial_whose_lease_expired_closes_nothing(backend):
    # the contract (StateStore.success, Breaker docs): only a trial whose lease is still held closes the breaker.
    # Redis's lease is a key with a TTL, gone when it expires; the in-process store kept the token and compared only
    # that, so the same late success closed the breaker there and left it half-open under Redis
    async def main():
        async with started_store(backend) as s:
            await s.failure("a", threshold=1, cooldown_s=0.05, open_s=None, why="x", status=None, trial=None)
            await asyncio.sleep(0.08)                               # the cooldown ended: half-open
            token = await s.claim_trial("a", lease_s=0.05)
            await asyncio.sleep(0.08)                               # the lease expired, nobody claimed a new one
            closed_it = await s.success("a", token)
            return token, closed_it, (await s.breakers(["a"]))[0]

    token, closed_it, snap = asyncio.run(main())
    assert token and closed_it is False
    assert snap.tripped and not snap.trial and snap.failures == 1
