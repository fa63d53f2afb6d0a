"""FastAPI dependencies (``Annotated`` aliases used by every route).

    State     the app's long-lived objects (settings, database, model chain, templates, throttle, trusted proxies)
    DB        one AsyncSession per request (services open their own transactions on it)
    Viewer    the logged-in user: session row, user row and the user's cipher; LoginRequired otherwise
    CsrfViewer  Viewer + the per-session CSRF token checked (form field ``csrf`` or ``X-CSRF-Token``)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated, Any, AsyncIterator

from fastapi import Depends, HTTPException, Request
from fastapi.templating import Jinja2Templates
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import accounts
from hearth.app.crypto import UserCipher
from hearth.app.settings import AppSettings
from hearth.app.storage.db import Database
from hearth.app.storage.models import Session, User
from hearth.app.throttle import Throttle

SESSION_COOKIE = "hearth_session"
ANON_CSRF_COOKIE = "hearth_csrf"  # double-submit token for the login and signup forms


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


async def current_viewer(request: Request, state: State, db: DB) -> CurrentViewer:
    token = request.cookies.get(SESSION_COOKIE, "")
    found = await accounts.session_user(db, token)
    if found is None:
        raise LoginRequired()
    session, user = found
    cipher = UserCipher.from_wrapped(state.settings.master_key.get_secret_value(), user.wrapped_key, user.id)
    return CurrentViewer(user=user, session=session, cipher=cipher)


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


def wants_stream(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")
