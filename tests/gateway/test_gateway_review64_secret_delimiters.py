"""Review 64: a URL password holding an unencoded '#', '/' or '?' was printed in full in the start-up error.

Generated passwords (base64: '/', '+'; others: '#', '?') often hold a URL delimiter. Written unencoded, the
authority ends at that delimiter (urlsplit reads ":pa" as host and a port that is not a number), so the URL is
refused, and its message quoted it: masked_url found no '@' in the cut authority and masked nothing, and the
parser's own reason ("Port could not be cast to integer value as 'pa'") repeated the password's start.
"""

from __future__ import annotations

import pytest

from hearth.gateway.config import config_from_dict, masked_url
from hearth.gateway.errors import ConfigError

HEAD, TAIL = "Zq8vLm", "Rt5wXy"


def _provider(**extra) -> dict:
    return {"name": "p", "base_url": "http://127.0.0.1:9/v1", "model": "m", **extra}


@pytest.mark.parametrize("cut", ["#", "/", "?"])
@pytest.mark.parametrize("gateway, provider, field", [
    ({"state_url": "redis://:{pw}@127.0.0.1:6379/0"}, {}, "gateway.state_url"),
    ({"state_url": "redis://svc:{pw}@127.0.0.1:6379/0"}, {}, "gateway.state_url"),
    ({}, {"base_url": "http://svc:{pw}@10.0.0.5:8000/v1"}, "providers[0].base_url"),
])
def test_a_password_with_a_url_delimiter_is_not_printed(cut, gateway, provider, field):
    pw = HEAD + cut + TAIL
    gateway = {k: v.format(pw=pw) for k, v in gateway.items()}
    provider = {k: v.format(pw=pw) for k, v in provider.items()}
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"gateway": gateway, "providers": [_provider(**provider)]}, env={})
    assert caught.value.field == field
    message = str(caught.value)
    assert HEAD not in message and TAIL not in message, message
    assert "***" in message, message


def test_masked_url_leaves_a_valid_url_with_an_at_sign_after_its_host_alone():
    assert masked_url("http://h:8000/v1?email=a@b") == "http://h:8000/v1?email=a@b"
    assert masked_url("http://h/v1/a@b") == "http://h/v1/a@b"
    assert masked_url(f"redis://:{HEAD}#{TAIL}@h:6379/0") == "redis://:***@h:6379/0"
