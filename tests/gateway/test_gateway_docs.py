"""The gateway's docs say what the code does and cite only what is in the repo (issue 13 item 9)."""

import re
from pathlib import Path

from hearth.gateway.config import WarmSettings

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_TEXT = sorted((ROOT / "src" / "hearth" / "gateway").rglob("*.py")) + [
    ROOT / "docs" / "gateway.md", ROOT / "docs" / "gateway.example.toml", ROOT / "benchmarks" / "gateway" / "bench_gateway.py"]


def _exists(ref: str, near: Path) -> bool:
    return any((base / ref).exists() for base in (ROOT, near.parent, ROOT / "src" / "hearth" / "gateway"))


def test_gateway_sources_and_docs_cite_only_files_in_the_repo():
    missing = []
    for path in GATEWAY_TEXT:
        text = path.read_text(encoding="utf-8")
        for ref in re.findall(r"[\w./-]*[\w-]\.md\b", text):
            if not _exists(ref, path):
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
        for doc in re.findall(r"\bsee ([A-Z][A-Z_]{3,})\b", text):   # 'see ARCHITECTURE' style citations
            if not _exists(doc, path) and not _exists(doc + ".md", path):
                missing.append(f"{path.relative_to(ROOT)}: {doc}")
    assert not missing, missing


def test_first_token_s_bounding_the_gap_between_deltas_is_documented():
    for path in (ROOT / "README.md", ROOT / "docs" / "gateway.md", ROOT / "docs" / "gateway.example.toml"):
        text = " ".join(path.read_text(encoding="utf-8").split())
        assert re.search(r"first_token_s.{0,200}gap between (two )?(streamed )?deltas", text), path


def test_cold_start_figure_is_measured_with_the_default_probe_timeout():
    bench = (ROOT / "benchmarks" / "gateway" / "bench_gateway.py").read_text(encoding="utf-8")
    assert "probe_timeout_s" not in re.sub(r"#.*", "", bench), "the cold fine-tune row must use the default probe"
    row = next(line for line in (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| cold fine-tune"))
    assert f"{WarmSettings().probe_timeout_s:g} s probe" in row, row
