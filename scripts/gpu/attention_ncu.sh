#!/usr/bin/env bash
# Nsight Compute on attention fwd+bwd, hearth beside FlashAttention-4 (scripts/gpu/attention_ncu.py), on the device:
#   OUT=out [CASES="LABEL:B,Hq,Hk,T,D,causal;..."] [PROVIDERS="hearth fa4"] [BUDGET_S=300] [SOURCE=1] bash scripts/gpu/attention_ncu.sh
# One ncu process per provider and case (`--set full`, `--clock-control none`: the clocks left as they are, as the
# timings are; kernel replay), its raw CSV in $OUT/ncu-<provider>-<n>.csv, then the compact table of all of them in
# $OUT/ncu-table.txt (also printed). fa4 needs the peers carried (scripts/gpu/peer_wheels.sh); where it does not
# import, its rows are left out and the table says so. Also writes the metric names this ncu knows for the chip
# ($OUT/ncu-metrics.txt), for reading the raw CSVs later. A run that would start past BUDGET_S seconds is left out
# (each is also cut at 240 s). SOURCE=1 adds, per provider and case, a second ncu run with the per-instruction pages
# (`--page source --print-source sass`: the warp-stall samples at each SASS instruction of every kernel of the call) in
# $OUT/ncu-src-<provider>-<n>.csv.xz, and their table by kind of instruction (`attention_ncu.py source`: idle warps,
# wgmma waits, mbarrier waits by address, named barriers) in $OUT/ncu-source-table.txt: the raw page's per-issue
# stall figures count warps that issue nothing (BENCHMARKS.md forty-ninth run).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
mkdir -p "$OUT"
CASES=${CASES:-"Qwen3-32B T8192:1,64,8,8192,128,1;Llama-2-7B B4 T2048:4,32,32,2048,128,1"}
PROVIDERS=${PROVIDERS:-"hearth fa4"}
BUDGET_S=${BUDGET_S:-300}
. scripts/gpu/carried_env.sh >/dev/null 2>&1 || true
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
command -v ncu >/dev/null || { echo "ncu is not on PATH"; exit 2; }
ncu --version > "$OUT/ncu-metrics.txt" 2>&1
ncu --query-metrics --chip gh100 >> "$OUT/ncu-metrics.txt" 2>&1 || true
IFS=';' read -r -a cases <<< "$CASES"
files=()
srcs=()
n=0
for c in "${cases[@]}"; do
  n=$(( n + 1 ))
  for p in $PROVIDERS; do
    if [ "$p" = fa4 ] && ! python3 -c "import flash_attn.cute" >/dev/null 2>&1; then
      echo "fa4: flash_attn.cute does not import (peers not carried): left out"; continue
    fi
    [ $SECONDS -lt "$BUDGET_S" ] || { echo "$p: $c left out (past BUDGET_S=$BUDGET_S s)"; continue; }
    f="$OUT/ncu-$p-$n.csv"
    echo "=== $p: $c -> $f"
    timeout 240 ncu --profile-from-start off --clock-control none --set full --csv --page raw --print-units base --log-file "$f" \
      python3 scripts/gpu/attention_ncu.py run --provider "$p" --case "$c" 2>&1 | tail -3
    files+=("$f")
    if [ "${SOURCE:-0}" = 1 ] && [ $SECONDS -lt "$BUDGET_S" ]; then
      src="$OUT/ncu-src-$p-$n.csv"
      timeout 240 ncu --profile-from-start off --clock-control none --section SourceCounters --section WarpStateStats \
        --page source --print-source sass --csv --log-file "$src" \
        python3 scripts/gpu/attention_ncu.py run --provider "$p" --case "$c" 2>&1 | tail -1
      srcs+=("$src")
    fi
  done
done
if [ ${#srcs[@]} -gt 0 ]; then
  python3 scripts/gpu/attention_ncu.py source "${srcs[@]}" > "$OUT/ncu-source-table.txt" 2>&1
  for f in "${srcs[@]}"; do [ -f "$f" ] && xz -9 -f "$f"; done
fi
if [ ${#files[@]} -gt 0 ]; then
  python3 scripts/gpu/attention_ncu.py table "${files[@]}" | tee "$OUT/ncu-table.txt"
else  # every run left out: nothing to tabulate, which is not a failure of this script
  echo "no ncu runs (every provider / case left out): no table" | tee "$OUT/ncu-table.txt"
fi
