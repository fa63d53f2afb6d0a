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


def companion_with_totals(page, base_url: str, db_file, affection: int, trust: int) -> str:
    """Sign up (robin), make a companion, set its affection / trust in the served SQLite file `db_file` and
    reload its page; returns the companion page's URL."""
    import sqlite3

    page.goto(base_url + "/signup")
    page.fill("input[name=username]", "robin")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button:has-text('Sign up')")
    page.wait_for_selector("text=Your companions")
    page.click("#new-companion button[type=submit]")
    page.wait_for_selector("#chat-form")
    companion_url = page.url.split("#")[0]
    with sqlite3.connect(db_file) as conn:
        assert conn.execute("UPDATE companions SET affection = ?, trust = ?", (affection, trust)).rowcount == 1
    page.reload()
    return companion_url
