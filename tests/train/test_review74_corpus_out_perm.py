"""Review 74, `hearth corpus build IN OUT_DIR` where OUT_DIR's folder cannot be written: refused before the input is
read, exit 2 naming out_dir.

build checked at start that OUT_DIR was not a file (nor under one) but not that it could be written: a read-only
parent was found only at mkdir, after the whole input had been read, validated and tokenized (minutes with
--tokenizer on a large corpus). Root passes os.access, so the test makes os.access deny the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hearth.train import corpus as C

EXAMPLE = Path(C.TEMPLATE_PATH).with_name("example_corpus.jsonl")


def test_an_out_dir_in_a_read_only_folder_is_refused_before_the_input_is_read(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == locked else real_access(p, mode, **k))

    def no_read(*a, **k):
        raise AssertionError("the input was read before the out_dir error")

    monkeypatch.setattr(C, "read_corpus", no_read)
    with pytest.raises(ValueError, match=r"^out_dir: cannot write in .*locked"):
        C.build(EXAMPLE, locked / "out")
