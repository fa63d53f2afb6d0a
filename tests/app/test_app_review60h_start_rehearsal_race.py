"""Starting a rehearsal whose companion (or agent) is deleted after start_rehearsal checked it and before the
rehearsal's row is inserted (another tab deleting it): the foreign key refuses the row, and that IntegrityError was a
500. Now it answers as the check would have: 404 for the companion, the agent_id error for the agent; nothing saved.
The race is made deterministic as in review 59: the companion's ownership check deletes the row in another session
once it has passed."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import delete

from hearth.app import simulation
from hearth.app.storage.models import Agent, Companion, Rehearsal
from tests.app.app_client import create_companion, signup
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio


def _deleted_once_checked(app, monkeypatch, model) -> None:
    """simulation.check_owned: once its first companion check has passed, the ``model`` row goes (another request)."""
    real, done = simulation.check_owned, []

    async def other_request_won(db, checked, user_id, record_id, what):
        await real(db, checked, user_id, record_id, what)
        if checked is Companion and not done:
            done.append(record_id)
            async with app.state.hearth.db.sessions() as s, s.begin():
                await s.execute(delete(model))

    monkeypatch.setattr(simulation, "check_owned", other_request_won)


@pytest.mark.parametrize("gone", ["companion", "agent"])
async def test_a_rehearsal_started_while_its_companion_or_agent_is_deleted_is_not_a_500(
        make_settings, sqlite_url, monkeypatch, gone):
    # "agent": the agent goes right after the companion's check, before the agent's own look-up, so this case holds
    # the answer the look-up gives; "companion" is the race past every check (a 500 before the fix)
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post("/agents", data={"name": "Sam", "personality": "blunt", "backstory": "a colleague",
                                               "relationship": "coworker", "companion_id": cid, "csrf": csrf})
        assert r.status_code == 303, r.text
        page = (await client.get(f"/companions/{cid}/simulate")).text
        agent_id = re.search(r'<select name="agent_id"><option value="([0-9a-f]{32})"', page).group(1)
        _deleted_once_checked(app, monkeypatch, Companion if gone == "companion" else Agent)
        answer = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf},
                                   headers={"accept": "application/json"})
        if gone == "companion":
            assert answer.status_code == 404, answer.text[-600:]
        else:
            assert answer.status_code == 400, answer.text[-600:]
            assert "agent_id" in answer.json()["detail"]
        assert await count_rows(app, Rehearsal) == 0
