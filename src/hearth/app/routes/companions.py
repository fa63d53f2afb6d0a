"""A companion's page: chat (streamed over SSE when the page asks for it), settings, clearing."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from hearth import prompts
from hearth.app import companions as svc
from hearth.app import simulation
from hearth.app.common import FORM_FIELD_MAX, InputError, UnreadableText, check_submission_id
from hearth.app.deps import DB, CsrfViewer, CurrentViewer, State, Viewer, wants_stream
from hearth.app.model import ModelUnavailable, failure_for_log
from hearth.app.routes._util import (ID_PATTERN, SSE_HEADERS, IdParam, SubmissionParam, form_turn_failure,
                                     reply_events, sse, stream_turn_failure, to_the_end)
from hearth.app.storage.models import new_id
from hearth.gateway.errors import GatewayError

router = APIRouter(prefix="/companions")
log = logging.getLogger("hearth.app.chat")
GONE_WHILE_WRITING = "This companion was deleted while the reply was being written, so it was not saved."


async def _companion_page(request: Request, state: State, db, viewer, companion_id: str, *, error: str = "",
                          draft: str = "", status: int = 200, before: str | None = None) -> Response:
    companion = await svc.get_companion(db, viewer.cipher, companion_id)
    messages, earlier = await svc.history_page(db, viewer.cipher, companion_id, before=before)
    return state.templates.TemplateResponse(request, "companion.html", {
        "viewer": viewer, "companion": companion, "messages": messages, "earlier": earlier, "before": before,
        "memories": await svc.memories(db, viewer.cipher, companion_id),
        "rehearsals": await simulation.list_rehearsals(db, viewer.cipher, companion_id),
        "world_views": prompts.WORLD_VIEWS, "model_configured": state.model_configured,
        # the no-script form's id for the next message (the page's script makes one per message it sends)
        "error": error, "draft": draft, "submission_id": new_id()}, status_code=status)


@router.get("/{companion_id}")
async def companion_page(request: Request, state: State, db: DB, viewer: Viewer, companion_id: IdParam,
                         before: Annotated[str | None, Query(pattern=ID_PATTERN)] = None) -> Response:
    """The chat's last messages; ``?before=<message id>`` pages back through a long one."""
    return await _companion_page(request, state, db, viewer, companion_id, before=before)


def _turn_json(turn: svc.TurnResult, companion: svc.CompanionView | None = None) -> dict:
    """The ``done`` event: the saved turn, and the companion's standing after it for the page's stage pill
    (label, key, and the affection/trust totals its tooltip shows). ``companion``: the companion as read back
    after the turn committed; without it (gone meanwhile) only the turn's own stage is sent."""
    doc = {"user_message_id": turn.user_message.id, "reply_id": turn.reply.id, "message": turn.reply.text,
           "mood": turn.reply.mood, "suggested_actions": turn.reply.suggestions, "memories": turn.new_memories,
           "stage": turn.standing.label, "stage_key": turn.standing.key, "provider": turn.provider,
           "replayed": turn.replayed}
    if companion is not None:  # the totals and the stage from one read, so the pill never mixes two moments
        doc.update(stage=companion.standing.label, stage_key=companion.standing.key,
                   affection=companion.affection, trust=companion.trust)
    return doc


