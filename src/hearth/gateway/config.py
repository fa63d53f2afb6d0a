"""Gateway configuration: one TOML file plus ``${VAR}`` expansion from the environment.

Environment: any string value in the TOML may contain ``${NAME}``; it is replaced by the
environment variable NAME at load time (a missing variable is a ConfigError naming the field and
the variable). We picked expansion over HEARTH_GATEWAY__... overrides because the file then shows
every setting that is in effect and where its secret-ish parts come from. API keys are never written
in the file: a provider names the variable (``api_key_env``) and a missing one fails start-up.

    [gateway]                  # all optional
    deadline_s = 30.0          # whole-request budget; caps every attempt
    breaker_failures = 3       # consecutive failures that open a provider's breaker
    cooldown_s = 30.0          # how long an open breaker skips the provider
    max_retry_after_s = 300.0  # a Retry-After longer than this is capped
    max_connections = 1024     # shared HTTP client pool size
    stream_write_timeout_s = 10.0  # a client that takes no bytes of a reply this long is disconnected
    default_kind = "chat"
    state_url = "redis://127.0.0.1:6379/0"   # optional: breaker, cooldown and warm state shared through
                                             # Redis by every worker/process that loads this file
                                             # (absent: kept in this process); checked at start-up
    state_prefix = "hearth:gateway"          # key prefix in that Redis (one per gateway deployment)

    [[providers]]              # in fallback order
    name = "finetune"                         # unique, [A-Za-z0-9_.-]
    base_url = "http://10.0.0.5:8000/v1"      # OpenAI-compatible root (…/chat/completions is appended)
    model = "hearth-lora"
    api_key_env = "VLLM_API_KEY"              # optional; missing variable = ConfigError
    json_schema = true                        # send envelope.response_format(kind)
    extra_body = { chat_template_kwargs = { enable_thinking = false } }
    headers = {}                              # extra request headers (one per name, any case; not an
                                              # Authorization header when api_key_env is set)
    scale_to_zero = true                      # warm-gated (needs health_url)
    health_url = "http://10.0.0.5:8000/health"   # the probe sends the key and headers only when this is the
                                                 # same origin (scheme, host, port) as base_url
    [providers.timeouts]                      # seconds
    connect_s = 2.0                           # <= total_s
    first_token_s = 10.0                      # headers (JSON) / first content delta (SSE); also the idle gap while streaming
    total_s = 30.0
    [providers.warm]                          # only for scale_to_zero (else, like health_url, an error)
    probe_timeout_s = 0.5                     # per-request probe (the request waits at most this)
    ttl_s = 5.0                               # how long a probe answer is trusted
    warmup_budget_s = 180.0                   # background warm-up keeps knocking for this long
    warmup_poll_s = 2.0                       # pause between warm-up knocks that were refused (> 0)
    warmup_request_timeout_s = 120.0          # one warm-up knock may wait this long (cold start)
    warmup_backoff_s = 60.0                   # after a failed warm-up: held cold (no probe, no warm-up) this long,
    warmup_backoff_max_s = 900.0              # doubled per failed warm-up in a row up to this (>= warmup_backoff_s)

The file is shared with `hearth serve`: its [app] table (hearth.app.settings) is ignored here. Any other
top-level key (a misspelt [gatway] or [[provider]], a setting written above the first table) is an error
naming config, as unknown keys inside [gateway] or a provider are (a typo would otherwise silently keep a
default).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from hearth.envelope import REPLY_KINDS
from hearth.gateway.errors import ConfigError
from hearth.gateway.state import check_redis_url

__all__ = ["GatewayConfig", "GatewaySettings", "ProviderConfig", "Timeouts", "WarmSettings", "ConfigError",
           "load_config", "config_from_dict", "masked_url", "secret_query_values", "FILE_TABLES",
           "unknown_tables"]

# the top-level keys of hearth's TOML file, the one file of `hearth serve` and `hearth gateway`: [app]
# (hearth.app.settings), [gateway] and [[providers]] (here)
FILE_TABLES = ("app", "gateway", "providers")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
_FRAMING = frozenset({"content-length", "transfer-encoding", "content-encoding"})  # how the body is sent
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters other than the tab: never valid in a header
_SPACE = re.compile(r"[\s\x00-\x1f\x7f]")  # none of it belongs in a URL
# query parameters whose value is a credential (api_key, access_token, sig, X-Amz-Signature, password, ...)
_SECRET_PARAM = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential", re.IGNORECASE)
_QUERY_PAIR = re.compile(r"([?&;])([^=&;#]*)=([^&;#]*)")


class _Strict(BaseModel):
    # TOML has inf and nan: a timeout of inf is no timeout at all, so neither is a valid number here
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Timeouts(_Strict):
    connect_s: float = Field(2.0, gt=0)
    first_token_s: float = Field(10.0, gt=0)
    total_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> "Timeouts":
        if self.first_token_s > self.total_s:
            raise ValueError("first_token_s must be <= total_s")
        if self.connect_s > self.total_s:
            raise ValueError("connect_s must be <= total_s")
        return self


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, lower-cased, the scheme's default port filled in; user:password@ is no part
    of it."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs are one origin: same scheme, host name (as written: 127.0.0.1 and localhost are two) and
    port. A provider's key goes only where its chat requests go anyway."""
    return origin(a) == origin(b)


