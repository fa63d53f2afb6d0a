"""Review 74: HEARTH_MASTER_KEY_FILE wins over the TOML's [app] master_key_file, as every HEARTH_* variable wins over
the TOML (hearth.app.settings: defaults < [app] < HEARTH_* < command line).

The TOML's key file was taken whenever it was set and the variable silently ignored: an operator pointing
HEARTH_MASTER_KEY_FILE at the key they keep (and back up) ran the app under the TOML's other key, new users' data
keys wrapped under a key they did not mean to use."""

from __future__ import annotations

from hearth.app.crypto import master_key_id, new_master_key_text, parse_master_key
from hearth.app.settings import load_settings


def _key_file(path, text):
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def test_the_environment_key_file_wins_over_the_toml(tmp_path):
    toml_key, env_key = new_master_key_text(), new_master_key_text()
    toml_file, env_file = _key_file(tmp_path / "toml.key", toml_key), _key_file(tmp_path / "env.key", env_key)
    cfg = tmp_path / "hearth.toml"
    cfg.write_text(f'[app]\nmaster_key_file = "{toml_file}"\n')
    settings = load_settings(cfg, env={"HEARTH_ENV": "production", "HEARTH_MASTER_KEY_FILE": str(env_file)},
                             overrides={"var_dir": str(tmp_path / "var")})
    assert master_key_id(settings.master_key.get_secret_value()) == master_key_id(parse_master_key(env_key))
    assert str(env_file) in settings.master_key_source


def test_the_toml_key_file_is_still_taken_without_the_variable(tmp_path):
    toml_key = new_master_key_text()
    toml_file = _key_file(tmp_path / "toml.key", toml_key)
    cfg = tmp_path / "hearth.toml"
    cfg.write_text(f'[app]\nmaster_key_file = "{toml_file}"\n')
    settings = load_settings(cfg, env={"HEARTH_ENV": "production"}, overrides={"var_dir": str(tmp_path / "var")})
    assert settings.master_key.get_secret_value() == parse_master_key(toml_key)
