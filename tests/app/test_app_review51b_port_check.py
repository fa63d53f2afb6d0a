"""`hearth serve`'s port check binds what uvicorn will bind, with real sockets on loopback.

uvicorn binds differently with one process and with --workers N: one process hands host and port to asyncio's
create_server (every address the host resolves to, IPv6 ones IPv6-only); workers get ONE socket from
Config.bind_socket (IPv6 when the host holds a ":", dual-stack on Linux, else IPv4). The check bound every
resolved address, IPv6 dual-stack, whatever the workers: it refused `--host ::` next to an IPv4 listener on the
port (one process serves that) and `--host ""` (uvicorn's all-interfaces).

The truth each case is compared with is uvicorn's own code binding the same host and port.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import contextmanager

import pytest
import uvicorn

from hearth.app import main


async def _no_app(scope, receive, send):  # pragma: no cover - never served
    raise AssertionError("not served")


def uvicorn_binds(host: str, port: int, workers: int) -> bool:
    """Whether uvicorn itself can bind host:port for that many workers (its own code, then let go)."""
    config = uvicorn.Config(_no_app, host=host, port=port, workers=workers, lifespan="off", log_level="critical")
    if workers > 1:  # what its process manager listens on (hearth.app.main._run_workers binds it the same way)
        try:
            config.bind_socket().close()
        except SystemExit:
            return False
        return True

    async def one_process() -> bool:
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        try:
            await server.startup()
        except SystemExit:
            return False
        for listener in server.servers:
            listener.close()
            await listener.wait_closed()
        return True

    return asyncio.run(one_process())


@contextmanager
def ipv4_listener():
    """Something else listening on 127.0.0.1 at a port of its own (IPv6 on that port stays free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "::", ""])
@pytest.mark.parametrize("held", [True, False], ids=["ipv4-port-taken", "port-free"])
def test_the_port_check_refuses_exactly_what_uvicorn_cannot_bind(host, workers, held):
    # before (every resolved address, IPv6 dual-stack, for any workers): "::" with one process and a taken IPv4
    # port, and "" with a free port, were refused although uvicorn binds them
    if held:
        with ipv4_listener() as port:
            refused, truth = main.listen_error(host, port, workers), uvicorn_binds(host, port, workers)
    else:
        port = _free_port()
        refused, truth = main.listen_error(host, port, workers), uvicorn_binds(host, port, workers)
    assert (refused is None) == truth, f"check: {refused!r}; uvicorn binds: {truth}"


def test_serve_starts_on_ipv6_any_next_to_an_ipv4_listener_and_refuses_it_with_workers(serve_env, monkeypatch):
    # one process on "::" takes only IPv6 (asyncio binds it IPv6-only), so an IPv4 listener on the port is no
    # obstacle; with workers uvicorn's one "::" socket is dual-stack and cannot bind. Before, both exited 1.
    tmp_path = serve_env
    ran = []
    monkeypatch.setattr(main, "_run_one", lambda server: ran.append(("one", server.config.host)) or 0)
    monkeypatch.setattr(main, "_run_workers", lambda config: ran.append(("workers", config.host)) or 0)
    database = f"sqlite+aiosqlite:///{tmp_path / 'h.sqlite3'}"
    with ipv4_listener() as port:
        assert main.serve(database_url=database, host="::", port=port, workers=1) == 0
        assert ran == [("one", "::")]
        assert (tmp_path / "h.sqlite3").exists()  # the start-up check ran on the real file
        assert main.serve(database_url=database, host="::", port=port, workers=2) == 1
    assert ran == [("one", "::")]  # the workers were never started
