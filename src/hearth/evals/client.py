"""The eval's one exit point to a model: POST {base_url}/chat/completions on any OpenAI-compatible server.

Small on purpose: one shared httpx.AsyncClient, a hard wall-clock timeout per call (a fallback can
fall through an error but not through a hang, so every call has one), and a result that keeps the
status code and finish_reason instead of flattening them into a string.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class ChatResult:
    """Outcome of one call.

    content:       the assistant message text ("" when there is none).
    finish_reason: as the server reported it (None when missing or on error).
    status:        HTTP status code, or None when no response arrived (timeout, connection error).
    error:         why the call failed at the transport/HTTP level, or None when a 200 with a message came back.
    latency_s:     wall-clock seconds from sending to the full response (or to the failure).
    ttft_s:        streaming only: seconds from sending to the first content token (None: none came, or not streamed).
    usage:         the server's token usage ({"prompt_tokens", "completion_tokens", ...}) when it sent one.
    provider:      hearth's gateway only: the provider that answered (its X-Hearth-Provider header).
    attempts:      hearth's gateway only: [provider, outcome] per provider tried or skipped, "ok" last (its
                   "hearth" block): more than one means the reply came after a fallback.
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


def _error_message(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        payload = None
    # OpenAI sends {"error": {"message": ...}}; proxies also send {"error": "text"} or {"error": null}
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return f"HTTP {response.status_code}" + (f": {str(message)[:200]}" if message else "")


async def chat_completion(client: httpx.AsyncClient, base_url: str, body: dict, *, timeout_s: float,
                          api_key: str | None = None, headers: dict[str, str] | None = None) -> ChatResult:
    """One chat completion, streamed when body["stream"] is true, with ``headers`` added to the request. Never raises
    for server or network trouble: the failure is in ``ChatResult.error`` (with ``status`` when the server answered)."""
    headers = {**(headers or {}), **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    url = base_url.rstrip("/") + "/chat/completions"
    start = time.perf_counter()

    def done(content="", finish=None, status=None, error=None, ttft=None, usage=None, response=None,
             attempts=None) -> ChatResult:
        provider = response.headers.get("x-hearth-provider") if response is not None else None
        return ChatResult(content, finish, status, error, time.perf_counter() - start, ttft, usage, provider, attempts)

    if body.get("stream"):
        return await _stream(client, url, body, headers, timeout_s, start, done)
    try:
        async with asyncio.timeout(timeout_s):  # wall clock: also bounds a server that drips bytes
            response = await client.post(url, json=body, headers=headers, timeout=timeout_s)
    except TimeoutError:
        return done(error=f"timeout after {timeout_s:g}s")
    except httpx.TimeoutException:
        return done(error=f"timeout after {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return done(error=f"{type(exc).__name__}: {str(exc)[:200] or 'connection failed'}")
    if response.status_code != 200:
        return done(status=response.status_code, error=_error_message(response), response=response)
    return _completion(response, done)


def _completion(response: httpx.Response, done) -> ChatResult:
    """A 200 JSON chat completion -> ChatResult (malformed ones are an error, not a crash)."""
    try:
        payload = response.json()
        choice = payload["choices"][0]
        content = choice["message"].get("content")
        finish = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return done(status=200, error=f"malformed completion: {response.text[:200]!r}", response=response)
    attempts = _attempts(payload)
    if content is not None and not isinstance(content, str):  # refused by the gateway too: not a reply the app gets
        return done(status=200, finish=finish, error=f"message.content is {type(content).__name__}, not a string",
                    response=response, attempts=attempts)
    content = content or ""
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else None
    return done(content=content, finish=finish, status=200, usage=usage, response=response, attempts=attempts)


def _attempts(payload) -> list | None:
    """The attempts hearth's gateway lists in a reply's (or the last stream chunk's) "hearth" block, or None."""
    hearth = payload.get("hearth") if isinstance(payload, dict) else None
    attempts = hearth.get("attempts") if isinstance(hearth, dict) else None
    return attempts if isinstance(attempts, list) else None


async def _stream(client, url, body, headers, timeout_s, start, done) -> ChatResult:
    """A streamed completion (SSE): content deltas joined, the time of the first one, the usage chunk
    (asked for with stream_options.include_usage) and the last finish_reason."""
    parts: list[str] = []
    finish = usage = ttft = attempts = response = None
    ended = False  # [DONE] seen
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body, headers=headers, timeout=timeout_s) as response:
                if response.status_code != 200:
                    await response.aread()
                    return done(status=response.status_code, error=_error_message(response), response=response)
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    await response.aread()  # a server that answered in one piece after all
                    return _completion(response, done)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        ended = True
                        break
                    try:
                        chunk = json.loads(data)
                        error = _chunk_error(chunk)
                        if error is not None:  # the server's way to fail mid-stream
                            message = error.get("message") if isinstance(error, dict) else error
                            return done(content="".join(parts), status=200, ttft=ttft, usage=usage,
                                        error=f"error in stream: {str(message)[:200]}", response=response)
                        choices = _chunk_choices(chunk)
                    except (ValueError, RecursionError):
                        return done(status=200, error=f"malformed stream chunk: {data[:200]!r}", response=response)
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    attempts = _attempts(chunk) or attempts
                    for choice, piece in choices:
                        if piece:
                            if ttft is None:
                                ttft = time.perf_counter() - start
                            parts.append(piece)
                        finish = choice.get("finish_reason") or finish
    except (TimeoutError, httpx.TimeoutException):
        return done(error=f"timeout after {timeout_s:g}s", ttft=ttft)
    except httpx.HTTPError as exc:
        return done(error=f"{type(exc).__name__}: {str(exc)[:200] or 'connection failed'}", ttft=ttft)
    if not ended and finish is None:  # the body ended with neither end marker: the gateway refuses this too
        return done(content="".join(parts), status=200, ttft=ttft, usage=usage, response=response, attempts=attempts,
                    error="stream ended without a finish_reason or [DONE] (cut short)")
    return done(content="".join(parts), finish=finish, status=200, ttft=ttft, usage=usage, response=response,
                attempts=attempts)


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
