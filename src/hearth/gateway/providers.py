"""One OpenAI-compatible chat provider: build the request, time every phase, parse, check the envelope.

A provider is a ProviderConfig plus the shared Transport; there is no per-vendor subclass (vendor
differences are data: extra_body, headers, json_schema).

Timing of one attempt (all in seconds, against time.monotonic):
    limit      = min(timeouts.total_s, budget_s)          budget_s: what is left of the request deadline
    connect    <= timeouts.connect_s                       -> Timeout("connect") (also when the first-token or total
               timer below runs out while still connecting)
    headers    <= min(timeouts.first_token_s, limit)       -> Timeout("first_token") (JSON: the reply's
               headers; SSE: the first non-empty content delta)
    the rest   <= limit                                    -> Timeout("total")
When budget_s is the binding limit the error is DeadlineExceeded instead, so a log says whose budget ran out.
A stream's clock stops while the gateway delivers a delta to its own client (ChatStream.away: the chain's
generator is suspended at its yield while the server writes, up to stream_write_timeout_s per write): the limit
measures the provider, so a slow client never ends a healthy stream as the provider's timeout (which counted
toward its breaker). The request deadline part of the limit stops with it: once a delta is shown there is no
fallback, so it bounds only this attempt's waits on the provider; the client's own pace is bounded by
stream_write_timeout_s per write (and the reply by MAX_REPLY_CHARS).
On any early exit the response is closed, which drops the connection rather than re-pooling it.
The caller's request id goes upstream as X-Request-ID, so provider logs can be joined with ours.

Usage: the provider's token counts (prompt_tokens, completion_tokens, total_tokens) are read from its reply:
the JSON reply's `usage`; for SSE the request asks for them (stream_options.include_usage, unless the
provider's extra_body sets stream_options itself) and the stream's last chunk that carries a `usage` object
gives them (OpenAI and vLLM send it after the finish_reason, with empty choices). None when the provider
reported none or nothing usable: the gateway never makes counts up.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Awaitable, TypeVar

from multidict import CIMultiDict
from pydantic import BaseModel

from hearth import envelope as env
from hearth.gateway.config import ProviderConfig
from hearth.gateway.errors import (
    ConnectionFailed, DeadlineExceeded, InvalidEnvelope, InvalidResponse, ProviderError, Timeout, UpstreamStatus,
)
from hearth.gateway.transport.client import (
    CONNECT_WATCH, BodyTooLarge, ConnectFailed, ConnectTimeout, ConnectWatch, Transport, UpstreamResponse,
)

T = TypeVar("T")
_MAX_ERROR_BODY = 2000
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark
# The most of a JSON reply body read: the envelope is at most MAX_REPLY_CHARS (64,000) characters, which JSON
# escaping (\uXXXX, surrogate pairs) can make ~12 times as many bytes; the rest of a chat completion is small. A
# larger body is no usable reply: it fails as an InvalidResponse when it gets there, not buffered whole until
# total_s (a broken upstream sending without end filled memory at loopback/LAN speed).
MAX_REPLY_BYTES = 8 * 1024 * 1024
_ERROR_BODY_BYTES = 64 * 1024  # of an error reply, only the first _MAX_ERROR_BODY characters are kept
# One compact encoder for request bodies (json.dumps with separators builds a new one per call).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True)
class Completion:
    envelope: BaseModel
    text: str
    finish_reason: str | None
    usage: dict[str, int] | None = None   # the provider's token counts (parse_usage), None when it sent none


_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def parse_usage(usage: Any) -> dict[str, int] | None:
    """An upstream `usage` object as {"prompt_tokens", "completion_tokens", "total_tokens"}, or None when it is
    absent or unusable (not an object, a count missing or not a non-negative integer). A missing total_tokens
    is the sum of the two counts (OpenAI defines it so); nothing else is ever filled in."""
    if not isinstance(usage, dict):
        return None
    counts = {k: usage.get(k) for k in _USAGE_KEYS}
    if counts["total_tokens"] is None:
        counts["total_tokens"] = _sum(counts["prompt_tokens"], counts["completion_tokens"])
    if not all(type(v) is int and v >= 0 for v in counts.values()):  # type(): True is no count
        return None
    return counts


def _sum(a: Any, b: Any) -> int | None:
    return a + b if type(a) is int and type(b) is int else None


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP-date; None when absent or unparsable (a number
    that is not finite, e.g. "inf" or "nan", included: it is no delta-seconds, and it broke the arithmetic; a date
    whose year overflows a C long, which email.utils raises as OverflowError, included: it escaped the chain as the
    gateway's own error instead of the provider's failure)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


class _Clock:
    """Deadlines of one attempt; turns an expired await into the right ProviderError."""

    __slots__ = ("provider", "start", "limit", "deadline_bound", "first_token_s")

    def __init__(self, p: ProviderConfig, budget_s: float) -> None:
        self.provider = p.name
        self.start = time.monotonic()
        self.deadline_bound = budget_s < p.timeouts.total_s
        self.limit = min(p.timeouts.total_s, budget_s)
        self.first_token_s = p.timeouts.first_token_s

    def expired(self, phase: str) -> ProviderError:
        elapsed = time.monotonic() - self.start
        if phase == "first_token" and self.first_token_s < self.limit:
            return Timeout(self.provider, "first_token", self.first_token_s)
        if self.deadline_bound:
            return DeadlineExceeded(self.provider, self.limit)
        return Timeout(self.provider, "total", max(elapsed, self.limit))

    def left(self) -> float:
        return self.limit - (time.monotonic() - self.start)

    def exclude(self, seconds: float) -> None:
        """Stop counting `seconds` that were not spent waiting on the provider."""
        self.start += seconds

    def first_token_left(self) -> float:
        return min(self.first_token_s, self.limit) - (time.monotonic() - self.start)

    async def within(self, aw: Awaitable[T], seconds: float, phase: str) -> T:
        if seconds <= 0:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise self.expired(phase)
        try:
            async with asyncio.timeout(seconds):
                return await aw
        except TimeoutError:
            raise self.expired(phase) from None


class Provider:
    """Sends chat requests for one configured provider over the shared transport."""

    def __init__(self, config: ProviderConfig, transport: Transport) -> None:
        self.config = config
        self.name = config.name
        self.transport = transport
        # case-insensitive, as header names are: a provider header named like one of ours ("content-type") replaces
        # it instead of going out beside it or losing to it by dict order
        headers = CIMultiDict({"Content-Type": "application/json", "Accept": "application/json"})
        headers.update(config.own_headers)
        self._headers = headers
        # Building a JSON Schema costs far more than the rest of a request: do it once per kind.
        self._response_formats = {k: env.response_format(k) for k in env.REPLY_KINDS} if config.json_schema else {}

    # ------------------------------------------------------------------ request
    def body(self, messages: list[dict], kind: str, *, max_tokens: int | None, stream: bool) -> bytes:
        body: dict[str, Any] = dict(self.config.extra_body)
        body["model"] = self.config.model
        body["messages"] = messages
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if self.config.json_schema:
            body["response_format"] = self._response_formats[kind]
        if stream:
            body["stream"] = True
            # ask for the usage chunk (OpenAI, vLLM); a provider's extra_body stream_options wins (a server that
            # refuses the option is configured with stream_options = { include_usage = false })
            options = body.get("stream_options")
            if options is None:
                body["stream_options"] = {"include_usage": True}
            elif isinstance(options, dict) and "include_usage" not in options:
                body["stream_options"] = {**options, "include_usage": True}
        else:
            # stream_options belongs to streaming requests only: vLLM and OpenAI refuse it on any other (a 400), so
            # an extra_body stream_options (the documented switch for a server that refuses include_usage) failed
            # every JSON request to the provider
            body.pop("stream_options", None)
        return _COMPACT.encode(body).encode()

    async def _open(self, clock: _Clock, body: bytes, stream: bool, request_id: str | None) -> UpstreamResponse:
        headers = self._headers
        if stream or request_id:
            headers = headers.copy()  # the request's own (an SSE Accept, its id) win over the provider's
            if stream:
                headers["Accept"] = "text/event-stream"
            if request_id:
                headers["X-Request-ID"] = request_id
        connect_s = min(self.config.timeouts.connect_s, max(clock.left(), 1e-3))
        # the connect runs inside the first-token window: when that timer (or total_s) runs out first (connect_s >=
        # first_token_s) while the transport is still connecting, it is the connect that ran out, not the first token
        watch = ConnectWatch()
        reset = CONNECT_WATCH.set(watch)
        try:
            resp = await clock.within(
                self.transport.open("POST", self.config.chat_url, headers=headers, body=body, connect_timeout_s=connect_s),
                clock.first_token_left(), "first_token")
        except ConnectTimeout:
            raise Timeout(self.name, "connect", connect_s) from None
        except Timeout as exc:
            if watch.connected is False:
                raise Timeout(self.name, "connect", exc.after_s) from None
            raise
        except ConnectFailed as exc:
            raise ConnectionFailed(self.name, str(exc)) from exc
        finally:
            CONNECT_WATCH.reset(reset)
        if not 200 <= resp.status < 300:
            try:
                raw = await clock.within(resp.read(_ERROR_BODY_BYTES), min(clock.left(), 1.0), "total")
            except BodyTooLarge as exc:
                raw = exc.head
            except (ProviderError, ConnectFailed):
                raw = b""
            finally:
                resp.close()
            raise UpstreamStatus(self.name, resp.status, parse_retry_after(resp.headers.get("Retry-After")),
                                 raw[:_MAX_ERROR_BODY].decode("utf-8", "replace"))
        return resp

    # ------------------------------------------------------------------ JSON
    async def complete(self, messages: list[dict], kind: str, *, budget_s: float,
                       max_tokens: int | None = None, request_id: str | None = None) -> Completion:
        """One non-streaming attempt. Raises a ProviderError subclass; never anything else on purpose."""
        clock = _Clock(self.config, budget_s)
        resp = await self._open(clock, self.body(messages, kind, max_tokens=max_tokens, stream=False), False, request_id)
        try:
            raw = await clock.within(resp.read(MAX_REPLY_BYTES), clock.left(), "total")
        except BodyTooLarge:
            raise InvalidResponse(self.name, f"the reply is larger than {MAX_REPLY_BYTES} bytes") from None
        except ConnectFailed as exc:
            raise ConnectionFailed(self.name, str(exc)) from exc
        finally:
            resp.close()
        text, finish, usage = self._message(raw)
        return Completion(self._envelope(text, kind, finish), text, finish, usage)

    def _message(self, raw: bytes) -> tuple[str, str | None, dict[str, int] | None]:
        try:
            doc = json.loads(raw)
            usage = parse_usage(doc.get("usage"))
            choice = doc["choices"][0]
            content = choice["message"].get("content")
            finish = choice.get("finish_reason")
        # RecursionError: JSON nested deeper than the decoder's stack (a broken upstream); a failure like any other
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
            raise InvalidResponse(self.name, f"not a chat completion ({exc.__class__.__name__}): "
                                             f"{raw[:200].decode('utf-8', 'replace')!r}") from None
        if content is not None and not isinstance(content, str):
            raise InvalidResponse(self.name, f"message.content is {type(content).__name__}, not a string")
        return content or "", finish, usage

    def _envelope(self, text: str, kind: str, finish: str | None) -> BaseModel:
        try:
            return env.parse_envelope(text, kind)
        except env.EnvelopeError as exc:
            raise InvalidEnvelope(self.name, exc, finish) from exc

    # ------------------------------------------------------------------ SSE
    async def open_stream(self, messages: list[dict], kind: str, *, budget_s: float,
                          max_tokens: int | None = None, request_id: str | None = None) -> tuple["ChatStream", str]:
        """Start a streaming attempt and wait for its first non-empty content delta.

        Returns (stream, first_delta). Everything that can fail before the first byte reaches the
        client fails here, so the chain can still fall back.
        """
        clock = _Clock(self.config, budget_s)
        resp = await self._open(clock, self.body(messages, kind, max_tokens=max_tokens, stream=True), True, request_id)
        stream = ChatStream(self, resp, clock)
        try:
            first = await stream.next_delta(phase="first_token")
        except BaseException:
            stream.close()
            raise
        if first is None:
            stream.close()
            self._envelope("", kind, stream.finish_reason)  # raises InvalidEnvelope: empty reply
            raise InvalidResponse(self.name, "stream ended without content")  # pragma: no cover
        return stream, first


class ChatStream:
    """An open SSE chat stream. next_delta() -> text, or None at the end; raises ProviderError."""

    def __init__(self, provider: Provider, resp: UpstreamResponse, clock: _Clock) -> None:
        self.provider = provider
        self._resp = resp
        self._lines = resp.lines()
        self._first = True  # no line read yet: SSE strips one BOM at the start of the stream (next_delta)
        self._clock = clock
        self.finish_reason: str | None = None
        self.usage: dict[str, int] | None = None   # from the last chunk carrying a usable `usage` (parse_usage)
        self._done = False

    async def next_delta(self, phase: str = "total") -> str | None:
        name = self.provider.name
        # While streaming, first_token_s also bounds the gap between two deltas: a stall ends the stream. The gap
        # runs from this call, not from the last line: keep-alive comments and empty (or reasoning-only) deltas
        # carry no content and must not keep a stalled stream open until total_s.
        idle_until = time.monotonic() + self.provider.config.timeouts.first_token_s
        while not self._done:
            if phase == "total":
                gap, left = idle_until - time.monotonic(), self._clock.left()
                wait, kind = (gap, "first_token") if gap < left else (left, "total")
            else:
                wait, kind = self._clock.first_token_left(), "first_token"
            try:
                line = await self._clock.within(anext(self._lines, b""), wait, kind)
            except (ConnectFailed, ProviderError) as exc:
                if self.finish_reason is not None:
                    # the reply's final chunk came: only [DONE] (and maybe the usage chunk) is missing, and an
                    # upstream that stalls or drops the connection there ends the reply as a clean EOF does
                    self._done = True
                    return None
                if isinstance(exc, ConnectFailed):
                    raise ConnectionFailed(name, str(exc)) from exc
                raise
            if not line:
                self._done = True
                if self.finish_reason is None:  # no final chunk and no [DONE]: the stream was cut short
                    raise ConnectionFailed(name, "the stream ended without a finish_reason or [DONE] (cut short)")
                return None
            if self._first:
                self._first = False
                if line.startswith(_BOM):  # a BOM at the start of the stream (only there) is no part of it
                    line = line[3:]
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # comments, event names, blank separators
            data = line[5:].strip()
            if data == b"[DONE]":
                self._done = True
                return None
            try:
                # the data's UTF-8 text, as the eval reads it (evals/client.py): json.loads of the bytes skipped a
                # BOM before the JSON, read UTF-16 and UTF-32 and let encoded surrogates through (surrogatepass)
                doc = json.loads(data.decode("utf-8"))
                usage = parse_usage(doc.get("usage"))  # the usage chunk; "usage": null on the others
                if usage is not None:
                    self.usage = usage
                choices = doc["choices"]
                if isinstance(choices, list) and not choices:
                    # a chunk for no choice: Azure's prompt_filter_results first chunk, the usage chunk of
                    # stream_options.include_usage; it carries no text (and no finish_reason)
                    continue
                choice = choices[0]
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
            except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
                raise InvalidResponse(name, f"bad SSE event: {data[:200].decode('utf-8', 'replace')!r}") from None
            if not isinstance(text, str):  # as message.content in a JSON reply: the chain joins deltas as text
                raise InvalidResponse(name, f"delta.content is {type(text).__name__}, not a string")
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if text:
                return text
        return None

    def away(self, seconds: float) -> None:
        """The caller spent `seconds` elsewhere (delivering a delta to its client): not the provider's time."""
        self._clock.exclude(seconds)

    def envelope(self, text: str, kind: str) -> BaseModel:
        return self.provider._envelope(text, kind, self.finish_reason)

    def close(self) -> None:
        self._resp.close()
