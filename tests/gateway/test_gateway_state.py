"""Breaker and warm state: one half-open trial at a time, and state shared between chains through Redis
(issue 13 items 4 and 8). Each test runs against the in-process store and against a real Redis.

Two Chain objects on one Redis stand for two gateway workers (or the gateway and the app): they
share nothing but the store. The 2-process version is in test_gateway_workers.py.
"""

import asyncio
import logging
import shutil
import subprocess

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.state import MemoryStore, RedisStore, StateStoreError
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import (
    BACKENDS, CHAT_JSON, MESSAGES, REDIS_URL, backend_settings, gateway, make_config, needs_redis, provider,
    shared_state, steady, stopwatch,
)

GOOD = Behavior.reply(CHAT_JSON)
COOLDOWN_S = 0.3


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_open_lets_one_trial_through_the_rest_keep_going(backend):
    async def main():
        script = [Behavior.status(500), Behavior.hang(), GOOD, GOOD]   # fail, then the trial hangs, then well again
        async with FakeOpenAI(script) as a, FakeOpenAI(GOOD) as b:
            # b's timing is not under test: generous limits, so that 50 concurrent replies on a loaded 2-core box
            # cannot miss a 0.3 s first token or a 0.5 s connect (each happened once, under a load average above 3)
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=1, cooldown_s=COOLDOWN_S,
                              **backend_settings(backend))
            async with Chain(cfg) as chain:
                first = await chain.complete(MESSAGES, kind="chat")             # a fails: open
                await asyncio.sleep(COOLDOWN_S + 0.05)                          # the cooldown is what is tested
                with stopwatch() as t:
                    burst = await asyncio.gather(*(chain.complete(MESSAGES, kind="chat") for _ in range(50)))
                burst_cost = t()
                reopened = await chain.complete(MESSAGES, kind="chat")          # the trial failed: open again
                await asyncio.sleep(COOLDOWN_S + 0.05)
                healed = await chain.complete(MESSAGES, kind="chat")            # the next trial succeeds
                after = await chain.complete(MESSAGES, kind="chat")
                return first, burst, burst_cost, reopened, healed, after, len(a.requests), (await chain.status())[0]

    first, burst, burst_cost, reopened, healed, after, a_calls, state = asyncio.run(main())
    assert first.attempts == [("a", "status_500"), ("b", "ok")]
    trials = [r for r in burst if r.attempts[0][1] != "cooldown"]
    assert [r.attempts for r in trials] == [[("a", "timeout_first_token"), ("b", "ok")]]   # exactly one trial
    assert all(r.attempts == [("a", "cooldown"), ("b", "ok")] for r in burst if r not in trials)
    assert burst_cost < 3.0  # one timeout (first_token_s 0.3) and the burst's own work, not 50 in a row (15 s)
    assert reopened.attempts == [("a", "cooldown"), ("b", "ok")]
    assert healed.attempts == [("a", "ok")] and after.attempts == [("a", "ok")]
    assert a_calls == 4 and state["state"] == "closed" and state["consecutive_failures"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelled_trial_is_given_back(backend):
    async def main():
        async with FakeOpenAI([Behavior.status(500), Behavior.hang(), GOOD]) as a, FakeOpenAI(GOOD) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=1, cooldown_s=COOLDOWN_S,
                              **backend_settings(backend))
            async with Chain(cfg) as chain:
                await chain.complete(MESSAGES, kind="chat")
                await asyncio.sleep(COOLDOWN_S + 0.05)
                trial = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))
                while len(a.requests) < 2:                       # the trial reached a
                    await asyncio.sleep(0.005)
                busy = await chain.complete(MESSAGES, kind="chat")
                trial.cancel()                                   # the client of the trial hung up
                with pytest.raises(asyncio.CancelledError):
                    await trial
                freed = await chain.complete(MESSAGES, kind="chat")
                return busy, freed, (await chain.status())[0]

    busy, freed, state = asyncio.run(main())
    assert busy.attempts == [("a", "cooldown"), ("b", "ok")]
    assert freed.attempts == [("a", "ok")] and state["state"] == "closed"


@needs_redis
def test_two_chains_on_one_redis_share_cooldowns_and_one_warmup(caplog):
    async def main():
        ft_port = free_port()   # the fine-tune is down (refused): cold
        async with FakeOpenAI(Behavior.status(503, headers={"Retry-After": "30"})) as a, FakeOpenAI(GOOD) as b:
            ft = {"name": "ft", "base_url": f"http://127.0.0.1:{ft_port}/v1", "model": "lora", "scale_to_zero": True,
                  "health_url": f"http://127.0.0.1:{ft_port}/health",
                  "warm": {"probe_timeout_s": 0.1, "ttl_s": 30.0, "warmup_budget_s": 5.0, "warmup_poll_s": 0.05}}
            cfg = make_config(ft, provider("a", a), steady("b", b), **shared_state())
            async with Chain(cfg) as one, Chain(cfg) as two:
                r1 = await one.complete(MESSAGES, kind="chat")    # ft cold (warm-up starts), a 503 Retry-After, b
                r2 = await two.complete(MESSAGES, kind="chat")    # sees both: ft cold, a cooling down
                state = {p["name"]: p for p in await two.status()}
                warming = (one.gates["ft"].warming, two.gates["ft"].warming)
                return r1, r2, state, warming, len(a.requests)

    with caplog.at_level(logging.INFO, logger="hearth.gateway.warm"):
        r1, r2, state, warming, a_calls = asyncio.run(main())
    assert r1.attempts == [("ft", "cold"), ("a", "status_503"), ("b", "ok")]
    assert r2.attempts == [("ft", "cold"), ("a", "cooldown"), ("b", "ok")]     # skipped ones first, in chain order
    assert a_calls == 1
    assert state["a"]["state"] == "open" and 29 < state["a"]["cooldown_left_s"] <= 30
    assert state["ft"]["warm_gate"]["warming"] is True and warming == (True, False)    # one warm-up, in `one`
    assert sum("starting warm-up" in r.getMessage() for r in caplog.records) == 1


