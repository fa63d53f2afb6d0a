"""Review 63: a connect that runs out is labelled timeout_connect, whatever first_token_s is.

The connect runs inside the first-token window (first_token_s counts from the start of the attempt): with
connect_s >= first_token_s a connect that did not finish was cut by the first-token timer and labelled
timeout_first_token in the error and the metrics. Real loopback sockets: a listener whose accept queue is full, so
the kernel drops the SYN and the connect neither completes nor fails.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.config import config_from_dict
from hearth.gateway.errors import AllProvidersFailed, Timeout
from tests.gateway.gateway_helpers import MESSAGES


def _provider(**extra) -> dict:
    return {"name": "p", "base_url": "http://127.0.0.1:9/v1", "model": "m", **extra}


def _unanswered_port(held: list) -> int:
    """A loopback port whose listener never accepts and whose accept queue is full: the kernel drops further SYNs,
    so a connect to it neither succeeds nor fails until its own timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    held.append(listener)
    port = listener.getsockname()[1]
    while True:  # fill the queue: the first connect that does not complete at once marks it full
        s = socket.socket()
        held.append(s)
        s.settimeout(0.2)
        try:
            s.connect(("127.0.0.1", port))
        except TimeoutError:
            return port


@pytest.mark.parametrize("connect_s, first_token_s", [(0.5, 0.3), (0.3, 0.3)])
def test_a_connect_that_never_completes_is_a_connect_timeout(connect_s, first_token_s):
    held: list[socket.socket] = []
    try:
        port = _unanswered_port(held)
        cfg = config_from_dict({"providers": [_provider(base_url=f"http://127.0.0.1:{port}/v1", timeouts={
            "connect_s": connect_s, "first_token_s": first_token_s, "total_s": 2.0})]}, env={})

        async def main():
            async with Chain(cfg) as chain:
                with pytest.raises(AllProvidersFailed) as caught:
                    await chain.complete(MESSAGES, kind="chat")
                return caught.value.exceptions[0], chain.metrics.render().decode()

        error, metrics = asyncio.run(main())
    finally:
        for s in held:
            s.close()
    assert isinstance(error, Timeout) and error.kind == "connect", error
    assert 'error="timeout_connect"' in metrics
    assert 'error="timeout_first_token"' not in metrics
