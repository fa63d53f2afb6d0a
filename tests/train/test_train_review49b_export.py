"""Review 49b, `hearth export`: the tokenizer written beside the merged weights must be one a server can use, and OUT
is replaced whole or not at all (a failed export keeps the previous one; no stale file of it survives)."""

from __future__ import annotations

import json

import pytest

from tests.train.exporting import export, snapshot

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def test_a_base_folder_without_a_tokenizer_exports_no_tokenizer(tmp_path, export_parts):
    """transformers 5 loads a model folder with no tokenizer files as an EMPTY tokenizer (every text -> no tokens): it
    was saved into the merged folder, export.json named the base as its source and the command said "with the
    tokenizer", so `vllm serve` / `transformers serve` of that folder tokenized every prompt to nothing."""
    _, bare, adapter = export_parts
    out = tmp_path / "merged"
    result = export("--adapter", adapter, "--model", bare, "--out", out)
    assert result.exit_code == 0, result.output
    assert "no tokenizer found" in result.output
    assert not (out / "tokenizer.json").exists() and not (out / "tokenizer_config.json").exists()
    assert json.loads((out / "export.json").read_text())["tokenizer"] is None


def test_a_tokenizer_folder_without_a_tokenizer_exits_2_before_the_merge(tmp_path, export_parts, monkeypatch):
    _, bare, adapter = export_parts

    def no_load(*a, **k):
        raise AssertionError("the base model was loaded before the argument error")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    out = tmp_path / "merged"
    result = export("--adapter", adapter, "--model", bare, "--out", out, "--tokenizer", bare)
    assert result.exit_code == 2 and "tokenizer:" in result.output, result.output
    assert not out.exists()


def test_a_failed_re_export_leaves_the_previous_export_whole(tmp_path, export_parts, monkeypatch):
    """A re-export into the same --out wrote file by file over the previous export: a failure while saving (a full
    disk) left new config, half-written weights and the OLD export.json describing something else."""
    tok_dir, bare, adapter = export_parts
    out = tmp_path / "merged"
    assert export("--adapter", adapter, "--model", bare, "--out", out, "--tokenizer", tok_dir).exit_code == 0
    before = snapshot(out)
    real = transformers.PreTrainedModel.save_pretrained

    def full_disk(self, path, *a, **k):
        real(self, path, *a, **k)
        with open(f"{path}/model.safetensors", "r+b") as fh:  # half of the weights made it
            fh.truncate(100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full_disk)
    result = export("--adapter", adapter, "--model", bare, "--out", out, "--dtype", "float16", "--tokenizer", tok_dir)
    assert result.exit_code == 1 and "No space left" in result.output, result.output
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # nothing half-written left beside it


def test_a_re_export_keeps_no_file_of_the_previous_one(tmp_path, export_parts):
    """The previous export's tokenizer (and e.g. a shard index of a larger earlier export, which loaders follow) stayed
    in --out under an export.json that said there was no tokenizer."""
    tok_dir, bare, adapter = export_parts
    out = tmp_path / "merged"
    assert export("--adapter", adapter, "--model", bare, "--out", out, "--tokenizer", tok_dir).exit_code == 0
    (out / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    assert (out / "tokenizer.json").is_file()
    assert export("--adapter", adapter, "--model", bare, "--out", out).exit_code == 0
    assert not (out / "tokenizer.json").exists() and not (out / "model.safetensors.index.json").exists()
    assert json.loads((out / "export.json").read_text())["tokenizer"] is None


def test_a_folder_that_is_not_an_export_is_not_written_into(tmp_path, export_parts):
    """--out models/ (the parent of the model folders, by mistake) used to get config.json, model.safetensors and a
    tokenizer written among what it held."""
    _, bare, adapter = export_parts
    out = tmp_path / "models"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = export("--adapter", adapter, "--model", bare, "--out", out)
    assert result.exit_code == 2 and "out:" in result.output, result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
