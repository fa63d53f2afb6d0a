"""`hearth serve` listens where the settings say: the TOML's [app] host / port unless --host / --port are given.
Before, the options' defaults (127.0.0.1, 8000) always won, so a TOML [app] port was validated and then ignored."""

from __future__ import annotations

import socket

from hearth.app import main


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_listens_on_the_toml_port_and_the_options_override_it(serve_env, monkeypatch, capsys):
    tmp_path, ran = serve_env, []
    monkeypatch.setattr(main, "_run_one", lambda server: ran.append((server.config.host, server.config.port)) or 0)
    toml_port, option_port = _free_port(), _free_port()
    config = tmp_path / "hearth.toml"
    config.write_text(f'[app]\nhost = "127.0.0.1"\nport = {toml_port}\n')
    database = f"sqlite+aiosqlite:///{tmp_path / 'h.sqlite3'}"
    assert main.serve(config=config, database_url=database) == 0
    assert f"serving on http://127.0.0.1:{toml_port}/" in capsys.readouterr().out
    assert main.serve(config=config, database_url=database, port=option_port) == 0
    assert ran == [("127.0.0.1", toml_port), ("127.0.0.1", option_port)]

