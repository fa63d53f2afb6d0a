"""Review 52h: the warm-up back-off in the state stores, the in-process one and Redis alike (the Redis runs are
skipped without HEARTH_TEST_REDIS_URL), and held across two chains on one Redis (two workers).

The store keeps, per endpoint, the failed warm-ups in a row and the window it is held cold for (in Redis: the key's
TTL, so workers need no common clock). While held, no worker may claim the warm-up's lease (a probe that was in
flight when the window began must not start a warm-up); a warm answer ends the window and the count.
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import (
    BACKENDS, CHAT_JSON, MESSAGES, make_config, needs_redis, scale_to_zero, shared_state, started_store, steady,
)

GOOD = Behavior.reply(CHAT_JSON)


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_backoff_doubles_caps_blocks_the_warmup_and_a_warm_answer_ends_it(backend):
    async def main():
        async with started_store(backend) as s:
            fresh = await s.warm("ft")
            windows = [await s.warmup_failed("ft", 10.0, 35.0) for _ in range(4)]
            held = await s.warm("ft")
            blocked = await s.claim_warmup("ft", 5.0)          # a probe in flight when the window began
            other = await s.claim_warmup("other", 5.0)         # another endpoint is not held
            await s.set_warm("ft", False, 5.0)                 # a cold answer does not end it
            still = await s.warm("ft")
            await s.set_warm("ft", True, 5.0)                  # a warm one does
            ended = await s.warm("ft")
            claimed = await s.claim_warmup("ft", 5.0)
            restarted = await s.warmup_failed("ft", 10.0, 35.0)
            return fresh, windows, held, blocked, other, still, ended, claimed, restarted

    fresh, windows, held, blocked, other, still, ended, claimed, restarted = asyncio.run(main())
    assert (fresh.held_cold_s, fresh.failed_warmups, fresh.warm, fresh.warming) == (0.0, 0, None, False)
    assert windows == [(1, 10.0), (2, 20.0), (3, 35.0), (4, 35.0)]
    assert held.failed_warmups == 4 and 34 < held.held_cold_s <= 35
    assert blocked is None and other is not None
    assert still.failed_warmups == 4 and still.held_cold_s > 34 and still.warm is False
    assert (ended.failed_warmups, ended.held_cold_s, ended.warm) == (0, 0.0, True)
    assert claimed is not None and restarted == (1, 10.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_window_runs_out_by_itself_and_the_count_stays(backend):
    async def main():
        async with started_store(backend) as s:
            # a 1 s window: read inside it even after a stall on a loaded CI box, then run out
            await s.warmup_failed("ft", 1.0, 10.0)
            held = await s.warm("ft")
            await asyncio.sleep(1.05)      # a TTL runs out: nothing to wait on but the time
            over = await s.warm("ft")
            claimed = await s.claim_warmup("ft", 5.0)
            return held, over, claimed, await s.warmup_failed("ft", 1.0, 10.0)

    held, over, claimed, second = asyncio.run(main())
    assert 0 < held.held_cold_s <= 1.0
    assert over.held_cold_s == 0 and over.failed_warmups == 1 and claimed is not None
    assert second == (2, 2.0)          # the next failure in a row doubles


@needs_redis
def test_two_chains_on_one_redis_hold_a_broken_endpoint_cold_for_both():
    async def main():
        async with FakeOpenAI(GOOD, health=Behavior.status(503)) as ft, FakeOpenAI(GOOD) as hosted:
            gated = scale_to_zero("ft", ft, ttl_s=0, warmup_backoff_s=2.0, warmup_backoff_max_s=10.0)
            cfg = make_config(gated, steady("hosted", hosted), **shared_state())
            async with Chain(cfg) as one, Chain(cfg) as two:
                await one.complete(MESSAGES, kind="chat")      # cold: one's warm-up starts and fails
                await one.gates["ft"].wait_warmup()
                knocks = ft.health_calls
                # ttl_s = 0: without the back-off every one of these probed, and `two` started a warm-up
                burst = await asyncio.gather(*(c.complete(MESSAGES, kind="chat") for c in (one, two) * 10))
                state = await two.gates["ft"].state()
                during = ft.health_calls - knocks
                await asyncio.sleep(2.05)                        # the window's TTL runs out
                await two.complete(MESSAGES, kind="chat")        # two probes, then warms up (and fails)
                await two.gates["ft"].wait_warmup()
                after = await one.gates["ft"].state()
                return burst, state, during, after, ft.health_calls - knocks

    burst, state, during, after, knocked = asyncio.run(main())
    assert all(r.attempts == [("ft", "cold"), ("hosted", "ok")] for r in burst)
    # a 2 s window: the burst and the reads fit inside it with room for a stall on a loaded CI box
    assert during == 0 and state["failed_warmups"] == 1 and 0 < state["held_cold_s"] <= 2.0
    assert knocked >= 2 and after["failed_warmups"] == 2 and 2.0 < after["held_cold_s"] <= 4.0   # doubled, shared
