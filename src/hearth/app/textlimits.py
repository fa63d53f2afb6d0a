"""How long the texts a user writes about a companion and about a rehearsed person may be: characters once cleaned
(common.clean_text: stripped, CRLF as LF); the app refuses a longer one (InputError naming the field). And the
default of the setting that bounds what a user sends (a message, a post, a situation, a rehearsal line).

A module of its own that imports nothing, so the corpus builder (hearth.train.corpus) refuses what the app refuses
with these same numbers, without loading the app (its database and crypto). The forms' text boxes take their
maxlength from here too (main._templates); the message boxes take the settings' max_text_chars (main.create_app).
"""

from __future__ import annotations

MAX_NAME = 60  # a companion's name (companions.create_companion / update_companion)
MAX_PERSONA = 4000  # a custom persona
MAX_CONTEXT = 8000  # the context the user shares with their companions

MAX_AGENT_NAME = 60  # the name of the person a rehearsal plays (simulation.create_agent)
MAX_AGENT_FIELD = 2000  # their personality, backstory and relationship to the user
# every field of the rehearsed person, in the order the app asks for them, and its limit (each is required)
AGENT_FIELD_LIMITS: dict[str, int] = {"name": MAX_AGENT_NAME, "personality": MAX_AGENT_FIELD,
                                      "backstory": MAX_AGENT_FIELD, "relationship": MAX_AGENT_FIELD}

# the default of [app] max_text_chars (hearth.app.settings.AppSettings.max_text_chars, whose default this is): the
# longest chat message, feed post, situation or rehearsal line; a deployment may change the setting, and the app
# enforces the loaded value (the corpus builder's --max-text-chars)
DEFAULT_MAX_TEXT_CHARS = 4000
