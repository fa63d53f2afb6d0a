"""Review 57 in headless chromium: a streamed rehearsal turn shows the person's mood and the coaching hints for the
user's next line under the reply (from the stream's ``reply`` event, or a replayed ``done``), as the page shows them
after a reload. The fake OpenAI server's chat envelope has mood "warm" and suggested_actions ["Tell me more"]. Skips
only when chromium is absent and CI is not set."""

from __future__ import annotations

import itertools

import pytest

from tests.app.app_browser import add_agent_and_rehearse, chromium_page, lose_the_first_answer, sign_up_with_a_companion
from tests.app.app_server import hearth_serve_on_fake_openai

pytestmark = pytest.mark.browser
_users = itertools.count()
LABEL = "Coaching for your next line:"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with hearth_serve_on_fake_openai(tmp_path_factory.mktemp("review57"), gateway="breaker_failures = 1000") as served:
        yield served


@pytest.fixture
def page(server):
    with chromium_page(390, 844) as page:  # a phone
        add_agent_and_rehearse(page, sign_up_with_a_companion(page, server.url, f"user{next(_users)}"))
        yield page


def _shows_coaching(reply) -> None:
    """The mood and one coaching block, after the message and before the panel, in the agent's item."""
    assert reply.locator(":scope > .mood").all_inner_texts() == ["warm"]
    assert reply.locator(":scope > .coaching").count() == 1
    assert reply.locator(".coaching .coaching-label").inner_text() == LABEL
    assert reply.locator(".coaching .hints li").all_inner_texts() == ["Tell me more"]
    classes = [c or "" for c in reply.locator(":scope > *").evaluate_all("els => els.map(e => e.className)")]
    assert classes.index("mood") == 1 and classes.index("coaching") == 2, classes


def test_a_streamed_rehearsal_turn_shows_the_mood_and_the_coaching_hints_as_the_reloaded_page_does(page):
    page.fill("#rehearsal-form textarea", "Could we keep our Tuesday slot?")
    page.click("#rehearsal-form button")
    reply = page.locator("#turns li.companion:not(.pending)")
    reply.wait_for()
    page.locator("#turns li.companion .panel-details").wait_for()
    assert "Echo: Could we keep our Tuesday slot?" in reply.inner_text()
    _shows_coaching(reply)
    assert page.locator("#turns li.user .coaching, #turns li.user .mood").count() == 0
    page.reload()
    _shows_coaching(page.locator("#turns li.companion"))


def test_a_replayed_rehearsal_turn_shows_its_mood_and_hints_once(page):
    ids = lose_the_first_answer(page, "**/turns")
    page.fill("#rehearsal-form textarea", "Could we keep Tuesday?")
    page.click("#rehearsal-form button")
    page.locator("#rehearsal-error:not([hidden])").wait_for()
    page.click("#rehearsal-form button")  # the same text again: the same id, the saved turn comes back replayed
    reply = page.locator("#turns li.companion:not(.pending)")
    reply.wait_for()
    assert len(ids) == 2 and ids[0] == ids[1]
    assert "Echo: Could we keep Tuesday?" in reply.inner_text()
    _shows_coaching(reply)
