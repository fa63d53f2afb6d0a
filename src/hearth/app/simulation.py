"""Simulation Mode: the five-analyst panel, custom agents, and rehearsals.

Panel: one situation goes to the five analysts (hearth.prompts.ANALYSTS) CONCURRENTLY, each call
with its own timeout; each analyst sees the context the user shares with the companion and what the
companion remembers from their chat (nothing of either when the user does not share with it). An analyst
that fails or times out is reported as failed; the others still arrive. The situation and every
reading (ok or failed) are written in one transaction once the panel has finished. A situation sent with a
submission id is saved once per companion, as a chat turn is (hearth.app.companions): a resend gets the saved
situation back, without asking the analysts again. Deleting a situation spends its submission id (in the delete's
transaction): a resend of it afterwards asks nothing and saves nothing (DELETED_BEFORE), as a chat turn sent from a
page loaded before a clear is refused, so a delete is not undone by a page that still holds the id.

Rehearsal: the model plays a custom agent (rehearsal_system_prompt, a ``chat`` envelope) and the
panel reads each exchange. A rehearsal is its own thread, separate from the companion chat, so the
user can leave it for the companion and come back to the same place. A turn is saved in two phases: the user's turn
and the agent's turn in one transaction as soon as the reply is final (save_rehearsal_exchange), then the panel's
readings of it in their own once the panel has finished (save_turn_readings); so an exchange the user saw is on the
page while the panel still reads it (panel_note), and stays saved when the panel's readings cannot be. A rehearsal
turn sent with a submission id is saved once per rehearsal, as a chat turn is (hearth.app.companions): a resend gets
the saved turn back, with the readings saved so far.

A situation, reading, agent field or rehearsal turn whose sealed text does not open (a damaged row) reads as None:
the pages show it as "could not be read" and every other row as usual; a rehearsal turn leaves it out of what the
agent and the panel are told (one whose agent does not open is refused: UnreadableText). Nothing read is rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hearth import prompts
from hearth.app.common import (LEFT_OUT, UNREADABLE_NAME, InputError, NotFound, Readable, UnreadableText,
                               check_owned, check_submission_id, clean_text, delete_owned, once_per_submission,
                               page_before, reading, rows_in, seal, seal_json, strict, unseal, unseal_json)
from hearth.app.companions import get_companion, get_shared_context, memories
from hearth.app.crypto import UserCipher
from hearth.app.model import check_as_streamed, describe_failure, failure_for_log
from hearth.app.storage.db import scrub_deleted
from hearth.app.storage.models import (Agent, Companion, Reading, Rehearsal, RehearsalTurn, Situation,
                                       SpentSituationSubmission, new_id, utcnow)
from hearth.app.textlimits import AGENT_FIELD_LIMITS
from hearth.companion_rules import MAX_PROMPT_CHARS, PROMPT_MEMORIES, fit_history

# how long past analyst_timeout_s an agent turn without readings is shown as still being read (panel_note): the
# panel's backstop (_ask_analyst) and the readings' commit
PANEL_MARGIN_S = 15.0
log = logging.getLogger("hearth.app.simulation")
ANALYST_TITLES = {a: prompts.ANALYST_LENSES[a][0] for a in prompts.ANALYSTS}


@dataclass
class PanelResult:
    """One analyst's outcome: ``ok`` with reading/advice/risk, or failed with ``error``; a stored one whose sealed
    text does not open has all four None (``unreadable``)."""

    analyst: str
    ok: bool
    reading: str = ""
    advice: str = ""
    risk: str = ""
    error: str = ""

    @property
    def unreadable(self) -> bool:
        return self.reading is None

    @property
    def title(self) -> str:
        return ANALYST_TITLES.get(self.analyst, self.analyst)

    def as_json(self) -> dict:
        return {"analyst": self.analyst, "title": self.title, "ok": self.ok, "reading": self.reading,
                "advice": self.advice, "risk": self.risk, "error": self.error}


def _failure(analyst: str, exc: BaseException) -> str:
    """Shown (and stored) with the failed reading: the user's words; the class names go to the log."""
    log.warning("analyst %s failed: %s", analyst, failure_for_log(exc))
    return describe_failure(exc)


# what the panel reads: a situation, or (after a rehearsal turn) its message for an analyst's system prompt, within the
# prompt budget (exchange_for_panel)
PanelText = str | Callable[[str], str]


