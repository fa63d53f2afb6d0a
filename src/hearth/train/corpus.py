"""Conversations -> supervised chat examples whose assistant turns are envelopes (docs/corpus.md).

Input: JSONL, one conversation per line:

    {"id": "wren-exam", "kind": "chat", "persona": "wren", "world_view": "grounded", "stage": "friend",
     "memories": ["..."], "shared_context": "...",
     "turns": [{"role": "user", "content": "..."}, {"role": "assistant", "envelope": {...}}, ...]}

``kind`` picks the prompt (chat -> companion, feed_comment -> feed, analyst -> analyst; ``"prompt":
"rehearsal"`` with a ``rehearsal`` object for rehearsal chats). A user turn may give ``after_rehearsal`` (an
object: the rehearsal, its earlier turns, the new line and the reply) instead of ``content``: the message the
app's analyst panel reads after a rehearsal turn, written by hearth.prompts.rehearsal_exchange_for. Every assistant turn is an envelope
object; it is validated with hearth.envelope and serialised with ``envelope.dumps``, so the model
trains on exactly the text the app parses. The system prompt comes from hearth.prompts, i.e. at
production size, and each example is the request the app sends at that turn (conversation_examples: its last
CHAT_CONTEXT_TURNS earlier turns, its latest PROMPT_MEMORIES memories, growing with what the replies list, the
relationship stage, moved by the replies' affection and trust as hearth.app.relationship moves it, the user's texts
as the app stores them, each within the app's max_text_chars; a feed or analyst conversation is one exchange).

Output (OUT_DIR): train.jsonl (one example per assistant turn: input_ids + labels with -100 outside
the reply + turns, the token where each message starts, when a tokenizer is given, else text + trained character spans), rejected.jsonl (line,
id, reason for every conversation refused) and stats.json. A conversation is refused as a whole
when any of its targets fails, so no example is trained on a history the app would have rejected.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterable

from pydantic import Field, TypeAdapter, ValidationError

# the app's rules, from the bottom-layer module the app takes them from too (importing it loads nothing of the app):
# its relationship ladder, its limits on what a user writes about a companion and a rehearsed person, and the
# defaults and bounds of the settings that shape a request
from hearth.companion_rules import (AGENT_FIELD_LIMITS, CHAT_CONTEXT_TURNS, DEFAULT_MAX_TEXT_CHARS, MAX_CONTEXT,
                                    MAX_NAME, MAX_PERSONA, MAX_PROMPT_CHARS, PROMPT_MEMORIES, SETTING_BOUNDS,
                                    fit_history)
from hearth.companion_rules import STAGES as LADDER
from hearth.companion_rules import standing
from hearth.durable import folder_problem
from hearth.envelope import MODELS, DuplicateKey, EnvelopeError, Memory, dumps, unique_keys
from hearth.prompt_budget import budget_shortfall
from hearth.prompts import (DEFAULT_PROMPT, PERSONAS, WORLD_VIEWS, history_turn, rehearsal_exchange_for,
                            system_prompt_for)
from hearth.train.batches import conversation_named
from hearth.train.chat_format import IM_END, IM_START, Rendered, render
from hearth.train.durable import CORPUS_FILES, CORPUS_TMP, fsync_tree, publish_corpus

IGNORE_INDEX = -100
TEMPLATE_PATH = Path(__file__).parent / "data" / "qwen3_nothink.jinja"

# What one app request carries, so that each example's prompt is the one the app sends at that turn: the app's
# defaults (CHAT_CONTEXT_TURNS: earlier turns, a user message and the reply, a chat or a rehearsal sends back;
# PROMPT_MEMORIES: the companion's latest memories in its prompt and in a rehearsal's / the panel's context), the
# stages (LADDER) and the text limits (MAX_CONTEXT, MAX_PERSONA, MAX_NAME, AGENT_FIELD_LIMITS, and
# DEFAULT_MAX_TEXT_CHARS, the default of the setting max_text_chars) are the app's own, from hearth.companion_rules.
# The number of memories the app keeps (hearth.app.companions.MAX_MEMORIES_KEPT) is not imported: the corpus builder
# does not load the app (its database and crypto); tests/train/test_train_review50b_corpus.py keeps it equal.
MAX_MEMORIES_KEPT = 200  # the app keeps a companion's latest 200 memories
APP_STAGES = tuple(key for key, *_ in LADDER)  # the stages the app sends (hearth.prompts.STAGES' keys, a test holds)
HISTORY_PROMPTS = ("companion", "rehearsal")  # the app sends earlier turns with these; feed and analyst go alone
# what a user turn's content is in the app, for each prompt: the text it holds to max_text_chars (routes.companions,
# routes.feed, routes.simulation: clean_text(..., max_text_chars))
SENT_TEXT = {"companion": "chat message", "rehearsal": "rehearsal line", "feed": "feed post", "analyst": "situation"}


def clean(text: str) -> str:
    """A user-written text as the app stores and sends it (hearth.app.common.clean_text): stripped, CRLF as LF."""
    return text.strip().replace("\r\n", "\n")


def remember(memories: list[str], proposed: list[str]) -> list[str]:
    """The companion's memories after a chat reply that lists ``proposed``, as the app's save_turn stores them: the
    new ones (not already kept, case-insensitively; each once) appended, the latest MAX_MEMORIES_KEPT kept."""
    seen = {m.casefold() for m in memories}
    fresh = []
    for m in proposed:
        if m.casefold() not in seen:
            seen.add(m.casefold())
            fresh.append(m)
    return (list(memories) + fresh)[-MAX_MEMORIES_KEPT:]


class CorpusError(ValueError):
    """One conversation that cannot become training examples: ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


