"""Shared bits of the route modules: id path parameters and server-sent events."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import Path

ID_PATTERN = r"^[0-9a-f]{32}$"
IdParam = Annotated[str, Path(pattern=ID_PATTERN)]


def sse(event: str, data: dict) -> bytes:
    """One server-sent event (JSON data on one line)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
