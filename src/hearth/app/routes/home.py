"""Home: the user's companions, the context they choose to share, and model set-up help."""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from hearth import prompts
from hearth.app import companions as svc
from hearth.app.deps import DB, CsrfViewer, State, Viewer

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok", "worker": os.getpid()}  # which worker process answered (hearth serve --workers N)


@router.get("/")
async def home(request: Request, state: State, db: DB, viewer: Viewer) -> Response:
    return state.templates.TemplateResponse(request, "home.html", {
        "viewer": viewer, "companions": await svc.list_companions(db, viewer.cipher),
        "shared_context": await svc.get_shared_context(db, viewer.cipher),
        "personas": prompts.PERSONAS, "world_views": prompts.WORLD_VIEWS,
        "model_configured": state.model_configured})


@router.post("/context")
async def save_context(db: DB, viewer: CsrfViewer,
                       shared_context: Annotated[str, Form(max_length=20000)] = "") -> Response:
    await svc.set_shared_context(db, viewer.cipher, shared_context)
    return RedirectResponse("/", status_code=303)


@router.post("/companions")
async def create_companion(db: DB, viewer: CsrfViewer, persona: Annotated[str, Form(max_length=20000)],
                           name: Annotated[str, Form(max_length=200)] = "",
                           world_view: Annotated[str, Form(max_length=40)] = "grounded",
                           share_context: Annotated[bool, Form()] = False,
                           custom_persona: Annotated[str, Form(max_length=20000)] = "") -> Response:
    persona = custom_persona if custom_persona.strip() else persona
    companion = await svc.create_companion(db, viewer.cipher, persona=persona, name=name, world_view=world_view,
                                           share_context=share_context)
    return RedirectResponse(f"/companions/{companion.id}", status_code=303)
