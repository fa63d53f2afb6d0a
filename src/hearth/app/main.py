"""The FastAPI app and ``hearth serve``.

    app = create_app(settings)                   # model: the gateway chain from settings.config_path
    app = create_app(settings, model=backend)    # tests: anything with the chain's complete()/stream()
    exit_code = serve(config, database_url, host, port, workers)

Start-up (lifespan): open the database and run hearth.app.startup.prepare (migrations, key rotation, the
master-key check that refuses to start when users' keys do not open), start the chain. Shutdown closes the
chain and the engine. ``hearth serve`` runs prepare ONCE itself, before it binds the port and before any
worker starts, and builds its apps with ``prepared`` so that their lifespans do not repeat it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
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
from hearth.app.crypto import master_key_id
from hearth.app.companions import ChatCleared
from hearth.app.deps import AppState, LoginRequired
from hearth.app.limits import BodyLimit, SecurityHeaders
from hearth.app.model import (SETUP_SNIPPET, ModelUnavailable, NoModel, build_backend, describe_failure,
                              failure_for_log, has_providers, quiet_upstream_text)
from hearth.app.settings import AppSettings, SettingsError, load_settings
from hearth.app.startup import StartupError, prepare
from hearth.app.storage import create_database
from hearth.app.textlimits import AGENT_FIELD_LIMITS, MAX_CONTEXT, MAX_NAME, MAX_PERSONA
from hearth.app.throttle import Throttle, parse_networks

log = logging.getLogger("hearth.app")
HERE = Path(__file__).parent


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["setup_snippet"] = SETUP_SNIPPET
    # the companion's and the rehearsed person's text boxes take what the server takes (hearth.app.textlimits);
    # the message boxes' max_text_chars comes from the settings, in create_app
    templates.env.globals.update(max_name=MAX_NAME, max_persona=MAX_PERSONA, max_context=MAX_CONTEXT,
                                 agent_field_limits=AGENT_FIELD_LIMITS)
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


def create_app(settings: AppSettings, *, model: Any = None, prepared: bool = False) -> FastAPI:
    """The ASGI app. ``model`` defaults to the chain built from ``settings.config_path``.

    ``prepared``: the caller has already run hearth.app.startup.prepare on these settings (``hearth serve``
    does, once, before it serves); the lifespan then does not run it again."""
    backend = model if model is not None else build_backend(settings.config_path)
    quiet_upstream_text()  # the chain's own failure logs: class names and labels, not upstream text
    templates = _templates()
    # the text boxes' maxlength: a browser cuts a longer paste silently, so it must be the server's own limit
    templates.env.globals["max_text_chars"] = settings.max_text_chars

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        db = create_database(settings.database_url)
        turns: set[asyncio.Task] = set()  # streamed turns whose page may have left (routes._util.to_the_end)
        try:
            if not prepared:
                await prepare(settings, db)  # StartupError: the app does not start
            if hasattr(backend, "start"):
                await backend.start()
            app.state.hearth = AppState(
                settings=settings, db=db, model=backend, model_configured=not isinstance(backend, NoModel),
                templates=templates, trusted_proxies=parse_networks(settings.forwarded_allow_ips),
                throttle=Throttle.for_master_key(settings.master_key.get_secret_value()), turns=turns)
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


def _checked(settings: AppSettings) -> str:
    """What the start-up check depends on, with the keys as fingerprints (no secret): a worker whose settings give
    the same string may skip the check that ``hearth serve`` ran on them."""
    previous = settings.previous_master_key
    return json.dumps([settings.database_url, master_key_id(settings.master_key.get_secret_value()),
                       master_key_id(previous.get_secret_value()) if previous is not None else None])


def worker_args(settings: AppSettings, *, config: Path | None, database_url: str | None, host: str,
                port: int) -> dict:
    """What ``hearth serve --workers N`` hands each worker (through SERVE_ARGS_ENV): its arguments, its pid, and
    the fingerprint of the settings it ran the start-up check on."""
    return {"config": str(config) if config else None, "database_url": database_url, "host": host, "port": port,
            "supervisor": os.getpid(), "checked": _checked(settings)}


def worker_app() -> FastAPI:
    """The app of one worker process of ``hearth serve --workers N`` (a uvicorn factory). The start-up check ran
    once in ``hearth serve`` before the workers started; a worker whose settings are not the ones checked (the
    key or the database changed before uvicorn started or restarted it) runs the check itself."""
    args = json.loads(os.environ[SERVE_ARGS_ENV])
    _exit_with_parent(args["supervisor"])  # (it may have died before this worker got here)
    config = Path(args["config"]) if args.get("config") else None
    settings = load_settings(config, database_url=args.get("database_url"), host=args["host"], port=args["port"])
    return create_app(settings, prepared=args.get("checked") == _checked(settings))


async def _preflight(settings: AppSettings) -> None:
    """``hearth serve``'s one start-up check, before it serves: prepare (migrations, key rotation, the master-key
    check, a new development key written), then a probe of the chain's state store (connect + PING, nothing
    written) so that an unreachable state_url is one line here rather than a lifespan traceback from uvicorn."""
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


async def _bind_one_process(host: str, port: int) -> None:
    """Bind what one uvicorn process binds, then let go: uvicorn hands host and port to asyncio's create_server,
    which binds every address the host resolves to ("" is all of them), the IPv6 ones IPv6-only."""
    server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host=host, port=port,
                                                            start_serving=False)
    server.close()
    await server.wait_closed()


def listen_error(host: str, port: int, workers: int) -> OSError | None:
    """The error uvicorn will get binding host:port (in use, not an address of this machine, a host name that does
    not resolve), or None when it can listen. With workers > 1 uvicorn binds ONE socket itself (Config.bind_socket):
    IPv6 when the host holds a ":" (on Linux it then takes IPv4 too), else IPv4 only, the name resolved for IPv4
    alone. Binding every address of the host, IPv6 ones dual-stack, whatever the workers, refused starts that work
    (--host :: next to an IPv4 listener on the port, --host "", with workers a localhost whose IPv6 address is
    taken or down) and let through one that fails (with workers, a host name with IPv6 addresses only)."""
    try:
        if workers == 1:
            asyncio.run(_bind_one_process(host, port))
            return None
        family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:  # socket.gaierror included
        return exc
    return None


def _run_one(server: Any) -> int:
    """Run one uvicorn server in this process. SIGTERM is a graceful stop (in-flight requests answered, the
    lifespan's shutdown run) and exits 0: uvicorn re-raises the signal it stopped on once it is done, which with
    the default handler killed the process (status 143) after the clean shutdown."""

    def on_sigterm(signum, frame) -> None:  # uvicorn's own handler is installed for the run, then this one again
        server.should_exit = True

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if server.started else 1


def _run_workers(config: Any) -> int:
    """uvicorn's process manager (what ``uvicorn.run(workers=N)`` runs), telling apart a stop it was asked for
    (SIGTERM, SIGINT: exit 0) from one it made because a worker failed to start (exit 1; uvicorn.run returned
    normally then, and serve exited 0)."""
    from uvicorn.supervisors import Multiprocess

    class Supervisor(Multiprocess):
        asked_to_stop = False

        def handle_term(self) -> None:
            self.asked_to_stop = True
            super().handle_term()

        def handle_int(self) -> None:
            self.asked_to_stop = True
            super().handle_int()

    sock = config.bind_socket()
    try:
        supervisor = Supervisor(config, sockets=[sock])
        supervisor.run()
    finally:
        sock.close()
    if supervisor.asked_to_stop:
        return 0
    print("hearth serve: a worker failed to start (its error is above); the others were stopped", file=sys.stderr)
    return 1


def serve(config: Path | None = None, database_url: str | None = None, host: str | None = None,
          port: int | None = None, workers: int = 1) -> int:
    """`hearth serve`: validate settings, check that the port can be bound, run the start-up check once
    (hearth.app.startup.prepare: migrations, key rotation, the master-key check) and probe the chain's state
    store, then run uvicorn until stopped. Returns the exit code: 2 for a configuration or start-up error (printed
    naming the field and the fix), 1 when the port cannot be bound or a worker failed to start, 0 after a stop
    by SIGTERM (or, with workers, SIGINT; a single process stopped by Ctrl-C exits 130).

    ``host`` / ``port``: None takes the settings' (the TOML's ``[app] host`` / ``port``, else 127.0.0.1:8000).
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
        # the address the settings hold: the option where given, else the TOML's [app] host / port (before, the
        # options' defaults always won, so the TOML's were validated and then ignored)
        host, port = settings.host, settings.port
        shown_host = f"[{host}]" if ":" in host else host
        # builds the chain: provider errors show now, not in a worker. prepared: the check below is the only one
        app = create_app(settings, prepared=True)
        # before the check: a start that cannot listen migrates nothing and writes no development key
        taken = listen_error(host, port, workers)
        if taken is None:
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
    if taken is not None:  # before: "serving on ...", then uvicorn's bind error and exit 3
        print(f"hearth serve: cannot listen on {shown_host}:{port}: {taken.strerror or taken}", file=sys.stderr)
        return 1
    model = "model: configured" if has_providers(settings.config_path) else "no model configured yet"
    database = make_url(settings.database_url).render_as_string(hide_password=True)
    print(f"hearth: serving on http://{shown_host}:{port}/  ({settings.environment} mode, {model}, "
          f"database {database}, {workers} worker{'s' if workers > 1 else ''})", flush=True)
    # a bounded graceful shutdown: in-flight turns get time to commit, a hung one cannot block exit
    common = dict(host=host, port=port, log_level="info", lifespan="on", proxy_headers=False, server_header=False,
                  timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    if workers > 1:
        os.environ[SERVE_ARGS_ENV] = json.dumps(worker_args(settings, config=config, database_url=database_url,
                                                            host=host, port=port))
        return _run_workers(uvicorn.Config("hearth.app.main:worker_app", factory=True, workers=workers, **common))
    return _run_one(uvicorn.Server(uvicorn.Config(app, **common)))
