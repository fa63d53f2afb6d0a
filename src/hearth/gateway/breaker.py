"""Per-provider circuit breaker: cool a provider down after failures, or when it says Retry-After.

    closed  --(breaker_failures consecutive failures)-->  open for cooldown_s
    closed  --(429/503 with Retry-After: N)----------->  open for min(N, max_retry_after_s)
    open    --(time passes)----------------------------> half-open: the next request tries it;
                                                          success closes it, a failure reopens it

State lives in this process. Several gateway workers each keep their own (documented limitation:
shared state would go in the app's database or Redis; see ARCHITECTURE "Beyond one machine").
"""

from __future__ import annotations

import time

from hearth.gateway.errors import Cooldown, UpstreamStatus


class Breaker:
    __slots__ = ("name", "threshold", "cooldown_s", "max_retry_after_s", "failures", "open_until", "why")

    def __init__(self, name: str, *, threshold: int, cooldown_s: float, max_retry_after_s: float) -> None:
        self.name = name
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.max_retry_after_s = max_retry_after_s
        self.failures = 0               # consecutive
        self.open_until = 0.0           # time.monotonic() until which the provider is skipped
        self.why = ""

    def check(self, now: float | None = None) -> Cooldown | None:
        """A Cooldown error when the provider must be skipped now, else None."""
        now = time.monotonic() if now is None else now
        if now < self.open_until:
            return Cooldown(self.name, self.open_until - now, self.why)
        return None

    def is_open(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self.open_until

    def success(self) -> None:
        self.failures = 0
        self.open_until = 0.0

    def failure(self, error: Exception, now: float | None = None) -> bool:
        """Record a failed attempt; returns True when this opened the breaker."""
        now = time.monotonic() if now is None else now
        self.failures += 1
        if isinstance(error, UpstreamStatus) and error.retry_after is not None:
            self.open_until = max(self.open_until, now + min(error.retry_after, self.max_retry_after_s))
            self.why = f"Retry-After {error.retry_after:g} s (HTTP {error.status})"
            return True
        if self.failures >= self.threshold and self.cooldown_s > 0:
            self.open_until = now + self.cooldown_s
            self.why = f"{self.failures} consecutive failures, last: {error}"
            return True
        return False

    def state(self, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        is_open = now < self.open_until
        return {"state": "open" if is_open else ("half_open" if self.failures >= self.threshold else "closed"),
                "consecutive_failures": self.failures,
                "cooldown_left_s": round(self.open_until - now, 3) if is_open else 0.0,
                "why": self.why if is_open else None}
