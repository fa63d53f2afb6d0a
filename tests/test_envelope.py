"""hearth.envelope: strict models, bounded repair, parse that never crashes, schemas that cannot drift."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hearth.envelope import (
    MAX_REPLY_CHARS, MODELS, REPLY_KINDS, AnalystReading, ChatReply, EnvelopeError, FeedComment, dumps,
    json_schema, kind_of, parse_envelope, repair, response_format, schema_text,
)

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------ strategies
def text(max_size: int) -> st.SearchStrategy[str]:
    return st.text(min_size=1, max_size=max_size).map(str.strip).filter(bool)


chat_replies = st.builds(
    ChatReply, message=text(200), mood=text(40), memories=st.lists(text(60), max_size=5),
    affection=st.integers(-2, 2), trust=st.integers(-2, 2), suggested_actions=st.lists(text(40), max_size=3),
)
feed_comments = st.builds(FeedComment, comment=text(200), tone=text(40))
analyst_readings = st.builds(
    AnalystReading, analyst=st.sampled_from(["optimist", "cynic", "mentor", "status_observer", "gossiper"]),
    reading=text(200), advice=text(200), risk=st.sampled_from(["low", "medium", "high"]),
)
envelopes = st.one_of(chat_replies, feed_comments, analyst_readings)
# chatter that cannot itself contain a JSON object or a think tag
chatter = st.text(alphabet=st.characters(blacklist_characters="{}<>`"), max_size=40)


def wrap(body: str, how: str, before: str, after: str) -> str:
    if how == "fence":
        return f"```json\n{body}\n```"
    if how == "fence_chatter":
        return f"{before}\n```json\n{body}\n```\n{after}"
    if how == "empty_think":
        return f"<think>\n\n</think>\n\n{body}"
    if how == "think":
        # a complete think block that itself holds a JSON-looking draft: it must be dropped, not used
        return '<think>draft {"message": "not this one"} ' + before + f"</think>\n{body}"
    if how == "chatter":
        return f"{before}\n{body}\n{after}"
    return body


VALID_CHAT = {"message": "Hey, how did the exam go?", "mood": "curious", "memories": ["Has a chemistry exam on Thursday."],
              "affection": 1, "trust": 0, "suggested_actions": ["Tell Wren about the exam"]}


def chat(**changes) -> str:
    return json.dumps({**VALID_CHAT, **changes})


# ------------------------------------------------------------------------------------ round trips
@FAST
@given(envelope=envelopes, how=st.sampled_from(["plain", "fence", "fence_chatter", "empty_think", "think", "chatter"]),
       before=chatter, after=chatter)
def test_valid_envelopes_round_trip_through_dumps_and_wrapping(envelope, how, before, after):
    kind = kind_of(envelope)
    text_ = wrap(dumps(envelope), how, before, after)
    assert parse_envelope(text_, kind) == envelope


@FAST
@given(envelope=envelopes)
def test_dumps_is_canonical_one_line(envelope):
    out = dumps(envelope)
    assert "\n" not in out.replace("\\n", "")
    assert list(json.loads(out)) == list(type(envelope).model_fields)  # declared field order
    assert dumps(parse_envelope(out, kind_of(envelope))) == out


# ------------------------------------------------------------------------------- never crashes
def _parse_outcome(text_: str, kind: str):
    try:
        return parse_envelope(text_, kind)
    except EnvelopeError as exc:
        assert exc.reason and exc.raw is not None
        return exc


@FAST
@given(text_=st.text(max_size=300), kind=st.sampled_from(REPLY_KINDS))
def test_random_text_returns_model_or_envelope_error(text_, kind):
    out = _parse_outcome(text_, kind)
    assert isinstance(out, (EnvelopeError, *MODELS.values()))


@st.composite
def mutated_json(draw):
    envelope = draw(envelopes)
    body = dumps(envelope)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "insert", "truncate", "duplicate", "swap"]))
        i = draw(st.integers(0, len(body)))
        j = draw(st.integers(i, min(len(body), i + 12)))
        if op == "delete":
            body = body[:i] + body[j:]
        elif op == "insert":
            body = body[:i] + draw(st.text(alphabet='{}[]":,\\ 0123456789truefalsnl<>/think`', max_size=6)) + body[i:]
        elif op == "truncate":
            body = body[:i]
        elif op == "duplicate":
            body = body[:j] + body[i:j] + body[j:]
        else:
            body = body[:i] + body[j:] + body[i:j]
    return kind_of(envelope), body


@FAST
@given(case=mutated_json())
def test_mutated_json_returns_model_or_envelope_error(case):
    kind, body = case
    out = _parse_outcome(body, kind)
    if not isinstance(out, EnvelopeError):
        assert type(out) is MODELS[kind]


@FAST
@given(text_=st.text(max_size=300))
def test_repair_only_removes_wrapping(text_):
    try:
        out = repair(text_)
    except EnvelopeError:
        return
    assert out in text_  # a contiguous piece of the input: nothing invented, nothing reordered


@pytest.mark.parametrize("text_", ["[" * 10_000, "{" * 5000, '{"a":' * 3000, "1" * 5000, "\x00" * 10, "nan"])
def test_pathological_inputs_raise_envelope_error(text_):
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(text_, "chat")
    assert info.value.field is None


# ---------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "changes, field, reason",
    [
        ({"message": ""}, "message", "empty"),
        ({"message": "   \n\t"}, "message", "empty"),
        ({"mood": " "}, "mood", "empty"),
        ({"memories": ["ok", "  "]}, "memories.1", "empty"),
        ({"affection": 3}, "affection", "less than or equal to 2"),
        ({"trust": -3}, "trust", "greater than or equal to -2"),
        ({"affection": True}, "affection", "integer"),  # strict: a bool is not an int
        ({"trust": "1"}, "trust", "integer"),  # strict: a string is not an int
        ({"affection": 1.0}, "affection", "integer"),
        ({"message": "x" * 2001}, "message", "at most 2000"),
        ({"memories": ["m"] * 6}, "memories", "at most 5"),
        ({"suggested_actions": "call mum"}, "suggested_actions", "list"),
        ({"extra": 1}, "extra", "Extra inputs"),
    ],
)
def test_invalid_chat_fields_name_the_field(changes, field, reason):
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(chat(**changes), "chat")
    assert info.value.field == field
    assert reason in info.value.reason
    assert str(info.value).startswith(f"{field}: ")


def test_missing_field_is_named():
    body = {k: v for k, v in VALID_CHAT.items() if k != "mood"}
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(json.dumps(body), "chat")
    assert (info.value.field, info.value.reason) == ("mood", "Field required")


def test_strings_are_stripped_and_validation_is_per_kind():
    env = parse_envelope(chat(message="  hi  "), "chat")
    assert env.message == "hi"
    with pytest.raises(EnvelopeError) as info:  # a valid chat reply is not a feed comment
        parse_envelope(chat(), "feed_comment")
    assert info.value.field in {"comment", "tone", "message"}
    with pytest.raises(EnvelopeError) as info:
        parse_envelope('{"analyst": "pessimist", "reading": "r", "advice": "a", "risk": "low"}', "analyst")
    assert info.value.field == "analyst"
    with pytest.raises(EnvelopeError) as info:
        parse_envelope('{"analyst": "cynic", "reading": "r", "advice": "a", "risk": "extreme"}', "analyst")
    assert info.value.field == "risk"


# -------------------------------------------------------------------------------------- repair
def test_repair_strips_known_wrapping():
    body = chat()
    assert repair(f"```json\n{body}\n```") == body
    assert repair(f"```\n{body}\n```") == body
    assert repair(f"<think>\n\n</think>\n\n{body}") == body
    assert repair(f"<think>I should be warm. {{\"draft\": 1}}</think>{body}") == body
    assert repair(f"Sure! Here is the reply:\n{body}\nHope that helps.") == body
    assert repair(f"  {body}  ") == body


@pytest.mark.parametrize(
    "text_, reason",
    [
        ('<think>let me think about {"message": "hi"}', "unterminated <think>"),
        (chat() + "\n" + chat(), "2 JSON objects"),
        (f"```json\n{chat()}\n```\nor maybe:\n```json\n{chat(message='other')}\n```", "2 JSON objects"),
    ],
)
def test_repair_refuses_to_guess(text_, reason):
    with pytest.raises(EnvelopeError) as info:
        repair(text_)
    assert reason in info.value.reason and info.value.field is None
    with pytest.raises(EnvelopeError):
        parse_envelope(text_, "chat")


def test_repair_never_closes_a_truncated_object():
    truncated = chat()[:-20]
    assert repair("Here:\n" + truncated) == truncated
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(truncated, "chat")
    assert "not valid JSON" in info.value.reason


def test_braces_inside_strings_do_not_split_objects():
    body = chat(message='She wrote "}{" on the card, then {laughed}.')
    assert parse_envelope(f"note: {body}", "chat").message.startswith("She wrote")


def test_reply_level_errors():
    for text_, reason in [("", "empty reply"), ("   ", "empty reply"), ("[1, 2]", "expected a JSON object"),
                          ("Hello there!", "not valid JSON"), ("<think></think>", "empty reply")]:
        with pytest.raises(EnvelopeError) as info:
            parse_envelope(text_, "chat")
        assert reason in info.value.reason, text_
        assert info.value.raw == text_
    with pytest.raises(EnvelopeError, match="over the"):
        parse_envelope(" " * (MAX_REPLY_CHARS + 1), "chat")


def test_bad_arguments():
    with pytest.raises(TypeError, match="text"):
        parse_envelope(b"{}", "chat")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind"):
        parse_envelope("{}", "poem")
    with pytest.raises(ValueError, match="kind"):
        json_schema("poem")
    with pytest.raises(TypeError, match="envelope"):
        dumps({"message": "hi"})  # type: ignore[arg-type]
    bad = ChatReply.model_construct(**{**VALID_CHAT, "affection": 9})
    with pytest.raises(EnvelopeError) as info:
        dumps(bad)
    assert info.value.field == "affection"


def test_envelope_error_is_a_value_error_and_pickles():
    err = EnvelopeError("must not be empty", field="message", raw="{}")
    assert isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.reason, back.raw, str(back)) == ("message", "must not be empty", "{}", str(err))


# ------------------------------------------------------------------------------------- schemas
@pytest.mark.parametrize("kind", REPLY_KINDS)
def test_schema_is_strict_and_committed_copy_matches(kind):
    schema = json_schema(kind)
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == sorted(schema["properties"])  # strict structured outputs need all
    committed = ROOT / "docs" / "envelope" / f"{kind}.schema.json"
    assert committed.read_text(encoding="utf-8") == schema_text(kind), (
        f"{committed} is stale: regenerate with `python -m hearth.envelope docs/envelope`")
    fmt = response_format(kind)
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == schema
    assert fmt["json_schema"]["name"] == f"hearth_{kind}"


def test_export_writes_every_kind(tmp_path):
    from hearth.envelope import export_schemas

    paths = export_schemas(str(tmp_path / "schemas"))
    assert sorted(Path(p).name for p in paths) == sorted(f"{k}.schema.json" for k in REPLY_KINDS)
    for p in paths:
        kind = Path(p).name.split(".")[0]
        assert json.loads(Path(p).read_text()) == json_schema(kind)


# ------------------------------------------------------------------ repair fast path = the scan
def _scan_only_repair(text_: str) -> str:
    """repair() as it was before its fast path: the brace scan alone (the reference)."""
    from hearth.envelope import _object_spans

    out = text_.strip()
    if out.startswith("<think>"):
        end = out.find("</think>")
        if end < 0:
            raise EnvelopeError("unterminated think")
        out = out[end + len("</think>"):].strip()
    spans, open_start = _object_spans(out)

    def is_object(s: str) -> bool:
        try:
            data = json.loads(s)
        except (ValueError, RecursionError):
            return False
        def unique(pairs):
            if len(dict(pairs)) < len(pairs):
                raise EnvelopeError("duplicate key")  # review49: a valid object with a duplicate key is refused
            return dict(pairs)

        json.loads(s, object_pairs_hook=unique)
        return isinstance(data, dict)

    def object_like(start: int) -> bool:
        return re.match(r'\{[ \t\n\r]*"', out[start:]) is not None

    objects = [(a, b) for a, b in spans if is_object(out[a:b])]
    broken = [a for a, b in spans if (a, b) not in objects and object_like(a)]
    broken += [open_start] if open_start is not None and object_like(open_start) else []
    if len(objects) > 1:
        raise EnvelopeError("two objects")
    if objects and any(a > objects[0][0] for a in broken):  # review49: a valid object then a broken one
        raise EnvelopeError("an object and a broken one")
    if objects:
        return out[objects[0][0]:objects[0][1]]
    candidates = spans + ([(open_start, len(out))] if open_start is not None else [])
    return out[candidates[0][0]:candidates[0][1]] if len(candidates) == 1 else out


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='{}[]"\\:, ab\n', max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='{}"\\ab', max_size=4), inner, max_size=3),
    max_leaves=8)
_objects = st.dictionaries(st.text(alphabet='{}"\\ab', max_size=4), _json_values, max_size=4).map(json.dumps)
_near_objects = st.one_of(
    _objects,                                                          # one object (the fast path)
    st.tuples(_objects, st.sampled_from(["", " ", "\n", "}{", "} {", ",", "x"]), _objects).map("".join),  # two
    st.tuples(_objects, st.integers(0, 40)).map(lambda t: t[0][: max(1, len(t[0]) - t[1] % len(t[0]))]),  # cut
    st.text(alphabet='{}[]"\\:, ab', max_size=30).map(lambda s: "{" + s + "}"),   # brace-wrapped noise
    st.tuples(_objects, st.sampled_from(["\n", " x "]), _objects, st.integers(1, 40))  # an object, then a cut one
    .map(lambda t: t[0] + t[1] + t[2][: max(1, len(t[2]) - t[3] % len(t[2]))]),
    st.tuples(_objects, st.sampled_from(["\n", " x "]), _objects)  # a broken object (trailing comma), then one
    .map(lambda t: (t[0][:-1] + ",}" if len(t[0]) > 2 else t[0]) + t[1] + t[2]),
)


@FAST
@given(body=_near_objects, before=st.sampled_from(["", "  ", "<think></think>", "<think>{\"a\": 1}</think>\n"]),
       after=st.sampled_from(["", "\n", " "]))
def test_repair_fast_path_returns_exactly_what_the_scan_returns(body, before, after):
    text_ = before + body + after
    try:
        expected = _scan_only_repair(text_)
    except EnvelopeError:
        with pytest.raises(EnvelopeError):
            repair(text_)
        return
    assert repair(text_) == expected
    for kind in REPLY_KINDS:  # parse decodes once now; it must still agree with decoding the repaired text
        out = _parse_outcome(text_, kind)
        assert isinstance(out, EnvelopeError) or out == MODELS[kind].model_validate(json.loads(expected))


def test_dumps_parsed_is_dumps_without_revalidation():
    from hearth.envelope import dumps_parsed

    env = parse_envelope(json.dumps(VALID_CHAT), "chat")
    assert dumps_parsed(env) == dumps(env)
    with pytest.raises(TypeError):
        dumps_parsed({"message": "hi"})


@pytest.mark.parametrize("kind", [["chat"], {"chat": 1}, None, 3])
def test_kind_of_the_wrong_type_is_named(kind):
    """An unhashable kind raised "unhashable type: 'list'", naming nothing; every bad kind is the ValueError
    naming ``kind`` that parse_envelope documents."""
    for call in (lambda: parse_envelope("{}", kind), lambda: json_schema(kind), lambda: response_format(kind)):
        with pytest.raises(ValueError, match="kind must be one of"):
            call()
