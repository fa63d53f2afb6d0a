"""Review 53: an in-memory SQLite ``database_url`` (``sqlite://``, ``sqlite:///:memory:``, a ``mode=memory`` URI) was
accepted. ``hearth serve`` ran its start-up check (migrations) on one such database, threw it away, printed "serving
on ..." and answered every request with a 500 ("no such table"); had it worked, every account would have gone with
the next restart. Now start-up refuses it, naming ``database_url``. Each test failed before the fix."""

from __future__ import annotations

import pytest

from hearth.app.settings import SettingsError
from hearth.app.storage.db import normalise_url


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+aiosqlite:///:memory:",
                                 "sqlite:///file:hearth?mode=memory&uri=true", "sqlite:///file::memory:?uri=true"])
def test_an_in_memory_sqlite_database_is_refused_at_start_up(make_settings, url):
    with pytest.raises(SettingsError) as caught:
        make_settings(url)
    assert caught.value.field == "database_url"
    assert "memory" in caught.value.reason


@pytest.mark.timeout(60)  # before: it served (every request a 500) until stopped
def test_serve_refuses_an_in_memory_database_before_it_serves(tmp_path, capsys, monkeypatch):
    from hearth.app.main import serve

    monkeypatch.setenv("HEARTH_MASTER_KEY", "")
    monkeypatch.chdir(tmp_path)
    assert serve(database_url="sqlite:///:memory:", port=0) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "database_url" in err


def test_a_sqlite_file_is_still_taken(make_settings, tmp_path):
    settings = make_settings(f"sqlite:///{tmp_path / 'memory.sqlite3'}")  # "memory" in a file's name is a file
    assert settings.database_url.endswith("memory.sqlite3")


@pytest.mark.parametrize("url", ["postgresql://bob:s3cret-pw@db:notaport/x", "postgres ql://bob:s3cret-pw@db/x",
                                 "postgresql://bob:s3cret@pw:w0rd@db:port/x"])
def test_an_unparsable_database_url_is_refused_without_its_password(url):
    # the start-up error goes to the console and the logs; it quoted the whole URL, password and all (and a
    # password with an unencoded @ broke the parse, and the parser's reason quoted a piece of it)
    with pytest.raises(ValueError, match="database_url") as err:
        normalise_url(url)
    assert "s3cret" not in str(err.value) and "w0rd" not in str(err.value) and "***" in str(err.value), str(err.value)


def test_an_unparsable_database_url_without_a_password_keeps_the_reason():
    with pytest.raises(ValueError, match="database_url: cannot parse 'postgresql://db:notaport/x': invalid literal"):
        normalise_url("postgresql://db:notaport/x")
