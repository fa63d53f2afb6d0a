"""`hearth export` refuses an adapter whose saved LoRA weights do not all go into the base, or that leaves LoRA
layers of the base without saved weights. peft's load takes the adapter's state dict with strict=False: an adapter
trained on a base with fewer layers (the extra layers get zero LoRA B), one trained on a base with more (its extra
layers' weights dropped), or an adapter_config.json whose target_modules do not name the saved weights (none of them
loaded: the export is the base itself) were merged and written as a good export (exit 0)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.train.exporting import export
from tests.train.tiny import tiny_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _base(path, vocab, layers):
    import torch

    cfg = tiny_config(vocab, layers)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    return path


def _refused(out, adapter, base, tok_dir, names):
    """export ADAPTER onto BASE exits 2 with an 'adapter:' error naming `names`, and writes nothing at OUT."""
    result = export("--adapter", adapter, "--model", base, "--out", out, "--tokenizer", tok_dir)
    assert result.exit_code == 2, result.output
    assert "adapter:" in result.output and names in result.output, result.output
    assert not out.exists()


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory, export_parts):
    tok_dir, base, adapter = export_parts
    vocab = transformers.AutoConfig.from_pretrained(str(base), local_files_only=True).vocab_size
    return _base(tmp_path_factory.mktemp("base3"), vocab, 3)


def test_an_adapter_for_a_smaller_base_is_refused(tmp_path, export_parts, three_layers):
    tok_dir, base, adapter = export_parts  # the adapter was trained on the 2-layer base
    _refused(tmp_path / "o", adapter, three_layers, tok_dir, "layers.2.")


def test_an_adapter_for_a_larger_base_is_refused(tmp_path, export_parts, three_layers):
    import torch

    tok_dir, base, _ = export_parts
    model = transformers.AutoModelForCausalLM.from_pretrained(str(three_layers), local_files_only=True)
    torch.manual_seed(1)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights=False, task_type="CAUSAL_LM"))
    adapter3 = tmp_path / "adapter3"
    lora.save_pretrained(str(adapter3))
    _refused(tmp_path / "o", adapter3, base, tok_dir, "layers.2.")


def test_an_adapter_config_whose_targets_do_not_name_its_weights_is_refused(tmp_path, export_parts):
    tok_dir, base, adapter = export_parts  # weights on q_proj and v_proj
    edited = tmp_path / "adapter"
    shutil.copytree(adapter, edited)
    cfg = json.loads((edited / "adapter_config.json").read_text(encoding="utf-8"))
    cfg["target_modules"] = ["k_proj"]
    (edited / "adapter_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    _refused(tmp_path / "o", edited, base, tok_dir, "target_modules")


def test_the_matching_adapter_still_exports(tmp_path, export_parts):
    tok_dir, base, adapter = export_parts
    result = export("--adapter", adapter, "--model", base, "--out", tmp_path / "o", "--tokenizer", tok_dir)
    assert result.exit_code == 0, result.output
