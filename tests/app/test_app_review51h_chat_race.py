"""Review 51h: two no-script chat posts racing with one submission id and two texts.

Was: the unique index refused the second save; its rollback expired the viewer's rows, and the 409 page that
keeps the text read them lazily, which the async session cannot (MissingGreenlet: a 500, the text lost). The
rehearsal and situation forms had the same fault (review 51g); all three now refresh the viewer first.
"""

from __future__ import annotations

import re

import pytest

from hearth.app.storage.models import Message
from tests.app.app_client import create_companion, forms_racing, signup
from tests.app.app_fakes import GatedModel
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio


async def test_two_chat_forms_racing_with_one_id_and_two_texts_keep_the_second_text(make_settings, database_url):
    async with running_app(make_settings(database_url), model=GatedModel(2)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        refused = await forms_racing(client, f"/companions/{cid}/messages", "message", ("about Friday", "about Monday"),
                                     csrf)
        assert re.search(r"about (Friday|Monday)</textarea>", refused.text) and "submission_id" in refused.text
        assert await count_rows(app, Message) == 2
