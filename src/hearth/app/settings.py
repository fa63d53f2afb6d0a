"""App settings, validated once at start-up.

Sources, later ones winning: defaults < the ``[app]`` table of the TOML file (the same file that
configures the gateway's providers) < ``HEARTH_*`` environment variables < command-line arguments.

The master key (the one secret) comes from ``HEARTH_MASTER_KEY`` or a key file
(``HEARTH_MASTER_KEY_FILE`` / ``[app] master_key_file``). In development mode, with neither set, the
key file under ``var_dir`` is read, or a new key is generated in memory (``new_dev_key_file``) and
written 0600 by start-up (hearth.app.startup) only once it has checked that the database holds no users. Outside
development a missing key, a placeholder key or a key file that was generated for development is
refused: :class:`SettingsError` (a ValueError) names the field.

Development mode is the default only when the app binds a loopback address, so ``hearth serve``
just works on a laptop and a server bound to a public interface must be configured on purpose.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretBytes, ValidationError, field_validator, model_validator

from hearth.app.companions import MAX_CONTEXT
from hearth.app.crypto import new_master_key_text, parse_master_key
from hearth.app.storage.db import make_private_dir, normalise_url
from hearth.app.throttle import Budget, Policy, parse_networks
from hearth.companion_rules import SETTING_BOUNDS
from hearth.envelope import REPLY_DEADLINE_S
from hearth.gateway.config import unknown_tables
from hearth.prompt_budget import budget_shortfall

log = logging.getLogger("hearth.app")

DEV_KEY_MARKER = "# hearth development master key: generated on first run; never use it in production"
DEFAULT_DB = "sqlite+aiosqlite:///./var/hearth.sqlite3"
FORM_BYTES_PER_CHAR = 12  # one character form-encoded, at most: 4 UTF-8 bytes, each written %XX
# a session's expiry (now + session_ttl_s) must be a date Python can hold (year 9999): a TTL past it failed every
# signup and login with an OverflowError, not start-up. A century is more than any session needs.
MAX_SESSION_TTL_S = 100 * 366 * 24 * 3600
# the throttle compares a bucket's attempts column (INTEGER: 32 bits on PostgreSQL) with the free attempts and the
# backoff tiers after them (hearth.app.throttle.Policy.delay_sql): a larger value failed every login / signup, not
# start-up. 2**30 leaves room for the tiers and for the count itself.
MAX_FREE_ATTEMPTS = 2 ** 30


def _bounded(setting: str) -> Any:
    """The Field of an integer setting whose default and bounds the corpus builder shares
    (hearth.companion_rules.SETTING_BOUNDS: default, least, most)."""
    default, least, most = SETTING_BOUNDS[setting]
    return Field(default, ge=least, le=most)


class SettingsError(ValueError):
    """A setting is missing or invalid; ``.field`` names it."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AppSettings(BaseModel):
    """Validated settings. Durations in seconds, sizes in bytes / characters."""

    # TOML has inf and nan: an infinite deadline is none, and an infinite backoff cap never ends its tiers
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    environment: Literal["development", "production"]
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    database_url: str = DEFAULT_DB
    var_dir: Path = Path("var")
    master_key: SecretBytes
    previous_master_key: SecretBytes | None = None  # set while rotating: data keys re-wrapped at start-up
    config_path: Path | None = None
    cookie_secure: bool = True
    session_ttl_s: int = Field(14 * 24 * 3600, ge=60, le=MAX_SESSION_TTL_S)
    max_body_bytes: int = Field(128 * 1024, ge=1024)  # at least what the longest text needs (below)
    # default and bounds in hearth.companion_rules.SETTING_BOUNDS (the corpus builder checks its flag against them):
    # at most the forms' own cap, FORM_TEXT_MAX
    max_text_chars: int = _bounded("max_text_chars")
    # login / signup throttling (hearth.app.throttle): free attempts, then a doubling delay up to the cap
    login_free_attempts: int = Field(5, ge=1, le=MAX_FREE_ATTEMPTS)
    login_backoff_base_s: float = Field(1.0, gt=0)
    login_backoff_max_s: float = Field(900.0, gt=0)
    login_window_s: float = Field(3600.0, gt=0)
    signup_free_attempts: int = Field(10, ge=1, le=MAX_FREE_ATTEMPTS)
    signup_backoff_base_s: float = Field(30.0, gt=0)
    signup_backoff_max_s: float = Field(3600.0, gt=0)
    signup_window_s: float = Field(3600.0, gt=0)
    # failed logins from one client address across all accounts (password spraying): a burst of this many, refilled
    # at this many per window (one every 36 s by default); 0 turns it off. Logins with the account's device cookie
    # are not counted.
    login_address_failures: int = Field(100, ge=0)
    login_address_window_s: float = Field(3600.0, gt=0)
    # reverse proxies whose X-Forwarded-For is believed (IPs or CIDR networks); default: none
    forwarded_allow_ips: list[str] = Field(default_factory=list)
    master_key_source: str = "HEARTH_MASTER_KEY"  # where the key came from, for start-up messages
    new_dev_key_file: Path | None = None  # development key generated in memory, written at start-up
    # default and bounds in hearth.companion_rules.SETTING_BOUNDS, which the corpus builder's flags are checked against
    chat_context_turns: int = _bounded("chat_context_turns")
    prompt_memories: int = _bounded("prompt_memories")
    # the most characters a chat or rehearsal request carries: its oldest earlier exchanges are left out to fit
    # (hearth.companion_rules.fit_history; the default's reasoning is at MAX_PROMPT_CHARS there). At least the largest
    # system prompt and one max_text_chars message (checked below, at start-up)
    max_prompt_chars: int = _bounded("max_prompt_chars")
    # defaults shared with the eval (hearth.envelope.REPLY_DEADLINE_S), which waits as long for each kind
    reply_deadline_s: float = Field(REPLY_DEADLINE_S["chat"], gt=0)
    analyst_timeout_s: float = Field(REPLY_DEADLINE_S["analyst"], gt=0)
    comment_timeout_s: float = Field(REPLY_DEADLINE_S["feed_comment"], gt=0)
    max_commenters: int = Field(3, ge=0, le=20)

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, url: str) -> str:
        normalise_url(url)  # ValueError naming database_url now, not a traceback from the lifespan later
        return url

    @field_validator("forwarded_allow_ips", mode="before")
    @classmethod
    def _networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if isinstance(value, list):
            parse_networks(value)
        return value

    @model_validator(mode="after")
    def _backoff_fits_the_window(self) -> "AppSettings":
        for kind in ("login", "signup"):
            base, cap, window = (getattr(self, f"{kind}_{n}") for n in ("backoff_base_s", "backoff_max_s", "window_s"))
            if not base <= cap <= window:
                raise ValueError(f"{kind}_backoff_max_s: need {kind}_backoff_base_s <= {kind}_backoff_max_s <= "
                                 f"{kind}_window_s, got {base:g}, {cap:g}, {window:g}")
        return self

    def policy(self, kind: str) -> Policy:
        return Policy(free=getattr(self, f"{kind}_free_attempts"), base_s=getattr(self, f"{kind}_backoff_base_s"),
                      max_s=getattr(self, f"{kind}_backoff_max_s"), window_s=getattr(self, f"{kind}_window_s"))

    def address_budget(self) -> Budget | None:
        """The budget of failed logins per client address, or None when it is off."""
        if self.login_address_failures == 0:
            return None
        return Budget(failures=self.login_address_failures, window_s=self.login_address_window_s)

    @model_validator(mode="after")
    def _body_holds_the_longest_text(self) -> "AppSettings":
        # a form-encoded character takes up to 12 bytes (4 UTF-8 bytes, each %XX): a smaller body limit refuses
        # text within a field's own limit (8000 characters of Chinese context) with a bare 413, the text lost
        name, chars = max((("shared_context", MAX_CONTEXT), ("max_text_chars", self.max_text_chars)),
                          key=lambda item: item[1])
        need = FORM_BYTES_PER_CHAR * chars + 1024
        if self.max_body_bytes < need:
            raise ValueError(f"max_body_bytes: must be at least {need} to carry the longest text the forms take "
                             f"({name}: {chars} characters, up to {FORM_BYTES_PER_CHAR} bytes each once "
                             f"form-encoded), got {self.max_body_bytes}")
        return self

    @model_validator(mode="after")
    def _prompt_holds_the_largest_request(self) -> "AppSettings":
        # the system prompt and the new message are never cut: a budget that cannot hold them would send requests
        # over it (the served model refusing them) from the first long message on, not fail here
        problem = budget_shortfall(prompt_memories=self.prompt_memories, max_text_chars=self.max_text_chars,
                                   max_prompt_chars=self.max_prompt_chars)
        if problem is not None:
            raise ValueError(f"max_prompt_chars: {problem}")
        return self

    @model_validator(mode="after")
    def _secure_outside_dev(self) -> "AppSettings":
        if self.environment == "production" and not self.cookie_secure:
            raise ValueError("cookie_secure: must be true outside development mode")
        return self

    @property
    def dev(self) -> bool:
        return self.environment == "development"


