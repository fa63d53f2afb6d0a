"""Launch recording for the kernel tests: which Triton kernels a launcher ran, on which pointers, strides and
sizes, so that a test can hold a host-side fast path (tensors passed whole instead of [rows, n] views) to the
launches of the general path."""

from __future__ import annotations

import torch

from tests.kernels.tolerance import DEVICE


class Launches:
    """Stands in for a module's Triton kernels (monkeypatched by name): kernel[grid](*args, **kwargs) appends
    (kernel name, grid, args with each tensor as its pointer) to .log and runs the real launch."""

    def __init__(self, monkeypatch, module, names):
        self.log = []
        for name in names:
            monkeypatch.setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name, kernel):
        log = self.log

        class _Kernel:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    ptrs = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
                    log.append((name, tuple(grid), ptrs))
                    return kernel[grid](*args, **kwargs)
                return run

        return _Kernel()


def laid_out(shape, strides=None, seed=0):
    """A float32 tensor of `shape` holding random values, laid out with `strides` over a larger buffer (None:
    a new contiguous tensor)."""
    g = torch.Generator().manual_seed(seed)
    if strides is None:
        return (torch.randn(shape, generator=g) * 3).to(DEVICE)
    t = torch.zeros(8192, device=DEVICE).as_strided(shape, strides)
    t.copy_(torch.randn(shape, generator=g) * 3)
    return t


def kept_pointer(view: torch.Tensor, t: torch.Tensor):
    """view's pointer when it reads t's memory, else None (a copy is a new buffer each time: not comparable)."""
    return view.data_ptr() if view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() else None


def row_view_launches(n: int, y: torch.Tensor, x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor):
    """What a norm's forward and backward launches got on the view path (rms_norm._rows of each input, out.view(-1,
    n) of each output), as [(pointers, row strides, rows)] for the forward (x, y) and the backward (dy, x, dx);
    a pointer is None where _rows copies (not comparable)."""
    from hearth.kernels.rms_norm import _rows

    want = []
    for ins, out in (((x,), y), ((dy, x), dx)):
        rows = [_rows(t, n) for t in ins] + [out.view(-1, n)]
        ptrs = [kept_pointer(r, t) for r, t in zip(rows, (*ins, out))]
        want.append((ptrs, [r.stride(0) for r in rows], rows[0].shape[0]))
    return want
