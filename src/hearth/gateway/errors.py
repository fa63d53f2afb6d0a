"""The gateway's errors: a small tree, so the chain decides by type and never by string matching.

    GatewayError
    ├── ConfigError (also ValueError)        the TOML or environment is wrong; .field names where
    ├── ProviderError                        one attempt at one provider failed; .provider
    │   ├── Timeout                          .kind: "connect" | "first_token" | "total"
    │   ├── UpstreamStatus                   non-2xx answer; .status, .retry_after (s or None), .body,
    │   │                                    .client_error (the request itself was refused: a 4xx
    │   │                                    other than 401/402/403/404/407/408/429)
    │   ├── ConnectionFailed                 refused / reset / DNS / closed mid-body
    │   ├── InvalidResponse                  2xx but not an OpenAI chat completion (bad JSON, no choices)
    │   ├── InvalidEnvelope                  a completion whose text fails hearth.envelope.parse_envelope;
    │   │                                    .envelope_error (the EnvelopeError), .finish_reason
    │   ├── Cooldown                         not tried: breaker open, Retry-After pending, or its half-open
    │   │                                    trial taken; .remaining_s, .status (429/503 for a Retry-After)
    │   ├── Cold                             not tried: scale-to-zero provider is not warm
    │   │   └── HeldCold                     ... and held cold after failed warm-ups (no probe); .held_s
    │   └── DeadlineExceeded                 the request's own deadline ran out (before or during it)
    ├── StreamInterrupted                    upstream failed after bytes were sent to the client;
    │                                        .provider, __cause__ is the ProviderError; no fallback
    ├── ClientStalled                        a streaming client took no bytes for stream_write_timeout_s:
    │                                        the gateway disconnects it (thrown into Chain.stream)
    └── AllProvidersFailed (ExceptionGroup)  every provider failed; .exceptions holds one
                                             ProviderError per provider, in chain order;
                                             .available_in_s when each may be tried again

Every ProviderError keeps what a fallback or a log needs (status, Retry-After, timeout kind);
nothing is flattened into a message string.
"""

from __future__ import annotations

from typing import Literal

from hearth.envelope import EnvelopeError

