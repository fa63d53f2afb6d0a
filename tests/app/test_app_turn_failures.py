"""routes._util.form_turn_failure / stream_turn_failure: what a failed chat or rehearsal turn shows on its page.

The chat and rehearsal routes share these two helpers (they were two copies of the same except clauses); the route
tests drive them end to end, these pin each branch: the status, the message shown (never upstream text), the log
line, the viewer re-read only after a rollback, and what is not a turn failure raised again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hearth.app.common import InputError, NotFound, UnreadableText
from hearth.app.companions import ChatCleared
from hearth.app.model import ModelUnavailable
from hearth.app.routes import _util
from hearth.gateway.errors import ProviderError

LOG = logging.getLogger("hearth.test.turns")


@pytest.fixture
def refreshed(monkeypatch):
    calls = []

    async def fake_refresh(db, viewer):
        calls.append((db, viewer))

    monkeypatch.setattr(_util, "refresh_viewer", fake_refresh)
    return calls


def form(exc):
    return asyncio.run(_util.form_turn_failure("db", "viewer", exc, "chat turn", LOG))


def test_form_provider_error_is_502_in_the_users_words_and_logged(refreshed, caplog):
    with caplog.at_level(logging.WARNING, logger="hearth.test.turns"):
        status, error = form(ProviderError("upstream-a", "secret upstream body"))
    assert status == 502 and error.startswith("The reply failed: ") and error.endswith("Nothing was saved.")
    assert "secret upstream body" not in error and "upstream-a" not in error
    assert [r.getMessage() for r in caplog.records] == ["chat turn failed: ProviderError[upstream-a, error]"]
    assert refreshed == []


def test_form_no_model_and_unreadable_text_are_503(refreshed):
    assert form(ModelUnavailable()) == (503, "No model is configured: see the top of the page. Nothing was saved.")
    assert form(UnreadableText("This persona does not open.")) == (503, "This persona does not open.")
    assert refreshed == []


def test_form_rolled_back_turns_are_409_after_reading_the_viewer_again(refreshed):
    cleared = ChatCleared()
    assert form(cleared) == (409, str(cleared))
    taken = InputError("submission_id", "this id came with another message")
    assert form(taken) == (409, str(taken))
    assert refreshed == [("db", "viewer"), ("db", "viewer")]


def test_form_other_errors_are_raised_again(refreshed):
    other = InputError("message", "too long")
    with pytest.raises(InputError) as info:
        form(other)
    assert info.value is other
    with pytest.raises(KeyError):
        form(KeyError("not a turn failure"))
    assert refreshed == []


def test_stream_messages(caplog):
    gone = "It was deleted meanwhile."
    msg = lambda exc: _util.stream_turn_failure(exc, "rehearsal turn", LOG, gone)  # noqa: E731
    assert msg(ModelUnavailable()) == "No model is configured: see the home page. Nothing was saved."
    for exc in (ChatCleared(), InputError("submission_id", "used before"), InputError("message", "too long"),
                UnreadableText("does not open")):
        assert msg(exc) == str(exc)
    assert msg(NotFound("companion")) == gone
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="hearth.test.turns"):
        text = msg(RuntimeError("boom with user text"))
    assert text.startswith("The reply failed: ") and "boom with user text" not in text
    assert [r.getMessage() for r in caplog.records] == ["rehearsal turn failed: RuntimeError"]