@needs_redis
def test_trial_lease_expires_when_its_holder_died():
    async def main():
        store = RedisStore(REDIS_URL, shared_state()["state_prefix"])
        await store.start()
        try:
            await store.failure("a", threshold=1, cooldown_s=0.05, open_s=None, why="x", status=None, trial=None)
            await asyncio.sleep(0.06)
            # a 1 s lease: the second claim comes well inside it, even after a stall on a loaded CI box
            held = await store.claim_trial("a", lease_s=1.0)     # a worker takes the trial and dies
            blocked = await store.claim_trial("a", lease_s=1.0)
            await asyncio.sleep(1.05)
            later = await store.claim_trial("a", lease_s=1.0)
            return held, blocked, later
        finally:
            await store.aclose()

    held, blocked, later = asyncio.run(main())
    assert held and blocked is None and later and later != held


def test_unreachable_redis_fails_chain_start_naming_it():
    async def main():
        cfg = make_config(provider("a", type("S", (), {"base_url": "http://127.0.0.1:9/v1"})()),
                          state_url=f"redis://127.0.0.1:{free_port()}/0")
        with pytest.raises(StateStoreError, match="Redis at redis://127.0.0.1"):
            await Chain(cfg).start()

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_retry_after_only_lengthens_a_cooldown_and_success_closes(backend, clock):
    async def main():
        s = RedisStore(REDIS_URL, shared_state()["state_prefix"]) if backend == "redis" else MemoryStore()
        await s.start()
        try:
            await s.failure("a", threshold=3, cooldown_s=1, open_s=30, why="long", status=429, trial=None)
            await s.failure("a", threshold=3, cooldown_s=1, open_s=2, why="short", status=429, trial=None)
            opened = (await s.breakers(["a", "b"]))
            # the cooldown ends (no trial is claimed while it runs: test_gateway_review62_trial_claim.py); the trial's
            # success closes it (a success without the trial leaves an open breaker open:
            # test_gateway_breaker_stale_success.py)
            if backend == "redis":
                await s._r.delete(s._k("a", "open"))
            else:
                clock.offset += 31.0
            await s.success("a", await s.claim_trial("a", 10.0))
            return opened, (await s.breakers(["a"]))[0]
        finally:
            await s.aclose()

    (a, b), closed = asyncio.run(main())
    assert 29 < a.open_left_s <= 30 and a.why == "long" and a.status == 429 and a.tripped and a.failures == 2
    assert b.failures == 0 and not b.tripped and b.open_left_s == 0
    assert closed.failures == 0 and not closed.tripped and closed.open_left_s == 0


@needs_redis
def test_one_trial_across_two_chains_on_one_redis():
    async def main():
        async with FakeOpenAI([Behavior.status(500), Behavior.hang()]) as a, FakeOpenAI(GOOD) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=1, cooldown_s=COOLDOWN_S,
                              **shared_state())
            async with Chain(cfg) as one, Chain(cfg) as two:
                await one.complete(MESSAGES, kind="chat")                        # opened by `one`
                await asyncio.sleep(COOLDOWN_S + 0.05)
                burst = await asyncio.gather(*(c.complete(MESSAGES, kind="chat") for c in (one, two) * 20))
                return burst, len(a.requests)

    burst, a_calls = asyncio.run(main())
    trials = [r for r in burst if r.attempts[0][1] != "cooldown"]
    assert len(trials) == 1 and trials[0].attempts[0] == ("a", "timeout_first_token") and a_calls == 2
    assert all(r.provider == "b" for r in burst)


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary (.ci/run installs it)")
def test_redis_going_away_is_503_and_unready_not_a_crash(tmp_path):
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)

    async def main():
        import redis.asyncio as aioredis

        probe = aioredis.Redis(port=port)
        for _ in range(200):   # a fresh process: wait until it answers (bounded)
            try:
                await probe.ping()
                break
            except Exception:
                await asyncio.sleep(0.02)
        await probe.aclose()
        async with FakeOpenAI(GOOD) as a:
            cfg = make_config(provider("a", a), state_url=f"redis://127.0.0.1:{port}/0")
            async with gateway(cfg) as client:
                ok = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                server.terminate()
                server.wait(10)
                down = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                ready = await client.get("/readyz")
                return ok.status, down.status, await down.json(), ready.status

    try:
        ok, down, body, ready = asyncio.run(main())
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert ok == 200 and down == 503 and ready == 503
    assert body["error"]["code"] == "state_store_unavailable"
