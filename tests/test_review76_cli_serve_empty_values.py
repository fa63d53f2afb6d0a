"""Review 76 (CLI): `hearth serve` refuses an empty --database-url naming it, exit 2.

An empty value is what `hearth serve --database-url "$DATABASE_URL"` passes when the variable is unset. It was
dropped as if the option had not been given: the app started on a new SQLite file under ./var/ (an empty database,
every account missing; what users wrote went there, not to the PostgreSQL meant). It is now a configuration error
naming database_url, before anything is created or served. (An empty --host stays uvicorn's every interface, as
docs/app.md says.)
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hearth.app.crypto import new_master_key_text
from hearth.app.settings import SettingsError, load_settings
from hearth.cli import app


def _no_serving(monkeypatch):
    import hearth.app.main as app_main

    def served(*a, **k):  # the command must stop before serving
        raise AssertionError("served")

    monkeypatch.setattr(app_main, "_run_one", served)
    monkeypatch.setattr(app_main, "_run_workers", served)


@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
@pytest.mark.parametrize("key", [True, False], ids=["with-key", "no-key"])
def test_an_empty_database_url_is_a_configuration_error_naming_it(tmp_path, monkeypatch, value, key):
    _no_serving(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HEARTH_MASTER_KEY", raising=False)
    if key:
        monkeypatch.setenv("HEARTH_MASTER_KEY", new_master_key_text())
    result = CliRunner().invoke(app, ["serve", "--port", "0", "--database-url", value])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "configuration error: database_url: " in result.output, result.output
    assert "serving on" not in result.output
    assert not (tmp_path / "var").exists()  # no database, no development key


def test_an_empty_database_url_in_the_toml_is_refused_naming_it(tmp_path):
    config = tmp_path / "hearth.toml"
    config.write_text('[app]\ndatabase_url = ""\n')
    with pytest.raises(SettingsError, match=r"^database_url: is empty"):
        load_settings(config, env={"HEARTH_MASTER_KEY": new_master_key_text()})


def test_given_values_still_win(tmp_path):
    env = {"HEARTH_MASTER_KEY": new_master_key_text()}
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.sqlite3'}"
    assert load_settings(None, database_url=url, env=env).database_url == url
    assert load_settings(None, env=env, overrides={"var_dir": str(tmp_path / "var")}).database_url.startswith("sqlite")
    assert load_settings(None, host="", env=env).host == ""  # every interface (docs/app.md), not refused
