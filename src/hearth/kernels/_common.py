"""Shared argument checks and launch helpers for hearth's Triton kernels.

Every public op checks its preconditions once, at the public edge, and raises
TypeError (wrong type / dtype) or ValueError (wrong shape, device, value) naming
the argument. The hot path (the launcher and the kernels) carries no checks.

Kernels run on CUDA tensors; under TRITON_INTERPRET=1 (CI, no GPU) they also run
on CPU tensors through Triton's interpreter, at small shapes.
"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpret_mode() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def _patch_interpreter_scalar_index() -> None:
    """Let Triton 3.6's CPU interpreter run loops whose bound is a runtime argument under numpy >= 2.3.

    The interpreter holds every scalar as a shape-(1,) array and implements `range(0, n, B)` with
    `int(array)`, which numpy 2.3+ refuses ("only 0-dimensional arrays can be converted"). We wrap
    its per-launch patch so `__index__` reads the single element. Interpreter only; idempotent.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_hearth_index_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._hearth_index_fix = True
    interpreter._patch_lang_tensor = patched


if interpret_mode():  # every kernel module imports this one, so the fix is in place before any launch
    _patch_interpreter_scalar_index()


def check_tensor(
    t,
    name: str,
    *,
    dtypes=FLOAT_DTYPES,
    ndim: int | tuple[int, ...] | None = None,
    allow_empty: bool = False,
) -> None:
    """Raise TypeError/ValueError naming `name` if `t` is not a usable kernel input."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None:
        allowed_ndim = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed_ndim:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed_ndim))} dimensions, got shape {tuple(t.shape)}")
    if t.device.type != "cuda" and not (t.device.type == "cpu" and interpret_mode()):
        raise ValueError(
            f"{name} must be a CUDA tensor (CPU tensors run only under TRITON_INTERPRET=1), got device {t.device}"
        )
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """Raise ValueError naming the first tensor that is not on the first tensor's device."""
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; they must share a device")


def check_same_dtype(**tensors: torch.Tensor) -> None:
    """Raise TypeError naming the first tensor whose dtype differs from the first tensor's."""
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; they must match")


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on `device` (a small constant under the interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