@dataclass
class Example:
    """One supervised example: the last assistant turn of ``rendered`` is the target."""

    id: str
    line: int
    kind: str
    rendered: Rendered


@dataclass
class BuildResult:
    examples: list[Example] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)  # {"line", "id", "reason"}
    conversations: int = 0


# ----------------------------------------------------------------------------------- conversations
def _field(obj: dict, name: str, kind: type = str) -> Any:
    if name not in obj:
        raise CorpusError(f"missing field {name!r}")
    if not isinstance(obj[name], kind):
        raise CorpusError(f"field {name!r} must be {kind.__name__}, got {type(obj[name]).__name__}")
    return obj[name]


def _lone_surrogate(value: Any, path: str = "") -> str | None:
    """The path of the first text in ``value`` (a decoded line) holding a lone surrogate (JSON allows the escape
    "\\udc00"; UTF-8, the tokenizer and train.jsonl cannot hold it), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "the line"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            where = _lone_surrogate(key, f"{path}.{key!r}" if path else repr(key)) or \
                _lone_surrogate(item, f"{path}.{key}" if path else key)
            if where:
                return where
    elif isinstance(value, list):
        for i, item in enumerate(value):
            where = _lone_surrogate(item, f"{path}[{i}]")
            if where:
                return where
    return None


def system_prompt(conv: dict) -> tuple[str, str]:
    """(kind, system prompt) for a conversation object, from hearth.prompts; CorpusError if it cannot."""
    try:
        return system_prompt_for(conv)
    except (TypeError, ValueError) as exc:
        raise CorpusError(str(exc)) from None


def _target(turn: dict, kind: str, index: int, conv: dict) -> tuple[str, str, Any]:
    """(the trained text: the canonical envelope, the same reply as a later example's history turn: what the app
    sends back, hearth.prompts.history_turn; the validated envelope)."""
    envelope = turn.get("envelope")
    if not isinstance(envelope, dict):
        raise CorpusError(f"turns[{index}]: an assistant turn needs an 'envelope' object")
    try:
        model = MODELS[kind].model_validate(envelope)
    except ValidationError as exc:  # keep the first field and reason
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"]) or "envelope"
        reason = "must not be empty (or only whitespace)" if first["type"] == "string_too_short" else first["msg"]
        raise CorpusError(f"turns[{index}].envelope.{loc}: {reason}") from None
    if kind == "analyst" and model.analyst != conv.get("analyst"):
        raise CorpusError(f"turns[{index}].envelope.analyst: {model.analyst!r} but the prompt is for "
                          f"{conv.get('analyst')!r}")
    try:
        return dumps(model), history_turn(model), model
    except EnvelopeError as exc:  # pragma: no cover - model_validate above already passed
        raise CorpusError(f"turns[{index}].envelope.{exc.field}: {exc.reason}") from None


def stage_start(stage: str) -> tuple[int, int]:
    """(affection, trust): the totals a companion chat starts from when its conversation gives a ``stage`` and no
    totals: the lowest at which the app's ladder reaches that stage (trust at its gate, or 0 where the stage has
    none; affection the rest of the stage's score, or 0), as if the companion had just got there. stranger is
    (0, 0), where the app starts every companion. KeyError for a stage the ladder does not have."""
    for key, _label, min_score, min_trust in LADDER:
        if key == stage:
            trust = max(min_trust, 0)
            return max(min_score - trust, 0), trust
    raise KeyError(stage)


def _start_totals(conv: dict) -> tuple[int, int] | None:
    """The companion's (affection, trust) when a companion chat starts, as the app stores them: the conversation's
    own ``affection`` and ``trust`` (both, integers; a ``stage`` given beside them must be the one they reach), else
    stage_start(its stage); None where the stage is missing or not the app's (system_prompt_for / _app_spec name
    it)."""
    given = [k for k in ("affection", "trust") if k in conv]
    stage = conv.get("stage")
    if not given:
        return stage_start(stage) if isinstance(stage, str) and stage in APP_STAGES else None
    if len(given) == 1:
        other = "trust" if given == ["affection"] else "affection"
        raise CorpusError(f"{other}: missing beside {given[0]!r} (the companion's two running totals when the "
                          "conversation starts: give both, or neither and a stage)")
    for k in ("affection", "trust"):
        if not isinstance(conv[k], int) or isinstance(conv[k], bool):
            raise CorpusError(f"{k}: the companion's running total must be an integer, got {type(conv[k]).__name__}")
    totals = conv["affection"], conv["trust"]
    reached = standing(*totals).key
    if stage is not None and stage != reached:
        raise CorpusError(f"stage: {str(stage)[:60]!r}, but affection {totals[0]} and trust {totals[1]} are the "
                          f"app's {reached!r} (hearth.app.relationship); give the totals alone, or a stage they reach")
    return totals


def _check_person(person: dict, where: str) -> None:
    """CorpusError for a field of the rehearsed person (``where``.field, cleaned) the app would not store: empty, or
    longer than its limit (hearth.app.textlimits.AGENT_FIELD_LIMITS, what simulation.create_agent enforces). A field
    missing or not text is left to hearth.prompts to name."""
    for name, limit in AGENT_FIELD_LIMITS.items():
        value = person.get(name)
        if not isinstance(value, str):
            continue
        if not value:
            raise CorpusError(f"{where}.{name}: must not be empty (the app asks for every field of the person)")
        if len(value) > limit:
            raise CorpusError(f"{where}.{name}: {len(value)} characters, over the app's {limit} for the rehearsed "
                              f"person's {name} (the app stores no longer one)")


def _app_spec(conv: dict) -> tuple[dict, tuple[int, int] | None]:
    """The conversation's prompt fields as the app holds them (clean), or CorpusError for what the app cannot send:
    a shared context, custom persona, companion name or field of the rehearsed person over its limits (or a field of
    the person empty), a world view or stage it does not have; and a companion chat's starting totals
    (_start_totals; None for any other prompt)."""
    spec = dict(conv)
    shared = conv.get("shared_context")
    if isinstance(shared, str):
        spec["shared_context"] = clean(shared)
        if len(spec["shared_context"]) > MAX_CONTEXT:
            raise CorpusError(f"shared_context: {len(spec['shared_context'])} characters, over the app's "
                              f"{MAX_CONTEXT} (the app stores no longer one)")
    persona = conv.get("persona")
    if isinstance(persona, str):
        spec["persona"] = clean(persona)  # the app stores a custom persona (and the companion's name) clean
        if spec["persona"] not in PERSONAS and len(spec["persona"]) > MAX_PERSONA:
            raise CorpusError(f"persona: {len(spec['persona'])} characters, over the app's {MAX_PERSONA} for a "
                              "custom persona")
    if isinstance(conv.get("companion"), str):
        spec["companion"] = clean(conv["companion"])
        if len(spec["companion"]) > MAX_NAME:
            raise CorpusError(f"companion: {len(spec['companion'])} characters, over the app's {MAX_NAME} for a "
                              "companion's name")
    if isinstance(conv.get("rehearsal"), dict):  # the rehearsed person's fields, as the app stores them (create_agent)
        spec["rehearsal"] = _clean_fields(conv["rehearsal"])
        _check_person(spec["rehearsal"], "rehearsal")
    prompt = conv.get("prompt") or DEFAULT_PROMPT.get(conv.get("kind"))
    if prompt in ("companion", "analyst", "rehearsal") and isinstance(conv.get("memories"), list):
        # the app stores a memory only from a reply's envelope (companions.save_turn): stripped, 1..300 characters;
        # a padded one would not match the same fact listed by a later reply (stored twice), an empty or longer one
        # is a prompt the app never sends. Anything not text is left to hearth.prompts to name
        spec["memories"] = [_stored_memory(m, i) if isinstance(m, str) else m for i, m in enumerate(conv["memories"])]
    if prompt in ("companion", "feed") and isinstance(conv.get("world_view"), str) \
            and conv["world_view"] not in WORLD_VIEWS:
        raise CorpusError(f"world_view: the app offers {', '.join(WORLD_VIEWS)}, got {conv['world_view'][:60]!r}")
    if prompt == "companion" and isinstance(conv.get("stage"), str) and conv["stage"] not in APP_STAGES:
        raise CorpusError(f"stage: the app sends one of its stages ({', '.join(APP_STAGES)}), got {conv['stage'][:60]!r}")
    totals = None
    if prompt == "companion":
        totals = _start_totals(conv)  # the stage the examples send is the one these reach (conversation_examples)
    elif prompt in ("feed", "analyst", "rehearsal") and ("affection" in conv or "trust" in conv):
        which = "affection" if "affection" in conv else "trust"
        raise CorpusError(f"{which}: only a companion chat has relationship totals (the app moves them with chat "
                          f"replies and sends the stage in the companion prompt), not a {prompt} conversation")
    return spec, totals


# hearth.envelope's Memory as a validator, built once (a TypeAdapter builds its schema when made)
_MEMORY = TypeAdapter(Memory)


def _stored_memory(memory: str, index: int) -> str:
    """A starting memory as the app holds it (hearth.envelope's Memory: stripped, 1..300 characters), or CorpusError
    naming memories[index]."""
    try:
        return _MEMORY.validate_python(memory)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        reason = "must not be empty (or only whitespace)" if first["type"] == "string_too_short" else first["msg"]
        raise CorpusError(f"memories[{index}]: {reason} (the app stores a memory from a reply's envelope)") from None


def _clean_fields(obj: dict) -> dict:
    return {k: clean(v) if isinstance(v, str) else v for k, v in obj.items()}


def _check_sent(text: str, where: str, what: str, max_text_chars: int) -> None:
    """CorpusError for a text the user sends (``text``, clean) longer than the app's max_text_chars: the app refuses
    it (common.clean_text in the chat, feed, situation and rehearsal routes), so it never reaches the model."""
    if len(text) > max_text_chars:
        raise CorpusError(f"{where}: {len(text)} characters, over the app's max_text_chars of {max_text_chars} for a "
                          f"{what} (the app refuses a longer one)")


def _check_exchange_lines(exchange: dict, where: str, max_text_chars: int) -> None:
    """The user's lines of an after_rehearsal object (clean: _app_exchange) within max_text_chars, as the app held
    them when the user sent them: the new line and every earlier one. Anything malformed is left for
    rehearsal_exchange_for to name."""
    if isinstance(exchange.get("history"), list):
        for j, t in enumerate(exchange["history"]):
            if isinstance(t, dict) and t.get("role") == "user" and isinstance(t.get("content"), str):
                _check_sent(t["content"], f"{where}.history[{j}].content", "rehearsal line", max_text_chars)
    if isinstance(exchange.get("text"), str):
        _check_sent(exchange["text"], f"{where}.text", "rehearsal line", max_text_chars)


def _app_exchange(after: Any) -> Any:
    """An after_rehearsal object with its texts as the app holds them when it writes the panel's message
    (simulation.exchange_for_panel): the person's fields and the user's lines clean, the reply's message stripped
    as the envelope strips it. Anything malformed is left for rehearsal_exchange_for to name."""
    if not isinstance(after, dict):
        return after
    out = dict(after)
    if isinstance(after.get("rehearsal"), dict):
        out["rehearsal"] = _clean_fields(after["rehearsal"])
    if isinstance(after.get("text"), str):
        out["text"] = clean(after["text"])
    if isinstance(after.get("reply"), str):
        out["reply"] = after["reply"].strip()
    if isinstance(after.get("history"), list):
        out["history"] = [{**t, "content": clean(t["content"])}
                          if isinstance(t, dict) and t.get("role") == "user" and isinstance(t.get("content"), str)
                          else t for t in after["history"]]
    return out


def conversation_examples(conv: Any, *, line: int = 0, context_turns: int = CHAT_CONTEXT_TURNS,
                          prompt_memories: int = PROMPT_MEMORIES, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
                          max_prompt_chars: int = MAX_PROMPT_CHARS) -> list[Example]:
    """All examples (one per assistant turn) of one conversation object; CorpusError if any is invalid.

    Each example's prompt is the app's request at that turn: its last ``context_turns`` earlier turns (companion
    chats and rehearsals; feed comments and analyst readings go with none, so such a conversation is one exchange),
    the latest ``prompt_memories`` memories (a companion chat's grow as the app stores what its replies list:
    ``memories`` is what the companion remembers when the conversation starts), a companion chat's relationship
    stage (each reply's affection and trust added to the totals, as the app's save_turn adds them, and the stage
    hearth.app.relationship.standing gives the new totals sent from the next request on; the conversation gives the
    start: _start_totals), and the user's texts as the app stores them (clean). A text the user sends (a user turn's
    content: a chat message, rehearsal line, feed post or situation; an after_rehearsal's lines) longer than
    ``max_text_chars`` once clean, the app's setting of that name, is refused: the app refuses it. The earlier
    turns are those that fit ``max_prompt_chars`` (the app's setting: its oldest exchanges left out, by the function
    the app calls, hearth.companion_rules.fit_history); the trained reply is not counted, as the app's request does
    not carry it."""
    if not isinstance(conv, dict):
        raise CorpusError(f"a conversation must be a JSON object, got {type(conv).__name__}")
    broken = _lone_surrogate(conv)
    if broken:
        raise CorpusError(f"{broken}: holds a lone surrogate escape such as \\udc00 (half a character), not valid "
                          "Unicode text")
    conv_id = _field(conv, "id")
    # the examples are named ID#TURN, and `hearth train --eval-fraction` groups a conversation's examples back by
    # that name (batches.conversation_named): an id it cannot recover (empty, or holding a line break) made each
    # example a conversation of its own, and the split held out some turns of a conversation it trained on
    if not conv_id.strip() or conversation_named(f"{conv_id}#1") != conv_id:
        raise CorpusError(f"id: {conv_id[:60]!r} cannot name a conversation (it must not be empty nor hold a line "
                          "break: the eval split groups the examples ID#TURN by it)")
    spec, totals = _app_spec(conv)
    memories = spec.get("memories")

    def prompt_for(known, totals) -> tuple[str, str]:
        now = dict(spec)
        if totals is not None:  # the stage the app reads from the companion's totals before it asks the model
            now["stage"] = standing(*totals).key
        if isinstance(known, list):  # anything else: system_prompt_for names it
            now["memories"] = known[-prompt_memories:] if prompt_memories else []
        return system_prompt(now)

    kind, system = prompt_for(memories, totals)
    prompt = spec.get("prompt") or DEFAULT_PROMPT[kind]
    turns = _field(conv, "turns", list)
    if not turns:
        raise CorpusError("turns is empty")
    if prompt not in HISTORY_PROMPTS and len(turns) > 2:
        raise CorpusError(f"turns: the app sends a {prompt} request with one user message and no history; a {kind} "
                          f"conversation is one user turn and one reply (got {len(turns)} turns)")
    messages: list[dict[str, str]] = []
    examples: list[Example] = []
    for i, turn in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if not isinstance(turn, dict) or turn.get("role") != expected:
            got = turn.get("role") if isinstance(turn, dict) else type(turn).__name__
            raise CorpusError(f"turns[{i}] must be a {expected} turn (turns alternate, user first), got {got!r}")
        if expected == "user":
            if "after_rehearsal" in turn:  # the panel after a rehearsal turn: its message as the app writes it
                if "content" in turn:
                    raise CorpusError(f"turns[{i}] gives content or after_rehearsal, not both")
                if prompt != "analyst":  # the app writes this message for the panel's analysts only
                    raise CorpusError(f"turns[{i}].after_rehearsal: only an analyst conversation reads a rehearsal "
                                      f"exchange (the app sends it to the panel), not a {prompt} one")
                exchange = _app_exchange(turn["after_rehearsal"])
                if isinstance(exchange, dict) and isinstance(exchange.get("rehearsal"), dict):
                    _check_person(exchange["rehearsal"], f"turns[{i}].after_rehearsal.rehearsal")  # as the app stores
                if isinstance(exchange, dict):  # the lines the user sent in the rehearsal, each within the limit
                    _check_exchange_lines(exchange, f"turns[{i}].after_rehearsal", max_text_chars)
                try:
                    # within the budget with this analyst's system prompt, as the app writes it (exchange_for_panel)
                    content = rehearsal_exchange_for(exchange, system, max_prompt_chars)
                except (TypeError, ValueError) as exc:
                    raise CorpusError(f"turns[{i}].after_rehearsal: {exc}") from None
            else:
                content = turn.get("content")
            if not isinstance(content, str) or not content.strip():
                raise CorpusError(f"turns[{i}].content must be a non-empty string")
            if "after_rehearsal" not in turn:  # what the user sent, as the app stores it (clean_text)
                content = clean(content)
                _check_sent(content, f"turns[{i}].content", SENT_TEXT.get(prompt, "user message"), max_text_chars)
            # the panel's message is the app's own (exchange_for_panel), sent as written: the user's lines in it are
            # clean already (_app_exchange), the person's replies are their envelopes' messages (a CRLF kept)
            messages.append({"role": "user", "content": content})
            continue
        target, as_history, envelope = _target(turn, kind, i, conv)
        # the earlier turns the app sends back (load_chat_context / rehearsal_messages: the last 2 x turns messages)
        sent = messages[:-1][-2 * context_turns:] if context_turns else []
        sent = fit_history(system, sent, messages[-1]["content"], max_prompt_chars)  # within the app's budget
        try:
            rendered = render(system, sent + [messages[-1], {"role": "assistant", "content": target}])
        except (TypeError, ValueError) as exc:
            raise CorpusError(str(exc)) from None
        # later examples see this reply as the app sends it back: its message text, not the envelope
        messages.append({"role": "assistant", "content": as_history})
        if prompt == "companion":
            # the app saves with the turn the memories a chat reply lists and adds its affection and trust to the
            # companion's totals (companions.save_turn): the next turn's prompt carries them, and the stage they reach
            if isinstance(memories, list):
                memories = remember(memories, list(envelope.memories))
            if totals is not None:
                totals = totals[0] + envelope.affection, totals[1] + envelope.trust
            kind, system = prompt_for(memories, totals)
        examples.append(Example(id=f"{conv_id}#{i}", line=line, kind=kind, rendered=rendered))
    if turns[-1].get("role") != "assistant":
        raise CorpusError("the last turn must be an assistant turn (a trailing user turn has no target)")
    return examples


def read_corpus(lines: Iterable[str | bytes], *, context_turns: int = CHAT_CONTEXT_TURNS,
                prompt_memories: int = PROMPT_MEMORIES, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
                max_prompt_chars: int = MAX_PROMPT_CHARS) -> BuildResult:
    """Parse JSONL lines (1-based line numbers; bytes lines are decoded as UTF-8 one by one, so a line that is not
    UTF-8 is rejected on its own); every bad line is collected, none stops the build. context_turns /
    prompt_memories / max_text_chars / max_prompt_chars: the app's settings of those names (chat_context_turns for
    context_turns; their defaults, or a deployment's)."""
    result = BuildResult()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        result.conversations += 1
        conv_id = None
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                result.rejected.append({"line": number, "id": None, "reason": f"not UTF-8 text: byte "
                                        f"0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line ({exc.reason})"})
                continue
        try:
            # a line that gives a field twice would train one of its two values without a word: refused, as the
            # app's parser refuses such a reply (the same rule: hearth.envelope.unique_keys)
            try:
                conv = json.loads(raw, object_pairs_hook=unique_keys)
            except DuplicateKey as exc:
                raise CorpusError(f"key {exc.key!r} written twice in one object; refusing to choose one of its "
                                  "values") from None
            conv_id = conv.get("id") if isinstance(conv, dict) else None
            if _lone_surrogate(conv_id):  # rejected.jsonl could not hold it: the reason names the field
                conv_id = None
            result.examples.extend(conversation_examples(conv, line=number, context_turns=context_turns,
                                                         prompt_memories=prompt_memories,
                                                         max_text_chars=max_text_chars,
                                                         max_prompt_chars=max_prompt_chars))
        except json.JSONDecodeError as exc:
            result.rejected.append({"line": number, "id": None, "reason": f"not JSON: {exc.msg} (column {exc.colno})"})
        except CorpusError as exc:
            result.rejected.append({"line": number, "id": conv_id, "reason": exc.reason})
    return result


# --------------------------------------------------------------------------------------- tokenize
def load_tokenizer(path: Path):
    """A local Hugging Face tokenizer (never downloads). ValueError naming ``tokenizer`` if unusable."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError depending on what is missing
        raise ValueError(f"tokenizer: cannot load a tokenizer from {path}: {exc}") from exc
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"tokenizer: {path} is not a fast tokenizer (offsets are needed for the loss mask)")
    # The trained reply ends with <|im_end|>, the token a server stops on: a tokenizer that splits it into pieces (not
    # Qwen's; or a model folder without tokenizer files, which transformers 5 loads as an empty tokenizer that
    # encodes everything to nothing) would train the model to spell the text "<|im_end|>" and never stop
    for control in (IM_END, IM_START):
        ids = tok(control, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"tokenizer: {path} does not encode {control} as one token (got {len(ids)}): not a Qwen "
                             "chat tokenizer, or a folder without tokenizer files; the corpus is Qwen3's chat format")
    return tok


def tokenize(tokenizer, rendered: Rendered) -> tuple[list[int], list[int]]:
    """input_ids and labels for one example: labels copy input_ids on tokens that start inside a
    trained span and are -100 elsewhere. Tokenizes the whole text once (no per-segment joins, so no
    boundary merges differ from what the server tokenizes)."""
    row = tokenize_row(tokenizer, rendered)
    return row["input_ids"], row["labels"]


def tokenize_row(tokenizer, rendered: Rendered) -> dict:
    """As tokenize(), plus ``turns``: the token index where each message block (<|im_start|>role ...)
    starts -- system, then the history, then the last user turn and the trained reply. The trainer uses
    it to drop the oldest history turns when an example is longer than its sequence length."""
    enc = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    labels = [IGNORE_INDEX] * len(ids)
    for t, (start, end) in enumerate(offsets):
        if end > start and any(a <= start < b for a, b in rendered.spans):
            labels[t] = ids[t]
    block_chars, at = [], rendered.text.find(IM_START)
    while at >= 0:
        block_chars.append(at)
        at = rendered.text.find(IM_START, at + 1)
    turns = [next(t for t, (start, end) in enumerate(offsets) if end > start and start >= c) for c in block_chars]
    return {"input_ids": ids, "labels": labels, "turns": turns}


def template_matches(tokenizer, example: Example) -> bool | None:
    """Whether the tokenizer's own chat template renders ``example`` identically (None: no template)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = example.rendered.text
    messages = _messages_from_text(text)
    try:
        theirs = tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=False)
    except Exception:  # a template that cannot render our messages does not match
        return False
    return theirs == text


