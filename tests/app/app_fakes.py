"""Test doubles for the app: valid envelopes by kind, an in-process model with the gateway chain's
interface, and a handler for the real-socket fake OpenAI server (tests/fakes/openai_server.py).

Replies are deterministic functions of the request, so tests can assert on them:
    chat          message "Echo: <user text>"; remembers "The user's name is X" when told "my name is X";
                  affection +1, trust +1
    feed_comment  comment "Proud of you for: <post>"
    analyst       the analyst named in the system prompt; reading "<analyst> reads: <situation head>"

and the rows an older version left behind (add_old_format_comments).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from hearth.app import companions as companions_svc
from hearth.app.common import seal
from hearth.app.crypto import UserCipher
from hearth.app.storage.models import Comment, Post, new_id, utcnow
from hearth.envelope import dumps, parse_envelope

_ANALYST = re.compile(r'The "analyst" field must be exactly "([a-z_]+)"')
_NAME = re.compile(r"my name is (\w+)", re.I)


def kind_from_request(body: dict) -> str:
    """Which envelope an OpenAI request body asks for: response_format name, else the system prompt."""
    fmt = body.get("response_format") or {}
    name = (fmt.get("json_schema") or {}).get("name", "")
    if name.startswith("hearth_"):
        return name.removeprefix("hearth_")
    system = body["messages"][0]["content"]
    if _ANALYST.search(system):
        return "analyst"
    if '"comment":' in system:
        return "feed_comment"
    return "chat"


def envelope_for(messages: list[dict], kind: str) -> str:
    """The canonical JSON text of a valid envelope of ``kind`` answering ``messages``."""
    system, user = messages[0]["content"], messages[-1]["content"]
    if kind == "chat":
        name = _NAME.search(user)
        data = {"message": f"Echo: {user[:300]}", "mood": "warm",
                "memories": [f"The user's name is {name.group(1)}"] if name else [],
                "affection": 1, "trust": 1, "suggested_actions": ["Tell me more"]}
    elif kind == "feed_comment":
        data = {"comment": f"Proud of you for: {user[:200]}", "tone": "proud"}
    elif kind == "analyst":
        analyst = _ANALYST.search(system).group(1)
        data = {"analyst": analyst, "reading": f"{analyst} reads: {user[:100]}", "advice": f"{analyst} advice",
                "risk": "medium"}
    else:
        raise ValueError(f"kind: {kind!r}")
    return dumps(parse_envelope(json.dumps(data), kind))


def analyst_of(messages: list[dict]) -> str | None:
    m = _ANALYST.search(messages[0]["content"])
    return m.group(1) if m else None


@dataclass
class FakeModel:
    """In-process stand-in for hearth.gateway.chain.Chain (same complete()/stream() interface).

    fail: analyst ids (or "chat"/"feed_comment") whose calls raise RuntimeError
    hang: analyst ids (or kinds) whose calls never return (the caller's timeout must fire)
    delay_s: sleep before each answer (lets tests observe concurrency)
    """

    fail: set[str] = field(default_factory=set)
    hang: set[str] = field(default_factory=set)
    delay_s: float = 0.0
    calls: list[tuple[str, list[dict]]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def _key(self, messages: list[dict], kind: str) -> str:
        return analyst_of(messages) or kind

    async def complete(self, messages: list[dict], *, kind: str, deadline_s: float | None = None,
                       max_tokens: int | None = None, request_id: str | None = None) -> Any:
        self.calls.append((kind, messages))
        key = self._key(messages, kind)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if key in self.hang:
                await asyncio.Event().wait()
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if key in self.fail:
                raise RuntimeError(f"fake failure for {key}")
            text = envelope_for(messages, kind)
            return SimpleNamespace(envelope=parse_envelope(text, kind), text=text, provider="fake")
        finally:
            self.in_flight -= 1

    async def stream(self, messages: list[dict], *, kind: str, **kw: Any):
        result = await self.complete(messages, kind=kind, **kw)
        text = result.text
        for i in range(0, len(text), 7):  # small pieces: escapes get split across deltas
            yield SimpleNamespace(text=text[i:i + 7], provider="fake")
        yield SimpleNamespace(result=result)


def openai_handler(body: dict):
    """Handler for tests.fakes.openai_server.FakeOpenAI: a valid envelope of the requested kind."""
    from tests.fakes.openai_server import Behavior

    return Behavior.reply(envelope_for(body["messages"], kind_from_request(body)))


class GatedModel(FakeModel):
    """Answers no call of ``kind`` until ``n`` of them are in flight: concurrent requests all pass any check made
    before the model (a look-up for a turn or situation already saved) and race at the save."""

    def __init__(self, n: int, kind: str = "chat"):
        super().__init__()
        self.n, self.kind, self.arrived, self.all_in = n, kind, 0, asyncio.Event()

    async def complete(self, messages, *, kind, **kw):
        if kind == self.kind:
            self.arrived += 1
            if self.arrived >= self.n:
                self.all_in.set()
            await self.all_in.wait()
        return await super().complete(messages, kind=kind, **kw)


async def add_old_format_comments(session, cipher: UserCipher, comments: list[tuple[str, str]], *,
                                  ids: list[str] | None = None) -> None:
    """A post of ``cipher``'s user and a companion's ``comments`` ((text, tone) each) on it, as the version before
    7da8d0d wrote them: the bare comment text sealed, the tone in the plain ``tone`` column. ``ids``: the comments'
    ids (new ones by default), for tests of the order start-up reads them in. ``session`` is not in a transaction."""
    companion = await companions_svc.create_companion(session, cipher, persona="wren")
    post = Post(id=new_id(), user_id=cipher.user_id, created_at=utcnow())
    post.body_ct = seal(cipher, post, "body_ct", "my cat died")
    async with session.begin():
        session.add(post)
        await session.flush()
        for (text, tone), comment_id in zip(comments, ids or [new_id() for _ in comments], strict=True):
            comment = Comment(id=comment_id, user_id=cipher.user_id, post_id=post.id, companion_id=companion.id,
                              tone=tone, created_at=utcnow())
            comment.body_ct = seal(cipher, comment, "body_ct", text)
            session.add(comment)
