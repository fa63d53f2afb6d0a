"""docs/app.md's provider TOML (Ollama, llama.cpp server, vLLM) is valid gateway configuration."""

from __future__ import annotations

import re
from pathlib import Path

from hearth.gateway.config import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "app.md"


def test_every_provider_example_in_the_app_docs_loads(tmp_path, monkeypatch):
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 3
    names = []
    for i, block in enumerate(blocks):
        path = tmp_path / f"{i}.toml"
        path.write_text(block)
        cfg = load_config(path)
        names += [p.name for p in cfg.providers]
        assert all(p.json_schema and p.base_url.startswith("http://127.0.0.1:") for p in cfg.providers)
    assert names == ["ollama", "llama-cpp", "vllm"]
