"""`hearth train`: LoRA / QLoRA SFT with transformers + peft on hearth's envelope corpus, hearth's kernels patched in.

    hearth train RUN.toml [--flags]            every key of FinetuneConfig is a flag; flags override the file
    run(FinetuneConfig(corpus=Path("out/train.jsonl"), model=Path("models/qwen3-14b"), out=Path("adapter")))

Steps: resolve the config (defaults < RUN.toml < flags; written to OUT/run.toml, which `hearth train` takes
back) -> read the corpus (hearth.train.batches: history turns dropped to fit seq_len, a validation split; the
start-up log and metrics.json say how many training examples lost history and the longest example) -> check the
step settings against the run's length (exit 2) -> refuse a memory budget the weights alone exceed (exit 1; names
--qlora, more FSDP ranks or a larger GPU, whichever can apply) -> load the model
from a LOCAL path (never the hub; --random-init builds it from a config JSON, for benchmarking), 4-bit NF4
with --qlora -> peft LoRA (rank, alpha, dropout, target modules) -> hearth.patch.apply, after probing the loss
kernel on this device (unless --no-patch; after peft, so that the LoRA projections get hearth's fused nodes) -> activation checkpointing for the budget
(plan_checkpointing) -> AdamW on the LoRA parameters, lr warm-up then cosine / linear / constant, gradient
clipping; each optimizer step is grad_accum micro-batches of at most batch_tokens tokens (padded, or packed
with no attention across examples), weighted by trained tokens; examples reshuffled every epoch from the
seed. hearth's attention is patched in by device (where its fused backward serves: Hopper, bf16/fp16, head_dim 64
or 128; --attention everywhere its kernels run, --no-attention never): padded micro-batches then run its flash
kernel (SDPA where there is padding), packed ones (--pack) its varlen kernel on the row's offsets.

OUT holds: the adapter (peft save_pretrained), run.toml, metrics.jsonl (one row per step: step, epoch,
loss, eval_loss, lr, grad_norm, tokens, tok_per_s, peak_gib), metrics.json (summary), loss.png, and with
save_every, checkpoints/step-NNNNNN/ (adapter, optimizer, scheduler, RNG state, data position). --resume
CKPT (a checkpoint folder, or OUT to take its latest) continues a run exactly: the losses of a resumed run
equal the uninterrupted run's. A resume from an earlier step starts a new line of training: the later checkpoints
are moved into checkpoints/superseded-<time>/ (set_aside_later), so --resume OUT never takes one. A fresh run into
an OUT holding an earlier run's adapter, run.toml or metrics moves them into OUT/superseded-<time>/ before it writes
(set_aside_earlier_run), so a run that fails part-way never leaves its run.toml beside another run's adapter.

Several processes: `torchrun --nproc-per-node N -m hearth.cli train RUN.toml --parallel ddp|fsdp` (PyTorch DDP or
FSDP2; the same optimizer steps as one process; rank 0 writes; hearth.train.distributed).

Exit codes: 0 done, 2 bad arguments (the message names the argument), 1 a runtime failure (a budget the
model cannot fit, a non-finite loss or gradient norm, out of memory).

This module does not import pydantic (scripts/gpu/lora_e2e.py shares it on machines without it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import statistics
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from hearth.durable import write_file, write_text
from hearth.train import distributed as D
from hearth.train.batches import (
    EVAL_SPLIT, EVAL_SPLITS, Example, collate, conversation_of, load_examples, plan_epoch, split_eval,
)
from hearth.train.distributed import PARALLEL
from hearth.train.durable import (
    ADAPTER, ADAPTER_CONFIG, ADAPTER_TMP, CORPUS, CORPUS_FILES, CORPUS_IN, CORPUS_NEW, finish_adapter_publish, fsync_tree,
    publish_adapter, publish_pending, replace_dir, restore_aside,
)

IGNORE_INDEX = -100
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GIB = 1 << 30
SCHEDULES = ("cosine", "linear", "constant")
# the shuffle seeds torch.Generator with seed x 100003 + epoch (batches.epoch_order), which takes up to 2**64 - 1; the
# 2**32 epochs of headroom are more than any run reaches
SEED_MAX = (2**64 - 1 - 2**32) // 100_003
# hearth.kernels.lora.LORA_COMPUTE, the run file's default first (not imported: the CLI validates a run file without
# loading torch or Triton; tests/train/test_finetune.py keeps the two equal)
LORA_COMPUTE = ("base", "adapter")
CPU_HINT = ("hearth's Triton kernels need a CUDA GPU; on a CPU start with TRITON_INTERPRET=1 in the environment "
            "(the Triton interpreter: slow, for checking) or pass --no-patch (plain transformers)")


# the files a run writes into OUT (the adapter's as peft writes them, its model card too; run.toml, metrics.json,
# loss.png and metrics.jsonl's rewrite at the start of a run or resume through their .tmp)
OUT_FILES = ("run.toml", "run.toml.tmp", "metrics.jsonl", "metrics.jsonl.tmp", "metrics.json", "metrics.json.tmp",
             "loss.png", "loss.png.tmp", "adapter_config.json", "adapter_model.safetensors", "README.md")


class RunError(RuntimeError):
    """A run that cannot go on (exit code 1): the model does not fit the budget, the loss diverged..."""


@dataclass
class FinetuneConfig:
    corpus: Path
    model: Path
    out: Path
    # schedule
    max_steps: int | None = None  # optimizer steps; None: `epochs` passes over the training examples
    epochs: int = 1
    lr: float = 2e-4
    lr_schedule: str = "cosine"  # after the warm-up: cosine or linear decay to 0, or constant
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    shuffle: bool = True
    # LoRA
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS
    # batches
    seq_len: int = 4096
    batch_tokens: int | None = None  # tokens per micro-batch (padded width x rows, or packed); None: seq_len
    grad_accum: int = 1
    pack: bool = False
    # validation, checkpoints
    eval_corpus: Path | None = None
    eval_fraction: float = 0.0
    eval_every: int = 0  # steps; 0: only at the end
    save_every: int = 0  # steps; 0: no intermediate checkpoints
    resume: Path | None = None
    # model, memory
    memory_budget_gib: float | None = None  # None: 90% of the GPU's memory on CUDA; no checkpointing on CPU
    patch: bool = True
    # hearth's fused LoRA nodes: "base" runs the adapters' low-rank products in the base dtype (bf16) on the
    # tensor cores, fp32 accumulation and fp32 adapter gradients (the fast setting; matches peft's training by
    # the tolerance rule on the H200); "adapter" keeps them in the adapters' fp32, as peft computes them
    lora_compute: str = "base"
    # hearth's attention kernels (patch.apply(attention=...)): None by device (where the fused backward serves),
    # True wherever the kernels run, False never (SDPA); with pack, each packed row runs
    # hearth.kernels.attention_varlen on the collator's offsets and no [T, T] mask is built
    attention: bool | None = None
    random_init: bool = False
    qlora: bool = False
    parallel: str = "none"  # none, ddp or fsdp (under torchrun; hearth.train.distributed)

    def __post_init__(self) -> None:
        for name in ("corpus", "model", "out", "eval_corpus", "resume"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, (str, os.PathLike)):  # Path(3) says "expected str", naming no key
                    raise ValueError(f"{name} must be a path (a string), got {value!r}")
                setattr(self, name, Path(value))
        if isinstance(self.targets, str):
            self.targets = tuple(t.strip() for t in self.targets.split(",") if t.strip())
        if not isinstance(self.targets, (list, tuple)):
            raise ValueError(f"targets must be a non-empty list of module names, got {self.targets!r}")
        self.targets = tuple(self.targets)

    @property
    def micro_tokens(self) -> int:
        return self.batch_tokens if self.batch_tokens is not None else self.seq_len

    def check(self) -> None:
        def positive_int(name, allow_none=False, allow_zero=False):
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
                raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} int, got {value!r}")

        for name in ("epochs", "rank", "seq_len", "grad_accum"):
            positive_int(name)
        positive_int("max_steps", allow_none=True)
        positive_int("batch_tokens", allow_none=True)
        for name in ("warmup_steps", "eval_every", "save_every", "seed"):
            positive_int(name, allow_zero=True)

        def number(name) -> bool:  # a bool is an int to Python: weight_decay = true was read as 1.0
            value = getattr(self, name)
            return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)

        if self.seed > SEED_MAX:  # the shuffle seeds torch.Generator with seed x 100003 + epoch (batches.epoch_order)
            raise ValueError(f"seed must be at most {SEED_MAX} (the shuffle seeds a generator with seed x 100003 + "
                             f"epoch, at most 2**64 - 1), got {self.seed!r}")
        if self.max_steps is not None and self.epochs != 1:
            raise ValueError(f"epochs and max_steps: give one of them (max_steps = {self.max_steps} runs exactly that "
                             f"many optimizer steps, passes repeating; epochs = {self.epochs} would be ignored)")
        for name in ("lr", "alpha", "max_grad_norm"):
            # TOML has inf: lr = inf made every step's update non-finite, alpha = inf every LoRA output
            if not (number(name) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        if not (number("weight_decay") and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if not (number("dropout") and 0 <= self.dropout < 1):
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if not (number("eval_fraction") and 0 <= self.eval_fraction < 1):
            raise ValueError(f"eval_fraction must be a number in [0, 1), got {self.eval_fraction!r}")
        if self.eval_corpus is not None and self.eval_fraction > 0:
            raise ValueError("eval_corpus and eval_fraction: give one of them, not both")
        if self.eval_every and self.eval_corpus is None and not self.eval_fraction:
            raise ValueError(f"eval_every: {self.eval_every} needs eval data: give eval_fraction or eval_corpus")
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {self.parallel!r}")
        if self.parallel != "none" and self.qlora:
            raise ValueError("parallel: ddp / fsdp with qlora is not supported yet (a 4-bit base cannot be sharded here)")
        world = D.launched_world()
        if (self.parallel != "none" and world > 1 and self.grad_accum < world
                and resumed_config(self.resume).get("grad_accum") != self.grad_accum):
            # the step's micro-batches are dealt to the ranks: with fewer than the ranks, some ranks only ever run
            # zero-weight passes, and N GPUs train at the speed of grad_accum of them. A resume keeps its
            # checkpoint's grad_accum (RESUME_KEYS): refused here, it could never continue on more ranks (_train
            # says what it costs)
            raise ValueError(f"grad_accum: {self.grad_accum} micro-batch(es) per step on {world} ranks leaves "
                             f"{world - self.grad_accum} rank(s) with no data in every step; set grad_accum to a "
                             f"multiple of {world} (e.g. {world})")
        for name in ("shuffle", "pack", "patch", "random_init", "qlora"):
            # a run file's pack = "false" or shuffle = 0 would be read by truthiness: packing on, shuffling off
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.attention is not None and not isinstance(self.attention, bool):
            raise ValueError(f"attention must be true, false or left out (by device), got {self.attention!r}")
        if self.attention and not self.patch:
            raise ValueError("attention: hearth's attention is part of the patch; drop --no-patch (patch = false) "
                             "or --attention")
        if self.lora_compute not in LORA_COMPUTE:
            raise ValueError(f"lora_compute must be one of {', '.join(LORA_COMPUTE)}, got {self.lora_compute!r}")
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(SCHEDULES)}, got {self.lr_schedule!r}")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ValueError(f"targets must be a non-empty list of module names, got {self.targets!r}")
        if self.batch_tokens is not None and self.batch_tokens < self.seq_len:
            raise ValueError(f"batch_tokens ({self.batch_tokens}) must be >= seq_len ({self.seq_len}): "
                             "every example must fit one micro-batch")
        if self.memory_budget_gib is not None and not (number("memory_budget_gib") and self.memory_budget_gib > 0):
            raise ValueError(f"memory_budget_gib must be a finite number of GiB > 0, got {self.memory_budget_gib!r}")
        if self.max_steps is not None:  # the run's length is known before the corpus is read
            self.check_steps(self.max_steps, saved=resumed_config(self.resume))
        for key in ("corpus", "eval_corpus"):
            path = getattr(self, key)
            if path is not None and Path(path).name in CORPUS_FILES and publish_pending(Path(path).parent, CORPUS):
                # a `hearth corpus build` killed while it replaced the files: the folder may hold the previous
                # build, or no train.jsonl, while the build that was run is committed beside it (durable.CORPUS)
                raise ValueError(f"{key}: {Path(path).parent} holds a `hearth corpus build` that was interrupted while "
                                 f"it replaced the corpus files ({CORPUS_NEW} / {CORPUS_IN} there): run `hearth corpus "
                                 f"build` into {Path(path).parent} again, which completes it first, then writes its "
                                 "own")
        if not Path(self.corpus).is_file():
            raise ValueError(f"corpus: {self.corpus} is not a file (expected OUT_DIR/train.jsonl from `hearth corpus build`)")
        if self.eval_corpus is not None and not Path(self.eval_corpus).is_file():
            raise ValueError(f"eval_corpus: {self.eval_corpus} is not a file")
        if self.eval_corpus is not None and Path(self.eval_corpus).resolve() == Path(self.corpus).resolve():
            raise ValueError(f"eval_corpus: {self.eval_corpus} is the training corpus (the eval loss would be measured "
                             "on the examples trained on); give held-out examples, or eval_fraction to hold some out")
        if (self.eval_corpus is not None and Path(self.eval_corpus).stat().st_size == Path(self.corpus).stat().st_size
                and file_sha256(self.eval_corpus) == file_sha256(self.corpus)):  # a copy: the same examples
            raise ValueError(f"eval_corpus: {self.eval_corpus} has the same contents as the training corpus "
                             f"{self.corpus} (a copy: the eval loss would be measured on the examples trained on); "
                             "give held-out examples, or eval_fraction to hold some out")
        if not Path(self.model).exists():
            raise ValueError(f"model: {self.model} does not exist (a local model directory"
                             + (" or config JSON" if self.random_init else "") + "; nothing is downloaded)")
        if Path(self.out).resolve() == Path(self.model).resolve():
            raise ValueError(f"out: {self.out} is the model folder (the adapter, run.toml and metrics would be written "
                             "among the model's files); give the run its own out")
        # OUT is first written once the model is loaded: a file in its place (or on the way to it) fails here
        for folder in (Path(self.out), *Path(self.out).parents):
            if folder.exists():
                if not folder.is_dir():
                    raise ValueError(f"out: {folder} is a file, not a folder" +
                                     (f" (so {self.out} cannot be created)" if folder != Path(self.out) else ""))
                if not os.access(folder, os.W_OK | os.X_OK):
                    raise ValueError(f"out: cannot write in {folder} (permission denied)")
                break
        # what the run writes into OUT only once it has trained: a folder in the place of one of its files, or a
        # checkpoints/ that is no writable folder, failed the run there, the steps before lost (metrics.json with them)
        for name in OUT_FILES:
            if (Path(self.out) / name).is_dir():
                raise ValueError(f"out: {Path(self.out) / name} is a folder, where the run writes its {name} file; "
                                 "move it away or give the run another out")
        # the final adapter is published with peft's model card, README.md, the old set's files deleted
        # (durable.ADAPTER_FILES): a README.md no earlier adapter brought (no adapter_config.json beside it, no
        # interrupted publish) is the user's, and would be lost
        readme = Path(self.out) / "README.md"
        if ((readme.is_file() or readme.is_symlink()) and not (Path(self.out) / ADAPTER_CONFIG).is_file()
                and not publish_pending(Path(self.out), ADAPTER)):
            raise ValueError(f"out: {self.out} holds a README.md that no earlier run's adapter wrote; the run's adapter "
                             "is saved with peft's model card under that name and would replace it: move it away or "
                             "give the run another out")
        checkpoints = Path(self.out) / "checkpoints"
        if self.save_every and checkpoints.exists() and not checkpoints.is_dir():
            raise ValueError(f"out: {checkpoints} is a file, where save_every = {self.save_every} writes its "
                             "checkpoints (the first after that many steps); move it away or give the run another out")
        if self.save_every and checkpoints.is_dir() and not os.access(checkpoints, os.W_OK | os.X_OK):
            raise ValueError(f"out: cannot write in {checkpoints} (permission denied), where save_every = "
                             f"{self.save_every} writes its checkpoints")
        if self.resume is not None:
            find_checkpoint(self.resume)
        else:
            # a fresh run into an OUT that holds an earlier run's checkpoints would overwrite only the steps it
            # reaches: after a crash, `--resume OUT` would take the earlier run's later step and continue IT
            # (the checkpoints --resume OUT would take: not an interrupted save's step-N.tmp / step-N.old)
            earlier = [p.name for p in run_checkpoints(Path(self.out))]
            if earlier:
                raise ValueError(f"out: {self.out} already holds checkpoints of an earlier run ({earlier[-1]}, "
                                 f"{len(earlier)} in all); continue that run with --resume {self.out}, or give this "
                                 f"run another out (or delete {Path(self.out) / 'checkpoints'})")

    def check_positions(self, positions: int, longest: int, where: str) -> None:
        """ValueError naming seq_len when it lets through an example (``longest``: the longest fitted one) longer than
        the model has positions for (max_position_embeddings: positions it was never trained at, and a prompt a
        server of this model refuses). A seq_len above it over a corpus of shorter examples trains nothing wrong and
        is left alone. Packed rows restart their positions at each example: an example's length is what counts."""
        if longest > positions:
            raise ValueError(f"seq_len: {self.seq_len} lets examples of up to {longest} tokens through, longer than the "
                             f"model's max_position_embeddings = {positions} ({where}); lower --seq-len to at most "
                             f"{positions}")

    def check_steps(self, total: int, *, saved: dict | None = None) -> None:
        """ValueError naming warmup_steps, eval_every or save_every when it does not fit a run of ``total`` optimizer
        steps (check() with max_steps; the runner once the corpus has given the step plan, before the model loads).

        ``saved``: the config of the checkpoint this run resumes (resumed_config). A value the checkpoint's run was
        started with is not refused: checkpoints written before these checks hold such runs, and warmup_steps is a
        resume key (check_resume), so refusing it left the run no way to continue. The run's length is a resume key
        too: the resume repeats the schedule it was saved with. A value changed for the resume is checked."""
        saved = saved or {}

        def kept(name: str) -> bool:
            return name in saved and saved[name] == getattr(self, name)

        unit = f"the run's {total} optimizer steps"
        if self.warmup_steps and self.warmup_steps >= total and not kept("warmup_steps"):
            raise ValueError(f"warmup_steps: {self.warmup_steps} is not shorter than {unit}: the lr would reach its "
                             f"peak at the last step at best and never decay ({self.lr_schedule}); use fewer warm-up "
                             f"steps (e.g. {max(1, total // 10)}), or a longer run")
        if self.eval_every and self.eval_every > total and not kept("eval_every"):
            raise ValueError(f"eval_every: {self.eval_every} is longer than {unit}: no evaluation but the last step's "
                             f"(as eval_every = 0); use at most {total}")
        if self.save_every and self.save_every >= total and not kept("save_every"):
            raise ValueError(f"save_every: {self.save_every} is not shorter than {unit}: no checkpoint would be written "
                             f"(the last step writes the adapter, not a checkpoint); use less than {total}, or 0")

    def as_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}


