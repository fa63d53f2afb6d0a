"""Request body limit (413) and security headers (with ``Cache-Control: no-store`` on everything but
/static), as plain ASGI middleware.

The body limit is checked twice: against Content-Length before the app runs, and against the bytes
actually received (a chunked upload has no Content-Length), so no route ever buffers more than
``max_bytes``.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from starlette.responses import PlainTextResponse

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'"),
]


class _TooLarge(HTTPException):
    # an HTTPException so FastAPI's body parser re-raises it as is (it turns other errors into 400)
    def __init__(self, max_bytes: int):
        super().__init__(413, f"request body over the {max_bytes}-byte limit")


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = True
                if too_big:
                    return await self._reject(scope, receive, send)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await self._reject(scope, receive, send)

    async def _reject(self, scope, receive, send) -> None:
        response = PlainTextResponse(f"request body over the {self.max_bytes}-byte limit", status_code=413,
                                     headers={"connection": "close"})
        await response(scope, receive, send)


class SecurityHeaders:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        # pages show decrypted user text: no browser or proxy may keep a copy (Back after logout must not
        # show the chat). Only the static files may be cached.
        cacheable = scope.get("path", "").startswith("/static/")

        async def with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", [])) + SECURITY_HEADERS
                if not cacheable and not any(name.lower() == b"cache-control" for name, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)
