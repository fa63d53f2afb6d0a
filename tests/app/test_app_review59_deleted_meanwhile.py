"""Review 59: a rehearsal turn or a situation sent WITHOUT a submission id (an older page, a client that sends none),
whose rehearsal or companion is deleted after the turn checked it and before its rows were inserted: the foreign key
refuses the rows, and that IntegrityError surfaced as a 500 (the stream said that the model failed). With an id it
was already answered as "gone" (common.once_per_submission's ``gone``); now without one too: the form's 404, the
stream's "deleted meanwhile" error, nothing saved. The race is made deterministic: the ownership check deletes the
row in another session (the other request winning) once it has passed."""

from __future__ import annotations

import pytest
from sqlalchemy import delete

from hearth.app import simulation
from hearth.app.routes.simulation import REHEARSAL_GONE
from hearth.app.storage.models import Companion, Reading, Rehearsal, RehearsalTurn, Situation
from tests.app.app_client import create_companion, signup, sse_events, start_rehearsal
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio
STREAM = {"accept": "text/event-stream"}


def _deleted_once_checked(app, monkeypatch, model) -> None:
    """simulation.check_owned, whose first check of a ``model`` row deletes that row in another session once passed."""
    real, done = simulation.check_owned, []

    async def other_request_won(db, checked, user_id, record_id, what):
        await real(db, checked, user_id, record_id, what)
        if checked is model and not done:
            done.append(record_id)
            async with app.state.hearth.db.sessions() as s, s.begin():
                await s.execute(delete(model).where(model.id == record_id))

    monkeypatch.setattr(simulation, "check_owned", other_request_won)


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
async def test_a_rehearsal_deleted_before_its_turn_is_inserted_is_gone_without_a_submission_id(
        make_settings, sqlite_url, monkeypatch, stream):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        rid = await start_rehearsal(client, csrf, await create_companion(client, csrf))
        _deleted_once_checked(app, monkeypatch, Rehearsal)
        answer = await client.post(f"/rehearsals/{rid}/turns", data={"message": "hello", "csrf": csrf},
                                   headers=STREAM if stream else {})
        if stream:
            assert sse_events(answer.text)[-1] == ("error", {"message": REHEARSAL_GONE}), answer.text[-600:]
        else:
            assert answer.status_code == 404, answer.text[-600:]
        assert (await count_rows(app, Rehearsal), await count_rows(app, RehearsalTurn)) == (0, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
async def test_a_companion_deleted_before_its_situation_is_inserted_is_gone_without_a_submission_id(
        make_settings, sqlite_url, monkeypatch, stream):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        _deleted_once_checked(app, monkeypatch, Companion)
        answer = await client.post(f"/companions/{cid}/situations", data={"situation": "my boss", "csrf": csrf},
                                   headers=STREAM if stream else {})
        if stream:
            event, data = sse_events(answer.text)[-1]
            assert event == "error" and "companion was deleted" in data["message"], answer.text[-600:]
        else:
            assert answer.status_code == 404, answer.text[-600:]
        assert (await count_rows(app, Situation), await count_rows(app, Reading)) == (0, 0)
