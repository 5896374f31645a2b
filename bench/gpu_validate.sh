#!/usr/bin/env bash
# fitplan's CUDA validation, unattended, in under 8 minutes on one GPU (written for one H200, 141 GB).
#
#   bench/gpu_validate.sh [OUT_DIR]        # default: $OUT if set, else bench/accuracy/gpu-results
#
# Needs: python with torch (a CUDA build), transformers and peft (optional: LoRA cases error without it),
# plus fitplan's own dependencies (pluggy attrs cattrs tomli-w networkx click rich). No internet, no
# pip install: fitplan and the plugin are used from this checkout through PYTHONPATH.
#
# Stages (each under its own timeout, so one hang cannot eat the budget; partial results are kept):
#   1. env.txt          torch / CUDA / GPU facts, and a check that every module imports
#   2. smoke            one tiny step on the GPU: fails fast if the referee cannot run at all
#   3. tiny             the accuracy matrix's CUDA column: 8 tiny architectures x precision x attention x
#                       checkpointing x method, real CUDA steps -> accuracy-cuda-tiny.md / tiny.json
#   4. shapes           Llama-2 7B/13B shapes that fit on the GPU, real CUDA steps, each next to the CPU
#                       referee's FakeTensorMode run of the same scenario -> accuracy-cuda-shapes.md / shapes.json
#   5. calibrate        fitplan validate --calibrate-out on llama-2-7b (bf16-true, b1 x 512, --gpu h200)
#                       -> calibration/h200.toml (a [framework] table + an [[mfu_calibration]] row)
# Everything lands in OUT_DIR; summary.txt lists what each stage returned.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${1:-${OUT:-$ROOT/bench/accuracy/gpu-results}}
mkdir -p "$OUT_DIR/calibration"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in "$ROOT/.venv/bin/python" python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      PY=$cand; break
    fi
  done
fi
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"
if [ -z "$PY" ]; then
  echo "no python with a CUDA-enabled torch found (set PYTHON=...)" | tee -a "$SUMMARY"
  exit 1
fi
export PYTHONPATH="$ROOT/src:$ROOT/plugins/fitplan-torch/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
START=$(date +%s)

stage() {  # stage NAME TIMEOUT_SECONDS command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 ))s (limit ${limit}s; log $name.log)" | tee -a "$SUMMARY"
  return 0
}

stage env 60 "$PY" - <<'PY'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for m in ("torch", "transformers", "peft", "pluggy", "attrs", "cattrs", "tomli_w", "networkx", "click", "rich", "fitplan", "fitplan_torch"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:14s} {getattr(mod, '__version__', 'ok')}")
    except Exception as e:
        print(f"{m:14s} MISSING: {e}")
import torch
print("cuda", torch.version.cuda, "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    free, total = torch.cuda.mem_get_info(i)
    print(f"device {i}: {p.name}, {total / 2**30:.1f} GiB total, {free / 2**30:.1f} GiB free")
PY
cp "$OUT_DIR/env.log" "$OUT_DIR/env.txt"

stage smoke 60 "$PY" - <<'PY'
import json, warnings
warnings.filterwarnings("ignore")
import fitplan, fitplan_torch
est = fitplan.estimate(model="tests/data/configs/tiny-llama/config.json", precision="bf16-true",
                       per_device_train_batch_size=2, max_seq_length=128)
r = fitplan_torch.validate(est, mode="cuda")
print(json.dumps({"device": r["device"], "components": r["components"], "cuda": r["measured"]["cuda"],
                  "counter_peak": r["measured"]["peak"]}, indent=1))
PY

stage tiny 170 "$PY" bench/accuracy/run.py --device cuda --groups tiny \
  --out "$OUT_DIR/accuracy-cuda-tiny.md" --json "$OUT_DIR/tiny.json"

stage shapes 200 "$PY" bench/accuracy/run.py --device cuda --groups shapes \
  --out "$OUT_DIR/accuracy-cuda-shapes.md" --json "$OUT_DIR/shapes.json"

export CAL_OUT="$OUT_DIR/calibration/h200.toml"
stage calibrate 90 "$PY" - <<'PY'
import json, os, warnings
warnings.filterwarnings("ignore")
import fitplan, fitplan_torch
est = fitplan.estimate(model="llama-2-7b", gpu="h200", precision="bf16-true", per_device_train_batch_size=1, max_seq_length=512)
r = fitplan_torch.validate(est, mode="cuda", calibrate_out=os.environ["CAL_OUT"])
print(json.dumps({k: r[k] for k in ("device", "components", "calibration", "tokens_per_second", "peak_phase")}, indent=1, default=str))
print(open(os.environ["CAL_OUT"]).read())
PY

echo "total: $(( $(date +%s) - START ))s" | tee -a "$SUMMARY"
ls -la "$OUT_DIR" >> "$SUMMARY"
