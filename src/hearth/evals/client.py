"""The eval's one exit point to a model: POST {base_url}/chat/completions on any OpenAI-compatible server.

Small on purpose: one shared httpx.AsyncClient, a hard wall-clock timeout per call (a fallback can
fall through an error but not through a hang, so every call has one), and a result that keeps the
status code and finish_reason instead of flattening them into a string.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import re
import time
from contextlib import aclosing
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class ChatResult:
    """Outcome of one call.

    content:       the assistant message text ("" when there is none).
    finish_reason: as the server reported it (None when missing or on error).
    status:        HTTP status code, or None when no response arrived (timeout, connection error).
    error:         why the call failed at the transport/HTTP level, or None when a 2xx with a message came back.
    latency_s:     wall-clock seconds from sending to the full response (or to the failure; for a stream that stalled
                   or broke after its final chunk, to that chunk).
    ttft_s:        streaming only: seconds from sending to the first content token (None: none came, or not streamed).
    usage:         the server's token usage ({"prompt_tokens", "completion_tokens", ...}) when it sent one.
    provider:      hearth's gateway only: the provider that answered (its X-Hearth-Provider header; for a stream
                   it ended with a stream_interrupted error event, the provider that event names).
    attempts:      hearth's gateway only: [provider, outcome] per provider tried or skipped, "ok" last (its
                   "hearth" block): more than one means the reply came after a fallback. On an error the gateway
                   sends when every provider failed, the providers' failures (no "ok"); on its stream_interrupted
                   event, that event's attempts, else [[provider, "stream_interrupted"]].
    reasoning:     the reasoning the server sent apart from the content (message or delta reasoning_content /
                   reasoning: vLLM's reasoning parser), joined; None when it sent none.
    """

    content: str
    finish_reason: str | None
    status: int | None
    error: str | None
    latency_s: float
    ttft_s: float | None = None
    usage: dict | None = None
    provider: str | None = None
    attempts: list | None = None
    reasoning: str | None = None


# What the client reads of a body, at most: an error body (HTTP status not 2xx) up to ERROR_BODY_CAP, a
# one-piece JSON reply up to REPLY_BODY_CAP (the gateway's own caps on what it reads from a provider). A body that
# does not end is not read into memory until the timeout.
ERROR_BODY_CAP = 64 * 1024
REPLY_BODY_CAP = 8 * 1024 * 1024
# A stream is read as it comes, and bounded the same way: the content and reasoning it keeps up to REPLY_BODY_CAP
# (UTF-8 bytes), one SSE line up to REPLY_BODY_CAP, and the bytes read (after any content-encoding) up to
# STREAM_BYTES_CAP. That last one only bounds the work (nothing but the line being read is held), and is larger:
# streamed a token a chunk, a reply costs ~200 bytes of SSE per token (a 32k-token reply, ~7 MB), where the same
# reply in one piece is ~4 bytes a token. Over a cap the reply fails with its status and the first ERROR_BODY_CAP
# characters of what came.
STREAM_BYTES_CAP = 4 * REPLY_BODY_CAP
_LINE_END = re.compile(r"\r\n|\r|\n")  # SSE's line ends (not str.splitlines': U+2028 in a JSON string is no end)
# what a byte that is not UTF-8 decodes to with errors="surrogateescape" (_sse_lines); nothing UTF-8 decodes to these
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
# what hearth's gateway strips from an SSE line and from its data (bytes.strip: ASCII whitespace only); str.strip
# strips more (a no-break space, U+001C..U+001F, U+2028), reading lines the gateway skips or refuses
_SSE_SPACE = " \t\n\r\x0b\x0c"


class _TooLarge(Exception):
    """A body over its cap (its size in words is the message)."""


async def _read_capped(response: httpx.Response, cap: int, words: str) -> bytes:
    """The (decoded) body, at most ``cap`` bytes; _TooLarge when there is more. The caller bounds it in time."""
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > cap and not response.headers.get("content-encoding"):
        raise _TooLarge(words)  # said up front: nothing to read
    data = bytearray()
    async for piece in response.aiter_bytes():
        data += piece
        if len(data) > cap:
            raise _TooLarge(words)
    return bytes(data)


def _json(raw: bytes):
    """The JSON document of a body, or None when it is not one."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _error_message(status: int, payload) -> str:
    # OpenAI sends {"error": {"message": ...}}; proxies also send {"error": "text"} or {"error": null}
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    failed = _failed_attempts(payload)
    tried = f" ({', '.join(f'{name}: {outcome}' for name, outcome in failed)})" if failed else ""
    return f"HTTP {status}" + (f": {str(message)[:200]}" if message else "") + tried


def _failed_attempts(payload) -> list | None:
    """hearth's gateway only: [provider, outcome] of each provider that failed, from the error.failures list of its
    error body when every provider failed (gateway/server.py _failure: 502, 504, 503, 429, or a refused request's
    4xx); None for any other body. The outcome is the failure's label ("invalid_envelope", "status_500",
    "timeout_first_token", "cooldown", ...) as in a reply's attempts, else its error class."""
    error = payload.get("error") if isinstance(payload, dict) else None
    failures = error.get("failures") if isinstance(error, dict) else None
    if not isinstance(failures, list) or not failures:
        return None
    attempts = []
    for f in failures:
        if not isinstance(f, dict) or not isinstance(f.get("provider"), str):
            return None  # not the gateway's shape: read as any other error body
        outcome = f.get("label") if isinstance(f.get("label"), str) else f.get("error")
        attempts.append([f["provider"], str(outcome) if outcome is not None else "failed"])
    return attempts


async def _error_result(response: httpx.Response, deadline: float, timeout_s: float, done) -> ChatResult:
    """A non-2xx answer: its status, and what its body says, read until the call's deadline and up to
    ERROR_BODY_CAP. A body that drips or never ends still gives the status (it is not a timeout: the server
    answered)."""
    status = response.status_code
    try:
        async with asyncio.timeout_at(deadline):
            raw = await _read_capped(response, ERROR_BODY_CAP, f"{ERROR_BODY_CAP // 1024} KiB")
    except (TimeoutError, httpx.TimeoutException):
        return done(status=status, error=f"HTTP {status} (error body not complete after {timeout_s:g}s)",
                    response=response)
    except _TooLarge as exc:
        return done(status=status, error=f"HTTP {status} (error body over {exc}, not read)", response=response)
    except httpx.HTTPError as exc:
        return done(status=status, error=f"HTTP {status} (error body cut short: {type(exc).__name__})",
                    response=response)
    payload = _json(raw)
    return done(status=status, error=_error_message(status, payload), response=response,
                attempts=_failed_attempts(payload))


async def chat_completion(client: httpx.AsyncClient, base_url: str, body: dict, *, timeout_s: float,
                          api_key: str | None = None, headers: dict[str, str] | None = None) -> ChatResult:
    """One chat completion, streamed when body["stream"] is true, with ``headers`` added to the request. Never raises
    for server or network trouble: the failure is in ``ChatResult.error`` (with ``status`` when the server answered).

    Everything, the body included, within ``timeout_s`` of wall clock (a server that drips bytes too); bodies are
    read up to a cap (ERROR_BODY_CAP, REPLY_BODY_CAP; a stream as it comes, its content and each line up to
    REPLY_BODY_CAP, its bytes up to STREAM_BYTES_CAP)."""
    headers = {**(headers or {}), **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    url = base_url.rstrip("/") + "/chat/completions"
    start = time.perf_counter()
    deadline = asyncio.get_running_loop().time() + timeout_s
    timed_out = f"timeout after {timeout_s:g}s"

    def done(content="", finish=None, status=None, error=None, ttft=None, usage=None, response=None,
             attempts=None, reasoning=None, provider=None, end=None) -> ChatResult:
        if provider is None and response is not None:  # given: named by the body (a gateway's error event)
            provider = response.headers.get("x-hearth-provider")
        latency = (time.perf_counter() if end is None else end) - start  # end: when the reply ended, if not now
        return ChatResult(content, finish, status, error, latency, ttft, usage, provider, attempts, reasoning)

    try:
        async with asyncio.timeout_at(deadline):  # wall clock, to the response's headers
            request = client.build_request("POST", url, json=body, headers=headers, timeout=timeout_s)
            response = await client.send(request, stream=True)
    except (TimeoutError, httpx.TimeoutException):
        return done(error=timed_out)
    except httpx.HTTPError as exc:
        return done(error=f"{type(exc).__name__}: {str(exc)[:200] or 'connection failed'}")
    try:
        # any 2xx is an answer, as hearth's gateway takes it (providers.Provider._open: 200 <= status < 300): a 201
        # or 203 reply the app shows failed the eval ('HTTP 201')
        if not 200 <= response.status_code < 300:
            return await _error_result(response, deadline, timeout_s, done)
        if body.get("stream"):
            # read as SSE whatever the Content-Type says, as hearth's gateway reads the answer to a stream it asked
            # for (providers.ChatStream: "data:" lines, nothing else): a server that ignores "stream": true and
            # answers in one piece fails every streamed chat turn of the app, and SSE sent as text/plain is a reply
            # the app shows (it passed and failed the eval, when the Content-Type chose how to read it)
            return await _stream(response, deadline, timed_out, start, done)
        try:
            async with asyncio.timeout_at(deadline):
                raw = await _read_capped(response, REPLY_BODY_CAP, f"{REPLY_BODY_CAP >> 20} MiB")
        except (TimeoutError, httpx.TimeoutException):
            return done(error=timed_out)
        except _TooLarge as exc:
            return done(status=response.status_code, error=f"reply body over {exc}, not read", response=response)
        except httpx.HTTPError as exc:
            return done(error=f"{type(exc).__name__}: {str(exc)[:200] or 'connection failed'}")
        return _completion(raw, response, done)
    finally:
        try:
            await response.aclose()  # a body left unread closes its connection; nothing is drained
        except httpx.HTTPError:
            pass


def _completion(raw: bytes, response: httpx.Response, done) -> ChatResult:
    """A 2xx JSON chat completion -> ChatResult (malformed ones are an error, not a crash)."""
    status = response.status_code
    try:
        payload = json.loads(raw)
        choice = payload["choices"][0]
        content = choice["message"].get("content")
        finish = choice.get("finish_reason")
    except (ValueError, RecursionError, KeyError, IndexError, TypeError, AttributeError):
        text = raw.decode("utf-8", "replace")
        return done(status=status, error=f"malformed completion: {text[:200]!r}", response=response)
    attempts = _attempts(payload)
    reasoning = _reasoning(choice["message"])
    if content is not None and not isinstance(content, str):  # refused by the gateway too: not a reply the app gets
        return done(status=status, finish=finish, error=f"message.content is {type(content).__name__}, not a string",
                    response=response, attempts=attempts, reasoning=reasoning)
    content = content or ""
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else None
    return done(content=content, finish=finish, status=status, usage=usage, response=response, attempts=attempts,
                reasoning=reasoning)


def _reasoning(message) -> str | None:
    """The reasoning a server sent apart from the content (vLLM's reasoning parser, DeepSeek: reasoning_content;
    newer vLLM, OpenRouter: reasoning) in a message or a stream delta, or None."""
    if not isinstance(message, dict):
        return None
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str):
            return message[key]
    return None


def _attempts(payload) -> list | None:
    """The attempts hearth's gateway lists in a reply's (or the last stream chunk's) "hearth" block, or None."""
    hearth = payload.get("hearth") if isinstance(payload, dict) else None
    attempts = hearth.get("attempts") if isinstance(hearth, dict) else None
    return attempts if isinstance(attempts, list) else None


async def _sse_lines(response: httpx.Response):
    """The lines of an SSE body (line ends: CRLF, CR or LF, as SSE defines them), decoded as they come; _TooLarge
    once more than STREAM_BYTES_CAP bytes were read, or one line runs past REPLY_BODY_CAP characters."""
    # UTF-8 whatever charset the Content-Type names, as hearth's gateway decodes each event (the UTF-8 text of its bytes),
    # and a byte that is not UTF-8 kept as its surrogate escape, so that _stream fails the data line holding it as
    # the gateway does: errors="replace" made it a U+FFFD in a reply that passed, and a charset label mojibake.
    # utf-8-sig: one BOM at the very start of the stream is dropped, as SSE says and the gateway does; anywhere else
    # it is text (a BOM before an event's JSON is malformed, in the gateway too)
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="surrogateescape")
    read = 0
    pending: list[str] = []  # the line being read, in pieces (joined only once it ends)
    pending_len = 0
    after_cr = False  # the text read last ended with a CR: an LF first in the next belongs to it (one CRLF)
    async for piece in response.aiter_bytes():
        read += len(piece)
        if read > STREAM_BYTES_CAP:
            raise _TooLarge(f"stream over {STREAM_BYTES_CAP >> 20} MiB")
        text = decoder.decode(piece)
        if not text:  # the first bytes of a character
            continue
        if after_cr and text[0] == "\n":
            text = text[1:]
        after_cr = text.endswith("\r")
        if "\n" not in text and "\r" not in text:
            pending.append(text)
            pending_len += len(text)
            if pending_len > REPLY_BODY_CAP:
                raise _TooLarge(f"stream line over {REPLY_BODY_CAP >> 20} MiB")
            continue
        *lines, last = _LINE_END.split("".join(pending) + text)
        pending, pending_len = [last], len(last)
        if pending_len > REPLY_BODY_CAP:
            raise _TooLarge(f"stream line over {REPLY_BODY_CAP >> 20} MiB")
        for line in lines:
            yield line
    for line in _LINE_END.split("".join(pending) + decoder.decode(b"", final=True)):
        if line:
            yield line


