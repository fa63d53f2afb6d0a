"""The JSON envelope every model reply travels in: one definition for train, evals, gateway and app.

The app does not want free text from the model: it wants a message plus the fields it acts on
(memories to store, mood, relationship signals, suggested next actions). A fine-tune that learns a
persona's voice but not this shape is useless to the app, so the corpus trains on exactly what
:func:`dumps` writes, the eval scores exactly what :func:`parse_envelope` accepts, and the gateway
sends :func:`response_format` to providers that can constrain decoding.

Three reply kinds (``REPLY_KINDS``):

    chat          ChatReply        companion (and rehearsal) turn
    feed_comment  FeedComment      a companion's comment on the user's feed post
    analyst       AnalystReading   one of the five Simulation Mode analysts reading a situation

Strings are stripped (Python ``str.strip``) and must be non-empty afterwards; every string and list
has an upper bound so a runaway reply fails validation instead of filling a database column.
Validation is strict: ``"1"`` is not an int and ``true`` is not an int either; unknown keys fail.

Repair is bounded on purpose (:func:`repair`): it removes wrapping and nothing else (a leading
``<think>...</think>`` block, code fences and chatter around exactly one JSON object). It never fills
in a field, closes a bracket or picks one of two objects (or one of two values of a key); those replies
are refused with an :class:`EnvelopeError` that names the field (or ``None`` for the reply as a whole)
and the reason.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError

__all__ = [
    "ReplyKind", "REPLY_KINDS", "REPLY_DEADLINE_S", "ChatReply", "FeedComment", "AnalystReading", "MODELS",
    "EnvelopeError", "parse_envelope", "repair", "unique_keys", "DuplicateKey", "json_schema", "response_format",
    "dumps", "kind_of", "MAX_REPLY_CHARS", "schema_text", "export_schemas", "dumps_parsed",
]

ReplyKind = Literal["chat", "feed_comment", "analyst"]
REPLY_KINDS: tuple[str, ...] = get_args(ReplyKind)
# how long the app waits for a reply of each kind by default ([app] reply_deadline_s, comment_timeout_s,
# analyst_timeout_s): a reply later than that is lost in production, so the eval's calls default to the same
REPLY_DEADLINE_S: dict[str, float] = {"chat": 60.0, "feed_comment": 30.0, "analyst": 45.0}

AnalystId = Literal["optimist", "cynic", "mentor", "status_observer", "gossiper"]
Risk = Literal["low", "medium", "high"]

# Replies longer than this are refused before any scanning: repair is linear in the text, but a
# provider that streams 1 MB of garbage should fail fast and clearly, not be searched for JSON.
MAX_REPLY_CHARS = 64_000


def _strip(value: Any) -> Any:
    # Python's str.strip, not pydantic's strip_whitespace (Rust trim): they disagree on characters
    # such as U+001C, and the envelope must strip the same way everywhere it is checked.
    return value.strip() if isinstance(value, str) else value


def _text(max_length: int) -> Any:
    """A stripped string of 1..max_length characters."""
    return Annotated[str, StringConstraints(min_length=1, max_length=max_length), BeforeValidator(_strip)]


Message = _text(2000)
Short = _text(40)
Memory = _text(300)
Action = _text(120)
Comment = _text(600)
Reading = _text(1200)
Advice = _text(600)


class _Envelope(BaseModel):
    # strict: the JSON types must be right as written (no "1" -> 1, no true -> 1);
    # forbid: an unknown key is a format error, and the exported schema says additionalProperties false.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ChatReply(_Envelope):
    """A companion's (or rehearsal partner's) reply in a conversation."""

    message: Message = Field(description="what the companion says to the user, in its own voice")
    mood: Short = Field(description="the companion's mood after this turn, one or two words (e.g. warm, amused, worried)")
    memories: list[Memory] = Field(
        max_length=5,
        description="new facts about the user worth remembering, each a short third-person sentence; [] when none",
    )
    affection: int = Field(ge=-2, le=2, description="how this turn changed warmth toward the user, -2..2 (0 = no change)")
    trust: int = Field(ge=-2, le=2, description="how this turn changed trust in the user, -2..2 (0 = no change)")
    suggested_actions: list[Action] = Field(
        max_length=3,
        description="up to three short next steps the user might take, as tappable suggestions; [] when none",
    )


class FeedComment(_Envelope):
    """A companion's comment under one of the user's feed posts."""

    comment: Comment = Field(description="the comment, in the companion's voice")
    tone: Short = Field(description="the comment's tone in one or two words (e.g. playful, proud, gentle)")


class AnalystReading(_Envelope):
    """One Simulation Mode analyst's reading of the user's situation."""

    analyst: AnalystId = Field(description="which analyst is speaking (must be the analyst you were asked to be)")
    reading: Reading = Field(description="what this analyst sees in the situation, through its own lens")
    advice: Advice = Field(description="one concrete piece of advice from this analyst")
    risk: Risk = Field(description="how risky this analyst judges the situation for the user: low, medium or high")


MODELS: dict[str, type[_Envelope]] = {"chat": ChatReply, "feed_comment": FeedComment, "analyst": AnalystReading}


class EnvelopeError(ValueError):
    """A reply that is not a valid envelope.

    field:  dotted path of the offending field (``"memories.2"``), or None when the reply as a whole
            is wrong (not JSON, two objects, unterminated think block, ...).
    reason: why, in words.
    raw:    the reply text as received (before repair).
    errors: pydantic's error list when validation failed (empty otherwise).
    """

    def __init__(self, reason: str, *, field: str | None = None, raw: str = "", errors: list[dict] | None = None):
        self.field = field
        self.reason = reason
        self.raw = raw
        self.errors = errors or []
        super().__init__(f"{field}: {reason}" if field else f"envelope: {reason}")

    def __reduce__(self):  # keep the keyword-only fields when pickled across processes
        return (_rebuild_error, (self.reason, self.field, self.raw, self.errors))


def _rebuild_error(reason: str, field: str | None, raw: str, errors: list[dict]) -> EnvelopeError:
    return EnvelopeError(reason, field=field, raw=raw, errors=errors)


def _check_kind(kind: Any) -> type[_Envelope]:
    if not isinstance(kind, str) or kind not in MODELS:  # isinstance first: a list is unhashable
        raise ValueError(f"kind must be one of {REPLY_KINDS}, got {kind!r}")
    return MODELS[kind]


def kind_of(envelope: BaseModel) -> str:
    """The ReplyKind of an envelope instance; TypeError for anything else."""
    for kind, model in MODELS.items():
        if type(envelope) is model:
            return kind
    raise TypeError(f"envelope must be one of {[m.__name__ for m in MODELS.values()]}, got {type(envelope).__name__}")


# ------------------------------------------------------------------------------------------ repair
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
# A brace span that starts like a JSON object (``{"``): when it does not decode, it is a broken object, not
# chatter such as "so {happy} for you" (JSON whitespace only, as the decoder reads it).
_OBJECT_LIKE = re.compile(r'\{[ \t\n\r]*"')


def scan_object(text: str, pos: int = 0, depth: int = 0, in_string: bool = False,
                escaped: bool = False) -> tuple[int, int, bool, bool]:
    """Walk ``text[pos:]`` through one JSON object, honouring string literals (a ``}`` inside ``"..."`` does not
    close it). Start either at its ``{`` with depth 0, or with the state a previous call returned (a stream
    scanned in pieces). Returns ``(end, depth, in_string, escaped)``: ``end`` is the index just past the brace
    that closes the object, or -1 when the text ends first (the other three are then the state to resume with).
    """
    for i in range(pos, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1, 0, False, False
    return -1, depth, in_string, escaped


def _object_spans(text: str, pos: int = 0, fresh: bool = True) -> tuple[list[tuple[int, int]], int | None]:
    """Top-level brace-balanced spans ``[start, end)`` in ``text``, and the start of an unterminated one.

    Outside a span, everything is chatter (quotes there mean nothing); inside, JSON string literals
    are honoured (scan_object). A ``{`` that never closes and does not start like an object ("Sure {",
    a lone "{" line) is a stray brace of chatter, not the start of everything after it: the spans
    inside it are top-level spans (_inside_stray_brace). Linear: at most a few passes over the text.
    From ``pos``; ``fresh``: whether a stray brace's chatter may be read again from its first quote (once).
    """
    spans: list[tuple[int, int]] = []
    start = text.find("{", pos)
    while start >= 0:
        end = scan_object(text, start)[0]
        if end < 0:
            if _OBJECT_LIKE.match(text, start):
                return spans, start  # a cut-off object: everything from here is that object
            inner, open_start = _inside_stray_brace(text, start, fresh)
            # nothing inside: the stray brace stays the candidate the parser is handed, as before
            return spans + inner, start if open_start is None and not inner else open_start
        spans.append((start, end))
        start = text.find("{", end)
    return spans, None


def _inside_stray_brace(text: str, start: int, fresh: bool = True) -> tuple[list[tuple[int, int]], int | None]:
    """The spans inside the brace at ``start`` that never closes and does not start like an object.

    One pass with the string state scan_object had from ``start`` (so a ``}`` inside ``"..."`` still does
    not count) and a stack of the braces still open: a span that closes while the brace just below it on
    the stack never does is a top-level span, as if the braces below were chatter, and so for every brace
    that never closes, down the stack, until the first that starts like an object (``{"``): that one is a
    cut-off object, returned as the unterminated start, and the spans inside it are its values, not
    candidates. Trying each later ``{`` as a fresh start instead would rescan the rest of the text once per
    brace: quadratic in a reply of braces.

    A ``"`` directly inside a stray brace is chatter (quotes mean nothing at the top level), but this pass
    read it as the start of a string, which can hide what follows ('Sure {' + envelope + ' the 12" one: ' +
    another envelope looked like one object). So from the first such quote the text is read again as top-level
    text (``fresh``: once; a second such quote there leaves the first object-like brace after it as a cut-off
    candidate, so repair refuses to choose rather than take what a quote may hide).
    """
    # [open brace, the spans that closed directly inside it, the first quote directly inside it]
    stack: list[list] = []
    in_string = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            if stack[-1][2] is None:
                stack[-1][2] = i
        elif ch == "{":
            stack.append([i, [], None])
        elif ch == "}":
            opened = stack.pop()[0]
            if not stack:  # pragma: no cover - scan_object, in the same states, found that ``start`` never closes
                return [], start
            stack[-1][1].append((opened, i + 1))
    spans: list[tuple[int, int]] = []
    for opened, inside, quote in stack:
        if _OBJECT_LIKE.match(text, opened):
            return spans, opened
        if quote is None:
            spans.extend(inside)
            continue
        # chatter from this quote on: the spans before it stand, what follows is top-level text
        spans.extend(span for span in inside if span[1] <= quote)
        if fresh:
            tail, open_start = _object_spans(text, quote + 1, fresh=False)
            return spans + tail, open_start
        later = _OBJECT_LIKE.search(text, quote)
        return spans, later.start() if later else None
    return spans, None


def repair(text: str) -> str:
    """Strip the wrapping around one JSON object; never invent, close or choose content.

    Removes, in order: surrounding whitespace; one leading ``<think>...</think>`` block (empty, as
    Qwen3 emits with thinking disabled, or complete); then any text around the single top-level JSON
    object (code fences, "Here you go:", trailing remarks). Returns the text unchanged (stripped)
    when it holds no complete JSON object, so the parser can say why; when it holds one unterminated
    object after chatter, returns that object's text from its ``{`` (still unterminated).

    A ``{`` of chatter that never closes ("Sure {" before the object) is chatter like any other text,
    unless it starts like an object (``{"``): that is a cut-off object, and an object inside it is one of
    its values, never taken for the reply.

    Raises EnvelopeError (field None) when repairing would mean guessing: an unterminated leading
    think block, two or more JSON objects, one JSON object followed by a broken one (a brace span
    starting ``{"`` that does not decode, or is cut off), a duplicate key, or a reply longer than
    MAX_REPLY_CHARS.
    TypeError when ``text`` is not a str.
    """
    return _repair(text)[0]


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice (``.key``), from :func:`unique_keys`."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads(..., object_pairs_hook=unique_keys)``: DuplicateKey for an object that gives a key twice.
    json.loads keeps the last of two equal keys: {"message": "A", ..., "message": "B"} would silently be B (while a
    stream preview showed A); two values for one field are two replies, refused like two objects. The corpus
    builder refuses such a line by the same rule (hearth.train.corpus)."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return data


def _loads_dict(candidate: str, raw: str) -> dict | None:
    """``json.loads(candidate)`` when that is a dict, else None; EnvelopeError (for ``raw``) when it is a
    valid JSON object with a duplicate key at any depth."""
    try:
        data = json.loads(candidate, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        if not _is_json(candidate):
            return None  # not JSON anyway (the duplicate was seen before the syntax error): chatter
        raise EnvelopeError(f"duplicate key {exc.key!r} in the JSON object; refusing to choose one of its values",
                            raw=raw) from None
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _is_json(candidate: str) -> bool:
    try:
        json.loads(candidate)
    except (ValueError, RecursionError):
        return False
    return True


def _repair(text: str) -> tuple[str, dict | None]:
    """repair(text), plus the decoded object when repair already decoded it (so parse decodes once)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if len(text) > MAX_REPLY_CHARS:
        raise EnvelopeError(f"reply is {len(text)} characters, over the {MAX_REPLY_CHARS} limit", raw=text[:2000])
    out = text.strip()
    if out.startswith(_THINK_OPEN):
        end = out.find(_THINK_CLOSE)
        if end < 0:
            raise EnvelopeError("unterminated <think> block (the reply ran out while thinking?)", raw=text)
        out = out[end + len(_THINK_CLOSE):].strip()
    # Fast path, same answer as the scan: text that decodes as one JSON object from its first to its
    # last character is a single brace-balanced span (the scan honours JSON strings exactly as JSON
    # does), so the scan would find that one span and return it whole. Two objects never decode.
    if out.startswith("{") and out.endswith("}"):
        data = _loads_dict(out, text)
        if data is not None:
            return out, data
    spans, open_start = _object_spans(out)
    objects, last_broken = [], -1
    for a, b in spans:
        data = _loads_dict(out[a:b], text)
        if data is not None:
            objects.append((a, b, data))
        elif _OBJECT_LIKE.match(out, a):
            last_broken = a
    if open_start is not None and _OBJECT_LIKE.match(out, open_start):
        last_broken = open_start
    if len(objects) > 1:
        raise EnvelopeError(f"{len(objects)} JSON objects in the reply; refusing to choose one", raw=text)
    if objects and last_broken > objects[0][0]:
        # a later object supersedes: a draft and its correction cut off by max_tokens (or with a syntax
        # error), or JSON drafted while reasoning (a template that opens <think> in the prompt leaves only
        # </think> in the reply) before a broken answer. A broken one BEFORE the object (an echoed format,
        # a draft the object corrects) is chatter.
        raise EnvelopeError("a JSON object followed by another that is not valid JSON (cut off?); "
                            "refusing to choose one", raw=text)
    if objects:
        a, b, data = objects[0]
        return out[a:b], data
    # No complete object: hand the parser the one candidate there is, so its error points at it.
    candidates = spans + ([(open_start, len(out))] if open_start is not None else [])
    if len(candidates) == 1:
        a, b = candidates[0]
        return out[a:b], None
    return out, None


# ------------------------------------------------------------------------------------------- parse
def _loc(loc: tuple) -> str | None:
    return ".".join(str(p) for p in loc) or None


def _reason(error: dict) -> str:
    if error["type"] == "string_too_short":
        return "must not be empty (or only whitespace)"
    if error["type"] == "string_unicode":
        # "\ud800" is valid JSON (a model cut inside an emoji writes it), but no UTF-8 column or page can hold it;
        # pydantic's words ("unable to parse raw data") hide that, and in a key it comes with no field (loc ())
        key = "" if error["loc"] else "a key "
        return f"{key}must be valid Unicode text, not a lone surrogate escape such as \\ud800 (half a character)"
    return error["msg"]


def parse_envelope(text: str, kind: str) -> _Envelope:
    """Repair (bounded), decode and validate a reply as an envelope of ``kind``.

    Returns the pydantic model (ChatReply, FeedComment or AnalystReading). Raises EnvelopeError with
    ``.field`` naming the first failing field (None for reply-level failures) and ``.reason``;
    ValueError when ``kind`` is not a ReplyKind, TypeError when ``text`` is not a str.
    Never raises anything else, whatever the text.
    """
    model = _check_kind(kind)
    body, data = _repair(text)
    if data is not None:
        return _validate(model, data, text)
    if not body:
        raise EnvelopeError("empty reply", raw=text)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise EnvelopeError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", raw=text) from None
    except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit integer, or nesting deeper than the stack
        raise EnvelopeError(f"not valid JSON: {type(exc).__name__}: {str(exc)[:200]}", raw=text) from None
    if not isinstance(data, dict):
        raise EnvelopeError(f"expected a JSON object, got {type(data).__name__}", raw=text)
    return _validate(model, data, text)


def _validate(model: type[_Envelope], data: dict, text: str) -> _Envelope:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise EnvelopeError(_reason(first) + more, field=_loc(first["loc"]), raw=text, errors=errors) from None
    except RecursionError:  # pragma: no cover - json.loads already bounds depth below pydantic's
        raise EnvelopeError("nesting too deep", raw=text) from None


# ----------------------------------------------------------------------------------- schema, dumps
def json_schema(kind: str) -> dict:
    """JSON Schema (draft 2020-12, as pydantic writes it) of the envelope of ``kind``.

    Every property is required and additionalProperties is false, so it is also valid for
    OpenAI-style strict structured outputs. ValueError for an unknown kind.
    """
    return _check_kind(kind).model_json_schema()


def response_format(kind: str) -> dict:
    """The OpenAI ``response_format`` asking for this kind's schema (vLLM, OpenAI, most gateways)."""
    return {
        "type": "json_schema",
        "json_schema": {"name": f"hearth_{kind}", "schema": json_schema(kind), "strict": True},
    }


def dumps(envelope: BaseModel) -> str:
    """Canonical one-line serialisation: field order as declared, ``", "``/``": "`` separators, UTF-8
    kept as is (no ``\\u`` escapes). This is the exact text the corpus trains assistant turns on.

    The envelope is re-validated first, so a model built with ``model_construct`` cannot smuggle an
    invalid target into the corpus: EnvelopeError if it does not validate, TypeError if it is not an
    envelope model at all.
    """
    model = MODELS[kind_of(envelope)]
    data = envelope.model_dump(mode="json")
    try:
        model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise EnvelopeError(_reason(first), field=_loc(first["loc"]), raw=repr(data)) from None
    return _CANONICAL.encode(data)


def dumps_parsed(envelope: BaseModel) -> str:
    """:func:`dumps` for an envelope that :func:`parse_envelope` returned, without validating it again.

    Envelopes are frozen, so one that parse_envelope validated is still valid; only instances built
    with ``model_construct`` can be invalid, and those must go through :func:`dumps`. Same text as
    dumps(envelope). TypeError if ``envelope`` is not an envelope model.
    """
    kind_of(envelope)
    return _CANONICAL.encode(envelope.model_dump(mode="json"))


# One encoder for the canonical form (json.dumps would build a new JSONEncoder on every call).
_CANONICAL = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "))


# ------------------------------------------------------------------------------------------ export
def schema_text(kind: str) -> str:
    """The committed form of ``json_schema(kind)`` (docs/envelope/<kind>.schema.json): sorted, indented."""
    return json.dumps(json_schema(kind), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def export_schemas(out_dir: str) -> list[str]:
    """Write one ``<kind>.schema.json`` per reply kind into ``out_dir``; returns the paths written."""
    from pathlib import Path

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in REPLY_KINDS:
        path = folder / f"{kind}.schema.json"
        path.write_text(schema_text(kind), encoding="utf-8")
        written.append(str(path))
    return written


if __name__ == "__main__":  # python -m hearth.envelope [OUT_DIR]  (default docs/envelope)
    import sys

    for written_path in export_schemas(sys.argv[1] if len(sys.argv) > 1 else "docs/envelope"):
        print(written_path)
