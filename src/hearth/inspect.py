"""`hearth inspect OP`: compile an op's Triton kernels for this GPU and read what the compiler made.

LESSON 4: a matmul sat flat at ~1 TFLOP/s because its PTX had no mma instruction at all -- whether
the tensor cores are used is read in the compiled code, not guessed. Per kernel this reports:
  * tensor-core instructions: PTX `wgmma.mma_async` (Hopper), `tcgen05.mma` (Blackwell), `mma.sync` /
    `wmma` (Ampere style); SASS `HGMMA` / `QGMMA` / `IGMMA` (Hopper), `UTC*MMA` (Blackwell), `HMMA` /
    `IMMA` (older path) -- SASS through cuobjdump on the cubin when the tool is there (Triton ships
    one). When there is SASS, it decides whether tensor cores are used (it is what runs);
  * TMA bulk copies and reduces (PTX cp.async.bulk.tensor / cp.reduce.async.bulk.tensor, SASS
    UTMALDG / UTMASTG / UTMAREDG), fp32 FMAs (FFMA);
  * registers per thread, spills (stack frame / local memory bytes; the frame also holds local arrays,
    so when it is not empty `ptxas -v` on the PTX tells whether any register was spilled), shared memory
    per program (the dynamic shared memory Triton launches with; the 1 KiB the system reserves per block
    is apart);
  * ptxas's performance advisories for a wgmma kernel (`ptxas -v` on its PTX, as Triton ran it): "(C7514)
    wgmma.mma_async instructions are serialized" means every wgmma of the kernel waits for the one before
    (a WARPGROUP.DEPBAR after each HGMMA): the tensor cores run one matmul at a time, with no error and no
    wrong result. Triton throws ptxas's log away; the fused attention backward drew C7514 once from an
    accumulator left in flight across its loop's back edge (BENCHMARKS.md, 2026-12-07);
  * a one-line verdict. A kernel whose Triton IR holds a `tt.dot` (matmul-like) but whose code has
    no tensor-core instruction gets "No tensor-core instructions were emitted", in red. Gluon kernels
    have no TTIR: their TTGIR is read (ttng.warp_group_dot / ttng.tc_gen5_mma). A wgmma kernel with a ptxas
    advisory is a warning that names it.

How kernels are found: a kernel module may expose `inspect_kernels(shape, dtype)` returning
[(label, CompiledKernel)] (matmul and linear_cross_entropy do). For other ops, the public op is run
once at the shape and every Triton kernel launched meanwhile is captured (JITFunction.run returns the
CompiledKernel it launched; the capture wraps it for the duration of the call).

Offline (`--arch sm_90`): a module may also expose `offline_kernels(arch, dtype)`, building its
kernels with triton.compile for GPUTarget("cuda", arch, 32) and Triton's bundled ptxas -- no GPU
needed, so CI can check that the matmul still emits wgmma (matmul implements it).

The parsing functions (count_ptx, count_sass, parse_res_usage, parse_ptxas_spills, parse_ptxas_advisories,
uses_dot, verdict) are pure and are tested on stored compiler output (tests/data/inspect/). `main` returns an exit
code: 0 fine, 1 a matmul-like kernel without tensor-core instructions, 2 bad arguments (op, --shape, --dtype, an --arch
the installed Triton's ptxas cannot build for, a --json folder that does not exist) / no CUDA (without
--arch) / TRITON_INTERPRET=1 (the interpreter compiles nothing), 3 the build itself failed (ptxas, a compiler
pass: the message names the error). Arguments are checked before anything is compiled.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

PTX_PATTERNS = {
    "wgmma": r"\bwgmma\.mma_async\b",  # .sp forms included
    "tcgen05.mma": r"\btcgen05\.mma\b",  # Blackwell (sm_100): .sp / .ws forms included
    # mma.sync and the sparse mma.sp(::ordered_metadata).sync, not wmma.mma.sync (that is a wmma)
    "mma.sync": r"(?<![\w.])mma(?:\.sp(?:::ordered_metadata)?)?\.sync\b",
    "wmma": r"\bwmma\.mma\b",
    "tma": r"\bcp\.(?:reduce\.)?async\.bulk\.tensor\b",
    "fma.f32": r"\bfma\.rn\.f32\b",
    "local": r"\b(?:ld|st)\.local\b",
}
SASS_PATTERNS = {
    "HGMMA": r"\bHGMMA\b",
    "QGMMA": r"\bQGMMA\b",
    "IGMMA": r"\bIGMMA\b",  # int8 wgmma
    "UTCMMA": r"\bUTC[A-Z]*MMA\b",  # Blackwell tcgen05.mma: UTCHMMA, UTCQMMA, UTCIMMA, UTCOMMA
    "HMMA": r"\bHMMA\b",  # not HFMA2.MMA (a plain fp16x2 FMA on the MMA pipe)
    "IMMA": r"\bIMMA\b",
    "UTMA": r"\bUTMA(?:LDG|STG|REDG)\b",
    "FFMA": r"\bFFMA\b",
    "LDL/STL": r"\b(?:LDL|STL)\b",
}
DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
               "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}


# ----------------------------------------------------------------------------------------- pure parsing
_LINE_COMMENT = re.compile(r"//[^\n]*")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/")  # within a line, as the disassemblers write them
_WORD = re.compile(r"\w+")


def _code(text: str) -> str:
    # instructions only, without comments (PTX //, SASS /* */ encodings)
    return _BLOCK_COMMENT.sub("", _LINE_COMMENT.sub("", text))


def count_ptx(ptx: str) -> dict[str, int]:
    """Instruction counts in PTX text (keys of PTX_PATTERNS)."""
    body = _code(ptx)
    return {name: len(re.findall(pat, body)) for name, pat in PTX_PATTERNS.items()}


def count_sass(sass: str) -> dict[str, int]:
    """Instruction counts in `cuobjdump -sass` / nvdisasm text (keys of SASS_PATTERNS).

    Every SASS pattern is a whole word (\\b...\\b around word characters), so a match is a whole word of the text:
    the words are counted once and each distinct one (a few hundred) matched against the patterns, 7x faster than
    a search of the text per pattern (0.06 against 0.39 s for an attention kernel's 600 KB of SASS)."""
    words = collections.Counter(_WORD.findall(_code(sass)))
    return {name: sum(n for word, n in words.items() if re.fullmatch(pat, word)) for name, pat in SASS_PATTERNS.items()}


def ptx_target(ptx: str) -> str | None:
    """The `.target` of a PTX module, e.g. 'sm_90a'."""
    m = re.search(r"^\s*\.target\s+(\S+)", ptx, re.M)
    return m.group(1).rstrip(",") if m else None


def parse_res_usage(text: str) -> dict[str, dict[str, int]]:
    """`cuobjdump -res-usage` output -> {function: {"REG": n, "STACK": n, "SHARED": n, "LOCAL": n, ...}}."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s+([^:\s]+)\s*:", line)
        if m:
            current = m.group(1)
            continue
        if current and "REG:" in line:
            out[current] = {k: int(v) for k, v in re.findall(r"([A-Z_]+(?:\[\d+\])?):(\d+)", line)}
            current = None
    return out


def parse_ptxas_spills(text: str) -> tuple[int, int] | None:
    """`ptxas -v` output -> (bytes of spill stores, bytes of spill loads), summed over its functions; None when
    the output has no such line."""
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if not found:
        return None
    return sum(int(st) for st, _ in found), sum(int(ld) for _, ld in found)


# ptxas's advisories that cost a wgmma kernel its overlap, by code: what the verdict calls them
PTXAS_ADVISORIES = {"C7514": "ptxas serialized the wgmma", "C7515": "ptxas serialized the wgmma",
                    "C7517": "ptxas injected a warpgroup.wait"}


def parse_ptxas_advisories(text: str) -> list[str]:
    """`ptxas -v` output -> its coded advisories ("ptxas info : (C7514) Potential Performance Loss: ...") as
    "C7514: <the message>", in order, each once."""
    found = []
    for code, message in re.findall(r"\((C\d{4})\)\s*(.*)", text):
        line = f"{code}: {' '.join(message.split())}"
        if line not in found:
            found.append(line)
    return found


def uses_dot(ir: str) -> bool:
    """True when the kernel's Triton IR (TTIR, or TTGIR: Gluon kernels have no TTIR) holds a dot (it is
    matmul-like: tensor cores expected): tt.dot / tt.dot_scaled, or Gluon's ttng.warp_group_dot (Hopper) /
    ttng.tc_gen5_mma (Blackwell) -- not ttng.warp_group_dot_wait."""
    return bool(re.search(r"\b(?:tt\.dot(?:_scaled)?|ttng\.warp_group_dot|ttng\.tc_gen5_mma(?:_scaled)?)\b(?!_)", ir))


@dataclass
class KernelReport:
    label: str
    name: str
    target: str | None
    matmul_like: bool
    ptx: dict[str, int]
    sass: dict[str, int] | None
    registers: int | None
    spill_bytes: int | None  # stack frame + local memory when ptxas spilled registers there, else 0
    shared_bytes: int | None
    num_warps: int | None
    num_stages: int | None
    level: str = ""
    verdict: str = ""
    notes: list[str] = field(default_factory=list)
    stack_bytes: int | None = None  # stack frame + local memory, spills or not (local arrays live there too)
    ptxas_advisories: list[str] = field(default_factory=list)  # parse_ptxas_advisories of `ptxas -v` (wgmma kernels)


def _tensor_core_kinds(report: KernelReport) -> dict[str, int]:
    """Tensor-core instruction counts by kind ("wgmma", "tcgen05", "mma.sync"), read from the SASS when there is
    SASS (what runs: ptxas may drop a PTX mma whose result is unused), else from the PTX."""
    if report.sass is not None:
        s = report.sass
        return {"wgmma": s.get("HGMMA", 0) + s.get("QGMMA", 0) + s.get("IGMMA", 0), "tcgen05": s.get("UTCMMA", 0),
                "mma.sync": s.get("HMMA", 0) + s.get("IMMA", 0)}
    p = report.ptx
    return {"wgmma": p.get("wgmma", 0), "tcgen05": p.get("tcgen05.mma", 0),
            "mma.sync": p.get("mma.sync", 0) + p.get("wmma", 0)}


def tensor_core_count(report: KernelReport) -> int:
    """Tensor-core instructions in the kernel (SASS when available, else PTX; see _tensor_core_kinds)."""
    return sum(_tensor_core_kinds(report).values())


def verdict(report: KernelReport) -> tuple[str, str]:
    """(level, one line): level "error" (matmul-like without tensor cores), "warn", or "ok"."""
    # Hopper and the datacenter Blackwells (sm_100 / sm_103) have a faster path than mma.sync
    fast_path = re.match(r"sm_(?:9\d|10\d)", report.target or "")
    spill = f"; {report.spill_bytes} bytes spilled to local memory" if report.spill_bytes else ""
    kinds = _tensor_core_kinds(report)
    if report.matmul_like and sum(kinds.values()) == 0:
        return "error", "No tensor-core instructions were emitted" + spill
    tma = ", TMA loads" if report.ptx["tma"] else ""
    if kinds["tcgen05"]:
        return ("warn" if spill else "ok"), f"tcgen05 tensor cores (Blackwell path){tma}{spill}"
    if kinds["wgmma"]:
        advised = [PTXAS_ADVISORIES[a[:5]] + f" ({a[:5]})" for a in report.ptxas_advisories if a[:5] in PTXAS_ADVISORIES]
        advice = "".join(f"; {a}" for a in dict.fromkeys(advised))
        return ("warn" if spill or advice else "ok"), f"wgmma tensor cores (Hopper path){tma}{advice}{spill}"
    if kinds["mma.sync"]:
        if fast_path:
            faster = "wgmma (HGMMA)" if (report.target or "").startswith("sm_9") else "tcgen05 (UTCHMMA)"
            return "warn", f"mma.sync tensor cores only: on {report.target} {faster} is the fast path" + spill
        return ("warn" if spill else "ok"), "mma.sync tensor cores" + spill
    return ("warn" if spill else "ok"), "no matmul in this kernel: tensor cores not expected" + spill


# ----------------------------------------------------------------------------------------- compiled kernels
def _tool(name: str) -> str | None:
    try:
        import triton

        path = getattr(getattr(triton.knobs.nvidia, name), "path", None)
        if path:
            return path
    except Exception:  # older triton without knobs: fall back to PATH
        pass
    return shutil.which(name)


def _run_cuobjdump(cubin: bytes, flag: str) -> tuple[str | None, str]:
    """(cuobjdump's output or None, why there is none)."""
    tool = _tool("cuobjdump")
    if not tool:
        return None, "no cuobjdump"
    if not cubin:
        return None, "no cubin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, flag, f.name], capture_output=True, text=True, timeout=120)
    if res.returncode == 0:
        return res.stdout, ""
    # e.g. a cuobjdump older than the arch: "nvdisasm fatal : Cannot decode architecture 'SM103a'"
    why = " ".join((res.stderr or res.stdout).split())[:200] or f"exit {res.returncode}"
    return None, f"cuobjdump could not read the cubin: {why}"


def _cuobjdump(cubin: bytes, flag: str) -> str | None:
    return _run_cuobjdump(cubin, flag)[0]


def _ptxas_for(cc: int) -> str | None:
    # the ptxas Triton builds with for this arch (triton/backends/nvidia/compiler.py: get_ptxas)
    return _tool("ptxas_blackwell" if cc >= 100 else "ptxas")


def ptxas_advisories(kernel) -> list[str] | None:
    """parse_ptxas_advisories of `ptxas -v` on a compiled kernel's PTX (as Triton assembled it); None when ptxas
    cannot be run for its target."""
    text = _ptxas_verbose(kernel.asm.get("ptx", ""), kernel.metadata)
    return None if text is None else parse_ptxas_advisories(text)


def _ptxas_verbose(ptx: str, metadata) -> str | None:
    """Re-assemble the kernel's PTX with `ptxas -v`, as Triton did (whose log it throws away): its output (spills,
    advisories); None when it cannot be run or fails."""
    target = ptx_target(ptx)
    m = re.fullmatch(r"sm_(\d+)a?", target or "")
    tool = _ptxas_for(int(m.group(1))) if m else None
    if not tool:
        return None
    fmad = [] if getattr(metadata, "enable_fp_fusion", True) else ["--fmad=false"]
    extra = (getattr(metadata, "ptx_options", None) or "").split()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        try:
            res = subprocess.run([tool, "-v", *fmad, *extra, f"--gpu-name={target}", str(src), "-o", str(src) + ".o"],
                                 capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return res.stderr + res.stdout if res.returncode == 0 else None


def report_compiled(label: str, kernel, *, sass: bool = True) -> KernelReport:
    """Build a KernelReport from a triton CompiledKernel (asm dict + metadata).

    sass=False leaves the SASS unread (report.sass None, PTX counts only), for callers that want the resources
    (registers, spills, shared memory) and PTX counts: disassembling a cubin is most of a report's cost (about
    0.7 s for an attention kernel on a 2-core box, against a few milliseconds for the resource usage)."""
    asm = kernel.asm
    ptx = asm.get("ptx", "")
    cubin = asm.get("cubin", b"")
    sass_text, sass_why = _run_cuobjdump(cubin, "-sass") if sass else (None, "not read: sass=False")
    usage = parse_res_usage(_cuobjdump(cubin, "-res-usage") or "")
    name = kernel.metadata.name
    res = usage.get(name) or (next(iter(usage.values())) if usage else {})
    # n_regs / n_spills exist once the kernel was loaded on a GPU; offline builds use cuobjdump's figures.
    # Triton's n_spills is CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4 (32-bit words, triton/backends/nvidia/
    # driver.c): cuobjdump's bytes are taken when there, else n_spills x 4, so both modes report bytes.
    registers = vars(kernel).get("n_regs") or res.get("REG")
    if res:
        stack = res.get("STACK", 0) + res.get("LOCAL", 0)
    else:
        words = vars(kernel).get("n_spills")
        stack = None if words is None else 4 * words
    spills, spill_note = stack, None
    ptx_counts = count_ptx(ptx)
    advise = sass and ptx_counts["wgmma"] > 0  # full reports of wgmma kernels read ptxas's advisories
    # ptxas -v once, for the spills behind a stack frame and the advisories
    verbose = _ptxas_verbose(ptx, kernel.metadata) if stack or advise else None
    if stack and verbose is not None:
        # the frame also holds local arrays (the sm_120 TMA matmul: an 8-byte frame, 0 bytes spill stores)
        if parse_ptxas_spills(verbose) == (0, 0):
            spills, spill_note = 0, f"{stack} bytes of stack frame / local memory, no register spills (ptxas -v)"
    rep = KernelReport(
        label=label, name=name, target=ptx_target(ptx),
        matmul_like=uses_dot(asm.get("ttir", "") + "\n" + asm.get("ttgir", "")),  # Gluon: TTGIR only
        ptx=ptx_counts, sass=count_sass(sass_text) if sass_text else None, registers=registers,
        spill_bytes=spills, shared_bytes=getattr(kernel.metadata, "shared", None),
        num_warps=getattr(kernel.metadata, "num_warps", None), num_stages=getattr(kernel.metadata, "num_stages", None),
        stack_bytes=stack,
        ptxas_advisories=parse_ptxas_advisories(verbose) if advise and verbose is not None else [],
    )
    if spill_note:
        rep.notes.append(spill_note)
    rep.notes.extend(f"ptxas {a}" for a in rep.ptxas_advisories)
    if sass_text is None:
        rep.notes.append(f"SASS unavailable ({sass_why}); PTX counts only")
    else:
        in_ptx = sum(rep.ptx[k] for k in ("wgmma", "tcgen05.mma", "mma.sync", "wmma"))
        in_sass = tensor_core_count(rep)
        if bool(in_ptx) != bool(in_sass):
            rep.notes.append(f"PTX has {in_ptx} tensor-core instructions, SASS {in_sass}: the SASS (what runs) decides")
    rep.level, rep.verdict = verdict(rep)
    return rep


# ----------------------------------------------------------------------------------------- op table
def _parse_shape(shape: str | None) -> tuple[int, ...] | None:
    if shape is None:
        return None
    try:
        dims = tuple(int(s) for s in shape.lower().replace(",", "x").split("x") if s.strip())
    except ValueError:
        raise ValueError(f"--shape must look like 4096x4096x4096, got {shape!r}") from None
    if not dims or min(dims) < 1:
        raise ValueError(f"--shape must be positive integers joined by 'x', got {shape!r}")
    return dims


def _generic_runner(op: str, shape, dtype, device="cuda"):
    """Inputs for ops without inspect_kernels: run the public op (and its backward) once (device: tests)."""
    import torch

    import hearth.kernels as K

    dev = torch.device(device)

    def r(*s):
        return torch.randn(*s, device=dev, dtype=dtype, requires_grad=True)

    dims = shape or ()
    if op in ("softmax", "rms_norm", "layer_norm", "swiglu", "cross_entropy"):
        n, d = (tuple(dims) + (4096, 4096))[:2]
        x = r(n, d) * 1.0  # non-leaf: cross_entropy writes its gradient over its input
        calls = {
            "softmax": lambda: K.softmax(x),
            "rms_norm": lambda: K.rms_norm(x, r(d)),
            "layer_norm": lambda: K.layer_norm(x, r(d), r(d)),
            "swiglu": lambda: K.swiglu(x, r(n, d)),
            "cross_entropy": lambda: K.cross_entropy(x, torch.randint(0, d, (n,), device=dev)),
        }
        return lambda: calls[op]().float().sum().backward()
    if op in ("attention", "rope"):
        b, h, t, d = (tuple(dims) + (1, 8, 1024, 128))[:4]
        if op == "attention":
            return lambda: K.attention(r(b, h, t, d), r(b, h, t, d), r(b, h, t, d), causal=True).float().sum().backward()
        cos, sin = torch.randn(1, t, d, device=dev, dtype=dtype), torch.randn(1, t, d, device=dev, dtype=dtype)
        return lambda: sum(o.float().sum() for o in K.rope(r(b, h, t, d), r(b, h, t, d), cos, sin)).backward()
    if op == "attention_varlen":
        # --shape S x H x T x D: S packed sequences of T tokens each, H heads (no GQA), causal
        s, h, t, d = (tuple(dims) + (4, 8, 1024, 128))[:4]

        def run():
            cu = torch.arange(0, (s + 1) * t, t, device=dev, dtype=torch.int32)
            q, k, v = (r(s * t, h, d) for _ in range(3))
            return K.attention_varlen(q, k, v, cu, cu.clone(), t, t, causal=True).float().sum().backward()

        return run
    raise ValueError(f"unknown op {op!r}; known: {', '.join(K.__all__)}")


def collect(op: str, shape, dtype) -> list[KernelReport]:
    """Compile (by running) the op's kernels on this GPU and report each."""
    import importlib

    import hearth.kernels as K

    if op not in K.__all__:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(K.__all__)}")
    module = importlib.import_module(f"hearth.kernels.{op}")
    if hasattr(module, "inspect_kernels"):
        kernels = module.inspect_kernels(shape, dtype)
    else:
        from hearth.kernels._common import capture_launched_kernels

        kernels = capture_launched_kernels(_generic_runner(op, shape, dtype), label=op)
    return [report_compiled(label, k) for label, k in kernels]


# ----------------------------------------------------------------------------------------- output
def render(reports: list[KernelReport], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    # Blackwell's tcgen05 columns only when some kernel has them (the Hopper table stays as it was)
    tc05 = any(r.ptx.get("tcgen05.mma") or (r.sass or {}).get("UTCMMA") for r in reports)
    table = Table(title="hearth inspect (PTX: wgmma, mma.sync, TMA; SASS: HGMMA, HMMA, FFMA)", show_lines=False)
    table.add_column("kernel", min_width=16, overflow="fold")
    cols = ("target", "wgmma", *(("tcgen05",) if tc05 else ()), "mma", "HGMMA", *(("UTCMMA",) if tc05 else ()), "HMMA",
            "TMA", "FFMA", "regs", "spill B", "smem KiB", "w/s")
    for col in cols:
        table.add_column(col, no_wrap=True)
    table.add_column("verdict", min_width=24, overflow="fold")
    style = {"ok": "green", "warn": "yellow", "error": "bold red"}
    for r in reports:
        s = r.sass or {}
        na = "-" if r.sass is None else None
        table.add_row(
            escape(r.label), r.target or "?", str(r.ptx["wgmma"]), *((str(r.ptx.get("tcgen05.mma", 0)),) if tc05 else ()),
            str(r.ptx["mma.sync"]), na or str(s["HGMMA"]), *((na or str(s.get("UTCMMA", 0)),) if tc05 else ()),
            na or str(s["HMMA"]), str(r.ptx["tma"]), na or str(s["FFMA"]), str(r.registers), str(r.spill_bytes),
            "?" if r.shared_bytes is None else f"{r.shared_bytes / 1024:.1f}", f"{r.num_warps}/{r.num_stages}",
            f"[{style[r.level]}]{r.verdict}[/]",
        )
    if console.is_terminal:
        console.print(table)
    else:
        # a pipe, a file, CI: rich's default 80 columns squeezed the kernel and verdict columns to nothing
        # (benchmarks/h200/inspect/*.txt); print the table at the width it needs instead
        from rich.measure import Measurement

        width = console.width
        console.width = max(width, Measurement.get(console, console.options.update_width(10_000), table).maximum)
        try:  # (print(width=...) is capped at the console's width)
            console.print(table, crop=False)
        finally:
            console.width = width
    for r in reports:
        if r.level == "error":
            console.print(f"[bold red]{escape(r.label)}: NO TENSOR-CORE INSTRUCTIONS WERE EMITTED for a matmul-like kernel "
                          f"(tl.dot compiled to plain FMAs: expect ~1/20 of the tensor-core throughput).[/]")
        for note in r.notes:
            console.print(f"[dim]{escape(r.label)}: {escape(note)}[/]")


def _parse_arch(arch: str) -> int:
    m = re.fullmatch(r"(?:sm_?)?(\d{2,3})a?", arch.strip().lower())
    if not m:
        raise ValueError(f"--arch must look like sm_90 or 90, got {arch!r}")
    return int(m.group(1))


def _ptxas_archs(tool: str) -> set[int]:
    try:
        text = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {int(v) for v in re.findall(r"'sm_(\d+)[a-z]?'", text)}


def _check_arch(cc: int) -> None:
    """Refuse an arch the installed Triton cannot build for before compiling: sm_91 aborted the process inside LLVM
    (exit 134, no Python error), sm_999 ended in a PassManager traceback. Triton hands sm_NN(a) to its ptxas, so
    the archs that ptxas lists are the ones it can build."""
    below, above = _tool("ptxas"), _tool("ptxas_blackwell")
    archs = _ptxas_archs(above if cc >= 100 else below) if (above if cc >= 100 else below) else set()
    if archs and cc not in archs:  # no ptxas, or no list read from it: Triton has the last word
        known = ({k for k in _ptxas_archs(below) if k < 100} if below else set()) | \
                ({k for k in _ptxas_archs(above) if k >= 100} if above else set())
        raise ValueError(f"--arch sm_{cc}: the installed Triton cannot build for it (its ptxas knows "
                         f"{', '.join(f'sm_{k}' for k in sorted(known))})")


def _check_op(op: str) -> None:
    import hearth.kernels as K

    if op not in K.__all__:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(K.__all__)}")


def _check_json_out(path: Path) -> None:
    if path.is_dir():
        raise ValueError(f"--json {path} is a folder; give a file path")
    if not path.parent.is_dir():
        raise ValueError(f"--json {path}: folder {path.parent} does not exist")


def _write_json(path: Path, reports: list[KernelReport]) -> None:
    # whole or not at all, also after a host crash (hearth.durable: the data flushed before the rename, the folder
    # after it; a rename alone could leave the new name on the disk without its data): a script comparing runs never
    # reads half a report
    from hearth.durable import write_file

    text = json.dumps([asdict(r) for r in reports], indent=2)
    write_file(path, lambda tmp: tmp.write_text(text), tmp=path.with_name(f".{path.name}.{os.getpid()}.tmp"))


def collect_offline(op: str, arch: int, dtype) -> list[KernelReport]:
    """Compile the op's kernels for `arch` without a GPU (ops exposing offline_kernels)."""
    import importlib

    import hearth.kernels as K

    if op not in K.__all__:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(K.__all__)}")
    module = importlib.import_module(f"hearth.kernels.{op}")
    if not hasattr(module, "offline_kernels"):
        raise ValueError(f"{op} has no offline build (offline_kernels); run without --arch on a CUDA machine")
    return [report_compiled(label, k) for label, k in module.offline_kernels(arch, dtype)]