async def _stream_turn(state: State, viewer: CurrentViewer, companion_id: str, text: str, submission_id: str | None,
                       chat_epoch: int | None):
    """SSE: ``delta`` events with the message as it streams, then ``done`` once the turn is committed
    (that is the acknowledgement), or ``error`` (nothing saved). A page that leaves does not stop it
    (routes._util.to_the_end): the turn is saved as it would be after a plain form POST. A resend of a
    ``submission_id`` already saved gets that turn's ``done`` (``replayed``), with no deltas and nothing saved; one
    sent from a page loaded before the chat was cleared (``chat_epoch``) gets an ``error``, with nothing asked."""
    s = state.settings
    try:
        async with state.db.sessions() as db:
            turn = await svc.saved_turn(db, viewer.cipher, companion_id, submission_id, text)
            if turn is None:
                ctx = await svc.load_chat_context(db, viewer.cipher, companion_id, s.chat_context_turns, chat_epoch)
                messages = svc.chat_messages(ctx, text, prompt_memories=s.prompt_memories,
                                             max_prompt_chars=s.max_prompt_chars)
                async for what, value in reply_events(state.model, messages, deadline_s=s.reply_deadline_s):
                    if what == "delta":
                        yield sse("delta", {"text": value})
                    else:
                        result = value
                turn = await svc.save_turn(db, viewer.cipher, ctx, text, result.envelope,
                                           getattr(result, "provider", None), submission_id)
            try:  # the totals as saved (a reload shows the same); the turn is saved whatever happens here
                companion = await svc.get_companion(db, viewer.cipher, companion_id)
            except Exception as exc:  # noqa: BLE001 - e.g. deleted meanwhile: "done" without the totals
                log.info("companion not read back after a turn: %s", failure_for_log(exc))
                companion = None
        yield sse("done", _turn_json(turn, companion))
    except Exception as exc:  # noqa: BLE001 - reported to the page; the turn was not saved
        yield sse("error", {"message": stream_turn_failure(exc, "chat turn", log, GONE_WHILE_WRITING)})


@router.post("/{companion_id}/messages")
async def send_message(request: Request, state: State, db: DB, viewer: CsrfViewer, companion_id: IdParam,
                       message: Annotated[str, Form(max_length=FORM_FIELD_MAX)],
                       submission_id: SubmissionParam = None,
                       chat_epoch: Annotated[int | None, Form(ge=0)] = None) -> Response:
    """One turn. ``submission_id`` (optional): the page's id for this message; a resend of one already saved
    (the connection dropped after the commit) shows the saved turn instead of saving it again. ``chat_epoch``
    (optional): the chat's epoch the page was loaded at; a turn sent from before a clear is refused (409), so a
    resend after the clear (whose rows went with it) does not bring the cleared chat back."""
    s = state.settings
    submission_id = check_submission_id(submission_id)
    if wants_stream(request):
        text = svc.clean_text(message, "message", s.max_text_chars)
        await svc.get_companion(db, viewer.cipher, companion_id)  # 404 before the stream starts
        return StreamingResponse(to_the_end(_stream_turn(state, viewer, companion_id, text, submission_id, chat_epoch),
                                            state.turns),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        await svc.chat_turn(db, state.model, viewer.cipher, companion_id, message, max_chars=s.max_text_chars,
                            turns=s.chat_context_turns, prompt_memories=s.prompt_memories,
                            deadline_s=s.reply_deadline_s, submission_id=submission_id, chat_epoch=chat_epoch,
                            max_prompt_chars=s.max_prompt_chars)
    except (GatewayError, ModelUnavailable, UnreadableText, svc.ChatCleared, InputError) as exc:
        # the chat page again with the message kept in the box (a bare error page lost what the user had typed)
        status, error = await form_turn_failure(db, viewer, exc, "chat turn", log)
        return await _companion_page(request, state, db, viewer, companion_id, status=status, draft=message,
                                     error=error)
    return RedirectResponse(f"/companions/{companion_id}#bottom", status_code=303)


@router.post("/{companion_id}/settings")
async def update_settings(db: DB, viewer: CsrfViewer, companion_id: IdParam,
                          world_view: Annotated[str, Form(max_length=40)],
                          share_context: Annotated[bool, Form()] = False,
                          persona: Annotated[str, Form(max_length=20000)] = "",
                          name: Annotated[str, Form(max_length=200)] = "") -> Response:
    await svc.update_companion(db, viewer.cipher, companion_id, world_view=world_view, share_context=share_context,
                               persona=persona or None, name=name or None)
    return RedirectResponse(f"/companions/{companion_id}", status_code=303)


@router.post("/{companion_id}/clear")
async def clear_chat(db: DB, viewer: CsrfViewer, companion_id: IdParam) -> Response:
    await svc.clear_chat(db, viewer.user_id, companion_id)
    return RedirectResponse(f"/companions/{companion_id}", status_code=303)


@router.post("/{companion_id}/delete")
async def delete_companion(db: DB, viewer: CsrfViewer, companion_id: IdParam) -> Response:
    await svc.delete_companion(db, viewer.user_id, companion_id)
    return RedirectResponse("/", status_code=303)
