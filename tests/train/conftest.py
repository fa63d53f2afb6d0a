"""hearth.patch replaces Qwen3's module-level apply_rotary_pos_emb process-wide (by design: it is a module
global). A test that patched a model earlier in the session (tests/test_patch.py, the patched runs here)
would leave every later Qwen3 on hearth's rope kernel -- under the CPU interpreter, slow enough to turn the
plain-transformers training tests from seconds into minutes. Each test here starts from the original
function (a test that wants hearth's rope patches its model itself) and the previous state is put back."""

from __future__ import annotations

import sys

import pytest

from tests.train.tiny import save_tiny_model, tiny_adapter, tiny_tokenizer, write_corpus


def _swap_in_original():
    """(module, the function found) after putting HF's own apply_rotary_pos_emb back, or (None, None)."""
    mod = sys.modules.get("transformers.models.qwen3.modeling_qwen3")
    before = getattr(mod, "apply_rotary_pos_emb", None) if mod is not None else None
    original = getattr(before, "__hearth_original__", None)
    if original is not None:
        mod.apply_rotary_pos_emb = original
    return mod, before


def _restoring_original_rope():
    mod, before = _swap_in_original()
    yield
    if before is not None:
        mod.apply_rotary_pos_emb = before


# per test, and per module too: pytest sets up module-scoped fixtures before any function-scoped one, and a
# module's plain-transformers training fixture (test_distributed's one-process reference) ran on the
# interpreter's rope after an earlier module had patched it (284 s instead of 1.4 s in CI)
_original_qwen3_rope = pytest.fixture(autouse=True, name="_original_qwen3_rope")(_restoring_original_rope)
_original_qwen3_rope_for_module_fixtures = pytest.fixture(
    autouse=True, scope="module", name="_original_qwen3_rope_for_module_fixtures")(_restoring_original_rope)


# the tiny run shared by the runner tests (a module may define its own `tok` / `corpus` instead): the in-test
# tokenizer, a 12-example corpus written with it, and a tiny random Qwen3 of its vocabulary
@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer(tmp_path_factory.mktemp("tok"))), local_files_only=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tok):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "train.jsonl", tok, range(12))


@pytest.fixture(scope="module")
def base(tmp_path_factory, tok):
    return save_tiny_model(tmp_path_factory.mktemp("model"), len(tok))


# the export tests' parts (tokenizer folder, base model folder without tokenizer files, LoRA adapter folder): one
# tiny adapter on q_proj / v_proj per module, as tests/train/tiny.py's tiny_adapter makes it
@pytest.fixture(scope="module")
def export_parts(tmp_path_factory):
    return tiny_adapter(tmp_path_factory)[:3]
