"""review76: a streamed answer's lines are read as SSE defines them, by the gateway as by the eval.

SSE (WHATWG HTML, "event stream interpretation") ends a line with CRLF, LF or a bare CR. The eval's client
(evals/client.py _sse_lines) split on all three; the gateway (transport/client.py _AiohttpResponse.lines) read with
aiohttp's readline(), which ends a line at LF only: a stream whose lines end in bare CRs read as one line (no data
line in it, or one past readline's 512 KiB limit) and failed in the gateway (502) while it passed the eval. A CRLF
split between two network chunks (the CR ends one, the LF starts the next) is ONE line end: the eval read it as a line
end and an empty line (an empty line ends an event).

Each answer is served by a real loopback server, once straight to the eval and once through the real gateway as the
app's chat streams it: the two verdicts must agree.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from aiohttp import web

from hearth.evals.client import _sse_lines
from hearth.gateway.transport.client import AiohttpTransport
from tests.evals.eval_vs_gateway import GOOD, SSE, LoopbackModel, agree as _agree, verdicts as both
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import gateway, make_config, provider, steady

MESSAGES = [{"role": "user", "content": "hi"}]


def _ended(end: str | list[str], text: str = SSE) -> str:
    """``text`` with its line ends (LF) made ``end``, or the ends of ``end`` in turn."""
    ends = [end] if isinstance(end, str) else end
    lines = text.split("\n")
    return "".join(line + ends[i % len(ends)] for i, line in enumerate(lines[:-1])) + lines[-1]


class _Pieces(LoopbackModel):
    """A model server that sends its answer as the given byte pieces, a short pause between two (so each comes as a
    network chunk of its own), or, in lockstep, each piece once the test puts a token in ``go``."""

    def __init__(self, lockstep: bool = False) -> None:
        self.pieces: list[bytes] = []
        self.lockstep = lockstep
        self.go: asyncio.Queue = asyncio.Queue()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, piece in enumerate(self.pieces):
            if i:
                if self.lockstep:
                    await self.go.get()
                else:
                    await asyncio.sleep(0.02)
            await resp.write(piece)
        await resp.write_eof()
        return resp


def _serve(model: _Pieces, pieces: list[bytes]) -> bool:
    model.pieces = pieces
    return True


def verdicts(answers: dict[str, list[bytes]]) -> tuple[dict, dict]:
    """{name: the answer's pieces} -> (the eval's row straight from the model, its row through the gateway)."""
    return both(_Pieces(), answers, _serve)


def test_a_stream_with_any_sse_line_end_passes_the_eval_and_the_gateway_alike():
    ends = {"LF": "\n", "CRLF": "\r\n", "CR": "\r", "mixed": ["\r", "\n", "\r\n"]}
    answers = {}
    for name, end in ends.items():
        text = _ended(end)
        answers[f"{name}, one piece"] = [text.encode()]
        # every line end the last byte of a piece (a CRLF split between its CR and its LF)
        answers[f"{name}, a piece a line"] = [piece.encode() for piece in re.split(r"(?<=[\r\n])", text) if piece]
    direct, through = verdicts(answers)
    _agree(direct, through)
    # before: every stream with bare CRs failed through the gateway (one line, no data line: 502)
    assert {name for name in answers if not through[name].passed} == set(), \
        {name: row.reason for name, row in through.items() if not row.passed}


# the pieces of one stream, in lockstep, and the lines each brings (line ends removed)
LOCKSTEP = [
    (b"data: a\r", ["data: a"]),              # a bare CR at a chunk's end ends the line now, not at the next byte
    (b"\n\r", [""]),                          # that CR's LF (the same line end), then an empty line
    (b"\n: c\r\n", [": c"]),                  # the empty line's CRLF, split; a comment
    (b"data: b\r\r", ["data: b", ""]),
    (b"\ndata: [DONE]\n", ["data: [DONE]"]),  # the last CR's LF; then EOF
]


def test_a_crlf_split_between_two_chunks_is_one_line_end_and_a_line_comes_at_its_end():
    async def read(open_lines, strip):
        async with _Pieces(lockstep=True) as model:
            model.pieces = [piece for piece, _ in LOCKSTEP]
            got = []
            async with open_lines(model.base_url + "/chat/completions") as lines:
                for i, (_, expected) in enumerate(LOCKSTEP):
                    if i:
                        model.go.put_nowait(None)
                    for _ in expected:
                        got.append(strip(await asyncio.wait_for(anext(lines), 5)))
                assert [strip(line) async for line in lines] == []
            return got

    class gateway_lines:  # the gateway's reader (transport/client.py)
        def __init__(self, url):
            self.url = url

        async def __aenter__(self):
            self.transport = AiohttpTransport()
            await self.transport.start()
            self.resp = await self.transport.open("POST", self.url, headers={"Content-Type": "application/json"},
                                                  body=b"{}", connect_timeout_s=5)
            return self.resp.lines()

        async def __aexit__(self, *exc):
            self.resp.close()
            await self.transport.aclose()

    class eval_lines:  # the eval's reader (evals/client.py)
        def __init__(self, url):
            self.url = url

        async def __aenter__(self):
            self.client = httpx.AsyncClient()
            self.stream = self.client.stream("POST", self.url, json={})
            return _sse_lines(await self.stream.__aenter__())

        async def __aexit__(self, *exc):
            await self.stream.__aexit__(*exc)
            await self.client.aclose()

    expected = [line for _, lines in LOCKSTEP for line in lines]
    # the gateway yields each line with its line end (an empty line is not the end of the stream)
    assert asyncio.run(read(gateway_lines, lambda line: line.rstrip(b"\r\n").decode())) == expected
    # before: the eval read the LF of a split CRLF as an empty line of its own
    assert asyncio.run(read(eval_lines, lambda line: line)) == expected


def _through(body: bytes) -> tuple[int, str | None, list[list[str]]]:
    """``body`` streamed by provider a, b the fallback: (status, the provider that served, the attempts)."""

    async def main():
        async with FakeOpenAI(Behavior.raw(body, content_type="text/event-stream")) as a, \
                FakeOpenAI(Behavior.reply(GOOD)) as b:
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                return r.status, r.headers.get("X-Hearth-Provider"), await r.read()

    status, served_by, raw = asyncio.run(main())
    events = [line[5:].strip() for line in raw.decode().splitlines() if line.startswith("data:")]
    return status, served_by, json.loads(events[-2])["hearth"]["attempts"]


@pytest.mark.parametrize("end", ["\r", "\n"])
def test_the_gateways_line_limit_is_per_line_whatever_the_line_end(end):
    # 1.2 MB of short lines (keep-alive comments) before the reply: each line is short
    chatter = (": " + "x" * 300 + end) * 4000
    assert _through(_ended(end, chatter + SSE).encode()) == (200, "a", [["a", "ok"]])
    # one line past the limit (512 KiB, aiohttp's readline) is a broken upstream: the next provider serves
    long_line = ": " + "x" * 600_000 + end
    assert _through(_ended(end, long_line + SSE).encode()) == (200, "b", [["a", "connection"], ["b", "ok"]])


# ------------------------------------------------------------------ a byte order mark
BOM = "\ufeff"


def test_a_bom_is_stripped_at_the_start_of_the_stream_only_and_an_events_data_is_utf8_json():
    """SSE strips one BOM at the very start of the stream; anywhere else it is text. An event's data is the UTF-8 text
    of a JSON document, and JSON text starts with no BOM: the gateway parsed it from bytes (json.loads), which skips
    a leading UTF-8 BOM, reads UTF-16 and UTF-32 too and lets encoded surrogates through, where the eval (text) refused
    them all; a BOM that started the stream was kept by both, so the stream's first line was no data line."""
    first, rest = SSE.split("\n\n", 1)
    answers = {
        "BOM at the stream start": [(BOM + SSE).encode()],
        "BOM at the stream start, split between two chunks": [b"\xef", b"\xbb\xbf" + SSE.encode()],
        "BOM at the stream start, then a comment": [(BOM + ": hi\n" + SSE).encode()],
        # only one is stripped: the first line starts with the second, so it is no data line (and GOOD[:20] is lost)
        "two BOMs at the stream start": [(BOM + BOM + SSE).encode()],
        "BOM before the first event's data": [(first.replace("data: ", "data: " + BOM) + "\n\n" + rest).encode()],
        "BOM before a later event's data": [(first + "\n\n" + rest.replace("data: {", "data: " + BOM + "{", 1))
                                            .encode()],
        "BOM starting a later line": [(first + "\n\n" + BOM + rest).encode()],
        "an event's data in UTF-16": [first.encode()[:6] + first[6:].encode("utf-16-le") + b"\n\n" + rest.encode()],
        "an event's data with an encoded surrogate": [first.replace("I'm", "I\\u0027m").encode()
                                                      .replace(b"\\u0027", b"\xed\xa0\x80") + b"\n\n" + rest.encode()],
    }
    direct, through = verdicts(answers)
    _agree(direct, through)
    assert {name for name in answers if direct[name].passed} == {
        "BOM at the stream start", "BOM at the stream start, split between two chunks",
        "BOM at the stream start, then a comment"}
