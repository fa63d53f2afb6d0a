"""Processes the gateway benchmark talks to, each started as `python servers.py ROLE ...`.

    upstream PORTFILE                 FakeOpenAI answering every chat request with a valid envelope
    hearth CONFIG PORT                `hearth gateway` (aiohttp.web) over the chain
    fastapi CONFIG PORT               the same chain behind FastAPI + uvicorn (one route, no logging:
                                      a lower bound on what a FastAPI gateway costs)

Every process binds 127.0.0.1 only. bench_gateway.py starts and stops them.
(No `from __future__ import annotations` here: FastAPI must resolve the `Request` annotation.)
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.fakes.http_wait import wait_http_ok  # noqa: E402  (needs REPO on sys.path)
from tests.fakes.openai_server import free_port  # noqa: E402

CHAT = {"message": "Hello there.", "mood": "warm", "memories": [], "affection": 1, "trust": 0, "suggested_actions": []}
CHAT_JSON = json.dumps(CHAT)


def _upstream(portfile: str) -> None:
    from tests.fakes.openai_server import Behavior, FakeOpenAI

    async def main() -> None:
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as server:
            Path(portfile).write_text(str(server.port))
            await asyncio.Event().wait()

    asyncio.run(main())


def _fastapi(config: str, port: int) -> None:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from hearth.envelope import dumps
    from hearth.gateway.chain import Chain
    from hearth.gateway.config import load_config

    chain = Chain(load_config(Path(config)))

    @asynccontextmanager
    async def lifespan(app):
        await chain.start()
        yield
        await chain.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        r = await chain.complete(body["messages"], kind=body.get("hearth_kind", "chat"))
        return JSONResponse({"object": "chat.completion", "model": r.provider, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": dumps(r.envelope)}, "finish_reason": "stop"}]})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Proc:
    """A child process that is stopped on exit."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log.open("wb")
        self.p = subprocess.Popen([sys.executable, *args], stdout=self.log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(REPO / "src")})

    @property
    def pid(self) -> int:
        return self.p.pid

    def wait_http(self, url: str, timeout_s: float = 60.0) -> None:
        wait_http_ok(url, self.p, timeout_s, name=url, details=lambda: f"see {self.log.name}")

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def start_upstream(workdir: Path) -> "tuple[Proc, str]":
    portfile = workdir / "upstream.port"
    portfile.unlink(missing_ok=True)
    proc = Proc([__file__, "upstream", str(portfile)], workdir / "upstream.log")
    deadline = time.monotonic() + 30
    while not portfile.exists() or not portfile.read_text():
        if proc.p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"upstream did not start, see {workdir / 'upstream.log'}")
        time.sleep(0.02)
    url = f"http://127.0.0.1:{portfile.read_text()}"
    proc.wait_http(url + "/health")
    return proc, url + "/v1"


def start_gateway(kind: str, config: Path, workdir: Path) -> "tuple[Proc, str]":
    port = free_port()
    if kind == "hearth":
        args = ["-m", "hearth.cli", "gateway", "--config", str(config), "--port", str(port)]
    else:
        args = [__file__, "fastapi", str(config), str(port)]
    proc = Proc(args, workdir / f"gateway-{kind}.log")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/healthz")
    return proc, url + "/v1"


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "upstream":
        _upstream(sys.argv[2])
    elif role == "fastapi":
        _fastapi(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown role {role!r}")
