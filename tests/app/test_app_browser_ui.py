"""Browser tests (Debian chromium via Playwright, desktop width) for the UI defects of Simulation Mode,
rehearsals, and Back after logout. Skips only when chromium is absent and CI is not set."""

from __future__ import annotations

import pytest

from tests.app.app_browser import chromium_page
from tests.app.app_fakes import analyst_of, openai_handler
from tests.app.app_server import hearth_serve, write_config
from tests.fakes.openai_server import Behavior, FakeOpenAI

pytestmark = pytest.mark.browser


@pytest.fixture
def desktop_page():
    with chromium_page(1366, 900) as page:
        yield page


def test_simulation_mode_and_rehearsal_in_a_browser(tmp_path, desktop_page):
    page = desktop_page
    mode = {"analysts": "ok", "chat": "ok"}

    def handler(body):
        if analyst_of(body["messages"]) and mode["analysts"] == "fail":
            return Behavior.status(500)
        if not analyst_of(body["messages"]) and mode["chat"] == "fail":
            return Behavior.status(503)
        return openai_handler(body)

    fake = FakeOpenAI(handler).start_in_thread()
    try:
        # failures on purpose must not open the chain's breaker for the rest of the test
        cfg = write_config(tmp_path / "hearth.toml", fake.base_url, total_s=10.0, gateway="breaker_failures = 1000")
        with hearth_serve(tmp_path, "--config", str(cfg), env={"HEARTH_MASTER_KEY": ""}) as server:
            page.goto(server.url + "/signup")
            page.fill("input[name=username]", "iris")
            page.fill("input[name=password]", "correct horse battery")
            page.click("button:has-text('Sign up')")
            page.click("#new-companion button")
            page.wait_for_selector("#chat-form")
            companion_url = page.url
            page.fill("#chat-form textarea", "A private thing I told Wren")
            page.click("#chat-form button")
            page.locator("#messages li.companion:not(.pending)").wait_for()

            # the live panel is hidden until something is asked, on every load (before: five "thinking…")
            page.click("#to-simulation")
            page.wait_for_selector("#situation-form")
            assert not page.locator("#live-panel").is_visible()
            page.reload()
            assert not page.locator("#live-panel").is_visible()

            # every analyst fails: nothing is saved, the text stays, the error is on the page (no alert)
            mode["analysts"] = "fail"
            page.fill("#situation-form textarea", "My sister did not call back")
            page.click("#situation-form button")
            page.locator("#panel-error:not([hidden])").wait_for()
            assert "None of the five analysts could answer" in page.inner_text("#panel-error")
            assert "Upstream" not in page.inner_text("#panel-error")
            assert page.input_value("#situation-form textarea") == "My sister did not call back"
            page.reload()
            assert page.locator("article.situation").count() == 0

            # they answer: saved; it can be deleted from the page
            mode["analysts"] = "ok"
            page.fill("#situation-form textarea", "My sister did not call back")
            page.click("#situation-form button")
            page.locator("#live-panel[data-saved]").wait_for()
            page.reload()
            assert page.locator("article.situation").count() == 1
            page.click("article.situation .delete-situation button")
            page.wait_for_selector("#situation-form")
            assert page.locator("article.situation").count() == 0

            # rehearsal: the reply streams into the page (no navigation), the panel arrives with it
            page.click("#agents summary") if page.locator("#agents details[open]").count() == 0 else None
            page.fill("#new-agent input[name=name]", "Noor")
            page.fill("#new-agent textarea[name=personality]", "quick to anger, loyal")
            page.fill("#new-agent textarea[name=backstory]", "my older sister")
            page.fill("#new-agent input[name=relationship]", "sister")
            page.click("#new-agent button")
            page.click("#start-rehearsal button")
            page.wait_for_selector("#rehearsal-form")
            rehearsal_url = page.url
            streamed_before = sum(1 for r in fake.requests if r.get("stream"))
            page.fill("#rehearsal-form textarea", "Can we talk about Sunday?")
            page.click("#rehearsal-form button")
            page.locator("#turns li.companion:not(.pending):has-text('Echo: Can we talk about Sunday?')").wait_for()
            assert page.url == rehearsal_url  # stayed on the page: streamed, not a form post + redirect
            assert "Panel (5/5)" in page.inner_text("#turns")
            assert sum(1 for r in fake.requests if r.get("stream")) == streamed_before + 1

            # a provider failure there is shown in place, the text given back (before: a full-page 502)
            mode["chat"] = "fail"
            page.fill("#rehearsal-form textarea", "Please answer me")
            page.click("#rehearsal-form button")
            page.locator("#rehearsal-error:not([hidden])").wait_for()
            assert "The reply failed" in page.inner_text("#rehearsal-error")
            assert page.input_value("#rehearsal-form textarea") == "Please answer me"
            assert page.url == rehearsal_url and page.locator("#turns > li").count() == 2
            mode["chat"] = "ok"

            # agents can be deleted from the page (their rehearsals go with them)
            page.goto(companion_url + "/simulate")
            page.click("#agent-list .delete-agent button")
            page.wait_for_selector("#situation-form")
            assert page.locator("#agent-list li").count() == 0

            # the error page's "Go back" returns to the page before it (it was a javascript: link, which the CSP
            # refuses: a click did nothing)
            simulate_url = page.url
            page.goto(server.url + "/companions/" + "0" * 32)
            assert page.locator("a.back").is_visible()
            page.click("a.back")
            page.wait_for_url(simulate_url)

            # Back after logout does not show the decrypted chat (Cache-Control: no-store)
            page.goto(companion_url)
            assert "A private thing I told Wren" in page.inner_text("#messages")
            page.click("button:has-text('Log out')")
            page.wait_for_selector("text=Log in")
            page.go_back()
            page.wait_for_load_state()
            assert "A private thing I told Wren" not in page.content()
    finally:
        fake.stop()
