"""The app reaches every relationship stage the prompts describe (review 50b).

Was: hearth.prompts.STAGES ends at "confidant" (its own prompt text; the eval's companion-05 and the corpus may use
it), but the app's ladder (hearth.app.relationship.STAGES) stopped at close_friend, so the fine-tune was trained and
scored on a companion prompt production never sent, and a long relationship never grew past "close".
"""

from __future__ import annotations


import pytest
from sqlalchemy import update

from hearth import prompts
from hearth.app.relationship import STAGES, standing
from hearth.app.storage.models import Companion
from tests.app.app_client import create_companion, signup, sse_events
from tests.app.conftest import running_app


def test_the_apps_stage_keys_are_the_prompt_stages_in_the_same_order():
    """One ladder: a stage added to (or renamed in) either place fails here until the other follows."""
    assert [key for key, *_ in STAGES] == list(prompts.STAGES)


@pytest.mark.parametrize("affection,trust,stage", [
    (45, 45, "confidant"), (50, 40, "confidant"), (200, 40, "confidant"),
    (49, 40, "close_friend"),   # score 89: one short
    (80, 39, "close_friend"),   # trust gates the top too: warmth alone does not make a confidant
    (150, 17, "friend"),        # no skipping over the close_friend gate
])
def test_confidant_is_reached_at_90_with_trust_40(affection, trust, stage):
    assert standing(affection, trust).key == stage


def test_next_at_points_at_the_confidant_threshold_and_the_top_has_none():
    assert standing(27, 18).key == "close_friend" and standing(27, 18).next_at == 90
    assert standing(50, 40).next_at is None
    assert standing(50, 40).label == "confidant"


def test_the_ladder_is_ordered_and_every_label_is_distinct():
    scores = [s for _, _, s, _ in STAGES]
    trusts = [t for *_, t in STAGES]
    assert scores == sorted(scores) and len(set(scores)) == len(scores)
    assert trusts == sorted(trusts)
    assert len({label for _, label, *_ in STAGES}) == len(STAGES)


@pytest.mark.anyio
async def test_a_turn_that_crosses_the_threshold_shows_confidant_and_the_next_prompt_says_so(
        make_settings, database_url):
    """The fake model's replies carry affection +1 and trust +1: from 49/39 one turn makes 50/40 (score 90)."""
    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        async with app.state.hearth.db.sessions() as s, s.begin():
            await s.execute(update(Companion).where(Companion.id == cid).values(affection=49, trust=39))
        home = (await client.get("/")).text
        assert '<span class="pill">close</span>' in home

        model = app.state.hearth.model
        r = await client.post(f"/companions/{cid}/messages", data={"message": "I have told you everything."},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        events = sse_events(r.text)
        assert events[-1][0] == "done" and events[-1][1]["stage"] == "confidant"
        assert prompts.STAGES["close_friend"] in model.calls[-1][1][0]["content"]  # the turn that crossed it

        page = (await client.get(f"/companions/{cid}")).text
        assert 'id="stage"' in page and ">confidant</span>" in page
        assert '<span class="pill">confidant</span>' in (await client.get("/")).text

        r = await client.post(f"/companions/{cid}/messages", data={"message": "And one more thing.", "csrf": csrf})
        assert r.status_code == 303
        system = model.calls[-1][1][0]["content"]
        assert prompts.STAGES["confidant"] in system and prompts.STAGES["close_friend"] not in system
