"""What the user is told when the fine-tune is held cold after failed warm-ups (the gateway's HeldCold, a Cold):
not "starting up", which it is not (no warm-up runs during the back-off). The other phrases keep their words."""

from __future__ import annotations

from hearth.app.model import describe_failure
from hearth.gateway.errors import Cold, Cooldown, HeldCold


def test_a_held_cold_endpoint_is_not_said_to_be_starting_up():
    said = describe_failure(HeldCold("ft", 120.0))
    assert "starting up" not in said
    assert "unavailable" in said and "hosted" not in said  # plain words: no provider names


def test_a_cold_endpoint_still_is_starting_up_and_a_cooldown_resting():
    assert describe_failure(Cold("ft")) == "The model is starting up."
    assert "resting" in describe_failure(Cooldown("ft", 5.0, "breaker open"))


def test_a_group_names_each_reason_once():
    said = describe_failure(ExceptionGroup("all failed", [HeldCold("ft", 60.0), Cooldown("hosted", 5.0, "breaker open")]))
    assert said.startswith("No model could answer right now.") and "starting up" not in said
