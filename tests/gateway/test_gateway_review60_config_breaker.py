"""Review gw2: defects found in the gateway's config, state and server (each test fails before its fix)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hearth.gateway.config import ConfigError, config_from_dict
from hearth.gateway.server import main

ONE = {"providers": [{"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}]}


# A state_url whose query the Redis client cannot use (an option it does not know, a typo of one, an ssl_ option on
# redis://, a value it cannot read): the client raised it from the chain's start, as a ValueError / TypeError with a
# traceback (exit 1) instead of the documented start-up error naming gateway.state_url (exit 2); the app building the
# same Chain died the same way.
@pytest.mark.parametrize("query, words", [
    ("?socket_timout=1", "socket_timout"),        # a typo of socket_timeout
    ("?socket_timeout=abc", "socket_timeout"),
    ("?db=one", "db"),
    ("?ssl_cert_reqs=none", "ssl_cert_reqs"),     # an SSL option on a plain redis:// URL
])
def test_a_state_url_query_the_redis_client_refuses_is_a_config_error_naming_it(query, words):
    with pytest.raises(ConfigError) as info:
        config_from_dict({"gateway": {"state_url": f"redis://127.0.0.1:6379/0{query}"}, **ONE}, {})
    assert info.value.field == "gateway.state_url", str(info.value)
    assert words in str(info.value), str(info.value)


def test_state_url_options_the_client_takes_still_load():
    for url in ("redis://127.0.0.1:6379/0?socket_timeout=1.5&health_check_interval=10",
                "rediss://u:p@127.0.0.1:6380/1?ssl_cert_reqs=none", "redis://127.0.0.1:6379"):
        assert config_from_dict({"gateway": {"state_url": url}, **ONE}, {}).gateway.state_url == url


def test_main_exits_2_naming_state_url_for_a_query_the_client_refuses(tmp_path: Path, capsys):
    path = tmp_path / "gateway.toml"
    path.write_text('[gateway]\nstate_url = "redis://127.0.0.1:9/0?socket_timout=1"\n\n[[providers]]\nname = "a"\n'
                    'base_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n', encoding="utf-8")
    assert main(path, port=0) == 2
    err = capsys.readouterr().err
    assert "configuration error: gateway.state_url" in err and "Traceback" not in err, err


# An all-digit host that is not a dotted-quad IPv4 address (a leading zero, a short form): Python's URL parsing takes
# it, the HTTP client refuses it on every request ("is not a canonical IPv4 address"), which failed every chat request
# as a ConnectionFailed counted against the provider (its breaker opened), or every probe of a health_url (the
# endpoint read cold for good). A start-up error naming the setting instead.
@pytest.mark.parametrize("field, url", [
    ("base_url", "http://10.0.0.05:8000/v1"),
    ("base_url", "http://127.1:8000/v1"),
    ("base_url", "http://256.0.0.1:8000/v1"),
    ("health_url", "http://10.0.0.05:8000/health"),
])
def test_an_all_digit_host_the_http_client_refuses_is_a_config_error(field, url):
    p = {"name": "a", "base_url": "http://10.0.0.5:8000/v1", "model": "m", "scale_to_zero": True,
         "health_url": "http://10.0.0.5:8000/health", field: url}
    with pytest.raises(ConfigError) as info:
        config_from_dict({"providers": [p]}, {})
    assert info.value.field == f"providers[0].{field}", str(info.value)
    assert "IPv4" in str(info.value), str(info.value)


def test_the_http_client_refuses_such_a_host_and_takes_the_dotted_quad():
    # what the check stands for: the transport's own reading of the two forms
    from hearth.gateway.transport.client import AiohttpTransport, ConnectFailed

    async def main() -> tuple[str, str]:
        transport = AiohttpTransport(4)
        await transport.start()
        errors = []
        try:
            for url in ("http://127.000.0.1:9/health", "http://127.0.0.1:9/health"):  # nothing listens on port 9
                with pytest.raises(ConnectFailed) as info:
                    await transport.open("GET", url, headers={}, body=None, connect_timeout_s=1.0)
                errors.append(str(info.value))
        finally:
            await transport.aclose()
        return errors[0], errors[1]

    invalid, refused = asyncio.run(main())
    assert "canonical IPv4" in invalid and "canonical" not in refused, (invalid, refused)
    with pytest.raises(ConfigError, match="IPv4"):
        config_from_dict({"providers": [{"name": "a", "base_url": "http://127.000.0.1:9/v1", "model": "m"}]}, {})
    assert config_from_dict({"providers": [{"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}]}, {})


# A reply cut short by the request's own max_tokens (finish_reason "length", no complete envelope) counted toward the
# provider's breaker like a broken reply: three requests asking for a few tokens opened the breaker of every provider
# they reached, and everyone else got 503 providers_unavailable for cooldown_s from healthy providers. The request's
# own cap is the client's choice, as a deadline it shortened is (which never counts); a reply the provider cut at a
# limit of its own (no max_tokens in the request) still counts.
def _truncating(body: dict):
    from tests.fakes.openai_server import Behavior
    from tests.gateway.gateway_helpers import CHAT_JSON

    if body.get("max_tokens") is not None and body["max_tokens"] < 50:
        # Qwen3 thinking first: the cap ends the reply inside its think block, before any JSON (a stream too fails
        # before its first byte, and falls through)
        return Behavior.reply("<think>The user greets me. I should", finish_reason="length")
    return Behavior.reply(CHAT_JSON)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_replies_cut_by_the_requests_own_max_tokens_do_not_open_the_breaker(stream):
    from tests.fakes.openai_server import FakeOpenAI
    from tests.gateway.gateway_helpers import gateway, make_config, post_chat, steady

    async def main():
        async with FakeOpenAI(_truncating) as a:
            async with gateway(make_config(steady("a", a), breaker_failures=3)) as client:
                capped = [await post_chat(client, stream=stream, max_tokens=8) for _ in range(4)]
                r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
                providers = await (await client.get("/v1/providers")).json()
                return capped, r.status, await r.json(), providers["providers"][0], len(a.requests)

    capped, status, body, state, sent = asyncio.run(main())
    assert all(c[0] == 502 and c[2]["error"]["failures"][0]["label"] == "invalid_envelope" for c in capped), capped
    assert status == 200 and body["hearth"]["provider"] == "a", body
    assert state["state"] == "closed" and state["consecutive_failures"] == 0, state
    assert sent == 5   # every capped request reached the provider: none was shed by an open breaker


def test_replies_the_provider_cut_at_its_own_limit_still_open_the_breaker():
    from tests.fakes.openai_server import Behavior, FakeOpenAI
    from tests.gateway.gateway_helpers import CHAT_JSON, gateway, make_config, post_chat, steady

    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON[:20], finish_reason="length")) as a:
            async with gateway(make_config(steady("a", a), breaker_failures=3)) as client:
                first = [await post_chat(client) for _ in range(3)]
                return first, await post_chat(client)

    first, (status, _, body) = asyncio.run(main())
    assert [f[0] for f in first] == [502, 502, 502]
    assert status == 503 and body["error"]["code"] == "providers_unavailable", body
