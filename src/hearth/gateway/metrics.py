"""Prometheus metrics of one gateway (its own registry, so two chains in one process never collide).

    hearth_gateway_requests_total{kind, outcome}                    one per chat request; outcome: a key of OUTCOMES
    hearth_gateway_request_seconds{kind, outcome}                   histogram, whole request (one per request)
    hearth_gateway_attempt_seconds{provider, outcome}               histogram, one attempt (ok or failed); a
                                                                    stream's without its client's delivery time
    hearth_gateway_errors_total{provider, error}                    error: timeout_first_token, status_429, ...: one
                                                                    per failed attempt; error="cooldown": one per
                                                                    request that skipped the provider for its breaker
                                                                    (open, Retry-After, trial taken), wherever decided
    hearth_gateway_fallbacks_total{provider}                        fell through from `provider` to the next
    hearth_gateway_warm_decisions_total{provider, decision}         decision: warm | cold
    hearth_gateway_warmups_total{provider, outcome}                 outcome: ok | failed
    hearth_gateway_warm_backoff_skips_total{provider}               "cold" decisions made by the back-off (no probe)
    hearth_gateway_warm_backoff_seconds{provider}                   time left of the endpoint's back-off (0: none)
    hearth_gateway_breaker_open{provider}                           1 while the provider is cooling down
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# How a chat request ended: every request gets exactly ONE of these, with its duration (request_done). A request
# that is not counted is invisible to the dashboards: failures and tail latency would be under-counted.
OUTCOMES = {
    "ok": "answered (JSON reply, or the stream's last chunk produced)",
    "failed": "every provider failed before the first byte (the client got 4xx/429/502/503/504)",
    "interrupted": "a stream failed after its first byte (upstream gone, stall or total timeout, bad envelope)",
    "client_cancelled": "the client went away first (hung up, or closed a stream mid-way); also a shutdown",
    "client_stalled": "a streaming client took no bytes for stream_write_timeout_s: the gateway disconnected it",
    "error": "the gateway itself failed (state store unavailable, internal error)",
    "rejected": "the gateway refused the request before any provider (400, 404, 408, 413, 415)",
}
UNKNOWN_KIND = "unknown"   # kind label of a request refused before its envelope kind was read

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Loopback answers take ~1 ms, hosted ones seconds, cold starts minutes: buckets span all three.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("hearth_gateway_requests", "Requests by reply kind and outcome", ["kind", "outcome"], registry=r)
        self.request_seconds = Histogram("hearth_gateway_request_seconds", "Whole-request latency by outcome",
                                         ["kind", "outcome"], buckets=_BUCKETS, registry=r)
        self.attempt_seconds = Histogram("hearth_gateway_attempt_seconds", "Latency of one provider attempt",
                                         ["provider", "outcome"], buckets=_BUCKETS, registry=r)
        self.errors = Counter("hearth_gateway_errors", "Provider failures by kind: one per failed attempt; "
                              "error=\"cooldown\": one per request that skipped the provider for its breaker (open, "
                              "Retry-After pending, half-open trial taken); a cold skip counts in warm_decisions",
                              ["provider", "error"], registry=r)
        self.fallbacks = Counter("hearth_gateway_fallbacks", "Fell through from this provider to the next",
                                 ["provider"], registry=r)
        self.warm_decisions = Counter("hearth_gateway_warm_decisions", "Warm gate decisions", ["provider", "decision"],
                                      registry=r)
        self.warmups = Counter("hearth_gateway_warmups", "Background warm-ups by outcome", ["provider", "outcome"],
                               registry=r)
        self.warm_backoff_skips = Counter(
            "hearth_gateway_warm_backoff_skips", "Cold decisions made without a probe: the endpoint is held cold "
            "after failed warm-ups", ["provider"], registry=r)
        self.warm_backoff_seconds = Gauge(
            "hearth_gateway_warm_backoff_seconds", "Seconds left of the back-off after failed warm-ups (0: none)",
            ["provider"], registry=r)
        self.breaker_open = Gauge("hearth_gateway_breaker_open", "1 while a provider is cooling down", ["provider"],
                                  registry=r)

        self._children: dict = {}

    def child(self, metric, *labels: str):
        """metric.labels(*labels), memoised: the hot path skips prometheus' lock and label checks.
        Label values are bounded (providers x outcomes x kinds), so the memo is too."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def request_done(self, kind: str, outcome: str, seconds: float) -> None:
        """Record how one chat request ended (one of OUTCOMES) and how long it took. Called once per request."""
        self.child(self.requests, kind, outcome).inc()
        self.child(self.request_seconds, kind, outcome).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