async def _ask_analyst(model: Any, analyst: str, shared_context: str, situation: PanelText,
                       timeout_s: float) -> PanelResult:
    system = prompts.analyst_system_prompt(analyst, shared_context=shared_context)
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": situation if isinstance(situation, str) else situation(system)}]
    try:
        # the chain enforces deadline_s; wait_for is the backstop so no analyst can hang the panel
        result = await asyncio.wait_for(
            model.complete(messages, kind="analyst", deadline_s=timeout_s, request_id=uuid.uuid4().hex),
            timeout=timeout_s + 1.0)
    except Exception as exc:  # noqa: BLE001 - any failure of one analyst is shown, never fatal to the panel
        return PanelResult(analyst=analyst, ok=False, error=_failure(analyst, exc))
    env = result.envelope
    if env.analyst != analyst:
        log.warning("analyst %s: the reply was written as analyst %r", analyst, env.analyst)
        return PanelResult(analyst=analyst, ok=False, error="The answer came from the wrong analyst.")
    return PanelResult(analyst=analyst, ok=True, reading=env.reading, advice=env.advice, risk=env.risk)


async def panel(model: Any, shared_context: str, situation: PanelText,
                timeout_s: float) -> AsyncIterator[PanelResult]:
    """Yield each analyst's result as it arrives (all five run concurrently). Pending calls are
    cancelled if the consumer stops early. ``situation``: the text each analyst reads, or a function of the analyst's
    system prompt that writes it (exchange_for_panel, bound to a rehearsal turn)."""
    tasks = [asyncio.create_task(_ask_analyst(model, a, shared_context, situation, timeout_s)) for a in prompts.ANALYSTS]
    try:
        for next_done in asyncio.as_completed(tasks):
            yield await next_done
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_panel(model: Any, shared_context: str, situation: PanelText, timeout_s: float) -> list[PanelResult]:
    """All five results, in ANALYSTS order."""
    got = {r.analyst: r async for r in panel(model, shared_context, situation, timeout_s)}
    return [got[a] for a in prompts.ANALYSTS]


def _reading_rows(cipher: UserCipher, results: list[PanelResult], *, situation_id: str | None = None,
                  turn_id: str | None = None) -> list[Reading]:
    rows, now = [], utcnow()
    order = {a: i for i, a in enumerate(prompts.ANALYSTS)}
    for r in results:
        row = Reading(id=new_id(), user_id=cipher.user_id, situation_id=situation_id, turn_id=turn_id,
                      analyst=r.analyst, status="ok" if r.ok else "failed",
                      created_at=now + timedelta(microseconds=order.get(r.analyst, 9)))
        row.body_ct = seal_json(cipher, row, "body_ct", r.as_json())
        rows.append(row)
    return rows


def _read_results(cipher: UserCipher, rows: list[Reading], readable: Any = strict) -> list[PanelResult]:
    out = []
    for row in sorted(rows, key=lambda r: r.created_at):
        d = readable(unseal_json, cipher, row, "body_ct")
        if d is None:  # the analyst and the outcome are stored in the clear; the words do not open
            out.append(PanelResult(analyst=row.analyst, ok=row.status == "ok", reading=None, advice=None, risk=None,
                                   error=None))
            continue
        out.append(PanelResult(analyst=row.analyst, ok=row.status == "ok", reading=d.get("reading", ""),
                               advice=d.get("advice", ""), risk=d.get("risk", ""), error=d.get("error", "")))
    return out


# ------------------------------------------------------------------------------ situations
@dataclass
class SituationView:
    id: str
    text: str | None  # None: stored, but its sealed text does not open (a damaged row)
    created_at: datetime
    results: list[PanelResult]
    replayed: bool = False  # saved by an earlier submission with the same id (saved_situation)


async def panel_context(db: AsyncSession, cipher: UserCipher, companion_id: str, *,
                        prompt_memories: int = PROMPT_MEMORIES, readable: Readable | None = None) -> str:
    """The context the panel (and a rehearsal's agent) sees: what the user shares with this companion, then
    what the companion remembers from their chat (its latest ``prompt_memories``, as its own prompt carries
    them). Nothing when the user does not share their context with this companion. What does not open (the
    shared context, a memory, the companion's name) is left out, counted as such."""
    with reading(readable, cipher.user_id, "panel context", LEFT_OUT) as read:
        companion = await get_companion(db, cipher, companion_id, readable=read)
        if not companion.share_context:
            return ""
        shared = await get_shared_context(db, cipher, readable=read) or ""
        kept = [m for m in await memories(db, cipher, companion_id, readable=read) if m is not None]
    kept = kept[-prompt_memories:] if prompt_memories else []
    return prompts.panel_context(shared, companion=companion.name or "", memories=kept)