def masked_url(url: str) -> str:
    """`url` as an error message or a log may show it: the password of its user:password@ (the whole userinfo when
    it is one word, a token) and the values of query parameters named like a credential (api_key, token, sig...)
    replaced by ***. Works on a URL that is no valid one too (that is when a start-up error quotes it)."""
    start = url.find("://")
    if start >= 0:
        start += 3
        end = _authority_end(url, start)
        netloc = url[start:end]
        if "@" not in netloc and (at := url.rfind("@", end)) >= 0 and _cut_password(netloc):
            # a password holding an unencoded '/', '?' or '#' (a generated one) cuts the authority short at it: its
            # start reads as a port that is no number. The userinfo then runs to the last '@' (more masked than
            # needed in an odd URL, never less)
            end = _authority_end(url, at + 1)
            netloc = url[start:end]
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user, colon, _ = userinfo.partition(":")
            netloc = f"{user}:***@{host}" if colon else f"***@{host}"
            url = url[:start] + netloc + url[end:]
    return _QUERY_PAIR.sub(lambda m: f"{m[1]}{m[2]}=***" if _SECRET_PARAM.search(m[2]) else m[0], url)


def secret_query_values(url: str) -> list[str]:
    """The values (as written in `url`) of its query parameters that masked_url hides: those named like a
    credential."""
    return [m[3] for m in _QUERY_PAIR.finditer(url) if _SECRET_PARAM.search(m[2]) and m[3]]


def _authority_end(url: str, start: int) -> int:
    """Where the authority that starts at `start` ends: the first '/', '?' or '#' after it, else the URL's end."""
    return min((i for i in (url.find(c, start) for c in "/?#") if i >= 0), default=len(url))


def _cut_password(netloc: str) -> bool:
    """Whether `netloc` (no '@' in it) looks like the start of user:password cut at a delimiter in the password: a
    ':' followed by no port number (an IPv6 address in brackets aside)."""
    if ":" not in netloc or netloc.endswith("]"):
        return False
    port = netloc.rsplit(":", 1)[1]
    return not (port.isdigit() and port.isascii())


def _masked_reason(reason: str, url: str) -> str:
    """The URL parser's `reason` for refusing `url`, with each quoted part of it that masked_url hides shown as ***
    (urlsplit quotes the port it could not read: with a password cut at a delimiter, the password's start)."""
    masked = masked_url(url)
    return re.sub(r"'([^']+)'", lambda m: "'***'" if m[1] not in masked else m[0], reason)


def _check_url(v: str, schemes: tuple[str, ...]) -> None:
    """ValueError unless `v` is a URL of one of `schemes` with a host and a valid port (when given). The messages show
    it through masked_url: they are printed at start-up."""
    try:
        parts = urlsplit(v)
        port = parts.port  # raises ValueError for ':abc' and for ports outside 0-65535
    except ValueError as exc:
        raise ValueError(f"{masked_url(v)!r} is not a valid URL: {_masked_reason(str(exc), v)}") from None
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"must be a {'/'.join(schemes)} URL with a host, got {masked_url(v)!r}")
    if port == 0:
        raise ValueError(f"port must be 1-65535, got 0 in {masked_url(v)!r}")


