"""Companions: persona, world view, the context the user shares, and chat turns.

A chat turn is: read (companion, shared context, memories, recent turns) -> ask the gateway chain for
a ``chat`` envelope -> ONE transaction that saves the user's message, the reply, the new memories and
the affection/trust change. If the model fails, nothing is written; if the write fails, the turn was
not acknowledged. Either the whole turn exists or none of it does.

A turn sent with a submission id (the page's, one per message it sends) is saved with it, once per chat: a resend
of a turn already saved (the connection dropped after the commit) gets the saved turn back, without asking the
model again or saving it twice (a unique index decides when two resends race).

A message, memory, name or persona whose sealed text does not open (a damaged row) reads as None: the pages show it
as "could not be read" and every other row as usual; a turn leaves it out of what the model is told (a turn whose
companion's persona does not open is refused: UnreadableText). Nothing read is rewritten (common.Readable).

Clearing a chat deletes its messages and memories (rows gone, not flagged) and moves the chat's epoch on,
so a turn whose reply was still being written is not saved after the clear (ChatCleared).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from hearth import prompts
from hearth.app.common import (LEFT_OUT, UNREADABLE_NAME, InputError, NotFound, Readable, UnreadableText,
                               check_submission_id, clean_text, delete_owned, once_per_submission,
                               page_before, reading, seal, seal_json, strict, unseal, unseal_json)
from hearth.app.crypto import UserCipher
from hearth.app.model import check_as_streamed
from hearth.app.relationship import Standing, standing
from hearth.app.storage.db import scrub_deleted
from hearth.app.storage.models import Companion, Memory, Message, User, new_id, utcnow
from hearth.app.textlimits import MAX_CONTEXT, MAX_NAME, MAX_PERSONA
from hearth.companion_rules import MAX_PROMPT_CHARS, fit_history
from hearth.envelope import ChatReply

MAX_MEMORIES_KEPT = 200  # per companion; the oldest go first


@dataclass
class CompanionView:  # name, persona: None when the sealed text does not open (a damaged row)
    id: str
    name: str | None
    persona: str | None  # a hearth.prompts.PERSONAS key or custom persona text
    world_view: str
    share_context: bool
    affection: int
    trust: int
    standing: Standing
    chat_epoch: int = 0  # bumped by each clear (a turn read before it is not saved after it)

    @property
    def builtin(self) -> bool:
        return self.persona in prompts.PERSONAS

    @property
    def shown_name(self) -> str:
        return self.name if self.name is not None else UNREADABLE_NAME


CLEARED_BEFORE = ("This chat was cleared after the page this message was sent from was loaded, so it was not sent "
                  "(a message sent again after a clear must not bring the cleared chat back). To send it to the chat "
                  "as it is now, reload the page first if it still shows the cleared messages.")


class ChatCleared(RuntimeError):
    """The chat was cleared while this turn's reply was being written, or before the turn was sent (from a page
    loaded before the clear): the turn is not saved."""

    def __init__(self, message: str = "The chat was cleared while this reply was being written, so it was not "
                                      "saved.") -> None:
        super().__init__(message)


@dataclass
class MessageView:
    id: str
    role: str  # "user" | "companion"
    text: str | None  # None: stored, but its sealed text does not open (a damaged row)
    created_at: datetime
    mood: str | None = None
    suggestions: list[str] = field(default_factory=list)


@dataclass
class TurnResult:
    user_message: MessageView
    reply: MessageView
    new_memories: list[str]
    standing: Standing
    provider: str | None
    replayed: bool = False  # the turn an earlier submission with the same id saved (new_memories is then [])


def _view(cipher: UserCipher, row: Companion, readable: Any = strict) -> CompanionView:
    return CompanionView(id=row.id, name=readable(unseal, cipher, row, "name_ct"),
                         persona=readable(unseal, cipher, row, "persona_ct"),
                         world_view=row.world_view, share_context=row.share_context, affection=row.affection,
                         trust=row.trust, standing=standing(row.affection, row.trust), chat_epoch=row.chat_epoch)


def _check_world_view(world_view: str) -> str:
    if world_view not in prompts.WORLD_VIEWS:
        raise InputError("world_view", f"must be one of {', '.join(prompts.WORLD_VIEWS)}")
    return world_view


# ------------------------------------------------------------------------------ shared context
async def get_shared_context(db: AsyncSession, cipher: UserCipher, *, readable: Readable | None = None) -> str | None:
    """What the user shares ("" when nothing); None when its sealed text does not open."""
    async with db.begin():
        user = (await db.execute(select(User).where(User.id == cipher.user_id))).scalar_one()
        if not user.shared_context_ct:
            return ""
        with reading(readable, cipher.user_id, "shared context") as read:
            return read(unseal, cipher, user, "shared_context_ct")


async def set_shared_context(db: AsyncSession, cipher: UserCipher, text: str) -> None:
    """Replace (or, with "", clear) what the user shares; the old text goes for good, as a delete's does."""
    text = clean_text(text, "shared_context", MAX_CONTEXT, required=False)
    async with db.begin():
        user = (await db.execute(select(User).where(User.id == cipher.user_id))).scalar_one()
        replaced = user.shared_context_ct is not None
        user.shared_context_ct = seal(cipher, user, "shared_context_ct", text) if text else None
    if replaced:  # the old page copies in SQLite's WAL still hold the old ciphertext
        await scrub_deleted(db)


