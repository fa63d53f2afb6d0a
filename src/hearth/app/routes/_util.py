"""Shared bits of the route modules: id path parameters and server-sent events."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, AsyncIterator

from fastapi import Path

from hearth.app.streamtext import MessageStream

ID_PATTERN = r"^[0-9a-f]{32}$"
IdParam = Annotated[str, Path(pattern=ID_PATTERN)]


def sse(event: str, data: dict) -> bytes:
    """One server-sent event (JSON data on one line)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


async def reply_events(model, messages: list[dict], *, deadline_s: float) -> AsyncIterator[tuple[str, Any]]:
    """The model's chat reply as ("delta", text piece) events while it streams, then ("result", the result).

    A model without ``stream`` answers through ``complete`` (one "result", no deltas). Raises RuntimeError when
    a stream ends without a result."""
    request_id = uuid.uuid4().hex
    if hasattr(model, "stream"):
        preview, result = MessageStream(), None
        async for ev in model.stream(messages, kind="chat", deadline_s=deadline_s, request_id=request_id):
            if hasattr(ev, "result"):
                result = ev.result
            elif piece := preview.feed(ev.text):
                yield "delta", piece
        if result is None:
            raise RuntimeError("stream ended without a result")
        yield "result", result
    else:
        yield "result", await model.complete(messages, kind="chat", deadline_s=deadline_s, request_id=request_id)