def _messages_from_text(text: str) -> list[dict[str, str]]:
    """Split a rendered sequence back into messages (think block stripped from the reply)."""
    out = []
    for block in text.split("<|im_start|>")[1:]:
        role, _, rest = block.partition("\n")
        content = rest[: rest.rindex("<|im_end|>")]
        if role == "assistant":
            content = content.split("</think>")[-1].lstrip("\n")
        out.append({"role": role, "content": content})
    return out


def _template_check(tok, examples: list[Example]) -> dict:
    """chat_template_matches: True when the tokenizer's template renders every example identically,
    False when any differs (their ids, up to 10, in chat_template_mismatches), None without a template."""
    if tok is None or not getattr(tok, "chat_template", None) or not examples:
        return {"chat_template_matches": None, "chat_template_mismatches": []}
    wrong = [e.id for e in examples if not template_matches(tok, e)]
    return {"chat_template_matches": not wrong, "chat_template_mismatches": wrong[:10]}


# ------------------------------------------------------------------------------------------ build
def _length_stats(lengths: list[int]) -> dict:
    """count, min, mean, p50 (the median), p95 (nearest rank: of 20 lengths the 19th, not the longest), max and
    total, as the eval's report gives its percentiles (hearth.evals.runner.summarize)."""
    if not lengths:
        return {"count": 0}
    ordered = sorted(lengths)
    median = statistics.median(ordered)
    return {"count": len(ordered), "min": ordered[0], "mean": round(statistics.fmean(ordered), 1),
            "p50": median if isinstance(median, int) or not median.is_integer() else int(median),
            "p95": ordered[math.ceil(0.95 * len(ordered)) - 1], "max": ordered[-1], "total": sum(ordered)}


