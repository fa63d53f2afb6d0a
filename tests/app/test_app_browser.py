"""End to end in headless Debian chromium (Playwright's Python API, never `playwright install`):
signup, streamed chat, feed post + comment, the five-analyst panel, rehearsal, switching to the
companion and back, clearing the chat; against `hearth serve` and a fake OpenAI server, at phone width.

Skips only when chromium is absent and CI is not set."""

from __future__ import annotations

import pytest

from tests.app.app_browser import chromium_page
from tests.app.app_fakes import openai_handler
from tests.app.app_server import hearth_serve, write_config
from tests.fakes.openai_server import FakeOpenAI

pytestmark = pytest.mark.browser


@pytest.fixture
def browser_page():
    with chromium_page(390, 844) as page:  # a phone
        yield page


def _no_sideways_scroll(page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"page is {width}px wide at phone width"


def test_the_whole_app_in_a_browser(tmp_path, browser_page):
    page = browser_page
    fake = FakeOpenAI(openai_handler).start_in_thread()
    try:
        cfg = write_config(tmp_path / "hearth.toml", fake.base_url)
        with hearth_serve(tmp_path, "--config", str(cfg), env={"HEARTH_MASTER_KEY": ""}) as server:
            page.goto(server.url + "/")
            assert page.url.endswith("/login")
            page.click("text=Create an account")
            page.fill("input[name=username]", "fern")
            page.fill("input[name=password]", "correct horse battery")
            page.click("button:has-text('Sign up')")
            page.wait_for_selector("text=Your companions")
            assert page.locator("#no-model").count() == 0  # a model is configured
            _no_sideways_scroll(page)

            page.fill("textarea[name=shared_context]", "I just moved to Lisbon for work.")
            page.click("form[action='/context'] button")
            page.select_option("select[name=persona]", "juno")
            page.click("#new-companion button[type=submit]")
            page.wait_for_selector("h1:has-text('Juno')")

            # chat: the reply streams in over SSE through the gateway chain, then is saved
            page.fill("#chat-form textarea", "Hi, my name is Fern")
            page.click("#chat-form button")
            reply = page.locator("#messages li.companion:not(.pending)").last
            reply.wait_for()
            assert reply.inner_text().startswith("Echo: Hi, my name is Fern")
            assert page.locator("#messages li.user").last.get_attribute("data-id")
            assert "The user's name is Fern" in page.locator("#memories").inner_text()  # shown at once
            page.click("#messages .suggestion:has-text('Tell me more')")  # tapping a suggestion drafts it
            assert page.input_value("#chat-form textarea") == "Tell me more"
            page.fill("#chat-form textarea", "")
            page.reload()
            assert "The user's name is Fern" in page.locator("#memories").inner_text()
            _no_sideways_scroll(page)
            companion_url = page.url

            # feed: post, and the companion comments
            page.click("nav >> text=Feed")
            page.fill("#post-form textarea", "Found a great bakery")
            page.click("#post-form button")
            page.wait_for_selector(".comment:has-text('Proud of you for: Found a great bakery')")
            assert "Juno" in page.locator(".comment").first.inner_text()

            # Simulation Mode: five analysts arrive into the live panel
            page.goto(companion_url)
            page.click("#to-simulation")
            page.fill("#situation-form textarea", "My new coworker keeps skipping our 1:1s")
            page.click("#situation-form button")
            # (locators, not wait_for_function: the app's CSP forbids eval, and the test keeps the CSP on)
            page.locator("#live-panel li.reading.ok").nth(4).wait_for()
            assert page.locator("#live-panel li.reading.ok").count() == 5
            texts = page.locator("#live-panel li.reading").all_inner_texts()
            assert any("gossiper reads: My new coworker" in t for t in texts)
            page.locator("#live-panel[data-saved]").wait_for()

            # a panel stream that ends without its "done" (connection lost) is reported: the server finishes the
            # panel without the page, so it may be saved; the text stays in the box
            cut = ('event: reading\ndata: {"analyst": "optimist", "title": "Optimist", "ok": true, '
                   '"reading": "fine", "advice": "go", "risk": "low", "error": ""}\n\n')
            page.route("**/situations", lambda route: route.fulfill(
                status=200, headers={"content-type": "text/event-stream"}, body=cut))
            page.fill("#situation-form textarea", "Will this one be saved?")
            page.click("#situation-form button")
            page.locator("#live-panel[data-error]").wait_for()
            assert "may still be saved" in page.locator("#live-panel").get_attribute("data-error")
            assert page.input_value("#situation-form textarea") == "Will this one be saved?"
            page.unroute("**/situations")

            # rehearsal with a custom agent
            if page.locator("#agents details[open]").count() == 0:  # open by default while there are no agents
                page.click("#agents summary")
            page.fill("#new-agent input[name=name]", "Rui")
            page.fill("#new-agent textarea[name=personality]", "reserved, kind, conflict-averse")
            page.fill("#new-agent textarea[name=backstory]", "joined the team a month before me")
            page.fill("#new-agent input[name=relationship]", "coworker")
            page.click("#new-agent button")
            page.click("#start-rehearsal button")
            page.wait_for_selector("h1:has-text('Rehearsing with Rui')")
            page.fill("#rehearsal-form textarea", "Could we keep our Tuesday slot?")
            page.click("#rehearsal-form button")
            page.locator("#turns li.companion:not(.pending):has-text('Echo: Could we keep our Tuesday slot?')").wait_for()
            assert "Panel (5/5)" in page.locator("#turns").inner_text()
            rehearsal_url = page.url.split("#")[0]

            # switch to the companion mid-rehearsal: the chat is where it was; talk; come back
            page.click("#switch-to-companion")
            page.wait_for_selector("#messages li.companion:has-text('Echo: Hi, my name is Fern')")
            page.fill("#chat-form textarea", "Practising with Rui now")
            page.click("#chat-form button")
            page.locator("#messages li.companion:not(.pending):has-text('Echo: Practising')").wait_for()
            page.click("#rehearsal-links a.resume")
            assert page.url.split("#")[0] == rehearsal_url
            assert "Echo: Could we keep our Tuesday slot?" in page.locator("#turns").inner_text()
            _no_sideways_scroll(page)
            page.goto(companion_url + "/simulate")
            _no_sideways_scroll(page)  # with the agent list and the situations' retry/delete links

            # the account page: the export downloads the user's data, decrypted
            page.click("#account-link")
            page.wait_for_selector("#export")  # the account page has loaded (measured mid-navigation, no document)
            _no_sideways_scroll(page)
            with page.expect_download() as download:
                page.click("#export")
            exported = open(download.value.path(), encoding="utf-8").read()
            assert "Could we keep our Tuesday slot?" in exported and '"username": "fern"' in exported

            # clear the chat: gone after a reload too
            page.goto(companion_url)
            page.click("#clear-chat")
            page.wait_for_selector("text=Nothing remembered yet.")
            page.reload()
            assert page.locator("#messages li").count() == 0
        kinds = [(r.get("response_format") or {}).get("json_schema", {}).get("name") for r in fake.requests]
        assert {"hearth_chat", "hearth_feed_comment", "hearth_analyst"} <= set(kinds)
        assert any(r.get("stream") for r in fake.requests)  # the chat reply was streamed
    finally:
        fake.stop()