TimeoutKind = Literal["connect", "first_token", "total"]


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(GatewayError, ValueError):
    """Invalid gateway configuration. ``field`` is a dotted path such as ``providers[1].timeouts.total_s``."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class ProviderError(GatewayError):
    """One provider attempt failed. ``outcome`` is the short label used in attempts and metrics."""

    outcome = "error"

    def __init__(self, provider: str, message: str) -> None:
        self.provider = provider
        super().__init__(f"{provider}: {message}")


class Timeout(ProviderError):
    outcome = "timeout"

    def __init__(self, provider: str, kind: TimeoutKind, after_s: float) -> None:
        self.kind = kind
        self.after_s = after_s
        super().__init__(provider, f"{kind} timeout after {after_s:.3f} s")

    @property
    def label(self) -> str:
        return f"timeout_{self.kind}"


# 4xx answers that are about the gateway's side of the request (our key, account, URL or model name,
# a proxy, a timeout, a rate limit), not about what the client sent.
PROVIDER_SIDE_4XX = frozenset({401, 402, 403, 404, 407, 408, 429})


class UpstreamStatus(ProviderError):
    outcome = "status"

    def __init__(self, provider: str, status: int, retry_after: float | None = None, body: str = "") -> None:
        self.status = status
        self.retry_after = retry_after
        self.body = body
        extra = f", Retry-After {retry_after:g} s" if retry_after is not None else ""
        super().__init__(provider, f"HTTP {status}{extra}: {body[:200]}")

    @property
    def label(self) -> str:
        return f"status_{self.status}"

    @property
    def client_error(self) -> bool:
        """The provider refused the request itself (400 context_length_exceeded, 413, 422, ...)."""
        return 400 <= self.status < 500 and self.status not in PROVIDER_SIDE_4XX


class ConnectionFailed(ProviderError):
    outcome = "connection"


class InvalidResponse(ProviderError):
    outcome = "invalid_response"


class InvalidEnvelope(ProviderError):
    outcome = "invalid_envelope"

    def __init__(self, provider: str, envelope_error: EnvelopeError, finish_reason: str | None = None) -> None:
        self.envelope_error = envelope_error
        self.finish_reason = finish_reason
        # cut short (finish_reason "length") by the max_tokens the request itself asked for: the client's choice,
        # not the provider's failure (hearth.gateway.breaker.counts); the chain sets it
        self.client_capped = False
        note = " (truncated: finish_reason=length)" if finish_reason == "length" else ""
        super().__init__(provider, f"invalid envelope{note}: {envelope_error}")
        self.__cause__ = envelope_error


class Cooldown(ProviderError):
    outcome = "cooldown"

    def __init__(self, provider: str, remaining_s: float, why: str, status: int | None = None) -> None:
        self.remaining_s = remaining_s
        self.why = why
        self.status = status
        super().__init__(provider, f"cooling down for {remaining_s:.2f} s more ({why})" if remaining_s > 0 else why)


class Cold(ProviderError):
    outcome = "cold"

    def __init__(self, provider: str) -> None:
        super().__init__(provider, "scale-to-zero endpoint is not warm; skipped (warm-up running)")


class HeldCold(Cold):
    """Cold and not probed: the endpoint is held cold after failed warm-ups (hearth.gateway.warm). Its label is
    still "cold"; the message says the back-off, not a warm-up that is not running. held_s: the window left."""

    def __init__(self, provider: str, held_s: float) -> None:
        self.held_s = held_s
        ProviderError.__init__(self, provider, f"scale-to-zero endpoint held cold for {held_s:.0f} s more after "
                                               "failed warm-ups; skipped (no probe)")


class DeadlineExceeded(ProviderError):
    """client_set: the deadline that ran out was one the request shortened (hearth_deadline_s below the gateway's
    deadline_s). Such an error says nothing about the provider and does not count toward its breaker: otherwise
    one client sending short deadlines would open a healthy provider's breaker for everyone."""

    outcome = "deadline"

    def __init__(self, provider: str, deadline_s: float, client_set: bool = False) -> None:
        self.deadline_s = deadline_s
        self.client_set = client_set
        super().__init__(provider, f"request deadline of {deadline_s:.3f} s exhausted")


class StreamInterrupted(GatewayError):
    """The upstream failed after the first byte reached the client: the stream ends with an error."""

    def __init__(self, provider: str, cause: BaseException) -> None:
        self.provider = provider
        super().__init__(f"{provider}: stream interrupted after first byte: {cause}")
        self.__cause__ = cause


class ClientStalled(GatewayError):
    """A streaming client stopped taking bytes (its socket open, its receive window full) for longer than
    [gateway].stream_write_timeout_s. The server throws it into the chain's stream (athrow), which closes the
    upstream, counts nothing against the provider and records the outcome client_stalled; then it drops the client."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(f"the client took no bytes of the stream for {timeout_s:g} s")


class AllProvidersFailed(ExceptionGroup, GatewayError):
    """Every provider in the chain failed; ``exceptions`` lists each one's ProviderError in order.

    ``available_in_s``: per exception, seconds until its provider may be tried again, read from the breaker and
    warm state when the chain gave up (0.0 at once, None not known); None when not read (the state store failed,
    or the group was built elsewhere): then only the errors themselves say it (hearth.gateway.server)."""

    available_in_s: list[float | None] | None = None

    def __new__(cls, message: str, exceptions):
        return super().__new__(cls, message, exceptions)

    def derive(self, excs):  # keep the type when ExceptionGroup.split/subgroup rebuild it
        return AllProvidersFailed(self.message, excs)

    def __str__(self) -> str:
        return self.message + ": " + "; ".join(str(e) for e in self.exceptions)


def label(error: ProviderError) -> str:
    """Metric / attempt label of an error: 'timeout_first_token', 'status_429', 'cooldown', ..."""
    return getattr(error, "label", error.outcome)


def for_log(error: ProviderError) -> str:
    """What logs and the breaker's reason say about a failure: its class and label, never its text. An upstream
    error body or an invalid envelope can quote the model's reply, which can quote what the user wrote."""
    return f"{type(error).__name__}({label(error)})"
