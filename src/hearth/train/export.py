"""`hearth export`: merge a LoRA adapter into its base model and write a 16-bit Hugging Face folder.

    hearth export --adapter runs/r1 --model models/qwen3-14b --out models/qwen3-14b-envelope

The base is loaded from its LOCAL folder in fp32, the adapter applied (peft), merged (W + B A x alpha / r),
and the merged weights rounded ONCE to --dtype (bfloat16 by default) and saved as safetensors with the
config, the generation config and the tokenizer (from --tokenizer, else the base folder), so that vLLM,
transformers serve, TGI or llama.cpp's converter load it like any model. export.json records what it came
from. A QLoRA adapter merges the same way (into the 16-bit base: the 4-bit base is a training-time device).

Serving the adapter without merging is documented in docs/training.md (vLLM --enable-lora).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hearth.durable import folder_problem
from hearth.train.durable import finish_adapter_publish, fsync_tree, replace_dir, restore_aside

DTYPES = ("bfloat16", "float16")


def _usable_tokenizer(path: Path, vocab_size: int):
    """The tokenizer in ``path``, or None when there is none that can serve this model. transformers 5 loads a model
    folder WITHOUT tokenizer files as an empty tokenizer of the model's class (one token; every text encodes to
    nothing): written beside the merged weights, a server would take it and tokenize every prompt to nothing."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None
    ids = tok("<|im_start|>user\nhello, how are you?<|im_end|>", add_special_tokens=False)["input_ids"]
    if not ids or max(ids) >= vocab_size or len(tok) <= 1:
        return None
    return tok


def _versions() -> dict:
    """The libraries that merged and wrote the model, for export.json."""
    import peft
    import safetensors
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "safetensors": safetensors.__version__}


def _adapter_key_mismatch(peft_model, adapter: Path) -> str | None:
    """What keeps the adapter's saved weights from being exactly the LoRA weights peft put into the base (None: they
    are). peft loads them with strict=False: a saved weight that no LoRA layer takes is dropped, and a LoRA layer with
    no saved weight keeps its init (B = 0: no change), so an adapter from another base (more or fewer layers) or with
    target_modules that do not name its weights merges silently into a wrong model -- the base itself, at worst."""
    from peft.utils import get_peft_model_state_dict, load_peft_weights

    saved = set(load_peft_weights(str(adapter), device="cpu"))
    expected = set(get_peft_model_state_dict(peft_model))
    missing, unused = sorted(expected - saved), sorted(saved - expected)
    if unused:
        return (f"{len(unused)} of its {len(saved)} saved weights go into no LoRA layer of the base "
                f"(e.g. {unused[0]})")
    if missing:
        return (f"{len(missing)} of the base's {len(expected)} LoRA weights have none saved in it (e.g. {missing[0]})")
    return None


