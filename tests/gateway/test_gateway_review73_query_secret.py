"""Review 73: a health_url's secret query value (?token=..., ?api_key=...) must not reach clients or logs.

config.masked_url hides a query value named like a credential in start-up errors (review 63), but the transport's
own error messages only hid the user:password@ of the URL (review 50q): a scale-to-zero provider whose health route
takes its key in the query (health_url = "https://.../health?token=..."), probed while the endpoint is down, showed the
token in the warm gate's `last_error`, which `GET /v1/providers` gives to anyone and the warm-up's log line prints.
Real loopback sockets; the endpoint is a port with nothing listening (connection refused at once).
"""

from __future__ import annotations

import pytest

from hearth.gateway.transport.client import AiohttpTransport, ConnectFailed
from tests.gateway.gateway_helpers import MESSAGES, closed_port, gateway, make_config

pytestmark = pytest.mark.anyio
SECRET = "qT0kenValue42xyz"


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_the_health_probes_last_error_does_not_show_a_secret_query_value():
    port = closed_port()
    provider = {"name": "lora", "base_url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m",
                "timeouts": {"connect_s": 1.0, "first_token_s": 1.0, "total_s": 2.0}, "scale_to_zero": True,
                "health_url": f"http://127.0.0.1:{port}/health?token={SECRET}", "warm": {"probe_timeout_s": 1.0}}
    async with gateway(make_config(provider)) as client:
        async with client.post("/v1/chat/completions", json={"messages": MESSAGES}) as resp:
            await resp.read()  # the probe runs (cold: refused)
        async with client.get("/v1/providers") as resp:
            body = await resp.text()
    assert "last_error" in body and "127.0.0.1" in body, body  # the failure is still described
    assert SECRET not in body


@pytest.mark.parametrize("query", [f"token={SECRET}", f"api_key={SECRET}&x=1", f"a=1&sig={SECRET}"])
async def test_transport_errors_name_the_url_without_its_secret_query_values(query):
    transport = AiohttpTransport()
    await transport.start()
    try:
        url = f"http://127.0.0.1:{closed_port()}/health?{query}"
        with pytest.raises(ConnectFailed) as caught:
            await transport.open("GET", url, headers={}, body=None, connect_timeout_s=1.0)
    finally:
        await transport.aclose()
    assert SECRET not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)
