"""Review 76, `hearth export`: a base folder without a tokenizer (and no --tokenizer) is known before the base model
is loaded, but the command said so only in its last line, after loading and merging (minutes for a 14B model),
with nothing shown meanwhile. Now the note comes first, and each stage (load, merge, write) shows as it starts."""

from __future__ import annotations

import pytest

from tests.train.exporting import export

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def test_the_no_tokenizer_note_comes_before_the_base_model_is_loaded(tmp_path, export_parts, monkeypatch):
    _, bare, adapter = export_parts
    seen: list[str] = []
    real = transformers.AutoModelForCausalLM.from_pretrained
    import hearth.train.export as ex

    real_say_target = ex.export

    def spying_export(*a, say=None, **k):
        def spy(text, stage):
            seen.append(("stage: " if stage else "note: ") + text)
            say(text, stage)
        return real_say_target(*a, say=spy, **k)

    def load(*a, **k):
        seen.append("load")
        return real(*a, **k)

    monkeypatch.setattr(ex, "export", spying_export)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    result = export("--adapter", adapter, "--model", bare, "--out", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    notes = [i for i, s in enumerate(seen) if s.startswith("note: no tokenizer found")]
    assert notes and notes[0] < seen.index("load"), seen
    assert [s.split(" ")[1] for s in seen if s.startswith("stage: ")] == ["loading", "merging", "writing"], seen
    assert "note:" in result.output and "no tokenizer found" in result.output.split("merged ")[0]
