"""Review 55: a feed post resubmitted is saved once.

Was: chat messages, rehearsal turns and situations carry a submission id (reviews 51e, 51g), but a feed post had
none. When the answer to a post was lost (a proxy timing out during the wait for the companions' comments) and the
browser or the user posted the form again, the companions were asked again and the post was saved twice, comments
and all. Now the feed form carries an id with the page, stored on the post under a unique index per user (schema
0006); a resend with a saved id redirects to the saved post without asking the model, two resends racing store one
post (the index decides), and an id that comes back with another text is refused (409, the text kept in its box).
Clients without an id work as before. Both backends (PostgreSQL with HEARTH_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import datetime, timezone

import pytest
from sqlalchemy import select, text

from hearth.app import companions, feed
from hearth.app.storage import upgrade
from hearth.app.storage.models import Comment, Post
from tests.app.app_client import create_companion, forms_racing, signup
from tests.app.app_fakes import FakeModel, GatedModel, kind_from_request, openai_handler
from tests.app.app_schema import HEAD, database_at, downgrade, insert_companion, scalars, upgrade_and_compare
from tests.app.conftest import count_rows, running_app, running_app_on_chain
from tests.fakes.openai_server import FakeOpenAI

pytestmark = pytest.mark.anyio
_SID = re.compile(r'<form[^>]*id="post-form"[^>]*>.*?name="submission_id" value="([0-9a-f]{32})"', re.S)
TEXT = "Finished the quilt"


def _comment_calls(model) -> int:
    return len([c for c in model.calls if c[0] == "feed_comment"])


async def _post_ids(app) -> list[str]:
    async with app.state.hearth.db.sessions() as s:
        return list((await s.execute(select(Post.id))).scalars())


async def test_a_resubmitted_post_is_saved_once_and_the_model_asked_once(tmp_path, master_key_text):
    # through the REAL gateway chain against the loopback fake OpenAI server: the requests it got are the model's
    async with FakeOpenAI(openai_handler) as fake:
        async with running_app_on_chain(tmp_path, master_key_text, fake.base_url) as (app, client):
            csrf = await signup(client, "hana")
            for persona in ("wren", "sol"):
                await create_companion(client, csrf, persona=persona)
            page = (await client.get("/feed")).text
            match = _SID.search(page)
            assert match, "no submission_id in the feed form"  # before: no such field
            sid = match.group(1)
            form = {"post": TEXT, "csrf": csrf, "submission_id": sid}
            locations = set()
            for _ in range(2):  # the browser posts the form again (the first answer was lost)
                r = await client.post("/feed/posts", data=form)
                assert r.status_code == 303, r.text
                locations.add(r.headers["location"])
            assert await count_rows(app, Post) == 1  # before: 2
            assert await count_rows(app, Comment) == 2  # before: 4
            assert [kind_from_request(b) for b in fake.requests] == ["feed_comment"] * 2  # before: 4, asked again
            (saved_id,) = await _post_ids(app)
            assert locations == {f"/feed#p-{saved_id}"}
            page = (await client.get("/feed")).text
            assert page.count(f"<p>{TEXT}</p>") == 1 and page.count(f"Proud of you for: {TEXT}") == 2
            assert _SID.search(page).group(1) != sid  # the next post gets a new id


async def test_two_ids_make_two_posts(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        await create_companion(client, csrf)
        for _ in range(2):  # the same text posted from two pages (each page's form has its own id)
            sid = _SID.search((await client.get("/feed")).text).group(1)
            r = await client.post("/feed/posts", data={"post": TEXT, "csrf": csrf, "submission_id": sid})
            assert r.status_code == 303, r.text
        assert await count_rows(app, Post) == 2 and await count_rows(app, Comment) == 2
        assert _comment_calls(model) == 2
        assert (await client.get("/feed")).text.count(f"<p>{TEXT}</p>") == 2


async def test_posts_without_an_id_work_as_before(make_settings, sqlite_url):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        await create_companion(client, csrf)
        for data in ({"post": TEXT, "csrf": csrf}, {"post": TEXT, "csrf": csrf, "submission_id": ""}):
            assert (await client.post("/feed/posts", data=data)).status_code == 303
        assert await count_rows(app, Post) == 2  # the same text sent without an id is a new post
        r = await client.post("/feed/posts", data={"post": TEXT, "csrf": csrf, "submission_id": "not-an-id"})
        assert r.status_code == 400 and "submission_id" in r.text
        assert await count_rows(app, Post) == 2 and _comment_calls(model) == 2
        async with app.state.hearth.db.sessions() as s:
            assert list((await s.execute(select(Post.submission_id))).scalars()) == [None, None]


async def test_an_id_reused_for_another_post_keeps_that_post_in_the_box(make_settings, sqlite_url):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        assert (await client.post("/feed/posts", data={"post": "first", "csrf": csrf,
                                                       "submission_id": sid})).status_code == 303
        # e.g. the page from before that post (the back button) used for a new one
        r = await client.post("/feed/posts", data={"post": "second", "csrf": csrf, "submission_id": sid})
        assert r.status_code == 409 and "second</textarea>" in r.text and "submission_id" in r.text
        assert _SID.search(r.text).group(1) != sid  # sent again from that page, it goes under a new id
        assert await count_rows(app, Post) == 1 and _comment_calls(model) == 1


async def test_another_users_id_is_not_their_post(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        sid = uuid.uuid4().hex
        r = await client.post("/feed/posts", data={"post": "mine", "csrf": csrf, "submission_id": sid})
        assert r.status_code == 303
        client.cookies.clear()
        csrf = await signup(client, "mallory")
        r = await client.post("/feed/posts", data={"post": "mine", "csrf": csrf, "submission_id": sid})
        assert r.status_code == 303  # a post of her own, not alice's replayed
        assert await count_rows(app, Post) == 2
        assert "<p>mine</p>" in (await client.get("/feed")).text


async def test_two_form_resends_racing_store_one_post(make_settings, database_url):
    model = GatedModel(2, kind="feed_comment")  # both are past the look-up for a saved post when the comments come
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        await create_companion(client, csrf)
        data = {"post": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        answers = await asyncio.gather(*(client.post("/feed/posts", data=data) for _ in range(2)))
        assert [r.status_code for r in answers] == [303, 303], [r.text for r in answers]
        (saved_id,) = await _post_ids(app)
        assert {r.headers["location"] for r in answers} == {f"/feed#p-{saved_id}"}
        assert await count_rows(app, Post) == 1 and await count_rows(app, Comment) == 1


async def test_two_forms_racing_with_one_id_and_two_texts_keep_the_second_text(make_settings, database_url):
    async with running_app(make_settings(database_url), model=GatedModel(2, kind="feed_comment")) as (app, client):
        csrf = await signup(client, "alice")
        await create_companion(client, csrf)
        refused = await forms_racing(client, "/feed/posts", "post", ("first", "second"), csrf)
        assert re.search(r">(first|second)</textarea>", refused.text) and "submission_id" in refused.text
        assert await count_rows(app, Post) == 1 and await count_rows(app, Comment) == 1


async def test_schema_0006_matches_the_models_and_upgrades_and_downgrades_keeping_rows(database_url, master_key):
    async with database_at(database_url, "0005", master_key) as (database, user_id, cipher):
        now = datetime.now(timezone.utc)
        async with database.engine.begin() as conn:  # a post with a comment saved before 0006 (raw SQL)
            await insert_companion(conn, user_id, "c" * 32, now)
            await conn.execute(text("INSERT INTO posts (id, user_id, body_ct, created_at) VALUES (:id, :u, :b, :now)"),
                               dict(id="5" * 32, u=user_id, b=b"x", now=now))
            await conn.execute(text("INSERT INTO comments (id, user_id, post_id, companion_id, body_ct, tone, "
                                    "created_at) VALUES (:id, :u, :p, :c, :b, '', :now)"),
                               dict(id="6" * 32, u=user_id, p="5" * 32, c="c" * 32, b=b"x", now=now))
        diff, version = await upgrade_and_compare(database)
        assert await scalars(database, "select count(*) from posts where submission_id is null",
                             "select count(*) from comments") == [1, 1]
        assert diff == [], f"migrations and models disagree: {diff}"
        assert version == HEAD

        model = FakeModel()
        async with database.sessions() as s:  # a companion that comments; posts with two ids and one without
            await companions.create_companion(s, cipher, persona="wren")
            sid = uuid.uuid4().hex
            first = await feed.create_post(s, model, cipher, TEXT, max_chars=4000, max_commenters=3, timeout_s=5.0,
                                           submission_id=sid)
            again = await feed.create_post(s, model, cipher, TEXT, max_chars=4000, max_commenters=3, timeout_s=5.0,
                                           submission_id=sid)
            assert again.post_id == first.post_id and again.replayed and not first.replayed
            assert [(c.text, c.tone) for c in again.comments] == [(f"Proud of you for: {TEXT}", "proud")]
            for other in (uuid.uuid4().hex, None):
                await feed.create_post(s, model, cipher, TEXT, max_chars=4000, max_commenters=3, timeout_s=5.0,
                                       submission_id=other)
        assert _comment_calls(model) == 3
        await downgrade(database, "0005")
        counts = await scalars(database, *(f"select count(*) from {t}" for t in ("posts", "comments")))
        assert counts == [4, 4]  # no copy-and-drop cascaded to the comments
        await upgrade(database.engine)
