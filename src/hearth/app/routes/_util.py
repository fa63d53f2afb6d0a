"""Shared bits of the route modules: id path parameters and server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Annotated, Any, AsyncIterator

from fastapi import Form, Path

from hearth.app.common import InputError, NotFound, UnreadableText
from hearth.app.companions import ChatCleared
from hearth.app.model import ModelUnavailable, check_as_streamed, describe_failure, failure_for_log
from hearth.app.streamtext import MessageStream
from hearth.gateway.errors import GatewayError

log = logging.getLogger("hearth.app")

ID_PATTERN = r"^[0-9a-f]{32}$"
IdParam = Annotated[str, Path(pattern=ID_PATTERN)]
# a turn's submission id (optional: clients from before it send none); common.check_submission_id checks it
SubmissionParam = Annotated[str | None, Form(max_length=200)]


async def refresh_viewer(db, viewer) -> None:
    """Re-read the viewer's rows after a turn's transaction rolled back (a chat cleared meanwhile, a racing submission
    with the same id refused by the index): the rollback expired them, and the page about to be shown reads them
    lazily, which the async session cannot (MissingGreenlet: a 500, the text in the box lost)."""
    async with db.begin():
        await db.refresh(viewer.session)
        await db.refresh(viewer.user)


# A turn that failed (a chat message, a rehearsal line) is shown on its own page with the user's text kept in the
# box, never as a bare error page: the two helpers below say what the page shows, for a form POST and for a stream.
# Nothing of the turn is saved in any of these cases.
_NO_MODEL = "No model is configured: see the {where}. Nothing was saved."


def _reply_failed(exc: Exception, what: str, logger: logging.Logger) -> str:
    logger.warning("%s failed: %s", what, failure_for_log(exc))
    return f"The reply failed: {describe_failure(exc)} Nothing was saved."


def _rolled_back(exc: Exception) -> bool:
    """The turn's transaction rolled back: the chat was cleared meanwhile, or its submission id came with another
    message before (a racing submission won). Either message is safe to show as it is."""
    return isinstance(exc, ChatCleared) or (isinstance(exc, InputError) and exc.field == "submission_id")


async def form_turn_failure(db, viewer, exc: Exception, what: str, logger: logging.Logger) -> tuple[int, str]:
    """(status, message) for the page a form-posted turn that raised ``exc`` shows again, the text kept in the box: a
    provider error 502, no model 503, a text that does not open (a damaged persona or rehearsed person) 503, a
    rolled-back turn 409 (the viewer's rows re-read first: refresh_viewer). Anything else (an InputError about
    another field, which the app's handler shows) is raised again. ``what`` names the turn in the log."""
    if isinstance(exc, GatewayError):
        return 502, _reply_failed(exc, what, logger)
    if isinstance(exc, ModelUnavailable):
        return 503, _NO_MODEL.format(where="top of the page")
    if isinstance(exc, UnreadableText):
        return 503, str(exc)
    if _rolled_back(exc):
        await refresh_viewer(db, viewer)
        return 409, str(exc)
    raise exc


def stream_turn_failure(exc: Exception, what: str, logger: logging.Logger, gone: str) -> str:
    """The ``error`` event's message for a streamed turn that raised ``exc`` (any exception: the stream has begun,
    so it is reported to the page, not raised): ``gone`` where the companion or rehearsal was deleted meanwhile."""
    if isinstance(exc, ModelUnavailable):
        return _NO_MODEL.format(where="home page")
    if isinstance(exc, (ChatCleared, InputError, UnreadableText)):
        return str(exc)
    if isinstance(exc, NotFound):  # the page checked it before the stream began
        return gone
    return _reply_failed(exc, what, logger)


def sse(event: str, data: dict) -> bytes:
    """One server-sent event (JSON data on one line)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


async def to_the_end(events: AsyncIterator[bytes], running: set[asyncio.Task]) -> AsyncIterator[bytes]:
    """Relay a turn's SSE ``events`` while the page listens, running them in a task of their own: a page that
    goes away (a closed tab, a tap on "Talk to <companion>" while the panel reads a rehearsal) no longer
    cancels the turn with the response. It runs to its commit as a plain form POST does, and is there when the
    user comes back. ``running`` holds the task until it ends (the app's shutdown waits for it)."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in events:
                queue.put_nowait(event)
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(pump())
    running.add(task)
    task.add_done_callback(running.discard)
    relayed = False
    try:
        while (event := await queue.get()) is not None:
            yield event
        relayed = True
    finally:
        if not relayed:  # the page left: nobody awaits the task, so its failure is logged here
            task.add_done_callback(_log_failure)
    await task  # a failure after its "error" event is the response's, as before


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a turn whose page had left failed: %s", failure_for_log(task.exception()))


async def reply_events(model, messages: list[dict], *, deadline_s: float) -> AsyncIterator[tuple[str, Any]]:
    """The model's chat reply as ("delta", text piece) events while it streams, then ("result", the result).

    A model without ``stream`` answers through ``complete`` (one "result", no deltas). Raises RuntimeError when
    a stream ends without a result. The result is held to the streamed envelope rule (model.check_as_streamed), as
    the form's path holds it: the chain applies it itself, a backend other than the chain may not."""
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
    else:
        result = await model.complete(messages, kind="chat", deadline_s=deadline_s, request_id=request_id)
    check_as_streamed(result)
    yield "result", result
