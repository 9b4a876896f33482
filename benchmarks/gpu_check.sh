#!/usr/bin/env bash
# One GPU check: benchmarks/gpu_check.py's six sections, one Markdown table.
#
# Needs only a CUDA PyTorch, transformers, accelerate and peft plus rlkit itself
# (pip install -e . --no-deps, or the checkout on PYTHONPATH). No network: every model is
# a random Qwen2 built in process; the --tiny run trains a byte tokenizer locally with
# `tokenizers` (a transformers dependency). Nothing else is installed or downloaded.
#
#   bash benchmarks/gpu_check.sh                    # one H100/H200, within 8 minutes
#   bash benchmarks/gpu_check.sh --tiny --device cpu   # the smoke-test size (any machine)
#   BUDGET_S=300 bash benchmarks/gpu_check.sh       # skip sections that would start later
#
# Arguments go to gpu_check.py. The table is also written to runs/gpu_check_<time>.md
# (RUNS_DIR overrides runs/) and, if $OUT is set, to $OUT/gpu_check.md. The run is stopped with SIGTERM (the table
# still printed) at BUDGET_S + 60 s, and killed 20 s after that.
set -uo pipefail
cd "$(dirname "$0")/.."
# PYTHON, else the checkout's .venv, else python on PATH.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python
fi
tiny=0
device=""
prev=""
for arg in "$@"; do
  [ "$arg" = "--tiny" ] && tiny=1
  [ "$prev" = "--device" ] && device=$arg
  case "$arg" in --device=*) device=${arg#--device=} ;; esac
  prev=$arg
done
"$PY" -c "import torch, transformers, accelerate" || {
  echo "gpu_check.sh: needs torch, transformers and accelerate importable by $PY" >&2
  exit 2
}
if [ "$tiny" = 0 ] || [ "$device" = "cuda" ]; then
  if [ "$device" != "cpu" ]; then
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
      echo "gpu_check.sh: torch sees no CUDA device (use --tiny --device cpu for a CPU run)" >&2
      exit 2
    }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  fi
fi
budget=${BUDGET_S:-420}
runs=${RUNS_DIR:-runs}
mkdir -p "$runs"
table="$runs/gpu_check_$(date +%Y%m%d_%H%M%S).md"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 20 $((budget + 60)) "$PY" benchmarks/gpu_check.py --budget-s "$budget" "$@" | tee "$table"
status=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp "$table" "$OUT/gpu_check.md"
fi
echo "gpu_check.sh: table in $table (exit $status)" >&2
exit "$status"
