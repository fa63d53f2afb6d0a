"""Envelope encryption primitives: wrapping bound to the user, fields bound to row and column,
tampering detected, key text formats."""

from __future__ import annotations

import base64

import pytest

from hearth.app import crypto


@pytest.fixture
def master():
    return crypto.parse_master_key(crypto.new_master_key_text())


def test_wrapped_key_is_bound_to_its_user(master):
    dek = crypto.new_data_key()
    wrapped = crypto.wrap_data_key(master, dek, "u1")
    assert crypto.unwrap_data_key(master, wrapped, "u1") == dek
    with pytest.raises(crypto.DecryptError):
        crypto.unwrap_data_key(master, wrapped, "u2")
    other = crypto.parse_master_key(crypto.new_master_key_text())
    with pytest.raises(crypto.DecryptError):
        crypto.unwrap_data_key(other, wrapped, "u1")
    rewrapped = crypto.rewrap_data_key(master, other, wrapped, "u1")
    assert crypto.unwrap_data_key(other, rewrapped, "u1") == dek


def test_field_ciphertext_only_opens_in_its_place(master):
    c = crypto.UserCipher("u1", crypto.new_data_key())
    blob = c.encrypt("messages", "r1", "body_ct", "hello ünïcode")
    assert c.decrypt("messages", "r1", "body_ct", blob) == "hello ünïcode"
    assert b"hello" not in blob
    for table, rid, field in [("messages", "r2", "body_ct"), ("posts", "r1", "body_ct"), ("messages", "r1", "meta_ct")]:
        with pytest.raises(crypto.DecryptError):
            c.decrypt(table, rid, field, blob)
    with pytest.raises(crypto.DecryptError):
        crypto.UserCipher("u2", c.data_key).decrypt("messages", "r1", "body_ct", blob)
    tampered = bytearray(blob)
    tampered[-1] ^= 1
    with pytest.raises(crypto.DecryptError):
        c.decrypt("messages", "r1", "body_ct", bytes(tampered))
    with pytest.raises(crypto.DecryptError):
        c.decrypt("messages", "r1", "body_ct", blob[:10])
    # two encryptions of the same text differ (random nonce)
    assert c.encrypt("messages", "r1", "body_ct", "x") != c.encrypt("messages", "r1", "body_ct", "x")


def test_bad_arguments_name_themselves(master):
    with pytest.raises(ValueError, match="master_key"):
        crypto.wrap_data_key(master[:16], crypto.new_data_key(), "u")
    with pytest.raises(TypeError, match="data_key"):
        crypto.wrap_data_key(master, "not bytes", "u")
    c = crypto.UserCipher("u", crypto.new_data_key())
    with pytest.raises(ValueError, match="record_id"):
        c.encrypt("t", "a|b", "f", "x")
    with pytest.raises(TypeError, match="text"):
        c.encrypt("t", "r", "f", b"bytes")


def test_master_key_text_formats(master):
    assert crypto.parse_master_key(master.hex()) == master
    assert crypto.parse_master_key(base64.urlsafe_b64encode(master).decode()) == master
    assert crypto.parse_master_key(base64.urlsafe_b64encode(master).decode().rstrip("=")) == master
    with pytest.raises(ValueError, match="master_key"):
        crypto.parse_master_key("11" * 32)
    assert crypto.master_key_id(master) != crypto.master_key_id(crypto.parse_master_key(crypto.new_master_key_text()))


def test_a_user_cipher_never_shows_its_data_key(master):
    # the cipher rides on the request's viewer object; a logged repr or a traceback must not leak the key
    dek = crypto.new_data_key()
    cipher = crypto.UserCipher.from_wrapped(master, crypto.wrap_data_key(master, dek, "u1"), "u1")
    for shown in (repr(cipher), str(cipher)):
        assert "u1" in shown
        assert repr(dek)[2:-1] not in shown and dek.hex() not in shown
