"""Where Triton 3.6 puts warpgroup bar.syncs around Gluon mbarrier operations (sm_90, compiled offline, no GPU).

One 4-warp kernel, two mbarriers a and b; MODE picks the sequence after their init: 0 arrive a, arrive b;
1 arrive a, wait b; 2 arrive a alone; 3 wait a, arrive b; 4 wait a, wait b; 5 arrive a, math, arrive a.
Prints the PTX lines that init, arrive, wait or bar.sync, in order. Run: env -u TRITON_INTERPRET PYTHONPATH=src
python benchmarks/host/mbarrier_syncs-2026-12-06.py (BENCHMARKS.md, forty-fourth run)."""
import re
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, fence_async_shared
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import triton

@gluon.jit
def k(X, MODE: ttgl.constexpr):
    a = ttgl.allocate_shared_memory(ttgl.int64, [1], mbarrier.MBarrierLayout())
    b = ttgl.allocate_shared_memory(ttgl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(a, count=1)
    mbarrier.init(b, count=1)
    fence_async_shared()
    x = ttgl.load(X + ttgl.arange(0, 128, layout=ttgl.BlockedLayout([1], [32], [4], [0])))
    if MODE == 0:    # arrive a, then arrive b
        mbarrier.arrive(a, count=1)
        mbarrier.arrive(b, count=1)
    elif MODE == 1:  # arrive a, then wait b
        mbarrier.arrive(a, count=1)
        mbarrier.wait(b, 0)
    elif MODE == 2:  # arrive a only, then math and store
        mbarrier.arrive(a, count=1)
    elif MODE == 3:  # wait a, then arrive b
        mbarrier.wait(a, 0)
        mbarrier.arrive(b, count=1)
    elif MODE == 4:  # wait a, wait b
        mbarrier.wait(a, 0)
        mbarrier.wait(b, 0)
    elif MODE == 5:  # arrive a, math, arrive a again
        mbarrier.arrive(a, count=1)
        x = x * 3.0
        mbarrier.arrive(a, count=1)
    ttgl.store(X + ttgl.arange(0, 128, layout=ttgl.BlockedLayout([1], [32], [4], [0])), x * 2)

target = GPUTarget("cuda", 90, 32)
for mode in range(6):
    src = GluonASTSource(k, signature={"X": "*fp32", "MODE": "constexpr"}, constexprs={"MODE": mode})
    ck = triton.compile(src, target=target, options=dict(num_warps=4))
    ptx = ck.asm["ptx"]
    body = [l.strip() for l in ptx.splitlines() if re.search(r"bar\.sync|barrier\.sync|mbarrier\.(arrive|try_wait|init)", l)]
    print(mode, body)
