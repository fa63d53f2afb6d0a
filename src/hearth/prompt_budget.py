"""The least max_prompt_chars a configuration can run with: what the app never cuts from a request, at its largest.

fit_history (hearth.companion_rules) leaves out a request's oldest earlier exchanges to fit max_prompt_chars, never
its system prompt nor its new message; a budget that cannot hold the largest of both would send requests over it.
The app refuses such a configuration at start-up (hearth.app.settings) and `hearth corpus build` refuses its flags
for one (hearth.train.corpus.build_command), both from here, so the corpus is never built for a configuration the
app refuses. A bottom-layer module (prompts, the rules and the envelope only), as the corpus builder needs it
without the app installed.
"""

from __future__ import annotations

from typing import get_args

from hearth import prompts
from hearth.companion_rules import AGENT_FIELD_LIMITS, MAX_CONTEXT, MAX_NAME, MAX_PERSONA
from hearth.envelope import Memory

# the longest memory a reply may list (hearth.envelope's Memory), as the system prompts carry up to prompt_memories
MEMORY_CHARS = next(m.max_length for m in get_args(Memory)[1:] if getattr(m, "max_length", None))


def largest_system_prompt(prompt_memories: int) -> tuple[str, int]:
    """(what it is, its characters): the longest system prompt the app can send with this prompt_memories, every
    text in it at its cap (a custom persona, the shared context, each memory a reply may list, the rehearsed
    person's fields and the companion's name), the longest world view and stage: a companion chat's, a rehearsal's
    (its person and the panel's context), or an analyst's (the panel's context). max_prompt_chars must hold it and
    one max_text_chars message: the app never cuts either (hearth.companion_rules.fit_history)."""
    memories = ["m" * MEMORY_CHARS] * prompt_memories
    context = prompts.panel_context("c" * MAX_CONTEXT, companion="n" * MAX_NAME, memories=memories)
    person = {field: field[0] * most for field, most in AGENT_FIELD_LIMITS.items()}
    sizes = {
        "a companion chat's": len(prompts.companion_system_prompt(
            persona="p" * MAX_PERSONA, world_view=max(prompts.WORLD_VIEWS, key=lambda k: len(prompts.WORLD_VIEWS[k])),
            shared_context="c" * MAX_CONTEXT, stage=max(prompts.STAGES, key=lambda k: len(prompts.STAGES[k])),
            memories=memories)),
        "a rehearsal's": len(prompts.rehearsal_system_prompt(**person, shared_context=context)),
        "an analyst's": max(len(prompts.analyst_system_prompt(a, shared_context=context)) for a in prompts.ANALYSTS),
    }
    return max(sizes.items(), key=lambda item: item[1])


def budget_shortfall(*, prompt_memories: int, max_text_chars: int, max_prompt_chars: int) -> str | None:
    """None when max_prompt_chars holds the largest system prompt (largest_system_prompt) and one max_text_chars
    message; else why not ("must be at least N to hold ..."), for the caller to name its setting or flag."""
    what, system = largest_system_prompt(prompt_memories)
    need = system + max_text_chars
    if max_prompt_chars >= need:
        return None
    return (f"must be at least {need} to hold the largest system prompt ({what}: {system} characters with "
            f"prompt_memories = {prompt_memories} and every text at its cap) and one message of max_text_chars = "
            f"{max_text_chars} characters, got {max_prompt_chars}")
