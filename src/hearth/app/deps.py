"""FastAPI dependencies (``Annotated`` aliases used by every route).

    State     the app's long-lived objects (settings, database, model chain, templates, throttle, trusted proxies)
    DB        one AsyncSession per request (services open their own transactions on it)
    Viewer    the logged-in user: session row, user row and the user's cipher; LoginRequired otherwise, and a 503
              saying so when the user's data key does not open (a damaged users row)
    CsrfViewer  Viewer + the per-session CSRF token checked (form field ``csrf`` or ``X-CSRF-Token``)
    CsrfSession the session and its user with the CSRF token checked, the data key left shut (the logout)
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Annotated, Any, AsyncIterator

from fastapi import Depends, HTTPException, Request
from fastapi.templating import Jinja2Templates
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import accounts
from hearth.app.crypto import DecryptError, UserCipher
from hearth.app.settings import AppSettings
from hearth.app.storage.db import Database
from hearth.app.storage.models import Session, User
from hearth.app.throttle import Throttle

SESSION_COOKIE = "hearth_session"
ANON_CSRF_COOKIE = "hearth_csrf"  # double-submit token for the login and signup forms

log = logging.getLogger("hearth.app")


class LoginRequired(Exception):
    """No valid session: pages redirect to /login, other requests get 401."""


@dataclass
class AppState:
    settings: AppSettings
    db: Database
    model: Any
    model_configured: bool
    templates: Jinja2Templates
    throttle: Throttle  # the login/signup throttle with the app's keys bound (hearth.app.throttle)
    trusted_proxies: list = field(default_factory=list)  # networks whose X-Forwarded-For is believed
    turns: set[asyncio.Task] = field(default_factory=set)  # streamed turns still running (routes._util.to_the_end)


@dataclass
class LoggedIn:
    """A live session and its user, the user's data key not yet opened."""
    user: User
    session: Session

    @property
    def csrf(self) -> str:
        return self.session.csrf_token


@dataclass
class CurrentViewer:
    user: User
    session: Session
    cipher: UserCipher

    @property
    def user_id(self) -> str:
        return self.user.id

    @property
    def csrf(self) -> str:
        return self.session.csrf_token


def get_state(request: Request) -> AppState:
    return request.app.state.hearth


State = Annotated[AppState, Depends(get_state)]


async def get_db(state: State) -> AsyncIterator[AsyncSession]:
    async with state.db.sessions() as session:
        yield session


DB = Annotated[AsyncSession, Depends(get_db)]


async def logged_in(request: Request, db: DB) -> LoggedIn:
    found = await accounts.session_user(db, request.cookies.get(SESSION_COOKIE, ""))
    if found is None:
        raise LoginRequired()
    session, user = found
    return LoggedIn(user=user, session=session)


async def current_viewer(state: State, found: Annotated[LoggedIn, Depends(logged_in)]) -> CurrentViewer:
    user = found.user
    try:
        cipher = UserCipher.from_wrapped(state.settings.master_key.get_secret_value(), user.wrapped_key, user.id)
    except DecryptError:
        # a damaged users row (the login refuses it; this session began before): a page of its own, not a 500
        # with a traceback on every request. The row is left as it is for the operator
        log.warning("request refused: the data key of user %s does not open under the master key (a damaged users "
                    "row)", user.id)
        raise HTTPException(503, accounts.DATA_KEY_DAMAGED) from None
    return CurrentViewer(user=user, session=found.session, cipher=cipher)


Viewer = Annotated[CurrentViewer, Depends(current_viewer)]


async def submitted_csrf(request: Request) -> str | None:
    header = request.headers.get("x-csrf-token")
    if header:
        return header
    if request.headers.get("content-type", "").startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        value = (await request.form()).get("csrf")
        return value if isinstance(value, str) else None
    return None


async def csrf_viewer(request: Request, viewer: Viewer) -> CurrentViewer:
    if not accounts.csrf_matches(viewer.csrf, await submitted_csrf(request)):
        raise HTTPException(403, "CSRF token missing or wrong; reload the page and try again")
    return viewer


CsrfViewer = Annotated[CurrentViewer, Depends(csrf_viewer)]


async def csrf_session(request: Request, found: Annotated[LoggedIn, Depends(logged_in)]) -> LoggedIn:
    """The session with its CSRF token checked, for what needs no user data (logging out): a user whose data key
    does not open can still end the session."""
    if not accounts.csrf_matches(found.csrf, await submitted_csrf(request)):
        raise HTTPException(403, "CSRF token missing or wrong; reload the page and try again")
    return found


CsrfSession = Annotated[LoggedIn, Depends(csrf_session)]


def wants_stream(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")