# a resend of a submission id whose situation was deleted (the form posted again, the page's script asking again)
DELETED_BEFORE = ("was used for a situation that has since been deleted, so it was not asked of the panel again or "
                  "saved (a situation sent again after its delete must not bring it back). To ask the panel anew, "
                  "reload the page and send it again.")


async def _check_not_spent(db: AsyncSession, user_id: str, companion_id: str, submission_id: str) -> None:
    """Inside an open transaction: InputError (DELETED_BEFORE) when a situation of this user's companion saved with
    ``submission_id`` was deleted (delete_situation spent the id)."""
    spent = select(SpentSituationSubmission.submission_id).where(
        SpentSituationSubmission.companion_id == companion_id, SpentSituationSubmission.user_id == user_id,
        SpentSituationSubmission.submission_id == submission_id)
    if (await db.execute(spent)).scalar_one_or_none() is not None:
        raise InputError("submission_id", DELETED_BEFORE)


async def _situation_with_id(db: AsyncSession, cipher: UserCipher, companion_id: str,
                             submission_id: str) -> tuple[str, SituationView] | None:
    """Inside an open transaction: the text and the situation (with its readings, ``replayed``) saved for this
    companion with ``submission_id``, or None; InputError (DELETED_BEFORE) when that situation was deleted. What does
    not open (a row damaged since) is None."""
    row = (await db.execute(select(Situation).where(Situation.companion_id == companion_id,
                                                    Situation.user_id == cipher.user_id,
                                                    Situation.submission_id == submission_id))).scalar_one_or_none()
    if row is None:
        await _check_not_spent(db, cipher.user_id, companion_id, submission_id)
        return None
    readings = (await db.execute(select(Reading).where(Reading.situation_id == row.id))).scalars().all()
    with Readable(cipher.user_id, "resent situation") as read:
        view = SituationView(id=row.id, text=read(unseal, cipher, row, "text_ct"), created_at=row.created_at,
                             results=_read_results(cipher, readings, read), replayed=True)
    return view.text, view


async def saved_situation(db: AsyncSession, cipher: UserCipher, companion_id: str, submission_id: str | None,
                          text: str) -> SituationView | None:
    """The situation (with its readings) saved for this companion with ``submission_id``, or None (no id, or none
    saved with it). InputError when it was saved for another text, or its situation was deleted (DELETED_BEFORE)."""
    return await once_per_submission(db, submission_id, text,
                                     lambda sid: _situation_with_id(db, cipher, companion_id, sid))


async def store_situation(db: AsyncSession, cipher: UserCipher, companion_id: str, text: str,
                          results: list[PanelResult], submission_id: str | None = None) -> SituationView:
    """The situation and its readings, in one transaction (NotFound for another user's companion). With a
    ``submission_id`` already saved for this companion (a resend that raced the first), nothing is written and
    the saved situation comes back (``replayed``); one whose situation was deleted meanwhile (the id spent) is
    InputError (DELETED_BEFORE), nothing written."""
    submission_id = check_submission_id(submission_id)
    row = Situation(id=new_id(), user_id=cipher.user_id, companion_id=companion_id, created_at=utcnow(),
                    submission_id=submission_id)
    row.text_ct = seal(cipher, row, "text_ct", text)

    async def write() -> SituationView:
        await check_owned(db, Companion, cipher.user_id, companion_id, "companion")
        db.add(row)
        await db.flush()
        if submission_id is not None:
            # after the insert, not before: an insert that got past the unique index where a situation with this id
            # was saved means its delete has committed (PostgreSQL makes the insert wait for it), and with it the
            # spent id, which this later statement sees; a check before the insert could miss a delete in between
            await _check_not_spent(db, cipher.user_id, companion_id, submission_id)
        db.add_all(_reading_rows(cipher, results, situation_id=row.id))
        return SituationView(id=row.id, text=text, created_at=row.created_at, results=results)

    async def gone() -> None:  # the companion went meanwhile, or what the first submission with the id saved did
        await check_owned(db, Companion, cipher.user_id, companion_id, "companion")
        if submission_id is not None:  # between the rollback and the read-back
            raise InputError("submission_id", "was used for a situation that was deleted while the panel read this one, "
                                              "so it was not saved again; send it again to ask the panel anew")

    return await once_per_submission(db, submission_id, text,
                                     lambda sid: _situation_with_id(db, cipher, companion_id, sid), write, gone)