_ENV_FIELDS = {
    "HEARTH_ENV": "environment", "HEARTH_DATABASE_URL": "database_url", "HEARTH_VAR_DIR": "var_dir",
    "HEARTH_MAX_BODY_BYTES": "max_body_bytes", "HEARTH_SESSION_TTL_S": "session_ttl_s",
    "HEARTH_FORWARDED_ALLOW_IPS": "forwarded_allow_ips", "HEARTH_MAX_PROMPT_CHARS": "max_prompt_chars",
}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise SettingsError("config", f"file not found: {path}") from None
    except OSError as exc:  # a folder, no permission, ...
        raise SettingsError("config", f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError("config", f"{path} is not valid TOML: {exc}") from None
    problem = unknown_tables(data, path)  # [apps] or a setting above [app]: the app ran on the defaults
    if problem:
        raise SettingsError("config", problem)
    app = data.get("app", {})
    if not isinstance(app, dict):
        raise SettingsError("app", "must be a table ([app])")
    return dict(app)


def _load_key_text(text: str, field: str, *, dev: bool) -> bytes:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    generated_for_dev = DEV_KEY_MARKER in lines
    if generated_for_dev and not dev:
        raise SettingsError(field, "is the generated development key; set a real key outside development")
    body = [ln for ln in lines if not ln.startswith("#")]
    if len(body) != 1:
        raise SettingsError(field, "expected exactly one key line")
    try:
        return parse_master_key(body[0])
    except ValueError as exc:
        raise SettingsError(field, str(exc).split(": ", 1)[-1]) from None


def _read_key_file(path: Path, field: str, *, dev: bool) -> bytes:
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except FileNotFoundError:
        raise SettingsError(field, f"key file not found: {path}") from None
    except OSError as exc:  # a folder, no permission, ...
        raise SettingsError(field, f"cannot read key file {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SettingsError(field, f"{path} is readable by group/others; chmod 600 it")
    return _load_key_text(text, field, dev=dev)


def _dev_key(var_dir: Path) -> tuple[bytes, Path | None]:
    """The development key: read from ``var_dir/master.key``, or, when that file does not exist, a new
    key held in memory and returned with the path it is to be written to. The file is written by
    :func:`write_new_dev_key` only once start-up has checked that the database holds no users (a new
    key could not decrypt them)."""
    path = var_dir / "master.key"
    if path.exists():
        return _read_key_file(path, "master_key_file", dev=True), None
    return parse_master_key(new_master_key_text()), path


def write_new_dev_key(settings: "AppSettings") -> None:
    """Write the pending development key (settings.new_dev_key_file), folder 0700 and file 0600."""
    path = settings.new_dev_key_file
    if path is None:
        return
    try:
        make_private_dir(path.parent)
    except OSError as exc:  # a file where the folder would be, no permission, ...: not a traceback
        raise SettingsError("var_dir", f"cannot create {path.parent} for the development master key: "
                                       f"{exc.strerror or exc}") from None
    # O_EXCL + mode 0600 at creation: never a moment where the key is world-readable
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if _read_key_file(path, "master_key_file", dev=True) == settings.master_key.get_secret_value():
            return  # written by this app's own earlier start-up step (hearth serve's pre-flight)
        raise SettingsError("master_key_file", f"{path} was created by another process meanwhile; start again") from None
    except OSError as exc:  # a file where the folder would be, no permission, ...: not a traceback
        raise SettingsError("var_dir", f"cannot write the development master key {path}: {exc.strerror or exc}") from None
    key = base64.urlsafe_b64encode(settings.master_key.get_secret_value()).decode().rstrip("=")
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{DEV_KEY_MARKER}\n{key}\n")
    log.warning("created a development master key at %s (0600). Back it up: without it the data cannot be "
                "decrypted. Outside development set HEARTH_MASTER_KEY or [app] master_key_file.", path)
    print(f"hearth: created development master key {path} (mode 0600)", flush=True)


def _path(value: Any, field: str) -> Path:
    """A path setting; SettingsError naming ``field`` when the TOML gave another type (var_dir = 5)."""
    if not isinstance(value, (str, os.PathLike)):
        raise SettingsError(field, f"must be a path (text), got {type(value).__name__}")
    return Path(value)


def load_settings(config: Path | None = None, *, database_url: str | None = None, host: str | None = None,
                  port: int | None = None, env: Mapping[str, str] | None = None,
                  overrides: Mapping[str, Any] | None = None) -> AppSettings:
    """Merge the sources (see module docstring) and validate; SettingsError names the bad field."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = _read_toml(config) if config is not None else {}
    for var, field in _ENV_FIELDS.items():
        if env.get(var):
            raw[field] = env[var]
    if database_url is not None:
        raw["database_url"] = database_url
    if host is not None:
        raw["host"] = host
    if port is not None:
        raw["port"] = port
    raw.update(overrides or {})
    raw["config_path"] = config
    # an empty --database-url (`--database-url "$DATABASE_URL"` with the variable unset) is a mistake, not the
    # default: it was dropped and the app ran on a new SQLite file. (An empty host is uvicorn's every interface,
    # docs/app.md.)
    if isinstance(raw.get("database_url"), str) and not raw["database_url"].strip():
        raise SettingsError("database_url", "is empty: give a SQLite or PostgreSQL URL, or leave it out for the "
                                            "SQLite file under var_dir")

    host_ = str(raw.get("host", "127.0.0.1"))
    raw.setdefault("environment", "development" if is_loopback(host_) else "production")
    # checked before the key: an unknown value ("dev") counted as production, and the error was "master_key: missing
    # outside development mode", naming the wrong setting
    if raw["environment"] not in ("development", "production"):
        raise SettingsError("environment", f"must be 'development' or 'production', got {raw['environment']!r}")
    dev = raw["environment"] == "development"
    raw.setdefault("cookie_secure", not (dev and is_loopback(host_)))
    var_dir = _path(raw.get("var_dir", "var"), "var_dir")
    raw.setdefault("database_url", f"sqlite+aiosqlite:///{var_dir / 'hearth.sqlite3'}")

    # the variable wins over the TOML, as every HEARTH_* setting does (it was the other way round, silently)
    toml_key_file = raw.pop("master_key_file", None)
    key_file = env.get("HEARTH_MASTER_KEY_FILE") or toml_key_file
    if "master_key" in raw:
        raise SettingsError("master_key", "do not put the key in the TOML file; use HEARTH_MASTER_KEY or master_key_file")
    if "previous_master_key" in raw:  # it would be taken unparsed: the key's text as its bytes
        raise SettingsError("previous_master_key", "do not put the key in the TOML file; use HEARTH_PREVIOUS_MASTER_KEY")
    for internal in ("master_key_source", "new_dev_key_file"):
        if internal in raw:
            raise SettingsError(internal, "is set by hearth itself, not in the TOML file")
    if env.get("HEARTH_MASTER_KEY"):
        key = _load_key_text(env["HEARTH_MASTER_KEY"], "HEARTH_MASTER_KEY", dev=dev)
        raw["master_key_source"] = "HEARTH_MASTER_KEY"
    elif key_file:
        key = _read_key_file(_path(key_file, "master_key_file"), "master_key_file", dev=dev)
        raw["master_key_source"] = f"master_key_file {key_file}"
    elif dev:
        key, raw["new_dev_key_file"] = _dev_key(var_dir)
        raw["master_key_source"] = f"development key file {var_dir / 'master.key'}"
    else:
        raise SettingsError("master_key", "missing outside development mode; set HEARTH_MASTER_KEY or [app] master_key_file")
    raw["master_key"] = key
    if env.get("HEARTH_PREVIOUS_MASTER_KEY"):
        raw["previous_master_key"] = _load_key_text(env["HEARTH_PREVIOUS_MASTER_KEY"], "HEARTH_PREVIOUS_MASTER_KEY", dev=dev)
        if raw["previous_master_key"] == key:  # rotation would refuse it later, from inside the lifespan
            raise SettingsError("HEARTH_PREVIOUS_MASTER_KEY",
                                "is the same key as the master key; unset it or set the new key")
    try:
        return AppSettings.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "app"
        msg = first["msg"]
        if first["type"] == "value_error" and ": " in msg:  # our own validator already named the field
            field, msg = msg.removeprefix("Value error, ").split(": ", 1)
        raise SettingsError(field, msg) from None
