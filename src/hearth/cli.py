"""`hearth`: one typer app. Each command imports its subsystem lazily, so `hearth serve`
never imports torch and `hearth bench` never imports the web stack.

Each command's body only parses arguments and hands them to the subsystem's entry point
(named in the command); the behaviour lives there, with its tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="hearth: kernels, benchmarks, fine-tune, gateway and companion app.")
corpus_app = typer.Typer(no_args_is_help=True, help="Build the envelope fine-tune corpus.")
app.add_typer(corpus_app, name="corpus")


# ----------------------------------------------------------------------------------------- kernels
@app.command()
def bench(
    ops: Annotated[Optional[list[str]], typer.Argument(help="ops to run, or 'all' (default: every op in hearth.kernels, plus swiglu_mlp)")] = None,
    dtype: Annotated[Optional[list[str]], typer.Option("--dtype", help="bfloat16, float16, float32 (repeatable)")] = None,
    mode: Annotated[Optional[list[str]], typer.Option("--mode", help="fwd, bwd or full (repeatable)")] = None,
    providers: Annotated[Optional[list[str]], typer.Option("--providers", help="hearth, eager, compile, liger, quack, vendor, cublas, sdpa_flash, sdpa_cudnn, torch_lce (repeatable)")] = None,
    sizes: Annotated[Optional[str], typer.Option("--sizes", help="headline (the published target shapes; default) | models (real model configs' shapes, named by model) | sweep | small | a comma list of the op's size knob")] = None,
    out: Annotated[Path, typer.Option("--out", help="output folder for results.jsonl, Markdown and PNG (rows are merged into an existing results.jsonl)")] = Path("benchmarks/latest"),
    check: Annotated[bool, typer.Option("--check", help="tiny sizes on the CPU under TRITON_INTERPRET=1: validates checks, formulas and writers")] = False,
    report_only: Annotated[bool, typer.Option("--report-only", help="run nothing: rebuild the reports from OUT/results.jsonl (+ --merge folders)")] = False,
    merge: Annotated[Optional[list[Path]], typer.Option("--merge", help="folder whose results.jsonl is merged into OUT (repeatable)")] = None,
    budget_s: Annotated[Optional[float], typer.Option("--budget-s", help="seconds at most per op (default: an equal share of the total)")] = None,
    total_budget_s: Annotated[float, typer.Option("--total-budget-s", help="seconds for the whole run; cases past it are recorded as skipped")] = 450.0,
) -> None:
    """Benchmark hearth's kernels against fused peers: GPU time, wall time per call (host overhead) and peak memory."""
    from hearth.bench.runner import main

    raise typer.Exit(main(ops=ops, dtypes=dtype, modes=mode, providers=providers, sizes=sizes, out=out, check=check,
                          report_only=report_only, merge=merge, budget_s=budget_s, total_budget_s=total_budget_s))


@app.command()
def inspect(
    op: Annotated[str, typer.Argument(help="op whose Triton kernels to compile and read (e.g. matmul, attention)")],
    shape: Annotated[Optional[str], typer.Option("--shape", help="problem shape, e.g. 4096x4096x4096")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16, float16 or float32 (bf16, fp16, fp32)")] = "bfloat16",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the per-kernel report as JSON here")] = None,
    arch: Annotated[Optional[str], typer.Option("--arch", help="compile offline for this GPU (e.g. sm_90), no CUDA needed (matmul; attention: sm_90)")] = None,
) -> None:
    """Compile an op's kernels for this GPU and report its instruction mix (tensor cores, registers, spills).
    Exit 0 fine, 1 a matmul-like kernel without tensor-core instructions, 2 bad arguments or nothing to compile for,
    3 the build failed."""
    from hearth.inspect import main

    raise typer.Exit(main(op=op, shape=shape, dtype=dtype, json_out=json_out, arch=arch))


# ----------------------------------------------------------------------------------------- model
@corpus_app.command("build")
def corpus_build(
    input: Annotated[Path, typer.Argument(help="conversation JSONL (see docs/corpus.md)")],
    out_dir: Annotated[Path, typer.Argument(help="where to write the supervised examples")],
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="local path of the tuned model's tokenizer")] = None,
    context_turns: Annotated[Optional[int], typer.Option("--context-turns", help="earlier turns a chat or rehearsal example sends: the deployment's chat_context_turns, within the app's bounds \\[the app's default]")] = None,
    prompt_memories: Annotated[Optional[int], typer.Option("--prompt-memories", help="latest memories a prompt carries: the deployment's prompt_memories, within the app's bounds \\[the app's default]")] = None,
    max_text_chars: Annotated[Optional[int], typer.Option("--max-text-chars", help="longest user message (chat message, rehearsal line, post, situation) a conversation may hold: the deployment's max_text_chars, within the app's bounds \\[the app's default]")] = None,
    max_prompt_chars: Annotated[Optional[int], typer.Option("--max-prompt-chars", help="characters a chat, rehearsal or after-rehearsal analyst example's prompt may carry, its oldest earlier exchanges left out to fit: the deployment's max_prompt_chars, within the app's bounds \\[the app's default]")] = None,
) -> None:
    """Turn conversations into chat examples whose assistant turns are envelopes."""
    from hearth.train.corpus import build_command

    raise typer.Exit(build_command(input=input, out_dir=out_dir, tokenizer=tokenizer, context_turns=context_turns,
                                   prompt_memories=prompt_memories, max_text_chars=max_text_chars,
                                   max_prompt_chars=max_prompt_chars))


