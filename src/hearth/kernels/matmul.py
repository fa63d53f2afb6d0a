"""matmul(a, b): C = A @ B on the tensor cores, Triton kernels and one torch.library op.

Math and traffic: C[M, N] = A[M, K] @ B[K, N], 2*M*N*K flops; with tiles BM x BN each A tile is
read N/BN times and each B tile M/BM times (mostly from L2 thanks to grouped tile ordering), C is
written once. bf16/fp16 feed the tensor cores directly (wgmma on Hopper, mma.sync on Ampere),
accumulating in fp32. fp32 inputs follow torch.backends.cuda.matmul.allow_tf32 as torch.mm does: TF32
tensor-core dots (10-bit mantissa) when it is on, full fp32 when it is off (PyTorch's default); under
the interpreter they are exact fp32.

Kernels
- `_matmul_tma_kernel` (Hopper, sm_90+): persistent grid of at most one program per SM, tiles
  visited in grouped order (GROUP_M rows of tiles share the B panel in L2), operands loaded by TMA.
  The A, B, C descriptors are built on the host (triton.tools.tensor_descriptor.TensorDescriptor)
  and passed as kernel arguments: Triton's launcher fills each CUtensorMap (128 bytes) into the
  kernel's parameters. Their block shape is the autotuned tile's, so every config carries a pre_hook
  (_set_block_shapes) that sets it before that config runs. Why not device-side descriptors
  (tl.make_tensor_descriptor): each program writes them to a global scratch buffer that Triton
  allocates on every launch (torch.empty through triton.set_allocator), which raised matmul's peak
  memory above its output (cuBLAS's figure) and cost host time per call; with host descriptors the
  output is the only allocation. That kernel, `_matmul_tma_device_desc_kernel` (same tile loop),
  stays reachable with env HEARTH_MATMUL_TMA_DESC=device (read per launch) for A/B timing. TMA needs
  a unit stride on the descriptor's last dimension and 16-byte aligned rows, so a transposed view
  (a.T) is described over its own contiguous storage and the loaded tile is transposed in shared
  memory (A_T / B_T constexpr) -- the backward pass never copies. Out-of-bounds tiles are zero-filled
  by TMA and clipped on store: any M, N, K. Host cost: what depends only on shapes, strides, dtype
  and device (layouts, descriptor shapes, and once tuned the config, grid and launch kwargs) is
  cached per such key (_TmaPlan), so a repeated call builds three descriptors and launches.
- `_matmul_kernel`: plain pointer kernel with masks, any strides. Used by the interpreter, pre-Hopper
  GPUs, fp32 (TF32) inputs, and operands TMA cannot describe (e.g. bf16 with K not a multiple of 8).
  If the TMA kernel fails to compile on a toolchain, the launcher warns once and stays on this one.

Checked offline (triton.compile for GPUTarget("cuda", 90, 32) on a CPU box): every TMA config, in
all four operand layouts, bf16 and fp16, with host descriptors, emits wgmma.mma_async and
cp.async.bulk.tensor, uses no global scratch and fits shared memory (128x256x64 x 4 stages: 229,440 B
of the 232,448 B limit); no spills (at most 166 registers; the device-descriptor kernel: 164).
The interpreter runs both TMA kernels (Triton 3.6's accepts TensorDescriptor arguments).

Both are autotuned on CUDA over a small config set keyed on (M, N, K) (the autotuner caches the
choice per shape); tile shapes that would leave SMs idle are pruned before timing (_prune_few_tiles). The launcher picks the kernel; `matmul` is a torch.library custom op with an
autograd formula (dA = dC @ B^T, dB = A^T @ dC through the same op on transposed views) and a fake
implementation, so torch.compile(fullgraph=True) traces it without a graph break. Eager calls skip the
custom-op dispatch (host time that small GEMMs cannot hide): a torch.autograd.Function with the same
formula runs the launcher (_common.autograd_op), and with no graph to record (no input requires grad,
or grad mode is off) `matmul` calls the launcher directly.
"""