async def save_situation(db: AsyncSession, cipher: UserCipher, companion_id: str, text: str,
                         results: list[PanelResult], submission_id: str | None = None) -> str:
    """The id of the situation store_situation saved (or found saved with ``submission_id``)."""
    return (await store_situation(db, cipher, companion_id, text, results, submission_id)).id


async def list_situations(db: AsyncSession, cipher: UserCipher, companion_id: str, limit: int = 20) -> list[SituationView]:
    return (await situations_page(db, cipher, companion_id, limit=limit))[0]


async def situations_page(db: AsyncSession, cipher: UserCipher, companion_id: str, *, limit: int = 20,
                          before: str | None = None) -> tuple[list[SituationView], str | None]:
    """(up to ``limit`` situations, newest first, the newest of them just older than situation ``before`` or the
    newest of all; the id to pass as ``before`` for the page of older ones, None at the end).
    NotFound for a ``before`` that is not one of this companion's situations (of this user)."""
    async with db.begin():
        rows, older = await page_before(db, Situation, (Situation.companion_id == companion_id,
                                                         Situation.user_id == cipher.user_id),
                                        limit=limit, before=before, what="situation")
        ids = [r.id for r in rows]
        readings = await rows_in(db, select(Reading).where(Reading.user_id == cipher.user_id), Reading.situation_id,
                                 ids, scalars=True)
        by_sit: dict[str, list[Reading]] = {}
        for rd in readings:
            by_sit.setdefault(rd.situation_id, []).append(rd)
        with Readable(cipher.user_id, "situations") as read:
            return [SituationView(id=r.id, text=read(unseal, cipher, r, "text_ct"), created_at=r.created_at,
                                  results=_read_results(cipher, by_sit.get(r.id, []), read)) for r in rows], older


async def delete_situation(db: AsyncSession, user_id: str, situation_id: str) -> None:
    """Delete the situation and its readings for good (NotFound unless ``user_id`` owns it). Its submission id, if
    it had one, is spent in the same transaction: a resend of it asks nothing and saves nothing (DELETED_BEFORE)."""
    async with db.begin():
        gone = (await db.execute(delete(Situation).where(Situation.id == situation_id, Situation.user_id == user_id)
                                 .returning(Situation.companion_id, Situation.submission_id))).one_or_none()
        if gone is None:  # none of this user's, or another delete of it committed first
            raise NotFound("situation")
        companion_id, submission_id = gone
        if submission_id is not None:
            db.add(SpentSituationSubmission(companion_id=companion_id, submission_id=submission_id, user_id=user_id))
    await scrub_deleted(db)


# ------------------------------------------------------------------------------ agents
@dataclass
class AgentView:  # a field is None when its sealed text does not open (a damaged row)
    id: str
    name: str | None
    personality: str | None
    backstory: str | None
    relationship: str | None

    @property
    def shown_name(self) -> str:
        return self.name if self.name is not None else UNREADABLE_NAME


_AGENT_FIELDS = tuple(AGENT_FIELD_LIMITS)  # name, personality, backstory, relationship


def _agent_view(cipher: UserCipher, row: Agent, readable: Any = strict) -> AgentView:
    return AgentView(id=row.id, **{f: readable(unseal, cipher, row, f"{f}_ct") for f in _AGENT_FIELDS})


async def create_agent(db: AsyncSession, cipher: UserCipher, **fields: str) -> AgentView:
    """fields: name, personality, backstory, relationship (all required text)."""
    unknown = set(fields) - set(_AGENT_FIELDS)
    if unknown:
        raise TypeError(f"unexpected fields: {sorted(unknown)}")
    row = Agent(id=new_id(), user_id=cipher.user_id)
    for f, limit in AGENT_FIELD_LIMITS.items():
        setattr(row, f"{f}_ct", seal(cipher, row, f"{f}_ct", clean_text(fields.get(f), f, limit)))
    async with db.begin():
        db.add(row)
    return _agent_view(cipher, row)


