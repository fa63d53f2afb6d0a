"""The prompt budget, [app] max_prompt_chars (hearth.companion_rules.fit_history).

Was: no request had a size limit. A chat or rehearsal sends up to chat_context_turns (20: 40 messages) earlier turns of
up to max_text_chars each, so a thread with a few long turns sent requests past the served model's context: the model
refused every later turn of that thread (the long turns stay in its history), and the user could only clear the chat.
Now each request leaves out its oldest earlier exchanges to fit max_prompt_chars, and a budget that cannot hold the
largest system prompt and one max_text_chars message is refused at start-up, naming the setting.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from hearth import prompts
from hearth.app.common import FORM_TEXT_MAX
from hearth.app.settings import SettingsError, load_settings
from hearth.companion_rules import AGENT_FIELD_LIMITS, MAX_CONTEXT, MAX_NAME, MAX_PROMPT_CHARS, prompt_chars
from hearth.envelope import ChatReply
from hearth.gateway.errors import UpstreamStatus
from hearth.prompt_budget import MEMORY_CHARS, largest_system_prompt
from tests.app.app_client import create_companion, signup, sse_events, start_rehearsal
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

BODY = 12 * FORM_TEXT_MAX + 1024  # a max_body_bytes that carries the longest text
MESSAGE_CHARS = ChatReply.model_fields["message"].metadata[0].max_length  # the longest reply the panel reads


@dataclass
class ContextModel(FakeModel):
    """A FakeModel with a served context: a request over ``limit`` characters is refused as vLLM refuses one past its
    max model length (HTTP 400), whatever its kind."""

    limit: int = MAX_PROMPT_CHARS

    async def complete(self, messages, *, kind, **kw):
        if prompt_chars(messages) > self.limit:
            self.calls.append((kind, messages))
            raise UpstreamStatus("fake", 400, body="context_length_exceeded")
        return await super().complete(messages, kind=kind, **kw)


@asynccontextmanager
async def _context_app(settings):
    """The app on a ContextModel served at settings.max_prompt_chars, with a signed-in user and one companion:
    yields (model, client, csrf, companion id)."""
    model = ContextModel(limit=settings.max_prompt_chars)
    async with running_app(settings, model=model) as (_, client):
        csrf = await signup(client, "ann")
        yield model, client, csrf, await create_companion(client, csrf)


# ------------------------------------------------------------------------------------------------ start-up
def test_a_budget_that_cannot_hold_the_largest_request_is_refused_at_start_up(make_settings, sqlite_url):
    what, system = largest_system_prompt(30)
    assert system + 4000 <= MAX_PROMPT_CHARS  # the defaults hold it
    with pytest.raises(SettingsError) as caught:  # the largest text the forms take, the default budget
        make_settings(sqlite_url, max_text_chars=FORM_TEXT_MAX, max_body_bytes=BODY)
    assert caught.value.field == "max_prompt_chars"
    assert str(system + FORM_TEXT_MAX) in str(caught.value) and "max_text_chars" in str(caught.value)
    with pytest.raises(SettingsError) as caught:  # more memories in every prompt
        make_settings(sqlite_url, prompt_memories=100)
    assert caught.value.field == "max_prompt_chars"
    with pytest.raises(SettingsError) as caught:
        make_settings(sqlite_url, max_prompt_chars=system + 4000 - 1)
    assert caught.value.field == "max_prompt_chars"
    assert make_settings(sqlite_url, max_prompt_chars=system + 4000).max_prompt_chars == system + 4000
    s = make_settings(sqlite_url, max_text_chars=FORM_TEXT_MAX, max_body_bytes=BODY,
                      max_prompt_chars=system + FORM_TEXT_MAX)
    assert s.max_prompt_chars == system + FORM_TEXT_MAX


def test_the_budget_comes_from_the_toml_and_the_environment(tmp_path, master_key_text):
    env = {"HEARTH_MASTER_KEY": master_key_text}
    cfg = tmp_path / "hearth.toml"
    cfg.write_text(f'[app]\nvar_dir = "{tmp_path / "var"}"\nmax_prompt_chars = 40000\n')
    assert load_settings(None, env=env, overrides={"var_dir": str(tmp_path / "var")}).max_prompt_chars == 32000
    assert load_settings(cfg, env=env).max_prompt_chars == 40000
    assert load_settings(cfg, env={**env, "HEARTH_MAX_PROMPT_CHARS": "50000"}).max_prompt_chars == 50000
    with pytest.raises(SettingsError) as caught:
        load_settings(cfg, env={**env, "HEARTH_MAX_PROMPT_CHARS": "20000"})
    assert caught.value.field == "max_prompt_chars"


# ------------------------------------------------------------------------------------------------ the requests
LONG = 4000  # max_text_chars' default: each message at the limit


def _long(i: int) -> str:
    return f"turn {i} " + "x" * (LONG - len(f"turn {i} "))


def _check_request(messages: list[dict], text: str, budget: int) -> None:
    assert prompt_chars(messages) <= budget
    assert messages[-1] == {"role": "user", "content": text}  # the new message, whole
    assert messages[0]["role"] == "system" and "## Reply format" in messages[0]["content"]  # with its format
    earlier = messages[1:-1]
    assert not earlier or earlier[0]["role"] == "user"  # whole exchanges: a kept reply has its turn


@pytest.mark.anyio
async def test_a_chat_of_long_turns_keeps_getting_replies_within_the_budget(make_settings, sqlite_url):
    settings = make_settings(sqlite_url)
    async with _context_app(settings) as (model, client, csrf, cid):
        for i in range(12):  # before: the 8th turn went over the context, then every later one
            r = await client.post(f"/companions/{cid}/messages", data={"message": _long(i), "csrf": csrf})
            assert r.status_code == 303, (i, r.text[-500:])
            kind, messages = model.calls[-1]
            assert kind == "chat"
            _check_request(messages, _long(i), settings.max_prompt_chars)
        # the newest exchanges are the ones kept, and as many as fit: one more would not
        earlier = messages[1:-1]
        assert earlier and earlier[-2]["content"] == _long(10) and len(earlier) < 2 * 11
        dropped_next = len(_long(0)) + len(f"Echo: {_long(0)[:300]}")
        assert prompt_chars(messages) + dropped_next > settings.max_prompt_chars
        page = (await client.get(f"/companions/{cid}")).text
        assert "turn 11 " in page  # saved and shown: the whole chat stays in the thread, only the request is cut


@pytest.mark.anyio
async def test_a_streamed_chat_turn_is_bounded_too(make_settings, sqlite_url):
    settings = make_settings(sqlite_url)
    async with _context_app(settings) as (model, client, csrf, cid):
        for i in range(10):
            r = await client.post(f"/companions/{cid}/messages", data={"message": _long(i), "csrf": csrf},
                                  headers={"accept": "text/event-stream"})
            assert r.status_code == 200 and "event: done" in r.text, (i, r.text[-500:])
            _check_request(model.calls[-1][1], _long(i), settings.max_prompt_chars)


@pytest.mark.anyio
async def test_a_rehearsal_of_long_turns_keeps_getting_replies_within_the_budget(make_settings, sqlite_url):
    settings = make_settings(sqlite_url)
    async with _context_app(settings) as (model, client, csrf, cid):
        rid = await start_rehearsal(client, csrf, cid)
        for i in range(10):
            r = await client.post(f"/rehearsals/{rid}/turns", data={"message": _long(i), "csrf": csrf})
            assert r.status_code == 303, (i, r.text[-500:])
            agent = [m for k, m in model.calls if k == "chat"][-1]
            _check_request(agent, _long(i), settings.max_prompt_chars)
        assert "turn 9 " in (await client.get(f"/rehearsals/{rid}")).text


# ------------------------------------------------------------------------------------------------ the panel
PANEL_TEXT = 10000  # a deployment's max_text_chars: 6 earlier lines and the new exchange outgrow the budget


def _panel_line(i: int) -> str:
    return f"line {i} " + "y" * (PANEL_TEXT - len(f"line {i} "))


def _check_panel(calls: list[tuple[str, list[dict]]], text: str, budget: int, earlier: bool = True) -> None:
    """The panel's five requests of the last turn: each within the budget, its system prompt and the new exchange
    whole, the newest earlier line kept, the oldest left out first."""
    analysts = [m for k, m in calls if k == "analyst"][-5:]
    assert sorted(m[0]["content"].split('"analyst" field must be exactly "')[1].split('"')[0] for m in analysts) == \
        sorted(prompts.ANALYSTS)
    for messages in analysts:
        assert prompt_chars(messages) <= budget
        assert messages[0]["role"] == "system" and "## Reply format" in messages[0]["content"]
        ((user_turn,),) = (messages[1:],)
        user = user_turn["content"]
        assert f"Me: {text}\nSam: Echo: " in user and user.endswith("How is it going, and what should I say next?")
        assert user.count("\nMe: ") >= (2 if earlier else 1)  # an earlier line kept: the newest one


@pytest.mark.anyio
async def test_the_panel_after_long_rehearsal_turns_reads_within_the_budget(make_settings, sqlite_url):
    what, system = largest_system_prompt(30)
    settings = make_settings(sqlite_url, max_text_chars=PANEL_TEXT, max_prompt_chars=system + PANEL_TEXT)
    async with _context_app(settings) as (model, client, csrf, cid):
        rid = await start_rehearsal(client, csrf, cid)
        for i in range(5):  # before: from the 3rd turn on the panel's requests went over, every reading failed
            r = await client.post(f"/rehearsals/{rid}/turns", data={"message": _panel_line(i), "csrf": csrf})
            assert r.status_code == 303, (i, r.text[-500:])
            _check_panel(model.calls, _panel_line(i), settings.max_prompt_chars, earlier=i > 0)
        last = [m for k, m in model.calls if k == "analyst"][-1][1]["content"]
        assert "line 3 " in last and "line 0 " not in last  # the oldest lines left out, the newest kept
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": _panel_line(5), "csrf": csrf},
                              headers={"accept": "text/event-stream"})
        readings = [data for event, data in sse_events(r.text) if event == "reading"]
        assert [d["ok"] for d in readings] == [True] * 5, r.text[-500:]
        _check_panel(model.calls, _panel_line(5), settings.max_prompt_chars)
        assert "error" not in [event for event, _ in sse_events(r.text)]


@pytest.mark.parametrize("memories, text", [(0, 10), (30, 4000), (30, FORM_TEXT_MAX), (500, 4000)])
def test_the_smallest_budget_start_up_accepts_holds_the_panels_fixed_part(memories, text):
    """The panel's request that cannot be cut (an analyst's system prompt, the exchange without earlier lines, every
    text at its cap) is smaller than the largest system prompt and one message, which start-up checks: no second
    check is needed. A prompt change that breaks this fails here."""
    _, system = largest_system_prompt(memories)
    context = prompts.panel_context("c" * MAX_CONTEXT, companion="n" * MAX_NAME,
                                    memories=["m" * MEMORY_CHARS] * memories)
    analyst = max(len(prompts.analyst_system_prompt(a, shared_context=context)) for a in prompts.ANALYSTS)
    person = {field: field[0] * AGENT_FIELD_LIMITS[field] for field in ("name", "personality", "relationship")}
    exchange = prompts.rehearsal_exchange(**person, earlier=[], text="t" * text, reply="r" * MESSAGE_CHARS)
    assert analyst + len(exchange) <= system + text
