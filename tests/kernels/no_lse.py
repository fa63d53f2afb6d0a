"""The check that an attention entry point skips the logsumexp when no backward will run, shared by the dense
(`attention`) and packed (`attention_varlen`) tests: both route a call with nothing to differentiate to their
forward launcher with store_lse=False."""

from __future__ import annotations

import torch


def check_forward_skips_logsumexp(monkeypatch, module, launcher: str, fn, q, k, v) -> None:
    """fn(q, k, v) -> out. With plain tensors (grad mode on) and under no_grad (q requiring grad), `module.launcher`
    (which returns (out, lse)) must be asked for no logsumexp (lse None) and the output must be bitwise the training
    forward's, with no graph recorded."""
    with torch.enable_grad():
        want = fn(*(x.clone().requires_grad_() for x in (q, k, v))).detach()
    seen = []
    real = getattr(module, launcher)

    def spy(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        seen.append(lse)
        return out, lse

    monkeypatch.setattr(module, launcher, spy)
    got_plain = fn(q, k, v)  # plain tensors, grad mode on
    with torch.no_grad():
        got_nograd = fn(q.clone().requires_grad_(), k, v)
    assert seen == [None, None]
    assert not got_plain.requires_grad and not got_nograd.requires_grad
    assert torch.equal(got_plain, want) and torch.equal(got_nograd, want)