from __future__ import annotations

import os
import warnings

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from hearth.kernels._common import (
    autograd_op, backward_route, capability, cdiv, check_same_device, check_same_dtype, check_tensor, interpret_mode,
    num_sms, records_graph, tma_scratch,
)




# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering: consecutive tile ids walk GROUP_M tile rows down one tile column, so the
    programs running at once share B panels (and A panels) in L2."""
    tiles_per_group = GROUP_M * num_pid_n
    group_id = tile_id // tiles_per_group
    first_m = group_id * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    in_group = tile_id % tiles_per_group
    pid_m = first_m + in_group % group_rows
    pid_n = in_group // group_rows
    return pid_m, pid_n


@triton.jit
def _matmul_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,
    # shapes
    M, N, K,
    # strides (elements)
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_of(pid, num_pid_m, num_pid_n, GROUP_M)

    # int64 row/column offsets: V x H weights (151936 x 5120) approach 2^31 elements.
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_left = K - k0
        a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n, other=0.0)
        if UPCAST:  # interpreter only: its bf16 dot multiplies raw bits; fp32 of bf16 values is exact
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


@triton.jit
def _tma_persistent_tiles(
    a_desc, b_desc, c_desc, M, N, K,
    A_T: tl.constexpr, B_T: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr, NUM_SMS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """The persistent tile loop of both TMA kernels (they differ only in where the descriptors come from)."""
    dtype = c_desc.dtype
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)

    # flatten=True lets the software pipeliner overlap the next tile's first loads with this
    # tile's epilogue (one loop nest instead of a restart per tile).
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            if A_T:
                a = a_desc.load([off_k, off_m]).T
            else:
                a = a_desc.load([off_m, off_k])
            if B_T:
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            if UPCAST:  # interpreter only (see _matmul_kernel)
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if EPILOGUE_SPLIT:
            halves = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)).permute(0, 2, 1)
            c0, c1 = tl.split(halves)
            c_desc.store([off_m, off_n], c0.to(dtype))
            c_desc.store([off_m, off_n + BLOCK_N // 2], c1.to(dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(dtype))


@triton.jit
def _matmul_tma_kernel(
    # host-built TMA descriptors (triton.tools.tensor_descriptor.TensorDescriptor): A over [M, K]
    # (A_T: over A^T's [K, M] storage), B over [K, N] (B_T: [N, K]), C over [M, N]; their block
    # shapes are set per config by _set_block_shapes
    a_desc, b_desc, c_desc,
    # shapes
    M, N, K,
    # meta-parameters
    A_T: tl.constexpr, B_T: tl.constexpr,  # operand is a transposed view of row-major storage
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr,  # store C in two halves: halves the epilogue's shared memory
    NUM_SMS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    _tma_persistent_tiles(a_desc, b_desc, c_desc, M, N, K, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                          EPILOGUE_SPLIT, NUM_SMS, PRECISION, UPCAST)


@triton.jit
def _matmul_tma_device_desc_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,
    # shapes
    M, N, K,
    # strides (elements): the leading stride of each operand's contiguous storage
    lda, ldb, ldc,
    # meta-parameters (as _matmul_tma_kernel)
    A_T: tl.constexpr, B_T: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr, NUM_SMS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    # The descriptors are built on the device: each program writes them into the global scratch
    # buffer Triton allocates per launch (triton.set_allocator).
    if A_T:  # storage is A^T [K, M] row-major
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[lda, 1], block_shape=[BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[lda, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_T:  # storage is B^T [N, K] row-major
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[ldb, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[ldb, 1], block_shape=[BLOCK_K, BLOCK_N])
    if EPILOGUE_SPLIT:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[ldc, 1], block_shape=[BLOCK_M, BLOCK_N // 2])
    else:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[ldc, 1], block_shape=[BLOCK_M, BLOCK_N])
    _tma_persistent_tiles(a_desc, b_desc, c_desc, M, N, K, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                          EPILOGUE_SPLIT, NUM_SMS, PRECISION, UPCAST)


# ----------------------------------------------------------------------------------------- launcher
# Small config sets (each autotuned shape pays ~len(configs) benchmark runs once).
# 128x256x64: the wgmma-friendly tile (one warpgroup pair, 64 KB of A/B per stage);
# 256x128x64: the same work per stage with the roles of A and B swapped (tall outputs, N <= 1024);
# 128x256x128 x 2 stages: half the k-steps, so half the two CTA barriers each k-step costs in
#   Triton's (not warp-specialised) Hopper pipeline;
# 128x128x64 with 4 stages: for shapes with few tiles (more programs per SM wave).
# sm_90 offline build (host descriptors, bf16 and fp16, all layouts): every config emits
# wgmma + cp.async.bulk.tensor, no spills; 128x256 / 256x128 x 3 stages: 154-163 registers, 176 KiB
# shared; x 4 stages: 154-166 registers, 224 KiB; 128x256x128 x 2: 154 registers, 224 KiB;
# 128x128 x 4 stages: 160 KiB (90-100 registers with 8 warps, 156-161 with 4). The device-descriptor
# kernel: the same shared memory, 0-5 registers fewer.
# Where the time goes at 4096^3 (0.88x cuBLAS in probe-1, 0.98x at K=8192): the per-tile epilogue
# (wgmma drain, acc -> smem -> TMA store) is not overlapped with the next tile's MMAs; halving the
# tiles' share of it (K=8192) closes most of the gap. Overlapping it needs warp specialisation.
# (tl.range(warp_specialize=True) builds for sm_90 in Triton 3.6 but emits no setmaxnreg and the
# same code: no producer/consumer split on Hopper, so it is not offered.)
_TMA_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "EPILOGUE_SPLIT": True}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "EPILOGUE_SPLIT": True}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "EPILOGUE_SPLIT": True}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "EPILOGUE_SPLIT": True}, num_stages=2, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "EPILOGUE_SPLIT": False}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "EPILOGUE_SPLIT": False}, num_stages=4, num_warps=4),
]
_PTR_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
]
# Interpreter: one small config (tests use shapes of a few dozen rows, so the masks are exercised).
_INTERP_PTR = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
_INTERP_TMA = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, EPILOGUE_SPLIT=True)



def _prune_few_tiles(configs, named_args, **kwargs):
    """Autotuner pre-filter: keep the tile shapes that give every SM at least one tile; when none
    does (small outputs), only those with the most tiles. A 128x256 tile on a 1000 x 3001 output
    leaves 36 of 132 SMs idle, and small shapes are launch-bound, so their autotune timings cannot
    be trusted to see it. Big shapes keep every config."""
    m, n = named_args["M"], named_args["N"]
    a = named_args["a_desc"].base if "a_desc" in named_args else named_args["a_ptr"]
    sms = num_sms(a.device)
    tiles = {c: cdiv(m, c.kwargs["BLOCK_M"]) * cdiv(n, c.kwargs["BLOCK_N"]) for c in configs}
    full = [c for c in configs if tiles[c] >= sms]
    if full:
        return full
    most = max(tiles.values())
    return [c for c in configs if tiles[c] == most]


def _block_shapes(a_t: bool, b_t: bool, block_m: int, block_n: int, block_k: int, split: bool):
    """The A, B, C descriptors' block shapes for one tile config (A_T / B_T: the descriptor is over
    the transposed storage, so its block is too; EPILOGUE_SPLIT stores C in two BLOCK_N / 2 halves)."""
    return ([block_k, block_m] if a_t else [block_m, block_k], [block_n, block_k] if b_t else [block_k, block_n],
            [block_m, block_n // 2] if split else [block_m, block_n])


def _set_block_shapes(nargs):
    """pre_hook of every host-descriptor TMA config: the autotuner calls it with the launch's named
    arguments plus that config's kwargs before each benchmark run and before the real launch, so
    every candidate tile gets descriptors of its own block shape (the block shape is part of the
    kernel's argument type, tensordesc<bf16[128, 64]>, and of the CUtensorMap the launcher fills)."""
    nargs["a_desc"].block_shape, nargs["b_desc"].block_shape, nargs["c_desc"].block_shape = _block_shapes(
        nargs["A_T"], nargs["B_T"], nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"], nargs["EPILOGUE_SPLIT"])


_TMA_HOST_CONFIGS = [triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages, pre_hook=_set_block_shapes)
                     for c in _TMA_CONFIGS]
_PRUNE = {"early_config_prune": _prune_few_tiles}
_matmul_ptr_tuned = triton.autotune(configs=_PTR_CONFIGS, key=["M", "N", "K", "PRECISION"], prune_configs_by=_PRUNE)(_matmul_kernel)
# The autotuner adds the dtype of every argument that has one to its key; descriptors have none, so
# one choice serves bf16 and fp16 at a shape (same bytes per tile, same wgmma rate on Hopper).
_matmul_tma_tuned = triton.autotune(configs=_TMA_HOST_CONFIGS, key=["M", "N", "K", "A_T", "B_T", "PRECISION"],
                                    prune_configs_by=_PRUNE)(_matmul_tma_kernel)
_matmul_tma_device_tuned = triton.autotune(configs=_TMA_CONFIGS, key=["M", "N", "K", "A_T", "B_T", "PRECISION"],
                                           prune_configs_by=_PRUNE)(_matmul_tma_device_desc_kernel)

# HEARTH_MATMUL_TMA_DESC: "host" (default) passes TensorDescriptors built here; "device" runs the
# kernel that builds them with tl.make_tensor_descriptor (a global scratch buffer per launch). Read
# on every TMA launch, so one process can time both (scripts set and unset it between runs).
TMA_DESC_ENV = "HEARTH_MATMUL_TMA_DESC"
_TMA_DESC_MODES = ("host", "device")

_TMA_BROKEN: str | None = None  # set once if the TMA kernel fails to compile on this GPU/toolchain
LAST_BACKEND: str | None = None  # "tma" or "pointer": which kernel the last launch used (probe/inspect)
LAST_TUNER = None  # the autotuner of the last tuned launch (.best_config, .configs_timings: probe)


def _precision(dtype: torch.dtype) -> str:
    """fp32 operands follow PyTorch's own switch, as torch.mm does: TF32 tensor-core dots only when
    torch.backends.cuda.matmul.allow_tf32 is on (float32_matmul_precision "high"/"medium"), else full
    fp32 ("ieee"). Always using TF32 gave fp32 gradients 5.6e-4 off where torch.mm is exact to 1e-6.
    The interpreter computes exactly anyway."""
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def _tma_desc_mode() -> str:
    mode = os.environ.get(TMA_DESC_ENV, "host")
    if mode not in _TMA_DESC_MODES:
        raise ValueError(f"{TMA_DESC_ENV} must be one of {_TMA_DESC_MODES}, got {mode!r}")
    return mode


def _tma_strides(t: torch.Tensor):
    """(transposed, leading stride) if TMA can describe `t` (2-D) from its shape and strides, else
    None. TMA needs a unit stride on one dimension, a non-zero 16-byte multiple leading stride and rows of at
    least 16 bytes; the base's 16-byte alignment is the caller's check (it changes every call)."""
    esize = t.element_size()
    # a leading stride of 0 (a broadcast row: the gradient of (y * w).sum() is w.expand(M, N)) is no TMA layout
    # (attention's tma_addressable refuses it too); the plan is cached per (shape, stride): no per-call cost
    if t.stride(1) == 1 and t.stride(0) > 0 and (t.stride(0) * esize) % 16 == 0 and (t.size(1) * esize) >= 16:
        return False, t.stride(0)
    if t.stride(0) == 1 and t.stride(1) > 0 and (t.stride(1) * esize) % 16 == 0 and (t.size(0) * esize) >= 16:
        return True, t.stride(1)
    return None


class _TmaPlan:
    """What a TMA launch decides from shapes, strides, dtype and device alone, kept per such key
    (_tma_plan) so that a repeated call (every training step, every layer of one shape) does little
    Python: the layouts, the descriptors' shapes and strides, and -- once the autotuner has chosen for
    this shape -- the config, grid and launch kwargs (`fixed`), launched without the autotuner's
    per-call work (its key, argument dicts and pre_hook: ~9 us per call on a CPU box with the launch
    stubbed; the whole TMA host path to the launch went 18.8 -> 8.6 us). A call then builds three
    descriptors around the new data pointers. The shape / stride lists are shared by every launch
    of the plan: nothing writes to them (block shapes are replaced, never edited)."""

    __slots__ = ("M", "N", "K", "a_t", "b_t", "lda", "ldb", "ldc", "a_shape", "b_shape", "c_shape",
                 "a_strides", "b_strides", "c_strides", "sms", "grid", "fixed")

    def __init__(self, a, b, c, a_t, lda, b_t, ldb):
        self.M, self.K = a.shape
        self.N = b.shape[1]
        M, N, K = self.M, self.N, self.K
        self.a_t, self.lda, self.b_t, self.ldb, self.ldc = a_t, lda, b_t, ldb, c.stride(0)
        # A^T's storage is [K, M] row-major (stride lda), B^T's is [N, K]: described as stored
        self.a_shape = [K, M] if a_t else [M, K]
        self.b_shape = [N, K] if b_t else [K, N]
        self.c_shape = [M, N]
        self.a_strides, self.b_strides, self.c_strides = [lda, 1], [ldb, 1], [self.ldc, 1]
        self.sms = sms = num_sms(a.device)
        # persistent grid: at most one program per SM
        self.grid = lambda m: (min(sms, cdiv(M, m["BLOCK_M"]) * cdiv(N, m["BLOCK_N"])),)
        # (device descriptors?, precision, tuned) -> (kernel, grid, launch kwargs, block shapes, tuner, config)
        self.fixed = {}

    def args(self, a, b, c, device_desc: bool, blocks):
        """The kernel's positional arguments for this call's tensors."""
        if device_desc:
            return (a, b, c, self.M, self.N, self.K, self.lda, self.ldb, self.ldc)
        return (TensorDescriptor(a, self.a_shape, self.a_strides, blocks[0]),
                TensorDescriptor(b, self.b_shape, self.b_strides, blocks[1]),
                TensorDescriptor(c, self.c_shape, self.c_strides, blocks[2]), self.M, self.N, self.K)


_PLANS: dict = {}
_PLANS_MAX = 4096  # distinct (shape, stride) keys kept; cleared when full (varying sequence lengths)
# descriptors' block shapes until the autotuner's pre_hook sets each config's (_set_block_shapes)
_PLACEHOLDER_BLOCKS = ([16, 16],) * 3


def _tma_plan(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> _TmaPlan | None:
    """The cached launch plan for these operands, or None where TMA cannot describe their layouts
    (a and b: a unit stride on either dimension, c: row-major). Alignment is not part of it."""
    key = (a.shape, a.stride(), b.shape, b.stride(), c.shape, c.stride(), a.dtype, a.device)
    plan = _PLANS.get(key, False)
    if plan is False:
        la, lb = _tma_strides(a), _tma_strides(b)
        ok = la is not None and lb is not None and _tma_strides(c) == (False, c.stride(0))
        plan = _TmaPlan(a, b, c, *la, *lb) if ok else None
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _aligned(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> bool:
    """TMA's 16-byte aligned bases (a view at an odd offset is not)."""
    return not (a.data_ptr() | b.data_ptr() | c.data_ptr()) & 15


def _use_tma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> _TmaPlan | None:
    """The TMA launch plan when the TMA kernel should run these operands, else None."""
    if _TMA_BROKEN is not None or a.device.type != "cuda" or interpret_mode():
        return None
    if a.dtype not in (torch.bfloat16, torch.float16) or capability(a.device)[0] < 9:
        return None  # fp32 (TF32) stays on the pointer kernel: wgmma reads 32-bit operands K-major only
    plan = _tma_plan(a, b, c)
    return plan if plan is not None and _aligned(a, b, c) else None


def _launch_tma(a, b, c, *, tuned: bool = True, plan: _TmaPlan | None = None):
    """plan: _use_tma's (already checked); None: look it up and check here (a forced backend)."""
    global LAST_TUNER
    if plan is None:
        plan = _tma_plan(a, b, c)
        if plan is None or not _aligned(a, b, c):
            raise ValueError("the TMA kernel needs a unit stride and 16-byte aligned rows and bases for a and b, "
                             "and a row-major out")
    device_desc = _tma_desc_mode() == "device"
    if device_desc and a.device.type == "cuda":
        # A ContextVar: set it on every launch (autograd's backward runs on another thread).
        triton.set_allocator(tma_scratch)
    key = (device_desc, _precision(a.dtype), tuned)
    fixed = plan.fixed.get(key)
    if fixed is None:
        kernel = _matmul_tma_device_desc_kernel if device_desc else _matmul_tma_kernel
        meta = dict(A_T=plan.a_t, B_T=plan.b_t, NUM_SMS=plan.sms, PRECISION=key[1], UPCAST=not tuned)
        if tuned:
            # The plan's first launch goes through the autotuner (it benchmarks on the shape's first
            # call; each config's pre_hook sets the descriptors' block shapes); later ones reuse its pick.
            tuner = _matmul_tma_device_tuned if device_desc else _matmul_tma_tuned
            LAST_TUNER = tuner
            handle = tuner[plan.grid](*plan.args(a, b, c, device_desc, _PLACEHOLDER_BLOCKS), **meta)
            cfg = tuner.best_config
            kwargs = {**meta, **cfg.all_kwargs()}
        else:
            handle, tuner, cfg = None, None, None
            kwargs = {**meta, **_INTERP_TMA}
        blocks = _block_shapes(plan.a_t, plan.b_t, kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["BLOCK_K"],
                               kwargs["EPILOGUE_SPLIT"])
        fixed = plan.fixed[key] = (kernel, plan.grid(kwargs), kwargs, blocks, tuner, cfg)
        if handle is not None:
            return handle
    kernel, grid, kwargs, blocks, tuner, cfg = fixed
    if tuner is not None:
        LAST_TUNER = tuner
        tuner.best_config = cfg  # what the autotuner would report for this launch (probe, inspect)
    return kernel[grid](*plan.args(a, b, c, device_desc, blocks), **kwargs)


# The pointer kernel's M / N offsets are int64, but its in-tile K offsets (offs_k * stride along K, and
# the per-step pointer bump BLOCK_K * stride) are int32: an operand whose K-direction stride reaches
# 2^31 / 256 elements (a pathological view) is re-laid out with unit K stride before launch.
_MAX_K_STRIDE = 2**31 // 256


def _launch_pointer(a, b, c, *, tuned: bool = True):
    global LAST_TUNER
    M, K = a.shape
    N = b.shape[1]
    if a.stride(1) > _MAX_K_STRIDE:
        a = a.contiguous()  # [M, K] row-major: K stride 1
    if b.stride(0) > _MAX_K_STRIDE:
        b = b.t().contiguous().t()  # [K, N] column-major: K stride 1 (the N offsets are int64)
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    if tuned:
        grid = lambda m: (cdiv(M, m["BLOCK_M"]) * cdiv(N, m["BLOCK_N"]),)
        LAST_TUNER = _matmul_ptr_tuned
        return _matmul_ptr_tuned[grid](*args, PRECISION=_precision(a.dtype), UPCAST=False)
    cfg = _INTERP_PTR
    grid = (cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]),)
    return _matmul_kernel[grid](*args, PRECISION=_precision(a.dtype), UPCAST=True, **cfg)


def matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, backend: str | None = None):
    """Launch C = A @ B into `out` [M, N] (row-major). a [M, K], b [K, N], any strides, same dtype,
    already validated. backend: None (pick), "tma" or "pointer" (tests force one). Returns the
    compiled kernel handle Triton's launch gives back (used by `inspect_kernels`)."""
    global _TMA_BROKEN, LAST_BACKEND
    tuned = a.device.type == "cuda" and not interpret_mode()
    auto = backend is None
    plan = None
    if auto:
        plan = _use_tma(a, b, out)
        backend = "tma" if plan is not None else "pointer"
    if backend == "tma":
        try:
            handle = _launch_tma(a, b, out, tuned=tuned, plan=plan)
            LAST_BACKEND = "tma"
            return handle
        except (triton.CompilationError, RuntimeError) as exc:  # toolchain without TMA support
            if not (tuned and auto):  # a forced backend (tests, inspect) reports its failure
                raise
            _TMA_BROKEN = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"hearth.matmul: the TMA kernel failed ({_TMA_BROKEN[:300]}); using the pointer kernel", stacklevel=2)
    handle = _launch_pointer(a, b, out, tuned=tuned)
    LAST_BACKEND = "pointer"
    return handle


