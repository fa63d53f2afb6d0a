"""A streamed chat reply holding half of a surrogate pair (a JSON "\\ud83d" escape with no low half: a model cut
inside an emoji) failed on the page's preview, not as the invalid reply it is: the preview decoded the half with
the next six characters as its pair (JSONDecodeError when they were no low half's escape), or passed the lone half
to sse(), whose UTF-8 encoding raised UnicodeEncodeError in the route; either way the page was told of an unexpected
failure (and the chain saw its consumer close, not its provider's invalid reply). Now the preview shows U+FFFD for
it and the turn ends as any invalid reply does: the gateway's error, nothing saved."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hearth.app.model import describe_failure
from hearth.app.storage.models import Message
from hearth.envelope import EnvelopeError, parse_envelope
from hearth.gateway.errors import InvalidEnvelope, StreamInterrupted
from tests.app.app_client import create_companion, signup, sse_events
from tests.app.app_fakes import FakeModel
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio
CUT = '{"message": "I brought you a flower \\ud83d", "mood": "warm", "suggested_actions": [], "memories": []}'


class CutEmojiModel(FakeModel):
    """Streams CUT in small pieces, then fails as the chain fails a stream whose envelope does not validate."""

    def __init__(self) -> None:
        super().__init__()
        with pytest.raises(EnvelopeError) as info:
            parse_envelope(CUT, "chat")
        self.failure = StreamInterrupted("fake", InvalidEnvelope("fake", info.value))

    async def stream(self, messages, *, kind, **kw):
        self.calls.append((kind, messages))
        for i in range(0, len(CUT), 5):
            yield SimpleNamespace(text=CUT[i:i + 5], provider="fake")
        raise self.failure


async def test_a_lone_surrogate_in_a_streamed_reply_fails_as_an_invalid_reply(make_settings, database_url):
    model = CutEmojiModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hello"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        events = sse_events(r.text)
        assert [e for e, _ in events if e != "delta"] == ["error"]
        shown = "".join(d["text"] for e, d in events if e == "delta")
        assert shown == "I brought you a flower \ufffd"  # before: no delta got out past the half
        # the invalid reply's own message, as for any reply the gateway refused (before: an unexpected failure's)
        assert events[-1][1]["message"] == f"The reply failed: {describe_failure(model.failure)} Nothing was saved."
        assert await count_rows(app, Message) == 0