def context_for(companion: CompanionView, shared: str) -> str:
    """What this companion may see: the shared context, if allowed (its Simulation Mode panel sees it too,
    with the companion's memories: simulation.panel_context)."""
    return shared if companion.share_context else ""


# ------------------------------------------------------------------------------ companions CRUD
async def create_companion(db: AsyncSession, cipher: UserCipher, *, persona: str, name: str = "",
                           world_view: str = "grounded", share_context: bool = True) -> CompanionView:
    """persona: a built-in key (PERSONAS) or custom persona text; name defaults to the built-in's name."""
    persona = clean_text(persona, "persona", MAX_PERSONA)
    name = clean_text(name, "name", MAX_NAME, required=False)
    if not name:
        if persona not in prompts.PERSONAS:
            raise InputError("name", "a custom persona needs a name")
        name = prompts.PERSONAS[persona].name
    row = Companion(id=new_id(), user_id=cipher.user_id, world_view=_check_world_view(world_view),
                    share_context=bool(share_context), affection=0, trust=0)
    row.name_ct = seal(cipher, row, "name_ct", name)
    row.persona_ct = seal(cipher, row, "persona_ct", persona)
    async with db.begin():
        db.add(row)
    return _view(cipher, row)


async def _row(db: AsyncSession, user_id: str, companion_id: str) -> Companion:
    row = (await db.execute(select(Companion).where(Companion.id == companion_id, Companion.user_id == user_id)
                            .execution_options(populate_existing=True))).scalar_one_or_none()
    if row is None:
        raise NotFound("companion")
    return row


async def get_companion(db: AsyncSession, cipher: UserCipher, companion_id: str, *,
                        readable: Readable | None = None) -> CompanionView:
    async with db.begin():
        row = await _row(db, cipher.user_id, companion_id)
        with reading(readable, cipher.user_id, "companion") as read:
            return _view(cipher, row, read)


async def list_companions(db: AsyncSession, cipher: UserCipher, *,
                          readable: Readable | None = None) -> list[CompanionView]:
    async with db.begin():
        rows = (await db.execute(select(Companion).where(Companion.user_id == cipher.user_id)
                                 .order_by(Companion.created_at))).scalars().all()
        with reading(readable, cipher.user_id, "companions") as read:
            return [_view(cipher, r, read) for r in rows]


async def update_companion(db: AsyncSession, cipher: UserCipher, companion_id: str, *, world_view: str,
                           share_context: bool, persona: str | None = None, name: str | None = None) -> None:
    """Switch the world view, the sharing choice, and (optionally) rename or rewrite the persona; the old name and
    persona go for good, as a delete's text does."""
    _check_world_view(world_view)
    async with db.begin():
        row = await _row(db, cipher.user_id, companion_id)
        row.world_view, row.share_context = world_view, bool(share_context)
        if persona:
            row.persona_ct = seal(cipher, row, "persona_ct", clean_text(persona, "persona", MAX_PERSONA))
        if name:
            row.name_ct = seal(cipher, row, "name_ct", clean_text(name, "name", MAX_NAME))
    if persona or name:  # the old page copies in SQLite's WAL still hold the old ciphertexts
        await scrub_deleted(db)


async def delete_companion(db: AsyncSession, user_id: str, companion_id: str) -> None:
    await delete_owned(db, Companion, user_id, companion_id, "companion")


# ------------------------------------------------------------------------------ chat
def _message_view(cipher: UserCipher, row: Message, readable: Any = strict) -> MessageView:
    meta = (readable(unseal_json, cipher, row, "meta_ct") if row.meta_ct else None) or {}
    return MessageView(id=row.id, role=row.role, text=readable(unseal, cipher, row, "body_ct"),
                       created_at=row.created_at, mood=meta.get("mood"),
                       suggestions=meta.get("suggested_actions", []))


