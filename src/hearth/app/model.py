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


def describe_failure(exc: BaseException) -> str:
    """A short, user-safe account of a gateway failure (provider names and outcome labels)."""
    if isinstance(exc, BaseExceptionGroup):
        parts = [f"{getattr(e, 'provider', '?')}: {type(e).__name__}" for e in exc.exceptions]
        return "Every provider failed (" + "; ".join(parts) + ")."
    if isinstance(exc, ModelUnavailable):
        return "No model is configured."
    return f"{type(exc).__name__}."
