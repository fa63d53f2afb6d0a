"""Review 50c: the stage pill follows each streamed reply, totals and all, without a reload.

Was: the chat stream's final "done" event carried the stage label but not the totals, so the pill's tooltip
("affection X, trust Y") kept the page-load numbers until a reload, however many replies changed them.
The fake model's replies carry affection +1 and trust +1 (tests/app/app_fakes.py).
"""

from __future__ import annotations


import pytest
from sqlalchemy import update

from hearth.app.storage.models import Companion
from tests.app.app_client import create_companion, signup, sse_events
from tests.app.conftest import running_app


@pytest.mark.anyio
async def test_the_done_event_carries_the_new_totals_and_stage(make_settings, database_url):
    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        async with app.state.hearth.db.sessions() as s, s.begin():  # friend, one reply short of close_friend
            await s.execute(update(Companion).where(Companion.id == cid).values(affection=27, trust=17))
        page = (await client.get(f"/companions/{cid}")).text
        assert 'title="affection 27, trust 17">friend</span>' in page

        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        r = await client.post(f"/companions/{cid}/messages", data={"message": "You can count on me."}, headers=headers)
        event, done = sse_events(r.text)[-1]
        assert event == "done"
        assert (done["affection"], done["trust"], done["stage"], done["stage_key"]) == (28, 18, "close", "close_friend")

        r = await client.post(f"/companions/{cid}/messages", data={"message": "Always."}, headers=headers)
        event, done = sse_events(r.text)[-1]
        assert event == "done"
        assert (done["affection"], done["trust"], done["stage"], done["stage_key"]) == (29, 19, "close", "close_friend")
        page = (await client.get(f"/companions/{cid}")).text  # what a reload shows: the same
        assert 'title="affection 29, trust 19">close</span>' in page


@pytest.mark.anyio
async def test_a_failed_read_back_still_acknowledges_the_saved_turn(make_settings, database_url, monkeypatch):
    """The totals are read after the turn committed: if that read fails (the companion deleted meanwhile), the page
    still gets "done" (the turn is saved; an "error" would tell it nothing was) with the turn's own stage."""
    from hearth.app import companions as svc

    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        real_get, real_save, saved = svc.get_companion, svc.save_turn, []

        async def save_turn(*args, **kw):
            turn = await real_save(*args, **kw)
            saved.append(turn)
            return turn

        async def get_companion(db, cipher, companion_id):
            if saved:  # the read back after the committed turn fails, as if the companion were deleted meanwhile
                raise svc.NotFound("companion")
            return await real_get(db, cipher, companion_id)

        monkeypatch.setattr(svc, "save_turn", save_turn)
        monkeypatch.setattr(svc, "get_companion", get_companion)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "Hello."},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        event, done = sse_events(r.text)[-1]
        assert len(saved) == 1 and event == "done", r.text
        assert done["stage"] == "stranger" and done["stage_key"] == "stranger" and "affection" not in done
        monkeypatch.undo()
        page = (await client.get(f"/companions/{cid}")).text
        assert "Echo: Hello." in page and 'title="affection 1, trust 1"' in page