async def history(db: AsyncSession, cipher: UserCipher, companion_id: str, limit: int = 200, *,
                  readable: Readable | None = None) -> list[MessageView]:
    """The last ``limit`` messages of this chat, oldest first. NotFound for another user's companion."""
    return (await history_page(db, cipher, companion_id, limit=limit, readable=readable))[0]


async def history_page(db: AsyncSession, cipher: UserCipher, companion_id: str, *, limit: int = 200,
                       before: str | None = None,
                       readable: Readable | None = None) -> tuple[list[MessageView], str | None]:
    """(up to ``limit`` messages, oldest first, the newest of them just before message ``before`` or the
    chat's last ones; the id to pass as ``before`` for the page of earlier messages, None at the start).
    NotFound for another user's companion or a ``before`` that is not a message of this chat."""
    async with db.begin():
        await _row(db, cipher.user_id, companion_id)
        rows, earlier = await page_before(db, Message, (Message.companion_id == companion_id,
                                                        Message.user_id == cipher.user_id),
                                          limit=limit, before=before, what="message")
        with reading(readable, cipher.user_id, "chat history") as read:
            return [_message_view(cipher, r, read) for r in reversed(rows)], earlier


async def memories(db: AsyncSession, cipher: UserCipher, companion_id: str, *,
                   readable: Readable | None = None) -> list[str | None]:
    """Everything remembered in this chat, oldest first (None for one whose sealed text does not open)."""
    async with db.begin():
        await _row(db, cipher.user_id, companion_id)
        rows = (await db.execute(select(Memory).where(Memory.companion_id == companion_id,
                                                      Memory.user_id == cipher.user_id)
                                 .order_by(Memory.created_at))).scalars().all()
        with reading(readable, cipher.user_id, "memories") as read:
            return [read(unseal, cipher, r, "text_ct") for r in rows]


@dataclass
class ChatContext:
    """Everything one chat turn needs, read before the model is called (only what opens: load_chat_context)."""

    companion: CompanionView
    shared_context: str
    memories: list[str]
    recent: list[MessageView]


def persona_needed(companion: CompanionView) -> None:
    """UnreadableText when the companion's persona does not open: the model cannot be told who to be."""
    if companion.persona is None:
        raise UnreadableText(f"{companion.shown_name}'s persona could not be read: its stored text does not open, "
                             "so they cannot answer. Nothing was saved. Writing a new persona in the settings "
                             "replaces it; the operator of this server can look into it.")


async def load_chat_context(db: AsyncSession, cipher: UserCipher, companion_id: str, turns: int,
                            chat_epoch: int | None = None) -> ChatContext:
    """What the model is told for one turn. A memory, message or shared context whose sealed text does not open is
    left out of it (a warning counts them), never sent as a placeholder; UnreadableText when the persona does not
    open. ``chat_epoch``: the chat's epoch on the page the turn was sent from; ChatCleared (CLEARED_BEFORE) when the
    chat was cleared since (a resend after a clear finds no saved turn to answer with: it must not be sent again).
    None (a client that sends none): not checked."""
    with Readable(cipher.user_id, "chat context", LEFT_OUT) as readable:
        async with db.begin():
            companion = _view(cipher, await _row(db, cipher.user_id, companion_id), readable)
        if chat_epoch is not None and chat_epoch != companion.chat_epoch:
            raise ChatCleared(CLEARED_BEFORE)
        persona_needed(companion)
        shared = await get_shared_context(db, cipher, readable=readable)
        kept = await memories(db, cipher, companion_id, readable=readable)
        recent = await history(db, cipher, companion_id, limit=2 * turns, readable=readable)
    return ChatContext(companion=companion, shared_context=shared or "", memories=[m for m in kept if m is not None],
                       recent=[m for m in recent if m.text is not None])


def chat_messages(ctx: ChatContext, user_text: str, *, prompt_memories: int,
                  max_prompt_chars: int = MAX_PROMPT_CHARS) -> list[dict]:
    """OpenAI-style messages: the production system prompt, the recent turns, then the new message; the oldest
    recent exchanges left out as needed to fit ``max_prompt_chars`` (the setting; fit_history)."""
    system = prompts.companion_system_prompt(
        persona=ctx.companion.persona, world_view=ctx.companion.world_view,
        shared_context=context_for(ctx.companion, ctx.shared_context), stage=ctx.companion.standing.key,
        memories=ctx.memories[-prompt_memories:] if prompt_memories else [])
    recent = [{"role": "user" if m.role == "user" else "assistant", "content": m.text} for m in ctx.recent]
    return [{"role": "system", "content": system}, *fit_history(system, recent, user_text, max_prompt_chars),
            {"role": "user", "content": user_text}]


