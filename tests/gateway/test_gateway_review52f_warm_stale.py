"""Review 52f: a "warm" answer that went stale (the scale-to-zero endpoint scaled back to zero since the probe).

The chain forgot the warm answer only after a Timeout or ConnectionFailed. An attempt cut by the request's
deadline (DeadlineExceeded: the app's shorter deadlines, e.g. a feed comment's, are below first_token_s) left
"warm" trusted for the rest of ttl_s, so every later request went to the cold endpoint first and spent its
wait there instead of skipping it.
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import AllProvidersFailed, DeadlineExceeded
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, provider, steady

GOOD = Behavior.reply(CHAT_JSON)
WARM = {"probe_timeout_s": 0.1, "ttl_s": 30.0, "warmup_budget_s": 5.0, "warmup_poll_s": 0.02,
        "warmup_request_timeout_s": 2.0}


def test_an_attempt_cut_by_the_requests_deadline_forgets_the_warm_answer():
    async def main():
        cold = asyncio.Event()  # the endpoint scaled to zero: chat and health wait for a cold start

        def chat(body):
            return Behavior.hang() if cold.is_set() else GOOD

        def health():
            return Behavior.hang() if cold.is_set() else Behavior.status(200, body={"status": "ok"})

        async with FakeOpenAI(chat, health=health) as ft, FakeOpenAI(GOOD) as hosted:
            ft_cfg = provider("ft", ft, scale_to_zero=True, health_url=ft.health_url, warm=WARM)
            async with Chain(make_config(ft_cfg, steady("hosted", hosted))) as chain:
                first = await chain.complete(MESSAGES, kind="chat")              # probed warm: ft answers
                cold.set()
                # the app's short deadline (below ft's first_token_s) runs out on the cold endpoint
                with pytest.raises(AllProvidersFailed) as cut:  # the whole deadline went to ft
                    await chain.complete(MESSAGES, kind="chat", deadline_s=0.2)
                third = await chain.complete(MESSAGES, kind="chat")
                return first, cut.value, third, len(ft.requests)

    first, cut, third, ft_chats = asyncio.run(main())
    assert first.provider == "ft"
    assert isinstance(cut.exceptions[0], DeadlineExceeded) and cut.exceptions[0].provider == "ft"
    # before: ("ft", "timeout_first_token") first: "warm" was still trusted and the request waited on ft again
    assert third.attempts == [("ft", "cold"), ("hosted", "ok")], third.attempts
    assert ft_chats == 2