async def list_agents(db: AsyncSession, cipher: UserCipher) -> list[AgentView]:
    async with db.begin():
        rows = (await db.execute(select(Agent).where(Agent.user_id == cipher.user_id)
                                 .order_by(Agent.created_at))).scalars().all()
        with Readable(cipher.user_id, "agents") as read:
            return [_agent_view(cipher, r, read) for r in rows]


async def delete_agent(db: AsyncSession, user_id: str, agent_id: str) -> None:
    await delete_owned(db, Agent, user_id, agent_id, "agent")


# ------------------------------------------------------------------------------ rehearsals
@dataclass
class TurnView:
    id: str
    role: str  # "user" | "agent"
    text: str | None  # None: stored, but its sealed text does not open (a damaged row)
    created_at: datetime
    results: list[PanelResult] = field(default_factory=list)
    replayed: bool = False  # saved by an earlier submission with the same id (saved_rehearsal_turn)
    readings_lost: bool = False  # the panel's readings of it could not be saved (readings_or_kept_exchange)
    # an agent turn's: the person's mood and the suggested actions, which the page shows as coaching for the user's
    # next line (None / [] for a user's turn, one saved before schema 0007, or one whose meta does not open)
    mood: str | None = None
    suggestions: list[str] = field(default_factory=list)


def _turn_meta(cipher: UserCipher, row: RehearsalTurn, readable: Any) -> dict:
    """An agent turn's sealed meta (mood, suggested_actions), or {} when it has none or it does not open."""
    meta = readable(unseal_json, cipher, row, "meta_ct") if row.meta_ct else None
    return meta if isinstance(meta, dict) else {}


def _turn_view(cipher: UserCipher, row: RehearsalTurn, readable: Any, results: list[PanelResult],
               replayed: bool = False) -> TurnView:
    meta = _turn_meta(cipher, row, readable)
    return TurnView(id=row.id, role=row.role, text=readable(unseal, cipher, row, "body_ct"), created_at=row.created_at,
                    results=results, replayed=replayed, mood=meta.get("mood"),
                    suggestions=list(meta.get("suggested_actions") or []))


@dataclass
class RehearsalView:
    id: str
    companion_id: str
    agent: AgentView
    turns: list[TurnView]


async def _rehearsal_parents(db: AsyncSession, user_id: str, companion_id: str, agent_id: str) -> None:
    """Inside an open transaction: NotFound for a companion, InputError for an agent, that is not this user's."""
    await check_owned(db, Companion, user_id, companion_id, "companion")
    agent = (await db.execute(select(Agent.id).where(Agent.id == agent_id,
                                                     Agent.user_id == user_id))).scalar_one_or_none()
    if agent is None:
        raise InputError("agent_id", "choose one of your agents")


async def start_rehearsal(db: AsyncSession, cipher: UserCipher, companion_id: str, agent_id: str) -> str:
    """A new rehearsal with the user's agent beside their companion (NotFound / InputError("agent_id") otherwise,
    also when either is deleted between the check and the insert: the foreign key refuses the row)."""
    row = Rehearsal(id=new_id(), user_id=cipher.user_id, companion_id=companion_id, agent_id=agent_id)
    try:
        async with db.begin():
            await _rehearsal_parents(db, cipher.user_id, companion_id, agent_id)
            db.add(row)
    except IntegrityError:
        async with db.begin():  # gone meanwhile: answered as the check answers it
            await _rehearsal_parents(db, cipher.user_id, companion_id, agent_id)
        raise
    return row.id


async def list_rehearsals(db: AsyncSession, cipher: UserCipher, companion_id: str) -> list[tuple[str, str]]:
    """(rehearsal id, agent name) pairs for this companion, newest first (UNREADABLE_NAME for a name that does not
    open)."""
    async with db.begin():
        rows = (await db.execute(select(Rehearsal, Agent).join(Agent, Agent.id == Rehearsal.agent_id)
                                 .where(Rehearsal.companion_id == companion_id, Rehearsal.user_id == cipher.user_id)
                                 .order_by(Rehearsal.created_at.desc()))).all()
        with Readable(cipher.user_id, "rehearsals") as read:  # the name alone: the list shows nothing else
            names = [(r.id, read(unseal, cipher, a, "name_ct")) for r, a in rows]
    return [(rid, UNREADABLE_NAME if name is None else name) for rid, name in names]


