"""Review 50c, in headless Debian chromium: the stage pill (label and its "affection X, trust Y" tooltip) follows
each streamed reply without a reload, across a stage change (friend -> close_friend, shown as "close").

Was: only the label was ever updated live; the tooltip kept the page-load totals until a reload.
The real `hearth serve` against the fake OpenAI server, whose chat replies carry affection +1 and trust +1; the
companion starts one reply short of close_friend (27/17: score 44 < 45, trust 17 < 18). Skips only when chromium
is absent and CI is not set."""

from __future__ import annotations

import pytest

from tests.app.app_browser import chromium_page, companion_with_totals
from tests.app.app_server import hearth_serve_on_fake_openai

pytestmark = pytest.mark.browser


def _send(page, text: str, replies: int) -> None:
    page.fill("#chat-form textarea", text)
    page.click("#chat-form button")
    page.locator("#messages li.companion:not(.pending)").nth(replies - 1).wait_for()


def test_the_pill_follows_each_streamed_reply_across_a_stage_change(tmp_path):
    # chromium_page first: it skips before anything starts when chromium is absent
    with chromium_page(1024, 800) as page, hearth_serve_on_fake_openai(tmp_path) as server:
        companion_url = companion_with_totals(page, server.url, tmp_path / "var" / "hearth.sqlite3", 27, 17)
        stage = page.locator("#stage")
        assert stage.inner_text() == "friend"
        assert stage.get_attribute("title") == "affection 27, trust 17"
        loads = []
        page.on("load", lambda _: loads.append(page.url))  # no reload may do the work below

        _send(page, "You can count on me.", 1)  # 28/18: score 46, trust 18 -> close_friend
        page.locator('#stage[title="affection 28, trust 18"]', has_text="close").wait_for()
        assert stage.inner_text() == "close"

        _send(page, "Always.", 2)  # the totals move on within a stage too
        page.locator('#stage[title="affection 29, trust 19"]').wait_for()
        assert stage.inner_text() == "close" and loads == []

        page.goto(companion_url)  # a reload agrees with what the live page showed
        assert stage.inner_text() == "close"
        assert stage.get_attribute("title") == "affection 29, trust 19"
