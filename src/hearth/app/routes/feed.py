"""The feed: the user's posts and their companions' comments."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from hearth.app import feed as svc
from hearth.app.common import FORM_FIELD_MAX, InputError, check_submission_id
from hearth.app.deps import DB, CsrfViewer, State, Viewer
from hearth.app.routes._util import ID_PATTERN, IdParam, SubmissionParam, refresh_viewer
from hearth.app.storage.models import new_id

router = APIRouter()


async def _feed_page(request: Request, state: State, db, viewer, *, error: str = "", draft: str = "",
                     status: int = 200, before: str | None = None) -> Response:
    posts, older = await svc.posts_page(db, viewer.cipher, before=before)
    return state.templates.TemplateResponse(request, "feed.html", {
        "viewer": viewer, "posts": posts, "older": older, "before": before,
        "model_configured": state.model_configured, "failed": _failed_count(request, state),
        # the form's id for the next post (one per page: the browser sends it again with a resubmitted form)
        "error": error, "draft": draft, "submission_id": new_id()}, status_code=status)


@router.get("/feed")
async def feed_page(request: Request, state: State, db: DB, viewer: Viewer,
                    before: Annotated[str | None, Query(pattern=ID_PATTERN)] = None) -> Response:
    """The newest posts; ``?before=<post id>`` pages back through older ones."""
    return await _feed_page(request, state, db, viewer, before=before)


def _failed_count(request: Request, state: State) -> int:
    """How many comments did not arrive, from ``?failed=N``: a number the page words itself, so a crafted
    link cannot put its own text in the alert box."""
    raw = request.query_params.get("failed", "")
    n = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 3 else 0
    return n if 0 < n <= state.settings.max_commenters else 0


@router.post("/feed/posts")
async def create_post(request: Request, state: State, db: DB, viewer: CsrfViewer,
                      post: Annotated[str, Form(max_length=FORM_FIELD_MAX)],
                      submission_id: SubmissionParam = None) -> Response:
    """A post and its companions' comments. ``submission_id`` as for a chat message (routes.companions.send_message):
    a resend of a post already saved (the answer was lost after the commit, e.g. a proxy timed out while the
    companions commented) redirects to the saved post, the companions not asked again."""
    s = state.settings
    submission_id = check_submission_id(submission_id)
    try:
        result = await svc.create_post(db, state.model, viewer.cipher, post, max_chars=s.max_text_chars,
                                       max_commenters=s.max_commenters, timeout_s=s.comment_timeout_s,
                                       submission_id=submission_id)
    except InputError as exc:
        if exc.field != "submission_id":
            raise
        # the id came with another post before (or a racing one with another text won): this text comes back in
        # the box, under a new id; the viewer's rows are re-read, which a rolled-back transaction expired
        await refresh_viewer(db, viewer)
        return await _feed_page(request, state, db, viewer, draft=post, status=409, error=str(exc))
    suffix = f"?failed={len(result.failed)}" if result.failed else ""
    return RedirectResponse(f"/feed{suffix}#p-{result.post_id}", status_code=303)


@router.post("/posts/{post_id}/delete")
async def delete_post(db: DB, viewer: CsrfViewer, post_id: IdParam) -> Response:
    await svc.delete_post(db, viewer.user_id, post_id)
    return RedirectResponse("/feed", status_code=303)
