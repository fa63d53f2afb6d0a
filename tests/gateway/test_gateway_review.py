"""Defects found by a correctness review of the gateway (one test per defect; each failed before its fix)."""

import asyncio
import json

from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, gateway, make_config, provider


def test_a_nan_deadline_is_a_400_naming_hearth_deadline_s_not_a_500():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
            async with gateway(make_config(provider("a", a))) as client:
                out = []
                for value in ("NaN", "-Infinity"):  # Python's json module reads these non-JSON constants
                    body = '{"messages": %s, "hearth_deadline_s": %s}' % (json.dumps(MESSAGES), value)
                    r = await client.post("/v1/chat/completions", data=body.encode(),
                                          headers={"Content-Type": "application/json"})
                    out.append((r.status, (await r.json())["error"]))
                return out, len(a.requests)

    out, upstream = asyncio.run(main())
    for status, error in out:
        # before: NaN passed the range check, the chain refused it with a ValueError: 500 internal_error
        assert (status, error["param"]) == (400, "hearth_deadline_s"), error
        assert "hearth_deadline_s" in error["message"]
    assert upstream == 0
