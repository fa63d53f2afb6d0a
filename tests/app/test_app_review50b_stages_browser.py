"""Review 50b, in headless Debian chromium: the stage pill reaches "confidant" live, on the streamed turn that
crosses the threshold, and keeps it on reload and on the home page (before, the ladder stopped at "close").

The real `hearth serve` against the fake OpenAI server, whose chat replies carry affection +1 and trust +1; the
companion's totals are set to one reply short (49/39) in the served SQLite file. Skips only when chromium is absent
and CI is not set."""

from __future__ import annotations

import sqlite3

import pytest

from tests.app.app_browser import chromium_page
from tests.app.app_fakes import openai_handler
from tests.app.app_server import hearth_serve, write_config
from tests.fakes.openai_server import FakeOpenAI

pytestmark = pytest.mark.browser


def test_the_stage_pill_turns_confidant_on_the_turn_that_crosses_the_threshold(tmp_path):
    with chromium_page(1024, 800) as page:  # skips before anything starts when chromium is absent
        fake = FakeOpenAI(openai_handler).start_in_thread()
        try:
            cfg = write_config(tmp_path / "hearth.toml", fake.base_url)
            with hearth_serve(tmp_path, "--config", str(cfg), env={"HEARTH_MASTER_KEY": ""}) as server:
                page.goto(server.url + "/signup")
                page.fill("input[name=username]", "robin")
                page.fill("input[name=password]", "correct horse battery")
                page.click("button:has-text('Sign up')")
                page.wait_for_selector("text=Your companions")
                page.click("#new-companion button[type=submit]")
                page.wait_for_selector("#chat-form")
                companion_url = page.url.split("#")[0]
                with sqlite3.connect(tmp_path / "var" / "hearth.sqlite3") as conn:
                    assert conn.execute("UPDATE companions SET affection = 49, trust = 39").rowcount == 1
                page.reload()
                assert page.inner_text("#stage") == "close"

                page.fill("#chat-form textarea", "There's something I haven't told anyone.")
                page.click("#chat-form button")
                page.locator("#messages li.companion:not(.pending)").first.wait_for()
                page.locator("#stage", has_text="confidant").wait_for()  # the live update (the CSP forbids eval)

                page.goto(companion_url)
                assert page.inner_text("#stage") == "confidant"
                page.goto(server.url + "/")
                assert page.inner_text("#companions .pill") == "confidant"
        finally:
            fake.stop()
