"""export.json records the versions that merged and wrote the model (torch, transformers, peft, safetensors), as
a training run's metrics.json does: a merged folder that a server loads wrongly could not be traced to the library
versions that wrote it (export.json held the adapter, the base, the dtype and the tokenizer only)."""

from __future__ import annotations

import json

import pytest

from tests.train.exporting import export

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def test_export_json_records_the_versions(tmp_path, export_parts):
    import safetensors
    import torch

    tok_dir, base, adapter = export_parts
    out = tmp_path / "o"
    result = export("--adapter", adapter, "--model", base, "--out", out, "--tokenizer", tok_dir)
    assert result.exit_code == 0, result.output
    info = json.loads((out / "export.json").read_text(encoding="utf-8"))
    assert info["adapter"] == str(adapter) and info["base_model"] == str(base)
    assert info["versions"] == {"torch": torch.__version__, "transformers": transformers.__version__,
                                "peft": peft.__version__, "safetensors": safetensors.__version__}
