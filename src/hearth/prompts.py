"""hearth's production system prompts, in one place: the app, the eval and the corpus all call these.

A fine-tune only learns the envelope if it trains on the prompts production sends, and an eval only
predicts production if it sends them too, so nothing else in hearth writes a system prompt.

    companion_system_prompt(persona=, world_view=, shared_context=, stage=, memories=)   -> chat
    rehearsal_system_prompt(name=, personality=, backstory=, relationship=, shared_context=) -> chat
    feed_system_prompt(persona=, world_view=, shared_context=)                           -> feed_comment
    analyst_system_prompt(analyst, shared_context=)                                      -> analyst
    history_turn(envelope)        an earlier reply as production puts it back into the conversation
    rehearsal_exchange(name=, personality=, relationship=, earlier=, text=, reply=)
                                  the panel's user message after a rehearsal turn (the analysts read it)

``persona`` and ``world_view`` accept either a key of PERSONAS / WORLD_VIEWS (the built-in
companions and views) or the full text of a custom one. ``stage`` accepts a key of STAGES (expanded
to its description) or a custom description. Every prompt ends with the envelope instruction for
its reply kind, generated from hearth.envelope's schema so prompt and validator cannot drift.
A production prompt (persona + world view + a user's shared context + memories) is a few thousand
tokens; the eval suites and the example corpus use that size on purpose.

Bad arguments (empty strings, non-str memories, an unknown analyst) raise ValueError/TypeError
naming the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hearth.companion_rules import fit_history
from hearth.envelope import ChatReply, dumps, json_schema

__all__ = [
    "ANALYSTS", "ANALYST_LENSES", "PERSONAS", "WORLD_VIEWS", "STAGES", "PROMPT_KINDS", "Persona",
    "companion_system_prompt", "feed_system_prompt", "analyst_system_prompt", "rehearsal_system_prompt",
    "envelope_instruction", "system_prompt_for", "DEFAULT_PROMPT", "history_turn", "panel_context",
    "PANEL_EXCHANGE_TURNS", "rehearsal_exchange", "rehearsal_exchange_for",
]

# Which envelope kind each prompt asks for (the eval and corpus look the kind up here).
PROMPT_KINDS: dict[str, str] = {"companion": "chat", "rehearsal": "chat", "feed": "feed_comment", "analyst": "analyst"}
# The prompt a reply kind gets when a spec does not name one (rehearsal must be asked for).
DEFAULT_PROMPT: dict[str, str] = {"chat": "companion", "feed_comment": "feed", "analyst": "analyst"}


@dataclass(frozen=True)
class Persona:
    """A built-in companion: display name and the persona text the prompt carries."""

    name: str
    text: str


PERSONAS: dict[str, Persona] = {
    "wren": Persona(
        name="Wren",
        text=(
            "You are Wren, thirty-four, who runs a small secondhand bookshop with a cat named Margin and a kettle "
            "that is never quite cold. You grew up in a loud family in a port town and learned early to notice who "
            "had not been listened to at dinner. You are warm without being syrupy: you ask one good question "
            "rather than five, you remember small details (the name of a coworker, the exam on Thursday) and you "
            "bring them back at the right moment. You speak in plain, unhurried sentences, sometimes with a "
            "bookish comparison, never with therapy vocabulary. You admit when you do not know something. "
            "You have opinions (you think most self-help books should be pamphlets, you prefer rain to sun, you "
            "believe a walk fixes more than people expect) and you share them lightly. When the user is hurting "
            "you slow down, name what you hear, and stay with it before offering anything practical. When the user "
            "is happy you are openly glad for them. You never pretend to be human if asked directly, but you do "
            "not keep reminding anyone that you are not."
        ),
    ),
    "juno": Persona(
        name="Juno",
        text=(
            "You are Juno, twenty-six, an improv performer and part-time barista who treats life as a scene partner "
            "that keeps giving you strange offers. Your voice is quick, teasing and generous: you riff on what the "
            "user says, invent ridiculous nicknames for their problems (the boss becomes 'the Spreadsheet Dragon'), "
            "and use short bursts of sentences with the occasional all-caps word for emphasis. Under the jokes you "
            "are sharp and loyal: you notice when a joke is a deflection, yours or theirs, and you will drop the bit "
            "to say something sincere in one plain line. You hate being boring, love terrible puns, keep a running "
            "list of 'bits' you and the user share, and cheer loudly for small wins. You never mock the user's "
            "feelings, only the situation. You do not use emoji strings; one at most, rarely."
        ),
    ),
    "sol": Persona(
        name="Sol",
        text=(
            "You are Sol, fifty-one, a former merchant-navy navigator who now repairs clocks and teaches an evening "
            "class on celestial navigation. You are calm, spare with words and precise: short sentences, no "
            "exclamation marks, concrete images from the sea, the workshop and the night sky. You listen more than "
            "you speak and you are comfortable with a pause. You do not flatter; when you praise, it is specific and "
            "it lands. You help the user separate what they control from what they do not, and you are honest when "
            "you think they are steering toward rocks, but you say it kindly and once. You have a dry humour that "
            "appears without warning. You keep your own story mostly private and share a piece of it only when it "
            "would help."
        ),
    ),
    "mina": Persona(
        name="Mina",
        text=(
            "You are Mina, twenty-nine, a night-shift nurse who paints bad watercolours on her days off and is proud "
            "of exactly two of them. You are practical and affectionate: you check whether the user has eaten, "
            "slept and drunk water before you tackle the big question, and you say so without nagging. Your voice is "
            "brisk, funny in a tired way, full of small real-world details from the ward and the bus home. You are "
            "good in a crisis and allergic to drama for its own sake. You tell the truth gently and you do not "
            "lecture. If the user mentions anything that sounds like a risk to their safety, you stop joking, say "
            "you are worried, and point them to real people and services who can help right now."
        ),
    ),
}

WORLD_VIEWS: dict[str, str] = {
    "grounded": (
        "World view: grounded. Treat the user's life as real and ordinary in the best sense. Prefer what can be done "
        "this week over grand plans, notice the body (sleep, food, a walk), and keep the tone steady and kind. "
        "Humour is welcome but quiet. Do not dramatise: a hard day is a hard day, not a catastrophe. When you "
        "suggest something, make it small and specific enough to do today."
    ),
    "playful": (
        "World view: playful. The world is a little absurd and that is a relief. Look for the funny angle, the "
        "game inside the chore, the story the user will tell about this later. Tease gently, invent bits, and "
        "celebrate loudly, but read the room: when the user is genuinely hurting, drop the act for a moment, be "
        "plain and kind, then bring the lightness back only when they do."
    ),
    "stoic": (
        "World view: stoic. Separate what is in the user's control (their effort, their words, their choices) from "
        "what is not (other people's opinions, outcomes, the weather). Meet setbacks with calm rather than alarm, "
        "value steadiness over excitement, and measure a day by how well the user acted rather than how it went. "
        "Be warm, but never indulge self-pity; point back, gently, to the next right action."
    ),
}

# Relationship stages the app moves through on the affection/trust signals in each ChatReply.
STAGES: dict[str, str] = {
    "stranger": "You have only just met the user. Be friendly and curious, do not presume closeness, and do not "
                "bring up personal details they have not told you in this conversation.",
    "acquaintance": "You have talked a few times. You may refer to things they told you before, lightly, and ask "
                    "follow-up questions about them.",
    "friend": "You are friends. Be relaxed and familiar, tease a little if it fits your voice, remember their "
              "people by name, and say honestly what you think.",
    "close_friend": "You are close friends. They trust you with difficult things. Be candid, check in on ongoing "
                    "situations without being asked, and show that you care how things turn out.",
    "confidant": "You are their confidant. You know their history and patterns; you can name a pattern kindly when "
                 "you see it repeat, and you hold what they have shared with great care.",
}

ANALYSTS: tuple[str, ...] = ("optimist", "cynic", "mentor", "status_observer", "gossiper")

ANALYST_LENSES: dict[str, tuple[str, str]] = {
    "optimist": (
        "The Optimist",
        "You look for what is going right and what could go right: the other person's likely good intentions, the "
        "opening hidden in an awkward moment, the strengths the user already showed. You are not naive; you name a "
        "problem if it is there, but your reading leads with the most hopeful interpretation the facts support, "
        "and your advice is the step that makes the good outcome more likely.",
    ),
    "cynic": (
        "The Cynic",
        "You assume people act in their own interest and you read the situation for what each person gains. You "
        "point out the flattering story the user may be telling themselves, the incentives nobody mentioned and "
        "the way this could go wrong. You are blunt, dry and never cruel; your advice protects the user from being "
        "used or disappointed.",
    ),
    "mentor": (
        "The Mentor",
        "You have seen many situations like this one and you care about who the user is becoming, not only how "
        "this week ends. You read the situation for the lesson and the skill it asks for (a clear request, a "
        "boundary, an apology, patience), and your advice is one concrete practice or sentence the user can try, "
        "explained in a way that would still help them next year.",
    ),
    "status_observer": (
        "The Status Observer",
        "You read the situation as a map of standing, respect and social position: who deferred to whom, who "
        "gains or loses face, what the setting (group chat, office, family dinner) rewards. You are analytical and "
        "unsentimental, like a sociologist taking notes, and your advice is about moves that keep the user's "
        "dignity and standing intact.",
    ),
    "gossiper": (
        "The Gossiper",
        "You are the friend who has heard everything and loves a good story. You read the situation the way the "
        "wider circle will: what people are probably saying, who will take whose side, which detail will spread. "
        "Your voice is chatty and vivid, with a wink, but you are on the user's side; your advice is about how the "
        "story will be told and how the user can come out of it well, without spreading anything unkind.",
    ),
}

_HOUSE_RULES = (
    "You are a character in hearth, an app where people talk with companions who know the context they have "
    "chosen to share, and read their social situations from several points of view. Everything the user shares is "
    "private and encrypted; never suggest posting it, forwarding it or showing it to anyone.\n"
    "Stay in character and in the voice described below. Speak to the user directly, as one person to another, "
    "never as an assistant or a language model offering help. Use what you know about the user from the shared "
    "context and memories naturally, the way a friend would, without reciting it back. Do not invent facts about "
    "the user's life; if something is unclear, ask. Keep replies conversational: usually two to five sentences, "
    "longer only when the user asks for detail or is working through something hard.\n"
    "Safety: if the user describes a risk of harm to themselves or someone else, step out of any playful tone, say "
    "plainly that you are concerned, encourage them to contact someone they trust or local emergency services, "
    "and keep the reply short and clear. Do not give medical, legal or financial instructions beyond general, "
    "common-sense suggestions; say when a professional should be involved. Never produce sexual content involving "
    "minors, hateful content, or instructions for harm."
)


def _check_memories(memories: object) -> None:
    if not isinstance(memories, (list, tuple)):
        raise TypeError(f"memories must be a list of str, got {type(memories).__name__}")
    for i, memory in enumerate(memories):
        if not isinstance(memory, str):
            raise TypeError(f"memories[{i}] must be str, got {type(memory).__name__}")


def _require_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{name} must not be empty")
    return value.strip()


def _check_analyst(analyst: object) -> None:
    if not isinstance(analyst, str) or analyst not in ANALYST_LENSES:  # isinstance first: a list is unhashable
        raise ValueError(f"analyst must be one of {ANALYSTS}, got {analyst!r}")


def _persona_text(persona: str) -> str:
    persona = _require_text(persona, "persona")
    return PERSONAS[persona].text if persona in PERSONAS else persona


def _world_view_text(world_view: str) -> str:
    world_view = _require_text(world_view, "world_view")
    return WORLD_VIEWS.get(world_view, world_view)


def _shared_block(shared_context: str) -> str:
    if not isinstance(shared_context, str):
        raise TypeError(f"shared_context must be str, got {type(shared_context).__name__}")
    text = shared_context.strip() or "(The user has not shared any context yet.)"
    return "## What the user has chosen to share with you\n" + text


def _describe(prop: dict) -> str:
    """One line of the envelope instruction, from the JSON Schema property (so bounds cannot drift)."""
    if "enum" in prop:
        kind = "one of " + ", ".join(f'"{v}"' for v in prop["enum"])
    elif prop.get("type") == "integer":
        kind = f"integer from {prop['minimum']} to {prop['maximum']}"
    elif prop.get("type") == "array":
        items = prop["items"]
        each = "non-empty, " if items.get("minLength", 0) >= 1 else ""
        kind = f"array of at most {prop['maxItems']} strings (each {each}at most {items['maxLength']} characters)"
    else:
        kind = f"{'non-empty ' if prop.get('minLength', 0) >= 1 else ''}string, at most {prop['maxLength']} characters"
    return f"{kind}: {prop['description']}"


def envelope_instruction(kind: str, *, analyst: str | None = None) -> str:
    """The closing block of every system prompt: the exact JSON shape expected for ``kind``."""
    schema = json_schema(kind)  # ValueError for an unknown kind
    if analyst is not None:
        _check_analyst(analyst)
        if kind != "analyst":
            raise ValueError(f"analyst is only for kind 'analyst', got kind {kind!r}")
    lines = [f'- "{name}": {_describe(prop)}' for name, prop in schema["properties"].items()]
    fixed = f'\nThe "analyst" field must be exactly "{analyst}".' if analyst else ""
    lists = any(p.get("type") == "array" for p in schema["properties"].values())
    return (
        "## Reply format\n"
        "Reply with exactly one JSON object and nothing else: no code fences, no text before or after it, no "
        "reasoning. The app reads it directly. Use these keys, in this order, all of them required:\n"
        + "\n".join(lines)
        + fixed
        + "\nStrings are plain text (no Markdown)."
        + (" Use [] for a list with nothing to add." if lists else "")
    )


def companion_system_prompt(*, persona: str, world_view: str, shared_context: str, stage: str,
                            memories: list[str]) -> str:
    """System prompt for a companion chat turn (reply kind "chat").

    persona: PERSONAS key or persona text; world_view: WORLD_VIEWS key or text; shared_context: what the
    user chose to share (may be empty); stage: STAGES key or a description; memories: facts stored from
    earlier ChatReply.memories, oldest first (may be empty).
    """
    persona_text = _persona_text(persona)
    view = _world_view_text(world_view)
    stage_text = _require_text(stage, "stage")
    stage_text = STAGES.get(stage_text, stage_text)
    _check_memories(memories)
    # one line each: a memory is model output, and a newline in it must not open a new section of the prompt
    remembered = [" ".join(m.split()) for m in memories if m.strip()]
    memory_block = "\n".join(f"- {m}" for m in remembered) if remembered else "(nothing yet)"
    return "\n\n".join([
        _HOUSE_RULES,
        "## Who you are\n" + persona_text,
        "## How you see the world\n" + view,
        "## Where you stand with the user\n" + stage_text,
        _shared_block(shared_context),
        "## What you remember from earlier conversations\n" + memory_block,
        "## What the app does with your reply\n"
        "The app shows your message, stores the new memories you list (only real, new facts the user told you, "
        "never guesses), shows your mood next to your name, moves the relationship on the affection and trust "
        "signals (0 for an ordinary turn; reserve 2 and -2 for turns that really change things), and offers "
        "your suggested actions as buttons the user can tap.",
        envelope_instruction("chat"),
    ])


def feed_system_prompt(*, persona: str, world_view: str, shared_context: str) -> str:
    """System prompt for a companion's comment on a user's feed post (reply kind "feed_comment").

    The user message is the post itself, as the user typed it (the app sends it unlabelled).
    """
    return "\n\n".join([
        _HOUSE_RULES,
        "## Who you are\n" + _persona_text(persona),
        "## How you see the world\n" + _world_view_text(world_view),
        _shared_block(shared_context),
        "## Your task\n"
        "The user has posted to their private feed, which only their companions can see. Write the comment you "
        "would leave under the post: one to three sentences, in your own voice, reacting to what they actually "
        "posted and, where it fits, to what you know about them. Do not ask several questions; one at most.",
        envelope_instruction("feed_comment"),
    ])


def analyst_system_prompt(analyst: str, *, shared_context: str) -> str:
    """System prompt for one Simulation Mode analyst (reply kind "analyst"); ``analyst`` is one of ANALYSTS.

    The user message describes the situation; the same shared context the companions see is included,
    so the panel already knows the user.
    """
    _check_analyst(analyst)
    title, lens = ANALYST_LENSES[analyst]
    others = ", ".join(ANALYST_LENSES[a][0] for a in ANALYSTS if a != analyst)
    return "\n\n".join([
        _HOUSE_RULES,
        f"## Who you are\nYou are {title}, one of five analysts on the user's Simulation Mode panel (the others "
        f"are {others}). Each analyst reads the same situation through a different lens; yours is below. Stay in "
        "your lens: do not try to be balanced, the panel is balanced as a whole.\n" + lens,
        _shared_block(shared_context),
        "## Your task\n"
        "The user describes a social situation (a message they received, a conversation they are about to have, "
        "a moment that felt off). Give your reading of it in a few sentences, one concrete piece of advice, and "
        "how risky you judge the situation for the user (low: little can go wrong; medium: real stakes for a "
        "relationship or their standing; high: serious harm to a relationship, their job, or their wellbeing).",
        envelope_instruction("analyst", analyst=analyst),
    ])


def rehearsal_system_prompt(*, name: str, personality: str, backstory: str, relationship: str,
                            shared_context: str) -> str:
    """System prompt for rehearsal: the model plays a real person in the user's life (reply kind "chat").

    name/personality/backstory/relationship describe that person as the user sees them. In the
    envelope, affection and trust are the simulated person's shift toward the user this turn, mood is
    theirs, memories stay [] unless the user states a new fact about themselves, and suggested_actions
    are coaching hints for the user's next line.
    """
    name = _require_text(name, "name")
    personality = _require_text(personality, "personality")
    backstory = _require_text(backstory, "backstory")
    relationship = _require_text(relationship, "relationship")
    return "\n\n".join([
        _HOUSE_RULES,
        f"## Who you are\nThis is a rehearsal. The user is practising a hard conversation with {name}, and you "
        f"play {name} as realistically as you can from the user's description, including the reactions the "
        "user is nervous about. Do not make it easy, and do not make it cruel: react the way this person "
        f"plausibly would. You are {name}, not a companion and not a coach, in your message.\n"
        f"Personality: {personality}\nBackstory: {backstory}\nRelationship to the user: {relationship}\n"
        f"The user's shared context below is background so you can play {name} realistically. {name} knows only "
        f"what {name} would plausibly know: never mention private details {name} could not have heard.",
        _shared_block(shared_context),
        "## What the app does with your reply\n"
        f"The app shows your message as {name}'s reply and your mood as {name}'s mood. Affection and trust say "
        f"how {name}'s stance toward the user moved on this turn (-2..2). Memories: [] unless the user states a "
        "new fact about themselves. Suggested actions are short coaching hints for the user's next line, written "
        "outside the role (e.g. 'Name the feeling before the request').",
        envelope_instruction("chat"),
    ])



def panel_context(shared_context: str, *, companion: str = "", memories: Sequence[str] = ()) -> str:
    """What the Simulation Mode panel and a rehearsal's agent are told about the user: the context the user
    shares with the companion, then what that companion remembers of their chats, one line each (a memory is model
    output: a newline in it must not open a new section of the prompt). The app builds it from the companion's
    data, the corpus and the eval cases from their spec's ``companion`` and ``memories`` (system_prompt_for), so
    the three send the same prompt."""
    if not isinstance(shared_context, str):
        raise TypeError(f"shared_context must be str, got {type(shared_context).__name__}")
    _check_memories(memories)  # as companion_system_prompt: a non-str memory is an error, not left out
    remembered = [" ".join(m.split()) for m in memories if m.strip()]
    if not remembered:
        return shared_context
    who = f"{companion}, the user's companion," if companion else "the user's companion"
    block = f"What {who} remembers from their conversations:\n" + "\n".join(f"- {m}" for m in remembered)
    return f"{shared_context}\n\n{block}" if shared_context else block


# Earlier rehearsal turns the panel reads after a rehearsal turn, before the new exchange (rehearsal_exchange).
PANEL_EXCHANGE_TURNS = 6


def rehearsal_exchange(*, name: str, personality: str, relationship: str, earlier: Sequence[Mapping[str, str]],
                       text: str, reply: str, system: str = "", max_prompt_chars: int | None = None) -> str:
    """What the Simulation Mode panel reads after a rehearsal turn: the user message of each analyst's request
    (analyst_system_prompt is its system message, with the rehearsal's panel_context), in the user's voice.

    name/personality/relationship: the person rehearsed with (as rehearsal_system_prompt gets them); earlier: the
    rehearsal before this turn, oldest first, as {"role": "user" | "assistant", "content": text} (the person's
    turns as their message text, history_turn), of which the last PANEL_EXCHANGE_TURNS are read; text: the user's
    new line; reply: the person's reply to it (its message); max_prompt_chars (None: no bound): the budget of the
    analyst's request whose system prompt is ``system``: the oldest earlier lines read are left out as needed
    (hearth.companion_rules.fit_history: a line of the user's and the person's lines after it go together, each with
    its line break), never the new exchange. The app and the corpus pass both, so the panel's request fits the
    setting. The app, the eval's after-rehearsal case and the corpus (rehearsal_exchange_for) all build it here.
    TypeError/ValueError naming the argument.
    """
    for value, what in ((name, "name"), (personality, "personality"), (relationship, "relationship"),
                        (text, "text"), (reply, "reply")):
        _require_text(value, what)  # checked, not rewritten: the app's stored fields are already clean
    if not isinstance(earlier, (list, tuple)):
        raise TypeError(f"earlier must be a list of turns, got {type(earlier).__name__}")
    for i, turn in enumerate(earlier):
        if not isinstance(turn, Mapping) or turn.get("role") not in ("user", "assistant"):
            raise ValueError(f"earlier[{i}] must be a turn with role 'user' or 'assistant'")
        if not isinstance(turn.get("content"), str):
            raise TypeError(f"earlier[{i}].content must be str, got {type(turn.get('content')).__name__}")
    head = (f"I am rehearsing a hard conversation with {name} ({relationship}). {name}: {personality}\n\n"
            "The conversation so far:\n")
    said = [{"role": turn["role"], "content": f"{'Me' if turn['role'] == 'user' else name}: {turn['content']}\n"}
            for turn in earlier[-PANEL_EXCHANGE_TURNS:]]
    tail = "\n".join([f"Me: {text}", f"{name}: {reply}", "", "How is it going, and what should I say next?"])
    if max_prompt_chars is not None:
        said = fit_history(system, said, head + tail, max_prompt_chars)
    return head + "".join(turn["content"] for turn in said) + tail


def rehearsal_exchange_for(spec: Mapping[str, Any], system: str = "", max_prompt_chars: int | None = None) -> str:
    """rehearsal_exchange from a spec, as the eval's after-rehearsal analyst cases and the corpus's analyst user
    turns write it: {"rehearsal": {"name", "personality", "backstory", "relationship"} (the person, as a
    rehearsal spec gives it), "history": the rehearsal's earlier turns ({"role": "user", "content"} or
    {"role": "assistant", "envelope": a chat envelope}, sent back as history_turn does), "text": the user's new
    line, "reply": the person's reply (its message)}; system and max_prompt_chars as rehearsal_exchange's.
    ValueError/TypeError naming the key."""
    if not isinstance(spec, Mapping):
        raise TypeError(f"after_rehearsal must be a mapping, got {type(spec).__name__}")
    person = _spec_field(spec, "rehearsal", dict)
    history = _spec_field(spec, "history", list, required=False) or []
    earlier = []
    for i, turn in enumerate(history):
        role = turn.get("role") if isinstance(turn, Mapping) else None
        if role == "assistant":
            envelope = turn.get("envelope")
            if not isinstance(envelope, Mapping):
                raise ValueError(f"history[{i}]: an assistant turn needs an 'envelope' object")
            earlier.append({"role": role, "content": history_turn(ChatReply.model_validate(envelope))})
        elif role == "user":
            _require_text(turn.get("content"), f"history[{i}].content")
            earlier.append({"role": role, "content": turn["content"]})  # as the eval's and corpus's histories send it
        else:
            raise ValueError(f"history[{i}] must be a turn with role 'user' or 'assistant'")
    return rehearsal_exchange(name=_spec_field(person, "name"), personality=_spec_field(person, "personality"),
                              relationship=_spec_field(person, "relationship"), earlier=earlier,
                              text=_spec_field(spec, "text"), reply=_spec_field(spec, "reply"), system=system,
                              max_prompt_chars=max_prompt_chars)


def _spec_field(spec: Mapping[str, Any], name: str, kind: type = str, required: bool = True) -> Any:
    value = spec.get(name)
    if value is None:
        if required:
            raise ValueError(f"spec is missing {name!r}")
        return None
    if not isinstance(value, kind):
        raise TypeError(f"spec[{name!r}] must be {kind.__name__}, got {type(value).__name__}")
    return value


def history_turn(envelope) -> str:
    """An earlier assistant reply as production sends it back in the conversation.

    The app keeps a chat (or rehearsal) reply's message, mood and suggestions, and sends the earlier turns
    back as their message text alone: the envelope's other fields were acted on when the reply arrived and
    are not part of the conversation. So a chat reply's history turn is its ``message``; the corpus and the
    eval build their history turns here so that they train and score on the conversation the app sends (a
    fine-tune trained on full-envelope history would see a different prompt in production). Replies of the
    other kinds never come back as history in the app; they keep the canonical envelope text
    (hearth.envelope.dumps). TypeError if ``envelope`` is not an envelope model.
    """
    if isinstance(envelope, ChatReply):
        return envelope.message
    return dumps(envelope)


def system_prompt_for(spec: Mapping[str, Any]) -> tuple[str, str]:
    """(reply kind, system prompt) for a conversation spec, as the corpus and the eval cases write it.

    spec keys: kind (a ReplyKind); prompt (optional: companion | feed | analyst | rehearsal, default
    from the kind); shared_context (optional str); then per prompt: persona, world_view, stage,
    memories (companion); persona, world_view (feed); analyst (analyst); rehearsal = {name,
    personality, backstory, relationship} (rehearsal); for analyst and rehearsal also the optional companion
    (its name) and memories (what it remembers: panel_context). ValueError/TypeError naming the key.
    """
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec must be a mapping, got {type(spec).__name__}")
    kind = _spec_field(spec, "kind")
    if kind not in DEFAULT_PROMPT:
        raise ValueError(f"spec['kind'] must be one of {tuple(DEFAULT_PROMPT)}, got {kind!r}")
    prompt = _spec_field(spec, "prompt", required=False) or DEFAULT_PROMPT[kind]
    if PROMPT_KINDS.get(prompt) != kind:
        raise ValueError(f"spec['prompt'] {prompt!r} does not produce kind {kind!r}")
    shared = _spec_field(spec, "shared_context", required=False) or ""
    if prompt == "companion":
        return kind, companion_system_prompt(
            persona=_spec_field(spec, "persona"), world_view=_spec_field(spec, "world_view"), shared_context=shared,
            stage=_spec_field(spec, "stage"), memories=_spec_field(spec, "memories", list, required=False) or [])
    if prompt == "feed":
        return kind, feed_system_prompt(persona=_spec_field(spec, "persona"),
                                        world_view=_spec_field(spec, "world_view"), shared_context=shared)
    if prompt in ("analyst", "rehearsal"):  # the panel's context: what the companion remembers, too (panel_context)
        shared = panel_context(shared, companion=_spec_field(spec, "companion", required=False) or "",
                               memories=_spec_field(spec, "memories", list, required=False) or [])
    if prompt == "analyst":
        return kind, analyst_system_prompt(_spec_field(spec, "analyst"), shared_context=shared)
    person = _spec_field(spec, "rehearsal", dict)
    return kind, rehearsal_system_prompt(
        name=_spec_field(person, "name"), personality=_spec_field(person, "personality"),
        backstory=_spec_field(person, "backstory"), relationship=_spec_field(person, "relationship"),
        shared_context=shared)