def main(op: str, shape: str | None = None, dtype: str = "bfloat16", json_out: Path | None = None,
         arch: str | None = None) -> int:
    """Entry point of `hearth inspect`. Returns the process exit code (see module docstring).
    arch (e.g. "sm_90"): compile offline for that GPU, no CUDA needed (ops with offline_kernels)."""
    from rich.console import Console

    console = Console()
    try:
        dims = _parse_shape(shape)
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"--dtype must be one of {sorted(set(DTYPE_NAMES.values()))}, got {dtype!r}")
        cc = _parse_arch(arch) if arch is not None else None
        if cc is not None:
            _check_arch(cc)
        if json_out is not None:
            _check_json_out(json_out)
        _check_op(op)
    except ValueError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        return 2
    import torch

    from hearth.kernels._common import interpret_mode

    if interpret_mode():
        console.print("[bold red]error:[/] TRITON_INTERPRET=1 is set: the interpreter compiles nothing; unset it to inspect.")
        return 2
    if cc is None and not torch.cuda.is_available():
        console.print("[bold red]error:[/] hearth inspect compiles kernels for the GPU at hand, but no CUDA GPU is visible "
                      "(use --arch sm_90 to compile offline for a given GPU).")
        return 2
    if cc is not None and dims is not None:
        console.print(f"[yellow]note: --shape {shape} is ignored with --arch: the offline build compiles the op's "
                      "fixed configs, for no particular shape.[/]")
    where = f"offline sm_{cc}" if cc is not None else f"shape {dims}"
    try:
        if cc is not None:
            reports = collect_offline(op, cc, getattr(torch, DTYPE_NAMES[dtype]))
        else:
            reports = collect(op, dims, getattr(torch, DTYPE_NAMES[dtype]))
    except (ValueError, TypeError) as exc:  # unknown op, or the op refused the shape/dtype/arch
        console.print(f"[bold red]error:[/] {op} at {where} / {dtype}: {exc}")
        return 2
    except Exception as exc:  # the compile itself failed (ptxas, an MLIR pass): not exit 1, "no tensor cores"
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        console.print(f"[bold red]error:[/] {op} at {where} / {dtype}: the build failed: {type(exc).__name__}: {first}")
        return 3
    if not reports:
        console.print(f"[yellow]{op}: no Triton kernel was launched at this shape/dtype: nothing was inspected "
                      "(exit 2).[/]")
    else:
        render(reports, console)
    if json_out is not None:  # an empty list too: the file never holds an earlier run's kernels
        _write_json(json_out, reports)
        console.print(f"wrote {json_out}")
    if not reports:  # "nothing to compile for" (the help's exit 2): a gate reading exit 0 as "inspected, fine" must not pass
        return 2
    return 1 if any(r.level == "error" for r in reports) else 0
