"""Relationship stages, from the affection and trust a companion has accumulated: the ladder (STAGES), Standing and
standing(affection, trust).

They live in hearth.companion_rules (the stage table and its reasons are documented there), a bottom-layer module
that the corpus builder (hearth.train.corpus) uses too without importing the app; this module keeps the app's names.
"""

from __future__ import annotations

from hearth.companion_rules import STAGES, Standing, standing

__all__ = ["STAGES", "Standing", "standing"]
