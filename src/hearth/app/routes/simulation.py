"""Simulation Mode pages: the analyst panel (streamed per analyst over SSE when asked), custom agents,
and rehearsals (their own thread: leaving for the companion and coming back resumes it)."""

from __future__ import annotations

import logging
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from hearth.app import companions as companions_svc
from hearth.app import simulation as svc
from hearth.app.common import (FORM_FIELD_MAX, InputError, NotFound, UnreadableText, check_submission_id,
                               clean_text)
from hearth.app.model import ModelUnavailable
from hearth.gateway.errors import GatewayError
from hearth.app.deps import DB, CsrfViewer, CurrentViewer, State, Viewer, wants_stream
from hearth.app.routes._util import (ID_PATTERN, SSE_HEADERS, IdParam, SubmissionParam, form_turn_failure,
                                     refresh_viewer, reply_events, sse, stream_turn_failure, to_the_end)
from hearth.app.storage.models import new_id

router = APIRouter()
log = logging.getLogger("hearth.app.simulation")
REHEARSAL_GONE = "This rehearsal was deleted while the reply was being written, so it was not saved."
# a turn's exchange saved, the panel's readings of it not (simulation.readings_or_kept_exchange): the streamed page
# shows the error after the reply it streamed, the form's page the saved exchange above the error
_READINGS_LOST = "The panel's readings of this exchange could not be saved. The exchange itself is saved"
READINGS_NOT_SAVED = _READINGS_LOST + ": reload the page to see it."
READINGS_NOT_SAVED_FORM = _READINGS_LOST + ", above."
Text = Annotated[str, Form(max_length=FORM_FIELD_MAX)]


async def _simulate_page(request: Request, state: State, db, viewer, companion_id: str, *, error: str = "",
                         draft: str = "", status: int = 200, before: str | None = None) -> Response:
    companion = await companions_svc.get_companion(db, viewer.cipher, companion_id)
    situations, older = await svc.situations_page(db, viewer.cipher, companion_id, before=before)
    return state.templates.TemplateResponse(request, "simulate.html", {
        "viewer": viewer, "companion": companion, "analysts": svc.ANALYST_TITLES,
        "situations": situations, "older": older, "before": before,
        "agents": await svc.list_agents(db, viewer.cipher),
        "rehearsals": await svc.list_rehearsals(db, viewer.cipher, companion_id),
        "model_configured": state.model_configured, "error": error, "draft": draft,
        # the no-script forms' ids: the box's next situation, and each "Ask the panel again" (a new situation)
        "submission_id": new_id(), "retry_ids": {s.id: new_id() for s in situations}}, status_code=status)


@router.get("/companions/{companion_id}/simulate")
async def simulate_page(request: Request, state: State, db: DB, viewer: Viewer, companion_id: IdParam,
                        before: Annotated[str | None, Query(pattern=ID_PATTERN)] = None) -> Response:
    """The newest situations; ``?before=<situation id>`` pages back through older ones."""
    return await _simulate_page(request, state, db, viewer, companion_id, before=before)


def _all_failed(results: list) -> str:
    reasons = " ".join(dict.fromkeys(r.error for r in results if r.error))
    return (f"None of the five analysts could answer. {reasons} Nothing was saved; your text is still there, "
            "so you can try again.").replace("  ", " ")


def _panel_done(situation: svc.SituationView) -> bytes:
    """The ``done`` event. For a situation an earlier submission with the same id saved, it is marked ``replayed``
    and carries that situation's readings, which the page shows instead of any it streamed for this submission
    (a first save's event keeps the shape it had before submission ids)."""
    doc = {"situation_id": situation.id, "failed": sum(not r.ok for r in situation.results)}
    if situation.replayed:
        doc.update(replayed=True, readings=[r.as_json() for r in situation.results])
    return sse("done", doc)


def _one_event(event: bytes) -> StreamingResponse:
    return StreamingResponse(iter([event]), media_type="text/event-stream", headers=SSE_HEADERS)


