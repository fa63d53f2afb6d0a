"""Review 75: a head dim that runs zero-padded (D 80 -> 128, 24 -> 32) widens each row of the tensors the kernels
read. attention and attention_varlen checked the int32 in-plane extent (the kernels' offsets inside one [T, D]
plane, or one packed sequence's) on the caller's tensors, BEFORE the padding: a plane under 2^31 elements at D
whose padded copy passes 2^31 reached the kernels (e.g. packed sequences of 420K-671K tokens at 40 heads x 80:
the int32 offsets wrap, reads and writes out of bounds). The check now runs on the tensors the kernels get.

The limit is lowered here (monkeypatch) so that small tensors sit between the two extents; a spy on the forward
records what would reach the kernels."""

from __future__ import annotations

import importlib

import pytest
import torch

from hearth.kernels import attention, attention_varlen
from tests.kernels.tolerance import DEVICE

attn_mod = importlib.import_module("hearth.kernels.attention")
varlen_mod = importlib.import_module("hearth.kernels.attention_varlen")


def _spy(monkeypatch, module, name, extent):
    seen = []
    real = getattr(module, name)

    def spy(q, k, v, *rest, **kw):
        seen.extend(extent(t) for t in (q, k, v))
        return real(q, k, v, *rest, **kw)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_dense_padded_plane_past_the_limit_never_reaches_the_kernel(monkeypatch):
    # [1, 1, 8, 24] dense: plane extent 7 * 24 + 23 = 191 at D; padded to 32: 7 * 32 + 31 = 255
    limit = 200
    monkeypatch.setattr(attn_mod, "_INT32_LIMIT", limit)
    seen = _spy(monkeypatch, attn_mod, "_attention_forward", attn_mod._plane_extent)
    q, k, v = (torch.randn(1, 1, 8, 24, device=DEVICE) for _ in range(3))
    with torch.no_grad():
        try:
            attention(q, k, v)
        except ValueError as e:
            assert str(e).startswith("q ")
    assert all(x < limit for x in seen), seen  # failed: [255, 255, 255]


def test_varlen_padded_sequence_past_the_limit_never_reaches_the_kernel(monkeypatch):
    # [8, 2, 24] packed, one sequence of 8: extent 7 * 48 + 23 = 359 at D; padded to 32: 7 * 64 + 31 = 479
    limit = 400
    monkeypatch.setattr(attn_mod, "_INT32_LIMIT", limit)
    seen = _spy(monkeypatch, varlen_mod, "_varlen_forward", lambda t: varlen_mod._seq_extent(t, 8))
    q, k, v = (torch.randn(8, 2, 24, device=DEVICE) for _ in range(3))
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        try:
            attention_varlen(q, k, v, cu, cu, 8, 8)
        except ValueError as e:
            assert str(e).startswith("q")
    assert all(x < limit for x in seen), seen  # failed: [479, 479, 479]


@pytest.mark.parametrize("D", [24, 32])
def test_within_the_limit_still_served(monkeypatch, D):
    # the same tensors under a limit their padded planes fit: served, and equal to the unpadded reference
    monkeypatch.setattr(attn_mod, "_INT32_LIMIT", 256)
    g = torch.Generator().manual_seed(75)
    q, k, v = (torch.randn(1, 1, 8, D, generator=g).to(DEVICE) for _ in range(3))
    with torch.no_grad():
        out = attention(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)
