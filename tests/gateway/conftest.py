"""Fixtures shared by the gateway tests (helpers that are not fixtures live in gateway_helpers.py)."""

import pytest

from tests.gateway.gateway_helpers import move_state_clock


@pytest.fixture
def clock(monkeypatch):
    """The state module's clock, moved forward by hand: clock.offset += seconds."""
    return move_state_clock(monkeypatch)
