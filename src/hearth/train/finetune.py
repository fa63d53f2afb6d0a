"""LoRA SFT with transformers + peft on hearth's envelope corpus, hearth's kernels patched in.

    run(FinetuneConfig(corpus=Path("out/train.jsonl"), model=Path("models/qwen3-14b"), out=Path("adapter")))
    hearth train --corpus out/train.jsonl --model models/qwen3-14b --out adapter [--max-steps 200]

Steps: load the model from a LOCAL path (never the hub; --random-init builds it from a config JSON, for
benchmarking) -> hearth.patch.apply (unless --no-patch) -> peft LoRA (r=16, alpha=32 on q,k,v,o,gate,up,down
by default) -> activation checkpointing chosen for the memory budget (plan_checkpointing, below) -> AdamW on
the LoRA parameters, one example per step -> ADAPTER_DIR (peft save_pretrained) + ADAPTER_DIR/metrics.json.

Data: train.jsonl rows from hearth.train.corpus with input_ids and labels (-100 outside the reply). An
example longer than --seq-len keeps its LAST seq_len tokens (the reply is at the end); examples with no
trained token left are skipped; both are counted in metrics.json. Examples are taken in order, cycling.

This module does not import pydantic (scripts/gpu/lora_e2e.py shares it on machines without it).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

IGNORE_INDEX = -100
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GIB = 1 << 30


@dataclass
class FinetuneConfig:
    corpus: Path
    model: Path
    out: Path
    max_steps: int = 100
    lr: float = 2e-4
    rank: int = 16
    alpha: float = 32.0
    seq_len: int = 4096
    memory_budget_gib: float | None = None  # None: 90% of the GPU's memory on CUDA; no checkpointing on CPU
    patch: bool = True
    random_init: bool = False
    targets: tuple[str, ...] = LORA_TARGETS
    seed: int = 0
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        self.corpus, self.model, self.out = Path(self.corpus), Path(self.model), Path(self.out)
        self.targets = tuple(self.targets)

    def check(self) -> None:
        for name in ("max_steps", "rank", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("lr", "alpha"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.memory_budget_gib is not None and not self.memory_budget_gib > 0:
            raise ValueError(f"memory_budget_gib must be > 0, got {self.memory_budget_gib!r}")
        if not Path(self.corpus).is_file():
            raise ValueError(f"corpus: {self.corpus} is not a file (expected OUT_DIR/train.jsonl from `hearth corpus build`)")
        if not Path(self.model).exists():
            raise ValueError(f"model: {self.model} does not exist (a local model directory"
                             + (" or config JSON" if self.random_init else "") + "; nothing is downloaded)")


# ------------------------------------------------------------------------------------------- data
def load_examples(path: Path, seq_len: int) -> tuple[list[tuple[list[int], list[int]]], dict]:
    """(input_ids, labels) pairs, each at most seq_len long (left-truncated), plus counts.
    ValueError naming ``corpus`` for a row without equal-length int lists, or when nothing is trainable."""
    examples, truncated, skipped = [], 0, 0
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            ids, labels = row.get("input_ids"), row.get("labels")
            if not isinstance(ids, list) or not isinstance(labels, list) or len(ids) != len(labels) or not ids:
                raise ValueError(f"corpus: line {lineno} has no input_ids/labels lists of equal, non-zero length "
                                 "(build the corpus with --tokenizer)")
            if len(ids) > seq_len:
                ids, labels, truncated = ids[-seq_len:], labels[-seq_len:], truncated + 1
            # labels[t] is the token at t; the loss shifts by one, so position 0's label is never trained
            if all(x == IGNORE_INDEX for x in labels[1:]):
                skipped += 1
                continue
            examples.append((ids, labels))
    if not examples:
        raise ValueError(f"corpus: {path} has no example with a trained token within seq_len={seq_len}")
    return examples, {"examples": len(examples), "truncated": truncated, "skipped_no_target": skipped}


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

    @property
    def mode(self) -> str:
        return "none" if self.checkpointed == 0 else "full" if self.checkpointed == self.layers else "selective"


def layer_activation_bytes_per_token(config, *, patched: bool, bytes_per_el: int) -> int:
    """Estimate of what ONE decoder layer keeps for its backward, per token, with LoRA on every projection.

    Counted in elements of hidden H, intermediate I, query width Q = Hq*D and key/value width K = Hk*D:
      norms: 2 inputs (H each) + the 2 normed outputs the LoRA'd projections read (H each)   4H
      q_norm / k_norm inputs Q + K; q, k, v as attention saves them Q + 2K; attention output Q
      (also o_proj's input)                                                                 3Q + 3K
      MLP: gate g and up u (I each) and h = silu(g) * u, kept by down_proj's LoRA A (I)      3I
      without hearth: the unfused silu keeps its own output (I) and HF's RMSNorm keeps ~2 fp32
      copies per norm (4 x 2H x 2 elements of bf16 width): + I + 16H
    LoRA's rank-r intermediates (r << H) are ignored. It is an estimate; measured peaks land in metrics.json.
    """
    h, i = config.hidden_size, config.intermediate_size
    d = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, k = config.num_attention_heads * d, config.num_key_value_heads * d
    elements = 4 * h + 3 * q + 3 * k + 3 * i
    if not patched:
        elements += i + 16 * h
    return elements * bytes_per_el


def loss_bytes_per_token(config, *, patched: bool, bytes_per_el: int) -> int:
    """hearth's fused loss keeps the hidden-state gradient (H) and a 64 MiB logits chunk (counted as fixed);
    HF's loss holds the logits (V, model dtype), their fp32 upcast and its gradient (2 x 4V bytes)."""
    if patched:
        return config.hidden_size * bytes_per_el
    return config.vocab_size * (bytes_per_el + 8)


def plan_checkpointing(config, tokens: int, *, weights_bytes: int, trainable_bytes: int, bytes_per_el: int,
                       budget_gib: float | None, patched: bool) -> CheckpointPlan:
    """The fewest checkpointed layers whose estimated peak fits the budget (fewer = less recompute = faster).

    peak(c) = weights + 4 x trainable (param, grad, AdamW m and v, fp32) + 1 GiB (workspace, logits chunk)
              + tokens x [ c x H x b                (a checkpointed layer keeps only its input)
                           + (L - c) x A            (A = layer_activation_bytes_per_token)
                           + (A if c else 0)        (one layer's activations while it is recomputed)
                           + loss_bytes_per_token ]
    Recompute costs about one extra forward per checkpointed layer (~1/3 of its fwd+bwd time), so c=0 is the
    fastest and c=L the slowest; none fitting falls back to full checkpointing (reported as over budget).
    """
    layers = config.num_hidden_layers
    act = layer_activation_bytes_per_token(config, patched=patched, bytes_per_el=bytes_per_el)
    fixed = weights_bytes + 4 * trainable_bytes + GIB
    per_loss = loss_bytes_per_token(config, patched=patched, bytes_per_el=bytes_per_el)

    def peak(c: int) -> float:
        per_token = c * config.hidden_size * bytes_per_el + (layers - c) * act + (act if c else 0) + per_loss
        return (fixed + tokens * per_token) / GIB

    table = [{"checkpointed": c, "estimate_gib": round(peak(c), 2)} for c in sorted({0, layers // 4, layers // 2, 3 * layers // 4, layers})]
    if budget_gib is None:
        return CheckpointPlan(0, layers, peak(0), None, "no memory budget (CPU, none given): no checkpointing", table)
    for c in range(layers + 1):
        if peak(c) <= budget_gib:
            mode = "none" if c == 0 else "full" if c == layers else f"selective ({c} of {layers} layers)"
            why = (f"{mode}: estimated peak {peak(c):.1f} GiB fits the {budget_gib:.1f} GiB budget"
                   + (f"; one layer fewer would need {peak(c - 1):.1f} GiB" if c else "; fastest setup"))
            return CheckpointPlan(c, layers, peak(c), budget_gib, why, table)
    return CheckpointPlan(layers, layers, peak(layers), budget_gib,
                          f"full: even full checkpointing is estimated at {peak(layers):.1f} GiB, over the "
                          f"{budget_gib:.1f} GiB budget (lower --seq-len)", table)


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


# ------------------------------------------------------------------------------------------- model
def load_model(path: Path, *, random_init: bool, dtype, device):
    """A causal LM from a local directory (from_pretrained, local_files_only), or with --random-init
    from a config JSON file / a directory holding config.json (from_config, weights random, built on device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if random_init:
        cfg_path = path / "config.json" if path.is_dir() else path
        try:
            raw = json.loads(cfg_path.read_text(encoding="utf-8"))
            model_type = raw.pop("model_type")
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"model: {cfg_path} is not a config JSON with a model_type ({exc})") from exc
        config = AutoConfig.for_model(model_type, **raw)
        config._attn_implementation = "sdpa"
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype,
                                                     attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise ValueError(f"model: cannot load a causal LM from {path}: {exc}") from exc
    return model.to(device)


def add_lora(model, *, rank: int, alpha: float, targets=LORA_TARGETS):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                            lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"))


# ------------------------------------------------------------------------------------------- run
def run(cfg: FinetuneConfig, *, console=None) -> dict:
    """Train, save the adapter and metrics.json in cfg.out; returns the metrics dict. ValueError on bad input."""
    return train_model(cfg, console=console)[1]


def train_model(cfg: FinetuneConfig, *, console=None):
    """As run(), returning (the trained peft model, metrics)."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from hearth import patch as hearth_patch

    console = console or Console()
    cfg.check()
    examples, data_stats = load_examples(cfg.corpus, cfg.seq_len)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(cfg.seed)

    t0 = time.perf_counter()
    model = load_model(cfg.model, random_init=cfg.random_init, dtype=dtype, device=device)
    vocab = model.config.vocab_size
    if max(max(ids) for ids, _ in examples) >= vocab:
        raise ValueError(f"corpus: token ids reach beyond the model's vocab_size={vocab} (another tokenizer?)")
    report = hearth_patch.apply(model) if cfg.patch else None
    if report is not None:
        report.print(console)
    model = add_lora(model, rank=cfg.rank, alpha=cfg.alpha, targets=cfg.targets)
    model.config.use_cache = False
    trainable = [p for p in model.parameters() if p.requires_grad]
    el = torch.finfo(dtype).bits // 8
    budget = cfg.memory_budget_gib
    if budget is None and device.type == "cuda":
        budget = 0.9 * torch.cuda.get_device_properties(device).total_memory / GIB
    longest = max(len(ids) for ids, _ in examples)
    plan = plan_checkpointing(
        model.config, longest, weights_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        trainable_bytes=sum(p.numel() * 4 for p in trainable), bytes_per_el=el, budget_gib=budget,
        patched=bool(report and report.count("loss")))
    apply_checkpointing(model, plan)
    console.print(f"[bold]checkpointing[/bold]: {plan.reason}")
    model.train()
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=0.0)
    build_s = time.perf_counter() - t0

    losses, step_s, tokens = [], [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=cfg.max_steps, status="")
        for step in range(cfg.max_steps):
            ids, labels = examples[step % len(examples)]
            input_ids = torch.tensor([ids], device=device)
            target = torch.tensor([labels], device=device)
            start = time.perf_counter()
            loss = model(input_ids=input_ids, labels=target).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            value = loss.item()  # also synchronises, so the step time is real
            step_s.append(time.perf_counter() - start)
            losses.append(value)
            tokens.append(len(ids))
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at step {step}")
            progress.update(task, advance=1, status=f"loss {value:.4f}  {len(ids) / step_s[-1]:.0f} tok/s")

    cfg.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(cfg.out))
    timed = list(zip(tokens, step_s))[1:] or list(zip(tokens, step_s))  # step 0 warms up kernels / allocator
    metrics = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "versions": _versions(),
        "data": data_stats,
        "patch": report.as_dict() if report else None,
        "checkpointing": {"mode": plan.mode, "checkpointed_layers": plan.checkpointed, "layers": plan.layers,
                          "estimate_gib": round(plan.estimate_gib, 2), "budget_gib": plan.budget_gib,
                          "reason": plan.reason, "estimates": plan.table},
        "trainable_params": sum(p.numel() for p in trainable),
        "build_s": round(build_s, 2),
        "steps": len(losses),
        "loss": losses,
        "step_s": [round(s, 4) for s in step_s],
        "tokens_per_s": round(sum(t for t, _ in timed) / sum(s for _, s in timed), 1),
        "median_step_s": round(statistics.median(s for _, s in timed), 4),
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / GIB, 2) if device.type == "cuda" else None,
    }
    tmp = cfg.out / "metrics.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    tmp.replace(cfg.out / "metrics.json")
    console.print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; {metrics['tokens_per_s']} tok/s"
                  + (f"; peak {metrics['peak_gib']} GiB" if metrics["peak_gib"] is not None else "")
                  + f"; adapter and metrics.json in {cfg.out}")
    return model, metrics


def _versions() -> dict:
    import peft
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


def main(**kwargs) -> int:
    """`hearth train`: exit 0 on success, 2 on bad arguments (printed, naming the argument)."""
    from rich.console import Console

    console = Console()
    try:
        run(FinetuneConfig(**kwargs), console=console)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    return 0
