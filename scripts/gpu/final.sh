#!/usr/bin/env bash
# The publishing H200 call: the headline benchmark of every op (bench_all.sh), `hearth inspect` of
# every op, and the attention probe with the opt-in TMA + fused-dQ variants. At most 8 files come
# back from $OUT, so logs are tarred. Run with carry=[".whl"] (Liger, pydantic for typer).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?}"
export PYTHONUNBUFFERED=1
start=$SECONDS
BUDGET_S=${BENCH_S:-330} bash scripts/gpu/bench_all.sh 2>&1 | tee "$OUT/bench_console.log" | tail -n 70
bench_rc=${PIPESTATUS[0]}  # an op that failed (its "exit N" line may be above the tail shown) fails the call
rc=$bench_rc
export PYTHONPATH=src:/tmp/site
mkdir -p "$OUT/inspect"
for op in matmul attention linear_cross_entropy softmax cross_entropy rms_norm layer_norm rope swiglu; do
  timeout 60 python3 -m hearth.cli inspect "$op" --json "$OUT/inspect/$op.json" > "$OUT/inspect/$op.txt" 2>&1
  r=$?
  [ $rc = 0 ] && rc=$r
  echo "inspect $op rc=$r $(grep -ciE 'no tensor-core' "$OUT/inspect/$op.txt") shouts"
done
tar -czf "$OUT/inspect.tgz" -C "$OUT" inspect && rm -rf "$OUT/inspect"
left=$(( ${TOTAL_S:-530} - (SECONDS - start) ))
if [ $left -gt 40 ]; then
  HEARTH_ATTN_TMA=1 HEARTH_ATTN_FUSED_DQ=1 timeout $left python3 scripts/gpu/attention_probe.py --quick > "$OUT/attn_variants.log" 2>&1
  r=$?
  [ $rc = 0 ] && rc=$r
  echo "attention variants rc=$r"; grep -E '"kind": "bench"|error' "$OUT/attn_variants.log" | cut -c1-400 | tail -n 8
fi
echo "final.sh total $(( SECONDS - start )) s; bench_all rc=$bench_rc (see bench_console.log); exit $rc"
exit $rc
