#!/usr/bin/env bash
# The headline benchmark on one H200: every op (or the ops given as arguments) at the published target
# shapes, all providers, one process per op (a kernel that corrupts the CUDA context then spoils
# only its own op), rows merged into one results.jsonl, everything tarred into one file in $OUT.
#
#   run (device tool), from the repo root, carrying .whl:
#     bash scripts/gpu/bench_all.sh                      # all ops, < 8 min
#     bash scripts/gpu/bench_all.sh softmax rms_norm     # a subset; merge later on the workstation:
#     hearth bench --report-only --out benchmarks/h200 --merge <unpacked dir 1> --merge <unpacked dir 2>
#
# Env: OUT (required), BUDGET_S (total seconds for the benchmark, default 390), BENCH_ARGS (extra
# arguments for every `hearth bench` call, e.g. "--dtype float16").
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
BUDGET_S=${BUDGET_S:-390}
# the carried wheels and, where a part of them was carried, the CuTe-DSL peers (quack, FlashAttention-4)
. scripts/gpu/carried_env.sh
ops=("$@")
[ ${#ops[@]} -gt 0 ] || ops=(softmax cross_entropy linear_cross_entropy rms_norm layer_norm rope rope_inplace swiglu swiglu_mlp attention matmul)
dest="$OUT/bench"
mkdir -p "$dest"
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv; } > "$dest/nvidia-smi.txt" 2>&1 || true
# relative cost of each op's headline cases (cases x torch.compile graphs), to split the budget
declare -A weight=([softmax]=3 [cross_entropy]=2 [linear_cross_entropy]=3 [rms_norm]=1 [layer_norm]=1 [rope]=1 [rope_inplace]=1
                   [swiglu]=1 [swiglu_mlp]=1 [attention]=3 [matmul]=1)
start=$SECONDS
rc=0
for i in "${!ops[@]}"; do
  left=$(( BUDGET_S - (SECONDS - start) ))
  w_rest=0
  for op in "${ops[@]:$i}"; do w_rest=$(( w_rest + ${weight[$op]:-1} )); done
  share=$(( left * ${weight[${ops[$i]}]:-1} / w_rest ))
  [ $share -ge 10 ] || share=10
  echo "=== ${ops[$i]}: ${share} s budget ($left s left) ==="
  # shellcheck disable=SC2086
  python3 -m hearth.bench "${ops[$i]}" --sizes headline --out "$dest" --total-budget-s "$share" --no-report ${BENCH_ARGS:-} \
    >> "$dest/bench.log" 2>&1
  r=$?
  [ $r -eq 0 ] || { echo "  exit $r (see bench.log)"; rc=$r; }
  tail -n 20 "$dest/bench.log" | grep -E "^${ops[$i]} " | tail -n 8
done
python3 -m hearth.bench --report-only --out "$dest" >> "$dest/bench.log" 2>&1 || { echo "report failed (see bench.log)"; rc=1; }
# the reply shows the end of the output: the summary (headline table, losses) goes last
[ -f "$dest/summary.md" ] && tail -c 9000 "$dest/summary.md"
tar -czf "$OUT/bench-results.tgz" -C "$OUT" bench && rm -rf "$dest"
echo "total $(( SECONDS - start )) s; results: bench-results.tgz (unpack: tar -xzf bench-results.tgz)"
exit $rc
