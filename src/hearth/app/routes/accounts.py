"""Signup, login, logout. Cookies: HttpOnly, SameSite=Lax, Secure unless development on loopback.

Login and signup are throttled in the database (hearth.app.throttle), so every worker shares the limits: a login
counts against its (account, client) pair and, unless it carries the account's device cookie, against its client
address's budget of failed logins; both before the password is checked."""

from __future__ import annotations

import logging
import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from hearth.app import accounts, throttle
from hearth.app.deps import ANON_CSRF_COOKIE, DB, SESSION_COOKIE, CsrfSession, State

log = logging.getLogger("hearth.app")
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


def _client(request: Request, state: State) -> str:
    peer = request.client.host if request.client else "?"
    return throttle.client_key(throttle.client_address(peer, request.headers.get("x-forwarded-for"),
                                                       state.trusted_proxies))


def _too_many(request: Request, state: State, template: str, wait: float, username: str = "") -> Response:
    seconds = int(wait) + 1
    response = _form_page(request, state, template, status=429, username=username,
                          error=f"Too many attempts from here; try again in {seconds} s.")
    response.headers["Retry-After"] = str(seconds)
    return response


@router.get("/signup")
async def signup_page(request: Request, state: State) -> Response:
    return _form_page(request, state, "signup.html")


@router.post("/signup")
async def signup(request: Request, state: State, db: DB, username: Annotated[str, Form(max_length=200)],
                 password: Annotated[str, Form(max_length=1000)], csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    _check_anon_csrf(request, csrf)
    # every signup attempt from an address counts (each costs an argon2 hash); success does not reset it
    wait = await state.throttle.attempt(db, "signup|ip:" + _client(request, state), state.settings.policy("signup"))
    if wait > 0:
        return _too_many(request, state, "signup.html", wait, username)
    try:
        new = await accounts.signup(db, username=username, password=password,
                                    master_key=state.settings.master_key.get_secret_value(),
                                    ttl_s=state.settings.session_ttl_s)
    except accounts.AccountError as exc:
        return _form_page(request, state, "signup.html", error=str(exc), status=400, username=username)
    return _with_device(request, state, _logged_in(state, new), new)


@router.get("/login")
async def login_page(request: Request, state: State) -> Response:
    return _form_page(request, state, "login.html")


def set_device_cookie(state: State, response: Response, user_id: str, epoch: int) -> None:
    """Give the browser a new device cookie for the account ``user_id`` at its device epoch ``epoch``."""
    response.set_cookie(throttle.DEVICE_COOKIE, state.throttle.new_device_cookie(user_id, epoch),
                        max_age=365 * 24 * 3600, httponly=True, samesite="lax", secure=state.settings.cookie_secure,
                        path="/login")


def _with_device(request: Request, state: State, response: Response, new: accounts.NewSession) -> Response:
    """Give the browser a device cookie for this account (kept if it already has a valid one): its later logins
    as this account are throttled apart from everyone else's guesses, and are not charged to its address."""
    if state.throttle.known_device(new.user_id, new.device_epoch, request.cookies.get(throttle.DEVICE_COOKIE)) is None:
        set_device_cookie(state, response, new.user_id, new.device_epoch)
    return response


async def _device(request: Request, db: DB, state: State, name: str) -> str | None:
    """The device id when the request carries a device cookie that the account ``name`` gave it since its last
    password change, else None."""
    cookie = request.cookies.get(throttle.DEVICE_COOKIE)
    if not cookie:
        return None
    owner = await accounts.device_owner(db, name)
    return state.throttle.known_device(*owner, cookie) if owner else None


@router.post("/login")
async def login(request: Request, state: State, db: DB, username: Annotated[str, Form(max_length=200)],
                password: Annotated[str, Form(max_length=1000)], csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    _check_anon_csrf(request, csrf)
    name = username.strip().lower()
    device = await _device(request, db, state, name)
    client = _client(request, state)
    # Both limits count BEFORE the slow password check, so a burst of parallel guesses cannot all pass and a
    # refused login costs no argon2 hash. First the address's budget of failed logins across all accounts
    # (password spraying), which a browser holding this account's device cookie does not touch; it is given back
    # below unless the password turns out wrong.
    budget = None if device else state.settings.address_budget()
    address = "login-failures|ip:" + client
    if budget is not None and (wait := await state.throttle.spend(db, address, budget)) > 0:
        return _too_many(request, state, "login.html", wait, username)
    bucket = f"login|{name}|" + (f"device:{device}" if device else "ip:" + client)
    counted_at = time.time()
    # (its account's name goes with it: deleting the account deletes the name's buckets, every client's)
    wait = await state.throttle.attempt(db, bucket, state.settings.policy("login"), now=counted_at, account=name)
    if wait > 0:
        if budget is not None:  # no password was checked: not a failed login
            await state.throttle.refund(db, address, budget)
        return _too_many(request, state, "login.html", wait, username)
    try:
        new = await accounts.login(db, username=username, password=password, ttl_s=state.settings.session_ttl_s,
                                   master_key=state.settings.master_key.get_secret_value())
    except accounts.DataKeyDamaged as exc:
        # the password was right: not a failed login. A session would only meet the same answer on every page
        log.warning("login refused: the data key of user %s does not open under the master key (a damaged users "
                    "row); nothing was changed", exc.user_id)
        if budget is not None:
            await state.throttle.refund(db, address, budget)
        await state.throttle.forget(db, bucket)
        return _form_page(request, state, "login.html", error=accounts.DATA_KEY_DAMAGED, status=503,
                          username=username)
    except Exception:
        # not a wrong password (a database error, say): what the login took is given back, or transient errors
        # would lock the account's owner out as guesses do. Best effort: the database may still be failing
        try:
            if budget is not None:
                await state.throttle.refund(db, address, budget)
            await state.throttle.uncount(db, bucket, counted_at)
        except Exception:
            log.warning("a login that failed on an error could not give its throttle allowance back", exc_info=True)
        raise
    if new is None:
        if secrets.randbelow(50) == 0:  # now and then: drop buckets idle past the window
            kinds = [state.settings.policy("login"), state.settings.policy("signup"), state.settings.address_budget()]
            await throttle.sweep(db, *(kind for kind in kinds if kind is not None))
        return _form_page(request, state, "login.html", error="Wrong username or password.", status=401,
                          username=username)
    if budget is not None:
        await state.throttle.refund(db, address, budget)
    await state.throttle.forget(db, bucket)
    return _with_device(request, state, _logged_in(state, new), new)


@router.post("/logout")
async def logout(request: Request, db: DB, viewer: CsrfSession) -> Response:
    await accounts.logout(db, request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
