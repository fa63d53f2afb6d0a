"""Signup, login, logout. Cookies: HttpOnly, SameSite=Lax, Secure unless development on loopback."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from hearth.app import accounts
from hearth.app.deps import ANON_CSRF_COOKIE, DB, SESSION_COOKIE, CsrfViewer, State

router = APIRouter()


def _form_page(request: Request, state: State, template: str, error: str = "", status: int = 200,
               username: str = "") -> Response:
    token = request.cookies.get(ANON_CSRF_COOKIE) or secrets.token_urlsafe(32)
    response = state.templates.TemplateResponse(
        request, template, {"csrf": token, "error": error, "username": username, "viewer": None}, status_code=status)
    response.set_cookie(ANON_CSRF_COOKIE, token, httponly=True, samesite="lax", secure=state.settings.cookie_secure)
    return response


def _check_anon_csrf(request: Request, given: str) -> None:
    if not accounts.csrf_matches(request.cookies.get(ANON_CSRF_COOKIE, ""), given):
        raise HTTPException(403, "CSRF token missing or wrong; reload the page and try again")


def _logged_in(state: State, new: accounts.NewSession) -> Response:
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(SESSION_COOKIE, new.token, max_age=state.settings.session_ttl_s, httponly=True,
                        samesite="lax", secure=state.settings.cookie_secure, path="/")
    response.delete_cookie(ANON_CSRF_COOKIE)
    return response


def _client(request: Request) -> str:
    return "ip:" + (request.client.host if request.client else "?")


@router.get("/signup")
async def signup_page(request: Request, state: State) -> Response:
    return _form_page(request, state, "signup.html")


@router.post("/signup")
async def signup(request: Request, state: State, db: DB, username: Annotated[str, Form(max_length=200)],
                 password: Annotated[str, Form(max_length=1000)], csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    _check_anon_csrf(request, csrf)
    try:
        new = await accounts.signup(db, username=username, password=password,
                                    master_key=state.settings.master_key.get_secret_value(),
                                    ttl_s=state.settings.session_ttl_s)
    except accounts.AccountError as exc:
        return _form_page(request, state, "signup.html", error=str(exc), status=400, username=username)
    return _logged_in(state, new)


@router.get("/login")
async def login_page(request: Request, state: State) -> Response:
    return _form_page(request, state, "login.html")


@router.post("/login")
async def login(request: Request, state: State, db: DB, username: Annotated[str, Form(max_length=200)],
                password: Annotated[str, Form(max_length=1000)], csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    _check_anon_csrf(request, csrf)
    keys = ("user:" + username.strip().lower(), _client(request))
    wait = state.limiter.retry_after(*keys)
    if wait > 0:
        response = _form_page(request, state, "login.html", status=429, username=username,
                              error=f"Too many failed attempts; try again in {int(wait) + 1} s.")
        response.headers["Retry-After"] = str(int(wait) + 1)
        return response
    # counted before the slow password check, so a burst of parallel guesses cannot all pass the check above
    state.limiter.failed(*keys)
    new = await accounts.login(db, username=username, password=password, ttl_s=state.settings.session_ttl_s)
    if new is None:
        return _form_page(request, state, "login.html", error="Wrong username or password.", status=401,
                          username=username)
    state.limiter.succeeded(keys[0])
    state.limiter.withdraw(keys[1])
    return _logged_in(state, new)


@router.post("/logout")
async def logout(request: Request, db: DB, viewer: CsrfViewer) -> Response:
    await accounts.logout(db, request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
