"""Small helpers shared by the app's services: the not-found error, input text checks, saving a resent turn
once, reading the rows of a list of ids that may be too long for one statement (rows_in), encrypt/decrypt of one
model field (table + record id + field bound as associated data), and reading the sealed texts of a page so that
one damaged row does not take the page down (Readable)."""

from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable, Sequence

from sqlalchemy import Select, and_, delete, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app.crypto import DecryptError, UserCipher
from hearth.app.storage.db import scrub_deleted
# what a form's free-text field may hold once cleaned, whatever max_text_chars says (the bound of that setting, so it
# lives with the settings' bounds)
from hearth.companion_rules import FORM_TEXT_MAX


log = logging.getLogger("hearth.app")

# the same field as sent, the limit FastAPI checks (Form(max_length)) before clean_text: a browser sends each line
# break of a text box as CR LF, two characters where the box's maxlength and clean_text count one, so a text of
# FORM_TEXT_MAX characters may arrive as up to twice as many
FORM_FIELD_MAX = 2 * FORM_TEXT_MAX
# the most ids one statement of rows_in binds: PostgreSQL's protocol carries at most 32767 bound parameters a
# statement (asyncpg refuses more) and SQLite caps them too (SQLITE_MAX_VARIABLE_NUMBER: 32766 since 3.32, 999
# before), so a list of ids that grows with what a user wrote (all their posts for the export) goes in chunks
IN_CHUNK = 1000


class NotFound(LookupError):
    """The record does not exist or belongs to another user (routes answer 404 either way)."""


class UnreadableText(RuntimeError):
    """A turn cannot go on without a text that does not open (a damaged row): a companion's persona, the person a
    rehearsal plays. Nothing is asked or saved; the message is safe to show to the user."""


class InputError(ValueError):
    """Bad form input; ``.field`` names it and the message is safe to show to the user."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


async def check_owned(db: AsyncSession, model: Any, user_id: str, record_id: str, what: str) -> None:
    """Inside an open transaction: NotFound(what) unless ``user_id`` owns the ``model`` row ``record_id``."""
    owned = select(model.id).where(model.id == record_id, model.user_id == user_id)
    if (await db.execute(owned)).scalar_one_or_none() is None:
        raise NotFound(what)


async def page_before(db: AsyncSession, model: Any, scope: tuple, *, limit: int, before: str | None,
                      what: str) -> tuple[list, str | None]:
    """Inside an open transaction: the ``model`` rows matching ``scope`` (where-clauses: the user's, the chat's...),
    newest first by (created_at, id), up to ``limit`` of them just older than row ``before`` (or the newest of all),
    and the id to pass as ``before`` for the page of older ones (None at the end). NotFound(what) when ``before``
    is not a row within ``scope``. Rows sharing a timestamp are ordered by id, so no page skips or repeats one."""
    query = select(model).where(*scope)
    if before is not None:
        pivot = (await db.execute(select(model.created_at).where(model.id == before, *scope))).scalar_one_or_none()
        if pivot is None:
            raise NotFound(what)
        query = query.where(or_(model.created_at < pivot, and_(model.created_at == pivot, model.id < before)))
    rows = (await db.execute(query.order_by(model.created_at.desc(), model.id.desc()).limit(limit + 1))
            ).scalars().all()
    return list(rows[:limit]), (rows[limit - 1].id if len(rows) > limit else None)


async def rows_in(db: AsyncSession, query: Select, column: Any, ids: Sequence[Any], *,
                  scalars: bool = False) -> list:
    """Inside an open transaction: the rows of ``query`` whose ``column`` is one of ``ids`` (``query.where(
    column.in_(ids))``), asked IN_CHUNK ids a statement so that no list of ids is too long for the database;
    ``scalars``: the first entity of each row, as ``.scalars()``. No ids: no statement, no rows. A repeated id
    counts once, as in one IN. Rows come chunk after chunk: ``query``'s ORDER BY holds within a chunk, so among
    the rows of any one id (they all come in that id's chunk), not across ids of different chunks."""
    ids = list(dict.fromkeys(ids))
    rows: list = []
    for start in range(0, len(ids), IN_CHUNK):
        result = await db.execute(query.where(column.in_(ids[start:start + IN_CHUNK])))
        rows.extend(result.scalars().all() if scalars else result.all())
    return rows


async def delete_owned(db: AsyncSession, model: Any, user_id: str, record_id: str, what: str) -> None:
    """Delete the ``model`` row ``record_id`` for good if ``user_id`` owns it (children go by ON DELETE
    CASCADE); NotFound(what) when there is no such row of that user's."""
    async with db.begin():
        gone = await db.execute(delete(model).where(model.id == record_id, model.user_id == user_id))
        if gone.rowcount != 1:
            raise NotFound(what)
    await scrub_deleted(db)


def clean_text(value: Any, field: str, max_chars: int, *, required: bool = True) -> str:
    """Strip and bound a user-supplied text; InputError naming ``field`` when empty or too long."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InputError(field, "must be text")
    text = value.strip().replace("\r\n", "\n")
    if required and not text:
        raise InputError(field, "must not be empty")
    if len(text) > max_chars:
        raise InputError(field, f"must be at most {max_chars} characters (got {len(text)})")
    return text


def check_submission_id(value: Any) -> str | None:
    """The page's id for one submission of a turn (32 lower-case hex digits; None or "" from a client that sends
    none): a resend with the id of a turn already saved gets that turn back instead of saving it twice."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) != 32 or value.strip("0123456789abcdef"):
        raise InputError("submission_id", "must be 32 lower-case hex digits")
    return value


