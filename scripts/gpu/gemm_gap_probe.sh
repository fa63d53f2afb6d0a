#!/usr/bin/env bash
# Where the fused GEMM ops lose to torch.compile (issue 17: swiglu_mlp 0.92-0.96x, linear_cross_entropy 0.88-0.99x
# in the model-shape suite), in one device call: per-kernel and per-GEMM-shape GPU time of hearth's op and of the
# bench's torch.compile row, back to back as a training loop runs them (scripts/gpu/host_trace_probe.py --shapes),
# at the model-suite shapes:
#   swiglu_mlp            N,H,I = 12289,2560,9728 (Qwen3-4B), 16384,1024,3072 (Qwen3-0.6B), 4096,5120,17408 (Qwen3-14B):
#                         hearth, compile, and hearth with one chunk (MLP_CHUNK_ELEMS past any size: h and dh whole)
#   linear_cross_entropy  N,H,V = 4096,4096,128256 (Llama-3.1-8B), 16384,1024,151936 (Qwen3-0.6B): hearth, compile
# then, while the budget lasts, scripts/gpu/mlp_chunk_probe.py at the three MLP cases: the budget rule alone (floor),
# the shipped rule (with its wave floor on the backward's weight-gradient columns) and waves4 (chunks that fill 4
# waves of tiles in each chunk's projection GEMM, both directions).
#
#   run (device tool), from the repo root:  OUT=$OUT bash scripts/gpu/gemm_gap_probe.sh
#
# Files back (one): $OUT/gemm_gap.tgz with host_trace_*.txt (hearth's, compile's, one/ for one chunk), each trace's
# stdout+stderr as log_*.txt, mlp_chunks.jsonl and its log. Env: OUT (required); BUDGET_S (default 540: the chunk
# probe starts only with 150 s left); ITERS (default 10 for the MLP, half that for the LCE).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
BUDGET_S=${BUDGET_S:-540}
ITERS=${ITERS:-10}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
mkdir -p "$work/one" "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$work/gpu.txt" 2>&1 || true
start=$SECONDS
trace() {  # op shape provider iters [out dir [extra arguments]]
  local dir=${5:-$work}
  timeout 170 python3 scripts/gpu/host_trace_probe.py --op "$1" --shape "$2" --provider "$3" --iters "$4" --shapes \
    --out "$dir" "${@:6}" > "$dir/log_$1_$3_$2.txt" 2>&1 || echo "FAILED: $1 $2 $3 ${*:6} (rc $?)" | tee -a "$work/failed.txt"
}
for shape in 12289,2560,9728 16384,1024,3072 4096,5120,17408; do
  for p in hearth compile; do trace swiglu_mlp "$shape" "$p" "$ITERS"; done
  # hearth's MLP in one chunk (MLP_CHUNK_ELEMS past any size): what the chunking itself costs
  trace swiglu_mlp "$shape" hearth "$ITERS" "$work/one" --mlp-chunk-elems $((1 << 40))
done
for shape in 4096,4096,128256 16384,1024,151936; do
  for p in hearth compile; do trace linear_cross_entropy "$shape" "$p" $(( (ITERS + 1) / 2 )); done
done
left=$(( BUDGET_S - (SECONDS - start) ))
if [ "$left" -ge 150 ]; then
  timeout $(( left - 30 )) python3 scripts/gpu/mlp_chunk_probe.py --out "$work" --chunks 16 --rules floor,shipped,waves4 \
    --cases 1,2,3 --reps 10 > "$work/mlp_chunks.log" 2>&1 || echo "mlp_chunk_probe stopped (rc $?)" >> "$work/mlp_chunks.log"
else
  echo "no time left for mlp_chunk_probe ($left s)" > "$work/mlp_chunks.log"
fi
# the summary: each trace's first line and its device total, longest GEMM shapes first
for f in "$work"/host_trace_* "$work"/one/host_trace_*; do
  [ -f "$f" ] || continue
  echo "== ${f#"$work"/}"
  head -n 1 "$f"
  grep -E "all [0-9]+ kinds" "$f"
  grep -A6 "by op and input shapes" "$f" | tail -n 6
done | tee "$work/summary.txt"
cat "$work/mlp_chunks.log" 2>/dev/null | tail -n 20
tar czf "$OUT/gemm_gap.tgz" -C "$work" .
echo "gemm_gap_probe: $(( SECONDS - start )) s"
