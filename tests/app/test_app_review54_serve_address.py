"""`hearth serve` listens where the settings say: the TOML's [app] host / port unless --host / --port are given.
Before, the options' defaults (127.0.0.1, 8000) always won, so a TOML [app] port was validated and then ignored."""

from __future__ import annotations

import socket

import pytest

from hearth.app import main
from hearth.app.crypto import new_master_key_text


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve_env(tmp_path, monkeypatch):
    for var in ("HEARTH_ENV", "HEARTH_DATABASE_URL", "HEARTH_VAR_DIR", "HEARTH_MASTER_KEY_FILE",
                "HEARTH_PREVIOUS_MASTER_KEY", main.SERVE_ARGS_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HEARTH_MASTER_KEY", new_master_key_text())
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr(main, "_run_one", lambda server: ran.append((server.config.host, server.config.port)) or 0)
    return tmp_path, ran


def test_serve_listens_on_the_toml_port_and_the_options_override_it(serve_env, capsys):
    tmp_path, ran = serve_env
    toml_port, option_port = _free_port(), _free_port()
    config = tmp_path / "hearth.toml"
    config.write_text(f'[app]\nhost = "127.0.0.1"\nport = {toml_port}\n')
    database = f"sqlite+aiosqlite:///{tmp_path / 'h.sqlite3'}"
    assert main.serve(config=config, database_url=database) == 0
    assert f"serving on http://127.0.0.1:{toml_port}/" in capsys.readouterr().out
    assert main.serve(config=config, database_url=database, port=option_port) == 0
    assert ran == [("127.0.0.1", toml_port), ("127.0.0.1", option_port)]