def _new_memories(existing: list[str], proposed: list[str]) -> list[str]:
    seen = {m.casefold() for m in existing}
    fresh = []
    for m in proposed:
        if m.casefold() not in seen:
            seen.add(m.casefold())
            fresh.append(m)
    return fresh


async def _turn_with_id(db: AsyncSession, cipher: UserCipher, companion_id: str,
                        submission_id: str) -> tuple[str, TurnResult] | None:
    """Inside an open transaction: the user's text and the turn (``replayed``) saved in this chat with
    ``submission_id``, or None. What does not open (a row damaged since) is None."""
    rows = {r.role: r for r in (await db.execute(
        select(Message).where(Message.companion_id == companion_id, Message.user_id == cipher.user_id,
                              Message.submission_id == submission_id))).scalars()}
    if not rows:
        return None
    comp = await _row(db, cipher.user_id, companion_id)
    with Readable(cipher.user_id, "resent chat turn") as read:
        mine, reply = _message_view(cipher, rows["user"], read), _message_view(cipher, rows["companion"], read)
        provider = (read(unseal_json, cipher, rows["companion"], "meta_ct") or {}).get("provider")
    return mine.text, TurnResult(user_message=mine, reply=reply, new_memories=[],
                                 standing=standing(comp.affection, comp.trust), provider=provider, replayed=True)


async def saved_turn(db: AsyncSession, cipher: UserCipher, companion_id: str, submission_id: str | None,
                     user_text: str) -> TurnResult | None:
    """The turn saved in this chat with ``submission_id`` (``replayed``), or None (no id, or none saved with it).
    InputError when it was saved for another text."""
    return await once_per_submission(db, submission_id, user_text,
                                     lambda sid: _turn_with_id(db, cipher, companion_id, sid))


async def save_turn(db: AsyncSession, cipher: UserCipher, ctx: ChatContext, user_text: str, reply: ChatReply,
                    provider: str | None, submission_id: str | None = None) -> TurnResult:
    """Write the whole turn in one transaction: user message, reply, memories, affection/trust. With a
    ``submission_id`` already saved in this chat (a resend that raced the first), nothing is written and the
    saved turn comes back (``replayed``)."""
    submission_id = check_submission_id(submission_id)
    uid, cid = cipher.user_id, ctx.companion.id
    now = utcnow()
    user_row = Message(id=new_id(), user_id=uid, companion_id=cid, role="user", created_at=now,
                       submission_id=submission_id)
    user_row.body_ct = seal(cipher, user_row, "body_ct", user_text)
    # the reply sorts after the message it answers even when both share a clock tick
    reply_row = Message(id=new_id(), user_id=uid, companion_id=cid, role="companion",
                        created_at=now + timedelta(microseconds=1), submission_id=submission_id)
    reply_row.body_ct = seal(cipher, reply_row, "body_ct", reply.message)
    reply_row.meta_ct = seal_json(cipher, reply_row, "meta_ct", {
        "mood": reply.mood, "suggested_actions": list(reply.suggested_actions), "provider": provider})
    # a pair the unique index refuses rolls back the whole turn, affection/trust included
    dropped: list[int] = []  # how many old memories the cap deleted (a turn that committed)
    result = await once_per_submission(
        db, submission_id, user_text, lambda sid: _turn_with_id(db, cipher, cid, sid),
        lambda: _write_turn(db, cipher, ctx, user_text, reply, provider, user_row, reply_row, now, dropped),
        lambda: _chat_gone(db, uid, ctx))
    if any(dropped):  # the memories the cap dropped go for good, as a delete's do
        await scrub_deleted(db)
    return result


async def _chat_gone(db: AsyncSession, user_id: str, ctx: ChatContext) -> None:
    """Inside an open transaction: NotFound when the companion is gone, ChatCleared when its chat was cleared since
    ``ctx`` was read (either took the turn an earlier submission with the same id saved)."""
    epoch = (await db.execute(select(Companion.chat_epoch).where(Companion.id == ctx.companion.id,
                                                                 Companion.user_id == user_id))).scalar_one_or_none()
    if epoch is None:
        raise NotFound("companion")
    if epoch != ctx.companion.chat_epoch:
        raise ChatCleared()


