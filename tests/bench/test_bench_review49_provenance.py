"""Review 49: every ranked figure carries its peer's versions.

quack (the fastest peer of 11 committed cases: softmax, cross entropy, rms_norm) and FlashAttention (of all 5
attention_varlen cases) were ranked with no version on their rows: env_info recorded torch, triton and Liger only,
and the flash_attn row did not say whether FlashAttention-4, -3 or -2 ran (it takes the first that imports).
"""

from __future__ import annotations

import importlib.metadata as md

import torch

from hearth.bench import cases, runner
from hearth.bench import providers as P


def test_env_records_the_peer_libraries_versions(monkeypatch):
    fake = {"quack-kernels": "0.6.5", "nvidia-cutlass-dsl": "4.8.1", "flash-attn-4": "4.0.0b36"}
    real = md.version

    def version(dist):
        if dist in fake:
            return fake[dist]
        if dist in ("flash-attn-3", "flash-attn"):
            raise md.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(md, "version", version)
    env = runner.env_info(torch.device("cpu"))
    assert env["quack"] == "0.6.5" and env["cutlass_dsl"] == "4.8.1"
    assert env["flash_attn"] == {"flash-attn-4": "4.0.0b36"}
    assert env["cuda"] == torch.version.cuda and "cudnn" in env


def test_flash_attn_row_names_the_flash_attention_it_timed(monkeypatch):
    import torch.nn.functional as F

    def flash_attn_func(q, k, v, causal=False):  # FlashAttention's layout, [B, T, H, D]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                             enable_gqa=True)
        return out.transpose(1, 2), None

    monkeypatch.setattr(P, "_flash_attn_function", lambda inputs, attr: ("flash_attn.cute", flash_attn_func))
    spec = cases.SPECS["attention"]
    size = spec.check_sizes[0]
    rows = runner.run_case(spec, size, "float32", "fwd", ["flash_attn"], torch.device("cpu"), {}, {}, False, True)
    assert [(r["provider"], r["status"], r.get("impl")) for r in rows] == [("flash_attn", "ok", "flash_attn.cute")]
