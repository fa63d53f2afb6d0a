"""Defects found by a correctness review of the gateway (one test per defect; each failed before its fix)."""

import asyncio
import json

from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, gateway, make_config, provider, steady


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


def test_an_infinite_timeout_or_deadline_in_the_toml_is_a_config_error_naming_the_field(tmp_path):
    import pytest

    from hearth.gateway.config import ConfigError, load_config

    base = '[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
    cases = {  # TOML has inf and nan; a timeout of inf is no timeout: a hung provider would hang the request
        "providers[0].timeouts.total_s": base + "[providers.timeouts]\ntotal_s = inf\n",
        "providers[0].timeouts.first_token_s": base + "[providers.timeouts]\nfirst_token_s = inf\n",
        "providers[0].timeouts.connect_s": base + "[providers.timeouts]\nconnect_s = inf\n",
        "providers[0].warm.probe_timeout_s": base.replace('model = "m"\n', 'model = "m"\nscale_to_zero = true\n'
                                                           'health_url = "http://127.0.0.1:9/health"\n')
                                              + "[providers.warm]\nprobe_timeout_s = inf\n",
        "gateway.deadline_s": "[gateway]\ndeadline_s = inf\n" + base,
    }
    for field, text in cases.items():
        path = tmp_path / "g.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as err:  # before: accepted
            load_config(path, env={})
        assert err.value.field == field, (field, str(err.value))


def test_a_control_character_in_an_api_key_or_header_is_a_config_error_not_a_500_per_request():
    import pytest

    from hearth.gateway.chain import Chain
    from hearth.gateway.config import ConfigError, config_from_dict

    base = {"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    # a key read from a file or a secret often ends in a newline: before, it was accepted here and every request
    # then died in the HTTP client with a ValueError (no fallback to the next provider: a 500)
    with pytest.raises(ConfigError) as err:
        config_from_dict({"providers": [{**base, "api_key_env": "KEY"}]}, {"KEY": "sk-secret\n"})
    assert err.value.field == "providers[0].api_key_env" and "KEY" in str(err.value)
    assert "sk-secret" not in str(err.value)
    for headers in ({"X-Team": "a\r\nX-Evil: 1"}, {"X Team": "a"}, {"": "a"}):
        with pytest.raises(ConfigError) as err:
            config_from_dict({"providers": [{**base, "headers": headers}]}, {})
        assert err.value.field == "providers[0].headers", headers
    # what the check lets through still reaches the next provider when the first one fails
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            cfg = config_from_dict({"providers": [{**base, "api_key_env": "KEY", "headers": {"X-Team": "core\tone"}},
                                                  steady("b", b)]}, {"KEY": "sk-secret"})
            async with Chain(cfg) as chain:
                return await chain.complete(MESSAGES, kind="chat")

    assert asyncio.run(main()).provider == "b"