# what a build writes into OUT_DIR, as one set (written into OUT_DIR/.corpus.tmp, then published: _publish)
BUILD_FILES = CORPUS_FILES


def build(input: Path, out_dir: Path, tokenizer: Path | None = None, *, progress=None,
          context_turns: int = CHAT_CONTEXT_TURNS, prompt_memories: int = PROMPT_MEMORIES,
          max_text_chars: int = DEFAULT_MAX_TEXT_CHARS, max_prompt_chars: int = MAX_PROMPT_CHARS) -> dict:
    """Build the corpus; returns the stats dict (also written to OUT_DIR/stats.json).

    Writes OUT_DIR/train.jsonl, rejected.jsonl, stats.json as one set: written into OUT_DIR/.corpus.tmp, flushed,
    then published in renames (_publish), so an interrupted build never leaves a half-written train.jsonl behind,
    nor a train.jsonl beside another build's rejected.jsonl and stats.json.
    ValueError naming ``input``/``tokenizer`` when they cannot be read, ``out_dir`` when it cannot be written, or when the input holds no conversation or
    none of its lines builds an example (the first reasons in the message; nothing written).
    """
    input, out_dir = Path(input), Path(out_dir)
    if not input.is_file():
        raise ValueError(f"input: {input} is not a file")
    # found out now, not after the input was read (mkdir raised FileExistsError / NotADirectoryError there): a file in
    # OUT_DIR's place or on the way to it, or a folder this process cannot write in
    problem = folder_problem(out_dir)
    if problem:
        raise ValueError(f"out_dir: {problem}")
    if input.resolve() in {(out_dir / name).resolve() for name in BUILD_FILES}:
        raise ValueError(f"input: {input} is one of the files the build writes into out_dir ({', '.join(BUILD_FILES)});"
                         " it would be replaced by the build: keep the conversations outside out_dir")
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    with input.open("rb") as fh:  # decoded line by line: a line that is not UTF-8 is a rejected line, named
        result = read_corpus(fh, context_turns=context_turns, prompt_memories=prompt_memories,
                             max_text_chars=max_text_chars, max_prompt_chars=max_prompt_chars)
    if not result.conversations:  # an empty train.jsonl would replace the last good build and only fail at training
        raise ValueError(f"input: {input} holds no conversation (it is empty or only blank lines)")
    if not result.examples:  # every line rejected: the same, and the reasons are what the author needs
        first = "; ".join(f"line {r['line']}: {r['reason']}" for r in result.rejected[:3])
        more = f" (and {len(result.rejected) - 3} more)" if len(result.rejected) > 3 else ""
        raise ValueError(f"input: {input}: none of its {result.conversations} lines built an example; "
                         f"nothing was written. {first}{more}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out_dir: cannot create {out_dir} ({exc.strerror or exc})") from None

    rows, lengths, trained = [], [], []
    for example in (progress(result.examples) if progress else result.examples):
        row = {"id": example.id, "line": example.line, "kind": example.kind}
        if tok is not None:
            row.update(tokenize_row(tok, example.rendered))
            ids, labels = row["input_ids"], row["labels"]
            lengths.append(len(ids))
            trained.append(sum(1 for x in labels if x != IGNORE_INDEX))
        else:
            row.update(text=example.rendered.text, mask=[list(s) for s in example.rendered.spans])
            lengths.append(len(example.rendered.text))
            trained.append(sum(b - a for a, b in example.rendered.spans))
        rows.append(row)

    unit = "tokens" if tok is not None else "characters"
    by_kind: dict[str, int] = {}
    for example in result.examples:
        by_kind[example.kind] = by_kind.get(example.kind, 0) + 1
    stats = {
        "input": str(input), "tokenizer": str(tokenizer) if tokenizer else None, "unit": unit,
        "context_turns": context_turns, "prompt_memories": prompt_memories, "max_text_chars": max_text_chars,
        "max_prompt_chars": max_prompt_chars,
        "conversations": result.conversations, "accepted": result.conversations - len(result.rejected),
        "rejected": len(result.rejected), "examples": len(rows), "examples_by_kind": by_kind,
        "length": _length_stats(lengths), "trained": _length_stats(trained),
    }
    stats.update(_template_check(tok, result.examples))
    _publish(out_dir, {"train.jsonl": _jsonl(rows), "rejected.jsonl": _jsonl(result.rejected),
                       "stats.json": json.dumps(stats, indent=2) + "\n"})
    stats["rejected_lines"] = result.rejected
    return stats


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _publish(out_dir: Path, files: dict[str, str]) -> None:
    """BUILD_FILES into ``out_dir`` as one set: written into OUT_DIR/.corpus.tmp and flushed (fsync_tree), then
    published (durable.publish_corpus): renamed to OUT_DIR/.corpus.new (the commit), the previous build's files moved
    aside with train.jsonl first, the new ones moved in with train.jsonl last, the previous ones deleted. Renaming the
    three files into place one by one left, after a kill between the renames, a new train.jsonl beside the previous
    build's rejected.jsonl and stats.json, which `hearth train` took as one corpus. Now a kill while writing leaves
    the previous build as it was (the next build deletes the .corpus.tmp); one during the renames leaves the previous
    build whole or no train.jsonl, and `hearth train` refuses the folder until a build into it completes the
    committed one first. ValueError naming ``out_dir`` when it cannot be written."""
    import shutil

    tmp = out_dir / CORPUS_TMP
    try:
        if tmp.exists():  # a build killed while writing: never committed
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name, text in files.items():
            with (tmp / name).open("w", encoding="utf-8") as fh:
                fh.write(text)
        fsync_tree(tmp)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # the previous build stays as it was
        raise ValueError(f"out_dir: cannot write in {out_dir} ({exc.strerror or exc})") from None
    try:
        publish_corpus(tmp, out_dir)
    except OSError as exc:
        committed = not tmp.exists()
        if not committed:
            shutil.rmtree(tmp, ignore_errors=True)  # the previous build stays as it was
        raise ValueError(f"out_dir: cannot write in {out_dir} ({exc.strerror or exc})"
                         + ("; the new files are committed: run the build into it again to complete them"
                            if committed else "")) from None