def export(adapter: Path, model: Path, out: Path, *, dtype: str = "bfloat16", tokenizer: Path | None = None,
           say=None) -> dict:
    """Write the merged model to ``out``; returns what export.json holds. ValueError naming the argument.
    ``say(text, stage)``, when given, hears each stage as it starts (stage True: "load", "merge", "write") and, before
    the base model is loaded, that no tokenizer will be written (stage False), so a user can stop at once instead
    of learning it after minutes of loading and merging a large model.

    ``out`` is written whole or not at all: the folder is built beside it (``.OUT.export-tmp``) and moved into place,
    replacing a previous export (a folder holding export.json) only once the new one is complete, so a failure (a full
    disk, a killed process) leaves the previous export as it was and no stale file of it (an old tokenizer, a shard
    index) survives into the new one. The new folder's files and the folder itself are fsynced before the rename
    and OUT's parent after it (hearth.train.durable), so a power cut cannot leave OUT with empty files; a process
    killed between moving the previous export aside and renaming the new one in leaves the previous one under
    ``.OUT.export-old``, which the next export puts back before it starts. Any other non-empty folder is refused."""
    import shutil

    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    # OUT absolute and without '.' / '..': the merged folder is built beside it under its name, and '.' has none (the
    # export failed after the merge), '..' none to build beside
    adapter, model, out = Path(adapter), Path(model), Path(os.path.abspath(out))
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if adapter.is_dir():
        # a `hearth train` killed while publishing its final adapter into this folder: the committed new adapter is
        # completed first (as the next run into it would), not refused for the adapter_config.json it lacks meanwhile
        try:
            finish_adapter_publish(adapter)
        except OSError as exc:
            raise ValueError(f"adapter: {adapter} holds an adapter whose publish a crash interrupted, and it cannot be "
                             f"completed here: {exc}") from exc
    if not (adapter / "adapter_config.json").is_file():
        raise ValueError(f"adapter: {adapter} has no adapter_config.json (a folder written by `hearth train`)")
    if not (model / "config.json").is_file():
        raise ValueError(f"model: {model} is not a local model folder (no config.json; nothing is downloaded)")
    if out.resolve() in (adapter.resolve(), model.resolve()):
        raise ValueError(f"out: {out} must not be the adapter or the base model folder")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file, not a folder")
    # the merged model is built beside OUT (.OUT.export-tmp) and renamed into place: a file on the way to OUT, or a
    # folder it cannot write in, failed that write only after the base model had been loaded and merged (minutes for
    # a 14B model), exit 1 and a bare FileExistsError / PermissionError
    problem = folder_problem(out, within=out.parent)
    if problem:
        raise ValueError(f"out: {problem}")
    if out.is_dir() and any(out.iterdir()) and not (out / "export.json").is_file():
        raise ValueError(f"out: {out} is a folder that holds other files and no export.json (not an earlier `hearth "
                         "export`); the merged model would be mixed into it: give an empty or new folder")
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise ValueError(f"tokenizer: {tokenizer} is not a tokenizer folder")
    try:
        vocab_size = AutoConfig.from_pretrained(str(model), local_files_only=True).get_text_config().vocab_size
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"model: cannot read the model config of {model}: {exc}") from exc
    tok_src = tokenizer or model
    tok = _usable_tokenizer(Path(tok_src), vocab_size)
    if tok is None and tokenizer is not None:
        raise ValueError(f"tokenizer: {tokenizer} holds no tokenizer for this model (none that loads, encodes text and "
                         f"stays within its vocab_size={vocab_size})")
    say = say or (lambda text, stage: None)
    if tok is None:
        say(f"no tokenizer found in {model}: the export will hold none (pass --tokenizer, or copy one in after)", False)
    say(f"loading {model} and applying {adapter}", True)
    try:
        base = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model: cannot load a causal LM from {model}: {exc}") from exc
    try:
        peft_model = PeftModel.from_pretrained(base, str(adapter))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"adapter: cannot apply {adapter} to {model}: {exc}") from exc
    mismatch = _adapter_key_mismatch(peft_model, adapter)
    if mismatch:
        raise ValueError(f"adapter: {adapter} does not match the base {model}: {mismatch} (target_modules in its "
                         "adapter_config.json and --model must be what it was trained with)")
    say("merging the adapter into the weights", True)
    try:
        merged = peft_model.merge_and_unload()
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"adapter: cannot apply {adapter} to {model}: {exc}") from exc
    merged = merged.to(getattr(torch, dtype))
    merged.config.use_cache = True
    info = {"adapter": str(adapter), "base_model": str(model), "dtype": dtype,
            "tokenizer": str(tok_src) if tok is not None else None,
            "adapter_config": json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8")),
            "versions": _versions()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = out.with_name(f".{out.name}.export-tmp"), out.with_name(f".{out.name}.export-old")
    # an earlier re-export was killed between its two renames: OUT is missing and the previous export is only under
    # the hidden name. Put it back first, so that this export failing too does not leave nothing.
    restore_aside(out, old)
    for leftover in (tmp, old):  # an earlier export that was killed half-way
        if leftover.exists():
            shutil.rmtree(leftover)
    say(f"writing {out}", True)
    try:
        merged.save_pretrained(str(tmp), safe_serialization=True)
        if tok is not None:
            tok.save_pretrained(str(tmp))
        (tmp / "export.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        # on the disk before it takes its name: a rename is not a flush, and after a power cut OUT could otherwise
        # hold empty or partial files (a zero-length model.safetensors) under a complete-looking export.json
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        replace_dir(tmp, out, old)  # a failed rename puts the previous export back under its name
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def main(*, adapter: Path, model: Path, out: Path, dtype: str = "bfloat16", tokenizer: Path | None = None) -> int:
    """`hearth export`: 0 done, 2 bad arguments, 1 a failure while writing."""
    from rich.console import Console

    console = Console()
    status = console.status("checking the arguments")

    def say(text: str, stage: bool) -> None:
        if stage:  # the spinner names the stage (loading and merging a 14B model takes minutes)
            status.update(text)
        else:
            console.print(f"[yellow]note:[/yellow] {text}")

    try:
        with status:
            info = export(adapter, model, out, dtype=dtype, tokenizer=tokenizer, say=say)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except (OSError, RuntimeError) as exc:
        console.print(f"[red]error:[/red] {type(exc).__name__}: {exc}")
        return 1
    console.print(f"merged {adapter} into {model} -> {out} ({dtype}"
                  + (", with the tokenizer" if info["tokenizer"] else ", no tokenizer found: copy one in") + ")")
    return 0
