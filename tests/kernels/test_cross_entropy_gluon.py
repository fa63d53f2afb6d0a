"""hearth.kernels.cross_entropy_gluon, the cluster cross-entropy for wide rows (branch; not routed): built
offline for sm_90 on the CPU, its losses and gradients checked on a Hopper GPU against fp64."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.offline import run_offline
from tests.kernels.tolerance import HAS_CUDA, assert_close

cg = importlib.import_module("hearth.kernels.cross_entropy_gluon")

_BUILD_SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from hearth import inspect as hi
from hearth.kernels import cross_entropy_gluon as cg, softmax_gluon as sg

n, dt = int(sys.argv[1]), sys.argv[2]
ctas, p, warps = sg.config(n)
const = sg.constexprs(ctas, p, warps, False)
fn = cg._ce_rows_cluster_kernel
sig = {"Logits": f"*{dt}", "Target": "*i64", "Loss": "*fp32", "stride": "i32", "n_cols": "i32",
       "ignore_index": "i32", "grad_scale": "fp32", "never": "i32", **{k: "constexpr" for k in const}}
aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
           if name in ("Logits", "Target", "Loss", "stride", "n_cols")}
k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=const, attrs=aligned),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_ctas": ctas})
ptx = k.asm["ptx"]
own = "\n".join(line for line in ptx.splitlines() if "cluster" not in line and "global_smem;" not in line)
rep = hi.report_compiled("cross_entropy_gluon", k)
print(json.dumps(dict(ctas=ctas, spills=rep.spill_bytes, mapa=ptx.count("mapa.shared::cluster"),
                      scratch=sorted({int(o) for o in re.findall(r"\[global_smem\+(\d+)\]", own)}),
                      bare=own.count("[global_smem]"))))
"""


@pytest.mark.parametrize("n, dtype", [(131072, "bf16"), (151936, "fp32")])
def test_sm90_build_exchanges_through_slots_ahead_of_the_compilers_scratch(n, dtype):
    """Builds for sm_90 without spills; one remote store per CTA; the compiler's scratch past the slots."""
    r = run_offline(_BUILD_SCRIPT, (str(n), dtype))[0]
    assert r["spills"] == 0 and r["mapa"] == r["ctas"], r
    assert r["scratch"] and min(r["scratch"]) >= 4 * cg.sg.SLOT_FLOATS and r["bare"] == 0, r


def test_bad_input_names_the_argument():
    logits = torch.zeros(2, 65536)
    with pytest.raises(ValueError, match="logits: the cluster cross-entropy serves Hopper"):
        cg.ce_rows_(logits, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="target must be int64 of shape"):
        cg.ce_rows_(logits, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="logits must be 2-D"):
        cg.ce_rows_(torch.zeros(2, 2, 65536), torch.zeros(2, dtype=torch.int64))


HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
hopper_only = pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.x (Hopper)")


@hopper_only
@pytest.mark.parametrize("rows, v, dtype", [(6, 131072, torch.bfloat16), (5, 151936, torch.bfloat16),
                                           (4, 65536 + 5, torch.float16), (3, 40000, torch.float32)])
def test_gpu_loss_and_gradient_match_reference(rows, v, dtype):
    """Losses and the in-place gradient (scaled 1 / rows) against F.cross_entropy in fp64 of the same values,
    within 2x PyTorch's own error in `dtype`; one ignored row (loss and gradient 0), one target in the last
    column, one in the first."""
    g = torch.Generator(device="cpu").manual_seed(v)
    x = (torch.randn(rows, v, generator=g) * 3).to(dtype).cuda()
    t = torch.randint(0, v, (rows,), generator=g).cuda()
    t[0], t[1], t[2] = -100, v - 1, 0
    ref_x = x.double().requires_grad_()
    ref = F.cross_entropy(ref_x, t, reduction="none")
    (ref.sum() / rows).backward()
    base_x = x.clone().requires_grad_()
    base = F.cross_entropy(base_x, t, reduction="none")
    (base.sum() / rows).backward()
    work = x.clone()
    loss = cg.ce_rows_(work, t, grad_scale=1.0 / rows)
    assert loss[0].item() == 0.0 and torch.count_nonzero(work[0]).item() == 0
    assert_close(loss, ref.detach(), dtype, msg="loss", baseline=base.detach().float())
    assert_close(work, ref_x.grad, dtype, msg="grad", baseline=base_x.grad)
