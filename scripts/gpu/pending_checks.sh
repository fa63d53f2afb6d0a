#!/usr/bin/env bash
# After scripts/gpu/test.sh has passed on this branch: the measurements its kernel-side changes were made for,
# in ONE device call (about 9 minutes on an H200; run from the repo root, carrying .whl with Liger and
# the pydantic/typer wheels):
#   1. scripts/gpu/lora_layer_probe.py: one Qwen3-14B-shaped MLP and q_proj / o_proj, peft vs the LoRA-aware
#      nodes (adapter and base compute), fwd+bwd time and memory                      -> $OUT/lora_layer_probe.jsonl
#   2. scripts/host_overhead.py --device cuda: per-op host cost after the eager autograd.Function route
#                                                                                      -> $OUT/host.jsonl
#   3. the model-shape suite for rms_norm (incl. the 128-wide q/k-norm rows), rope and swiglu: GPU time and
#      wall time per call against Liger / torch.compile                               -> $OUT/models/
#   4. scripts/gpu/dist_e2e.py --gpus 1 --layers 4: torchrun + NCCL + DDP and FSDP2 on one GPU (the code path,
#      not a scaling figure)                                                           -> $OUT/dist_e2e.jsonl
#   5. scripts/gpu/attention_gluon_probe.py when the Gluon forward is on this branch   -> $OUT/attention_gluon.jsonl
# Each step is bounded; BUDGET_S (default 540) stops starting steps when time runs out.
#   OUT=/tmp/out bash scripts/gpu/pending_checks.sh
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
BUDGET_S=${BUDGET_S:-540}
start=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
export PYTHONPATH=src PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=src:/tmp/site
fi
mkdir -p "$OUT"
step() {  # step NAME MIN_SECONDS COMMAND...
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "== $name: skipped, $(left) s left" | tee -a "$OUT/steps.log"; return; fi
  echo "== $name ($(left) s left)" | tee -a "$OUT/steps.log"
  timeout "$(( $(left) - 5 ))" "$@" >> "$OUT/$name.log" 2>&1
  echo "   rc=$?" | tee -a "$OUT/steps.log"
}
step lora_layer_probe 60 python3 scripts/gpu/lora_layer_probe.py --out "$OUT/lora_layer_probe.jsonl"
step host_overhead 60 python3 scripts/host_overhead.py --device cuda --reps 200 --jsonl "$OUT/host.jsonl"
step models 150 env OUT="$OUT" BUDGET_S=150 bash scripts/gpu/bench_models.sh rms_norm rope swiglu
step dist_e2e 90 python3 scripts/gpu/dist_e2e.py --out "$OUT/dist_e2e.jsonl" --gpus 1 --layers 4 --seq 2048 \
  --steps 3 --cases 14b-single,14b-ddp,14b-fsdp
if [ -f scripts/gpu/attention_gluon_probe.py ]; then
  step attention_gluon 60 env HEARTH_ATTN_GLUON=1 python3 scripts/gpu/attention_gluon_probe.py --out "$OUT/attention_gluon.jsonl"
fi
tail -n 40 "$OUT"/*.log
