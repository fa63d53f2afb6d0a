"""Data-parallel `hearth train` on several processes: PyTorch DDP or FSDP2, launched by torchrun.

    torchrun --nproc-per-node 2 -m hearth.cli train run.toml --parallel ddp     (or fsdp)

parallel = "none"  one process (the default); launching it on several ranks is refused (they would all write OUT).
parallel = "ddp"   torch DistributedDataParallel: every rank holds the whole model and the LoRA weights,
                   gradients are all-reduced once per optimizer step (no_sync on the other micro-batches).
parallel = "fsdp"  FSDP2 (torch.distributed.fsdp.fully_shard) of every decoder layer and then of the whole
                   (peft) model: the frozen base and the LoRA weights are sharded over the ranks, gathered
                   layer by layer for the forward and the backward, gradients reduce-scattered. On CUDA the
                   compute and the all-gathers run in bf16 with fp32 gradient reduction (MixedPrecisionPolicy);
                   on the CPU everything is fp32.

Backend: nccl on CUDA (one GPU per rank: cuda:LOCAL_RANK), gloo on the CPU.

Data: every rank builds the same step plan (hearth.train.finetune.step_plan: the seeded per-epoch shuffle and
the token-budget micro-batches of ONE process) and takes the micro-batches mbs[rank::world] of each optimizer
step. Each micro-batch's loss is weighted by its share of the step's trained tokens times world (the engine
averages gradients over the ranks), so the summed gradient is the one process's gradient: N ranks compute the
same optimizer step as 1 process with grad_accum micro-batches. A rank with fewer micro-batches in a step (the
step's count not a multiple of world) runs a zero-weight pass so that every rank joins the same collectives.
(grad_accum below world is refused, but for a resume: it keeps its checkpoint's grad_accum, and its ranks beyond
it only run such passes.)

Checkpoints: the adapter is gathered (FSDP: DTensor.full_tensor) and written by rank 0 in peft's format, so a
checkpoint resumes on any rank count and mode. The optimizer state: DDP and one process keep the same full
AdamW state (rank 0 writes optimizer.pt, any world size reads it); FSDP keeps each rank's shard
(optimizer-rank-R.pt), read back only at the same world size under fsdp and with every rank's shard there --
otherwise every rank restarts AdamW's moments (said on the console and in metrics.json). Every rank saves its RNG
state (rng-rank-R.pt, the dropout masks); a resume at the same world size gives each rank its own back, at another
size rank 0's (rng.pt).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

PARALLEL = ("none", "ddp", "fsdp")


@dataclass
class Dist:
    mode: str = "none"
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: object = None
    initialized: bool = False  # this module started the process group (and ends it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.mode != "none"


def launched_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def check_launch(mode: str) -> None:
    """ValueError naming ``parallel`` for a mode that does not match how the process was started."""
    if mode not in PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {mode!r}")
    world = launched_world()
    if mode == "none" and world > 1:
        raise ValueError(f"parallel: this process is one of {world} started by torchrun, but parallel = \"none\" "
                         "(set parallel = \"ddp\" or \"fsdp\", or start one process)")
    if mode != "none" and not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        raise ValueError(f"parallel: {mode!r} needs a torchrun launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): "
                         f"torchrun --nproc-per-node N -m hearth.cli train RUN.toml --parallel {mode}")


def setup(mode: str):
    """The process group for ``mode`` (nccl on CUDA, gloo on the CPU) and this rank's device."""
    import torch
    import torch.distributed as dist

    check_launch(mode)
    if mode == "none":
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        if not 0 <= local < gpus:  # one GPU per rank: more ranks on a node than GPUs
            raise ValueError(f"parallel: this rank has LOCAL_RANK {local} but {gpus} CUDA device(s) are visible; start at "
                             f"most {gpus} process(es) per node (torchrun --nproc-per-node {gpus})")
        device, backend = torch.device("cuda", local), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    started = not dist.is_initialized()
    if started:
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return Dist(mode, rank, world, local, device, started)


