"""Review 50q: a provider URL's user:password@ credentials must not reach clients.

config.py accepts credentials in base_url (as the provider's auth, when it sends no Authorization header) and in a
scale-to-zero provider's health_url (review 50j made a start-up error of them only beside the probe's Authorization).
The transport put the whole URL, credentials included, into its ConnectFailed / ConnectTimeout messages, which became
the provider error's text: the `failures[].message` of the 502 sent to every client, and the warm gate's
`last_error` that `GET /v1/providers` shows to anyone. Real loopback sockets; the "provider" is a port with nothing
listening (connection refused at once).
"""

from __future__ import annotations

import pytest

from hearth.gateway.transport.client import AiohttpTransport, ConnectFailed
from tests.gateway.gateway_helpers import MESSAGES, closed_port, gateway, make_config

pytestmark = pytest.mark.anyio
SECRET = "s3cretPassw0rd"


def _provider(**extra) -> dict:
    port = closed_port()
    return {"name": "creds", "base_url": f"http://svc:{SECRET}@127.0.0.1:{port}/v1", "model": "m",
            "timeouts": {"connect_s": 1.0, "first_token_s": 1.0, "total_s": 2.0}, **extra}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_refused_connection_does_not_send_the_providers_url_password_to_the_client(stream):
    cfg = make_config(_provider())
    async with gateway(cfg) as client:
        async with client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": stream}) as resp:
            body = await resp.text()
    assert resp.status == 502, body
    assert "ConnectionFailed" in body  # the failure is still described
    assert SECRET not in body


async def test_the_health_probes_last_error_does_not_show_the_health_urls_password():
    port = closed_port()
    cfg = make_config(_provider(scale_to_zero=True, health_url=f"http://svc:{SECRET}@127.0.0.1:{port}/health",
                                warm={"probe_timeout_s": 1.0}))
    async with gateway(cfg) as client:
        async with client.post("/v1/chat/completions", json={"messages": MESSAGES}) as resp:
            await resp.read()  # the probe runs (cold: refused)
        async with client.get("/v1/providers") as resp:
            body = await resp.text()
    assert "last_error" in body
    assert SECRET not in body


async def test_transport_errors_name_the_url_without_its_credentials():
    transport = AiohttpTransport()
    await transport.start()
    try:
        url = f"http://svc:{SECRET}@127.0.0.1:{closed_port()}/v1/chat/completions"
        with pytest.raises(ConnectFailed) as caught:
            await transport.open("POST", url, headers={}, body=b"{}", connect_timeout_s=1.0)
    finally:
        await transport.aclose()
    assert SECRET not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)
