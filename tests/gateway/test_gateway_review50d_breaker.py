"""A half-open breaker's single trial: its success is recorded (the breaker closed) before the trial is given back,
so no other request/worker can claim a second "single" trial in between."""

import asyncio

import pytest

from hearth.gateway.chain import Chain, StreamDone
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, provider


class HookedStore(MemoryStore):
    """A MemoryStore that, at the moment the chain records the trial's success or gives the trial back, lets
    "another worker" try to claim the provider's trial first (the interleaving a shared store allows)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, object]] = []

    def half_open(self, name: str) -> None:
        b = self._get(name)
        b.failures, b.tripped, b.open_until = 3, True, 0.0   # tripped, cooldown over: half-open

    async def _other_worker(self, name: str, when: str) -> None:
        snap = (await self.breakers([name]))[0]
        # another worker's request: a tripped breaker whose trial is free admits one trial
        if snap.tripped and not snap.trial:
            self.events.append((when, "second trial" if await self.claim_trial(name, 60.0) else "refused"))
        else:
            self.events.append((when, "skipped" if snap.tripped else "closed"))

    async def success(self, name: str, trial: str | None) -> bool:
        await self._other_worker(name, "during success")
        closed = await super().success(name, trial)
        self.events.append(("success", name))
        return closed

    async def release_trial(self, name: str, token: str) -> None:
        await self._other_worker(name, "during release")
        await super().release_trial(name, token)
        self.events.append(("release", name))


async def _run(mode: str):
    store = HookedStore()
    async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
        cfg = make_config(provider("a", a))
        async with Chain(cfg, store=store) as chain:
            store.half_open("a")
            if mode == "complete":
                result = await chain.complete(MESSAGES, kind="chat")
            else:
                result = [item async for item in chain.stream(MESSAGES, kind="chat")][-1]
                assert isinstance(result, StreamDone)
                result = result.result
            status = {s["name"]: s for s in await chain.status()}
    return result, store.events, status


@pytest.mark.parametrize("mode", ["complete", "stream"])
def test_a_successful_half_open_trial_closes_the_breaker_before_any_second_trial(mode):
    result, events, status = asyncio.run(_run(mode))
    assert result.provider == "a"
    # before: the finally gave the trial back first (another worker claimed a second "single" trial right
    # then), and only then was the success recorded
    assert all(what != "second trial" for _, what in events), events
    assert events[0] == ("during success", "skipped")   # the trial is still held while success is recorded
    assert ("success", "a") in events
    assert status["a"]["state"] == "closed" and not status["a"]["trial_in_flight"]
