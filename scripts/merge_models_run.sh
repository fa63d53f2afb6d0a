#!/usr/bin/env bash
# Merge one device call's model-shape suite (scripts/gpu/bench_models.sh's $OUT/models, copied back) into the
# committed benchmarks/h200/models, on the workstation:
#
#   bash scripts/merge_models_run.sh NEW_DIR LABEL [DEST]
#     NEW_DIR  the call's models folder (results.jsonl, bench.log, ...; a models.tgz of it: unpack it first)
#     LABEL    names the kept log: DEST/bench-<date>-LABEL.log, e.g. "22d0de2-attention-attention_varlen"
#     DEST     default benchmarks/h200/models
#
# Steps: unpack DEST/reports.tgz (the per-op Markdown and plots) into DEST; `hearth bench --report-only --out DEST
# --merge NEW_DIR` (per case the later row wins, but a skipped row or a provider unavailable in that call never
# replaces a measured one: hearth.bench.report.merge_rows) rebuilds every report and summary.md; the per-op reports
# go back into reports.tgz; NEW_DIR's bench.log and nvidia-smi.txt become DEST's latest and bench-<date>-LABEL.log.
# NEW_DIR's rows must come from a GPU DEST's rows were measured on (exit 2 otherwise: no mixed-GPU report).
# Env: PYTHON (default .venv/bin/python when present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
new=${1:?usage: merge_models_run.sh NEW_DIR LABEL [DEST]}
label=${2:?usage: merge_models_run.sh NEW_DIR LABEL [DEST]}
dest=${3:-benchmarks/h200/models}
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
[ -f "$new/results.jsonl" ] || { echo "merge_models_run: $new/results.jsonl not found" >&2; exit 2; }
[ -d "$dest" ] || { echo "merge_models_run: $dest is not a folder" >&2; exit 2; }
case "$label" in *[!A-Za-z0-9._-]*|"") echo "merge_models_run: LABEL must be letters, digits, . _ -, got '$label'" >&2; exit 2 ;; esac
new=$(cd "$new" && pwd)
# rows of one GPU only: a call that ran on another card (an H100 where the folder is the H200's, or a CPU --check
# folder) would replace DEST's rows by key while the summary and the folder's name go on naming DEST's GPU
"$py" - "$dest/results.jsonl" "$new/results.jsonl" <<'PY' || exit 2
import json, sys

def gpus(path):
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return set()
    return {str((json.loads(line).get("env") or {}).get("gpu")) for line in lines if line.strip()}

have, new = gpus(sys.argv[1]), gpus(sys.argv[2])
if have and not new <= have:
    sys.exit(f"merge_models_run: {sys.argv[2]} holds rows measured on {sorted(new - have)}, {sys.argv[1]} on "
             f"{sorted(have)}: merging would mix GPUs in one report; merge it into a folder of its own GPU")
PY
[ -f "$dest/reports.tgz" ] && tar -xzf "$dest/reports.tgz" -C "$dest"
PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} "$py" -m hearth.bench --report-only --out "$dest" --merge "$new"
(
  cd "$dest"
  shopt -s nullglob
  reports=()
  for f in ./*.md ./*.png; do
    case "$f" in ./summary.md|./ratios.png) ;; *) reports+=("$f") ;; esac
  done
  if [ ${#reports[@]} -gt 0 ]; then
    tar -czf reports.tgz "${reports[@]}"
    rm -f "${reports[@]}"
  fi
)
day=$(sed -n 's/.*"date": "\([0-9-]*\)T.*/\1/p' "$new/results.jsonl" | head -n 1)
for f in bench.log nvidia-smi.txt; do
  [ -f "$new/$f" ] && cp "$new/$f" "$dest/$f"
done
[ -f "$new/bench.log" ] && cp "$new/bench.log" "$dest/bench-${day:-$(date -u +%Y-%m-%d)}-$label.log"
echo "merged $new into $dest ($(wc -l < "$dest/results.jsonl") rows; per-op reports in $dest/reports.tgz)"
