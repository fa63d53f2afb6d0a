"""--extra-body that json.loads cannot read for a reason other than a syntax error is refused naming the option
(exit 2, before any call), as a syntax error is.

Was: main caught only json.JSONDecodeError, but json.loads raises a plain ValueError for an integer of more than
4300 digits (Python's int_max_str_digits) and RecursionError for nesting deeper than the stack: both escaped as a
traceback (exit 1) naming neither the option nor what was wrong with it.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from tests.fakes.openai_server import Behavior, FakeOpenAI


@pytest.mark.parametrize("extra", [
    '{"top_k": 1' + "0" * 5000 + "}",  # ValueError: Exceeds the limit (4300 digits) for integer string conversion
    '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # RecursionError
], ids=["5001-digit integer", "deep nesting"])
def test_unreadable_extra_body_is_refused_naming_the_option(extra):
    with FakeOpenAI(lambda body: Behavior.reply('{"comment": "Nice.", "tone": "warm"}')) as server:
        result = CliRunner().invoke(app, ["eval", "feed", "--base-url", server.base_url, "--model", "m",
                                          "--timeout", "5", "--extra-body", extra])
        assert server.requests == [], "nothing may be sent"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "--extra-body is not JSON" in " ".join(result.output.split()), result.output
