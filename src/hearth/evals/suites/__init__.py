"""Eval suites as data: companion.jsonl, feed.jsonl, analysts.jsonl (docs/eval.md), plus what the cases point at
by name: contexts.json (the users' shared contexts), histories.json (earlier turns of a conversation) and
memories.json (what a companion remembers), so every case runs at production prompt size, up to the largest
prompt the app sends (a chat at its history, memory and shared-context limits).

A case line:

    {"id": "companion-01", "kind": "chat", "persona": "wren", "world_view": "grounded", "stage": "friend",
     "memories": [...], "context": "tama", "history": [{"role": "user", "content": "..."},
     {"role": "assistant", "envelope": {...}}], "user": "the message to answer"}

An analyst case may give ``after_rehearsal`` instead of ``user``: the panel's message after a rehearsal turn,
written by hearth.prompts.rehearsal_exchange_for as the app writes it ({"rehearsal": the person, "history": the
rehearsal's earlier turns, inline or a histories.json name, "text": the user's new line, "reply": the person's
reply}); it stays in the case's spec. Any key hearth.prompts.system_prompt_for reads may appear (prompt, analyst,
rehearsal, companion, ...);
``context`` names an entry of contexts.json and becomes ``shared_context``; ``history`` and ``memories`` are
either inline lists or the name of an entry of histories.json / memories.json (one long conversation or memory
list can serve several cases, e.g. a chat, a rehearsal and the panel of the same companion). Assistant turns
are envelopes, sent back as the app sends them (hearth.prompts.history_turn: a chat reply's message).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from hearth.envelope import MODELS
from hearth.prompts import history_turn, rehearsal_exchange_for, system_prompt_for

HERE = Path(__file__).parent
SUITES: dict[str, str] = {"companion": "companion.jsonl", "feed": "feed.jsonl", "analysts": "analysts.jsonl"}


@dataclass(frozen=True)
class Case:
    """One eval case: a production system prompt, optional history, and the user turn to answer."""

    suite: str
    id: str
    kind: str
    spec: dict[str, Any]
    history: tuple[dict[str, str], ...] = ()
    user: str = ""
    expect: dict[str, Any] = field(default_factory=dict)  # optional extra checks, e.g. {"analyst": "cynic"}

    def system_prompt(self) -> str:
        return system_prompt_for(self.spec)[1]

    def messages(self) -> list[dict[str, str]]:
        """OpenAI chat messages: system, history (assistant turns as canonical envelopes), user."""
        return [{"role": "system", "content": self.system_prompt()}, *self.history,
                {"role": "user", "content": self.user}]


@lru_cache(maxsize=1)
def contexts() -> dict[str, str]:
    return json.loads((HERE / "contexts.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def histories() -> dict[str, list[dict]]:
    """Named conversations (earlier turns, oldest first) that cases point at with ``"history": "name"``."""
    return json.loads((HERE / "histories.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def memory_lists() -> dict[str, list[str]]:
    """Named memory lists (oldest first) that cases point at with ``"memories": "name"``."""
    return json.loads((HERE / "memories.json").read_text(encoding="utf-8"))


def _named(table: dict, name: str, what: str, file: str):
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {what} {name!r} (not in {file})")
    return table[name]


def _after_rehearsal(raw: Any) -> dict:
    """An after-rehearsal spec with its named history (histories.json) resolved."""
    if not isinstance(raw, dict):
        raise TypeError(f"after_rehearsal must be an object, got {type(raw).__name__}")
    if isinstance(raw.get("history"), str):
        return {**raw, "history": list(_named(histories(), raw["history"], "history", "histories.json"))}
    return dict(raw)


def _case(suite: str, raw: dict) -> Case:
    spec = {k: v for k, v in raw.items() if k not in {"id", "context", "history", "user", "after_rehearsal"}}
    if "context" in raw:
        spec["shared_context"] = _named(contexts(), raw["context"], "context", "contexts.json")
    if isinstance(raw.get("memories"), str):
        spec["memories"] = list(_named(memory_lists(), raw["memories"], "memories", "memories.json"))
    kind, _ = system_prompt_for(spec)  # fails loudly on a malformed case
    turns = raw.get("history", [])
    if isinstance(turns, str):
        turns = _named(histories(), turns, "history", "histories.json")
    history = []
    for i, turn in enumerate(turns):
        if turn.get("role") == "assistant":
            content = history_turn(MODELS[kind].model_validate(turn["envelope"]))  # as the app sends it
        else:
            content = turn["content"]
        history.append({"role": turn["role"], "content": content})
    user = raw.get("user")
    if "after_rehearsal" in raw:  # the panel after a rehearsal turn: its message as the app writes it
        if kind != "analyst" or "user" in raw or history:
            raise ValueError("after_rehearsal is an analyst case's user message: give it instead of 'user' and "
                             "'history'")
        after = _after_rehearsal(raw["after_rehearsal"])
        user = rehearsal_exchange_for(after)
        spec["after_rehearsal"] = after
    if not isinstance(user, str) or not user.strip():
        raise ValueError("'user' must be a non-empty string")
    expect = {"analyst": spec["analyst"]} if kind == "analyst" else {}
    return Case(suite=suite, id=raw["id"], kind=kind, spec=spec, history=tuple(history), user=user, expect=expect)


def load_suite(name: str, path: Path | None = None) -> list[Case]:
    """Cases of a built-in suite (companion, feed, analysts), or of a JSONL file at ``path``.

    ValueError naming ``name`` for an unknown suite, or the file and line of a malformed case.
    """
    if path is None:
        if name not in SUITES:
            raise ValueError(f"name must be one of {tuple(SUITES)} (or 'all'), got {name!r}")
        path = HERE / SUITES[name]
    cases = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise ValueError(f"a case must be a JSON object, got {type(raw).__name__}")
            cases.append(_case(name, raw))
        except KeyError as exc:
            raise ValueError(f"{where}: missing key {exc}") from exc
        except (ValueError, TypeError, AttributeError) as exc:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"{where}: {exc}") from exc
    return cases
