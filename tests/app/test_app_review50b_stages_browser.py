"""Review 50b, in headless Debian chromium: the stage pill reaches "confidant" live, on the streamed turn that
crosses the threshold, and keeps it on reload and on the home page (before, the ladder stopped at "close").

The real `hearth serve` against the fake OpenAI server, whose chat replies carry affection +1 and trust +1; the
companion's totals are set to one reply short (49/39) in the served SQLite file. Skips only when chromium is absent
and CI is not set."""

from __future__ import annotations

import pytest

from tests.app.app_browser import chromium_page, companion_with_totals
from tests.app.app_server import hearth_serve_on_fake_openai

pytestmark = pytest.mark.browser


def test_the_stage_pill_turns_confidant_on_the_turn_that_crosses_the_threshold(tmp_path):
    # chromium_page first: it skips before anything starts when chromium is absent
    with chromium_page(1024, 800) as page, hearth_serve_on_fake_openai(tmp_path) as server:
        companion_url = companion_with_totals(page, server.url, tmp_path / "var" / "hearth.sqlite3", 49, 39)
        assert page.inner_text("#stage") == "close"

        page.fill("#chat-form textarea", "There's something I haven't told anyone.")
        page.click("#chat-form button")
        page.locator("#messages li.companion:not(.pending)").first.wait_for()
        page.locator("#stage", has_text="confidant").wait_for()  # the live update (the CSP forbids eval)

        page.goto(companion_url)
        assert page.inner_text("#stage") == "confidant"
        page.goto(server.url + "/")
        assert page.inner_text("#companions .pill") == "confidant"