# `hearth corpus build`'s flags for the app settings a deployment may change: flag -> the app's setting (its default
# and bounds: hearth.companion_rules.SETTING_BOUNDS, which hearth.app.settings.AppSettings' fields are made from)
APP_SETTING_FLAGS = {"--context-turns": "chat_context_turns",
                     "--prompt-memories": "prompt_memories",
                     "--max-text-chars": "max_text_chars",
                     "--max-prompt-chars": "max_prompt_chars"}


def app_setting(flag: str, value: int | None) -> int:
    """The value `hearth corpus build` uses for ``flag``: the app's default for its setting when ``value`` is None,
    else ``value`` validated as the app's settings validate it (an int within the bounds of
    hearth.companion_rules.SETTING_BOUNDS, the app's own, so a corpus is built for a configuration the app can run).
    ValueError naming the flag."""
    setting = APP_SETTING_FLAGS[flag]
    default, least, most = SETTING_BOUNDS[setting]
    if value is None:
        return default
    try:
        return TypeAdapter(Annotated[int, Field(ge=least, le=most)]).validate_python(value)
    except ValidationError:
        raise ValueError(f"{flag}: the app's {setting} must be >= {least} and <= {most}, got {value!r}") from None


def build_command(*, input: Path, out_dir: Path, tokenizer: Path | None = None, context_turns: int | None = None,
                  prompt_memories: int | None = None, max_text_chars: int | None = None,
                  max_prompt_chars: int | None = None) -> int:
    """`hearth corpus build`: build, print counts, rejections and length stats; exit code 0, or 2 on bad
    arguments. Rejected lines do not fail the command (they are reported and written out). context_turns /
    prompt_memories / max_text_chars / max_prompt_chars: the deployment's chat_context_turns / prompt_memories /
    max_text_chars / max_prompt_chars (None: the app's defaults; app_setting)."""
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    console = Console()
    try:
        context_turns = app_setting("--context-turns", context_turns)
        prompt_memories = app_setting("--prompt-memories", prompt_memories)
        max_text_chars = app_setting("--max-text-chars", max_text_chars)
        max_prompt_chars = app_setting("--max-prompt-chars", max_prompt_chars)
        # the app's start-up check of the three together (hearth.app.settings): a corpus for a configuration the app
        # refuses would hold prompts over the budget, the system prompt and new message being never cut
        problem = budget_shortfall(prompt_memories=prompt_memories, max_text_chars=max_text_chars,
                                   max_prompt_chars=max_prompt_chars)
        if problem is not None:
            raise ValueError(f"--max-prompt-chars: the app's max_prompt_chars {problem} (the app refuses to start "
                             "with less; raise --max-prompt-chars or lower --max-text-chars / --prompt-memories)")
        stats = build(input, out_dir, tokenizer, context_turns=context_turns, prompt_memories=prompt_memories,
                      max_text_chars=max_text_chars, max_prompt_chars=max_prompt_chars,
                      progress=lambda xs: track(xs, description="tokenizing", console=console, transient=True))
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    console.print(f"{stats['conversations']} conversations: {stats['accepted']} accepted, "
                  f"{stats['rejected']} rejected -> {stats['examples']} examples "
                  + ", ".join(f"{k}={v}" for k, v in sorted(stats["examples_by_kind"].items())))
    for rej in stats["rejected_lines"]:
        console.print(f"[yellow]rejected[/yellow] line {rej['line']} ({rej['id']}): {rej['reason']}")
    table = Table(title=f"example length ({stats['unit']})")
    for col in ("", "min", "mean", "p50", "p95", "max", "total"):
        table.add_column(col, justify="right")
    for name in ("length", "trained"):
        s = stats[name]
        table.add_row(name, *(str(s.get(k, "-")) for k in ("min", "mean", "p50", "p95", "max", "total")))
    console.print(table)
    if stats["chat_template_matches"] is False:
        console.print("[yellow]warning:[/yellow] the tokenizer's chat template renders differently from "
                      f"hearth's Qwen3 renderer for {stats['chat_template_mismatches']}; check docs/corpus.md before training")
    console.print(f"wrote {out_dir}/train.jsonl, rejected.jsonl, stats.json")
    return 0
