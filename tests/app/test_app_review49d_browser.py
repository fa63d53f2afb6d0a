"""Review 49d: the companion app's web UI in headless Debian chromium (Playwright's Python API, never
`playwright install`), at phone width (390x844), as its users use it:

* long unbroken text (a pasted URL, a long name) widened the page past the phone's width, and a feed post's
  line breaks were collapsed;
* a streamed reply was scrolled to while still empty, then grew out of sight below the window;
* sending disabled the focused Send button, which dropped the focus to <body>: a keyboard user's next keys
  went nowhere;
* the "What you share" box had no accessible name, and the message boxes had only a placeholder;
* and a guard: a walk through every page logs no JS exception and no console error (CSP violations included)
  beyond the status lines of the error pages it opens on purpose; a double click sends once; a reply's markup
  stays text.

One `hearth serve` (against a fake OpenAI server) for the module; every test signs up its own user.
Skips only when chromium is absent and CI is not set."""

from __future__ import annotations

import itertools

import pytest

from tests.app.app_browser import add_agent_and_rehearse, chromium_page
from tests.app.app_fakes import openai_handler
from tests.app.app_server import hearth_serve, write_config
from tests.fakes.openai_server import Behavior, FakeOpenAI

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 390, 844
URL = "https://example.com/" + "a-very-long-path-segment-without-spaces" * 4
_users = itertools.count()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    mode = {"chat": "ok"}

    def handler(body):
        if mode["chat"] == "fail" and body.get("stream"):
            return Behavior.status(503)
        return openai_handler(body)

    tmp = tmp_path_factory.mktemp("review49d")
    fake = FakeOpenAI(handler).start_in_thread()
    try:
        cfg = write_config(tmp / "hearth.toml", fake.base_url, gateway="breaker_failures = 1000")
        with hearth_serve(tmp, "--config", str(cfg), env={"HEARTH_MASTER_KEY": ""}) as server:
            yield server, fake, mode
    finally:
        fake.stop()


@pytest.fixture
def phone(served):
    server, fake, mode = served
    mode["chat"] = "ok"
    with chromium_page(WIDTH, HEIGHT) as page:
        yield page, server, fake, mode


def _sign_up(page, server, username: str | None = None) -> None:
    page.goto(server.url + "/signup")
    page.fill("input[name=username]", username or f"user{next(_users)}")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button:has-text('Sign up')")
    page.wait_for_selector("text=Your companions")


def _new_companion(page) -> str:
    page.click("#new-companion button[type=submit]")
    page.wait_for_selector("#chat-form")
    return page.url.split("#")[0]


def _chat(page, text: str, nth: int) -> None:
    page.fill("#chat-form textarea", text)
    page.click("#chat-form button")
    page.locator("#messages li.companion:not(.pending)").nth(nth).wait_for()


def _page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def test_a_pasted_url_or_long_name_does_not_widen_the_page_at_phone_width(phone):
    """Before: a URL in a feed post made the page 1300+ px wide (sideways scrolling, the nav and the Post
    button off to the left); a situation with one did the same on the Simulation Mode page, and a
    32-character username on the account page. The feed also showed a two-line post on one line."""
    page, server, _, _ = phone
    _sign_up(page, server, "fern" + "x" * 28)  # the longest username there can be
    companion_url = _new_companion(page)

    page.goto(server.url + "/account")
    assert _page_width(page) <= WIDTH, "account page"

    page.goto(server.url + "/feed")
    page.fill("#post-form textarea", "Look what I found\n" + URL)
    page.click("#post-form button")
    page.wait_for_selector(".comment")
    assert _page_width(page) <= WIDTH, "feed with a URL in a post"
    assert page.inner_text("article.post > p") == "Look what I found\n" + URL  # the line break is kept

    page.goto(companion_url + "/simulate")
    page.fill("#situation-form textarea", "He sent me this " + URL)
    page.click("#situation-form button")
    page.locator("#live-panel[data-saved]").wait_for()
    assert _page_width(page) <= WIDTH, "the live panel's readings quoting the URL"
    page.reload()
    assert _page_width(page) <= WIDTH, "the saved situation"

    page.goto(companion_url)
    _chat(page, "Here is the link " + URL, 0)
    assert _page_width(page) <= WIDTH, "chat"


