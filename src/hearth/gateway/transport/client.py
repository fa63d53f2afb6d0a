"""The transport seam: the one replaceable point where gateway requests leave the process.

    Transport.open(method, url, headers=..., body=..., connect_timeout_s=...) -> UpstreamResponse
        returns once the status line and headers arrived; raises ConnectTimeout or ConnectFailed.
    UpstreamResponse: .status, .headers, await .read(limit) -> bytes, async for line in .lines(), .close()
        lines() yields the body's lines with their line ends (CRLF, LF or a bare CR: SSE's), never b"".
        read()/lines() raise ConnectFailed when the connection breaks mid-body; read(limit) raises BodyTooLarge
        (with the first `limit` bytes) as soon as the body passes `limit` bytes, instead of buffering it all.

The transport enforces only the connect timeout (it alone can tell connecting from waiting): getting a
connection, i.e. name resolution, a free slot in the pool, TCP and TLS, all within connect_timeout_s;
first-token and total budgets are enforced by the caller (providers.py) around these awaits, and the
caller closes the response on any early exit, which drops (never re-pools) the connection. A caller whose own
timer may run out while open() is still connecting (first_token_s <= connect_s) sets a ConnectWatch in
CONNECT_WATCH around the call: AiohttpTransport marks it when it has a connection, so the caller can say the
connect ran out, not the first token (a transport that does not mark it leaves .connected None).

A request goes to its URL and nowhere else, and carries only the headers its caller gave:
    * redirects are followed only for a GET with no body (the health probe), and one that carries headers (the
      provider's key, sent to the provider's own origin only) only within its origin: a 3xx to another origin
      is that probe's answer. A chat POST answered 3xx is that status (a provider failure, falls through).
      Following it re-sent the user's messages and the provider's key headers (`api-key`, `x-api-key`, ...:
      aiohttp strips only Authorization and Cookie) to whatever origin the Location named, took that
      server's reply as the provider's, and a 301/302 turned the POST into a GET;
    * no cookie jar: a cookie one upstream sets (a load balancer's, a session) was kept for the life of
      the process and sent with every user's requests to that host, whichever provider they went to.

A pooled keep-alive connection is reused only while it has been idle less than POOL_IDLE_S (4 s). uvicorn, which
serves vLLM's OpenAI API, closes a connection idle for 5 s by default; aiohttp keeps one for 15 s, so a chat POST sent
on a connection the upstream was closing at that moment failed as a reset (a provider failure, counted by its
breaker). Below the upstream's idle limit that race does not come up. A request that fails so is NOT sent again: from
the client a connection the upstream closed before reading the request cannot be told from one it closed after
acting on it (a worker that crashed mid-generation), and a second send would run, and bill, the generation twice.

Why aiohttp (AiohttpTransport) and not httpx.AsyncClient: measured on the 2-core CI-like machine
(benchmarks/gateway/results.md, rows "httpx direct" vs "aiohttp direct"), httpx's pool collapses at
high concurrency: at 500 concurrent requests httpx managed 133 req/s (p99 11.2 s) where aiohttp did
7796 req/s, at a fraction of httpx's client CPU per request. At 1 concurrent the two are close.
Tests never swap this for a mock: they point it at real loopback servers (tests/fakes), and a test
that needs a different transport implements these two small classes.
"""

from __future__ import annotations

import abc
import re
from contextvars import ContextVar
from typing import AsyncIterator, Mapping
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from hearth.gateway.config import masked_url, same_origin, secret_query_values

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10  # aiohttp's own default
# an SSE line with its end: CRLF, LF or a bare CR (UpstreamResponse.lines)
_LINE = re.compile(rb"[^\r\n]*(?:\r\n?|\n)")
# the longest line lines() reads (its line end included): what aiohttp's readline() allowed (twice its read_bufsize,
# 256 KiB); a longer one is a broken upstream (ConnectFailed), as readline's LineTooLong was
MAX_LINE = 512 * 1024


def _redacted(message: str, url: str) -> str:
    """`message` without the user:password@ of `url` nor the values of its query parameters named like a credential
    (?token=, ?api_key=, ?sig=...: config.masked_url). A provider's base_url or health_url may carry credentials
    (its auth); these messages become the provider error's text, which the gateway sends to clients (the 502's
    failures) and shows in /v1/providers (a warm gate's last_error)."""
    message = message.replace(url, masked_url(url))
    for value in secret_query_values(url):
        for shown in {value, unquote(value)}:
            if len(shown) >= 6:  # wherever else it shows (as the password below)
                message = message.replace(shown, "***")
    try:
        parts = urlsplit(url)
    except ValueError:
        return message
    if "@" not in parts.netloc:
        return message
    userinfo = parts.netloc.rsplit("@", 1)[0]
    for shown in (userinfo, unquote(userinfo)):
        message = message.replace(shown + "@", "***@")
    password = unquote(parts.password or "")
    if len(password) >= 6:  # wherever else it shows (a short one would mangle the message, and guesses easily)
        message = message.replace(password, "***")
    return message