# ----------------------------------------------------------------------------------------- torch.library op
def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    matmul_into(a, b, out)
    return out


_matmul_op = torch.library.custom_op("hearth::matmul", mutates_args=())(_matmul)


@_matmul_op.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    mm = backward_route(ctx, _matmul_op, _matmul_diff, _matmul)  # matmul again (_common.backward_route)
    # Transposed *views*: the kernels take the strides, nothing is copied.
    if ctx.needs_input_grad[0]:
        grad_a = mm(grad_c, b.t())
    if ctx.needs_input_grad[1]:
        grad_b = mm(a.t(), grad_c)
    return grad_a, grad_b


# eager: a torch.autograd.Function over _matmul; under torch.compile: the custom op
_matmul_diff = autograd_op(_matmul_op, _matmul, _setup_context, _backward)


# ----------------------------------------------------------------------------------------- public
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = a @ b on the tensor cores (differentiable, torch.compile-able).

    a: [..., M, K] (leading dims are flattened into M), b: [K, N]; same dtype (float32, bfloat16,
    float16), same device. Returns [..., M, N] in the inputs' dtype, accumulated in fp32; float32
    inputs use TF32 tensor-core dots on the GPU. Any strides (transposed views are read in place).
    Raises TypeError (non-tensor, dtype) or ValueError (shape, device, empty) naming the argument.
    """
    check_tensor(a, "a")
    check_tensor(b, "b", ndim=2)
    if a.dim() < 2:
        raise ValueError(f"a must have at least 2 dimensions [..., M, K], got shape {tuple(a.shape)}")
    check_same_dtype(a=a, b=b)
    check_same_device(a=a, b=b)
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"b has {b.shape[0]} rows but a has {a.shape[-1]} columns (K must match): a {tuple(a.shape)}, b {tuple(b.shape)}")
    flat = a.dim() == 2  # no reshape views (autograd nodes of host time each way) around a 2-D call
    a2 = a if flat else a.reshape(-1, a.shape[-1])
    if torch.compiler.is_compiling() or records_graph(a, b):
        out = _matmul_diff(a2, b)
    else:  # no graph to record: skip the autograd.Function too
        out = _matmul(a2, b)
    return out if flat else out.reshape(*a.shape[:-1], b.shape[1])


def inspect_kernels(shape: tuple[int, ...], dtype: torch.dtype) -> list[tuple[str, object]]:
    """`hearth inspect` convention: compile this op's kernels at `shape` = (M, N, K) and return
    [(label, compiled kernel)], each compiled kernel exposing .asm (ptx, cubin...) and .metadata."""
    m, n, k = (tuple(shape) + (4096, 4096, 4096))[:3] if shape else (4096, 4096, 4096)
    dev = torch.device("cuda")
    a = torch.randn(m, k, device=dev, dtype=dtype)
    b = torch.randn(k, n, device=dev, dtype=dtype)
    out = torch.empty(m, n, device=dev, dtype=dtype)
    found = []
    for backend in ("tma", "pointer"):
        if backend == "tma" and not _use_tma(a, b, out):
            continue
        handle = matmul_into(a, b, out, backend=backend)
        if LAST_BACKEND == backend and handle is not None:
            found.append((f"matmul[{backend}] {m}x{n}x{k}", handle))
    return found


def compile_tma_offline(arch: int, dtype: torch.dtype, cfg: triton.Config, *, a_t: bool = False, b_t: bool = False,
                        desc: str = "host"):
    """triton.compile one TMA kernel config for compute capability `arch` without a GPU, as a launch with
    these operand layouts would specialise it. desc "host": _matmul_tma_kernel, whose descriptor
    arguments are typed by element type and block shape (tensordesc<bf16[128, 64]>, what Triton's JIT
    derives from a TensorDescriptor); "device": _matmul_tma_device_desc_kernel (pointers + strides)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if desc not in _TMA_DESC_MODES:
        raise ValueError(f"desc must be one of {_TMA_DESC_MODES}, got {desc!r}")
    ty = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    if ty is None:
        raise ValueError(f"dtype must be bfloat16 or float16 for the TMA kernel, got {dtype}")
    const = dict(A_T=a_t, B_T=b_t, NUM_SMS=132, PRECISION="ieee", UPCAST=False, **cfg.kwargs)
    if desc == "host":
        blocks = _block_shapes(a_t, b_t, cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"],
                               cfg.kwargs["EPILOGUE_SPLIT"])
        sig = {name: f"tensordesc<{ty}[{bs[0]}, {bs[1]}]>" for name, bs in zip(("a_desc", "b_desc", "c_desc"), blocks)}
        sig.update(M="i32", N="i32", K="i32")
        fn = _matmul_tma_kernel
    else:
        sig = {"a_ptr": f"*{ty}", "b_ptr": f"*{ty}", "c_ptr": f"*{ty}", "M": "i32", "N": "i32", "K": "i32",
               "lda": "i32", "ldb": "i32", "ldc": "i32"}
        fn = _matmul_tma_device_desc_kernel
    sig.update({k: "constexpr" for k in const})
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def offline_kernels(arch: int, dtype: torch.dtype) -> list[tuple[str, object]]:
    """`hearth inspect --arch` convention: compile this op's kernels for compute capability `arch`
    (e.g. 90) without a GPU (triton.compile + the bundled ptxas). Needs TRITON_INTERPRET unset at
    import (the interpreter replaces @triton.jit functions)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptr = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}[dtype]
    target = GPUTarget("cuda", arch, 32)
    found = []
    if arch >= 90 and dtype != torch.float32:
        for cfg in (_TMA_CONFIGS[0], _TMA_CONFIGS[4]):  # 128x256x64 and 128x128x64 (the others: see _TMA_CONFIGS)
            k = compile_tma_offline(arch, dtype, cfg)  # the default (host-descriptor) kernel
            found.append((f"matmul[tma] {cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']}x{cfg.kwargs['BLOCK_K']} sm_{arch}", k))
    cfg = _PTR_CONFIGS[1]
    const = dict(stride_ak=1, stride_bn=1, stride_cn=1, PRECISION=_precision(dtype), UPCAST=False, **cfg.kwargs)
    sig = {"a_ptr": ptr, "b_ptr": ptr, "c_ptr": ptr, "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}
    sig.update({k: "constexpr" for k in const})
    k = triton.compile(ASTSource(fn=_matmul_kernel, signature=sig, constexprs=const), target=target,
                       options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    found.append((f"matmul[pointer] {cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']}x{cfg.kwargs['BLOCK_K']} sm_{arch}", k))
    return found
