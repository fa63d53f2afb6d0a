"""The app's one seam to the model: the gateway chain, in process.

The app never calls a provider itself. It holds one object with the chain's interface
(``complete(messages, kind=...)`` -> result with ``.envelope`` / ``.provider``, and optionally
``stream(...)``) for the life of the app:

    * the real ``hearth.gateway.chain.Chain`` built from the ``[[providers]]`` of the TOML file given
      to ``hearth serve --config FILE`` (the same file the gateway reads);
    * :class:`NoModel` when no providers are configured: every call raises :class:`ModelUnavailable`
      and the UI explains how to point the app at an endpoint (``SETUP_SNIPPET``).

Tests hand ``create_app`` any object with the same interface.

Errors seen by callers: :class:`ModelUnavailable` (nothing configured) and the gateway's
``GatewayError`` tree (``AllProvidersFailed`` etc.); routes turn both into a visible failure and
store nothing for that turn.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any, AsyncIterator, Protocol

SETUP_SNIPPET = """\
# hearth.toml: then run  hearth serve --config hearth.toml
[[providers]]
name = "local"
base_url = "http://127.0.0.1:8001/v1"   # any OpenAI-compatible server (vLLM, llama.cpp, ...)
model = "hearth-lora"
json_schema = true                      # ask the server to constrain replies to the envelope
# api_key_env = "OPENAI_API_KEY"        # name of the variable holding the key, if one is needed
[providers.timeouts]
connect_s = 2.0
total_s = 30.0
"""


class ModelUnavailable(RuntimeError):
    """No model endpoint is configured (see SETUP_SNIPPET)."""


class ModelBackend(Protocol):
    async def complete(self, messages: list[dict], *, kind: str, deadline_s: float | None = None,
                       max_tokens: int | None = None, request_id: str | None = None) -> Any: ...


class NoModel:
    """Stands in for the chain when no providers are configured."""

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def complete(self, messages: list[dict], *, kind: str, deadline_s: float | None = None,
                       max_tokens: int | None = None, request_id: str | None = None) -> Any:
        raise ModelUnavailable("no model endpoint is configured")

    async def stream(self, messages: list[dict], *, kind: str, **_: Any) -> AsyncIterator[Any]:
        raise ModelUnavailable("no model endpoint is configured")
        yield  # pragma: no cover - makes this an async generator


def has_providers(config: Path | None) -> bool:
    if config is None:
        return False
    with open(config, "rb") as fh:
        return bool(tomllib.load(fh).get("providers"))


def build_backend(config: Path | None) -> Any:
    """The chain for ``config`` (or NoModel when it lists no providers).

    Raises the gateway's ConfigError (a ValueError naming the field) when the providers are invalid.
    """
    if not has_providers(config):
        return NoModel()
    from hearth.gateway.chain import Chain
    from hearth.gateway.config import load_config

    return Chain(load_config(config))


def check_as_streamed(result: Any) -> None:
    """Refuse a ``complete`` chat reply that the streamed path would have failed, so both paths keep the same turns.

    The chain applies this rule itself (hearth.gateway.streamfilter.check_streamed, for STREAMED_KINDS): such a
    reply is an InvalidResponse there, and the next provider answers. This call holds a backend other than the
    chain (any object with its interface, as create_app accepts) to the same rule; it raises the gateway's
    InvalidResponse (the routes show it and save nothing). A result without the reply's ``text`` (a test double)
    has nothing to compare."""
    text = getattr(result, "text", None)
    if not isinstance(text, str):
        return
    from hearth.gateway.streamfilter import check_streamed

    check_streamed(text, getattr(result, "provider", None) or "model")


_PHRASES = [  # (gateway class name, what the user is told); first match wins
    ("ModelUnavailable", "No model is configured yet."),
    ("StreamInterrupted", "The reply was cut off part-way."),
    ("Timeout", "The model took too long to answer."),
    ("DeadlineExceeded", "The model took too long to answer."),
    ("TimeoutError", "The model took too long to answer."),
    ("ConnectionFailed", "The model service could not be reached."),
    ("UpstreamStatus", "The model service reported an error."),
    ("InvalidResponse", "The model's answer could not be understood."),
    ("InvalidEnvelope", "The model's answer could not be understood."),
    ("Cooldown", "The model service is resting after recent errors."),
    # a Cold held after failed warm-ups: nothing is starting, so not "starting up"
    ("HeldCold", "The model is unavailable for now: it did not start after several tries."),
    ("Cold", "The model is starting up."),
]
_GENERIC = "Something went wrong while asking the model."


def _phrase(exc: BaseException) -> str:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return next((text for name, text in _PHRASES if name in names), _GENERIC)


def describe_failure(exc: BaseException) -> str:
    """What happened, in the user's words: no class names, provider names or upstream text."""
    if isinstance(exc, BaseExceptionGroup):
        phrases = list(dict.fromkeys(_phrase(e) for e in exc.exceptions))
        return "No model could answer right now. " + " ".join(phrases)
    return _phrase(exc)


def failure_for_log(exc: BaseException) -> str:
    """The failure for the operator's log: class names, providers and outcome labels, never the upstream
    body or the model's text (which can hold what the user wrote)."""
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__}(" + "; ".join(failure_for_log(e) for e in exc.exceptions) + ")"
    provider = getattr(exc, "provider", None)
    detail = getattr(exc, "label", None) or getattr(exc, "outcome", None)
    if detail is None and isinstance(getattr(exc, "status", None), int):
        detail = f"status {exc.status}"
    parts = [p for p in (provider, detail) if p]
    cause = exc.__cause__
    text = type(exc).__name__ + (f"[{', '.join(map(str, parts))}]" if parts else "")
    return text + (f" <- {failure_for_log(cause)}" if cause is not None and cause is not exc else "")


class UpstreamTextFilter(logging.Filter):
    """In the app's process, the gateway's log records carry failures as class names and labels only: an
    exception passed as a log argument is replaced by :func:`failure_for_log` (an upstream error body or
    an invalid envelope can hold the model's text, which can hold what the user wrote)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, BaseException) for a in record.args):
            record.args = tuple(failure_for_log(a) if isinstance(a, BaseException) else a for a in record.args)
        return True


def quiet_upstream_text(loggers: tuple[str, ...] = ("hearth.gateway.chain",)) -> None:
    """Install :class:`UpstreamTextFilter` on the gateway's loggers (once)."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(f, UpstreamTextFilter) for f in logger.filters):
            logger.addFilter(UpstreamTextFilter())