async def get_rehearsal(db: AsyncSession, cipher: UserCipher, rehearsal_id: str, *,
                        readable: Readable | None = None) -> RehearsalView:
    async with db.begin():
        row = (await db.execute(select(Rehearsal, Agent).join(Agent, Agent.id == Rehearsal.agent_id)
                                .where(Rehearsal.id == rehearsal_id, Rehearsal.user_id == cipher.user_id))).first()
        if row is None:
            raise NotFound("rehearsal")
        reh, agent = row
        turns = (await db.execute(select(RehearsalTurn).where(RehearsalTurn.rehearsal_id == reh.id)
                                  .order_by(RehearsalTurn.created_at))).scalars().all()
        ids = [t.id for t in turns]
        readings = await rows_in(db, select(Reading), Reading.turn_id, ids, scalars=True)
        by_turn: dict[str, list[Reading]] = {}
        for rd in readings:
            by_turn.setdefault(rd.turn_id, []).append(rd)
        with reading(readable, cipher.user_id, "rehearsal") as read:
            views = [_turn_view(cipher, t, read, _read_results(cipher, by_turn.get(t.id, []), read)) for t in turns]
            return RehearsalView(id=reh.id, companion_id=reh.companion_id, agent=_agent_view(cipher, agent, read),
                                 turns=views)


def agent_needed(view: RehearsalView) -> None:
    """UnreadableText when a field of the rehearsed person does not open: the model cannot be told who to play."""
    if any(getattr(view.agent, f) is None for f in _AGENT_FIELDS):
        raise UnreadableText(f"What you wrote about {view.agent.shown_name} could not be read: its stored text does "
                             "not open, so this rehearsal cannot go on. Nothing was saved. The operator of this "
                             "server can look into it.")


def rehearsal_messages(view: RehearsalView, shared_context: str, text: str, turns: int,
                       max_prompt_chars: int = MAX_PROMPT_CHARS) -> list[dict]:
    """The agent's messages; a turn whose text does not open is not among them (get_rehearsal gives it as None). The
    oldest earlier exchanges are left out as needed to fit ``max_prompt_chars`` (the setting; fit_history)."""
    a = view.agent
    system = prompts.rehearsal_system_prompt(name=a.name, personality=a.personality, backstory=a.backstory,
                                             relationship=a.relationship, shared_context=shared_context)
    earlier = [{"role": "user" if t.role == "user" else "assistant", "content": t.text}
               for t in view.turns[-2 * turns:] if t.text is not None]
    return [{"role": "system", "content": system}, *fit_history(system, earlier, text, max_prompt_chars),
            {"role": "user", "content": text}]


def exchange_for_panel(view: RehearsalView, text: str, reply: str, system: str,
                       max_prompt_chars: int = MAX_PROMPT_CHARS) -> str:
    """What an analyst reads after a rehearsal turn: who it is, and the latest exchange in context. Written by
    hearth.prompts.rehearsal_exchange (its last PANEL_EXCHANGE_TURNS earlier turns), which the eval's
    after-rehearsal case and the corpus use too. ``system``: the analyst's system prompt, with which the request
    fits ``max_prompt_chars``, the oldest earlier lines left out as needed (fit_history): the panel passes a
    function of it (panel's ``situation``: partial(exchange_for_panel, view, text, reply, max_prompt_chars=...))."""
    a = view.agent
    earlier = [{"role": "user" if t.role == "user" else "assistant", "content": t.text}
               for t in view.turns[-prompts.PANEL_EXCHANGE_TURNS:] if t.text is not None]
    return prompts.rehearsal_exchange(name=a.name, personality=a.personality, relationship=a.relationship,
                                      earlier=earlier, text=text, reply=reply, system=system,
                                      max_prompt_chars=max_prompt_chars)


async def rehearsal_context(db: AsyncSession, cipher: UserCipher, rehearsal_id: str, text: str, *,
                            turns: int, prompt_memories: int = PROMPT_MEMORIES,
                            max_prompt_chars: int = MAX_PROMPT_CHARS) -> tuple[RehearsalView, str, list[dict]]:
    """What one rehearsal turn needs before the model is asked: the rehearsal, the context the panel may
    see (panel_context), and the messages for the agent's reply. NotFound for another user's rehearsal. What does
    not open is left out of them (counted in one warning); UnreadableText when the rehearsed person does not open."""
    with Readable(cipher.user_id, "rehearsal context", LEFT_OUT) as readable:
        view = await get_rehearsal(db, cipher, rehearsal_id, readable=readable)
        agent_needed(view)
        shared = await panel_context(db, cipher, view.companion_id, prompt_memories=prompt_memories,
                                     readable=readable)
    return view, shared, rehearsal_messages(view, shared, text, turns, max_prompt_chars)


