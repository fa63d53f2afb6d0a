"""Start-up checks run before the app serves anything (by the lifespan, and once by ``hearth serve``
before it starts its workers):

    0. open one connection to the database: one that cannot be reached (a server down, a wrong host, port, user,
       password or database name) is refused naming database_url (the URL without its password), not a traceback;
    1. bring the schema to the packaged alembic head; a database a newer hearth migrated (a revision these
       migrations do not hold) is refused naming the revision, and left as it is;
    2. rotate: re-wrap data keys under the new master key when HEARTH_PREVIOUS_MASTER_KEY is set;
    3. the master key must open every user's data key. When users exist and their keys are wrapped
       under another master key, start-up is REFUSED with a message naming both keys (by fingerprint,
       never the key) and how to fix it; a development key is never created while users exist. A user
       whose own row is damaged (the key under the right fingerprint does not open) does not stop the others:
       refused only when no user's key opens;
    4. seal what an older version left in the clear: the tone of feed comments written before it was sealed with
       the comment (the ``tone`` column, e.g. "grieving": how the user's post came across). A comment that
       cannot be sealed (damaged row) is left as it was, with a warning naming the user; the next start retries.

    await prepare(settings, db)     # StartupError (a RuntimeError) with the message for the operator
"""

from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from hearth.app import crypto
from hearth.app.common import seal_json, unseal
from hearth.app.keys import rotate_master_key
from hearth.app.settings import AppSettings, write_new_dev_key
from hearth.app.storage import Database, unknown_revisions, upgrade
from hearth.app.storage.db import scrub_deleted
from hearth.app.storage.models import Comment, User

log = logging.getLogger("hearth.app")


class StartupError(RuntimeError):
    """The app must not start; the message says why and what to do."""


FIX = ("Start with the master key those users were created under (HEARTH_MASTER_KEY, HEARTH_MASTER_KEY_FILE or "
       "[app] master_key_file; in development the file var/master.key), or, to move them to a new key, set "
       "HEARTH_MASTER_KEY=<new key> and HEARTH_PREVIOUS_MASTER_KEY=<the key they are under> once.")


async def _key_census(db: Database) -> dict[str, int]:
    """Users per master-key fingerprint."""
    async with db.sessions() as s, s.begin():
        rows = (await s.execute(select(User.master_key_id, func.count()).group_by(User.master_key_id))).all()
    return {k: n for k, n in rows}


async def _check_one_unwraps(db: Database, master: bytes) -> None:
    """Fingerprints can be edited in the database: prove the key by opening one user's data key. A user whose key
    does not open (a damaged row) does not decide it: the next one does, and start-up is refused only when none
    opens. That user cannot log in; the others can."""
    mine, after = crypto.master_key_id(master), ""
    damaged: list[tuple[str, str]] = []
    async with db.sessions() as s:
        while True:  # one user in the usual case; all of them, SEAL_BATCH at a time, only while none opens
            async with s.begin():
                rows = (await s.execute(select(User.id, User.username, User.wrapped_key)
                                        .where(User.master_key_id == mine, User.id > after)
                                        .order_by(User.id).limit(SEAL_BATCH))).all()
            for user_id, username, wrapped in rows:
                try:
                    crypto.unwrap_data_key(master, wrapped, user_id)
                except crypto.DecryptError:
                    damaged.append((user_id, username))
                    continue
                for bad, _ in damaged:
                    log.warning("master key: the data key of user %s does not open although its fingerprint "
                                "matches (a damaged users row); that user cannot log in", bad)
                return
            if len(rows) < SEAL_BATCH:
                break
            after = rows[-1].id
    if damaged:
        more = f" (nor that of any of the {len(damaged)} users under its fingerprint)" if len(damaged) > 1 else ""
        raise StartupError(f"master key: the configured key does not open the data key of user {damaged[0][1]!r}"
                           f"{more} although its fingerprint matches; the users table was altered or restored from "
                           f"elsewhere. Nothing was changed.")


async def _rotate(db: Database, previous: bytes, master: bytes) -> int:
    """rotate_master_key; where a data key under the previous key's fingerprint does not open (a damaged row), the
    rotation changes nothing and raises a DecryptError that names neither them nor a fix: refuse the start naming
    those users (rotating only the others would leave them stranded, and the census refuses that start anyway)."""
    try:
        return await rotate_master_key(db, previous, master)
    except crypto.DecryptError:
        pass
    async with db.sessions() as s, s.begin():
        rows = (await s.execute(select(User.id, User.wrapped_key)
                                .where(User.master_key_id == crypto.master_key_id(previous)))).all()
    damaged: list[str] = []
    for user_id, wrapped in rows:
        try:
            crypto.unwrap_data_key(previous, wrapped, user_id)
        except crypto.DecryptError:
            damaged.append(user_id)
    named = ", ".join(sorted(damaged)) or "(none on a second look: start again)"
    raise StartupError(f"master key: HEARTH_PREVIOUS_MASTER_KEY does not open the data key of user(s) {named} "
                       f"although their fingerprint matches; the users table was altered or restored from elsewhere. "
                       f"Nothing was changed (no data key was re-wrapped).")


# comments sealed a transaction at a time: the first start after an upgrade may find a whole table of them, and one
# SELECT of every row held them all in memory (and the write lock for the whole table's time)
SEAL_BATCH = 500


