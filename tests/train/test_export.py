"""`hearth export`: the merged bf16 folder's logits equal base + adapter within what bf16 rounding of the
weights costs, and it is a plain Hugging Face folder (safetensors, config, tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hearth.cli import app
from tests.train.tiny import tiny_adapter

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_adapter(tmp_path_factory, targets=("q_proj", "v_proj", "down_proj"))


def test_merged_bf16_logits_equal_base_plus_adapter(tmp_path, parts):
    tok_dir, base, adapter, vocab = parts
    out = tmp_path / "merged"
    result = CliRunner().invoke(app, ["export", "--adapter", str(adapter), "--model", str(base), "--out", str(out),
                                      "--tokenizer", str(tok_dir)])
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert (out / "tokenizer.json").is_file() and json.loads((out / "export.json").read_text())["dtype"] == "bfloat16"
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {torch.bfloat16}

    ids = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = transformers.AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True)
        base_logits = plain(input_ids=ids).logits
        rounded = plain.to(torch.bfloat16).float()(input_ids=ids).logits  # what bf16 weights alone cost
        reference = peft.PeftModel.from_pretrained(
            transformers.AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True), str(adapter))(input_ids=ids).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True, dtype=torch.float32)
        exported = merged(input_ids=ids).logits
    bf16_cost = (rounded - base_logits).abs().max().item()
    assert bf16_cost > 0
    assert (exported - reference).abs().max().item() <= 3 * bf16_cost
    assert (exported - base_logits).abs().max().item() > 10 * bf16_cost  # the adapter is really in there
    # and the tokenizer beside it renders hearth's chat template
    tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert "<|im_start|>assistant" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                              add_generation_prompt=True)


@pytest.mark.parametrize("flag, value, needle", [
    ("--adapter", "missing", "adapter"),
    ("--model", "missing", "model"),
    ("--dtype", "int8", "dtype"),
])
def test_bad_export_arguments_exit_2(tmp_path, parts, flag, value, needle):
    tok_dir, base, adapter, _ = parts
    args = {"--adapter": str(adapter), "--model": str(base), "--out": str(tmp_path / "o"), "--dtype": "bfloat16"}
    args[flag] = str(tmp_path / value) if value == "missing" else value
    result = CliRunner().invoke(app, ["export", *[x for kv in args.items() for x in kv]])
    assert result.exit_code == 2 and needle in result.output


@pytest.mark.parametrize("case", ["tokenizer_missing", "out_is_a_file"])
def test_export_argument_errors_fire_before_the_merge(tmp_path, parts, case, monkeypatch):
    # --tokenizer was only tried after the merged model had been written (a folder without export.json
    # left behind), and an --out that is a file failed in mkdir after the merge as an OSError (exit 1)
    tok_dir, base, adapter, _ = parts
    out = tmp_path / "o"
    args = ["export", "--adapter", str(adapter), "--model", str(base), "--out", str(out)]
    if case == "tokenizer_missing":
        args += ["--tokenizer", str(tmp_path / "no-such-tokenizer")]
        needle = "tokenizer"
    else:
        out.write_text("not a folder")
        needle = "out"

    def no_load(*a, **k):
        raise AssertionError("the base model was loaded before the argument error")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and f"{needle}:" in result.output, result.output
    assert not out.is_dir()
