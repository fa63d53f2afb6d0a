"""A real OpenAI-compatible HTTP server on 127.0.0.1 with scripted behaviours (contract E).

It speaks HTTP over a real socket (aiohttp.web), so clients under test go through their whole
stack: connection pool, timeouts, SSE parsing. Nothing leaves loopback.

    from tests.fakes.openai_server import FakeOpenAI, Behavior

    async with FakeOpenAI(Behavior.reply('{"comment": "hi", "tone": "warm"}')) as server:
        ...  # POST server.base_url + "/chat/completions"

    server = FakeOpenAI(handler).start_in_thread()   # sync tests / Playwright
    ...
    server.stop()

handler (what POST /v1/chat/completions does), one of:
    * a Behavior: served for every request;
    * a list of Behaviors: served in order, one per request; once the list is exhausted the
      server answers 500 {"error": {"message": "fake: script exhausted ..."}} so a test that
      makes more calls than it scripted fails loudly instead of passing by accident;
    * a sync or async callable (body: dict) -> Behavior.

Behaviours:
    Behavior.reply(content, finish_reason="stop", delay_s=0, usage=AUTO)   JSON chat.completion, or SSE (the
        content split into a few deltas) when the request body has "stream": true.
    Behavior.stream(chunks, first_token_delay_s=0, stall_after=None, chunk_delay_s=0, finish_reason="stop",
                    cut=False, usage=AUTO)   SSE deltas;
        stall_after=N sends N chunks and then stalls (holds the connection open, sends nothing);
        cut=True ends the body right after the chunks, without the final chunk and [DONE].
        For a non-streaming request the chunks are joined into one JSON reply after the delay
        (a stall then means no reply at all).
    Behavior.status(code, headers=None, body=None)   that status; body defaults to an OpenAI error object.
    usage (reply and stream): AUTO = the default counts (usage_json(content)); a dict = exactly that object;
        None = no usage at all. A JSON reply carries it as "usage"; an SSE reply only when the request asked
        with "stream_options": {"include_usage": true}, as OpenAI and vLLM send it: "usage": null on every
        other chunk, then one last chunk with "choices": [] and the usage, before [DONE] (none when None).
    Behavior.hang()     accepts the request and never answers (until the server stops).
    Behavior.reset()    closes the TCP connection with a RST before any response byte.
    Behavior.raw(data, content_type="application/json", status=200, delay_s=0)   exactly these bytes.

FakeOpenAI(handler, model="fake-model", health=None, port=0): port 0 picks a free port; pass one
(see free_port()) to bring an endpoint up where clients were refused until then.

Other routes: GET /v1/models (lists `model`), GET /health (server.health: a Behavior, a list or a
callable () -> Behavior; default 200 {"status": "ok"}).

Recorded: server.requests (JSON bodies of chat requests, in arrival order), server.headers (their
headers), server.health_calls (GET /health count). All behaviours that wait (hang, stall, delays)
wake up when the server stops, so stop()/__aexit__ never hangs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence, Union

from aiohttp import web

Handler = Union["Behavior", Sequence["Behavior"], Callable[[dict], "Behavior | Awaitable[Behavior]"]]


@dataclass(frozen=True)
class Behavior:
    """One scripted response. Build it with the class methods, not the constructor."""

    kind: str
    content: str = ""
    chunks: tuple[str, ...] = ()
    finish_reason: str | None = "stop"
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    stall_after: int | None = None
    cut: bool = False
    code: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    content_type: str = "application/json"
    usage: Any = "auto"

    @classmethod
    def reply(cls, content: str, finish_reason: str | None = "stop", delay_s: float = 0.0,
              usage: Any = "auto") -> "Behavior":
        _check_delay("delay_s", delay_s)
        return cls("reply", content=content, finish_reason=finish_reason, delay_s=delay_s, usage=usage)

    @classmethod
    def stream(cls, chunks: Sequence[str], first_token_delay_s: float = 0.0, stall_after: int | None = None,
               chunk_delay_s: float = 0.0, finish_reason: str | None = "stop", cut: bool = False,
               usage: Any = "auto") -> "Behavior":
        if isinstance(chunks, str):
            raise TypeError("chunks must be a sequence of strings, not one string")
        _check_delay("first_token_delay_s", first_token_delay_s)
        _check_delay("chunk_delay_s", chunk_delay_s)
        if stall_after is not None and stall_after < 0:
            raise ValueError(f"stall_after must be >= 0, got {stall_after}")
        return cls("stream", chunks=tuple(chunks), delay_s=first_token_delay_s, stall_after=stall_after,
                   chunk_delay_s=chunk_delay_s, finish_reason=finish_reason, cut=cut, usage=usage)

    @classmethod
    def status(cls, code: int, headers: dict[str, str] | None = None, body: Any = None) -> "Behavior":
        if not 100 <= code <= 599:
            raise ValueError(f"code must be an HTTP status, got {code}")
        if body is None:
            body = {"error": {"message": f"fake status {code}", "type": "fake", "code": code}}
        raw = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        return cls("status", code=code, headers=dict(headers or {}), body=raw)

    @classmethod
    def hang(cls) -> "Behavior":
        return cls("hang")

    @classmethod
    def reset(cls) -> "Behavior":
        return cls("reset")

    @classmethod
    def raw(cls, data: bytes | str, content_type: str = "application/json", status: int = 200,
            delay_s: float = 0.0) -> "Behavior":
        _check_delay("delay_s", delay_s)
        return cls("raw", body=data.encode() if isinstance(data, str) else bytes(data), content_type=content_type,
                   code=status, delay_s=delay_s)


def _check_delay(name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


AUTO = "auto"  # Behavior usage: the default counts


def usage_json(content: str) -> dict:
    """The default usage object of a reply carrying `content` (made-up counts: it is a fake, but a consistent
    one: total_tokens = prompt_tokens + completion_tokens, as a real server reports them)."""
    prompt, completion = 1, max(1, len(content) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _usage_of(usage: Any, content: str) -> dict | None:
    return usage_json(content) if usage == AUTO else usage


def completion_json(content: str, model: str, finish_reason: str | None = "stop", usage: Any = AUTO) -> dict:
    """An OpenAI chat.completion object carrying `content` (and `usage`, see Behavior; None: no usage key)."""
    doc = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": finish_reason}],
    }
    usage = _usage_of(usage, content)
    if usage is not None:
        doc["usage"] = usage
    return doc


def free_port() -> int:
    """A loopback port that nothing listens on right now (connections to it are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A free_port() handed to a child process is free when picked, not necessarily when the child binds it: another
# process (the other pytest worker's servers) can take it in between. The tests that start a child on one pick
# another port when the child says so, up to PORT_TRIES ports in all; no other failure is tried again.
PORT_TRIES = 3


def port_taken(output: str) -> bool:
    """Whether a child server's output says its port was taken (EADDRINUSE)."""
    return "address already in use" in output.lower()


def _split(content: str, parts: int = 3) -> list[str]:
    if not content:
        return [""]
    step = max(1, -(-len(content) // parts))
    return [content[i:i + step] for i in range(0, len(content), step)]


class FakeOpenAI:
    """The scripted server. See the module docstring for handler and behaviour semantics."""

    def __init__(self, handler: Handler, *, model: str = "fake-model", health: Any = None, port: int = 0) -> None:
        self.model = model
        self._want_port = port  # 0: a free port; a fixed one lets a test "bring up" an endpoint that refused
        self.handler = handler
        self.health = health if health is not None else Behavior.status(200, body={"status": "ok"})
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.health_calls = 0
        self.port: int | None = None
        self._script_pos = 0
        self._health_pos = 0
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ addresses
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def health_url(self) -> str:
        return self.url + "/health"

    # ------------------------------------------------------------------ life cycle (async)
    async def start(self) -> "FakeOpenAI":
        self._loop = asyncio.get_running_loop()
        self._closing = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        # access_log=None: a log line per request would distort the benchmark and spam tests.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._want_port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, backlog=2048).start()
        return self

    async def aclose(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "FakeOpenAI":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ life cycle (thread)
    def start_in_thread(self, timeout_s: float = 10.0) -> "FakeOpenAI":
        """Run the server on its own event loop in a daemon thread; returns once it listens."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # reported to the starting thread below
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.aclose())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"FakeOpenAI-{id(self):x}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"fake server did not start within {timeout_s} s")
        if failure:
            raise failure[0]
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop a server started with start_in_thread (idempotent)."""
        if self._thread is None or self._loop is None:
            return
        loop = self._loop
        if self._closing is not None:
            loop.call_soon_threadsafe(self._closing.set)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> "FakeOpenAI":
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ routes
    async def _pick(self, source: Any, pos_attr: str, arg: Any) -> Behavior | None:
        if isinstance(source, Behavior):
            return source
        if isinstance(source, (list, tuple)):
            pos = getattr(self, pos_attr)
            setattr(self, pos_attr, pos + 1)
            return source[pos] if pos < len(source) else None
        result = source(arg) if arg is not _NO_ARG else source()
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Behavior):
            raise TypeError(f"handler must return a Behavior, got {type(result).__name__}")
        return result

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "fake: body is not JSON"}}, status=400)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        behavior = await self._pick(self.handler, "_script_pos", body)
        if behavior is None:
            return web.json_response(
                {"error": {"message": f"fake: script exhausted after {len(self.requests) - 1} requests"}}, status=500)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return await self._serve(request, behavior, stream=bool(body.get("stream")), include_usage=include_usage)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self.health_calls += 1
        behavior = await self._pick(self.health, "_health_pos", _NO_ARG)
        if behavior is None:
            behavior = Behavior.status(200, body={"status": "ok"})
        return await self._serve(request, behavior, stream=False)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}]})

    # ------------------------------------------------------------------ behaviours
    async def _wait(self, seconds: float | None) -> bool:
        """Sleep `seconds` (None: forever) unless the server is closing; True if it is closing."""
        assert self._closing is not None
        if seconds == 0:
            return self._closing.is_set()
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def _serve(self, request: web.Request, b: Behavior, *, stream: bool,
                     include_usage: bool = False) -> web.StreamResponse:
        if b.kind == "hang":
            await self._wait(None)
            return web.Response(status=503)
        if b.kind == "reset":
            transport = request.transport
            sock = transport.get_extra_info("socket") if transport is not None else None
            if sock is not None:  # linger 0: close() sends RST instead of FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if transport is not None:
                transport.abort()
            raise asyncio.CancelledError  # nothing more can be written; aiohttp drops the request
        if b.kind == "status":
            return web.Response(status=b.code, body=b.body, headers=b.headers, content_type="application/json")
        if b.kind == "raw":
            if await self._wait(b.delay_s):
                return web.Response(status=503)
            return web.Response(status=b.code, body=b.body, headers={"Content-Type": b.content_type})
        chunks = list(b.chunks) if b.kind == "stream" else _split(b.content)
        if not stream:
            if await self._wait(b.delay_s):
                return web.Response(status=503)
            if b.kind == "stream" and b.stall_after is not None:
                await self._wait(None)
                return web.Response(status=503)
            return web.json_response(completion_json("".join(chunks), self.model, b.finish_reason, b.usage))
        return await self._sse(request, b, chunks, include_usage)

    async def _sse(self, request: web.Request, b: Behavior, chunks: list[str],
                   include_usage: bool = False) -> web.StreamResponse:
        if await self._wait(b.delay_s):
            return web.Response(status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"

        # asked for usage (stream_options.include_usage): "usage": null on every chunk, as OpenAI and vLLM send it
        extra = {"usage": None} if include_usage else {}

        def event(delta: dict, finish: str | None) -> bytes:
            obj = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        await resp.write(event({"role": "assistant", "content": ""}, None))
        for i, chunk in enumerate(chunks):
            if b.stall_after is not None and i >= b.stall_after:
                await self._wait(None)
                return resp
            if i and b.chunk_delay_s and await self._wait(b.chunk_delay_s):
                return resp
            await resp.write(event({"content": chunk}, None))
        if b.stall_after is not None and b.stall_after >= len(chunks):
            await self._wait(None)
            return resp
        if b.cut:  # the body ends cleanly, but without the final chunk and [DONE]
            await resp.write_eof()
            return resp
        await resp.write(event({}, b.finish_reason))
        usage = _usage_of(b.usage, "".join(chunks)) if include_usage else None
        if usage is not None:  # the usage chunk: no choices, after the finish_reason, before [DONE]
            obj = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model,
                   "choices": [], "usage": usage}
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