def _reason(exc: BaseException) -> str:
    """What an error message says of the HTTP client's `exc`: its repr, except for a ClientResponseError (a reply the
    client could not parse: a bad status line or header, a Content-Encoding it cannot decode), whose repr carries its
    RequestInfo and so the request's headers: 'Authorization': 'Bearer <key>', a provider's api-key. That text went
    into the 502's failures and a health probe's last_error (GET /v1/providers, the warm-up's log lines)."""
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{type(exc).__name__}(status={exc.status}, message={exc.message!r})"
    return repr(exc)


class ConnectWatch:
    """Whether open() has its connection yet: None (the transport does not tell), False (still connecting), True."""

    __slots__ = ("connected",)

    def __init__(self) -> None:
        self.connected: bool | None = None


CONNECT_WATCH: ContextVar[ConnectWatch | None] = ContextVar("hearth_gateway_connect_watch", default=None)


async def _on_connected(session, trace_config_ctx, params) -> None:
    watch = trace_config_ctx.trace_request_ctx
    if isinstance(watch, ConnectWatch):
        watch.connected = True


class TransportError(Exception):
    """Base of transport failures (deliberately not a TimeoutError: callers time phases themselves)."""


class ConnectTimeout(TransportError):
    """No connection (name resolution, pool slot, TCP, TLS) within connect_timeout_s."""


class ConnectFailed(TransportError):
    """Refused, reset, DNS failure, or the connection broke before the body was complete."""


class BodyTooLarge(TransportError):
    """The body passed the caller's limit; .head holds its first `limit` bytes. The connection is dropped."""

    def __init__(self, limit: int, head: bytes) -> None:
        self.limit = limit
        self.head = head
        super().__init__(f"the body is larger than {limit} bytes")


class UpstreamResponse(abc.ABC):
    status: int
    headers: Mapping[str, str]

    @abc.abstractmethod
    async def read(self, limit: int | None = None) -> bytes: ...

    @abc.abstractmethod
    def lines(self) -> AsyncIterator[bytes]: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the connection (safe to call twice; safe after read())."""


class Transport(abc.ABC):
    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def open(self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None,
                   connect_timeout_s: float) -> UpstreamResponse: ...

    @abc.abstractmethod
    async def aclose(self) -> None: ...


class _AiohttpResponse(UpstreamResponse):
    __slots__ = ("_resp", "status", "headers")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    async def read(self, limit: int | None = None) -> bytes:
        try:
            if limit is None:
                data = await self._resp.read()
            else:
                data = await self._read_at_most(limit)
        except (aiohttp.ClientError, OSError) as exc:
            self._resp.close()
            raise ConnectFailed(f"connection broke while reading the body: {_reason(exc)}") from exc
        self._resp.release()  # body complete: the connection goes back to the pool
        return data

    async def _read_at_most(self, limit: int) -> bytes:
        buf = bytearray()
        content = self._resp.content
        while True:
            chunk = await content.readany()
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > limit:
                self._resp.close()
                raise BodyTooLarge(limit, bytes(buf[:limit]))

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines, each with its line end: CRLF, LF or a bare CR, as SSE defines them (WHATWG HTML, event
        stream interpretation), so an empty line is b"\r", b"\n" or b"\r\n", never b""; the last line may have
        none. aiohttp's readline() ended a line at LF only: a stream whose lines end in bare CRs read as one line
        (no data line in it: 502 invalid_response, or one past its limit), where the eval (evals/client.py
        _sse_lines) read it line by line and passed it. A line is yielded as soon as its end arrives; a CR that
        ends a chunk ends its line then, and an LF that starts the next chunk is that CRLF's end, not an empty line
        (which ends an event)."""
        content = self._resp.content
        pending: list[bytes] = []  # the line being read, in pieces (joined once it ends)
        pending_len = 0
        after_cr = False  # the last chunk ended with a CR: an LF first in this one belongs to it
        while True:
            try:
                chunk = await content.readany()
            except (aiohttp.ClientError, OSError) as exc:
                raise ConnectFailed(f"connection broke mid-stream: {_reason(exc)}") from exc
            except (HttpProcessingError, ValueError) as exc:
                # the payload parser's own errors: a broken upstream like any other, not a gateway error that
                # escapes the chain as a 500
                raise ConnectFailed(f"unreadable stream: {type(exc).__name__}: {str(exc)[:200]}") from exc
            if not chunk:
                if pending:
                    yield b"".join(pending)
                return
            start = 1 if after_cr and chunk[0] == 0x0A else 0
            end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1  # just past the chunk's last line end
            if end <= start:  # no line end (but that LF): the line goes on
                after_cr = False
                if len(chunk) > start:
                    pending.append(chunk[start:] if start else chunk)
                    pending_len += len(chunk) - start
                    if pending_len > MAX_LINE:
                        raise ConnectFailed(f"unreadable stream: a line over {MAX_LINE} bytes")
                continue
            after_cr = chunk[end - 1] == 0x0D
            found = _LINE.findall(chunk, start, end)
            if pending:
                pending.append(found[0])
                found[0] = b"".join(pending)
            if pending_len + end - start > MAX_LINE and max(map(len, found)) > MAX_LINE:
                raise ConnectFailed(f"unreadable stream: a line over {MAX_LINE} bytes")
            pending_len = len(chunk) - end
            pending = [chunk[end:]] if pending_len else []
            if pending_len > MAX_LINE:
                raise ConnectFailed(f"unreadable stream: a line over {MAX_LINE} bytes")
            for line in found:
                yield line

    def close(self) -> None:
        self._resp.close()


