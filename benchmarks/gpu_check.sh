#!/usr/bin/env bash
# One GPU check: benchmarks/gpu_check.py's six sections, one Markdown table.
#
# Needs a CUDA PyTorch, transformers, accelerate and peft, rlkit itself (the checkout is
# put on PYTHONPATH) and rlkit's one pure-Python dependency outside those, gin-config
# (0.5.0, one 61 kB wheel). Where gin is not importable, the script installs it into a
# temporary folder from a wheel in $WHEELS (default .whl/), fetched beforehand on any
# machine with pip:
#   pip download --no-deps --only-binary=:all: gin-config==0.5.0 -d .whl
# No network: every model is a random Qwen2 built in process; the --tiny run trains a
# byte tokenizer locally with `tokenizers` (a transformers dependency).
#
#   bash benchmarks/gpu_check.sh                    # one H100/H200, within 8 minutes
#   bash benchmarks/gpu_check.sh --tiny --device cpu   # the smoke-test size (any machine)
#   BUDGET_S=300 bash benchmarks/gpu_check.sh       # skip sections that would start later
#
# Arguments go to gpu_check.py. The table is also written to runs/gpu_check_<time>.md
# and its progress log (every row as it is added) to runs/gpu_check_<time>.log
# (RUNS_DIR overrides runs/); if $OUT is set, both are copied there as gpu_check.md and
# gpu_check.log. The run is stopped with SIGTERM (the table
# still printed) at BUDGET_S + 60 s, and killed 20 s after that.
set -uo pipefail
cd "$(dirname "$0")/.."
# PYTHON, else the checkout's .venv, else python3 (or python) on PATH.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
elif command -v python3 >/dev/null; then PY=python3
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
if ! "$PY" -c "import gin" 2>/dev/null; then
  wheels=${WHEELS:-.whl}
  wheel=$(ls "$wheels"/gin_config-*.whl 2>/dev/null | head -n 1)
  if [ -z "$wheel" ]; then
    echo "gpu_check.sh: rlkit needs gin-config, which $PY cannot import and $wheels/ holds" \
      "no wheel of. Fetch it where pip works:" \
      "pip download --no-deps --only-binary=:all: gin-config==0.5.0 -d $wheels" >&2
    exit 2
  fi
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  "$PY" -m pip install -q --no-index --no-deps --target "$site" "$wheel" || {
    echo "gpu_check.sh: could not install $wheel" >&2
    exit 2
  }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_check.sh: gin-config from $wheel" >&2
fi
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
stamp=$(date +%Y%m%d_%H%M%S)
table="$runs/gpu_check_$stamp.md"
log="$runs/gpu_check_$stamp.log"  # progress and every row as added: kept even if killed
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 20 $((budget + 60)) "$PY" benchmarks/gpu_check.py --budget-s "$budget" \
  --log "$log" "$@" | tee "$table"
status=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp "$table" "$OUT/gpu_check.md"
  [ -f "$log" ] && cp "$log" "$OUT/gpu_check.log"
fi
echo "gpu_check.sh: table in $table (exit $status)" >&2
exit "$status"