async def _write_turn(db: AsyncSession, cipher: UserCipher, ctx: ChatContext, user_text: str, reply: ChatReply,
                      provider: str | None, user_row: Message, reply_row: Message, now: datetime,
                      dropped: list[int]) -> TurnResult:
    """Inside an open transaction: save_turn's writes; how many old memories the cap deleted is appended to
    ``dropped``."""
    uid, cid = cipher.user_id, ctx.companion.id
    # the UPDATE doubles as the ownership/existence check (a companion deleted meanwhile aborts the turn)
    # and as the clear check: a chat cleared since the context was read has another epoch
    result = await db.execute(
        update(Companion).where(Companion.id == cid, Companion.user_id == uid,
                                Companion.chat_epoch == ctx.companion.chat_epoch)
        .values(affection=Companion.affection + reply.affection, trust=Companion.trust + reply.trust))
    if result.rowcount != 1:
        await _chat_gone(db, uid, ctx)  # NotFound when it is gone, ChatCleared when cleared since ctx was read
        raise ChatCleared()  # (the UPDATE matched no row: one of the two)
    # the memories as they are now, not as the context read them before the model call: the UPDATE holds the
    # companion's row, so a turn sent at the same time has committed its memories (or waits for this one), and
    # two turns that both learn "likes tea" keep it once
    kept = (await db.execute(select(Memory).where(Memory.companion_id == cid, Memory.user_id == uid))).scalars()
    with Readable(uid, "memories", "not compared with the new ones") as readable:
        known = [readable(unseal, cipher, r, "text_ct") for r in kept]
    fresh = _new_memories([m for m in known if m is not None], list(reply.memories))
    memory_rows = []
    for i, text in enumerate(fresh):
        row = Memory(id=new_id(), user_id=uid, companion_id=cid, created_at=now + timedelta(microseconds=i))
        row.text_ct = seal(cipher, row, "text_ct", text)
        memory_rows.append(row)
    db.add_all([user_row, reply_row, *memory_rows])
    await db.flush()
    total = (await db.execute(select(func.count()).select_from(Memory).where(Memory.companion_id == cid))).scalar_one()
    if total > MAX_MEMORIES_KEPT:
        oldest = select(Memory.id).where(Memory.companion_id == cid).order_by(Memory.created_at).limit(
            total - MAX_MEMORIES_KEPT).scalar_subquery()
        dropped.append((await db.execute(delete(Memory).where(Memory.id.in_(oldest)))).rowcount)
    comp = await _row(db, uid, cid)
    return TurnResult(
        user_message=MessageView(user_row.id, "user", user_text, user_row.created_at),
        reply=MessageView(reply_row.id, "companion", reply.message, reply_row.created_at, reply.mood,
                          list(reply.suggested_actions)),
        new_memories=fresh, standing=standing(comp.affection, comp.trust), provider=provider)


async def chat_turn(db: AsyncSession, model: Any, cipher: UserCipher, companion_id: str, text: str, *,
                    max_chars: int, turns: int, prompt_memories: int, deadline_s: float,
                    submission_id: str | None = None, chat_epoch: int | None = None,
                    max_prompt_chars: int = MAX_PROMPT_CHARS) -> TurnResult:
    """One complete turn (non-streaming). InputError / NotFound / the gateway's errors propagate. A
    ``submission_id`` already saved in this chat returns that turn (``replayed``) without asking the model; a turn
    sent from a page loaded before a clear (``chat_epoch``, see load_chat_context) is ChatCleared, with nothing asked
    or saved. A reply the streamed path would fail (model.check_as_streamed) fails here too."""
    text = clean_text(text, "message", max_chars)
    submission_id = check_submission_id(submission_id)
    if (saved := await saved_turn(db, cipher, companion_id, submission_id, text)) is not None:
        return saved
    ctx = await load_chat_context(db, cipher, companion_id, turns, chat_epoch)
    messages = chat_messages(ctx, text, prompt_memories=prompt_memories, max_prompt_chars=max_prompt_chars)
    result = await model.complete(messages, kind="chat", deadline_s=deadline_s, request_id=uuid.uuid4().hex)
    check_as_streamed(result)
    return await save_turn(db, cipher, ctx, text, result.envelope, getattr(result, "provider", None), submission_id)


async def clear_chat(db: AsyncSession, user_id: str, companion_id: str) -> int:
    """Delete every message and memory of this chat for good; returns how many messages went. A turn in
    flight meanwhile is not saved afterwards (the chat epoch moves on)."""
    async with db.begin():
        bumped = await db.execute(update(Companion).where(Companion.id == companion_id, Companion.user_id == user_id)
                                  .values(chat_epoch=Companion.chat_epoch + 1))
        if bumped.rowcount != 1:
            raise NotFound("companion")
        gone = await db.execute(delete(Message).where(Message.companion_id == companion_id, Message.user_id == user_id))
        await db.execute(delete(Memory).where(Memory.companion_id == companion_id, Memory.user_id == user_id))
    await scrub_deleted(db)
    return gone.rowcount
