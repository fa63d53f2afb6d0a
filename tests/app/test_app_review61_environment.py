"""Review 61: an environment that is neither "development" nor "production" is refused naming environment.

HEARTH_ENV=dev (or "Development", or ``[app] environment = "dev"``) without a master key was answered "master_key:
missing outside development mode": the unknown value counted as production before it was validated, so the error
named the wrong setting and told someone who had asked for development that they were outside it. The value is now
checked first, and the error names environment and the two values it takes."""

from __future__ import annotations

import pytest

from hearth.app.settings import SettingsError, load_settings


@pytest.mark.parametrize("value", ["dev", "Development", "prod"])
def test_an_unknown_environment_is_named_not_the_master_key(tmp_path, value):
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={"HEARTH_ENV": value}, overrides={"var_dir": str(tmp_path / "var")})
    assert info.value.field == "environment", str(info.value)
    assert "development" in info.value.reason and "production" in info.value.reason and repr(value) in info.value.reason
    assert not (tmp_path / "var").exists()


def test_an_unknown_environment_in_the_toml_is_named_too(tmp_path):
    cfg = tmp_path / "hearth.toml"
    cfg.write_text('[app]\nenvironment = "dev"\n')
    with pytest.raises(SettingsError) as info:
        load_settings(cfg, env={}, overrides={"var_dir": str(tmp_path / "var")})
    assert info.value.field == "environment", str(info.value)


def test_the_two_environments_still_load(tmp_path, master_key_text):
    dev = load_settings(None, env={"HEARTH_ENV": "development"}, overrides={"var_dir": str(tmp_path / "var")})
    assert dev.dev
    prod = load_settings(None, env={"HEARTH_ENV": "production", "HEARTH_MASTER_KEY": master_key_text},
                         overrides={"var_dir": str(tmp_path / "var")})
    assert not prod.dev