# how long an idle pooled connection may wait to be reused: below uvicorn's (and so vLLM's) 5 s keep-alive default,
# so the gateway does not send a request on a connection the upstream is closing as idle (module docstring)
POOL_IDLE_S = 4.0


class AiohttpTransport(Transport):
    """One shared aiohttp.ClientSession for the life of the gateway."""

    def __init__(self, max_connections: int = 1024, *, pool_idle_s: float = POOL_IDLE_S) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if not pool_idle_s > 0:
            raise ValueError(f"pool_idle_s must be > 0, got {pool_idle_s}")
        self.max_connections = max_connections
        self.pool_idle_s = pool_idle_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300,
                                             keepalive_timeout=self.pool_idle_s)
            trace = aiohttp.TraceConfig()  # marks a caller's ConnectWatch (a new connection, TLS done, or a pooled one)
            trace.on_connection_create_end.append(_on_connected)
            trace.on_connection_reuseconn.append(_on_connected)
            # No session-wide timeout: every call passes its own (a hang must never outlive its budget).
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                                  raise_for_status=False, cookie_jar=aiohttp.DummyCookieJar(),
                                                  trace_configs=[trace])

    async def open(self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None,
                   connect_timeout_s: float) -> UpstreamResponse:
        if self._session is None:
            raise RuntimeError("transport not started (call await transport.start())")
        # connect: DNS, the pool and the handshake together (sock_connect alone left a resolver that does not
        # answer to the caller's first-token budget); sock_connect: each address tried
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s)
        watch = CONNECT_WATCH.get()
        if watch is not None:
            watch.connected = False
        try:
            follow = method == "GET" and body is None
            # aiohttp's own following would take headers such as api-key to whatever origin Location names
            resp = await self._session.request(method, url, data=body, headers=headers, timeout=timeout,
                                               allow_redirects=follow and not headers, trace_request_ctx=watch)
            if follow and headers:
                hops = 0
                while resp.status in _REDIRECTS and hops < _MAX_REDIRECTS:
                    try:
                        target = resp.url.join(URL(resp.headers["Location"]))
                    except (KeyError, ValueError):  # no Location, or one that is no URL: the 3xx is the answer
                        break
                    if not same_origin(str(target), url):
                        break  # elsewhere: the 3xx is the answer, the headers stay home
                    resp.close()
                    hops += 1
                    resp = await self._session.request(method, target, headers=headers, timeout=timeout,
                                                       allow_redirects=False)
        except aiohttp.ConnectionTimeoutError as exc:
            raise ConnectTimeout(_redacted(f"connect to {url} timed out after {connect_timeout_s:g} s", url)) from exc
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, DNS, server closed the socket
            raise ConnectFailed(_redacted(f"{method} {url}: {_reason(exc)}", url)) from exc
        except UnicodeError as exc:
            # a host name the resolver cannot encode (an empty label, one over 63 characters: getaddrinfo's IDNA
            # step), e.g. a redirect's Location: no connection, as a DNS failure is (it escaped as a ValueError)
            raise ConnectFailed(_redacted(f"{method} {url}: unusable host name: {exc}", url)) from exc
        return _AiohttpResponse(resp)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
