"""Review 73, `hearth export --out` under a file: refused before the base model loads, exit 2 naming out.

export checked that OUT itself was not a file, but not the folders on the way to it: `--out weights.bin/merged`
loaded the base model, applied and merged the adapter (minutes for a 14B model), and only then failed to create
OUT's parent: 'error: FileExistsError: [Errno 17] File exists: ...', exit 1, naming no argument.
"""

from __future__ import annotations

import pytest

from tests.train.exporting import export

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


@pytest.mark.parametrize("depth", [1, 2])
def test_an_out_under_a_file_exits_2_naming_out_before_the_model_loads(tmp_path, export_parts, monkeypatch, depth):
    _, bare, adapter = export_parts

    def no_load(*a, **k):
        raise AssertionError("the base model was loaded before the argument error")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    blocker = tmp_path / "weights.bin"
    blocker.write_text("mine\n")
    out = blocker / "merged" if depth == 1 else blocker / "a" / "merged"
    result = export("--adapter", adapter, "--model", bare, "--out", out)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "out:" in text and "is a file" in text, result.output
    assert blocker.read_text() == "mine\n"