# ------------------------------------------------------------------------------------------- config file
KEYS = {f.name for f in fields(FinetuneConfig)}


def read_toml(path: Path) -> dict:
    """The keys of a RUN.toml (flat, or under a [train] table). ValueError naming ``config`` for an unknown
    key or a file that is not TOML. Relative paths in it are relative to the current directory."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"config: cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config: {path} is not TOML: {exc}") from None
    if set(doc) == {"train"} and isinstance(doc["train"], dict):
        doc = doc["train"]
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise ValueError(f"config: unknown key(s) {', '.join(unknown)} in {path} (known: {', '.join(sorted(KEYS))})")
    return doc


def resolve(config_file: Path | None, flags: dict) -> FinetuneConfig:
    """defaults < RUN.toml < flags (a flag left at None does not override). ValueError naming what is missing."""
    values = read_toml(config_file) if config_file is not None else {}
    given = {k: v for k, v in flags.items() if v is not None}
    # the run's length is one setting given two ways: a flag for it replaces the file's (RUN.toml's epochs = 2 with
    # --max-steps 10, a quick trial of a real run, runs 10 steps), where both in one place stay an error (check())
    for flag, other in (("max_steps", "epochs"), ("epochs", "max_steps")):
        if flag in given and other not in given:
            values.pop(other, None)
    values.update(given)
    missing = [k for k in ("corpus", "model", "out") if values.get(k) in (None, "")]
    if missing:
        raise ValueError(f"{missing[0]}: required (as --{missing[0]} or in the config file)")
    try:
        return FinetuneConfig(**values)
    except TypeError as exc:
        raise ValueError(f"config: {exc}") from None


def to_toml(cfg: FinetuneConfig) -> str:
    """The resolved config as TOML that read_toml takes back (None values are left out)."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))  # a JSON string is a valid TOML basic string

    lines = ["# hearth train: the resolved config of this run (`hearth train run.toml` repeats it)"]
    lines += [f"{k} = {value(v)}" for k, v in cfg.as_dict().items() if v is not None]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- memory plan
@dataclass
class CheckpointPlan:
    """checkpointed: how many of the `layers` decoder layers recompute their activations in the backward."""

    checkpointed: int
    layers: int
    estimate_gib: float
    budget_gib: float | None
    reason: str
    table: list[dict] = field(default_factory=list)
    fits: bool = True  # False: even full checkpointing is estimated over the budget

    @property
    def mode(self) -> str:
        return "none" if self.checkpointed == 0 else "full" if self.checkpointed == self.layers else "selective"


def _widths(config) -> tuple[int, int, int, int]:
    """(H, I, Q, K): hidden, intermediate, query width Hq*D and key/value width Hk*D."""
    h, i = config.hidden_size, config.intermediate_size
    d = getattr(config, "head_dim", None) or h // config.num_attention_heads
    return h, i, config.num_attention_heads * d, config.num_key_value_heads * d


