"""A memory that is not a str is refused by the panel's prompt as it is by the companion's, naming it.

Was: companion_system_prompt raised TypeError("memories[i] must be str"), but panel_context (the analysts' and a
rehearsal agent's context, through system_prompt_for) silently dropped such a memory, so an analyst or rehearsal
spec (an eval case, a corpus conversation) with a malformed memory ran or trained on a smaller prompt than it gave,
and a bare string given as ``memories`` was read one character per memory. The module promises TypeError naming
the argument for non-str memories.
"""

from __future__ import annotations

import pytest

from hearth import prompts

REHEARSAL = {"name": "Dana", "personality": "Direct.", "backstory": "Her manager.", "relationship": "manager"}


@pytest.mark.parametrize("spec", [
    {"kind": "analyst", "analyst": "cynic", "shared_context": "I work nights.", "companion": "Wren"},
    {"kind": "chat", "prompt": "rehearsal", "rehearsal": REHEARSAL, "shared_context": "I work nights."},
    {"kind": "chat", "persona": "wren", "world_view": "grounded", "stage": "friend", "shared_context": "x"},
], ids=["analyst", "rehearsal", "companion"])
def test_a_memory_that_is_not_a_str_is_refused_naming_it(spec):
    with pytest.raises(TypeError, match=r"memories\[1\] must be str, got int"):
        prompts.system_prompt_for({**spec, "memories": ["Likes tea", 3]})


def test_panel_context_refuses_a_bare_string_and_non_str_memories():
    with pytest.raises(TypeError, match="memories must be a list of str, got str"):
        prompts.panel_context("I work nights.", memories="Likes tea")
    with pytest.raises(TypeError, match=r"memories\[0\] must be str, got NoneType"):
        prompts.panel_context("I work nights.", memories=[None])
    # unchanged for good input: blank memories are still left out, a newline still folded
    assert prompts.panel_context("c", memories=["Likes tea", " ", "Two\nlines"]).endswith("- Likes tea\n- Two lines")
