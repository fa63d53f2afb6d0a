"""The feed: the user posts; companions comment (``feed_comment`` envelopes).

Comments are asked for concurrently (one call per companion, each with its own timeout) before
anything is written; the post and the comments that arrived are then saved in ONE transaction. A
companion whose call failed simply has no comment; the post is saved either way.

A post or comment whose sealed text does not open (a damaged row) does not take the page down with it: its text
comes back as None ("could not be read"), every other one as usual, and the row is left as it is
(common.Readable). A companion whose persona does not open does not comment: it cannot be played.

Which companions comment: at most ``max_commenters``, those who commented least recently first (never first of
all, then by their last comment; ties by age), so every companion takes its turn across posts, in rotation.

A post sent with a submission id (the feed form's, one per page) is saved once per user, as a chat turn is
(hearth.app.companions): a resend gets the saved post and its comments back (``replayed``), the companions not
asked again; two resends racing store one post (the unique index decides, common.once_per_submission).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from hearth import prompts
from hearth.app.common import (LEFT_OUT, InputError, Readable, check_submission_id, clean_text, delete_owned,
                               once_per_submission, page_before, rows_in, seal, seal_json, unseal, unseal_json)
from hearth.app.companions import CompanionView, context_for, get_shared_context, list_companions
from hearth.app.crypto import UserCipher
from hearth.app.storage.models import Comment, Companion, Post, new_id, utcnow


@dataclass
class CommentView:  # None: stored, but its sealed text does not open (a damaged row)
    companion_id: str
    companion_name: str | None
    text: str | None
    tone: str | None


@dataclass
class PostView:
    id: str
    text: str | None  # None: stored, but its sealed text does not open (a damaged row)
    created_at: datetime
    comments: list[CommentView] = field(default_factory=list)


@dataclass
class PostResult:
    post_id: str
    comments: list[CommentView]
    failed: list[str]  # names of companions whose comment did not arrive ([] when replayed: they are not kept)
    replayed: bool = False  # saved by an earlier submission with the same id (saved_post)


async def _comment(model: Any, companion: CompanionView, shared: str, text: str, timeout_s: float):
    system = prompts.feed_system_prompt(persona=companion.persona, world_view=companion.world_view,
                                        shared_context=context_for(companion, shared))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    result = await asyncio.wait_for(model.complete(messages, kind="feed_comment", deadline_s=timeout_s,
                                                   request_id=uuid.uuid4().hex), timeout=timeout_s + 1.0)
    return result.envelope


async def _commenters(db: AsyncSession, cipher: UserCipher, limit: int, readable: Readable) -> list[CompanionView]:
    """Up to ``limit`` companions, those who commented least recently first (never, then the oldest last
    comment; ties in creation order). Their comments are timed in this order, so the turns go round. One whose
    persona does not open is left out (it cannot be played)."""
    companions = [c for c in await list_companions(db, cipher, readable=readable) if c.persona is not None]
    async with db.begin():
        last = dict((await db.execute(select(Comment.companion_id, func.max(Comment.created_at))
                                      .where(Comment.user_id == cipher.user_id)
                                      .group_by(Comment.companion_id))).all())
    order = sorted(range(len(companions)), key=lambda i: (companions[i].id in last, last.get(companions[i].id), i))
    return [companions[i] for i in order[:limit]]


async def _comment_views(db: AsyncSession, cipher: UserCipher, post_ids: list[str],
                         readable: Readable) -> dict[str, list[CommentView]]:
    """Inside an open transaction: the comments on these posts, oldest first, by post id (all of a post's come in
    one chunk of rows_in, ordered there)."""
    comments = await rows_in(db, select(Comment, Companion).join(Companion, Companion.id == Comment.companion_id)
                             .where(Comment.user_id == cipher.user_id).order_by(Comment.created_at),
                             Comment.post_id, post_ids)
    by_post: dict[str, list[CommentView]] = {}
    for c, comp in comments:
        if c.tone:  # written before the tone was sealed: the body is the bare comment text
            text, tone = readable(unseal, cipher, c, "body_ct"), c.tone
        else:
            sealed = readable(unseal_json, cipher, c, "body_ct") or {"comment": None, "tone": None}
            text, tone = sealed["comment"], sealed["tone"]
        by_post.setdefault(c.post_id, []).append(
            CommentView(comp.id, readable(unseal, cipher, comp, "name_ct"), text, tone))
    return by_post


async def _post_with_id(db: AsyncSession, cipher: UserCipher, submission_id: str) -> tuple[str, PostResult] | None:
    """Inside an open transaction: the text and the post (with its comments, ``replayed``) this user saved with
    ``submission_id``, or None. What does not open (a row damaged since) is None."""
    row = (await db.execute(select(Post).where(Post.user_id == cipher.user_id,
                                               Post.submission_id == submission_id))).scalar_one_or_none()
    if row is None:
        return None
    with Readable(cipher.user_id, "resent post") as read:
        text = read(unseal, cipher, row, "body_ct")
        comments = (await _comment_views(db, cipher, [row.id], read)).get(row.id, [])
    return text, PostResult(post_id=row.id, comments=comments, failed=[], replayed=True)


async def saved_post(db: AsyncSession, cipher: UserCipher, submission_id: str | None, text: str) -> PostResult | None:
    """The post (with its comments) this user saved with ``submission_id``, or None (no id, or none saved with
    it). InputError when it was saved for another text."""
    return await once_per_submission(db, submission_id, text, lambda sid: _post_with_id(db, cipher, sid))


async def create_post(db: AsyncSession, model: Any, cipher: UserCipher, text: str, *, max_chars: int,
                      max_commenters: int, timeout_s: float, submission_id: str | None = None) -> PostResult:
    """Ask the companions for their comments, then save the post and those that arrived in one transaction. With
    a ``submission_id`` this user already saved a post with (a resend: the connection dropped after the commit),
    nothing is asked or written and the saved post comes back (``replayed``); likewise when a resend racing this
    one saved it first. InputError (field ``submission_id``) when the id was saved with another text."""
    text = clean_text(text, "post", max_chars)
    submission_id = check_submission_id(submission_id)
    if (saved := await saved_post(db, cipher, submission_id, text)) is not None:
        return saved
    with Readable(cipher.user_id, "feed comments", LEFT_OUT) as readable:
        companions = await _commenters(db, cipher, max_commenters, readable)
        shared = await get_shared_context(db, cipher, readable=readable) or ""
    outcomes = await asyncio.gather(*(_comment(model, c, shared, text, timeout_s) for c in companions),
                                    return_exceptions=True)
    now = utcnow()
    post = Post(id=new_id(), user_id=cipher.user_id, created_at=now, submission_id=submission_id)
    post.body_ct = seal(cipher, post, "body_ct", text)
    rows, views, failed = [], [], []
    for i, (comp, out) in enumerate(zip(companions, outcomes)):
        if isinstance(out, BaseException):
            if not isinstance(out, Exception):  # CancelledError & co. must not be swallowed
                raise out
            failed.append(comp.name)
            continue
        # the tone says how the post came across ("grieving"), so it is sealed with the comment; the
        # plaintext tone column stays empty (it is only read for rows written before this change)
        row = Comment(id=new_id(), user_id=cipher.user_id, post_id=post.id, companion_id=comp.id, tone="",
                      created_at=now + timedelta(microseconds=i + 1))
        row.body_ct = seal_json(cipher, row, "body_ct", {"comment": out.comment, "tone": out.tone})
        rows.append(row)
        views.append(CommentView(comp.id, comp.name, out.comment, out.tone))

    async def write() -> PostResult:
        db.add(post)
        await db.flush()
        # a companion deleted while the comments were generated must not get a dangling comment; the key-share
        # lock (PostgreSQL; SQLite already serialises the writers) holds off a delete between this check and the
        # comments' insert, whose foreign key would otherwise fail and roll the post back with it
        alive = set((await db.execute(select(Companion.id).where(Companion.user_id == cipher.user_id)
                                      .with_for_update(key_share=True))).scalars())
        db.add_all([r for r in rows if r.companion_id in alive])
        return PostResult(post_id=post.id, comments=[v for v in views if v.companion_id in alive], failed=failed)

    async def gone() -> None:  # what the first submission saved went between the rollback and the read-back
        if submission_id is not None:  # (without an id, the IntegrityError is another constraint's: it propagates)
            raise InputError("submission_id", "was used for a post that was deleted while your companions read "
                                              "this one, so it was not saved again; send it again to post it anew")

    return await once_per_submission(db, submission_id, text, lambda sid: _post_with_id(db, cipher, sid), write,
                                     gone)


async def list_posts(db: AsyncSession, cipher: UserCipher, limit: int = 50) -> list[PostView]:
    return (await posts_page(db, cipher, limit=limit))[0]


async def posts_page(db: AsyncSession, cipher: UserCipher, *, limit: int = 50,
                     before: str | None = None) -> tuple[list[PostView], str | None]:
    """(up to ``limit`` posts, newest first, the newest of them just older than post ``before`` or the newest
    of all; the id to pass as ``before`` for the page of older posts, None at the end).
    NotFound for a ``before`` that is not one of the user's posts."""
    async with db.begin():
        posts, older = await page_before(db, Post, (Post.user_id == cipher.user_id,), limit=limit, before=before,
                                         what="post")
        with Readable(cipher.user_id, "feed") as readable:
            by_post = await _comment_views(db, cipher, [p.id for p in posts], readable)
            views = [PostView(id=p.id, text=readable(unseal, cipher, p, "body_ct"), created_at=p.created_at,
                              comments=by_post.get(p.id, [])) for p in posts]
    return views, older


async def delete_post(db: AsyncSession, user_id: str, post_id: str) -> None:
    await delete_owned(db, Post, user_id, post_id, "post")
