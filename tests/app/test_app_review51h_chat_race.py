"""Review 51h: two no-script chat posts racing with one submission id and two texts.

Was: the unique index refused the second save; its rollback expired the viewer's rows, and the 409 page that
keeps the text read them lazily, which the async session cannot (MissingGreenlet: a 500, the text lost). The
rehearsal and situation forms had the same fault (review 51g); all three now refresh the viewer first.
"""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Message
from tests.app.app_client import create_companion, signup
from tests.app.conftest import running_app
from tests.app.app_fakes import GatedModel

pytestmark = pytest.mark.anyio


async def test_two_chat_forms_racing_with_one_id_and_two_texts_keep_the_second_text(make_settings, database_url):
    async with running_app(make_settings(database_url), model=GatedModel(2)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        answers = await asyncio.gather(*(client.post(f"/companions/{cid}/messages",
                                                     data={"message": t, "csrf": csrf, "submission_id": sid})
                                         for t in ("about Friday", "about Monday")))
        assert sorted(r.status_code for r in answers) == [303, 409], [r.text[-400:] for r in answers]
        refused = next(r for r in answers if r.status_code == 409)
        assert re.search(r"about (Friday|Monday)</textarea>", refused.text) and "submission_id" in refused.text
        async with app.state.hearth.db.sessions() as s:
            assert (await s.execute(select(func.count()).select_from(Message))).scalar_one() == 2
