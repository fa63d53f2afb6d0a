"""Test files that train the tiny Qwen3 (tests.train.tiny) live under tests/train, whose conftest puts HF's own
apply_rotary_pos_emb back before each test and module: hearth.patch replaces it process-wide, so a file elsewhere
trained on whatever an earlier file in its worker had patched (hearth's rope on the CPU interpreter), and a CI run
spent over 10 minutes in one such file (review 76)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
USES_TINY = re.compile(r"^\s*(from tests\.train(\.tiny)? import|import tests\.train)", re.M)


def test_tiny_model_runs_live_under_tests_train():
    outside = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
                     if TESTS / "train" not in p.parents and p != Path(__file__).resolve()
                     and USES_TINY.search(p.read_text(encoding="utf-8")))
    assert not outside, f"move these under tests/train (its conftest restores HF's rope): {outside}"


def test_the_check_sees_an_import_of_the_tiny_run():
    assert USES_TINY.search("import io\nfrom tests.train.tiny import run_config\n")
    assert not USES_TINY.search("x = 1\n# a comment naming tests.train.tiny\n")
