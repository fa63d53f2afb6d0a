"""SQLAlchemy 2 models. Every column holding user text is ``*_ct`` (AES-GCM ciphertext, see
``hearth.app.crypto``); plaintext columns hold only identifiers, enum-like labels, counters and times.

Ids are 32-character hex uuids generated in Python *before* insert, because each ciphertext binds
its record id as associated data. Child rows reference their owner with ``ON DELETE CASCADE`` so
clearing or deleting is a real delete, not a flag.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from sqlalchemy import (Boolean, DateTime, Double, ForeignKey, Index, Integer, LargeBinary, MetaData, String)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _id() -> Mapped[str]:
    return mapped_column(String(32), primary_key=True, default=new_id)


def _owner() -> Mapped[str]:
    return mapped_column(String(32), ForeignKey("users.id", ondelete="CASCADE"), index=True)


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), default=utcnow)


class User(Base):
    __tablename__ = "users"
    id: Mapped[str] = _id()
    username: Mapped[str] = mapped_column(String(64), unique=True)  # login name (lower-case)
    password_hash: Mapped[str] = mapped_column(String(255))
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary)  # data key under the master key
    master_key_id: Mapped[str] = mapped_column(String(16))
    shared_context_ct: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = _created()
    # device cookies are signed over it (hearth.app.throttle); a password change bumps it, so they stop counting
    device_epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Session(Base):
    __tablename__ = "sessions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the cookie token
    user_id: Mapped[str] = _owner()
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _created()
    # indexed (schema 0008): each new session sweeps expired ones of any user (accounts.sweep_expired_sessions)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Companion(Base):
    __tablename__ = "companions"
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    name_ct: Mapped[bytes] = mapped_column(LargeBinary)
    persona_ct: Mapped[bytes] = mapped_column(LargeBinary)
    world_view: Mapped[str] = mapped_column(String(32))
    share_context: Mapped[bool] = mapped_column(Boolean, default=True)
    affection: Mapped[int] = mapped_column(Integer, default=0)
    trust: Mapped[int] = mapped_column(Integer, default=0)
    # bumped by every clear: a turn read before a clear must not be saved after it
    chat_epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = _created()


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (Index("ix_messages_companion_created", "companion_id", "created_at"),
                      # a resend of a turn already saved (its page lost the connection) cannot save it twice, even
                      # when two resends race: the database refuses the second pair, not a check before the insert
                      Index("ix_messages_submission", "companion_id", "submission_id", "role", unique=True))
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    companion_id: Mapped[str] = mapped_column(String(32), ForeignKey("companions.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))  # "user" | "companion"
    body_ct: Mapped[bytes] = mapped_column(LargeBinary)
    meta_ct: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # mood, suggestions, provider
    created_at: Mapped[datetime] = _created()
    # the page's id for the submission that saved this turn, on both of its messages (None: sent without one)
    submission_id: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Memory(Base):
    __tablename__ = "memories"
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    companion_id: Mapped[str] = mapped_column(String(32), ForeignKey("companions.id", ondelete="CASCADE"), index=True)
    text_ct: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _created()


class Post(Base):
    __tablename__ = "posts"
    # a post sent again (its page lost the connection) is saved once, as a chat turn is
    __table_args__ = (Index("ix_posts_submission", "user_id", "submission_id", unique=True),)
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    body_ct: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _created()
    submission_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # as Message.submission_id


class Comment(Base):
    __tablename__ = "comments"
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    post_id: Mapped[str] = mapped_column(String(32), ForeignKey("posts.id", ondelete="CASCADE"), index=True)
    companion_id: Mapped[str] = mapped_column(String(32), ForeignKey("companions.id", ondelete="CASCADE"))
    body_ct: Mapped[bytes] = mapped_column(LargeBinary)
    tone: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = _created()


class Situation(Base):
    __tablename__ = "situations"
    # a situation asked of the panel again (its page lost the connection) is saved once, as a chat turn is
    __table_args__ = (Index("ix_situations_submission", "companion_id", "submission_id", unique=True),)
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    companion_id: Mapped[str] = mapped_column(String(32), ForeignKey("companions.id", ondelete="CASCADE"), index=True)
    text_ct: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _created()
    submission_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # as Message.submission_id


class SpentSituationSubmission(Base):
    """A submission id whose situation was deleted (schema 0009): a resend of it (the no-script form posted again,
    the page's script asking again after a lost stream) asks nothing and saves nothing, as a chat turn sent from a
    page loaded before a clear is refused. Written in the delete's transaction; no text, and gone with its companion
    or its user."""

    __tablename__ = "spent_situation_submissions"
    companion_id: Mapped[str] = mapped_column(String(32), ForeignKey("companions.id", ondelete="CASCADE"),
                                              primary_key=True)
    submission_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = _owner()


class Agent(Base):
    """A person the user rehearses a conversation with (the model plays them)."""

    __tablename__ = "agents"
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    name_ct: Mapped[bytes] = mapped_column(LargeBinary)
    personality_ct: Mapped[bytes] = mapped_column(LargeBinary)
    backstory_ct: Mapped[bytes] = mapped_column(LargeBinary)
    relationship_ct: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _created()


class Rehearsal(Base):
    __tablename__ = "rehearsals"
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    companion_id: Mapped[str] = mapped_column(String(32), ForeignKey("companions.id", ondelete="CASCADE"), index=True)
    agent_id: Mapped[str] = mapped_column(String(32), ForeignKey("agents.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = _created()


class RehearsalTurn(Base):
    __tablename__ = "rehearsal_turns"
    __table_args__ = (Index("ix_rehearsal_turns_rehearsal_created", "rehearsal_id", "created_at"),
                      Index("ix_rehearsal_turns_submission", "rehearsal_id", "submission_id", "role", unique=True))
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    rehearsal_id: Mapped[str] = mapped_column(String(32), ForeignKey("rehearsals.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))  # "user" | "agent"
    body_ct: Mapped[bytes] = mapped_column(LargeBinary)
    # an agent turn's mood and suggested actions (the coaching hints), as Message.meta_ct; None: a user's turn, or
    # one saved before schema 0007
    meta_ct: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = _created()
    submission_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # as Message.submission_id


class Reading(Base):
    """One analyst's reading of a situation, or of a rehearsal turn (exactly one parent is set)."""

    __tablename__ = "readings"
    id: Mapped[str] = _id()
    user_id: Mapped[str] = _owner()
    situation_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("situations.id", ondelete="CASCADE"), nullable=True, index=True)
    turn_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("rehearsal_turns.id", ondelete="CASCADE"), nullable=True, index=True)
    analyst: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))  # "ok" | "failed"
    body_ct: Mapped[bytes] = mapped_column(LargeBinary)  # JSON: reading/advice/risk, or the failure
    created_at: Mapped[datetime] = _created()


class AuthThrottle(Base):
    """Failed login / signup attempts per key, shared by every app worker (see hearth.app.throttle).

    ``key`` is a SHA-256 of what is limited (e.g. account + client address), so the table holds no
    usernames or addresses in clear. Times are epoch seconds (plain numbers: portable arithmetic in SQL).
    ``account`` (login buckets only; schema 0010): a keyed hash of the username, the same for every client's
    bucket of it, so that deleting the account deletes them all.
    """

    __tablename__ = "auth_throttle"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempts: Mapped[int] = mapped_column(Integer)
    last_at: Mapped[float] = mapped_column(Double, index=True)
    blocked_until: Mapped[float] = mapped_column(Double)
    account: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)
