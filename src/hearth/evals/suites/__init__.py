"""Eval suites as data: companion.jsonl, feed.jsonl, analysts.jsonl (docs/eval.md), plus contexts.json,
the shared contexts the cases point at, so every case runs at production prompt size.

A case line:

    {"id": "companion-01", "kind": "chat", "persona": "wren", "world_view": "grounded", "stage": "friend",
     "memories": [...], "context": "tama", "history": [{"role": "user", "content": "..."},
     {"role": "assistant", "envelope": {...}}], "user": "the message to answer"}

Any key hearth.prompts.system_prompt_for reads may appear (prompt, analyst, rehearsal, ...);
``context`` names an entry of contexts.json and becomes ``shared_context``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from hearth.envelope import MODELS
from hearth.prompts import history_turn, system_prompt_for

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


def _case(suite: str, raw: dict) -> Case:
    spec = {k: v for k, v in raw.items() if k not in {"id", "context", "history", "user"}}
    if "context" in raw:
        if raw["context"] not in contexts():
            raise ValueError(f"unknown context {raw['context']!r}")
        spec["shared_context"] = contexts()[raw["context"]]
    kind, _ = system_prompt_for(spec)  # fails loudly on a malformed case
    history = []
    for i, turn in enumerate(raw.get("history", [])):
        if turn.get("role") == "assistant":
            content = history_turn(MODELS[kind].model_validate(turn["envelope"]))  # as the app sends it
        else:
            content = turn["content"]
        history.append({"role": turn["role"], "content": content})
    if not isinstance(raw.get("user"), str) or not raw["user"].strip():
        raise ValueError("'user' must be a non-empty string")
    expect = {"analyst": spec["analyst"]} if kind == "analyst" else {}
    return Case(suite=suite, id=raw["id"], kind=kind, spec=spec, history=tuple(history), user=raw["user"],
                expect=expect)


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
