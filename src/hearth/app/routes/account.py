"""The user's own account: change the password, export everything, delete the account.

Both changes need the current password; its check is throttled per session like a login (hearth.app.throttle,
the login policy), so a session left open somewhere cannot be used to guess the password behind it, one argon2
hash after another. Per session, not per account: guesses sent in one session (a cookie someone else holds) must not
keep the owner, in theirs, from changing the password, the one way to log that session out; and a new session needs
the password itself (a login, throttled on its own)."""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from hearth.app import account as svc
from hearth.app import accounts
from hearth.app.deps import DB, SESSION_COOKIE, CsrfViewer, State, Viewer
from hearth.app.routes.accounts import set_device_cookie

log = logging.getLogger("hearth.app")
router = APIRouter(prefix="/account")
Secret = Annotated[str, Form(max_length=1000)]


def _page(request: Request, state: State, viewer, *, error: str = "", notice: str = "", status: int = 200) -> Response:
    return state.templates.TemplateResponse(request, "account.html", {
        "viewer": viewer, "error": error, "notice": notice}, status_code=status)


def _password_bucket(viewer) -> str:
    return f"password|{viewer.user_id}|session:{viewer.session.id}"


async def _too_many(request: Request, state: State, db, viewer, bucket: str, at: float) -> Response | None:
    """Count one current-password check in ``bucket`` at ``at``; the page with a 429 when it must wait (then nothing
    is checked)."""
    wait = await state.throttle.attempt(db, bucket, state.settings.policy("login"), now=at)
    if wait <= 0:
        return None
    seconds = int(wait) + 1
    response = _page(request, state, viewer, status=429,
                     error=f"Too many password attempts; try again in {seconds} s.")
    response.headers["Retry-After"] = str(seconds)
    return response


async def _give_back(state: State, db, bucket: str, at: float) -> None:
    """The check counted at ``at`` ended on an error (a database error, say), not on a wrong password: give its
    attempt back, as a login does, or transient errors would hold the owner off as guesses do. Best effort: the
    database may still be failing (the caller raises its own error on)."""
    try:
        await state.throttle.uncount(db, bucket, at)
    except Exception:
        log.warning("a password check that failed on an error could not give its throttle attempt back", exc_info=True)


@router.get("")
async def account_page(request: Request, state: State, viewer: Viewer) -> Response:
    notice = "Your password was changed; every other session was logged out." if request.query_params.get(
        "changed") == "1" else ""
    return _page(request, state, viewer, notice=notice)


@router.post("/password")
async def change_password(request: Request, state: State, db: DB, viewer: CsrfViewer, current_password: Secret,
                          new_password: Secret) -> Response:
    bucket, counted_at = _password_bucket(viewer), time.time()  # read now: a rolled-back write expires the rows
    if refused := await _too_many(request, state, db, viewer, bucket, counted_at):
        return refused
    try:
        new = await svc.change_password(db, viewer.user, current=current_password, new=new_password,
                                        ttl_s=state.settings.session_ttl_s)
    except accounts.AccountError as exc:
        if exc.field == "new_password":  # the current password was right (checked first): it clears the count
            await state.throttle.forget(db, bucket)
        return _page(request, state, viewer, error=str(exc), status=400)
    except Exception:
        await _give_back(state, db, bucket, counted_at)
        raise
    await state.throttle.forget(db, bucket)
    response = RedirectResponse("/account?changed=1", status_code=303)
    response.set_cookie(SESSION_COOKIE, new.token, max_age=state.settings.session_ttl_s, httponly=True,
                        samesite="lax", secure=state.settings.cookie_secure, path="/")
    # the device epoch moved on: every device cookie of the account (a stolen one too) stopped counting, except
    # this browser's new one
    set_device_cookie(state, response, new.user_id, new.device_epoch)
    return response


@router.get("/export")
async def export(db: DB, viewer: Viewer) -> Response:
    data = await svc.export(db, viewer.cipher, viewer.user)
    return Response(json.dumps(data, ensure_ascii=False, indent=1), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="hearth-{viewer.user.username}.json"'})


@router.post("/delete")
async def delete_account(request: Request, state: State, db: DB, viewer: CsrfViewer, password: Secret) -> Response:
    bucket, counted_at = _password_bucket(viewer), time.time()  # read now: a rolled-back deletion expires the rows
    if refused := await _too_many(request, state, db, viewer, bucket, counted_at):
        return refused
    try:
        await svc.delete_account(db, viewer.user, password=password, throttle=state.throttle)
    except accounts.AccountError as exc:
        if exc.field != "account":
            return _page(request, state, viewer, error=str(exc), status=400)
        # "no longer exists": another request (a second tab, a double submit) deleted it after this one's login
        # check; the account is gone as asked, so this one ends as that one did (its error page read the viewer's
        # rows, expired by the rolled-back transaction: a 500)
    except Exception:
        await _give_back(state, db, bucket, counted_at)
        raise
    # nothing of the account is left behind
    await state.throttle.forget(db, bucket)
    response = RedirectResponse("/signup", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