@app.command("eval")
def eval_(
    suite: Annotated[str, typer.Argument(help="companion, feed, analysts or all")],
    base_url: Annotated[str, typer.Option("--base-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")],
    model: Annotated[str, typer.Option("--model")],
    api_key_env: Annotated[Optional[str], typer.Option("--api-key-env", help="environment variable holding the API key")] = None,
    extra_body: Annotated[Optional[str], typer.Option("--extra-body", help="JSON merged into each request body (not a key an option here sets: temperature, seed, max_tokens, ...)")] = None,
    json_schema: Annotated[bool, typer.Option("--json-schema/--no-json-schema", help="send response_format json_schema")] = False,
    threshold: Annotated[float, typer.Option("--threshold", help="minimum pass fraction; exit 1 below it")] = 1.0,
    report: Annotated[Optional[Path], typer.Option("--report", help="JSON report path")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="max_tokens per reply (0: do not send)")] = 1024,
    timeout: Annotated[Optional[float], typer.Option(
        "--timeout", help="wall-clock seconds per call (default: as long as the app waits for the kind: chat 60, "
                          "analyst 45, feed comment 30)")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="calls in flight at once")] = 4,
    samples: Annotated[int, typer.Option("--samples", help="replies per case (the rate gets a tighter interval)")] = 1,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="sent with every request (default: the server's)")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="sample i of each case is sent with seed + i")] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="stream replies (measures time to first token)")] = True,
) -> None:
    """Score envelope validity at production prompt size against any OpenAI-compatible endpoint."""
    from hearth.evals.runner import main

    raise typer.Exit(
        main(suite=suite, base_url=base_url, model=model, api_key_env=api_key_env, extra_body=extra_body,
             json_schema=json_schema, threshold=threshold, report=report, max_tokens=max_tokens or None,
             timeout_s=timeout, concurrency=concurrency, samples=samples, temperature=temperature, seed=seed,
             stream=stream)
    )


# ----------------------------------------------------------------------------------------- services
@app.command()
def gateway(
    config: Annotated[Path, typer.Option("--config", help="gateway TOML file")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8400,
    workers: Annotated[int, typer.Option("--workers", help="processes on one port (SO_REUSEPORT); > 1 needs \\[gateway] state_url")] = 1,
) -> None:
    """Serve the warm-gated provider chain as an OpenAI-compatible API."""
    from hearth.gateway.server import main

    raise typer.Exit(main(config=config, host=host, port=port, workers=workers))


@app.command()
def serve(
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML file (providers, app settings)")] = None,
    database_url: Annotated[Optional[str], typer.Option("--database-url", help="default: a SQLite file under ./var/")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="default: the TOML's \\[app] host, else 127.0.0.1")] = None,
    port: Annotated[Optional[int], typer.Option("--port", help="default: the TOML's \\[app] port, else 8000")] = None,
    workers: Annotated[int, typer.Option("--workers", help="worker processes (state is shared through the database; use PostgreSQL)")] = 1,
) -> None:
    """Run the companion app (SQLite by default, PostgreSQL by URL)."""
    from hearth.app.main import serve as run

    raise typer.Exit(run(config=config, database_url=database_url, host=host, port=port, workers=workers))