def layer_activation_bytes_per_token(config, *, patched: bool, bytes_per_el: int, lora_bytes_per_el: int = 4,
                                     fused_lora: bool = False, liger: bool = False, fused_mlp: bool = False) -> int:
    """What ONE non-checkpointed decoder layer keeps for its backward, per token, with LoRA on all seven
    projections (q, k, v, o, gate, up, down; the frozen base Linears save nothing: no weight gradient).

    Elements of hidden H, intermediate I, query width Q = Hq*D, key/value width K = Hk*D, b = bytes_per_el:
      the two decoder norms keep their inputs                                         2H
      q_norm / k_norm keep their inputs Q + K; SDPA keeps q, k, v (Q + 2K) and its output Q   3Q + 3K
      the SwiGLU keeps g and u                                                        2I
      h = silu(g) * u, kept unless the SwiGLU recomputes it (Liger's swiglu; hearth's swiglu kernel,
      fused_mlp, which hearth.patch's MLP uses since 2026-12-01; hearth's LoRA MLP node, fused_lora);
      the issue-16 rows were measured with a hearth MLP that kept it                  + I
      HF's RMSNorm (neither hearth nor Liger patched in) keeps an fp32 copy of each norm
      input instead of the bf16 one: + (4 - b) bytes on 2H + Q + K
      peft's fp32 LoRA on a 16-bit base: each LoRA'd projection casts its input to fp32 and
      lora_A keeps that copy (q, k, v, gate and up read H each: 5H; o_proj Q; down_proj I;
      the bf16 normed outputs themselves are then kept by nobody)              + (5H + Q + I) x 4 bytes
      fused_lora (hearth's LoRA nodes): no fp32 copy and no h, but each node keeps its bf16
      input: the two normed outputs (o_proj's input is SDPA's output, counted)      + 2H instead
      LoRA in the base dtype (no cast): lora_A keeps the normed outputs and h themselves   + 2H + I
    Derived from measured H200 peaks (Qwen3-14B shape, 2026-12-01, max_memory_allocated): without
    checkpointing at 4096 tokens HF + peft kept 387.9 KB per token per layer (this gives 387.1), Liger 322.5
    (319.5), hearth 357.2 (354.3); tests/train/test_planner_h200.py pins every row.
    """
    h, i, q, k = _widths(config)
    b = bytes_per_el
    elements = 2 * h + 3 * q + 3 * k + 2 * i
    keeps_h = not (liger or fused_lora or fused_mlp)
    extra = 0
    if not (patched or liger):
        extra += (2 * h + q + k) * max(4 - b, 0)
    if fused_lora:
        elements += 2 * h
    elif lora_bytes_per_el != b:
        extra += (5 * h + q + i) * lora_bytes_per_el
    else:  # LoRA in the base dtype (e.g. an fp32 model): lora_A keeps the normed outputs and h themselves
        elements += 2 * h
        keeps_h = True
    if keeps_h:
        elements += i
    return elements * b + extra


def backward_bytes_per_token(config, *, bytes_per_el: int) -> int:
    """The working set of one layer's backward on top of what it saved: the incoming hidden gradient (H) and
    the gradients of g, u and h (3I), b bytes each. Fitted to the same rows: the recompute of a checkpointed
    layer costs its activations plus 111.6 KB per token at the 14B shape (this gives 114.7)."""
    h, i, _, _ = _widths(config)
    return (h + 3 * i) * bytes_per_el


def loss_bytes_per_token(config, *, patched: bool, bytes_per_el: int, liger: bool = False) -> int:
    """What the loss holds at its backward, per token. A fused linear cross entropy (hearth's, Liger's) never
    makes the [T, V] logits: the hidden-state gradient (H x b; its chunk of logits is in the fixed term).
    HF's loss: the logits (V x b), their fp32 log-probabilities (4V), the fp32 gradient (4V) and the logits'
    gradient (V x b): V x (2b + 8), 12V bytes in bf16 (the H200 rows: 1.84 MB per token at V=151936, this
    gives 1.82)."""
    if patched or liger:
        return config.hidden_size * bytes_per_el
    return config.vocab_size * (2 * bytes_per_el + 8)


