"""review76: a stream whose final chunk came ends there for the eval too, whatever follows, as it does in the gateway.

Was: once the chunk with the finish_reason had come, only [DONE] (and maybe the usage chunk) is missing; hearth's
gateway (gateway/providers.py ChatStream.next_delta) ends the reply there when the upstream then stalls or drops the
connection, as a clean end of the body does, and the app shows and saves it. The eval's client kept waiting: a stall
there was "timeout after Ns" and a dropped connection "RemoteProtocolError: ...", the whole reply thrown away and
the case failed (no status, no content) though the app takes it.

The answers come from a real loopback server, once straight to the eval and once through the real gateway as the
app's chat streams it: the two verdicts must agree.
"""

from __future__ import annotations

from aiohttp import web

from tests.evals.eval_vs_gateway import GOOD, LoopbackModel, event, verdicts as both

# first_token_s also bounds the gap between two lines of a stream in the gateway: how long it waits for [DONE]
TIMEOUTS = {"connect_s": 5.0, "first_token_s": 1.0, "total_s": 8.0}


class _Upstream(LoopbackModel):
    """A model server whose stream, after its final chunk, does what ``self.after`` says: "stall" (sends nothing
    more until the server stops), "drop" (the connection is cut, the chunked body never ended) or "done" ([DONE])."""

    after = "done"

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(event({"role": "assistant", "content": GOOD[:20]}).encode())
        await resp.write(event({"content": GOOD[20:]}).encode())
        await resp.write(event({}, "stop").encode())
        if self.after == "stall":
            await self.closing.wait()
        elif self.after == "drop":
            request.transport.abort()
            return resp
        else:
            await resp.write(b"data: [DONE]\n\n")
        try:
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp


def serve_after(model: _Upstream, after: str) -> bool:
    model.after = after
    return True


def verdicts(afters: tuple[str, ...]) -> tuple[dict, dict]:
    return both(_Upstream(), {after: after for after in afters}, serve_after, timeouts=TIMEOUTS, direct_timeout_s=3)


def test_a_stream_that_stalls_or_breaks_after_its_final_chunk_is_scored_as_the_app_takes_it():
    direct, gateway = verdicts(("done", "stall", "drop"))
    assert all(row.passed for row in gateway.values()), {k: r.reason for k, r in gateway.items()}  # the app takes all
    assert {k: r.reason for k, r in direct.items()} == {"done": None, "stall": None, "drop": None}
    for row in direct.values():
        assert row.status == 200 and row.finish_reason == "stop" and row.content == GOOD, row