async def _rehearsal_turn_with_id(db: AsyncSession, cipher: UserCipher, rehearsal_id: str,
                                  submission_id: str) -> tuple[str, TurnView] | None:
    """Inside an open transaction: the user's text and the agent's turn (with its readings, ``replayed``) saved in
    this rehearsal with ``submission_id``, or None. What does not open (a row damaged since) is None."""
    rows = {r.role: r for r in (await db.execute(
        select(RehearsalTurn).where(RehearsalTurn.rehearsal_id == rehearsal_id,
                                    RehearsalTurn.user_id == cipher.user_id,
                                    RehearsalTurn.submission_id == submission_id))).scalars()}
    if not rows:
        return None
    agent = rows["agent"]
    readings = (await db.execute(select(Reading).where(Reading.turn_id == agent.id))).scalars().all()
    with Readable(cipher.user_id, "resent rehearsal turn") as read:
        return read(unseal, cipher, rows["user"], "body_ct"), _turn_view(
            cipher, agent, read, _read_results(cipher, readings, read), replayed=True)


async def saved_rehearsal_turn(db: AsyncSession, cipher: UserCipher, rehearsal_id: str, submission_id: str | None,
                               text: str) -> TurnView | None:
    """The agent's turn (with its readings) saved in this rehearsal with ``submission_id``, or None (no id, or none
    saved with it). InputError when it was saved for another text."""
    return await once_per_submission(db, submission_id, text,
                                     lambda sid: _rehearsal_turn_with_id(db, cipher, rehearsal_id, sid))


async def save_rehearsal_exchange(db: AsyncSession, cipher: UserCipher, rehearsal_id: str, text: str,
                                  reply: str, submission_id: str | None = None, *, mood: str | None = None,
                                  suggested_actions: Sequence[str] = ()) -> TurnView:
    """Phase 1 of a turn, as soon as the reply is final: the user's turn and the agent's (no readings yet; its
    ``mood`` and ``suggested_actions``, the reply envelope's, sealed in its meta_ct as a chat reply's), in one
    transaction (NotFound, nothing written, if the rehearsal is gone). With a ``submission_id`` already saved in this
    rehearsal (a resend that raced the first), nothing is written and the saved turn comes back (``replayed``, with
    the readings saved so far): its panel is the first submission's to run."""
    submission_id = check_submission_id(submission_id)
    now = utcnow()
    user_row = RehearsalTurn(id=new_id(), user_id=cipher.user_id, rehearsal_id=rehearsal_id, role="user", created_at=now,
                             submission_id=submission_id)
    user_row.body_ct = seal(cipher, user_row, "body_ct", text)
    agent_row = RehearsalTurn(id=new_id(), user_id=cipher.user_id, rehearsal_id=rehearsal_id, role="agent",
                              created_at=now + timedelta(microseconds=1), submission_id=submission_id)
    agent_row.body_ct = seal(cipher, agent_row, "body_ct", reply)
    hints = list(suggested_actions)
    agent_row.meta_ct = seal_json(cipher, agent_row, "meta_ct", {"mood": mood, "suggested_actions": hints})

    async def write() -> TurnView:
        await check_owned(db, Rehearsal, cipher.user_id, rehearsal_id, "rehearsal")
        db.add_all([user_row, agent_row])
        return TurnView(id=agent_row.id, role="agent", text=reply, created_at=agent_row.created_at, mood=mood,
                        suggestions=hints)

    return await once_per_submission(db, submission_id, text,
                                     lambda sid: _rehearsal_turn_with_id(db, cipher, rehearsal_id, sid), write,
                                     lambda: check_owned(db, Rehearsal, cipher.user_id, rehearsal_id, "rehearsal"))