def teardown(d: Dist) -> None:
    import torch.distributed as dist

    if d.initialized and dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model) -> list:
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def fsdp_gathered_bytes(model, *, bytes_per_el: int) -> dict:
    """What FSDP2 holds UNSHARDED on every rank on top of its 1/N shards, for the memory plan (before wrap()):
    ``root``: the bytes of every parameter outside the decoder layers (embeddings, final norm, lm_head; a tied
    lm_head once), and ``layer``: the largest decoder layer's bytes (base and LoRA), both at ``bytes_per_el`` (the
    all-gather dtype: MixedPrecisionPolicy's bf16 param_dtype on CUDA, the fp32 parameters themselves on the CPU).

    How wrap()'s fully_shard (torch 2.13, defaults: reshard_after_forward=None, implicit forward prefetch, backward
    prefetch of one group) gathers, read from torch/distributed/fsdp/_fully_shard:
      - the root group (fully_shard(model): the parameters no decoder layer took) gets reshard_after_forward=False
        at lazy init, so it is all-gathered at the forward's start and stays whole until its post-backward: the
        full embeddings / lm_head exist on every rank for the whole step;
      - a decoder layer (reshard_after_forward=True) is whole while it runs, and one more layer-sized buffer is
        alive beside it: in the forward its all-gather output, kept until the next layer's copy-in, or the next
        layer's all-gather issued ahead; in the backward the previous layer's all-gather, prefetched by its
        pre-backward. So two layers at a layer's backward; at the loss's backward (the start of the backward) one:
        the last layer's all-gather, which the root's pre-backward prefetches.
    finetune.estimate_peak_gib adds root once and layer x 2 (a layer's backward) or x 1 (the loss's); the gradients'
    reduce-scatter buffers (LoRA only, fp32) are left out like the one-process plan leaves LoRA gradients out."""
    layers = decoder_layers(model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_layers)  # parameters() dedups a tied head
    layer = max((sum(p.numel() for p in layer.parameters()) for layer in layers), default=0)
    return {"root": root * bytes_per_el, "layer": layer * bytes_per_el}


def wrap(model, d: Dist, *, dtype):
    """The training module for d.mode: the model itself, DDP around it, or the model fully_shard'ed in place."""
    import torch

    if d.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    if d.mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(d.device.type, (d.world,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if d.device.type == "cuda" else MixedPrecisionPolicy())
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def sync_context(module, d: Dist, last: bool):
    """Gradient sync only on the last micro-batch of an optimizer step."""
    if d.mode == "ddp" and not last:
        return module.no_sync()
    if d.mode == "fsdp":
        module.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def my_micro_batches(mbs: list, d: Dist) -> list[tuple[list[int], bool]]:
    """(micro-batch, counts) for this rank: mbs[rank::world], padded with zero-weight repeats of the step's
    first micro-batch to ceil(len(mbs) / world), so that every rank runs the same number of passes."""
    mine = [(mb, True) for mb in mbs[d.rank::d.world]]
    per_rank = -(-len(mbs) // d.world)
    return mine + [(mbs[0], False)] * (per_rank - len(mine))


def all_sum(values: list[float], d: Dist, device) -> list[float]:
    if not d.active:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_max(value: float, d: Dist, device) -> float:
    if not d.active:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def barrier(d: Dist) -> None:
    if d.active:
        import torch.distributed as dist

        dist.barrier()


def full_tensor(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def trainable_state(model) -> dict:
    """Every trainable parameter by name, whole (FSDP shards gathered: a collective, every rank calls it), on the CPU."""
    return {n: full_tensor(p.detach()).cpu() for n, p in model.named_parameters() if p.requires_grad}


def save_adapter(peft_model, d: Dist, path) -> None:
    """peft save_pretrained of the (gathered) adapter by rank 0; every rank must call it."""
    state = trainable_state(peft_model) if d.mode == "fsdp" else None
    if d.main:
        peft_model.save_pretrained(str(path), state_dict=state) if state is not None else peft_model.save_pretrained(str(path))


def load_adapter(peft_model, d: Dist, tensors: dict) -> None:
    """Load a peft-format adapter state (as saved) into the model, sharding it to FSDP's DTensors where needed."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    if d.mode != "fsdp":
        set_peft_model_state_dict(peft_model, tensors)
        return
    import torch
    from torch.distributed.tensor import distribute_tensor

    params = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    probe = {n: torch.empty(0) for n in params}
    by_id = {id(v): n for n, v in probe.items()}
    saved_name = {k: by_id[id(v)] for k, v in get_peft_model_state_dict(peft_model, state_dict=probe).items()}
    missing = sorted(set(saved_name) - set(tensors))
    if missing:
        raise ValueError(f"resume: the checkpoint's adapter lacks {missing[0]}")
    with torch.no_grad():
        for key, name in saved_name.items():
            p = params[name]
            value = tensors[key].to(device=p.device, dtype=p.dtype)
            if hasattr(p, "device_mesh"):
                value = distribute_tensor(value, p.device_mesh, p.placements)
            p.copy_(value)


def grad_norm_value(norm) -> float:
    return float(full_tensor(norm))
