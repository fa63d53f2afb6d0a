"""Headless Debian chromium through Playwright's Python API (never `playwright install`) for the browser tests:
one page at a given viewport. Skips when chromium is absent, fails instead under CI=true."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Iterator

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium_path() -> str:
    path = os.environ.get("HEARTH_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"chromium not found at {path} under CI=true")
        pytest.skip("chromium is not installed (set HEARTH_TEST_CHROMIUM)")
    return path


@contextmanager
def chromium_page(width: int, height: int) -> Iterator:
    """A fresh browser's page at width x height, 30 s timeouts, every confirm() accepted; closed on exit."""
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_context(viewport={"width": width, "height": height}).new_page()
            page.set_default_timeout(30_000)
            page.on("dialog", lambda dialog: dialog.accept())  # e.g. the "clear chat?" confirm
            yield page
        finally:
            browser.close()


def sign_up_with_a_companion(page, base_url: str, username: str) -> str:
    """Sign ``username`` up on the served app and make a companion with the form's defaults; returns the companion
    page's URL (the page is left on it)."""
    page.goto(base_url + "/signup")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "correct horse battery")
    page.click("button:has-text('Sign up')")
    page.wait_for_selector("text=Your companions")
    page.click("#new-companion button[type=submit]")
    page.wait_for_selector("#chat-form")
    return page.url.split("#")[0]


def add_agent_and_rehearse(page, companion_url: str) -> None:
    """Add an agent (Rui, a reserved coworker) on the companion's Simulation Mode page and start a rehearsal with it;
    the page is left on the rehearsal."""
    page.goto(companion_url + "/simulate")
    if page.locator("#agents details[open]").count() == 0:
        page.click("#agents summary")
    page.fill("#new-agent input[name=name]", "Rui")
    page.fill("#new-agent textarea[name=personality]", "reserved, kind")
    page.fill("#new-agent textarea[name=backstory]", "joined the team a month before me")
    page.fill("#new-agent input[name=relationship]", "coworker")
    page.click("#new-agent button")
    page.click("#start-rehearsal button")
    page.wait_for_selector("#rehearsal-form")


def lose_the_first_answer(page, pattern: str, then=None) -> list[str]:
    """Route POSTs to ``pattern``: the first reaches the server (which saves what it was sent and answers), its answer
    never reaches the page (the connection is reset); later ones pass. ``then()``, if given, runs between the answer
    and the reset (e.g. to damage what was saved). Returns the list the submission id of every POST is appended to."""
    from urllib.parse import parse_qs

    ids: list[str] = []

    def handle(route):
        ids.append(parse_qs(route.request.post_data).get("submission_id", [""])[0])
        if len(ids) == 1:
            route.fetch()  # the server saves the submission and answers...
            if then is not None:
                then()
            route.abort("connectionreset")  # ...and the connection drops
        else:
            route.continue_()

    page.route(pattern, handle)
    return ids


def companion_with_totals(page, base_url: str, db_file, affection: int, trust: int) -> str:
    """Sign up (robin), make a companion, set its affection / trust in the served SQLite file `db_file` and
    reload its page; returns the companion page's URL."""
    import sqlite3

    companion_url = sign_up_with_a_companion(page, base_url, "robin")
    with sqlite3.connect(db_file) as conn:
        assert conn.execute("UPDATE companions SET affection = ?, trust = ?", (affection, trust)).rowcount == 1
    page.reload()
    return companion_url
