"""Bad input is refused before the first call, naming the argument as it was given (review 52i).

Was: the CLI's numeric options were checked by run_cases, whose messages named its Python parameters ("samples must
be >= 1", "timeout_s must be ...", "max_tokens must be >= 1 (or None: not sent)"), not the options typed. And a case
of a kind no envelope has went out to the server: the run broke with a ValueError from the scorer after its calls
were made (or, with json_schema, from the first request body), naming neither the case nor the argument.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from hearth.evals.runner import main, run_cases
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI


@pytest.mark.parametrize("option, value, words", [
    ("samples", 0, "--samples must be >= 1, got 0"),
    ("concurrency", 0, "--concurrency must be >= 1, got 0"),
    ("timeout_s", 0.0, "--timeout must be a finite number of seconds > 0, got 0"),
    ("timeout_s", math.nan, "--timeout must be a finite number of seconds > 0, got nan"),
    ("max_tokens", -1, "--max-tokens must be >= 1 (0: no max_tokens sent), got -1"),
    ("temperature", 3.0, "--temperature must be in [0, 2], got 3"),
])
def test_a_bad_number_is_refused_naming_its_option(option, value, words, capsys):
    # port 9 (discard): nothing answers there, and nothing is sent before the arguments are checked
    rc = main(suite="feed", base_url="http://127.0.0.1:9/v1", model="m", **{option: value})
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 2 and words in out, out


@pytest.mark.parametrize("json_schema", [False, True])
def test_a_case_of_an_unknown_kind_is_refused_before_any_call(json_schema):
    good = load_suite("feed")[0]
    bad = dataclasses.replace(good, id="feed-x", kind="comment")

    async def go():
        async with FakeOpenAI(lambda body: Behavior.reply('{"comment": "Nice.", "tone": "warm"}')) as server:
            with pytest.raises(ValueError) as info:
                await run_cases([good, bad], base_url=server.base_url, model="m", timeout_s=5,
                                json_schema=json_schema)
            return info.value, server.requests

    error, requests = asyncio.run(go())
    assert requests == []
    assert "cases[1].kind" in str(error) and "feed-x" in str(error) and "'comment'" in str(error), str(error)
