"""Review 62: the breaker's consecutive-failure count, against the in-process store and a real Redis (loopback fake
upstreams).

A success resets the consecutive-failure count also when the request's plan read the breaker with no failures at all.
Chain._succeeded skipped the store for such an attempt (its snapshot was CLOSED), so a success that landed between
failures of requests admitted after it reset nothing: breaker_failures failures with successes between them opened
the breaker as if they were in a row, and the provider was skipped for cooldown_s.
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import BACKENDS, CHAT_JSON, MESSAGES, backend_settings, make_config, provider, \
    steady

GOOD = Behavior.reply(CHAT_JSON)
SLOW = {"connect_s": 2.0, "first_token_s": 5.0, "total_s": 5.0}   # a held request is not a timeout


async def _until(server, n: int) -> None:
    for _ in range(1000):                                   # bounded: 10 s
        if len(server.requests) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the fake saw {len(server.requests)} requests, not {n}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_success_admitted_while_closed_resets_the_consecutive_failures(backend):
    async def main():
        go = asyncio.Event()
        seen = 0

        async def handler(body):  # the first request waits for `go` and answers well; every other one is a 500
            nonlocal seen
            seen += 1
            if seen == 1:
                await go.wait()
                return GOOD
            return Behavior.status(500)

        async with FakeOpenAI(handler) as a, FakeOpenAI(GOOD) as b:
            cfg = make_config(provider("a", a, timeouts=SLOW), steady("b", b), breaker_failures=3, cooldown_s=30.0,
                              deadline_s=10.0, **backend_settings(backend))
            async with Chain(cfg) as chain:
                slow = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))  # admitted with no failures, held
                await _until(a, 1)
                failed = [await chain.complete(MESSAGES, kind="chat") for _ in range(2)]   # a: 500, 500
                go.set()
                slow = await slow                                                   # a answers well after them
                after_success = (await chain.status())[0]
                third = await chain.complete(MESSAGES, kind="chat")                 # a: 500, one since the success
                state = (await chain.status())[0]
                next_one = await chain.complete(MESSAGES, kind="chat")
                return failed, slow, after_success, third, state, next_one

    failed, slow, after_success, third, state, next_one = asyncio.run(main())
    assert [r.attempts for r in failed] == [[("a", "status_500"), ("b", "ok")]] * 2
    assert slow.attempts == [("a", "ok")]
    assert after_success["consecutive_failures"] == 0          # before: 2, the success counted for nothing
    assert third.attempts == [("a", "status_500"), ("b", "ok")]
    # before: the third failure since the success opened the breaker for 30 s and the next request skipped a
    assert state["state"] == "closed" and state["consecutive_failures"] == 1
    assert next_one.attempts[0] == ("a", "status_500")
