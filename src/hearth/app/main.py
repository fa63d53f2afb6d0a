"""The FastAPI app and ``hearth serve``.

    app = create_app(settings)                   # model: the gateway chain from settings.config_path
    app = create_app(settings, model=backend)    # tests: anything with the chain's complete()/stream()
    exit_code = serve(config, database_url, host, port, workers)

Start-up (lifespan): open the database and run hearth.app.startup.prepare (migrations, key rotation, the
master-key check that refuses to start when users' keys do not open), start the chain. Shutdown closes the
chain and the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy.engine import make_url

from hearth.app.common import InputError, NotFound
from hearth.app.companions import ChatCleared
from hearth.app.deps import AppState, LoginRequired
from hearth.app.limits import BodyLimit, SecurityHeaders
from hearth.app.model import (SETUP_SNIPPET, ModelUnavailable, NoModel, build_backend, describe_failure,
                              failure_for_log, has_providers, quiet_upstream_text)
from hearth.app.settings import AppSettings, SettingsError, load_settings
from hearth.app.startup import StartupError, prepare
from hearth.app.storage import create_database
from hearth.app.throttle import device_secret, parse_networks, throttle_secret

log = logging.getLogger("hearth.app")
HERE = Path(__file__).parent


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["setup_snippet"] = SETUP_SNIPPET
    return templates


def _error_page(request: Request, status: int, title: str, detail: str) -> Any:
    if "text/html" not in request.headers.get("accept", "") or request.headers.get("x-requested-with"):
        return JSONResponse({"error": title, "detail": detail}, status_code=status)
    state: AppState = request.app.state.hearth
    return state.templates.TemplateResponse(request, "error.html", {"title": title, "detail": detail,
                                                                    "status": status}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired):
        if request.method == "GET":
            return RedirectResponse("/login", status_code=303)
        return JSONResponse({"error": "login required"}, status_code=401)

    @app.exception_handler(NotFound)
    async def _missing(request: Request, exc: NotFound):
        return _error_page(request, 404, "Not found", f"No such {exc.args[0] if exc.args else 'page'}.")

    @app.exception_handler(ChatCleared)
    async def _cleared(request: Request, exc: ChatCleared):
        return _error_page(request, 409, "The chat was cleared", str(exc))

    @app.exception_handler(InputError)
    async def _input(request: Request, exc: InputError):
        return _error_page(request, 400, "Please check your input", str(exc))

    @app.exception_handler(ModelUnavailable)
    async def _no_model(request: Request, exc: ModelUnavailable):
        return _error_page(request, 503, "No model is configured",
                           "Point the app at an OpenAI-compatible endpoint (see the snippet on the home page). "
                           "Nothing was saved.")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        parts = [f"{err['loc'][-1]}: {err['msg']}" for err in exc.errors()]
        return _error_page(request, 422, "Please check your input", "; ".join(parts))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return _error_page(request, exc.status_code, "Request refused", str(exc.detail))

    try:
        from hearth.gateway.errors import GatewayError
    except ImportError:  # pragma: no cover - the gateway ships with the app
        return

    @app.exception_handler(GatewayError)
    async def _gateway(request: Request, exc: GatewayError):
        log.warning("model call failed: %s", failure_for_log(exc))
        return _error_page(request, 502, "The model did not answer",
                           f"{describe_failure(exc)} Nothing was saved; try again.")


GRACEFUL_SHUTDOWN_S = 30  # in-flight turns get this long to commit at shutdown; a hung one cannot block exit


async def _finish_turns(turns: set[asyncio.Task]) -> None:
    """Shutdown: let the streamed turns whose page left commit (the same grace as the requests still open),
    then cancel what is left (its transaction rolls back: nothing half-written)."""
    if not turns:
        return
    _, late = await asyncio.wait(set(turns), timeout=GRACEFUL_SHUTDOWN_S)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)


def create_app(settings: AppSettings, *, model: Any = None) -> FastAPI:
    """The ASGI app. ``model`` defaults to the chain built from ``settings.config_path``."""
    backend = model if model is not None else build_backend(settings.config_path)
    quiet_upstream_text()  # the chain's own failure logs: class names and labels, not upstream text
    templates = _templates()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        db = create_database(settings.database_url)
        turns: set[asyncio.Task] = set()  # streamed turns whose page may have left (routes._util.to_the_end)
        try:
            await prepare(settings, db)  # StartupError: the app does not start
            if hasattr(backend, "start"):
                await backend.start()
            app.state.hearth = AppState(
                settings=settings, db=db, model=backend, model_configured=not isinstance(backend, NoModel),
                templates=templates, trusted_proxies=parse_networks(settings.forwarded_allow_ips),
                device_secret=device_secret(settings.master_key.get_secret_value()),
                throttle_secret=throttle_secret(settings.master_key.get_secret_value()), turns=turns)
            yield
        finally:
            await _finish_turns(turns)
            if hasattr(backend, "aclose"):
                await backend.aclose()
            await db.dispose()

    app = FastAPI(title="hearth", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    from hearth.app.routes import ROUTERS

    for router in ROUTERS:
        app.include_router(router)
    _install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(SecurityHeaders)
    return app


SERVE_ARGS_ENV = "HEARTH_SERVE_ARGS"  # how `hearth serve --workers N` hands its arguments to each worker


def _exit_with_parent(supervisor: int) -> None:
    """A worker whose supervisor died (kill -9, OOM) stops too instead of holding the port forever."""

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown: in-flight turns may commit

    threading.Thread(target=watch, name="hearth-parent-watch", daemon=True).start()


def worker_app() -> FastAPI:
    """The app of one worker process of ``hearth serve --workers N`` (a uvicorn factory)."""
    args = json.loads(os.environ[SERVE_ARGS_ENV])
    _exit_with_parent(args["supervisor"])  # (it may have died before this worker got here)
    config = Path(args["config"]) if args.get("config") else None
    settings = load_settings(config, database_url=args.get("database_url"), host=args["host"], port=args["port"])
    return create_app(settings)


async def _preflight(settings: AppSettings) -> None:
    db = create_database(settings.database_url)
    try:
        await prepare(settings, db)
    finally:
        await db.dispose()
    if has_providers(settings.config_path):  # the chain's shared state store ([gateway] state_url) must answer now
        from hearth.gateway.config import load_config
        from hearth.gateway.state import make_store

        store = make_store(load_config(settings.config_path).gateway)
        try:
            await store.start()
        finally:
            await store.aclose()


def serve(config: Path | None = None, database_url: str | None = None, host: str = "127.0.0.1",
          port: int = 8000, workers: int = 1) -> int:
    """`hearth serve`: validate settings, the database and the chain's state store, then run uvicorn until
    interrupted. Returns the exit code (2 for a configuration or start-up error, which is printed naming the
    field and the fix).

    ``workers`` > 1 runs that many worker processes on the same port (uvicorn's process manager). They
    share everything through the database (login/signup throttling included); the gateway chain's breaker
    and warm state are shared when the TOML sets ``[gateway] state_url``."""
    import uvicorn

    from hearth.gateway.state import StateStoreError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if workers < 1:
        print(f"hearth serve: configuration error: workers: must be >= 1, got {workers}", file=sys.stderr)
        return 2
    try:
        settings = load_settings(config, database_url=database_url, host=host, port=port)
        app = create_app(settings)  # builds the chain: provider errors show now, not in a worker
        asyncio.run(_preflight(settings))
    except (SettingsError, ValueError) as exc:  # the gateway's ConfigError is a ValueError too
        print(f"hearth serve: configuration error: {exc}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"hearth serve: refusing to start: {exc}", file=sys.stderr)
        return 2
    except StateStoreError as exc:  # before: a traceback from the lifespan after "serving on ..."
        print(f"hearth serve: configuration error: gateway.state_url: {exc}", file=sys.stderr)
        return 2
    shown_host = f"[{host}]" if ":" in host else host
    model = "model: configured" if has_providers(settings.config_path) else "no model configured yet"
    database = make_url(settings.database_url).render_as_string(hide_password=True)
    print(f"hearth: serving on http://{shown_host}:{port}/  ({settings.environment} mode, {model}, "
          f"database {database}, {workers} worker{'s' if workers > 1 else ''})", flush=True)
    # a bounded graceful shutdown: in-flight turns get time to commit, a hung one cannot block exit
    common = dict(host=host, port=port, log_level="info", lifespan="on", proxy_headers=False, server_header=False,
                  timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    if workers > 1:
        os.environ[SERVE_ARGS_ENV] = json.dumps({"config": str(config) if config else None,
                                                 "database_url": database_url, "host": host, "port": port,
                                                 "supervisor": os.getpid()})
        uvicorn.run("hearth.app.main:worker_app", factory=True, workers=workers, **common)
        return 0
    server = uvicorn.Server(uvicorn.Config(app, **common))
    server.run()
    return 0 if server.started else 1
