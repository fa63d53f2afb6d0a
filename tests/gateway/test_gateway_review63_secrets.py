"""Review 63: start-up error messages must not print a URL's password.

Config validation quoted the whole URL: a state_url (Redis) or a provider base_url / health_url holding
user:password@ (or an API key in its query) was printed in full in the start-up error (stderr and the log).
"""

from __future__ import annotations

import pytest

from hearth.gateway.config import config_from_dict
from hearth.gateway.errors import ConfigError

SECRET = "s3cretPassw0rd"
KEY = "sk-live-0123456789"


def _provider(**extra) -> dict:
    return {"name": "p", "base_url": "http://127.0.0.1:9/v1", "model": "m", **extra}


@pytest.mark.parametrize("gateway, provider, field", [
    ({"state_url": f"redis://svc:{SECRET}@127.0.0.1:6379/abc"}, {}, "gateway.state_url"),
    ({"state_url": f"rediss://:{SECRET}@127.0.0.1:6379/x"}, {}, "gateway.state_url"),
    ({"state_url": f"http://svc:{SECRET}@127.0.0.1:6379/0"}, {}, "gateway.state_url"),
    ({}, {"base_url": f"ftp://svc:{SECRET}@10.0.0.5:8000/v1"}, "providers[0].base_url"),
    ({}, {"base_url": f"http://svc:{SECRET}@10.0.0.5:8000/v1 "}, "providers[0].base_url"),
    ({}, {"base_url": f"http://svc:{SECRET}@10.0.0.5:abc/v1"}, "providers[0].base_url"),
    ({}, {"scale_to_zero": True, "health_url": f"http://svc:{SECRET}@10.0.0.5:8000/health?api_key={KEY}\t"},
     "providers[0].health_url"),
    ({}, {"scale_to_zero": True, "health_url": f"http://10.0.0.5:0/health?token={KEY}"}, "providers[0].health_url"),
])
def test_a_config_error_names_the_setting_without_the_urls_password(gateway, provider, field):
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"gateway": gateway, "providers": [_provider(**provider)]}, env={})
    assert caught.value.field == field
    message = str(caught.value)
    assert SECRET not in message and KEY not in message, message
    assert "***" in message, message  # the URL is still shown, its secrets masked


def test_masked_url_masks_the_password_and_secret_query_values_only():
    from hearth.gateway.config import masked_url

    assert masked_url(f"redis://svc:{SECRET}@h:6379/0") == "redis://svc:***@h:6379/0"
    assert masked_url(f"http://{KEY}@h/v1") == "http://***@h/v1"
    assert masked_url(f"http://h/health?api_key={KEY}&x=1&Token={KEY}") == "http://h/health?api_key=***&x=1&Token=***"
    assert masked_url("http://h:8000/v1") == "http://h:8000/v1"
