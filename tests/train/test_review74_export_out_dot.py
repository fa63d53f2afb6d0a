"""Review 74, `hearth export --out .` (or an OUT ending in ..): the merged model is written there.

export builds the merged folder beside OUT under OUT's name (``out.with_name(".NAME.export-tmp")``). Path(".") has
no name: after every argument check passed, the base model loaded and the adapter merged (minutes for a 14B model),
with_name raised "PosixPath('.') has an empty name", printed as an argument error, exit 2, naming no argument and
writing nothing. ``--out ..`` put its temporary folder in the current folder, inside OUT itself.
"""

from __future__ import annotations

import json

import pytest

from tests.train.exporting import export

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


def test_out_dot_in_an_empty_folder_writes_the_export_there(tmp_path, export_parts, monkeypatch):
    _, bare, adapter = export_parts
    here = tmp_path / "merged"
    here.mkdir()
    monkeypatch.chdir(here)
    result = export("--adapter", adapter, "--model", bare, "--out", ".")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "merged" / "export.json").read_text())["dtype"] == "bfloat16"
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no temporary left beside it


def test_out_dotdot_writes_the_export_into_the_parent(tmp_path, export_parts, monkeypatch):
    _, bare, adapter = export_parts
    parent = tmp_path / "merged"
    (parent / "sub").mkdir(parents=True)
    # a re-export: the parent holds an earlier export (and the folder the command runs in)
    (parent / "export.json").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    result = export("--adapter", adapter, "--model", bare, "--out", "merged/sub/..")
    assert result.exit_code == 0, result.output
    assert json.loads((parent / "export.json").read_text())["dtype"] == "bfloat16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]
