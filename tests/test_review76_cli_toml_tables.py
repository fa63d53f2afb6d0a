"""Review 76 (CLI): a top-level table or key of the TOML file that is none of hearth's is refused at start-up.

`hearth serve --config` and `hearth gateway --config` read one file: [app] (hearth.app.settings), [gateway] and
[[providers]] (hearth.gateway.config). Each read its own tables and ignored every other top-level key, so a misspelt
table ([gatway], [apps], [[provider]]) or a key written above the first table was dropped without a word and the
process ran on the defaults: `hearth gateway` with `[gatway] deadline_s = 5` served with the 30 s deadline, `hearth
serve` with `[apps] reply_deadline_s = 120` waited 60 s per reply, found out at the first slow request. Both now refuse
the file naming config and the key, exit 2, before anything is served.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hearth.app.crypto import new_master_key_text
from hearth.app.settings import SettingsError, load_settings
from hearth.cli import app
from hearth.gateway.config import ConfigError, load_config

PROVIDER = '[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'


def _no_serving(monkeypatch):
    import hearth.app.main as app_main
    import hearth.gateway.server as server

    def served(*a, **k):  # the command must stop before serving
        raise AssertionError("served")

    monkeypatch.setattr(server, "_serve", served)
    monkeypatch.setattr(server, "_supervise", served)
    monkeypatch.setattr(app_main, "_run_one", served)
    monkeypatch.setattr(app_main, "_run_workers", served)


@pytest.mark.parametrize("text, key", [
    ("[gatway]\ndeadline_s = 5\n" + PROVIDER, "gatway"),
    ("deadline_s = 5\n" + PROVIDER, "deadline_s"),
    ('[apps]\nreply_deadline_s = 120\n' + PROVIDER, "apps"),
])
def test_hearth_gateway_refuses_a_top_level_key_that_is_not_hearths(tmp_path, monkeypatch, text, key):
    _no_serving(monkeypatch)
    config = tmp_path / "gw.toml"
    config.write_text(text)
    result = CliRunner().invoke(app, ["gateway", "--config", str(config), "--port", "0"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "config" in result.output and repr(key) in result.output, result.output


@pytest.mark.parametrize("text, key", [
    ("[apps]\nreply_deadline_s = 120\n", "apps"),
    ("[gatway]\ndeadline_s = 5\n" + PROVIDER, "gatway"),
    ("[[provider]]\nname = 'a'\nbase_url = 'http://127.0.0.1:9/v1'\nmodel = 'm'\n", "provider"),
    ('reply_deadline_s = 120\n[app]\nenvironment = "development"\n', "reply_deadline_s"),
])
def test_hearth_serve_refuses_a_top_level_key_that_is_not_hearths(tmp_path, monkeypatch, text, key):
    _no_serving(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HEARTH_MASTER_KEY", new_master_key_text())
    (tmp_path / "hearth.toml").write_text(text)
    result = CliRunner().invoke(app, ["serve", "--config", "hearth.toml", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "configuration error: config" in result.output and repr(key) in result.output, result.output
    assert "serving on" not in result.output
    assert not (tmp_path / "var").exists()  # no database created for a start that cannot run


def test_the_known_tables_and_a_shared_file_still_load(tmp_path):
    config = tmp_path / "hearth.toml"
    config.write_text('[app]\nreply_deadline_s = 90\n[gateway]\ndeadline_s = 5\n' + PROVIDER)
    assert load_settings(config, env={"HEARTH_MASTER_KEY": new_master_key_text()}).reply_deadline_s == 90
    assert load_config(config, env={}).gateway.deadline_s == 5


def test_the_loaders_name_config(tmp_path):
    config = tmp_path / "hearth.toml"
    config.write_text("[apps]\nport = 9000\n" + PROVIDER)
    with pytest.raises(SettingsError, match=r"^config: .*'apps'"):
        load_settings(config, env={"HEARTH_MASTER_KEY": new_master_key_text()})
    with pytest.raises(ConfigError, match=r"^config: .*'apps'"):
        load_config(config, env={})