@app.command()
def train(
    config_file: Annotated[Optional[Path], typer.Argument(help="RUN.toml: any of the options below as keys (flags override it)")] = None,
    corpus: Annotated[Optional[Path], typer.Option("--corpus", help="OUT_DIR/train.jsonl from `hearth corpus build --tokenizer ...`")] = None,
    model: Annotated[Optional[Path], typer.Option("--model", help="local model directory (or, with --random-init, a config JSON)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="run folder: adapter, run.toml, metrics.jsonl, loss.png, checkpoints/")] = None,
    max_steps: Annotated[Optional[int], typer.Option("--max-steps", help="optimizer steps (default: --epochs passes)")] = None,
    epochs: Annotated[Optional[int], typer.Option("--epochs", help="passes over the training examples [1]")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="peak AdamW learning rate [2e-4]")] = None,
    lr_schedule: Annotated[Optional[str], typer.Option("--lr-schedule", help="after the warm-up: cosine, linear or constant \\[cosine]")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option("--warmup-steps", help="linear warm-up steps [0]")] = None,
    weight_decay: Annotated[Optional[float], typer.Option("--weight-decay", help="AdamW weight decay [0]")] = None,
    max_grad_norm: Annotated[Optional[float], typer.Option("--max-grad-norm", help="gradient clipping norm [1.0]")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="seed: LoRA init, shuffling, eval split [0]")] = None,
    shuffle: Annotated[Optional[bool], typer.Option("--shuffle/--no-shuffle", help="reshuffle the examples every epoch \\[on]")] = None,
    rank: Annotated[Optional[int], typer.Option("--rank", help="LoRA rank r [16]")] = None,
    alpha: Annotated[Optional[float], typer.Option("--alpha", help="LoRA alpha [32]")] = None,
    dropout: Annotated[Optional[float], typer.Option("--dropout", help="LoRA dropout [0]")] = None,
    targets: Annotated[Optional[str], typer.Option("--targets", help="comma list of module names for LoRA \\[q,k,v,o,gate,up,down _proj]")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="tokens per example at most; longer ones drop their oldest history turns [4096]")] = None,
    batch_tokens: Annotated[Optional[int], typer.Option("--batch-tokens", help="tokens per micro-batch, padding included \\[seq-len]")] = None,
    grad_accum: Annotated[Optional[int], typer.Option("--grad-accum", help="micro-batches per optimizer step [1]")] = None,
    pack: Annotated[Optional[bool], typer.Option("--pack/--no-pack", help="pack short examples into one row (no attention across them) \\[off]")] = None,
    eval_corpus: Annotated[Optional[Path], typer.Option("--eval-corpus", help="validation train.jsonl (instead of --eval-fraction)")] = None,
    eval_fraction: Annotated[Optional[float], typer.Option("--eval-fraction", help=(
        "hold out about this fraction of the examples, as whole conversations, for eval loss [0]"))] = None,
    eval_every: Annotated[Optional[int], typer.Option("--eval-every", help="eval loss every N steps (and at the end) \\[end only]")] = None,
    save_every: Annotated[Optional[int], typer.Option("--save-every", help="checkpoint every N steps under OUT/checkpoints \\[never]")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="a checkpoint folder, or a run folder (its latest checkpoint)")] = None,
    memory_budget_gib: Annotated[Optional[float], typer.Option("--memory-budget-gib", help="picks activation checkpointing; refuses what cannot fit [90% of the GPU]")] = None,
    no_patch: Annotated[bool, typer.Option("--no-patch", help="train without hearth's kernels (plain transformers)")] = False,
    attention: Annotated[Optional[bool], typer.Option("--attention/--no-attention", help="hearth's attention kernels: --attention wherever they run, --no-attention never (SDPA); with --pack, the varlen kernel on each packed row \\[by device: Hopper, bf16/fp16, head_dim 64/128]")] = None,
    lora_compute: Annotated[Optional[str], typer.Option("--lora-compute", help="base: LoRA products in bf16 on the tensor cores (fast); adapter: in the adapters' fp32, as peft \\[base]")] = None,
    random_init: Annotated[Optional[bool], typer.Option("--random-init", help="build the model from a config JSON with random weights (benchmarking)")] = None,
    qlora: Annotated[Optional[bool], typer.Option("--qlora", help="4-bit NF4 base (bitsandbytes) under the LoRA adapters")] = None,
    parallel: Annotated[Optional[str], typer.Option("--parallel", help="none, ddp or fsdp; ddp / fsdp under torchrun --nproc-per-node N -m hearth.cli train \\[none]")] = None,
) -> None:
    """LoRA / QLoRA fine-tune on the envelope corpus with hearth's kernels patched in (docs/training.md)."""
    from hearth.train.finetune import main

    raise typer.Exit(main(config_file, corpus=corpus, model=model, out=out, max_steps=max_steps, epochs=epochs, lr=lr,
                          lr_schedule=lr_schedule, warmup_steps=warmup_steps, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, seed=seed, shuffle=shuffle, rank=rank, alpha=alpha,
                          dropout=dropout, targets=targets, seq_len=seq_len, batch_tokens=batch_tokens,
                          grad_accum=grad_accum, pack=pack, eval_corpus=eval_corpus, eval_fraction=eval_fraction,
                          eval_every=eval_every, save_every=save_every, resume=resume,
                          memory_budget_gib=memory_budget_gib, patch=False if no_patch else None, attention=attention,
                          lora_compute=lora_compute,
                          random_init=random_init, qlora=qlora, parallel=parallel))


@app.command()
def export(
    adapter: Annotated[Path, typer.Option("--adapter", help="adapter folder from `hearth train`")],
    model: Annotated[Path, typer.Option("--model", help="the local base model folder it was trained on")],
    out: Annotated[Path, typer.Option("--out", help="where to write the merged model (Hugging Face folder, safetensors)")],
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16 or float16")] = "bfloat16",
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="tokenizer folder to copy beside it \\[the base model's]")] = None,
) -> None:
    """Merge a LoRA adapter into its base: a 16-bit model folder any server loads."""
    from hearth.train.export import main

    raise typer.Exit(main(adapter=adapter, model=model, out=out, dtype=dtype, tokenizer=tokenizer))


if __name__ == "__main__":  # pragma: no cover
    app()