async def _stream(response: httpx.Response, deadline: float, timed_out: str, start, done) -> ChatResult:
    """A streamed completion (SSE): content deltas joined, the time of the first one, the usage chunk
    (asked for with stream_options.include_usage) and the last finish_reason. Bounded in size as well as time
    (REPLY_BODY_CAP, STREAM_BYTES_CAP)."""
    status = response.status_code
    parts: list[str] = []
    thoughts: list[str] = []
    kept = 0  # UTF-8 bytes of content and reasoning kept
    finish = usage = ttft = attempts = None
    ended = False  # [DONE] seen
    finished = None  # perf_counter when the final chunk (the last finish_reason) was read
    stopped = False  # the stream stalled or broke after it
    events = 0  # data lines read

    def joined(pieces: list[str], cut: bool = False) -> str:
        text = "".join(pieces)
        return text[:ERROR_BODY_CAP] if cut else text

    try:
        async with asyncio.timeout_at(deadline), aclosing(_sse_lines(response)) as lines:
            async for line in lines:
                # stripped first, as the gateway reads a line (providers.ChatStream.next_delta): " data:" is one
                line = line.strip(_SSE_SPACE)
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip(_SSE_SPACE)
                events += 1
                if _NOT_UTF8.search(data):  # the gateway's bad SSE event: an event's bytes are UTF-8 or nothing
                    return done(status=status, error=f"malformed stream chunk (not UTF-8): {ascii(data[:200])}",
                                response=response)
                if data == "[DONE]":
                    ended = True
                    break
                try:
                    chunk = json.loads(data)
                    error = _chunk_error(chunk)
                    if error is not None:  # the server's way to fail mid-stream
                        message = error.get("message") if isinstance(error, dict) else error
                        provider, failed = _interrupted(error)
                        return done(content="".join(parts), status=status, ttft=ttft, usage=usage,
                                    error=f"error in stream: {str(message)[:200]}", response=response,
                                    reasoning="".join(thoughts) if thoughts else None,
                                    provider=provider, attempts=failed)
                    choices = _chunk_choices(chunk)
                except (ValueError, RecursionError):
                    return done(status=status, error=f"malformed stream chunk: {data[:200]!r}", response=response)
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                attempts = _attempts(chunk) or attempts
                for choice, piece in choices:
                    if piece:
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        parts.append(piece)
                        kept += _utf8_len(piece)
                    thought = _reasoning(choice.get("delta"))
                    if thought:
                        thoughts.append(thought)
                        kept += _utf8_len(thought)
                    if choice.get("finish_reason"):
                        finish, finished = choice["finish_reason"], time.perf_counter()
                if kept > REPLY_BODY_CAP:
                    raise _TooLarge(f"streamed reply over {REPLY_BODY_CAP >> 20} MiB (content and reasoning)")
    # A stall or a broken connection once the final chunk (its finish_reason) has come ends the reply as a clean
    # end of the body does: only [DONE] (and maybe the usage chunk) is missing, and hearth's gateway takes the reply
    # there (providers.ChatStream.next_delta), so the app shows and saves it; failing it here failed a reply the app
    # keeps (and threw its content away). Its latency ends at that chunk, the reply's end: the gateway waits only its
    # idle limit (first_token_s) there, the eval its whole timeout, which the latency ran on to.
    except (TimeoutError, httpx.TimeoutException):
        if finish is None:
            return done(error=timed_out, ttft=ttft)
        stopped = True
    except _TooLarge as exc:
        return done(content=joined(parts, cut=True), status=status, ttft=ttft, usage=usage, response=response,
                    attempts=attempts, error=f"{exc}, not read further",
                    reasoning=joined(thoughts, cut=True) if thoughts else None)
    except httpx.HTTPError as exc:
        if finish is None:
            return done(error=f"{type(exc).__name__}: {str(exc)[:200] or 'connection failed'}", ttft=ttft)
        stopped = True
    reasoning = "".join(thoughts) if thoughts else None
    if not ended and finish is None:  # the body ended with neither end marker: the gateway refuses this too
        kind = response.headers.get("content-type", "")
        if not events and "text/event-stream" not in kind:  # not a stream at all: say what came instead
            error = (f"asked for a stream, answered in one piece ({kind or 'no Content-Type'}), not as server-sent "
                     "events: hearth's gateway reads no event in it and fails the reply")
        else:
            error = "stream ended without a finish_reason or [DONE] (cut short)"
        return done(content="".join(parts), status=status, ttft=ttft, usage=usage, response=response, attempts=attempts,
                    error=error, reasoning=reasoning)
    return done(content="".join(parts), finish=finish, status=status, ttft=ttft, usage=usage, response=response,
                attempts=attempts, reasoning=reasoning, end=finished if stopped else None)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _interrupted(error) -> tuple[str | None, list | None]:
    """hearth's gateway only: (provider, attempts) of the error event it ends a stream with when the provider
    streaming it fails after the first delta (gateway/server.py: code "stream_interrupted", its provider named; no
    fallback there, the client already shows that provider's text). attempts: the event's own attempts list when
    it sends one ([provider, outcome] pairs), else [[provider, "stream_interrupted"]]. (None, None) for any other
    error event (other servers', the gateway's own state_store_unavailable / internal_error)."""
    if not isinstance(error, dict) or error.get("code") != "stream_interrupted":
        return None, None
    provider = error.get("provider")
    if not isinstance(provider, str):
        return None, None
    sent = error.get("attempts")
    if (isinstance(sent, list) and sent
            and all(isinstance(a, list) and len(a) == 2 and all(isinstance(x, str) for x in a) for a in sent)):
        return provider, [list(a) for a in sent]
    return provider, [[provider, "stream_interrupted"]]


def _chunk_error(chunk):
    """The error a stream chunk reports, or None: {"error": ...} (OpenAI, vLLM, SGLang, TGI, llama.cpp) or the
    bare {"object": "error", "message": ...} of vLLM's error bodies."""
    if not isinstance(chunk, dict):
        return None
    if chunk.get("error") is not None:
        return chunk["error"]
    return chunk if chunk.get("object") == "error" else None


def _chunk_choices(chunk) -> list[tuple[dict, str | None]]:
    """(choice, content delta) of each choice of a stream chunk; ValueError when it is not shaped like one.
    A chunk needs a choices list (empty for the usage chunk of include_usage), as the gateway requires: one
    without is refused there (providers.py), so it is a failure here, not skipped."""
    if not isinstance(chunk, dict):
        raise ValueError("not an object")
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ValueError("choices is not a list of objects")
    out = []
    for choice in choices:
        delta = choice.get("delta") or {}
        piece = delta.get("content") if isinstance(delta, dict) else None
        if not isinstance(delta, dict) or not isinstance(piece, (str, type(None))):
            raise ValueError("delta is not an object with string content")
        out.append((choice, piece))
    return out
