"""Review gw2: defects found in the gateway's config, state and server (each test fails before its fix)."""

from __future__ import annotations

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