def test_a_streamed_reply_is_in_view_once_it_has_grown(phone):
    """Before: the reply's bubble was scrolled to while empty; the streamed text then grew below the window:
    at phone width only its first ~50 px of a 276 px reply were visible, and a rehearsal reply with its
    panel (1400 px) was below the window altogether."""
    page, server, _, _ = phone
    _sign_up(page, server)
    companion_url = _new_companion(page)
    for i in range(3):
        _chat(page, f"message {i} " + "a few more words " * 12, i)
        box = page.locator("#messages li.companion").nth(i).bounding_box()
        assert box["y"] >= -1 and box["y"] + box["height"] <= HEIGHT + 1, f"reply {i} out of view: {box}"

    add_agent_and_rehearse(page, companion_url)
    for i in range(2):
        page.fill("#rehearsal-form textarea", f"turn {i}: could we keep our Tuesday slot?")
        page.click("#rehearsal-form button")
        reply = page.locator("#turns li.companion:not(.pending)").nth(i)
        reply.wait_for()
        assert "Panel (5/5)" in reply.inner_text()
        box = reply.bounding_box()  # taller than the window: its start is shown
        assert -1 <= box["y"] < HEIGHT / 2, f"rehearsal reply {i} starts out of view: {box}"


def test_the_focus_goes_back_to_the_box_after_sending_with_the_keyboard(phone):
    """Before: Tab to Send and Enter sent the message, but disabling the focused button dropped the focus to
    <body>, so the next message typed went nowhere (after a failed reply too, with the text given back)."""
    page, server, _, mode = phone
    _sign_up(page, server)
    companion_url = _new_companion(page)

    page.focus("#chat-form textarea")
    page.keyboard.type("Hello there")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Send"
    page.keyboard.press("Enter")
    page.locator("#messages li.companion:not(.pending)").wait_for()
    page.keyboard.type("And again")
    assert page.input_value("#chat-form textarea") == "And again"

    mode["chat"] = "fail"  # the reply fails: the text comes back, and the focus with it
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.locator("#chat-error:not([hidden])").wait_for()
    assert page.input_value("#chat-form textarea") == "And again"
    page.keyboard.type("!")
    assert page.input_value("#chat-form textarea") == "And again!"
    mode["chat"] = "ok"

    # Simulation Mode's panel form: the same
    page.goto(companion_url + "/simulate")
    page.focus("#situation-form textarea")
    page.keyboard.type("My coworker skips our 1:1s")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.locator("#live-panel[data-saved]").wait_for()
    page.keyboard.type("Another one")
    assert page.input_value("#situation-form textarea") == "Another one"


LABELLESS = """() => [...document.querySelectorAll('input:not([type=hidden]), textarea, select')]
  .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                  && !el.getAttribute('aria-labelledby'))
  .map((el) => el.name)"""


def test_every_form_field_has_a_label(phone):
    """Before: the home page's "What you share" box had no accessible name at all (a screen reader said
    "edit text"), and the chat, rehearsal, feed and situation boxes had only a placeholder, which is gone
    once something is typed."""
    page, server, _, _ = phone
    _sign_up(page, server)
    assert page.evaluate(LABELLESS) == [], "home"
    page.get_by_role("textbox", name="What you share with your companions").fill("I moved to Lisbon")
    companion_url = _new_companion(page)
    pages = {"companion": companion_url, "simulate": companion_url + "/simulate", "feed": server.url + "/feed",
             "account": server.url + "/account"}
    for name, url in pages.items():
        page.goto(url)
        assert page.evaluate(LABELLESS) == [], name
    page.goto(companion_url)
    page.get_by_label("Your message to Wren").fill("hi")
    add_agent_and_rehearse(page, companion_url)
    assert page.evaluate(LABELLESS) == [], "rehearsal"
    page.get_by_label("What you say to Rui").fill("hi")


