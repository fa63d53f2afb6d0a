"""hearth's Triton kernels, named like torch.nn.functional.

Each op lives in its own module (one file per op); this package re-exports the public
functions lazily so that importing one op does not compile or import the others.
"""

from __future__ import annotations

import importlib

_OPS = {
    "softmax": "softmax",
    "cross_entropy": "cross_entropy",
    "linear_cross_entropy": "linear_cross_entropy",
    "rms_norm": "rms_norm",
    "layer_norm": "layer_norm",
    "rope": "rope",
    "swiglu": "swiglu",
    "attention": "attention",
    "matmul": "matmul",
}

__all__ = list(_OPS)


def __getattr__(name: str):
    if name in _OPS:
        module = importlib.import_module(f"hearth.kernels.{_OPS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'hearth.kernels' has no attribute {name!r}")
