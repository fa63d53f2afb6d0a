#!/usr/bin/env bash
# The most informative LoRA-step rows in ONE device call (about 9.5 minutes on an H200):
#   1. seq 4096, budget 80 GiB (speed mode): hf, liger, hearth, each at the fastest checkpointing setting
#      the planner fits in the budget (an OOM is recorded and the next lighter setting tried)
#   2. seq 4096, budget 31.5 GiB (lean mode): the same
#   3. seq 16384, budgets 80 and 31.5 GiB: the same, while time is left
#   4. the same-training check: 20 AdamW steps at 4 layers, seq 1024 (hf, hearth; fp32-base reference)
# Each child (one setup, one setting) is its own process; a 40-layer child costs ~40-60 s (build ~10 s,
# 1 warm-up + 3 steps). BUDGET_S (default 540) is the wall clock for the whole script: no child starts when
# less than MIN_CHILD_S (default 50) is left. Rows go to $OUT/lora_e2e.jsonl (and the match row to
# $OUT/lora_match.jsonl); the wheels carried under .whl/ (liger, and unsloth_wheels.sh's) are installed first.
#   OUT=/tmp/out BUDGET_S=540 bash scripts/gpu/lora_matrix.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}; BUDGET_S=${BUDGET_S:-540}; MIN_CHILD_S=${MIN_CHILD_S:-50}; SETUPS=${SETUPS:-hf,liger,hearth}
# UNSLOTH=1 adds Unsloth to every budget (needs the wheels of scripts/gpu/unsloth_wheels.sh under .whl/; its child
# builds ~80 s longer: save + FastLanguageModel.from_pretrained), so 16384 then needs a call of its own: SEQS=16384
[ -n "${UNSLOTH:-}" ] && SETUPS="$SETUPS,unsloth"
mkdir -p "$OUT"
start=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1 && [ -z "${SKIP_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# the rows' commit where the tree travelled without .git (the device machine): COMMIT=$(git rev-parse HEAD) here
export HEARTH_COMMIT=${HEARTH_COMMIT:-${COMMIT:-}}
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
run() {  # run SEQ BUDGET_GIB
  local l; l=$(left)
  if [ "$l" -lt "$MIN_CHILD_S" ]; then echo "skip seq $1 budget $2: ${l}s left"; return; fi
  python3 scripts/gpu/lora_e2e.py --out "$OUT/lora_e2e.jsonl" --seqs "$1" --setups "$SETUPS" --budget-gib "$2" \
    --steps "${STEPS:-3}" --time-budget-s "$l" --min-child-s "$MIN_CHILD_S" --child-timeout-s 200
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
SEQS=${SEQS:-4096,16384}
case ",$SEQS," in *,4096,*) run 4096 80; run 4096 31.5;; esac
if [ "${MATCH-1}" != "" ] && [ "${MATCH-1}" != 0 ] && [ "$(left)" -gt 150 ]; then
  # the .pt files (LoRA weights, ~25 MB each at 4 layers) stay in MATCH_DIR; the row is copied to $OUT
  MATCH_DIR=${MATCH_DIR:-/tmp/lora_match}; mkdir -p "$MATCH_DIR"
  python3 scripts/gpu/lora_e2e.py --match-steps 20 --out "$MATCH_DIR/lora_match.jsonl" --setups "${MATCH_SETUPS:-hf,hearth}" \
    --time-budget-s "$(( $(left) - 60 ))" --min-child-s 20 --child-timeout-s 120
  cat "$MATCH_DIR/lora_match.jsonl" >> "$OUT/lora_match.jsonl"
fi
case ",$SEQS," in *,16384,*) run 16384 80; run 16384 31.5;; esac
echo "done in $(( $(date +%s) - start )) s"
