"""Review 74: a SQLite file or a development key that cannot be written is a configuration error naming the setting.

A SQLite ``database_url`` whose folder cannot be created (a file stands where the folder would be, no permission, a
read-only file system) made ``hearth serve`` end in a NotADirectoryError / PermissionError traceback from
``create_database`` (the SQLite file is created 0600 before SQLite opens it), exit 1; and in development a
``var_dir`` where the new development key cannot be written ended the same way, AFTER the migrations had run. Both
are now one line naming the setting (database_url, var_dir), exit 2, as a database that cannot be reached is."""

from __future__ import annotations

import pytest

from hearth.app.main import serve
from hearth.app.storage import create_database


def test_create_database_names_database_url_when_the_sqlite_folder_cannot_be_made(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError) as caught:
        create_database(f"sqlite:///{tmp_path / 'afile' / 'hearth.sqlite3'}")
    assert str(caught.value).startswith("database_url: "), str(caught.value)
    assert "afile" in str(caught.value)


@pytest.mark.timeout(60)
def test_serve_refuses_a_sqlite_file_it_cannot_create_in_one_line(serve_env, capsys):
    (serve_env / "afile").write_text("x")
    assert serve(database_url=f"sqlite:///{serve_env / 'afile' / 'hearth.sqlite3'}", port=0) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "database_url" in err and "Traceback" not in err


@pytest.mark.timeout(60)
def test_serve_refuses_a_var_dir_where_the_development_key_cannot_be_written(serve_env, capsys, monkeypatch):
    monkeypatch.delenv("HEARTH_MASTER_KEY")  # development: a new key is to be written under var_dir
    (serve_env / "afile").write_text("x")
    monkeypatch.setenv("HEARTH_VAR_DIR", str(serve_env / "afile" / "var"))
    assert serve(database_url=f"sqlite:///{serve_env / 'db' / 'hearth.sqlite3'}", port=0) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "var_dir" in err and "Traceback" not in err
