"""The app through the REAL gateway chain (in process) against the real-socket fake OpenAI server:
provider failures surface as a failed turn with nothing stored, one failing analyst shows as failed
while the other four arrive, and replies stream through Chain.stream."""

from __future__ import annotations

import json
import logging

import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Message
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import analyst_of, openai_handler
from tests.app.conftest import running_app_on_chain
from tests.fakes.openai_server import Behavior, FakeOpenAI

pytestmark = pytest.mark.anyio


async def test_real_chain_failures_store_nothing_and_one_analyst_failing_is_shown(tmp_path, master_key_text, caplog):
    caplog.set_level(logging.INFO)
    mode = {"broken": True}

    def handler(body):
        if mode["broken"]:  # the upstream's error body echoes what the user wrote: it must not reach the log
            return Behavior.status(500, body={"error": {"message": "model said MODELSAID123"}})
        if analyst_of(body["messages"]) == "status_observer":
            return Behavior.status(503)
        return openai_handler(body)

    async with FakeOpenAI(handler) as fake:
        async with running_app_on_chain(tmp_path, master_key_text, fake.base_url) as (app, client):
            assert type(app.state.hearth.model).__name__ == "Chain"
            csrf = await signup(client, "hana")
            cid = await create_companion(client, csrf)
            r = await client.post(f"/companions/{cid}/messages", data={"message": "hello", "csrf": csrf},
                                  headers={"accept": "text/html"})
            assert r.status_code == 502 and "Nothing was saved" in r.text
            assert "The model service reported an error." in r.text
            r = await client.post(f"/companions/{cid}/messages", data={"message": "hello"},
                                  headers={"accept": "text/event-stream", "x-csrf-token": csrf})
            assert "event: error" in r.text and "The model service reported an error." in r.text
            # the user reads what happened; the class names (not the upstream text) are in the log
            for internal in ("UpstreamStatus", "AllProvidersFailed", "StreamInterrupted", "MODELSAID123"):
                assert internal not in r.text
            assert "UpstreamStatus[fake, status_500]" in caplog.text
            assert "MODELSAID123" not in caplog.text  # the app's log records and the chain's in this process

            mode["broken"] = False
            r = await client.post(f"/companions/{cid}/messages", data={"message": "hello again"},
                                  headers={"accept": "text/event-stream", "x-csrf-token": csrf})
            blocks = [b.splitlines() for b in r.text.strip().split("\n\n")]
            assert [b[0] for b in blocks].count("event: delta") >= 1 and blocks[-1][0] == "event: done"
            assert json.loads(blocks[-1][1][6:])["provider"] == "fake"
            assert fake.requests[-1]["stream"] is True

            r = await client.post(f"/companions/{cid}/situations", data={"situation": "A tense meeting"},
                                  headers={"accept": "text/event-stream", "x-csrf-token": csrf})
            readings = [json.loads(b[1][6:]) for b in (blk.splitlines() for blk in r.text.strip().split("\n\n"))
                        if b[0] == "event: reading"]
            assert len(readings) == 5
            assert [d["analyst"] for d in readings if not d["ok"]] == ["status_observer"]
            failed = next(d for d in readings if not d["ok"])
            assert failed["error"].startswith("No model could answer right now.") and "Upstream" not in failed["error"]
            async with app.state.hearth.db.sessions() as s:
                n = (await s.execute(select(func.count()).select_from(Message))).scalar_one()
            assert n == 2  # only the turn that succeeded