async def _seal_plain_tones(db: Database, master: bytes, *, batch: int = SEAL_BATCH) -> int:
    """Move the tone of comments written before it was sealed into their sealed body ({"comment", "tone"}, as new
    comments are written) and empty the plain column, ``batch`` comments a transaction; returns how many. A start
    stopped part-way leaves each comment either sealed or as it was (the readers take both), and the next start goes
    on. A comment that cannot be sealed (its user's data key or its own body does not open: a damaged row) is left
    exactly as it was, with a warning naming the user, and the next start tries it again: one damaged row must not
    keep the app from starting for everyone."""
    done = 0
    ciphers: dict[str, crypto.UserCipher | None] = {}  # None: that user's data key does not open
    left: dict[tuple[str, str], int] = {}  # (user id, why): comments left as they were
    after = ""  # past the last comment read: the ones left keep their plain tone and must not be read again
    async with db.sessions() as s:
        while True:
            async with s.begin():
                rows = (await s.execute(select(Comment, User.wrapped_key).join(User, User.id == Comment.user_id)
                                        .where(Comment.tone != "", Comment.id > after)
                                        .order_by(Comment.id).limit(batch))).all()
                for comment, wrapped in rows:
                    if comment.user_id not in ciphers:
                        try:
                            ciphers[comment.user_id] = crypto.UserCipher.from_wrapped(master, wrapped, comment.user_id)
                        except crypto.DecryptError:
                            ciphers[comment.user_id] = None
                    cipher = ciphers[comment.user_id]
                    if cipher is None:
                        why = "the user's data key does not open under the master key"
                    else:
                        try:
                            text = unseal(cipher, comment, "body_ct")
                        except crypto.DecryptError:
                            why = "their sealed comment text does not open"
                        else:
                            comment.body_ct = seal_json(cipher, comment, "body_ct", {"comment": text,
                                                                                     "tone": comment.tone})
                            comment.tone = ""
                            done += 1
                            continue
                    left[comment.user_id, why] = left.get((comment.user_id, why), 0) + 1
                if rows:
                    after = rows[-1][0].id
            s.expunge_all()  # the sealed rows are not needed again: memory stays one batch
            if len(rows) < batch:
                break
        if done:  # the old page copies in SQLite's WAL held the plain tones
            await scrub_deleted(s)
    for (user_id, why), n in sorted(left.items()):
        log.warning("the plain tone of %d comments of user %s, written by an older version, was left as it was: %s; "
                    "the next start tries again", n, user_id, why)
    return done


async def _reachable(db: Database) -> None:
    """StartupError naming database_url when no connection to the database opens (step 0 of the module docstring):
    the URL as the engine has it, its password shown as ***, and the driver's reason (which never holds the
    password: it is taken out should it appear)."""
    try:
        async with db.engine.connect():
            pass
    except Exception as exc:  # noqa: BLE001 - whatever stops the first connection: OSError, the driver's errors
        url = db.engine.url
        reason = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        text = " ".join(str(reason).split()) or type(reason).__name__
        if url.password:
            text = text.replace(str(url.password), "***")
        raise StartupError(f"database_url: cannot connect to {url.render_as_string(hide_password=True)}: {text}. "
                           "Check that the database server is running and that the URL's host, port, user, password "
                           "and database name are right.") from None


async def prepare(settings: AppSettings, db: Database) -> None:
    """Migrate, rotate, and check the master key against the users (see the module docstring)."""
    await _reachable(db)
    if unknown := await unknown_revisions(db.engine):
        raise StartupError(f"database_url: the database's schema is at revision {', '.join(unknown)}, which this "
                           "version of hearth does not know: a newer version migrated it. Run that version (or a newer "
                           "one), or restore a backup taken before it. Nothing was changed.")
    await upgrade(db.engine)
    master = settings.master_key.get_secret_value()
    census = await _key_census(db)
    users = sum(census.values())
    if settings.new_dev_key_file is not None and users:
        ids = ", ".join(sorted(census))
        raise StartupError(
            f"master key: {settings.new_dev_key_file} does not exist, but the database already holds {users} "
            f"user(s) whose data keys are wrapped under master key {ids}. A new key was NOT created (it could not "
            f"decrypt them). Put the original key file back at {settings.new_dev_key_file}, or set "
            f"HEARTH_MASTER_KEY to the key they were created with.")
    if settings.previous_master_key is not None:
        n = await _rotate(db, settings.previous_master_key.get_secret_value(), master)
        log.warning("re-wrapped %d users' data keys under the new master key", n)
        census = await _key_census(db)
    mine = crypto.master_key_id(master)
    stranded = {k: n for k, n in census.items() if k != mine}
    if stranded:
        found = ", ".join(f"{n} under key {k}" for k, n in sorted(stranded.items()))
        raise StartupError(
            f"master key: the configured key ({settings.master_key_source}, fingerprint {mine}) cannot open the data "
            f"keys of {sum(stranded.values())} user(s) ({found}); they could not log in, so the app will not start. "
            + FIX)
    await _check_one_unwraps(db, master)
    if sealed := await _seal_plain_tones(db, master):
        log.warning("sealed the plain tone of %d comments written by an older version", sealed)
    write_new_dev_key(settings)
