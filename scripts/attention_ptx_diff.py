"""Does an edit of kernels/attention.py change the compiled dense kernels? No GPU needed.

Compiles the forward, dK/dV and dQ kernels (head dim 64 and 128, causal and not, bf16, the first Hopper
config of each list, specialised as a launch would: unit head-dim strides constexpr, pointers, strides and
lengths divisible by 16) for sm_90 from two source trees, and compares their PTX with the debug line
records (.loc / .file, which move with any edit above a kernel) dropped. Exit 1 when any differs.

    git worktree add /tmp/base main     # or any commit
    python scripts/attention_ptx_diff.py /tmp/base/src src

Each tree is compiled in its own subprocess (TRITON_INTERPRET unset: the interpreter replaces
@triton.jit functions). About 5 s per kernel on a CPU, 12 kernels per tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

_COMPILE = r"""
import importlib, json, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

A = importlib.import_module("hearth.kernels.attention")
out = sys.argv[1]
names = []
for causal in (False, True):
    for d in (64, 128):
        cls = "d64" if d == 64 else "d128"
        for label, fn, table in (("fwd", A._attn_fwd_kernel, A._FWD_CANDIDATES),
                                 ("dkdv", A._attn_bwd_dkdv_kernel, A._DKDV_CANDIDATES),
                                 ("dq", A._attn_bwd_dq_kernel, A._DQ_CANDIDATES)):
            bm, bn, warps, stages = table[cls][0]
            consts = dict(HEAD_DIM=d, CAUSAL=causal, USE_TMA=False, DOT_PREC="tf32", INTERP=False, BLOCK_M=bm, BLOCK_N=bn)
            if label == "dkdv":
                consts["FUSED_DQ"] = False
            consts.update({n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("d")})
            # parameters with defaults (e.g. VARLEN and its offsets) take them, as a dense launch does
            for p in fn.params:
                if p.name not in consts and p.has_default:
                    consts[p.name] = p.default
            # the signature is built here, not by attention.offline_source: the trees compared may predate it
            sig, attrs = {}, {}
            for i, n in enumerate(fn.arg_names):
                if n in consts:
                    sig[n] = "constexpr"
                elif n in ("Lse", "Delta", "DQacc"):
                    sig[n] = "*fp32"
                elif n in ("qk_scale", "sm_scale"):
                    sig[n] = "fp32"
                elif n in ("H_Q", "H_K", "GROUP") or n.startswith(("stride_", "N_CTX")):
                    sig[n] = "i32"
                else:
                    sig[n] = "*bf16"
                if n not in consts and (sig[n].startswith("*") or n.startswith(("stride_", "N_CTX"))):
                    attrs[(i,)] = [["tt.divisibility", 16]]
            k = triton.compile(ASTSource(fn, sig, constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()},
                                         attrs=attrs), target=GPUTarget("cuda", 90, 32),
                               options=dict(num_warps=warps, num_stages=stages))
            name = f"{label}_d{d}_{'causal' if causal else 'full'}"
            with open(os.path.join(out, name + ".ptx"), "w") as f:
                f.write(k.asm["ptx"])
            names.append(name)
print(json.dumps(names))
"""


def _ptx_without_debug(path: str) -> str:
    keep = []
    with open(path) as f:
        for line in f:
            if line.lstrip().startswith((".loc", ".file")):
                continue
            if line.lstrip().startswith(".section") and ".debug" in line:
                break
            keep.append(line)
    return "".join(keep)


def compile_tree(src: str, out: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.abspath(src)
    res = subprocess.run([sys.executable, "-c", _COMPILE, out], env=env, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"compiling {src} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        names = compile_tree(argv[0], a)
        compile_tree(argv[1], b)
        differ = [n for n in names if _ptx_without_debug(os.path.join(a, n + ".ptx"))
                  != _ptx_without_debug(os.path.join(b, n + ".ptx"))]
    for n in names:
        print(f"{n}: {'DIFFERENT' if n in differ else 'identical'}")
    print(f"{len(names) - len(differ)} of {len(names)} kernels compile to the same PTX")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
