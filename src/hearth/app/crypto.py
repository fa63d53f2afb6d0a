"""Envelope encryption of every user text at rest.

Two layers, both AES-256-GCM (``cryptography``):

    master key (32 bytes, from HEARTH_MASTER_KEY or a key file; never stored in the database)
      └─ wraps one data key per user (32 random bytes)   aad = "hearth/dek/v1|<user id>"
           └─ encrypts each text field of that user       aad = "hearth/v1|<user id>|<table>|<record id>|<field>"

Binding the user id, table, record id and field name as associated data means a ciphertext copied
to another row, another column or another user's row fails authentication instead of decrypting
into the wrong place. Blobs are ``version byte (1) | nonce (12) | ciphertext + tag``.

Errors: ``DecryptError`` (a ValueError) when a blob is corrupt, moved, or wrapped under another key;
``ValueError``/``TypeError`` naming the argument for bad keys or inputs.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_VERSION = 1
_NONCE = 12
KEY_BYTES = 32


class DecryptError(ValueError):
    """A ciphertext did not authenticate: wrong key, wrong row/user/field, or tampered bytes."""


def _check_key(key: bytes, name: str) -> bytes:
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"{name}: expected bytes, got {type(key).__name__}")
    if len(key) != KEY_BYTES:
        raise ValueError(f"{name}: expected {KEY_BYTES} bytes, got {len(key)}")
    return bytes(key)


def parse_master_key(text: str) -> bytes:
    """Decode a master key written as 64 hex characters or urlsafe base64 of 32 bytes.

    Raises ValueError naming ``master_key`` when the text is neither, or decodes to the wrong size.
    """
    text = text.strip()
    raw: bytes | None = None
    if len(text) == 2 * KEY_BYTES:
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = None
    if raw is None:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (ValueError, TypeError) as exc:
            raise ValueError("master_key: not 64 hex characters nor base64 of 32 bytes") from exc
    if len(raw) != KEY_BYTES:
        raise ValueError(f"master_key: decodes to {len(raw)} bytes, expected {KEY_BYTES}")
    if len(set(raw)) < 8:
        # an all-zero or repeated-byte key is a placeholder, not a secret
        raise ValueError("master_key: looks like a placeholder (too few distinct bytes)")
    return raw


def new_master_key_text() -> str:
    """A fresh random master key as urlsafe base64 (what HEARTH_MASTER_KEY expects)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode().rstrip("=")


def master_key_id(master_key: bytes) -> str:
    """A short, non-secret fingerprint of a master key (stored with wrapped keys to spot a mismatch)."""
    return hashlib.sha256(b"hearth/master-id|" + _check_key(master_key, "master_key")).hexdigest()[:16]


def _seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE)
    return bytes([_VERSION]) + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def _open(key: bytes, blob: bytes, aad: bytes) -> bytes:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"blob: expected bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < 1 + _NONCE + 16 or blob[0] != _VERSION:
        raise DecryptError("blob: truncated or unknown version")
    try:
        return AESGCM(key).decrypt(blob[1 : 1 + _NONCE], blob[1 + _NONCE :], aad)
    except InvalidTag as exc:
        raise DecryptError("blob: authentication failed (wrong key, row, user or field)") from exc


def _dek_aad(user_id: str) -> bytes:
    return f"hearth/dek/v1|{user_id}".encode()


def new_data_key() -> bytes:
    """32 random bytes: one user's data key."""
    return os.urandom(KEY_BYTES)


def wrap_data_key(master_key: bytes, data_key: bytes, user_id: str) -> bytes:
    """Encrypt ``data_key`` under ``master_key``, bound to ``user_id``."""
    return _seal(_check_key(master_key, "master_key"), _check_key(data_key, "data_key"), _dek_aad(user_id))


def unwrap_data_key(master_key: bytes, wrapped: bytes, user_id: str) -> bytes:
    """Inverse of :func:`wrap_data_key`; DecryptError when the key or the user does not match."""
    return _open(_check_key(master_key, "master_key"), wrapped, _dek_aad(user_id))


def rewrap_data_key(old_master: bytes, new_master: bytes, wrapped: bytes, user_id: str) -> bytes:
    """Unwrap under ``old_master`` and wrap again under ``new_master`` (key rotation of one user)."""
    return wrap_data_key(new_master, unwrap_data_key(old_master, wrapped, user_id), user_id)


@dataclass(frozen=True)
class UserCipher:
    """Encrypts and decrypts one user's fields. Build it with :meth:`from_wrapped`."""

    user_id: str
    data_key: bytes = field(repr=False)  # kept out of logs and tracebacks that print the viewer

    @classmethod
    def from_wrapped(cls, master_key: bytes, wrapped: bytes, user_id: str) -> "UserCipher":
        return cls(user_id=user_id, data_key=unwrap_data_key(master_key, wrapped, user_id))

    def _aad(self, table: str, record_id: str, field: str) -> bytes:
        for name, value in (("table", table), ("record_id", record_id), ("field", field)):
            if not value or "|" in value:
                raise ValueError(f"{name}: must be non-empty and contain no '|', got {value!r}")
        return f"hearth/v1|{self.user_id}|{table}|{record_id}|{field}".encode()

    def encrypt(self, table: str, record_id: str, field: str, text: str) -> bytes:
        """UTF-8 encode ``text`` and seal it for exactly this (user, table, record, field)."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        return _seal(self.data_key, text.encode("utf-8"), self._aad(table, record_id, field))

    def decrypt(self, table: str, record_id: str, field: str, blob: bytes) -> str:
        """Inverse of :meth:`encrypt`; DecryptError if the blob belongs elsewhere or was altered."""
        return _open(self.data_key, blob, self._aad(table, record_id, field)).decode("utf-8")