async def _stream_panel(state: State, viewer: CurrentViewer, companion_id: str, text: str, shared: str,
                        submission_id: str | None):
    """SSE: one ``reading`` event per analyst as it arrives, then ``done`` after the commit. A panel where
    every analyst failed is not saved (``error``): there is nothing to keep but the text, which the page keeps.
    A resend of ``submission_id`` that raced the first gets the first's situation in ``done`` (``replayed``)."""
    results = []
    async for result in svc.panel(state.model, shared, text, state.settings.analyst_timeout_s):
        results.append(result)
        yield sse("reading", result.as_json())
    if not any(r.ok for r in results):
        yield sse("error", {"message": _all_failed(results)})
        return
    try:
        async with state.db.sessions() as db:
            situation = await svc.store_situation(db, viewer.cipher, companion_id, text, results, submission_id)
    except InputError as exc:  # the racing submission with this id came with another text: this one is not saved
        yield sse("error", {"message": str(exc)})
        return
    except NotFound:  # the page checked the companion before the stream began: it was deleted meanwhile
        yield sse("error", {"message": "This companion was deleted while the panel was reading, so it was not "
                                       "saved."})
        return
    except Exception:  # noqa: BLE001 - the page must learn that the panel was not saved
        yield sse("error", {"message": "The panel could not be saved."})
        raise
    yield _panel_done(situation)


