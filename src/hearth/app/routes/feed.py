"""The feed: the user's posts and their companions' comments."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from hearth.app import feed as svc
from hearth.app.common import FORM_FIELD_MAX
from hearth.app.deps import DB, CsrfViewer, State, Viewer
from hearth.app.routes._util import ID_PATTERN, IdParam

router = APIRouter()


@router.get("/feed")
async def feed_page(request: Request, state: State, db: DB, viewer: Viewer,
                    before: Annotated[str | None, Query(pattern=ID_PATTERN)] = None) -> Response:
    """The newest posts; ``?before=<post id>`` pages back through older ones."""
    posts, older = await svc.posts_page(db, viewer.cipher, before=before)
    return state.templates.TemplateResponse(request, "feed.html", {
        "viewer": viewer, "posts": posts, "older": older, "before": before,
        "model_configured": state.model_configured, "failed": _failed_count(request, state)})


def _failed_count(request: Request, state: State) -> int:
    """How many comments did not arrive, from ``?failed=N``: a number the page words itself, so a crafted
    link cannot put its own text in the alert box."""
    raw = request.query_params.get("failed", "")
    n = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 3 else 0
    return n if 0 < n <= state.settings.max_commenters else 0


@router.post("/feed/posts")
async def create_post(state: State, db: DB, viewer: CsrfViewer, post: Annotated[str, Form(max_length=FORM_FIELD_MAX)]) -> Response:
    s = state.settings
    result = await svc.create_post(db, state.model, viewer.cipher, post, max_chars=s.max_text_chars,
                                   max_commenters=s.max_commenters, timeout_s=s.comment_timeout_s)
    suffix = f"?failed={len(result.failed)}" if result.failed else ""
    return RedirectResponse(f"/feed{suffix}#p-{result.post_id}", status_code=303)


@router.post("/posts/{post_id}/delete")
async def delete_post(db: DB, viewer: CsrfViewer, post_id: IdParam) -> Response:
    await svc.delete_post(db, viewer.user_id, post_id)
    return RedirectResponse("/feed", status_code=303)