def same_submission(saved_text: str, text: str) -> None:
    """A submission id found saved with another text: the client reused it for a new message, which would be lost
    if the saved turn were answered for it."""
    if saved_text != text:
        raise InputError("submission_id", "was already used for another message; reload the page and send it again")


async def once_per_submission(db: AsyncSession, submission_id: str | None, text: str,
                              find: Callable[[str], Awaitable[tuple[str, Any] | None]],
                              write: Callable[[], Awaitable[Any]] | None = None,
                              gone: Callable[[], Awaitable[None]] | None = None) -> Any:
    """A turn (a situation) sent with a submission id is saved once. ``find(submission_id)``, run inside a
    transaction of its own, reads what was saved with the id: (the text sent, what to answer, marked replayed),
    or None.

    Without ``write``: the saved answer, or None (no id, or none saved with it). With ``write``: its result, run
    inside one transaction; when that fails on an IntegrityError, the answer saved with the id, read back in a new
    transaction (the unique index refused the rows: another submission with this id committed first; the failed
    transaction rolled back whole, and on PostgreSQL nothing more could run in it). The IntegrityError propagates
    when nothing is saved with the id (no id, or another constraint): it is not a resend's to answer. Either way
    InputError (same_submission) when the id was saved with another text, or with one that does not open (``find``
    gives the text as None; the rest of its answer may hold None for what does not open, shown as unreadable).

    ``gone()``, run in a transaction of its own when the read-back finds nothing saved with the id (or there is no
    id), raises the caller's error when what the turn is saved into went meanwhile: a chat cleared, a companion
    deleted between the rollback and the read-back take the first submission's rows with them; without an id, the
    foreign key refused the rows because their companion, chat or rehearsal was deleted after the turn had checked
    it. The turn answers that (as it does when it finds it gone before writing), not the IntegrityError, which still
    propagates when ``gone()`` returns."""
    if write is not None:
        try:
            async with db.begin():
                return await write()
        except IntegrityError:
            if (saved := await once_per_submission(db, submission_id, text, find)) is None:
                if gone is not None:
                    async with db.begin():
                        await gone()
                raise
            return saved
    if submission_id is None:
        return None
    async with db.begin():
        found = await find(submission_id)
    if found is None:
        return None
    saved_text, saved = found
    if saved_text is None:  # a damaged row: it cannot be told from an id reused for another text, so nothing is kept
        raise InputError("submission_id", "was used for a text saved before that can no longer be read (its stored "
                                          "text does not open), so this one cannot be compared with it and was not "
                                          "saved; reload the page and send it again")
    same_submission(saved_text, text)
    return saved


def seal(cipher: UserCipher, row: Any, field: str, text: str) -> bytes:
    """Encrypt ``text`` for column ``field`` of ``row`` (the row's id must already be set)."""
    return cipher.encrypt(row.__tablename__, row.id, field, text)


def unseal(cipher: UserCipher, row: Any, field: str) -> str:
    return cipher.decrypt(row.__tablename__, row.id, field, getattr(row, field))


def seal_json(cipher: UserCipher, row: Any, field: str, data: Any) -> bytes:
    return seal(cipher, row, field, json.dumps(data, ensure_ascii=False))


def unseal_json(cipher: UserCipher, row: Any, field: str) -> Any:
    return json.loads(unseal(cipher, row, field))


UNREADABLE_NAME = "(name could not be read)"  # shown for a companion's or agent's name that does not open
SHOWN = "shown as unreadable"
LEFT_OUT = "left out of what the model is told"


class Readable:
    """The sealed texts of one read (a page's list, the export's, a turn's context) opened so that one damaged row
    does not hide every other behind a 500: ``readable(unseal, cipher, row, field)`` is what ``unseal`` returns, or
    None (counted) when the sealed text does not open. The row is left as it is: a read never rewrites or deletes.

    Used as ``with Readable(user_id, "chat history") as readable:``; the outermost block logs one warning naming the
    user id, how many texts did not open and what became of them (``outcome``). A read passed a Readable of its
    caller's (``readable=``) counts into it, so a turn's context reports once, as left out of the prompt."""

    def __init__(self, user_id: str, what: str, outcome: str = SHOWN):
        self.user_id, self.what, self.outcome = user_id, what, outcome
        self.count, self._depth = 0, 0

    def __call__(self, read: Callable[..., Any], *args: Any) -> Any:
        try:
            return read(*args)
        except DecryptError:
            self.count += 1
            return None

    def __enter__(self) -> Readable:
        self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self.count:
            log.warning("%s: %d sealed text%s of user %s do%s not open (damaged rows); %s, left as they were",
                        self.what, self.count, "s" if self.count > 1 else "", self.user_id,
                        "" if self.count > 1 else "es", self.outcome)
            self.count = 0


def strict(read: Callable[..., Any], *args: Any) -> Any:
    """The reader where a text must open (a resend compared with the turn saved for it): DecryptError goes up."""
    return read(*args)


def reading(readable: Readable | None, user_id: str, what: str, outcome: str = SHOWN) -> Readable:
    """The caller's Readable (its block reports), or a new one for this read."""
    return readable if readable is not None else Readable(user_id, what, outcome)
