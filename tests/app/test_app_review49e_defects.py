"""Gaps found by review 49b of the app and fixed in 49e (each test failed before its fix):

* the feed always asked the oldest ``max_commenters`` companions for comments, so a fourth companion never
  commented; now those who commented least recently go first, and the turns go round;
* the Simulation Mode page showed only the 20 newest situations and the feed only the 50 newest posts, with
  no way to reach older ones; both now page back with ``?before=<id>`` ("Older" links), like the chat.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from sqlalchemy import select

from hearth.app import companions, crypto, feed
from hearth.app.common import seal
from hearth.app.storage.models import Post, Situation, User
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel
from tests.app.app_users import signed_up
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
PERSONAS = ("wren", "juno", "sol", "mina")  # Wren, Juno, Sol, Mina: created in this order
POST = dict(max_chars=4000, max_commenters=3, timeout_s=5.0)


async def _cipher(db, master_key) -> crypto.UserCipher:
    return (await signed_up(db, master_key))[1]


async def test_every_companion_takes_its_turn_to_comment_on_the_feed(db, master_key):
    # before: the oldest three companions commented on every post and Mina (the fourth) on none
    cipher = await _cipher(db, master_key)
    async with db.sessions() as s:
        for persona in PERSONAS:
            await companions.create_companion(s, cipher, persona=persona)
        commenters = []
        for i in range(8):
            result = await feed.create_post(s, FakeModel(), cipher, f"post {i}", **POST)
            assert result.failed == [] and len(result.comments) == 3
            commenters.append({c.companion_name for c in result.comments})
        posts = await feed.list_posts(s, cipher)
    assert commenters[0] == {"Wren", "Juno", "Sol"}  # nobody has commented yet: the oldest first
    assert "Mina" in commenters[1], "the fourth companion never gets to comment"
    counts = Counter(name for names in commenters for name in names)
    assert counts == {"Wren": 6, "Juno": 6, "Sol": 6, "Mina": 6}, counts  # round robin: fair over time
    assert [{c.companion_name for c in p.comments} for p in reversed(posts)] == commenters  # as saved


async def test_a_companion_whose_comment_failed_is_asked_first_next_time(db, master_key):
    class MinaFailsOnce(FakeModel):
        failed = False

        async def complete(self, messages, *, kind, **kw):
            if "Mina" in messages[0]["content"] and not MinaFailsOnce.failed:
                MinaFailsOnce.failed = True
                raise RuntimeError("Mina's provider is down")
            return await super().complete(messages, kind=kind, **kw)

    cipher = await _cipher(db, master_key)
    async with db.sessions() as s:
        for persona in PERSONAS:
            await companions.create_companion(s, cipher, persona=persona)
        await feed.create_post(s, MinaFailsOnce(), cipher, "first", **POST)
        second = await feed.create_post(s, MinaFailsOnce(), cipher, "second", **POST)
        third = await feed.create_post(s, MinaFailsOnce(), cipher, "third", **POST)
        posts = await feed.list_posts(s, cipher)
    assert second.failed == ["Mina"]
    assert [p.text for p in posts] == ["third", "second", "first"]  # the post is saved whatever the comments do
    assert {c.companion_name for c in third.comments} >= {"Mina", "Sol"}  # the two left out longest


async def _second_user(app) -> httpx.AsyncClient:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                               follow_redirects=False)
    return client


def _older(page: str, pattern: str) -> str | None:
    m = re.search(pattern, page)
    return m.group(1) if m else None


async def _walk(client, url: str, item: str, older: str, per_page: int) -> list[int]:
    seen = []
    while url:
        page = await client.get(url)
        assert page.status_code == 200, page.text
        lines = [int(n) for n in re.findall(item, page.text)]
        assert 0 < len(lines) <= per_page
        seen += lines
        url = _older(page.text, older)
    return seen


async def test_the_feed_pages_back_to_its_first_post(database_url, make_settings, master_key):
    # before: /feed showed the 50 newest posts and nothing led to the older ones (?before was ignored)
    async with running_app(make_settings(database_url)) as (app, client):
        await signup(client, "alice")
        db = app.state.hearth.db
        async with db.sessions() as s, s.begin():
            user = (await s.execute(select(User))).scalar_one()
            cipher = crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
            start = datetime.now(timezone.utc) - timedelta(days=30)
            for i in range(123):  # pairs share a time: the paging must neither skip nor repeat either
                row = Post(id=f"{i:032x}", user_id=user.id, created_at=start + timedelta(seconds=i // 2))
                row.body_ct = seal(cipher, row, "body_ct", f"post {i}")
                s.add(row)

        seen = await _walk(client, "/feed", r'<article class="card post" id="p-[0-9a-f]{32}">\s*<p>post (\d+)</p>',
                           r'href="(/feed\?before=[0-9a-f]{32})" id="older"', 50)
        assert seen == list(range(122, -1, -1)), "some of the feed cannot be reached from its page"
        older = await client.get(f"/feed?before={1:032x}")
        assert older.status_code == 200 and 'id="newest"' in older.text and 'id="older"' not in older.text

        assert (await client.get(f"/feed?before={'f' * 32}")).status_code == 404  # no such post
        async with await _second_user(app) as bob:
            await signup(bob, "bob")
            assert (await bob.get(f"/feed?before={5:032x}")).status_code == 404  # alice's post
            assert "post 5" not in (await bob.get("/feed")).text


async def test_simulation_mode_pages_back_to_the_first_situation(database_url, make_settings, master_key):
    # before: the page showed the 20 newest situations and nothing led to the older ones (?before was ignored)
    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        other = await create_companion(client, csrf, persona="juno")
        db = app.state.hearth.db
        async with db.sessions() as s, s.begin():
            user = (await s.execute(select(User))).scalar_one()
            cipher = crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
            start = datetime.now(timezone.utc) - timedelta(days=30)
            for i in range(45):
                row = Situation(id=f"{i:032x}", user_id=user.id, companion_id=cid,
                                created_at=start + timedelta(seconds=i // 2))
                row.text_ct = seal(cipher, row, "text_ct", f"situation {i}")
                s.add(row)
            row = Situation(id="e" * 32, user_id=user.id, companion_id=other, created_at=start)
            row.text_ct = seal(cipher, row, "text_ct", "about juno")
            s.add(row)

        url = f"/companions/{cid}/simulate"
        seen = await _walk(client, url, r'<article class="situation" id="s-[0-9a-f]{32}">\s*<p class="quote">situation (\d+)</p>',
                           r'href="(/companions/[0-9a-f]{32}/simulate\?before=[0-9a-f]{32})" id="older"', 20)
        assert seen == list(range(44, -1, -1)), "some situations cannot be reached from the page"
        assert "about juno" not in (await client.get(f"{url}?before={40:032x}")).text

        assert (await client.get(f"{url}?before={'f' * 32}")).status_code == 404  # no such situation
        assert (await client.get(f"{url}?before={'e' * 32}")).status_code == 404  # another companion's
        async with await _second_user(app) as bob:
            bob_csrf = await signup(bob, "bob")
            bob_cid = await create_companion(bob, bob_csrf)
            assert (await bob.get(f"/companions/{bob_cid}/simulate?before={5:032x}")).status_code == 404  # alice's
