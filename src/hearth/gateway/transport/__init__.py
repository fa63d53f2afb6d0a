"""The one place where gateway requests leave the process (see client.py)."""

from hearth.gateway.transport.client import (
    AiohttpTransport, BodyTooLarge, ConnectFailed, ConnectTimeout, Transport, TransportError, UpstreamResponse,
)

__all__ = ["Transport", "UpstreamResponse", "AiohttpTransport", "TransportError", "ConnectFailed", "ConnectTimeout",
           "BodyTooLarge"]
