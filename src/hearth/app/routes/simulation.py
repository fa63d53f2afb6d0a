"""Simulation Mode pages: the analyst panel (streamed per analyst over SSE when asked), custom agents,
and rehearsals (their own thread: leaving for the companion and coming back resumes it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from hearth.app import companions as companions_svc
from hearth.app import simulation as svc
from hearth.app.common import clean_text
from hearth.app.model import ModelUnavailable
from hearth.app.deps import DB, CsrfViewer, CurrentViewer, State, Viewer, wants_stream
from hearth.app.routes._util import ID_PATTERN, SSE_HEADERS, IdParam, sse

router = APIRouter()
Text = Annotated[str, Form(max_length=50000)]


@router.get("/companions/{companion_id}/simulate")
async def simulate_page(request: Request, state: State, db: DB, viewer: Viewer, companion_id: IdParam) -> Response:
    companion = await companions_svc.get_companion(db, viewer.cipher, companion_id)
    return state.templates.TemplateResponse(request, "simulate.html", {
        "viewer": viewer, "companion": companion, "analysts": svc.ANALYST_TITLES,
        "situations": await svc.list_situations(db, viewer.cipher, companion_id),
        "agents": await svc.list_agents(db, viewer.cipher),
        "rehearsals": await svc.list_rehearsals(db, viewer.cipher, companion_id),
        "model_configured": state.model_configured})


async def _stream_panel(state: State, viewer: CurrentViewer, companion_id: str, text: str, shared: str):
    """SSE: one ``reading`` event per analyst as it arrives, then ``done`` after the commit."""
    results = []
    async for result in svc.panel(state.model, shared, text, state.settings.analyst_timeout_s):
        results.append(result)
        yield sse("reading", result.as_json())
    try:
        async with state.db.sessions() as db:
            situation_id = await svc.save_situation(db, viewer.cipher, companion_id, text, results)
    except Exception:  # noqa: BLE001 - the page must learn that the panel was not saved
        yield sse("error", {"message": "The panel could not be saved."})
        raise
    yield sse("done", {"situation_id": situation_id, "failed": sum(not r.ok for r in results)})


@router.post("/companions/{companion_id}/situations")
async def run_situation(request: Request, state: State, db: DB, viewer: CsrfViewer, companion_id: IdParam,
                        situation: Text) -> Response:
    text = clean_text(situation, "situation", state.settings.max_text_chars)
    if not state.model_configured:
        raise ModelUnavailable("no model endpoint is configured")
    shared = await svc.panel_context(db, viewer.cipher, companion_id)  # 404 for another user's companion
    if wants_stream(request):
        return StreamingResponse(_stream_panel(state, viewer, companion_id, text, shared),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    results = await svc.run_panel(state.model, shared, text, state.settings.analyst_timeout_s)
    situation_id = await svc.save_situation(db, viewer.cipher, companion_id, text, results)
    return RedirectResponse(f"/companions/{companion_id}/simulate#s-{situation_id}", status_code=303)


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


@router.get("/rehearsals/{rehearsal_id}")
async def rehearsal_page(request: Request, state: State, db: DB, viewer: Viewer, rehearsal_id: IdParam) -> Response:
    view = await svc.get_rehearsal(db, viewer.cipher, rehearsal_id)
    companion = await companions_svc.get_companion(db, viewer.cipher, view.companion_id)
    return state.templates.TemplateResponse(request, "rehearsal.html", {
        "viewer": viewer, "rehearsal": view, "companion": companion, "model_configured": state.model_configured})


@router.post("/rehearsals/{rehearsal_id}/turns")
async def rehearsal_turn(state: State, db: DB, viewer: CsrfViewer, rehearsal_id: IdParam, message: Text) -> Response:
    s = state.settings
    await svc.rehearsal_turn(db, state.model, viewer.cipher, rehearsal_id, message, max_chars=s.max_text_chars,
                             turns=s.chat_context_turns, deadline_s=s.reply_deadline_s,
                             analyst_timeout_s=s.analyst_timeout_s)
    return RedirectResponse(f"/rehearsals/{rehearsal_id}#bottom", status_code=303)


@router.post("/rehearsals/{rehearsal_id}/delete")
async def delete_rehearsal(db: DB, viewer: CsrfViewer, rehearsal_id: IdParam) -> Response:
    view = await svc.get_rehearsal(db, viewer.cipher, rehearsal_id)
    await svc.delete_rehearsal(db, viewer.user_id, rehearsal_id)
    return RedirectResponse(f"/companions/{view.companion_id}/simulate", status_code=303)