def test_a_walk_through_every_page_logs_no_errors(phone):
    """Guard (passed before): every page and flow, with console and page errors collected throughout. The
    only console errors allowed are the status lines of the error pages opened on purpose."""
    page, server, fake, mode = phone
    problems: list[str] = []
    expected_status_pages: set[str] = set()

    def on_console(msg):
        if msg.type not in ("error", "warning"):
            return
        if msg.text.startswith("Failed to load resource") and page.url in expected_status_pages:
            return
        problems.append(f"console {msg.type} on {page.url}: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(f"pageerror on {page.url}: {exc}"))

    page.goto(server.url + "/")
    page.click("text=Create an account")
    expected_status_pages.add(server.url + "/signup")  # a refused signup answers 400
    page.fill("input[name=username]", f"walker{next(_users)}")
    page.fill("input[name=password]", "short")
    page.click("button:has-text('Sign up')")
    page.wait_for_selector("p.error")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button:has-text('Sign up')")
    page.wait_for_selector("text=Your companions")
    page.fill("textarea[name=shared_context]", "I just moved to Lisbon.")
    page.click("form[action='/context'] button")
    companion_url = _new_companion(page)

    # a double click on Send sends once; a reply's markup stays text
    page.fill("#chat-form textarea", "<b>bold</b> <img src=x>")
    streamed = sum(1 for r in fake.requests if r.get("stream"))
    page.dblclick("#chat-form button")
    reply = page.locator("#messages li.companion:not(.pending)").first
    reply.wait_for()
    assert page.locator("#messages li.user").count() == 1
    assert sum(1 for r in fake.requests if r.get("stream")) == streamed + 1
    assert reply.locator("p").inner_text().startswith("Echo: <b>bold</b> <img src=x>")
    assert page.locator("#messages b, #messages img").count() == 0
    page.click("#messages .suggestion")
    page.fill("#chat-form textarea", "")

    mode["chat"] = "fail"
    page.fill("#chat-form textarea", "This one fails")
    page.click("#chat-form button")
    page.locator("#chat-error:not([hidden])").wait_for()
    assert page.locator("#chat-form button").is_enabled()
    mode["chat"] = "ok"
    page.reload()

    page.click("nav >> text=Feed")
    page.fill("#post-form textarea", "Found a great bakery")
    page.click("#post-form button")
    page.wait_for_selector(".comment")

    page.goto(companion_url)
    page.click("#to-simulation")
    page.fill("#situation-form textarea", "My new coworker keeps skipping our 1:1s")
    page.click("#situation-form button")
    page.locator("#live-panel[data-saved]").wait_for()
    add_agent_and_rehearse(page, companion_url)
    page.fill("#rehearsal-form textarea", "Could we keep our Tuesday slot?")
    page.click("#rehearsal-form button")
    page.locator("#turns li.companion:not(.pending)").wait_for()
    page.click("#switch-to-companion")
    page.click("#rehearsal-links a.resume")
    page.wait_for_selector("#rehearsal-form")

    page.click("#account-link")
    expected_status_pages.add(server.url + "/account/password")  # a wrong current password answers 400
    page.fill("#change-password input[name=current_password]", "not my password")
    page.fill("#change-password input[name=new_password]", "another long password")
    page.click("#change-password button")
    page.wait_for_selector("#account-error")
    with page.expect_download():
        page.click("#export")

    page.goto(server.url + "/feed")
    missing = server.url + "/companions/" + "0" * 32
    expected_status_pages.add(missing)
    page.goto(missing)
    page.click("a.back")
    page.wait_for_url(server.url + "/feed")

    page.goto(companion_url)
    page.click("#clear-chat")
    page.wait_for_selector("text=Nothing remembered yet.")
    page.click("button:has-text('Log out')")
    page.wait_for_selector("text=Log in")
    assert problems == []