class WarmSettings(_Strict):
    probe_timeout_s: float = Field(0.5, gt=0)
    ttl_s: float = Field(5.0, ge=0)
    warmup_budget_s: float = Field(180.0, gt=0)
    # > 0: a health route that fails fast (404, 500, refused) was knocked on in a tight loop for the whole budget
    warmup_poll_s: float = Field(2.0, gt=0)
    warmup_request_timeout_s: float = Field(120.0, gt=0)
    # After a failed warm-up the endpoint is held cold (no probe, no warm-up) this long, doubled after each failed
    # warm-up in a row up to warmup_backoff_max_s: a broken endpoint (bad deploy, quota) was knocked on every
    # warmup_poll_s for as long as traffic came, each knock maybe starting (and billing) a container
    warmup_backoff_s: float = Field(60.0, gt=0)
    warmup_backoff_max_s: float = Field(900.0, gt=0, validate_default=True)  # checked against a warmup_backoff_s
                                                                              # above the default too

    @field_validator("warmup_backoff_max_s")
    @classmethod
    def _backoff_max(cls, v: float, info: ValidationInfo) -> float:
        # a field validator (not a model one) so the error names warm.warmup_backoff_max_s
        start = info.data.get("warmup_backoff_s")
        if start is not None and v < start:
            raise ValueError(f"must be >= warmup_backoff_s ({start:g} s), got {v:g} s")
        return v


