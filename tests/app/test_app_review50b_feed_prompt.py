"""A feed comment request's user message is the one the eval scores and the corpus trains (review 50b).

Was: every feed case of the eval and every feed conversation of the example corpus sent the post as
"Post: <text>", while the app sends the post as the user typed it: the fine-tune was trained and scored on a
user turn production never sends. The app is the reference (a label there would change every deployed model's
prompt); the suites and the corpus now hold the post as the app sends it.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from hearth import prompts
from hearth.app import feed
from hearth.app.companions import CompanionView
from hearth.app.relationship import standing
from hearth.evals.suites import load_suite
from tests.app.app_client import create_companion, signup
from tests.app.conftest import running_app
from tests.app.app_fakes import FakeModel

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "hearth" / "train" / "data" / "example_corpus.jsonl"
LABEL = re.compile(r"\s*post\s*:", re.I)  # a label the app never puts before a post


def _companion(persona: str, world_view: str) -> CompanionView:
    return CompanionView(id="c1", name=prompts.PERSONAS[persona].name, persona=persona, world_view=world_view,
                         share_context=True, affection=0, trust=0, standing=standing(0, 0))


@pytest.mark.parametrize("case", load_suite("feed"), ids=lambda c: c.id)
def test_each_feed_case_is_a_post_as_the_app_sends_it(case):
    assert not LABEL.match(case.user), case.user
    model = FakeModel()
    asyncio.run(feed._comment(model, _companion(case.spec["persona"], case.spec["world_view"]),
                              case.spec["shared_context"], case.user, timeout_s=5))
    (kind, messages), = model.calls
    assert kind == "feed_comment" and messages == case.messages()  # the app's own request, byte for byte


def test_the_example_corpus_feed_turns_are_posts_as_the_app_sends_them():
    feeds = [conv for conv in map(json.loads, EXAMPLE.read_text(encoding="utf-8").splitlines())
             if conv.get("kind") == "feed_comment"]
    assert feeds
    for conv in feeds:
        for turn in conv["turns"][::2]:
            assert not LABEL.match(turn["content"]), (conv["id"], turn["content"])


@pytest.mark.anyio
async def test_a_post_reaches_the_model_as_typed(make_settings, sqlite_url):
    """The convention the data follows: the user turn is the post (stripped, as stored), nothing added."""
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        await create_companion(client, csrf)
        r = await client.post("/feed/posts", data={"post": "  First loaf that didn't sink.  ", "csrf": csrf})
        assert r.status_code == 303
        kind, messages = app.state.hearth.model.calls[-1]
        assert kind == "feed_comment"
        assert messages[-1] == {"role": "user", "content": "First loaf that didn't sink."}
