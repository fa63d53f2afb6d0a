"""Review 52f: Qwen3 gets thinking OFF on every call the gateway makes to it, as docs/gateway.example.toml sets it.

The example's two Qwen providers (the vLLM fine-tune: chat_template_kwargs.enable_thinking; hosted Qwen on
DashScope's compatible mode: enable_thinking) are loaded from the example file, pointed at loopback fakes, and
called through the gateway's HTTP API, streamed and not: the bodies the fakes receive must carry the switch. With
thinking on, the reasoning ate the token budget and truncated the JSON reply.
"""

import asyncio
from pathlib import Path

from hearth.gateway.config import load_config
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, gateway

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "gateway.example.toml"


def test_both_qwen_providers_of_the_example_get_thinking_off_streamed_and_not():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as ft, FakeOpenAI(Behavior.reply(CHAT_JSON)) as hosted:
            cfg = load_config(EXAMPLE, env={"HEARTH_VLLM_URL": ft.url, "HEARTH_VLLM_API_KEY": "k1",
                                            "DASHSCOPE_API_KEY": "k2", "OPENAI_API_KEY": "k3"})
            ft_p, qwen, openai = cfg.providers
            cfg = cfg.model_copy(update={"providers": (ft_p, qwen.model_copy(update={"base_url": hosted.base_url}),
                                                       openai)})
            async with gateway(cfg) as client:
                for model in ("hearth-lora", "qwen3-14b"):
                    for stream in (False, True):
                        async with client.post("/v1/chat/completions",
                                               json={"messages": MESSAGES, "model": model, "stream": stream}) as r:
                            assert r.status == 200, await r.text()
                            assert r.headers["X-Hearth-Provider"] == ("finetune" if model == "hearth-lora"
                                                                      else "qwen-hosted")
                            await r.read()
            return ft.requests, hosted.requests

    ft_bodies, hosted_bodies = asyncio.run(main())
    assert [bool(b.get("stream")) for b in ft_bodies] == [False, True]
    assert [bool(b.get("stream")) for b in hosted_bodies] == [False, True]
    for body in ft_bodies:  # vLLM: the chat template's switch
        assert body["chat_template_kwargs"] == {"enable_thinking": False}, body
    for body in hosted_bodies:  # DashScope: a top-level parameter
        assert body["enable_thinking"] is False, body