class ProviderConfig(_Strict):
    name: str
    base_url: str
    model: str = Field(min_length=1)
    api_key_env: str | None = None
    api_key: str | None = Field(None, exclude=True, repr=False)  # filled from api_key_env, never from TOML
    json_schema: bool = False
    extra_body: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    scale_to_zero: bool = False
    health_url: str | None = Field(None, validate_default=True)  # validated when absent too (scale_to_zero needs it)
    timeouts: Timeouts = Timeouts()
    warm: WarmSettings = WarmSettings()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 characters of letters, digits, '_', '.', '-'")
        return v

    @field_validator("base_url", "health_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            if not re.match(r"^https?://[^/\s]+", v):
                raise ValueError(f"must be an http(s) URL, got {masked_url(v)!r}")
            if _SPACE.search(v):
                # the HTTP client drops a tab or line break and sends a space: "http://h:8000 /v1" resolved the host
                # "h:8000 " (a DNS failure on every request), ".../v1 /chat/completions" asked for /v1%20/... (a 404)
                raise ValueError(f"holds whitespace or a control character: {masked_url(v)!r} (does a ${{VAR}} in it end with a "
                                 "space or a line break?)")
            _check_url(v, ("http", "https"))
            try:
                urlsplit(v).hostname.encode("idna")
            except UnicodeError:
                # the resolver's own encoding of the name (an empty label, one over 63 characters): it raised inside
                # the HTTP client on every request and probe
                raise ValueError(f"has a host name that cannot be resolved: {urlsplit(v).hostname!r} (an empty "
                                 "label or one over 63 characters)") from None
            host = urlsplit(v).hostname
            if host.replace(".", "").isdigit():
                # all digits: an IPv4 address, which the HTTP client takes only as four numbers 0-255 without leading
                # zeros; "10.0.0.05" or "127.1" it refused on every request and probe (InvalidUrlClientError: "is not
                # a canonical IPv4 address"), counted against the provider, or read the endpoint cold for good
                try:
                    ipaddress.IPv4Address(host)
                except ValueError:
                    raise ValueError(f"has a host that is no IPv4 address as the HTTP client reads one: {host!r} (four "
                                     "numbers 0-255, no leading zeros)") from None
            path = urlsplit(v).path
            if "//" in path:
                # "${HEARTH_VLLM_URL}/v1" with the variable ending in "/": servers route "//health" nowhere (404),
                # so the endpoint read cold for good and every chat request failed
                raise ValueError(f"has an empty path segment ('//') in its path {path!r}: does a ${{VAR}} in it end "
                                 "with '/'?")
        return v.rstrip("/") if v else v

    @field_validator("base_url")
    @classmethod
    def _base(cls, v: str) -> str:
        # /chat/completions is appended to it: after a query or fragment it would land in them (a 404 on every
        # request, counted against the provider) instead of in the path
        if "?" in v or "#" in v:
            raise ValueError("must not have a query or fragment (the gateway appends /chat/completions to it)")
        return v

    @field_validator("extra_body")
    @classmethod
    def _extra(cls, v: dict) -> dict:
        reserved = {"model", "messages", "stream"} & set(v)
        if reserved:
            raise ValueError(f"must not set {sorted(reserved)} (the gateway sets them)")
        try:  # TOML has dates and nan/inf, JSON has not: refuse here, not on every request
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must hold only JSON values (no dates, nan or inf): {exc}") from None
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        # checked here: the HTTP client refuses them on every request (a ValueError, not a provider failure)
        seen: dict[str, str] = {}
        for name, value in v.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid header name")
            if _CONTROL.search(value):
                raise ValueError(f"the value of {name!r} holds a control character (a line break?)")
            if name.lower() in _FRAMING:
                # the HTTP client frames the JSON body itself: a second framing (a stale length, "chunked" beside a
                # Content-Length, an encoding the body does not have) garbled every request, counted as the provider's
                raise ValueError(f"{name!r} is set by the gateway's HTTP client from the request body; remove it")
            # header names are case-insensitive: one of the two silently replaced the other
            if name.lower() in seen:
                raise ValueError(f"{seen[name.lower()]!r} and {name!r} are one header (names are case-insensitive); "
                                 "keep one")
            seen[name.lower()] = name
        return v

    @field_validator("health_url", mode="after")
    @classmethod
    def _health(cls, v: str | None, info: ValidationInfo) -> str | None:
        # a field validator (not a model one) so the error names providers[i].health_url
        if info.data.get("scale_to_zero") and not v:
            raise ValueError("required when scale_to_zero = true")
        return v

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"

    @property
    def own_headers(self) -> dict[str, str]:
        """The headers that are this provider's: Authorization from api_key_env, then `headers` (its key headers
        such as api-key, x-api-key, its organisation...)."""
        out = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        out.update(self.headers)
        return out

    @property
    def health_headers(self) -> dict[str, str]:
        """What the health probe sends: own_headers when health_url is the same origin as base_url (an endpoint
        behind a key answers its health route only with it), else nothing: the key never goes to another origin."""
        if self.health_url is None or not same_origin(self.health_url, self.base_url):
            return {}
        return self.own_headers


class GatewaySettings(_Strict):
    deadline_s: float = Field(30.0, gt=0)
    breaker_failures: int = Field(3, ge=1)
    cooldown_s: float = Field(30.0, ge=0)
    max_retry_after_s: float = Field(300.0, ge=0)
    max_connections: int = Field(1024, ge=1)
    # the longest one write of a streamed reply may wait for the client to take bytes (its receive window full):
    # past it the client is disconnected and the upstream closed (outcome client_stalled); a JSON reply (errors
    # too) must be taken within it as a whole, or the client is disconnected the same way
    stream_write_timeout_s: float = Field(10.0, gt=0)
    default_kind: str = "chat"
    state_url: str | None = None
    state_prefix: str = Field("hearth:gateway", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")

    @field_validator("state_url")
    @classmethod
    def _state_url(cls, v: str | None) -> str | None:
        if v is not None:
            _check_url(v, ("redis", "rediss"))
            path = urlsplit(v).path.strip("/")
            if path and not path.isdigit():
                raise ValueError(f"the path must be a Redis database number (e.g. /0), got {masked_url(v)!r}")
            check_redis_url(v)  # its query's options, as the Redis client reads them
        return v

    @field_validator("default_kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in REPLY_KINDS:
            raise ValueError(f"must be one of {REPLY_KINDS}")
        return v


class GatewayConfig(_Strict):
    gateway: GatewaySettings = GatewaySettings()
    providers: tuple[ProviderConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "GatewayConfig":
        seen: set[str] = set()
        for p in self.providers:
            if p.name in seen:
                raise ValueError(f"duplicate provider name {p.name!r}")
            seen.add(p.name)
        return self

    def provider(self, name: str) -> ProviderConfig:
        for p in self.providers:
            if p.name == name:
                return p
        raise KeyError(name)


def _expand(value: Any, path: str, env: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(1) not in env:
                raise ConfigError(path, f"environment variable {m.group(1)} is not set (used as ${{{m.group(1)}}})")
            return env[m.group(1)]
        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, f"{path}.{k}" if path else k, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}[{i}]", env) for i, v in enumerate(value)]
    return value


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _check_unique_names(providers: Any) -> None:
    """ConfigError naming the second of two providers with one name (GatewayConfig checks it too, but
    a model-level check can only blame the whole document)."""
    if not isinstance(providers, list):
        return  # not a list: validation says so
    first: dict[str, int] = {}
    for i, p in enumerate(providers):
        name = p.get("name") if isinstance(p, dict) else None
        if not isinstance(name, str):
            continue
        if name in first:
            raise ConfigError(f"providers[{i}].name", f"duplicate provider name {name!r} (also providers[{first[name]}])")
        first[name] = i


def config_from_dict(data: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> GatewayConfig:
    """Validate an already-parsed TOML document. Raises ConfigError naming the first bad field."""
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a mapping, got {type(data).__name__}")
    wanted = {k: data[k] for k in ("gateway", "providers") if k in data}  # other tables belong to others
    wanted = _expand(wanted, "", env)
    _check_unique_names(wanted.get("providers"))
    try:
        config = GatewayConfig.model_validate(wanted)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(_field_path(err["loc"]), err["msg"]) from None
    providers = []
    for i, p in enumerate(config.providers):
        parts = urlsplit(p.base_url)
        if (parts.username or parts.password) and (
                p.api_key_env is not None or any(h.lower() == "authorization" for h in p.headers)):
            # the HTTP client refuses both at once: a ValueError on every request, not a provider failure
            raise ConfigError(f"providers[{i}].base_url", "holds credentials (user:password@) and the provider also "
                                                          "sends an Authorization header (api_key_env or headers); "
                                                          "keep one of them")
        auth = [h for h in p.headers if h.lower() == "authorization"]
        if p.api_key_env is not None and auth:
            # both are the Authorization header: the `headers` one silently replaced the key (aiohttp keeps the last)
            raise ConfigError(f"providers[{i}].headers", f"provider {p.name!r} sets both api_key_env and "
                                                         f"headers.{auth[0]}: both are its Authorization header; "
                                                         "keep one")
        if p.health_url is not None and p.scale_to_zero:
            health = urlsplit(p.health_url)
            if (health.username or health.password) and same_origin(p.health_url, p.base_url) and (
                    p.api_key_env is not None or auth):
                # the probe sends the provider's Authorization to its own origin, and the HTTP client refuses that
                # next to URL credentials: a ValueError on every probe (every request a 500), not a cold provider
                raise ConfigError(f"providers[{i}].health_url", "holds credentials (user:password@) and the health "
                                                                "probe also sends the provider's Authorization header "
                                                                "(same origin as base_url); keep one of them")
        if p.scale_to_zero and p.warm.probe_timeout_s >= config.gateway.deadline_s:
            # the request waits for the probe: a hanging health route (mid cold start) spent the whole deadline
            # there and no provider, the hosted fallback included, was tried
            raise ConfigError(f"providers[{i}].warm.probe_timeout_s",
                              f"{p.warm.probe_timeout_s} s must be less than gateway.deadline_s "
                              f"({config.gateway.deadline_s} s): a request waits for the probe before any provider "
                              "is tried")
        if not p.scale_to_zero:
            # only a scale_to_zero provider is warm-gated: without it these were ignored without a word, and a
            # fine-tune meant to be gated went first on every request, cold or not, and waited out its timeout
            for key in ("health_url", "warm"):
                if key in p.model_fields_set and getattr(p, key) is not None:
                    raise ConfigError(f"providers[{i}].{key}", f"is only used by a scale-to-zero provider: set "
                                                               f"scale_to_zero = true for {p.name!r}, or remove it")
        if p.api_key is not None:
            raise ConfigError(f"providers[{i}].api_key", "put the key in an environment variable and name it in api_key_env")
        if p.api_key_env is not None:
            key = env.get(p.api_key_env)
            if not key:
                raise ConfigError(f"providers[{i}].api_key_env",
                                  f"environment variable {p.api_key_env} is not set (API key of provider {p.name!r})")
            if _CONTROL.search(key):  # it goes into the Authorization header of every request
                raise ConfigError(f"providers[{i}].api_key_env",
                                  f"environment variable {p.api_key_env} holds a control character (a trailing "
                                  f"newline?); the API key of provider {p.name!r} must be one line")
            p = p.model_copy(update={"api_key": key})
        providers.append(p)
    return config.model_copy(update={"providers": tuple(providers)})


def unknown_tables(data: Mapping[str, Any], path: Path) -> str | None:
    """What is wrong with a TOML document's top level (None: only FILE_TABLES). Each reader took its own tables and
    dropped the rest without a word: a misspelt table ([gatway], [apps], [[provider]]) or a key above the first table
    left every setting in it at its default, found out at the first request that needed it."""
    unknown = [k for k in data if k not in FILE_TABLES]
    if not unknown:
        return None
    return (f"unknown top-level key(s) {', '.join(map(repr, unknown))} in {path} (hearth's TOML has "
            f"{', '.join(repr(t) for t in FILE_TABLES)}: [app], [gateway] and [[providers]]; a setting goes inside "
            "its table)")


def load_config(path: Path | None, env: Mapping[str, str] = os.environ) -> GatewayConfig:
    """Read and validate the gateway TOML at `path` (None: the HEARTH_GATEWAY_CONFIG variable).

    Raises ConfigError (field "config" for an unreadable or unparsable file) naming the bad field.
    """
    if path is None:
        if not env.get("HEARTH_GATEWAY_CONFIG"):
            raise ConfigError("config", "no path given and HEARTH_GATEWAY_CONFIG is not set")
        path = Path(env["HEARTH_GATEWAY_CONFIG"])
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("config", f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", f"{path} is not valid TOML: {exc}") from None
    problem = unknown_tables(data, path)
    if problem:
        raise ConfigError("config", problem)
    return config_from_dict(data, env)
