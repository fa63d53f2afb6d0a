#!/usr/bin/env bash
# The whole GPU test suite in ONE device call (target: under 6 minutes on an H200), with a log that a
# kernel change carries: benchmarks/h200/tests/<date>-<commit>.log (commit, GPU, versions, pytest's
# last line first, then pytest's whole output).
#
#   run (device tool), from the repo root, on a clean commit:
#     COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu/test.sh      # writes $OUT/<date>-<commit>.log
#   then copy that file to benchmarks/h200/tests/ and commit it.
#
# Env: OUT (required), COMMIT (the commit under test; the copy on the device has no .git), PYTEST_ARGS
# (default: the kernel, nn and patch tests), TEST_S (wall limit for pytest, default 480 s: on 2026-12-06 one H100 ran
# the suite in 325 s of pytest and another had not finished at 400), OFFLINE=1 (also run
# the offline sm_90 builds, the tests named *sm90*: they compile with Triton's bundled ptxas on the CPU, need no
# GPU and run in CI with the same pinned Triton, so by default the device does not spend its time on them; in the
# 2026-12-03 suite of 70082d4 they were 10 of the 20 slowest test phases, 35-62 s each, beside 14 workers).
# HEARTH_ATTN_AUTOTUNE=0: the attention tests pin each list's first config; every config of every list is
# still checked, once, by tests/kernels/test_attention.py::test_gpu_every_config_is_correct.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONUNBUFFERED=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} HEARTH_ATTN_AUTOTUNE=${HEARTH_ATTN_AUTOTUNE:-0}
unset TRITON_INTERPRET
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
day=$(date -u +%Y-%m-%d)
log="$OUT/${day}-${commit}.log"
raw="$OUT/pytest-raw.txt"
start=$SECONDS
# several pytest workers share the GPU: the suite is dominated by Triton compiles (CPU) and fp32
# references, not by GPU time; the tests with the largest references (xdist_group "gpu_big") run one
# at a time in one worker, the rest beside them
workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n "${PYTEST_WORKERS:-3}" --dist loadgroup)
select=(-k "not sm90")
[ "${OFFLINE:-0}" = 1 ] && select=()
timeout "${TEST_S:-480}" python3 -m pytest -q -rfE -p no:cacheprovider --timeout 200 --durations=20 "${workers[@]}" "${select[@]}" \
  ${PYTEST_ARGS:-tests/kernels tests/test_nn.py tests/test_patch.py tests/test_patch_lora.py tests/test_patch_varlen.py} > "$raw" 2>&1
rc=$?
last=$(grep -E "^(=+ )?[0-9]+ (passed|failed)|^=+ .*(passed|failed|error).* =+$" "$raw" | tail -n 1)
[ -n "$last" ] || last="(no pytest summary line: rc=$rc, killed at the time limit?)"
{
  echo "# hearth GPU test suite"
  echo "commit:   $commit"
  echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command:  COMMIT=$commit OFFLINE=${OFFLINE:-0} bash scripts/gpu/test.sh   (pytest ${select[*]} ${PYTEST_ARGS:-tests/kernels tests/test_nn.py tests/test_patch.py tests/test_patch_lora.py tests/test_patch_varlen.py})"
  python3 - <<'PY'
import torch, triton
try:
    import transformers, peft
    extra = f"transformers {transformers.__version__}, peft {peft.__version__}"
except Exception as e:  # noqa: BLE001
    extra = f"transformers/peft unavailable ({type(e).__name__})"
import subprocess
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA"
try:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=20).stdout.strip()
except Exception:  # noqa: BLE001
    driver = "?"
print(f"gpu:      {gpu} (driver {driver})")
print(f"versions: torch {torch.__version__}, triton {triton.__version__}, {extra}")
PY
  echo "wall:     $(( SECONDS - start )) s, pytest rc=$rc, workers: ${workers[*]:-1}"
  echo "result:   $last"
  echo
  cat "$raw"
} > "$log"
rm -f "$raw"
grep -E "^(FAILED|ERROR)" "$log" | head -n 60
echo "result: $last  ($(( SECONDS - start )) s)  -> $(basename "$log")"
exit $rc