@router.post("/companions/{companion_id}/situations")
async def run_situation(request: Request, state: State, db: DB, viewer: CsrfViewer, companion_id: IdParam,
                        situation: Text, submission_id: SubmissionParam = None) -> Response:
    """Ask the panel. ``submission_id`` as for a chat message (routes.companions.send_message): a resend of one
    already saved (the connection dropped after the commit) shows the saved situation, the analysts not asked."""
    text = clean_text(situation, "situation", state.settings.max_text_chars)
    submission_id = check_submission_id(submission_id)
    try:
        saved = await svc.saved_situation(db, viewer.cipher, companion_id, submission_id, text)
    except InputError as exc:  # the id came with another situation before, or its situation was deleted since
        if wants_stream(request):  # (simulation.DELETED_BEFORE): this one is kept in the box, nothing asked
            return _one_event(sse("error", {"message": str(exc)}))
        await refresh_viewer(db, viewer)  # a deleted one's look-up rolled back (routes._util.refresh_viewer)
        return await _simulate_page(request, state, db, viewer, companion_id, draft=text, status=409, error=str(exc))
    if saved is not None:
        if wants_stream(request):
            return _one_event(_panel_done(saved))
        return RedirectResponse(f"/companions/{companion_id}/simulate#s-{saved.id}", status_code=303)
    if not state.model_configured:
        if wants_stream(request):  # the page's script keeps the text and shows the error
            raise ModelUnavailable("no model endpoint is configured")
        # the page with the text kept in the box (the bare 503 page lost it)
        return await _simulate_page(request, state, db, viewer, companion_id, draft=text, status=503,
                                    error="No model is configured: see the top of the page. Nothing was saved.")
    shared = await svc.panel_context(db, viewer.cipher, companion_id,  # 404 for another user's companion
                                     prompt_memories=state.settings.prompt_memories)
    if wants_stream(request):
        return StreamingResponse(to_the_end(_stream_panel(state, viewer, companion_id, text, shared, submission_id),
                                            state.turns),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    results = await svc.run_panel(state.model, shared, text, state.settings.analyst_timeout_s)
    if not any(r.ok for r in results):
        return await _simulate_page(request, state, db, viewer, companion_id, error=_all_failed(results),
                                    draft=text, status=502)
    try:
        stored = await svc.store_situation(db, viewer.cipher, companion_id, text, results, submission_id)
    except InputError as exc:
        if exc.field != "submission_id":
            raise
        # a racing submission with this id and another text won: this text comes back in the box
        await refresh_viewer(db, viewer)
        return await _simulate_page(request, state, db, viewer, companion_id, draft=text, status=409, error=str(exc))
    return RedirectResponse(f"/companions/{companion_id}/simulate#s-{stored.id}", status_code=303)


@router.post("/situations/{situation_id}/delete")
async def delete_situation(db: DB, viewer: CsrfViewer, situation_id: IdParam,
                           companion_id: Annotated[str, Form(pattern=ID_PATTERN)]) -> Response:
    await svc.delete_situation(db, viewer.user_id, situation_id)
    return RedirectResponse(f"/companions/{companion_id}/simulate", status_code=303)


@router.post("/agents")
async def create_agent(db: DB, viewer: CsrfViewer, name: Text, personality: Text, backstory: Text,
                       relationship: Text, companion_id: Annotated[str, Form(pattern=ID_PATTERN)]) -> Response:
    await companions_svc.get_companion(db, viewer.cipher, companion_id)  # only redirect to one's own page
    await svc.create_agent(db, viewer.cipher, name=name, personality=personality, backstory=backstory,
                           relationship=relationship)
    return RedirectResponse(f"/companions/{companion_id}/simulate#agents", status_code=303)


@router.post("/agents/{agent_id}/delete")
async def delete_agent(db: DB, viewer: CsrfViewer, agent_id: IdParam,
                       companion_id: Annotated[str, Form(pattern=ID_PATTERN)]) -> Response:
    await svc.delete_agent(db, viewer.user_id, agent_id)
    return RedirectResponse(f"/companions/{companion_id}/simulate#agents", status_code=303)


@router.post("/companions/{companion_id}/rehearsals")
async def start_rehearsal(db: DB, viewer: CsrfViewer, companion_id: IdParam,
                          agent_id: Annotated[str, Form(pattern=ID_PATTERN)]) -> Response:
    rehearsal_id = await svc.start_rehearsal(db, viewer.cipher, companion_id, agent_id)
    return RedirectResponse(f"/rehearsals/{rehearsal_id}", status_code=303)


async def _rehearsal_page(request: Request, state: State, db, viewer, rehearsal_id: str, *, error: str = "",
                          draft: str = "", status: int = 200, readings_lost: str | None = None) -> Response:
    view = await svc.get_rehearsal(db, viewer.cipher, rehearsal_id)
    companion = await companions_svc.get_companion(db, viewer.cipher, view.companion_id)
    # an agent turn saved before the panel's readings: "pending" while the panel may still read it, else "lost"
    panel_notes = {t.id: svc.panel_note(t, state.settings.analyst_timeout_s) for t in view.turns}
    if readings_lost in panel_notes and panel_notes[readings_lost]:  # the turn whose readings just failed to save
        panel_notes[readings_lost] = "lost"
    return state.templates.TemplateResponse(request, "rehearsal.html", {
        "viewer": viewer, "rehearsal": view, "companion": companion, "model_configured": state.model_configured,
        "panel_notes": panel_notes,
        "error": error, "draft": draft, "submission_id": new_id()}, status_code=status)  # the no-script form's


@router.get("/rehearsals/{rehearsal_id}")
async def rehearsal_page(request: Request, state: State, db: DB, viewer: Viewer, rehearsal_id: IdParam) -> Response:
    return await _rehearsal_page(request, state, db, viewer, rehearsal_id)


def _rehearsal_done(turn: svc.TurnView) -> bytes:
    """The ``done`` event. For a turn an earlier submission with the same id saved (``replayed``), it carries that
    turn's reply and readings, which the page shows instead of any it streamed for this submission."""
    doc = {"turn_id": turn.id, "ok": sum(r.ok for r in turn.results), "total": len(turn.results),
           "message": turn.text, "mood": turn.mood, "suggested_actions": turn.suggestions, "replayed": turn.replayed}
    if turn.replayed:
        doc["readings"] = [r.as_json() for r in turn.results]
    return sse("done", doc)


async def _stream_rehearsal(state: State, viewer: CurrentViewer, rehearsal_id: str, text: str,
                            submission_id: str | None):
    """SSE: ``delta`` (the agent's reply as it streams), ``reply`` (its final text, once both turns are committed:
    simulation.save_rehearsal_exchange), one ``reading`` per analyst, then ``done`` once the readings are committed
    (simulation.save_turn_readings; or found not to be, the rehearsal deleted meanwhile). ``error`` before ``reply``:
    nothing saved; after it: the exchange stays saved, only the readings were not. Leaving for the companion while
    the panel reads does not stop it (routes._util.to_the_end), and the exchange is on the rehearsal page meanwhile.
    A resend of a ``submission_id`` already saved gets that turn in one ``done`` (``replayed``, with the readings
    saved so far), nothing saved again; one that raced the first to the save gets it after its ``reply``."""
    s, model = state.settings, state.model
    try:
        async with state.db.sessions() as db:
            saved = await svc.saved_rehearsal_turn(db, viewer.cipher, rehearsal_id, submission_id, text)
        if saved is not None:
            yield _rehearsal_done(saved)
            return
        async with state.db.sessions() as db:
            view, shared, messages = await svc.rehearsal_context(db, viewer.cipher, rehearsal_id, text,
                                                                 turns=s.chat_context_turns,
                                                                 prompt_memories=s.prompt_memories,
                                                                 max_prompt_chars=s.max_prompt_chars)
        async for what, value in reply_events(model, messages, deadline_s=s.reply_deadline_s):
            if what == "delta":
                yield sse("delta", {"text": value})
            else:
                result = value
        reply = result.envelope.message
        async with state.db.sessions() as db:
            turn = await svc.save_rehearsal_exchange(db, viewer.cipher, rehearsal_id, text, reply, submission_id,
                                                     mood=result.envelope.mood,
                                                     suggested_actions=result.envelope.suggested_actions)
    except Exception as exc:  # noqa: BLE001 - reported to the page; the turn was not saved
        yield sse("error", {"message": stream_turn_failure(exc, "rehearsal turn", log, REHEARSAL_GONE)})
        return
    # the reply as saved, with the person's mood and the coaching hints for the user's next line (a resend that
    # raced the first gets the first's, in the ``done`` that follows)
    yield sse("reply", {"message": reply, "mood": turn.mood, "suggested_actions": turn.suggestions})
    if turn.replayed:  # a resend that raced the first to the save: the first's panel reads it
        yield _rehearsal_done(turn)
        return
    with svc.readings_or_kept_exchange(turn):  # a failure sets turn.readings_lost: the exchange stays saved
        results = []
        situation = partial(svc.exchange_for_panel, view, text, reply, max_prompt_chars=s.max_prompt_chars)
        async for reading in svc.panel(model, shared, situation, s.analyst_timeout_s):
            results.append(reading)
            yield sse("reading", reading.as_json())
        async with state.db.sessions() as db:
            await svc.save_turn_readings(db, viewer.cipher, turn, results)
    if turn.readings_lost:
        yield sse("error", {"message": READINGS_NOT_SAVED})
        return
    yield _rehearsal_done(turn)


@router.post("/rehearsals/{rehearsal_id}/turns")
async def rehearsal_turn(request: Request, state: State, db: DB, viewer: CsrfViewer, rehearsal_id: IdParam,
                         message: Text, submission_id: SubmissionParam = None) -> Response:
    """One rehearsal turn; ``submission_id`` as for a chat message (routes.companions.send_message)."""
    s = state.settings
    submission_id = check_submission_id(submission_id)
    if wants_stream(request):
        text = clean_text(message, "message", s.max_text_chars)
        await svc.get_rehearsal(db, viewer.cipher, rehearsal_id)  # 404 before the stream starts
        return StreamingResponse(to_the_end(_stream_rehearsal(state, viewer, rehearsal_id, text, submission_id),
                                            state.turns),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        turn = await svc.rehearsal_turn(db, state.model, viewer.cipher, rehearsal_id, message,
                                        max_chars=s.max_text_chars, turns=s.chat_context_turns,
                                        deadline_s=s.reply_deadline_s, analyst_timeout_s=s.analyst_timeout_s,
                                        prompt_memories=s.prompt_memories, submission_id=submission_id,
                                        max_prompt_chars=s.max_prompt_chars)
    except (GatewayError, ModelUnavailable, UnreadableText, InputError) as exc:
        # the rehearsal page again with the text kept in the box (routes._util.form_turn_failure)
        status, error = await form_turn_failure(db, viewer, exc, "rehearsal turn", log)
        return await _rehearsal_page(request, state, db, viewer, rehearsal_id, status=status, draft=message,
                                     error=error)
    if turn.readings_lost:  # the exchange is saved, its readings not: the page shows it and says so, the box empty
        await refresh_viewer(db, viewer)  # the readings' transaction rolled back (routes._util.refresh_viewer)
        return await _rehearsal_page(request, state, db, viewer, rehearsal_id, error=READINGS_NOT_SAVED_FORM,
                                     readings_lost=turn.id)
    return RedirectResponse(f"/rehearsals/{rehearsal_id}#bottom", status_code=303)


@router.post("/rehearsals/{rehearsal_id}/delete")
async def delete_rehearsal(db: DB, viewer: CsrfViewer, rehearsal_id: IdParam) -> Response:
    view = await svc.get_rehearsal(db, viewer.cipher, rehearsal_id)
    await svc.delete_rehearsal(db, viewer.user_id, rehearsal_id)
    return RedirectResponse(f"/companions/{view.companion_id}/simulate", status_code=303)