_NO_ARG = object()


# ---------------------------------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.fakes.openai_server --port N``: serve valid hearth envelopes on 127.0.0.1:N until
    interrupted, so the app (or the gateway, or an eval) can be tried without a model. Chat replies echo
    the user ("Echo: ..."), feed comments and analyst readings are canned; streaming works too."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.fakes.openai_server", description=main.__doc__)
    parser.add_argument("--port", type=int, default=8001, help="port on 127.0.0.1 (default 8001; 0 picks one)")
    parser.add_argument("--model", default="fake-model", help="model name it answers to (default fake-model)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port: must be 0-65535, got {args.port}")
    from tests.app.app_fakes import envelope_for, kind_from_request

    def handler(body: dict) -> Behavior:  # a valid envelope of the requested kind
        # (this module's own Behavior: run with -m it is __main__, not tests.fakes.openai_server)
        return Behavior.reply(envelope_for(body["messages"], kind_from_request(body)))

    async def run() -> None:
        server = FakeOpenAI(handler, model=args.model, port=args.port)
        try:
            await server.start()
        except OSError as exc:
            raise SystemExit(f"--port: cannot listen on 127.0.0.1:{args.port}: {exc.strerror}") from None
        print(f"fake OpenAI-compatible server: base_url = \"{server.base_url}\", model = \"{args.model}\" "
              "(Ctrl-C stops it)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.aclose()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
