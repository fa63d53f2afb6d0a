"""QLoRA: a frozen 4-bit NF4 base (bitsandbytes) under bf16/fp32 LoRA adapters.

    model = load_4bit(path, dtype=torch.bfloat16, device="cuda")          # a local model folder
    model = random_4bit(config, dtype=torch.bfloat16, device="cuda")      # random weights, for benchmarks

Every nn.Linear of the decoder (not lm_head, not the embeddings) becomes a bitsandbytes Linear4bit
(NF4, double-quantised absmax, compute in ``dtype``); peft then puts its LoRA layers around those, as
for any bitsandbytes model. load_4bit goes through transformers' BitsAndBytesConfig (quantised while
loading, so a 14B base never exists in 16 bits on the GPU); random_4bit builds the model on the meta
device and materialises one Linear at a time (random, std = config.initializer_range) straight into
4 bits, so its peak is one bf16 matrix above the 4-bit model. bitsandbytes' NF4 path runs on the CPU
too (the tests use it there).
"""

from __future__ import annotations

from pathlib import Path

# bytes per weight of an NF4 Linear with double quantisation: 4 bits + an 8-bit absmax per 64 weights
# + an fp32 second-level scale per 256 absmax values
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)


def bnb_config(dtype):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=dtype)


def load_4bit(path: Path, *, dtype, device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype,
                                                attn_implementation="sdpa", quantization_config=bnb_config(dtype),
                                                device_map={"": str(device)})


def _linear4bit(linear, weight, dtype, device):
    import bitsandbytes as bnb
    import torch

    with torch.device("meta"):
        q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              compute_dtype=dtype, compress_statistics=True, quant_type="nf4")
    q.weight = bnb.nn.Params4bit(weight.to("cpu") if str(device) == "cpu" else weight, requires_grad=False,
                                 compress_statistics=True, quant_type="nf4")
    if linear.bias is not None:
        q.bias = torch.nn.Parameter(torch.zeros(linear.out_features, dtype=dtype, device=device), requires_grad=False)
    return q.to(device)  # quantises here


def random_4bit(config, *, dtype, device, seed: int = 0):
    """A causal LM from ``config`` with random weights and an NF4 base, built without ever holding the
    whole model in 16 bits (see the module doc)."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    gen = torch.Generator(device=device).manual_seed(seed)
    std = getattr(config, "initializer_range", 0.02)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    head = model.get_output_embeddings()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and child is not head:
                w = torch.empty(child.out_features, child.in_features, dtype=dtype, device=device)
                w.normal_(0.0, std, generator=gen)
                setattr(module, name, _linear4bit(child, w, dtype, device))
                del w
    for module in list(model.modules()):  # what is left on meta: embeddings, lm_head, norms, rotary buffers
        for name, p in list(module.named_parameters(recurse=False)):
            if p.device.type != "meta":
                continue
            new = torch.empty(p.shape, dtype=p.dtype, device=device)
            if "Norm" in type(module).__name__:
                new.fill_(1.0)
            else:
                new.normal_(0.0, std, generator=gen)
            setattr(module, name, nn.Parameter(new, requires_grad=p.requires_grad))
        if any(b.device.type == "meta" for b in module.buffers(recurse=False)):
            if "Rotary" not in type(module).__name__:
                raise ValueError(f"model: cannot materialise the buffers of {type(module).__name__} for a 4-bit random init")
            with torch.device("cpu"):
                fresh = type(module)(config=config)
            for bname, buf in fresh.named_buffers(recurse=False):
                module.register_buffer(bname, buf.to(device), persistent=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.is_loaded_in_4bit = True
    return model


def prepare(model):
    """What QLoRA needs before peft: every non-quantised parameter frozen, norms kept in the model dtype
    (peft's prepare_model_for_kbit_training would upcast them to fp32 and cost memory)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model