async def save_turn_readings(db: AsyncSession, cipher: UserCipher, turn: TurnView,
                             results: list[PanelResult]) -> bool:
    """Phase 2 of a turn, once the panel has finished: its readings of the agent's ``turn`` (saved by
    save_rehearsal_exchange), in a transaction of their own; ``turn.results`` become ``results``. False, nothing
    written and nothing raised, when the turn went meanwhile (the rehearsal deleted while the panel read): the user's
    turn did not fail, what it was saved into is gone."""
    turn.results = results

    async def there() -> bool:
        found = select(RehearsalTurn.id).where(RehearsalTurn.id == turn.id, RehearsalTurn.role == "agent",
                                               RehearsalTurn.user_id == cipher.user_id)
        return (await db.execute(found)).scalar_one_or_none() is not None

    try:
        async with db.begin():
            if not await there():
                return False
            db.add_all(_reading_rows(cipher, results, turn_id=turn.id))
            return True
    except IntegrityError:  # the turn was deleted between the look-up and the insert (a foreign key refused them)
        async with db.begin():
            if await there():
                raise
        return False


@contextlib.contextmanager
def readings_or_kept_exchange(turn: TurnView) -> Iterator[None]:
    """Around phase 2 of a turn whose exchange is saved (the panel reading it, save_turn_readings): a failure in it
    (the database refused the readings or went away) is logged, not raised, and sets ``turn.readings_lost``; the
    exchange stays saved, and the caller tells the user that only its readings are not. The streamed turn
    (routes.simulation._stream_rehearsal) and the form's (rehearsal_turn) both run their phase 2 in it."""
    try:
        yield
    except Exception:  # noqa: BLE001 - the exchange is saved; the page must learn that its readings are not
        log.exception("rehearsal turn: the panel's readings could not be saved")
        turn.readings_lost = True


def panel_note(turn: TurnView, analyst_timeout_s: float, now: datetime | None = None) -> str:
    """What the rehearsal page says of an agent turn without readings: "pending" while the panel may still be
    reading it (saved less than analyst_timeout_s + PANEL_MARGIN_S ago), "lost" after that (the process stopped
    while the panel read: the readings will not come); "" for a turn with readings, or a user's."""
    if turn.role != "agent" or turn.results:
        return ""
    created = turn.created_at if turn.created_at.tzinfo else turn.created_at.replace(tzinfo=timezone.utc)
    age = (now or utcnow()) - created
    return "pending" if age < timedelta(seconds=analyst_timeout_s + PANEL_MARGIN_S) else "lost"


async def rehearsal_turn(db: AsyncSession, model: Any, cipher: UserCipher, rehearsal_id: str, text: str, *,
                         max_chars: int, turns: int, deadline_s: float, analyst_timeout_s: float,
                         prompt_memories: int = PROMPT_MEMORIES, submission_id: str | None = None,
                         max_prompt_chars: int = MAX_PROMPT_CHARS) -> TurnView:
    """The agent replies, both turns are saved (save_rehearsal_exchange), the panel reads the exchange and its
    readings are saved (save_turn_readings): if the panel's readings cannot be saved, the exchange stays saved and
    the turn comes back with ``readings_lost`` (readings_or_kept_exchange), nothing raised. A
    ``submission_id`` already saved in this rehearsal returns that turn without asking the model (nor the panel,
    when the resend raced the first to the save); a reply the streamed path would fail (model.check_as_streamed)
    fails here too, nothing saved."""
    text = clean_text(text, "message", max_chars)
    submission_id = check_submission_id(submission_id)
    if (saved := await saved_rehearsal_turn(db, cipher, rehearsal_id, submission_id, text)) is not None:
        return saved
    view, shared, messages = await rehearsal_context(db, cipher, rehearsal_id, text, turns=turns,
                                                     prompt_memories=prompt_memories,
                                                     max_prompt_chars=max_prompt_chars)
    result = await model.complete(messages, kind="chat", deadline_s=deadline_s, request_id=uuid.uuid4().hex)
    check_as_streamed(result)
    reply = result.envelope.message
    turn = await save_rehearsal_exchange(db, cipher, rehearsal_id, text, reply, submission_id,
                                         mood=result.envelope.mood, suggested_actions=result.envelope.suggested_actions)
    if turn.replayed:
        return turn
    with readings_or_kept_exchange(turn):
        situation = partial(exchange_for_panel, view, text, reply, max_prompt_chars=max_prompt_chars)
        results = await run_panel(model, shared, situation, analyst_timeout_s)
        await save_turn_readings(db, cipher, turn, results)
    return turn


async def delete_rehearsal(db: AsyncSession, user_id: str, rehearsal_id: str) -> None:
    await delete_owned(db, Rehearsal, user_id, rehearsal_id, "rehearsal")
