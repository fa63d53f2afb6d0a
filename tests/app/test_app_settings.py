"""Settings validated at start-up: errors name the field; no default or missing secret outside
development; the development key file is created 0600 and announced."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from hearth.app.crypto import new_master_key_text
from hearth.app.settings import DEV_KEY_MARKER, SettingsError, load_settings, write_new_dev_key


def test_development_creates_a_private_key_file_once(tmp_path, caplog):
    first = load_settings(None, env={}, overrides={"var_dir": str(tmp_path / "var")})
    key_file = tmp_path / "var" / "master.key"
    # held in memory until start-up has checked that no users exist (hearth.app.startup), then written
    assert first.new_dev_key_file == key_file and not key_file.exists()
    with caplog.at_level(logging.WARNING, logger="hearth.app"):
        write_new_dev_key(first)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert DEV_KEY_MARKER in key_file.read_text()
    assert "created a development master key" in caplog.text and str(key_file) in caplog.text
    second = load_settings(None, env={}, overrides={"var_dir": str(tmp_path / "var")})
    assert first.master_key.get_secret_value() == second.master_key.get_secret_value()
    assert first.environment == "development" and first.cookie_secure is False


def test_production_refuses_a_missing_key(tmp_path):
    with pytest.raises(SettingsError) as info:
        load_settings(None, host="0.0.0.0", env={}, overrides={"var_dir": str(tmp_path)})
    assert info.value.field == "master_key"
    assert not (tmp_path / "master.key").exists()


def test_production_refuses_the_generated_development_key(tmp_path):
    write_new_dev_key(load_settings(None, env={}, overrides={"var_dir": str(tmp_path)}))  # creates the dev key
    with pytest.raises(SettingsError, match="generated development key") as info:
        load_settings(None, env={"HEARTH_ENV": "production", "HEARTH_MASTER_KEY_FILE": str(tmp_path / "master.key")})
    assert info.value.field == "master_key_file"


@pytest.mark.parametrize("key,reason", [("00" * 32, "placeholder"), ("change-me", "bytes"), ("ab" * 10, "bytes")])
def test_placeholder_or_malformed_keys_are_refused(key, reason):
    with pytest.raises(SettingsError, match=reason) as info:
        load_settings(None, env={"HEARTH_MASTER_KEY": key, "HEARTH_ENV": "production"})
    assert info.value.field == "HEARTH_MASTER_KEY"


def test_key_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "k"
    path.write_text(new_master_key_text())
    os.chmod(path, 0o644)
    with pytest.raises(SettingsError, match="chmod 600"):
        load_settings(None, env={"HEARTH_MASTER_KEY_FILE": str(path), "HEARTH_ENV": "production"})


def test_toml_env_and_arguments_merge_and_bad_values_name_the_field(tmp_path):
    cfg = tmp_path / "hearth.toml"
    cfg.write_text('[app]\nmax_text_chars = 500\ndatabase_url = "sqlite:///from-toml.db"\n'
                   '[[providers]]\nname = "x"\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\n')
    env = {"HEARTH_MASTER_KEY": new_master_key_text()}
    s = load_settings(cfg, env=env, port=9001)
    assert (s.max_text_chars, s.port, s.database_url, s.config_path) == (500, 9001, "sqlite:///from-toml.db", cfg)
    s = load_settings(cfg, env={**env, "HEARTH_DATABASE_URL": "sqlite:///env.db"}, database_url="sqlite:///arg.db")
    assert s.database_url == "sqlite:///arg.db"
    with pytest.raises(SettingsError) as info:
        load_settings(cfg, env=env, port=70000)
    assert info.value.field == "port"
    cfg.write_text("[app]\nmax_text_char = 5\n")
    with pytest.raises(SettingsError) as info:
        load_settings(cfg, env=env)
    assert info.value.field == "max_text_char"
    cfg.write_text('[app]\nmaster_key = "abc"\n')
    with pytest.raises(SettingsError) as info:
        load_settings(cfg, env=env)
    assert info.value.field == "master_key"
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={**env, "HEARTH_ENV": "production"}, overrides={"cookie_secure": False})
    assert info.value.field == "cookie_secure"


@pytest.mark.parametrize("url", ["mysql://u@h/db", "not a url at all"])
def test_a_bad_database_url_is_refused_at_start_up_naming_the_field(tmp_path, url):
    env = {"HEARTH_MASTER_KEY": new_master_key_text()}
    with pytest.raises(SettingsError) as info:
        load_settings(None, env=env, database_url=url, overrides={"var_dir": str(tmp_path / "var")})
    assert info.value.field == "database_url"


def test_a_previous_master_key_equal_to_the_current_one_is_refused_naming_the_field(tmp_path):
    key = new_master_key_text()
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={"HEARTH_MASTER_KEY": key, "HEARTH_PREVIOUS_MASTER_KEY": key},
                      overrides={"var_dir": str(tmp_path / "var")})
    assert info.value.field == "HEARTH_PREVIOUS_MASTER_KEY"


def test_a_previous_master_key_in_the_toml_is_refused_naming_the_field(tmp_path):
    # it was taken as it stood: the key's text as raw bytes (43 of them for the base64 a key is written in), a
    # secret kept in the TOML file that the master key may not be in; the start then failed inside the
    # start-up check, from the rotation, naming master_key
    cfg = tmp_path / "hearth.toml"
    cfg.write_text(f'[app]\nprevious_master_key = "{new_master_key_text()}"\n')
    with pytest.raises(SettingsError) as info:
        load_settings(cfg, env={"HEARTH_MASTER_KEY": new_master_key_text()},
                      overrides={"var_dir": str(tmp_path / "var")})
    assert info.value.field == "previous_master_key"
    assert "HEARTH_PREVIOUS_MASTER_KEY" in info.value.reason
