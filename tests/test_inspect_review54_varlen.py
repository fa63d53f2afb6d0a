"""hearth.inspect, review 54: every op `hearth inspect` accepts (hearth.kernels.__all__) has a way to be compiled.
attention_varlen passed the argument check (it is in __all__) but had neither inspect_kernels nor a runner: on a GPU
`hearth inspect attention_varlen` answered "unknown op 'attention_varlen'; known: ..., attention_varlen, ...", exit 2."""

from __future__ import annotations

import importlib

import pytest
import torch

from hearth import inspect as hi

K = importlib.import_module("hearth.kernels")


@pytest.mark.parametrize("op", K.__all__)
def test_every_accepted_op_can_be_run(op):
    module = importlib.import_module(f"hearth.kernels.{op}")
    if hasattr(module, "inspect_kernels"):
        return
    assert callable(hi._generic_runner(op, None, torch.float32, device="cpu"))


def test_varlen_runner_calls_the_packed_op_with_its_shape(monkeypatch):
    seen = {}

    def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, scale=None):
        seen.update(q=tuple(q.shape), k=tuple(k.shape), cu=cu_q.tolist(), cu_k=cu_k.tolist(), max=(max_q, max_k),
                    causal=causal, dtype=cu_q.dtype)
        return q * 2

    monkeypatch.setattr(K, "attention_varlen", fake)
    run = hi._generic_runner("attention_varlen", (3, 4, 16, 32), torch.float32, device="cpu")
    run()
    assert seen == dict(q=(48, 4, 32), k=(48, 4, 32), cu=[0, 16, 32, 48], cu_k=[0, 16, 32, 48], max=(16, 16),
                        causal=True, dtype=torch.int32)