def sdpa_mask_bytes_per_token(config, tokens: int, mask_rows: int, *, bytes_per_el: int) -> int:
    """What a micro-batch that reaches SDPA WITH a mask adds, per token, to each decoder layer that keeps its
    activations (0 when mask_rows is 0: no mask). That is a padded micro-batch with padding (transformers' [B, 1, T, T]
    padding mask; hearth's attention hands those to SDPA too) and a packed row of several sequences that hearth's
    varlen attention does not take (the [1, 1, T, T] block-diagonal mask); ``tokens`` is mask_rows x T.

    With a mask, transformers' SDPA path repeats k and v to the query heads (repeat_kv: its GQA path is for mask-free
    calls only), so SDPA keeps k and v at the query width, 2 (Q - K) more than layer_activation_bytes_per_token's
    Q + 2K; and torch's SDPA turns the boolean mask into an additive one of the compute dtype, which its
    memory-efficient kernel keeps for the backward: T x b per token, in every layer (one copy per call). The bool
    mask itself (T x 1 byte per token, shared by the layers) is in estimate_peak_gib's fixed term. Checked against
    the H200's packed row on SDPA (16384 tokens in 8 sequences, 21 of 40 layers checkpointed): 92.25 GiB measured,
    77.00 with the varlen kernel; this adds (16384 + 2 x 4096) x 2 bytes per token to the 20 layers holding
    activations at the peak plus the 0.25 GiB bool mask: 15.25 GiB, the whole gap."""
    if not mask_rows:
        return 0
    _, _, q, k = _widths(config)
    width = -(-tokens // mask_rows)
    return (width + 2 * (q - k)) * bytes_per_el


FIXED_BYTES = 256 << 20
"""Beyond weights and optimizer state: cuBLAS workspaces, the fused loss's logits chunk, allocator rounding.
The measured peaks are torch.cuda.max_memory_allocated (what tensors hold), so the caching allocator's
reserve and fragmentation (small with expandable_segments:True) are not in them; measured intercept over
weights + LoRA state: 0.06 GiB; 0.25 keeps every estimate at or above its row."""


PLAN_MARGIN = 0.01


def estimate_peak_gib(config, tokens: int, checkpointed: int, *, weights_bytes: int, trainable_bytes: int,
                      bytes_per_el: int, patched: bool, liger: bool = False, fused_lora: bool = False,
                      qlora: bool = False, fused_mlp: bool = False, mask_rows: int = 0, fsdp_root_bytes: int = 0,
                      fsdp_layer_bytes: int = 0) -> float:
    """Estimated peak GiB (torch.cuda.max_memory_allocated) of one LoRA step with `checkpointed` of the decoder
    layers (the LAST ones, as apply_checkpointing picks them) recomputed in the backward.

    Knobs: patched (hearth.patch: its norms, rope and fused loss; its MLP is unfused under peft unless
    fused_lora), liger (Liger's RMSNorm, rope, SwiGLU and fused linear cross entropy), fused_lora (hearth's
    LoRA nodes), qlora (a 4-bit base: each frozen weight is dequantised to the compute dtype while it is used,
    the largest, H x I, alive in a layer's backward), mask_rows (the micro-batch's `tokens` are that many rows that
    reach SDPA with a [T, T] mask each: sdpa_mask_bytes_per_token, added to A; 0: no mask).

    FSDP (parallel = "fsdp"): weights_bytes and trainable_bytes are the rank's 1/N shards, and what FSDP2 holds
    unsharded beside them is added (hearth.train.distributed.fsdp_gathered_bytes says how it gathers):
    fsdp_root_bytes (embeddings, final norm, lm_head: whole for the whole step) to the fixed part, and
    fsdp_layer_bytes (the largest decoder layer, in the all-gather dtype) twice at a layer's backward (its own
    parameters and the previous layer's prefetched all-gather), once at the loss's backward.

    peak = weights + 3 x trainable (the fp32 LoRA parameters and AdamW's m and v: their gradients appear
           only as the backward goes, after the peak) + FIXED_BYTES (+ H x I x b with qlora) (+ fsdp_root_bytes)
           + tokens x [ c x H x b                            (a checkpointed layer keeps only its input)
                        + (L - c) x A ]                      (A = layer_activation_bytes_per_token)
           + max(tokens x loss (+ fsdp_layer_bytes),         (the loss's backward, loss_bytes_per_token)
                 tokens x ((A if c else 0) + B)              (the first layer's backward: recomputed if
                 (+ 2 x fsdp_layer_bytes))                    checkpointed, B = backward_bytes_per_token)
    Within -0.4..+1.1% of all 25 measured peaks of the current stack (HF, Liger, hearth; none, selective,
    full; 4096 and 16384 tokens; QLoRA at 2048): tests/train/test_planner_h200.py.
    """
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens!r}")
    layers = config.num_hidden_layers
    if not 0 <= checkpointed <= layers:
        raise ValueError(f"checkpointed must be in [0, {layers}], got {checkpointed!r}")
    h, i, _, _ = _widths(config)
    act = layer_activation_bytes_per_token(config, patched=patched, bytes_per_el=bytes_per_el,
                                           fused_lora=fused_lora, liger=liger, fused_mlp=fused_mlp)
    loss = loss_bytes_per_token(config, patched=patched, bytes_per_el=bytes_per_el, liger=liger)
    backward = backward_bytes_per_token(config, bytes_per_el=bytes_per_el)
    act += sdpa_mask_bytes_per_token(config, tokens, mask_rows, bytes_per_el=bytes_per_el)
    fixed = weights_bytes + 3 * trainable_bytes + FIXED_BYTES + (h * i * bytes_per_el if qlora else 0) + fsdp_root_bytes
    if mask_rows:  # transformers' boolean mask, [rows, 1, T, T], shared by the layers
        fixed += tokens * -(-tokens // mask_rows)
    c = checkpointed
    kept = tokens * (c * h * bytes_per_el + (layers - c) * act)
    at_loss = tokens * loss + min(1, layers) * fsdp_layer_bytes
    at_layer = tokens * ((act if c else 0) + backward) + min(2, layers) * fsdp_layer_bytes
    return (fixed + kept + max(at_loss, at_layer)) / GIB


def patch_knobs(report, lora_dropout: float = 0.0) -> dict:
    """estimate_peak_gib's knobs for a model that hearth.patch.apply reported on (None: nothing patched): the
    loss kernel (patched), hearth's MLP (fused_mlp: h is recomputed, not kept) and the fused LoRA nodes
    (fused_lora). One derivation for `hearth train` and the GPU scripts that plan as it does.

    lora_dropout > 0 on a LoRA model: the report still counts the LoRA layers and the MLP it switched in, but in
    training they are not in a plain state (dropout in effect), so every call takes peft's own forward and the MLP
    calls its wrapped projections as modules, keeping h: neither fused knob holds, and planning with them would
    under-count the activations."""
    lora = bool(report and report.count("lora"))
    unfused = lora and lora_dropout > 0
    return {"patched": bool(report and report.count("loss")),
            "fused_mlp": bool(report and report.count("mlp")) and not unfused, "fused_lora": lora and not unfused}


def packed_mask_note(pack: bool, report, device_type: str) -> str | None:
    """The start-up note for packed rows that do not run hearth's varlen attention (no attention patch: off Hopper
    by default, --no-attention, --no-patch): transformers then attends through SDPA with a [T, T] block-diagonal
    mask per row, which costs memory (the plan counts it: sdpa_mask_bytes_per_token) and time. None when there is
    nothing to say."""
    if not pack or device_type != "cuda" or (report is not None and report.count("attention")):
        return None
    return ("packed rows run through SDPA with transformers' [T, T] block-diagonal mask: SDPA keeps a copy of the "
            "mask and k / v repeated to the query heads in every layer (Qwen3-14B shape, 16384 tokens in 8 sequences, "
            "on an H200: 92.2 GiB at peak against a 78.5 GiB plan that left them out; the plan counts them now, so it "
            "checkpoints more under the same --memory-budget-gib), and runs at 0.46x the tokens/s of hearth's varlen "
            "attention. Use hearth's attention (--attention, where the kernels run; the default on Hopper).")


def plan_checkpointing(config, tokens: int, *, weights_bytes: int, trainable_bytes: int, bytes_per_el: int,
                       budget_gib: float | None, patched: bool, liger: bool = False, fused_lora: bool = False,
                       qlora: bool = False, fused_mlp: bool = False, mask_rows: int = 0,
                       batches: list[tuple[int, int]] | None = None, fsdp_root_bytes: int = 0,
                       fsdp_layer_bytes: int = 0) -> CheckpointPlan:
    """The fewest checkpointed layers whose estimated peak (estimate_peak_gib, same knobs) fits the budget
    (fewer = less recompute = faster).

    The estimate must fit the budget less PLAN_MARGIN: the estimates land within -0.4..+1.1% of the measured
    peaks, and one under (HF at 16384 tokens) overran an 80 GiB budget by 0.12 GiB without the margin.
    Recompute costs about one extra forward per checkpointed layer (~1/3 of its fwd+bwd time), so c=0 is the
    fastest and c=L the slowest; none fitting falls back to full checkpointing (reported as over budget).

    batches: (tokens, mask_rows) of every micro-batch shape the run takes (micro_batch_shapes); the estimate is the
    largest over them (a masked micro-batch of fewer tokens can need more than the longest unmasked one). Default:
    the one micro-batch (tokens, mask_rows).

    fsdp_root_bytes, fsdp_layer_bytes: what FSDP holds unsharded on each rank (estimate_peak_gib); the reason then
    says what was counted.
    """
    layers = config.num_hidden_layers
    shapes = batches or [(tokens, mask_rows)]
    counted = (f"; FSDP per rank: 1/N of the weights and LoRA state, plus the unsharded root "
               f"(embeddings, final norm, lm_head: {fsdp_root_bytes / GIB:.2f} GiB, whole for the step) and up to "
               f"{min(2, layers)} decoder layers in flight ({fsdp_layer_bytes / GIB:.2f} GiB each: the running layer "
               "and the prefetched next / previous one)") if (fsdp_root_bytes or fsdp_layer_bytes) else ""

    def peak(c: int) -> float:
        return max(estimate_peak_gib(config, t, c, weights_bytes=weights_bytes, trainable_bytes=trainable_bytes,
                                     bytes_per_el=bytes_per_el, patched=patched, liger=liger, fused_lora=fused_lora,
                                     qlora=qlora, fused_mlp=fused_mlp, mask_rows=r, fsdp_root_bytes=fsdp_root_bytes,
                                     fsdp_layer_bytes=fsdp_layer_bytes) for t, r in shapes)

    table = [{"checkpointed": c, "estimate_gib": round(peak(c), 2)} for c in sorted({0, layers // 4, layers // 2, 3 * layers // 4, layers})]
    if budget_gib is None:
        return CheckpointPlan(0, layers, peak(0), None,
                              "no memory budget (CPU, none given): no checkpointing" + counted, table)
    limit = budget_gib * (1 - PLAN_MARGIN)
    for c in range(layers + 1):
        if peak(c) <= limit:
            mode = "none" if c == 0 else "full" if c == layers else f"selective ({c} of {layers} layers)"
            why = (f"{mode}: estimated peak {format_gib(peak(c))} GiB fits the {format_gib(budget_gib)} GiB budget (less "
                   f"{PLAN_MARGIN:.0%}: {format_gib(limit)})"
                   + (f"; one layer fewer would need {format_gib(peak(c - 1), limit)} GiB" if c else "; fastest setup")
                   + counted)
            return CheckpointPlan(c, layers, peak(c), budget_gib, why, table)
    return CheckpointPlan(layers, layers, peak(layers), budget_gib,
                          f"full: even full checkpointing is estimated at {format_gib(peak(layers), budget_gib)} GiB, "
                          f"over the {format_gib(budget_gib)} GiB budget (lower --seq-len / --batch-tokens, use --qlora, or a GPU "
                          "with more memory)" + counted, table, fits=False)


def micro_batch_shapes(examples: list[Example], mbs, *, pack: bool, varlen: bool) -> list[tuple[int, int]]:
    """(tokens, mask_rows) of the micro-batches ``mbs`` (lists of indices into ``examples``) for plan_checkpointing,
    keeping only the ones that can set the peak. Padded: rows x the longest, padding included, and a mask over every
    row when any row is padded. Packed: the sum, with a mask (one row) when several sequences share the row and
    ``varlen`` is False (hearth's varlen attention not patched in: transformers' block-diagonal mask on SDPA)."""
    unmasked, masked = 0, set()
    for mb in mbs:
        lengths = [len(examples[i]) for i in mb]
        if pack:
            tokens, rows = sum(lengths), 1 if len(lengths) > 1 and not varlen else 0
        else:
            tokens, rows = max(lengths) * len(lengths), len(lengths) if min(lengths) < max(lengths) else 0
        if rows:
            masked.add((tokens, rows))
        else:
            unmasked = max(unmasked, tokens)
    keep, widest = [], 0  # masked shapes no other one beats on both tokens and mask size (tokens x T)
    for tokens, rows in sorted(masked, key=lambda s: (-s[0], s[1])):
        if tokens * -(-tokens // rows) > widest:
            keep.append((tokens, rows))
            widest = tokens * -(-tokens // rows)
    return ([(unmasked, 0)] if unmasked and not (keep and keep[0][0] >= unmasked) else []) + keep


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing on every decoder layer (no input-grad hook needed with LoRA)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x: the new name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # 5.17 (the H200 image) has only the old one
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def apply_checkpointing(model, plan: CheckpointPlan) -> int:
    """Turn on non-reentrant checkpointing for the LAST plan.checkpointed decoder layers; returns how many
    layers were switched. (The last layers: their activations are freed first in the backward, so keeping
    the early layers un-checkpointed does not raise the peak further.)"""
    if plan.checkpointed == 0:
        return 0
    enable_checkpointing(model)
    layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing") and type(m).__name__.endswith("DecoderLayer")]
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index >= len(layers) - plan.checkpointed
    return sum(layer.gradient_checkpointing for layer in layers)


def format_gib(value: float, other: float | None = None) -> str:
    """A GiB figure for a message: one decimal from 1 GiB up (80.0, 21.6), two significant digits below it (0.2,
    0.05, 0.00001: a small --memory-budget-gib printed as given, not as "0.0"), and more decimals while ``other`` would
    print the same (a need just over its budget: "need 24.04 GiB, over the 24.0 GiB budget")."""
    if not math.isfinite(value) or value <= 0:
        return f"{value:.1f}"
    decimals = 1 if value >= 1 else max(1, 1 - math.floor(math.log10(value)))
    if other is not None and math.isfinite(other):
        while decimals < 9 and f"{value:.{decimals}f}" == f"{other:.{decimals}f}":
            decimals += 1
    text = f"{value:.{decimals}f}"
    if decimals > 1:  # 0.20 -> 0.2, 24.00 -> 24.0: the digits that were needed, no padding
        text = text.rstrip("0")
        text += "0" if text.endswith(".") else ""
    return text


def refuse_over_budget(weights_bytes: int, trainable_bytes: int, budget_gib: float | None, *,
                       qlora: bool, qlora_weights_bytes: int | None = None, parallel: str = "none",
                       world: int = 1) -> None:
    """RunError when the weights (+ the LoRA parameters, their gradients and AdamW state) alone exceed the
    budget: no checkpointing or sequence length can fix that. ``weights_bytes`` / ``trainable_bytes`` are one
    rank's (under fsdp: 1/world of the model's). The message says what can: in one process --qlora (with the 4-bit
    size) or a larger GPU; under parallel = "fsdp" more ranks (how many the weights alone need) or larger GPUs; under
    "ddp" (every rank holds the whole model) parallel = "fsdp". --qlora is refused with either (check())."""
    if budget_gib is None:
        return
    need = (weights_bytes + 4 * trainable_bytes) / GIB
    if need <= budget_gib:
        return
    what = "4-bit" if qlora else "16-bit" if weights_bytes else ""
    if parallel == "fsdp":
        ranks = math.ceil(need * world / budget_gib)  # the whole model's, spread 1/N a rank
        fix = (f"more ranks (FSDP keeps 1/N of them on each rank: at least {ranks} for the weights and LoRA state "
               f"alone, more for the activations) or GPUs with more memory (--qlora cannot be combined with parallel)")
    elif parallel == "ddp":
        fix = ("parallel = \"fsdp\" (DDP keeps the whole model on every rank; FSDP keeps 1/N of it) or GPUs with more "
               "memory (--qlora cannot be combined with parallel)")
    elif qlora:
        fix = "a GPU with more memory"
    else:
        fix = (f"--qlora (a 4-bit NF4 base: about {format_gib((qlora_weights_bytes or 0) / GIB)} GiB of weights) or a GPU with "
               "more memory")
    raise RunError(f"memory_budget_gib: the {what} model weights and LoRA state alone need {format_gib(need, budget_gib)} GiB"
                   f"{' per rank' if parallel != 'none' else ''}, over the {format_gib(budget_gib)} GiB budget; no activation checkpointing or shorter --seq-len can fix that: use {fix}")


# ------------------------------------------------------------------------------------------- model
def model_config(path: Path, *, random_init: bool):
    """The transformers config of --model (a local folder, or with --random-init a config JSON / a folder
    holding config.json). ValueError naming ``model``."""
    from transformers import AutoConfig

    path = Path(path)
    if random_init:
        cfg_path = path / "config.json" if path.is_dir() else path
        try:
            raw = json.loads(cfg_path.read_text(encoding="utf-8"))
            model_type = raw.pop("model_type")
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"model: {cfg_path} is not a config JSON with a model_type ({exc})") from exc
        config = AutoConfig.for_model(model_type, **raw)
    else:
        try:
            config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ValueError(f"model: cannot read a model config from {path}: {exc}") from exc
    config._attn_implementation = "sdpa"
    return config


def weight_bytes(config, *, dtype, targets, rank: int) -> dict:
    """Sizes from a meta-device build (no memory): 16-bit weights, the same with every decoder Linear in
    NF4 (QLoRA), and the fp32 LoRA parameters for ``targets`` at ``rank``."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    from hearth.train.qlora import NF4_BYTES_PER_PARAM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    el = torch.finfo(dtype).bits // 8
    head = model.get_output_embeddings()
    linear = sum(m.weight.numel() for m in model.modules() if type(m) is nn.Linear and m is not head)
    total = sum(p.numel() for p in model.parameters())
    def targeted(name: str, target: str) -> bool:  # peft's match: the module's name or a dotted suffix of it
        return name == target or name.endswith("." + target)

    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    lora = sum(rank * (m.in_features + m.out_features) for n, m in linears if any(targeted(n, t) for t in targets))
    return {"weights": total * el, "weights_4bit": int((total - linear) * el + linear * NF4_BYTES_PER_PARAM),
            "lora_fp32": lora * 4,
            # targets no Linear of the model matches: peft would skip them without a word when another one matched
            "missing_targets": [t for t in targets if not any(targeted(n, t) for n, _ in linears)],
            "linear_names": sorted({n.rsplit(".", 1)[-1] for n, _ in linears})}


def load_model(path: Path, *, random_init: bool, dtype, device, qlora: bool = False, config=None, seed: int = 0):
    """A causal LM from a local directory (from_pretrained, local_files_only), or with --random-init
    from a config JSON file / a directory holding config.json (from_config, weights random, built on device).
    qlora: the decoder's Linears in 4-bit NF4 (hearth.train.qlora)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = config or model_config(path, random_init=random_init)
    if qlora:
        from hearth.train import qlora as q

        try:
            model = (q.random_4bit(config, dtype=dtype, device=device, seed=seed) if random_init
                     else q.load_4bit(path, dtype=dtype, device=device))
        except ImportError as exc:
            raise ValueError(f"qlora: needs bitsandbytes ({exc}); pip install 'hearth[train]'") from exc
        return q.prepare(model)
    if random_init:
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype,
                                                     attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise ValueError(f"model: cannot load a causal LM from {path}: {exc}") from exc
    return model.to(device)


def add_lora(model, *, rank: int, alpha: float, targets=LORA_TARGETS, dropout: float = 0.0):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                            lora_dropout=dropout, bias="none", task_type="CAUSAL_LM"))


def probe_loss_kernel(device, dtype) -> str | None:
    """None when hearth's fused linear cross-entropy runs on this device and matches torch's loss on a
    small random input; else why not (hearth.patch probes the norm, rope and MLP itself, not the loss)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    h = torch.randn(6, 32, generator=gen).to(device=device, dtype=dtype)
    w = torch.randn(40, 32, generator=gen).to(device=device, dtype=dtype)
    y = torch.tensor([1, 5, IGNORE_INDEX, 39, 0, 7], device=device)
    want = torch.nn.functional.cross_entropy((h.float() @ w.float().T), y, ignore_index=IGNORE_INDEX)
    try:
        from hearth.kernels.linear_cross_entropy import linear_cross_entropy

        with torch.no_grad():
            got = linear_cross_entropy(h, w, y, ignore_index=IGNORE_INDEX)
    except Exception as exc:  # no GPU and no interpreter, an old Triton...
        return f"loss probe: hearth's kernel raised {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    if not torch.allclose(got.float(), want, rtol=tol, atol=tol):
        return f"loss probe: {got.item():.6g} differs from torch's {want.item():.6g}"
    return None


# ------------------------------------------------------------------------------------------- schedule
def step_plan(train: list[Example], cfg: FinetuneConfig) -> list[tuple[int, int, list[list[int]]]]:
    """Every optimizer step of the run as (epoch, step within the epoch, micro-batches): `epochs` passes,
    or exactly max_steps (passes repeat, each reshuffled) when max_steps is given."""
    steps: list[tuple[int, int, list[list[int]]]] = []
    epoch = 0
    while True:
        plan = plan_epoch(train, epoch, seed=cfg.seed, shuffle=cfg.shuffle, batch_tokens=cfg.micro_tokens,
                          pack=cfg.pack, grad_accum=cfg.grad_accum)
        for i, mbs in enumerate(plan):
            if cfg.max_steps is not None and len(steps) == cfg.max_steps:
                return steps
            steps.append((epoch, i, mbs))
        epoch += 1
        if cfg.max_steps is None and epoch == cfg.epochs:
            return steps


def lr_factor(step: int, *, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): linear warm-up over ``warmup`` steps
    (the first step at 1/warmup), then cosine or linear decay towards 0 at ``total``, or constant."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress


# ------------------------------------------------------------------------------------------- checkpoints
# a resumed run must see the same data and model: these keys may not change between the run and its resume
RESUME_KEYS = ("corpus", "model", "seed", "shuffle", "seq_len", "batch_tokens", "grad_accum", "pack", "rank", "alpha",
               "targets", "eval_fraction", "eval_corpus", "qlora", "random_init", "epochs", "max_steps", "lr",
               "lr_schedule", "warmup_steps",
               "weight_decay",  # AdamW's restored param groups carry it: another value would be silently ignored
               # the step's math: another dropout, clipping norm or low-rank precision is another training, so a
               # resume that changes one would not reproduce the uninterrupted run's losses
               "dropout", "max_grad_norm", "lora_compute")


# what save_checkpoint has written into a checkpoint folder before it takes its name (load_checkpoint reads them),
# besides its optimizer state: optimizer.pt, or optimizer-rank-R.pt under fsdp
_CHECKPOINT_FILES = ("state.json", "adapter_config.json", "adapter_model.safetensors", "scheduler.pt", "rng.pt")


def _whole_checkpoint(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _CHECKPOINT_FILES) and (
        (folder / "optimizer.pt").is_file() or any(folder.glob("optimizer-rank-*.pt")))


def _restore_replaced(final: Path) -> None:
    """A re-save of step-N renames the old folder to step-N.old, the new one to step-N, then deletes the .old. Killed
    between the two renames, the previous step-N (whole: it was on the disk before it first took its name) is left
    only as step-N.old, and --resume would take step N-1. Put it back under its name (as export.py does for an
    export). An .old that is not whole (its delete was cut short, after the new step-N had the name) stays ignored."""
    final = Path(final)
    old = final.with_name(final.name + ".old")
    if not old.is_dir() or not _whole_checkpoint(old):
        return
    try:
        restore_aside(final, old)
    except OSError:
        if not (final / "state.json").is_file():  # not another rank (or process) that put it back first
            raise


def run_checkpoints(out: Path) -> list[Path]:
    """The complete checkpoints under OUT/checkpoints, the highest step last: step-NNNNNN folders holding state.json
    (a step-NNNNNN.tmp is a save a crash interrupted, a step-NNNNNN.old one being replaced: neither is a checkpoint;
    a whole step-NNNNNN.old with no step-NNNNNN, a replacement killed between its renames, is renamed back first)."""
    folder = Path(out) / "checkpoints"
    if not folder.is_dir():
        return []
    for old in sorted(folder.glob("step-*.old")):
        if old.name[5:-4].isdigit():
            _restore_replaced(old.with_name(old.name[:-4]))
    return [p for _, p in sorted((int(p.parent.name[5:]), p.parent) for p in folder.glob("step-*/state.json")
                                 if p.parent.name[5:].isdigit())]


def find_checkpoint(path: Path) -> Path:
    """A checkpoint folder (holding state.json), or the latest under PATH/checkpoints. ValueError naming resume."""
    path = Path(path)
    if path.name.startswith("step-") and path.name[5:].isdigit():
        _restore_replaced(path)  # a step folder a killed re-save left only as step-N.old
    if (path / "state.json").is_file():
        return path
    found = run_checkpoints(path)
    if not found:
        raise ValueError(f"resume: {path} is not a checkpoint folder (with state.json) nor a run folder with checkpoints/")
    # the latest checkpoint of the line of training metrics.jsonl describes: one its rows do not lead to is of a line
    # abandoned by a resume from an earlier step (an OUT an earlier hearth left so, which did not move such
    # checkpoints aside, or one put back by hand). A log that leads to none of them (gone, or rewritten without its
    # earlier rows) cannot tell: the highest step, as before
    log = path / "metrics.jsonl"
    if log.is_file():
        rows = metrics_rows(log, upto=math.inf)
        on_line = [p for p in found if leads_to(rows, _state_of(p))]
        if on_line:
            return on_line[-1]
    return found[-1]


def _state_of(checkpoint: Path) -> dict:
    try:
        state = json.loads((Path(checkpoint) / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def leads_to(rows: list[dict], state: dict) -> bool:
    """Whether metrics.jsonl's ``rows`` are of the line of training that saved the checkpoint whose state.json is
    ``state``: they hold its step's row (written and fsynced before the checkpoint takes its name), with the loss the
    checkpoint recorded (checkpoints saved before that was recorded: any row of its step). A state with no step
    cannot be judged: True (check_resume refuses it)."""
    step = state.get("step")
    if not isinstance(step, int):
        return True
    mine = [r for r in rows if r.get("step") == step]
    if not mine:
        return False
    return "loss" not in state or any(r.get("loss") == state["loss"] for r in mine)


def superseded_name(folder: Path) -> Path:
    """A new folder under ``folder`` for the checkpoints of an abandoned line: superseded-<local time>[-k]."""
    base = folder / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def set_aside_later(out: Path, step: int, resumed: Path) -> tuple[Path | None, list[str]]:
    """A run resuming from ``step`` starts a new line of training: the checkpoints under OUT/checkpoints of later
    steps (and of the same step, when the checkpoint resumed is another folder) belong to the line it leaves, and
    `--resume OUT` must never take one as the latest. They are moved, never deleted, into
    OUT/checkpoints/superseded-<time>/ with a copy of OUT's metrics.jsonl / metrics.json as they were (the rows of that
    line past ``step``, which this run's metrics.jsonl drops). One rename per folder, the highest step first, the one
    resumed never touched: killed part-way, OUT keeps a prefix of the old line, which its metrics.jsonl (rewritten
    only after this) still describes, and the same resume moves the rest. Returns (that folder or None, the names)."""
    import shutil

    from hearth.durable import fsync

    folder = Path(out) / "checkpoints"
    if not folder.is_dir():
        return None, []
    same = (folder / f"step-{step:06d}").resolve() == Path(resumed).resolve()

    def number(p: Path) -> int | None:
        digits = p.name[5:].split(".", 1)[0]
        return int(digits) if p.name.startswith("step-") and digits.isdigit() else None

    later = sorted((p for p in folder.iterdir() if (n := number(p)) is not None and (n > step or (n == step and not same))),
                   key=lambda p: (-number(p), p.name))
    if not later:
        return None, []
    dest = superseded_name(folder)
    dest.mkdir()
    for name in ("metrics.jsonl", "metrics.json"):
        if (Path(out) / name).is_file():
            shutil.copy2(Path(out) / name, dest / name)
            fsync(dest / name)
    fsync(dest)
    fsync(folder)
    for p in later:
        p.rename(dest / p.name)
    fsync(dest)
    fsync(folder)
    return dest, [p.name for p in later]


# an earlier run's files at OUT's top level, which a fresh run moves aside before it writes (set_aside_earlier_run):
# the adapter first (durable.ADAPTER_FILES, adapter_config.json leading: killed part-way, OUT never holds a config
# beside missing weights), then run.toml and the metrics. Their leftover .tmp files (run.toml.tmp, ..., an uncommitted
# .adapter.tmp) are left where they are: no reader takes them, and this run's writes replace or delete them
EARLIER_RUN_FILES = (*ADAPTER.files, "run.toml", "metrics.jsonl", "metrics.json", "loss.png")


def set_aside_earlier_run(out: Path) -> tuple[Path | None, list[str]]:
    """A fresh run (no resume) into an OUT that holds an earlier run's files: they are moved, never deleted, into
    OUT/superseded-<time>/ before the run writes anything into OUT. Else a run failed or killed part-way left OUT with
    its own run.toml / metrics.jsonl beside the EARLIER run's adapter, taken for its result. The caller completes an
    adapter publish a crash interrupted first (finish_adapter_publish, as _train does at every start), so the set
    moved is whole; peft's README.md goes with
    the adapter only when adapter_config.json is beside it (one without is the user's: check() refuses that OUT).
    One rename per file; not under OUT/checkpoints, so --resume OUT never looks there (run_checkpoints). Rank 0
    only. Returns (that folder or None when OUT held none of the files: nothing is created, the names moved)."""
    from hearth.durable import fsync

    out = Path(out)
    if not out.is_dir():
        return None, []
    names = [name for name in EARLIER_RUN_FILES if (out / name).is_file() or (out / name).is_symlink()]
    if "README.md" in names and ADAPTER_CONFIG not in names:
        names.remove("README.md")
    if not names:
        return None, []
    dest = superseded_name(out)
    dest.mkdir()
    fsync(out)
    for name in names:
        (out / name).rename(dest / name)
    fsync(dest)
    fsync(out)
    return dest, names


def resumed_config(resume: Path | None) -> dict:
    """The config in state.json of the checkpoint ``resume`` names ({} without one, or when it cannot be read:
    check() and check_resume refuse those, naming resume)."""
    if resume is None:
        return {}
    try:
        state = json.loads((find_checkpoint(resume) / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    config = state.get("config") if isinstance(state, dict) else None
    return config if isinstance(config, dict) else {}


def data_fingerprint(cfg) -> dict:
    """sha256 of the corpus (and eval corpus) files: a checkpoint's step plan indexes THESE examples, so a resume
    over a corpus rebuilt in place must be refused (the paths alone would match)."""
    out = {}
    for key in ("corpus", "eval_corpus"):
        path = getattr(cfg, key)
        if path is not None:
            out[f"{key}_sha256"] = file_sha256(path)
    return out


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def eval_split_of(state: dict | None, path: Path | None) -> str:
    """How a run with eval_fraction splits off its eval examples (batches.EVAL_SPLITS): a fresh run by
    batches.EVAL_SPLIT; a resume by the split its checkpoint recorded, or "examples" for one saved before splits were
    recorded (its data holds no eval_split) -- its step plan indexes the training set of that split, so another
    split would train some examples twice and others never, and score examples it trained on. ValueError naming
    resume for a split this version does not know."""
    if state is None:
        return EVAL_SPLIT
    split = (state.get("data") or {}).get("eval_split", "examples")
    if split not in EVAL_SPLITS:
        raise ValueError(f"resume: {path} held its eval examples out by {split!r}, which this hearth cannot repeat "
                         "(a resumed run must see the same data)")
    return split


def _save_final_adapter(model, d: D.Dist, out: Path) -> None:
    """The run's adapter into OUT, whole or not at all: written to OUT/.adapter.tmp and fsynced, then published
    (durable.publish_adapter): renamed to OUT/.adapter.new (the commit), the old adapter's files moved aside with
    adapter_config.json first, the new ones moved in with it last, the old ones deleted. A crash while writing
    leaves the old adapter as it was; one during the renames leaves OUT with the old adapter whole, or with no
    adapter_config.json (never the new config beside the old weights, as moving the files in one by one over the
    old ones did), and the next save into OUT (or a run's start) completes the new adapter first. Every rank
    calls it."""
    import shutil

    tmp = out / ADAPTER_TMP
    # (a publish an earlier run left part-way is completed by the run's start and again by publish_adapter)
    if d.main and tmp.exists():  # a save a crash interrupted while writing: never committed
        shutil.rmtree(tmp)
    D.barrier(d)
    D.save_adapter(model, d, tmp)
    if d.main:
        fsync_tree(tmp)
        publish_adapter(tmp, out)


def save_checkpoint(out: Path, *, model, optimizer, scheduler, step: int, position: tuple[int, int], cfg,
                    dist: D.Dist | None = None, data: dict | None = None, loss: float | None = None) -> Path:
    """Every rank calls it under ddp / fsdp (the adapter is gathered); rank 0 writes all but FSDP's optimizer shards.
    ``loss``: the step's, as its metrics.jsonl row holds it (leads_to)."""
    import shutil

    import torch

    d = dist or D.Dist()
    final = out / "checkpoints" / f"step-{step:06d}"
    tmp, old = final.with_name(final.name + ".tmp"), final.with_name(final.name + ".old")
    if d.main:
        _restore_replaced(final)  # a re-save killed between its renames: the previous step-N back, not deleted
        for leftover in (tmp, old):  # a save a crash interrupted
            if leftover.exists():
                shutil.rmtree(leftover)
    D.barrier(d)
    D.save_adapter(model, d, tmp)
    D.barrier(d)
    if d.mode == "fsdp":
        torch.save(optimizer.state_dict(), tmp / f"optimizer-rank-{d.rank}.pt")
    elif d.main:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    # CUDA: the generator of the GPU this rank trains on (its dropout's), not every visible GPU's (load_checkpoint)
    rng = {"cpu": torch.get_rng_state(),
           "cuda": [torch.cuda.get_rng_state(_cuda_index(d))] if torch.cuda.is_available() else []}
    if d.active:  # each rank's own stream (dropout): the ranks' micro-batches differ, so their states part
        torch.save(rng, tmp / f"rng-rank-{d.rank}.pt")
    if d.main:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng, tmp / "rng.pt")
    D.barrier(d)
    if d.main:
        state = {"step": step, "epoch": position[0], "step_in_epoch": position[1], "config": cfg.as_dict(),
                 **({"loss": loss} if loss is not None else {}),  # its row's: find_checkpoint matches metrics.jsonl
                 "parallel": d.mode, "world_size": d.world, "data": data if data is not None else data_fingerprint(cfg)}
        (tmp / "state.json").write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        fsync_tree(tmp)  # on the disk before it takes its name (every rank's files are closed: the barrier above)
        # a checkpoint folder exists only once it is complete. A resume from an earlier checkpoint replays this step:
        # its new state replaces the old, which replace_dir moves out of the way in one rename and deletes only once
        # the new one has the name (a crash part-way through deleting it in place left step-N with its state.json
        # and without its adapter, which --resume OUT took as the latest)
        replace_dir(tmp, final, old)
    D.barrier(d)
    return final


def metrics_rows(path: Path, *, upto: int) -> list[dict]:
    """The rows of a run's metrics.jsonl up to step ``upto``, for a resume to keep. A line that does not decode is
    skipped: a crash while a row was written (a full disk, a power cut) leaves half of one, always a row after the
    checkpoint's step, which the resume drops anyway (it used to stop on it with a bare JSONDecodeError)."""
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= upto:
            rows.append(row)
    return rows


def check_resume(path: Path, cfg, data: dict | None = None) -> dict:
    """The checkpoint's state.json, when this run may resume it: ValueError naming ``resume`` and the first key
    that differs (RESUME_KEYS), or a corpus whose contents changed. `hearth train` calls it before loading the model."""
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
            raise ValueError("no config")
    except (OSError, ValueError) as exc:
        raise ValueError(f"resume: {path / 'state.json'} is not a checkpoint state ({exc})") from None
    mine = cfg.as_dict()
    saved = state["config"]

    def ignored(k: str) -> bool:
        # under max_steps epochs does nothing (step_plan): checkpoints written before check() refused the pair may
        # hold epochs != 1, which the resumed run, refused with both, cannot repeat
        return k == "epochs" and mine.get("max_steps") is not None and saved.get("max_steps") == mine.get("max_steps")

    changed = [k for k in RESUME_KEYS if saved.get(k) != mine.get(k) and not ignored(k)]
    if changed:
        k = changed[0]
        raise ValueError(f"resume: {path} was made with {k}={state['config'].get(k)!r}, this run has {k}={mine.get(k)!r} "
                         "(a resumed run must see the same data, model and schedule)")
    saved_data, data = state.get("data") or {}, data if data is not None else data_fingerprint(cfg)
    for key, digest in saved_data.items():  # checkpoints written before the fingerprint have none to compare
        if key.endswith("_sha256") and data.get(key) != digest:  # eval_split: the runner follows the checkpoint's
            name = key.removesuffix("_sha256")
            raise ValueError(f"resume: {path} was trained on another {name}: {getattr(cfg, name)} changed since "
                             "(its sha256 differs; a resumed run must see the same data)")
    return state


def load_checkpoint(path: Path, *, model, optimizer, scheduler, cfg, dist: D.Dist | None = None,
                    data: dict | None = None) -> dict:
    """The adapter always (any rank count or mode); AdamW's state when this layout can read it (state["optimizer"]
    says whether it was restored or restarted)."""
    import torch
    from safetensors.torch import load_file

    state = check_resume(path, cfg, data)
    d = dist or D.Dist()
    device = next(p.device for p in model.parameters() if p.requires_grad)
    D.load_adapter(model, d, load_file(str(path / "adapter_model.safetensors"), device=str(device)))
    saved_mode, saved_world = state.get("parallel", "none"), state.get("world_size", 1)
    # FSDP: every rank's shard or none (each rank looking at its own only, one restored its moments while another
    # restarted them, and rank 0's "restored" was reported)
    names = [f"optimizer-rank-{r}.pt" for r in range(d.world)] if d.mode == "fsdp" else ["optimizer.pt"]
    layout = (saved_mode == "fsdp" and saved_world == d.world) if d.mode == "fsdp" else saved_mode != "fsdp"
    missing = next((name for name in names if not (path / name).is_file()), None)
    usable = layout and missing is None
    shard = path / names[d.rank if d.mode == "fsdp" else 0]
    if usable:
        optimizer.load_state_dict(torch.load(shard, weights_only=False if d.mode == "fsdp" else True,
                                             map_location=device))
        # torch's load_state_dict leaves each 'step' count where map_location put it, on the GPU. The run that was
        # not interrupted keeps AdamW's count as a CPU scalar (neither fused nor capturable): on the GPU it is read
        # back with .item() for every parameter's bias correction, a host sync per LoRA tensor in every step
        for group in optimizer.param_groups:
            if not (group.get("fused") or group.get("capturable")):
                for p in group["params"]:
                    saved_step = optimizer.state.get(p, {}).get("step")
                    if torch.is_tensor(saved_step) and saved_step.device.type != "cpu":
                        optimizer.state[p]["step"] = saved_step.cpu()
    state["optimizer"] = "restored" if usable else (
        f"restarted ({missing} is missing from the checkpoint)" if layout else
        f"restarted (saved by {saved_mode} on {saved_world} rank(s); this run is {d.mode} on {d.world})")
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    # LambdaLR's load_state_dict restores its step count but leaves the optimizer's lr alone: a restarted AdamW
    # would keep the lr set at construction (step 0's). Set the lr the schedule has reached (restored: the same)
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
    # each rank takes back the stream it saved when the rank count is the same; else (and in one process) rank 0's
    own = path / f"rng-rank-{d.rank}.pt"
    rng = torch.load(own if d.active and saved_world == d.world and own.is_file() else path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"] and torch.cuda.is_available():
        # the stream of the GPU the saving rank trained on, onto this rank's GPU. (Earlier checkpoints hold every
        # VISIBLE GPU's state, and set_rng_state_all put them all back: IndexError where fewer GPUs are visible
        # than at the save. Of those, the entry for this rank's GPU, which the same layout saved, is taken.)
        index = _cuda_index(d)
        states = rng["cuda"]
        torch.cuda.set_rng_state(states[0] if len(states) == 1 else states[min(index, len(states) - 1)], index)
    return state


def _cuda_index(d: D.Dist) -> int:
    """The CUDA device this rank trains on (its dropout draws from that device's generator)."""
    import torch

    device = d.device
    if device is not None and getattr(device, "type", None) == "cuda" and device.index is not None:
        return device.index
    return torch.cuda.current_device()


# ------------------------------------------------------------------------------------------- run
def run(cfg: FinetuneConfig, *, console=None) -> dict:
    """Train, save the adapter and metrics in cfg.out; returns the metrics dict.
    ValueError on bad input (exit 2), RunError when the run cannot go on (exit 1)."""
    return train_model(cfg, console=console)[1]


def _peak_gib(device) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / GIB, 3)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3)  # process peak RSS (Linux: KiB)


def evaluate(model, examples: list[Example], cfg: FinetuneConfig, device, dist: D.Dist | None = None) -> float:
    """Token-weighted mean loss over ``examples`` (no dropout, no gradients); under ddp / fsdp the micro-batches
    are shared among the ranks (every rank calls it)."""
    import torch

    from hearth.train.batches import micro_batches

    d = dist or D.Dist()
    was_training = model.training
    model.eval()
    total = weight = 0.0
    with torch.no_grad():
        mbs = micro_batches(examples, list(range(len(examples))), cfg.micro_tokens, cfg.pack)
        for mb, counts in D.my_micro_batches(mbs, d):
            batch = [examples[i] for i in mb]
            n = sum(e.targets for e in batch) if counts else 0
            total += model(**collate(batch, pack=cfg.pack, device=device)).loss.float().item() * n
            weight += n
    total, weight = D.all_sum([total, weight], d, device)
    if was_training:
        model.train()
    return total / weight


def train_model(cfg: FinetuneConfig, *, console=None):
    """As run(), returning (the trained peft model, metrics). Under ddp / fsdp every rank returns; only rank 0's
    metrics are the full dict (the others get their losses)."""
    from rich.console import Console

    console = console or Console()
    cfg.check()
    dist = D.setup(cfg.parallel)
    try:
        result = _train(cfg, dist, console if dist.main else Console(quiet=True))
        # Every rank is done before any tears down. Rank 0 writes the plot and metrics after the others have
        # returned; a rank that exits while a peer's gloo process group is still live can make that peer abort
        # (SIGABRT from gloo's I/O thread). Not on the error path: a peer may be inside another collective.
        D.barrier(dist)
        return result
    finally:
        D.teardown(dist)


def _train(cfg: FinetuneConfig, dist: D.Dist, console):
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from hearth import patch as hearth_patch

    def say_rejected(path, stats):
        for rej in stats["rejected"]:
            source = f", conversation line {rej['conversation_line']}" if rej.get("conversation_line") else ""
            console.print(f"[yellow]rejected[/yellow] {path} line {rej['line']} ({rej['id']}{source}): {rej['reason']}")

    examples, data_stats = load_examples(cfg.corpus, cfg.seq_len)
    say_rejected(cfg.corpus, data_stats)
    resume_from = find_checkpoint(cfg.resume) if cfg.resume is not None else None
    fingerprint = data_fingerprint(cfg) if (cfg.save_every or resume_from is not None) else None
    # a config error: before the model is loaded; before the split too, which a resume takes from its checkpoint
    resume_state = check_resume(resume_from, cfg, fingerprint) if resume_from is not None else None
    if cfg.eval_corpus is not None:
        train, (held, eval_stats) = examples, load_examples(cfg.eval_corpus, cfg.seq_len, name="eval_corpus")
        say_rejected(cfg.eval_corpus, eval_stats)
        data_stats["eval"] = eval_stats
    else:
        split = eval_split_of(resume_state, resume_from) if cfg.eval_fraction > 0 else None
        train, held = split_eval(examples, cfg.eval_fraction, cfg.seed, split=split or EVAL_SPLIT)
        if split is not None:  # the checkpoints this run writes resume with the same split
            data_stats["eval_split"] = split
            if fingerprint is not None:
                fingerprint["eval_split"] = split
        if split == "examples":
            console.print(f"[yellow]note:[/yellow] {resume_from} was saved before hearth held out whole "
                          "conversations: this run keeps its per-example eval split (the steps it has left index "
                          "that training set); its eval loss may score turns of conversations it trains on")
    data_stats.update(train_examples=len(train), eval_examples=len(held),
                      eval_conversations=len({conversation_of(e) for e in held}),
                      train_truncated=sum(1 for e in train if e.dropped_turns),
                      train_history_dropped=sum(e.dropped_turns for e in train),
                      eval_truncated=sum(1 for e in held if e.dropped_turns))
    console.print(fit_summary(data_stats, cfg.seq_len))
    # loss.png is drawn from metrics.jsonl's rows (matplotlib comes with hearth[train] and hearth[kernels]). Without
    # it the run goes on with no plot, said now (it used to stop at the plot with ImportError, after the last step
    # and before metrics.json)
    plot = importlib.util.find_spec("matplotlib") is not None
    if not plot:
        console.print("[yellow]note:[/yellow] matplotlib is not installed: no loss.png for this run (metrics.jsonl "
                      "holds the losses; pip install 'hearth[train]' for the plot)")
    steps = step_plan(train, cfg)
    saved = resume_state["config"] if resume_state is not None else None
    # warm-up, eval and checkpoint intervals against the run's length, before the model; a resume (the same data
    # and schedule: check_resume) keeps the values its checkpoint was saved with
    cfg.check_steps(len(steps), saved=saved)

    device = dist.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    config = model_config(cfg.model, random_init=cfg.random_init)
    if isinstance(getattr(config, "max_position_embeddings", None), int):  # with transformers' default for the type
        cfg.check_positions(config.max_position_embeddings, max(len(e) for e in examples + held), str(cfg.model))
    if max(max(e.ids) for e in examples + held) >= config.vocab_size:
        raise ValueError(f"corpus: token ids reach beyond the model's vocab_size={config.vocab_size} (another tokenizer?)")
    budget = cfg.memory_budget_gib
    if budget is None and device.type == "cuda":
        budget = 0.9 * torch.cuda.get_device_properties(device).total_memory / GIB
    sizes = weight_bytes(config, dtype=dtype, targets=cfg.targets, rank=cfg.rank)
    if sizes["missing_targets"]:
        raise ValueError(f"targets: {', '.join(map(repr, sizes['missing_targets']))} is not a Linear module of this model "
                         f"(its Linear layers: {', '.join(sizes['linear_names'])})")
    shards = dist.world if dist.mode == "fsdp" else 1  # FSDP keeps 1/world of the weights and LoRA state per rank
    refuse_over_budget(sizes["weights_4bit" if cfg.qlora else "weights"] // shards, sizes["lora_fp32"] // shards, budget,
                       qlora=cfg.qlora, qlora_weights_bytes=sizes["weights_4bit"], parallel=dist.mode, world=dist.world)

    model = load_model(cfg.model, random_init=cfg.random_init, dtype=dtype, device=device, qlora=cfg.qlora,
                       config=config, seed=cfg.seed)
    # LoRA first, then hearth's patch: its "lora" kind routes the LoRA projections to kernels.lora's fused
    # nodes, which only exist to be found once peft has wrapped the projections
    model = add_lora(model, rank=cfg.rank, alpha=cfg.alpha, targets=cfg.targets, dropout=cfg.dropout)
    report = None
    if cfg.patch:
        why = probe_loss_kernel(device, dtype)
        # on a 4-bit base the probes build their inputs in the compute dtype (norm, rope, MLP and loss apply),
        # and the LoRA-aware nodes take the 4-bit projections (dequantised per use, never kept for the backward)
        report = hearth_patch.apply(model, loss=why is None, lora_compute=cfg.lora_compute, attention=cfg.attention)
        reasons = {"loss": why}
        report.left = {(k, c, reasons.get(k) or r): n for (k, c, r), n in report.left.items()}
        report.print(console)
        if why is not None or sum(report.count(k) for k in ("norm", "rope", "mlp", "loss")) == 0:
            console.print(f"[yellow]note:[/yellow] {CPU_HINT}" if device.type == "cpu" else
                          f"[yellow]note:[/yellow] hearth's loss kernel was left: {why}")
    model.config.use_cache = False
    trainable = [p for p in model.parameters() if p.requires_grad]
    el = torch.finfo(dtype).bits // 8
    widest = max(sum(len(train[i]) for i in mb) if cfg.pack else max(len(train[i]) for i in mb) * len(mb)
                 for _, _, mbs in steps for mb in mbs)  # tokens in the largest micro-batch, padding included
    weights_total = sum(_stored_bytes(p) for p in model.parameters())
    # the masked micro-batches (padded ones with padding; packed rows off hearth's varlen attention) cost more per token
    batches = micro_batch_shapes(train, [mb for _, _, mbs in steps for mb in mbs], pack=cfg.pack,
                                 varlen=bool(report and report.count("attention")))
    # FSDP: each rank keeps 1/N of the weights and LoRA state, and gathers the root (embeddings, lm_head) and the
    # decoder layers in flight whole in the compute dtype (D.fsdp_gathered_bytes says how fully_shard gathers)
    gathered = D.fsdp_gathered_bytes(model, bytes_per_el=el) if dist.mode == "fsdp" else {"root": 0, "layer": 0}
    plan = plan_checkpointing(
        model.config, widest, weights_bytes=weights_total // shards,
        trainable_bytes=sum(p.numel() * 4 for p in trainable) // shards, bytes_per_el=el, budget_gib=budget,
        qlora=cfg.qlora, batches=batches, fsdp_root_bytes=gathered["root"], fsdp_layer_bytes=gathered["layer"],
        **patch_knobs(report, cfg.dropout))
    if not plan.fits:
        raise RunError(f"memory_budget_gib: {plan.reason}")
    apply_checkpointing(model, plan)
    console.print(f"[bold]checkpointing[/bold]: {plan.reason}")
    note = packed_mask_note(cfg.pack, report, device.type)
    if note:
        console.print(f"[yellow]note:[/yellow] {note}")
    model.train()
    module = D.wrap(model, dist, dtype=dtype)  # the model itself, DDP around it, or the model sharded in place
    trainable = [p for p in model.parameters() if p.requires_grad]  # FSDP replaced them with DTensor shards
    if dist.active:
        console.print(f"[bold]parallel[/bold]: {dist.mode} on {dist.world} rank(s), {device.type} "
                      f"({'nccl' if device.type == 'cuda' else 'gloo'})")
        if cfg.grad_accum < dist.world:  # only a resume gets here (check())
            console.print(f"[yellow]note:[/yellow] grad_accum = {cfg.grad_accum} (the checkpoint's) on {dist.world} "
                          f"ranks: {dist.world - cfg.grad_accum} rank(s) run zero-weight passes only; the steps are "
                          f"the same, at the speed of {cfg.grad_accum} rank(s)")
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = len(steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total=total, warmup=cfg.warmup_steps, schedule=cfg.lr_schedule))
    start_step = 0
    optimizer_resume = None
    log_path = cfg.out / "metrics.jsonl"
    if dist.main:
        cfg.out.mkdir(parents=True, exist_ok=True)
        finish_adapter_publish(cfg.out)  # a run killed while publishing its adapter: the new one whole in OUT
        if resume_from is None:
            # a fresh run: an earlier run's adapter, run.toml and metrics are moved aside whole before this run writes
            # its own (the config was read before: `hearth train OUT/run.toml` repeats a run into its own OUT)
            aside, moved = set_aside_earlier_run(cfg.out)
            if aside is not None:
                console.print(f"[yellow]note:[/yellow] {cfg.out} held an earlier run: moved its {', '.join(moved)} "
                              f"to {aside} (a fresh run; --resume continues a run)")
        write_text(cfg.out / "run.toml", to_toml(cfg))  # whole or not at all: a crash left it torn
    rows: list[dict] = []
    if resume_from is not None:
        state = load_checkpoint(resume_from, model=model, optimizer=optimizer, scheduler=scheduler, cfg=cfg, dist=dist,
                                data=fingerprint)
        start_step, optimizer_resume = state["step"], state["optimizer"]
        # the rows up to the checkpoint, of its line: OUT's metrics.jsonl, or for a checkpoint set aside with its
        # line's metrics (set_aside_later) the copy beside it
        sources = [p for p in (resume_from.parent / "metrics.jsonl", log_path) if p.is_file()]
        read = [(p, metrics_rows(p, upto=start_step)) for p in dict.fromkeys(sources)]
        rows = next((r for _, r in read if leads_to(r, state)), None)
        if rows is None:
            rows = next((r for p, r in read if p == log_path), [])
            if "loss" in state and rows:
                console.print(f"[yellow]note:[/yellow] {log_path} does not lead to {resume_from} (no row of step "
                              f"{start_step} with its loss): its rows up to step {start_step} are kept, but may be of "
                              "another line of training")
        console.print(f"resumed from {resume_from} at step {start_step} (epoch {state['epoch']}); AdamW state {optimizer_resume}")
    D.barrier(dist)  # every rank has read metrics.jsonl before rank 0 rewrites it
    log = None
    if dist.main and resume_from is not None:
        # a resume from an earlier step starts a new line of training: the later checkpoints of the line it leaves
        # are moved aside (before metrics.jsonl is cut back to this step), so that `--resume OUT` never takes one
        aside, moved = set_aside_later(cfg.out, start_step, resume_from)
        if aside is not None:
            console.print(f"[yellow]note:[/yellow] resuming from step {start_step} starts a new line of training: "
                          f"moved {', '.join(moved)} (of the line it leaves) with that line's metrics to {aside}")
    if dist.main:
        # replaced whole (durable.write_text): rewriting it in place lost the earlier steps' rows to a crash
        write_text(log_path, "".join(json.dumps(r) + "\n" for r in rows))
        log = log_path.open("a", encoding="utf-8")
    build_s = time.perf_counter() - t0

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress, (log or contextlib.nullcontext()):
        task = progress.add_task("train", total=total, completed=start_step, status="")
        for step in range(start_step, total):
            epoch, in_epoch, mbs = steps[step]
            targets = sum(train[i].targets for mb in mbs for i in mb)
            tokens = sum(len(train[i]) for mb in mbs for i in mb)
            lr = scheduler.get_last_lr()[0]
            start = time.perf_counter()
            value = 0.0
            mine = D.my_micro_batches(mbs, dist)  # all of them in one process
            for k, (mb, counts) in enumerate(mine):
                batch = [train[i] for i in mb]
                share = sum(e.targets for e in batch) / targets if counts else 0.0
                with D.sync_context(module, dist, last=k == len(mine) - 1):
                    loss = module(**collate(batch, pack=cfg.pack, device=device)).loss
                    # x world: DDP and FSDP average the ranks' gradients; the step needs their sum
                    (loss * (share * dist.world)).backward()
                value += loss.item() * share  # .item() also synchronises, so the step time is real
            value = D.all_sum([value], dist, device)[0]
            grad_norm = D.grad_norm_value(torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm))
            # before the update: a NaN / inf gradient (clipping scales it by NaN) would make every LoRA weight NaN,
            # and the adapter or checkpoint saved next would hold them (every rank sees the same loss and norm)
            if not math.isfinite(value):
                raise RunError(f"loss became {value} at step {step + 1} (lower --lr, or check the corpus)")
            if not math.isfinite(grad_norm):
                raise RunError(f"gradient norm became {grad_norm} at step {step + 1} with a finite loss ({value:.4g}); "
                               "the step was not applied (lower --lr, or check the corpus)")
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - start
            done = step + 1
            row = {"step": done, "epoch": epoch, "loss": value, "eval_loss": None, "lr": lr, "grad_norm": grad_norm,
                   "tokens": tokens, "step_s": round(elapsed, 4), "tok_per_s": round(tokens / elapsed, 1),
                   "peak_gib": _peak_gib(device)}
            if dist.active:
                row["peak_gib"] = D.all_max(row["peak_gib"], dist, device)  # the fullest rank
                row["tok_per_s_per_rank"] = round(row["tok_per_s"] / dist.world, 1)
            if held and ((cfg.eval_every and done % cfg.eval_every == 0) or done == total):
                row["eval_loss"] = evaluate(module, held, cfg, device, dist)
            if log is not None:
                log.write(json.dumps(row) + "\n")
                log.flush()
            rows.append(row)
            if cfg.save_every and done % cfg.save_every == 0 and done < total:
                if log is not None:  # the rows up to the checkpoint on the disk before it (fsynced) takes its name
                    os.fsync(log.fileno())
                save_checkpoint(cfg.out, model=model, optimizer=optimizer, scheduler=scheduler, step=done,
                                position=(epoch, in_epoch + 1), cfg=cfg, dist=dist, data=fingerprint, loss=value)
            progress.update(task, advance=1, status=f"loss {value:.4f}  {row['tok_per_s']:.0f} tok/s"
                            + (f"  eval {row['eval_loss']:.4f}" if row["eval_loss"] is not None else ""))

    _save_final_adapter(model, dist, cfg.out)
    peak = _peak_gib(device)
    if dist.active:
        peak = D.all_max(peak, dist, device)
        D.barrier(dist)
    if not dist.main:
        return model, {"loss": [r["loss"] for r in rows], "rank": dist.rank}
    if plot:
        plot_losses(rows, cfg.out / "loss.png")
    timed = [r for r in rows if r["step"] > start_step + 1] or rows[-1:]  # the first step warms up kernels / allocator
    metrics = {
        "config": cfg.as_dict(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "versions": _versions(),
        "data": data_stats,
        "patch": report.as_dict() if report else None,
        "checkpointing": {"mode": plan.mode, "checkpointed_layers": plan.checkpointed, "layers": plan.layers,
                          "estimate_gib": round(plan.estimate_gib, 2), "budget_gib": plan.budget_gib,
                          "reason": plan.reason, "estimates": plan.table,
                          **({"fsdp_gathered_gib": {k: round(v / GIB, 4) for k, v in gathered.items()}}
                             if dist.mode == "fsdp" else {})},
        "weights_gib": round(sum(_stored_bytes(p) for p in model.parameters() if not p.requires_grad) / GIB, 4),
        "trainable_params": sum(p.numel() for p in trainable),
        "resumed_from": str(resume_from) if resume_from else None,
        "optimizer_resume": optimizer_resume,
        "parallel": {"mode": dist.mode, "world_size": dist.world,
                     "backend": None if not dist.active else "nccl" if device.type == "cuda" else "gloo",
                     "mixed_precision": "bf16 params, fp32 reduce" if dist.mode == "fsdp" and device.type == "cuda" else None},
        "build_s": round(build_s, 2),
        "steps": len(rows),
        "loss": [r["loss"] for r in rows],
        "eval_loss": [{"step": r["step"], "eval_loss": r["eval_loss"]} for r in rows if r["eval_loss"] is not None],
        "step_s": [r["step_s"] for r in rows],
        "tokens_per_s": round(sum(r["tokens"] for r in timed) / sum(r["step_s"] for r in timed), 1) if timed else None,
        "median_step_s": round(statistics.median(r["step_s"] for r in timed), 4) if timed else None,
        "peak_gib": peak if device.type == "cuda" else None,
        "peak_rss_gib": peak if device.type == "cpu" else None,
    }
    if dist.active and metrics["tokens_per_s"] is not None:
        metrics["tokens_per_s_per_rank"] = round(metrics["tokens_per_s"] / dist.world, 1)
    write_text(cfg.out / "metrics.json", json.dumps(metrics, indent=2) + "\n")  # fsynced before it takes the name
    losses = metrics["loss"]
    console.print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; {metrics['tokens_per_s']} tok/s"
                  + (f"; eval loss {metrics['eval_loss'][-1]['eval_loss']:.4f}" if metrics["eval_loss"] else "")
                  + (f"; peak {metrics['peak_gib']} GiB" if metrics["peak_gib"] is not None else "")
                  + f"; adapter, run.toml, metrics.jsonl and loss.png in {cfg.out}")
    return model, metrics


def fit_summary(data: dict, seq_len: int) -> str:
    """The start-up line on fitting the corpus into seq_len: how many training examples lost their oldest history
    turns (batches.fit_example), how many were rejected (too long even with no history: not trained), and the
    longest example as built (docs/training.md, "Sequence length and the app's prompts": the app's largest prompt is
    longer than the default seq_len)."""
    longest = data.get("longest_tokens", 0)
    if "eval" in data:
        longest = max(longest, data["eval"].get("longest_tokens", 0))
    held = ""
    if data.get("eval_examples"):
        n = data.get("eval_conversations")
        held = f", {data['eval_examples']} held out" + (f" ({n} conversation{'s' * (n != 1)})" if n else "")
    # the rejected examples are named one by one above this line; counted here too, or a corpus that lost most of
    # its examples to seq_len read "every example fits seq_len whole"
    lost = ""
    for what, stats in (("examples", data), ("eval_corpus examples", data.get("eval") or {})):
        rejected = len(stats.get("rejected") or [])
        if rejected:
            built = stats.get("examples", 0) + rejected + stats.get("skipped_no_target", 0)
            lost += (f"; [yellow]{rejected} of {built} {what} rejected: longer than seq_len={seq_len} even with every "
                     "history turn dropped (not trained)[/yellow]")
    whole = f"; longest example {longest} tokens: seq_len={longest} would train every example whole"
    if not data.get("train_truncated") and not data.get("eval_truncated"):
        if lost:
            return f"[bold]data[/bold]: {data['train_examples']} training examples{held}{lost}{whole}"
        return (f"[bold]data[/bold]: {data['train_examples']} training examples{held}; every example fits "
                f"seq_len={seq_len} whole (longest example {longest} tokens)")
    return (f"[bold]data[/bold]: [yellow]{data['train_truncated']} of {data['train_examples']} training examples had "
            f"history dropped to fit seq_len={seq_len}[/yellow] ({data['train_history_dropped']} history messages, "
            f"the oldest first){held}"
            + (f", {data['eval_truncated']} of the held-out ones" if data.get("eval_truncated") else "")
            + lost + whole)


def _stored_bytes(p) -> int:
    """Bytes a parameter occupies (a bitsandbytes 4-bit weight is uint8-packed: its numel is what is stored)."""
    return p.numel() * p.element_size()


def plot_losses(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="train loss", lw=1.2)
    evals = [r for r in rows if r.get("eval_loss") is not None]
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval loss", lw=1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (mean over trained tokens)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    # whole or not at all, as metrics.json: a run stopped while the plot is written keeps the last good loss.png, and
    # write_file flushes it before the rename (a rename alone could leave an empty loss.png after a power cut)
    try:
        write_file(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)


def _versions() -> dict:
    import peft
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    for name in ("triton", "bitsandbytes"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:  # pragma: no cover
            pass
    return out


def main(config_file: Path | None = None, **flags) -> int:
    """`hearth train [RUN.toml]`: exit 0 on success, 2 on bad arguments (printed, naming the argument),
    1 when the run fails (printed)."""
    from rich.console import Console

    console = Console()
    try:
        run(resolve(config_file, flags), console=console)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except (RunError, FloatingPointError, RuntimeError, OSError, MemoryError) as exc:
        console.print(f"[red]error:[/red] {type(exc).__name__}: {exc}")
        return 1
    return 0
