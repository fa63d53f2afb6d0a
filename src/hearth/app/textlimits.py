"""How long the texts a user writes about a companion and about a rehearsed person may be: characters once cleaned
(common.clean_text: stripped, CRLF as LF); the app refuses a longer one (InputError naming the field). And the
default of the setting that bounds what a user sends (a message, a post, a situation, a rehearsal line).

The numbers live in hearth.companion_rules, a bottom-layer module, so the corpus builder (hearth.train.corpus)
refuses what the app refuses with these same numbers without importing the app; this module keeps the app's names.
The forms' text boxes take their maxlength from here too (main._templates); the message boxes take the settings'
max_text_chars (main.create_app).
"""

from __future__ import annotations

from hearth.companion_rules import (AGENT_FIELD_LIMITS, DEFAULT_MAX_TEXT_CHARS, MAX_AGENT_FIELD, MAX_AGENT_NAME,
                                    MAX_CONTEXT, MAX_NAME, MAX_PERSONA)

__all__ = ["AGENT_FIELD_LIMITS", "DEFAULT_MAX_TEXT_CHARS", "MAX_AGENT_FIELD", "MAX_AGENT_NAME", "MAX_CONTEXT",
           "MAX_NAME", "MAX_PERSONA"]
