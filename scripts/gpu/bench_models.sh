#!/usr/bin/env bash
# The model-shape suite on one H200 (issue 17): every op at the shapes of real model configs
# (`--sizes models`: Qwen3 0.6B-32B, Llama 3.1 8B/70B, Llama 2, Qwen2.5, Gemma 3), all providers,
# GPU time, wall time per call and peak memory, then one line per op:
#   GEOMEAN <op> <ratio> worst <ratio> (<case>) | ... | mem <= peer in k/n ... | wall/call ...
# printed last. One process runs every op (one torch.compile start-up, one speed-of-light
# measurement); if a kernel leaves a sticky CUDA error, the ops it stopped run again, one process each.
#
#   run (device tool), from the repo root, carrying .whl (Liger: `pip download liger_kernel==0.8.5
#   --no-deps -d .whl` on the workstation; quack and FlashAttention-4 too if wanted: scripts/gpu/peer_wheels.sh, then
#   carry .peers/peers.tar.xz.1of2 in one call and .peers/peers.tar.xz.2of2 in the next, on the same warm machine):
#     OUT=out bash scripts/gpu/bench_models.sh                  # all ops, about 7 min (budget 360 s + start-up + reports)
#     OUT=out bash scripts/gpu/bench_models.sh rms_norm swiglu  # a subset
#   then on the workstation: bash scripts/merge_models_run.sh <the call's models folder> <commit>-<ops>
#   (unpacks the committed per-op reports, hearth bench --report-only --merge, repacks them, keeps the bench.log)
#
# Files back (at most 8, one folder deep): $OUT/models/{results.jsonl, summary.md, ratios.png,
# bench.log, nvidia-smi.txt, reports.tgz (per-op Markdown and PNG plots)}.
# Env: OUT (required); BUDGET_S (seconds for the benchmark itself, default 360; cases past it are
# recorded as skipped); PROVIDERS (default hearth,compile,liger,quack,vendor: eager, never a
# fused peer, is left out to save time); BENCH_ARGS (extra arguments, e.g. "--dtype float16").
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
BUDGET_S=${BUDGET_S:-360}
PROVIDERS=${PROVIDERS:-hearth,compile,liger,quack,vendor}
export PYTHONUNBUFFERED=1
# the carried wheels and, where a part of them was carried, the CuTe-DSL peers (scripts/gpu/peer_wheels.sh: two calls
# back to back on one warm machine; the first's part waits in /tmp/site until the second's comes)
. scripts/gpu/carried_env.sh
ops=("$@")
[ ${#ops[@]} -gt 0 ] || ops=(all)
dest="$OUT/models"
mkdir -p "$dest"
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv; } > "$dest/nvidia-smi.txt" 2>&1 || true
python3 -c "import quack" >/dev/null 2>&1 && echo "quack imports" || echo "quack does not import: its rows will say unavailable"
start=$SECONDS
rc=0
# shellcheck disable=SC2086
# a hard stop past the budget (one case overrunning) so the reports are always written
timeout $(( BUDGET_S + 90 )) python3 -m hearth.bench "${ops[@]}" --sizes models --providers "$PROVIDERS" --out "$dest" --total-budget-s "$BUDGET_S" \
  --no-report ${BENCH_ARGS:-} \
  > "$dest/bench.log" 2>&1 || { rc=$?; echo "bench exit $rc (see bench.log)"; }
grep -E -- "-> (win|loss|no peer|hearth)" "$dest/bench.log" | cut -c1-260 | tail -n 80
# ops stopped by another kernel's sticky CUDA error: again, one process each, in the time left
redo=$(python3 - "$dest/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(" ".join(sorted({r["op"] for r in rows if r["status"] == "skipped" and "sticky CUDA error" in r.get("reason", "")})))
PY
)
for op in $redo; do
  left=$(( BUDGET_S - (SECONDS - start) ))
  [ $left -ge 20 ] || { echo "no time left to rerun $op"; continue; }
  echo "=== rerun $op in its own process (${left} s left) ==="
  # shellcheck disable=SC2086
  timeout $(( left + 60 )) python3 -m hearth.bench "$op" --sizes models --providers "$PROVIDERS" --out "$dest" --total-budget-s "$left" \
    --no-report ${BENCH_ARGS:-} \
    >> "$dest/bench.log" 2>&1 || { rc=$?; echo "  exit $rc"; }
done
python3 -m hearth.bench --report-only --out "$dest" > "$dest/report.log" 2>&1 || { echo "report failed"; cat "$dest/report.log"; rc=1; }
cat "$dest/report.log" >> "$dest/bench.log"
# per-op pages and plots in one file (at most 8 files come back)
( cd "$dest" && tar -czf reports.tgz --exclude=results.jsonl --exclude=summary.md --exclude=ratios.png \
    --exclude=bench.log --exclude=nvidia-smi.txt --exclude=reports.tgz --exclude=report.log ./*.md ./*.png 2>/dev/null;
  rm -f ./*_*.png report.log; for f in ./*.md; do [ "$f" = ./summary.md ] || rm -f "$f"; done )
ls "$dest"
echo "total $(( SECONDS - start )) s"
# last: the per-op geometric means and the attention goals (report.log's GEOMEAN and ATTENTION-GOAL lines: one per op
# and per attention mode; the benchmark runs above print none, --no-report)
grep -E "^(GEOMEAN|ATTENTION-GOAL) " "$dest/bench.log"
exit $rc
