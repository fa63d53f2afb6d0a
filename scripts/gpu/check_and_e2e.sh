#!/usr/bin/env bash
# H200 call: kernel tests at real shapes, `hearth inspect` on the tensor-core ops, and the
# end-to-end LoRA step. Everything lands in $OUT; run with carry=[".whl"].
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?}"
export PYTHONUNBUFFERED=1
. scripts/gpu/carried_env.sh
python3 - <<'PY' > "$OUT/env.json"
import json, torch, triton, transformers, peft, datetime
print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
  "transformers": transformers.__version__, "peft": peft.__version__, "date": datetime.datetime.utcnow().isoformat()}))
PY
for op in ${INSPECT_OPS:-matmul attention softmax cross_entropy rms_norm}; do
  timeout 90 python3 -m hearth.cli inspect "$op" --json "$OUT/inspect_$op.json" > "$OUT/inspect_$op.txt" 2>&1
  echo "inspect $op rc=$?"; tail -n 12 "$OUT/inspect_$op.txt"
done
timeout "${PYTEST_S:-200}" python3 -m pytest -q -rfs --timeout 90 --durations=15 -p no:cacheprovider ${PYTEST_ARGS:-tests/kernels tests/test_nn.py} > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|ERROR|Timeout" "$OUT/pytest_gpu.log" | tail -n 30
timeout "${E2E_S:-240}" python3 scripts/gpu/lora_e2e.py --out "$OUT/lora_e2e.jsonl" --plot "$OUT/lora_e2e.png" ${E2E_ARGS:---seqs 4096} > "$OUT/lora_e2e.log" 2>&1
echo "e2e rc=$?"; tail -n 25 "$OUT/lora_e2e.log"
