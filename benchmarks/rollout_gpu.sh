#!/usr/bin/env bash
# Rollout benchmark on one GPU: HF engine vs SGLang engine, and the three weight-sync modes.
#
# Needs an environment with SGLang's normal CUDA install (pip install "sglang==0.5.23",
# which brings its CUDA torch, sgl_kernel and flashinfer) plus rlkit (pip install -e .).
# The CPU recipe (scripts/install_sglang.sh) is NOT for a GPU machine. No network is needed:
# the model is a random Qwen2 built locally (~0.5B parameters at the default size).
#
#   bash benchmarks/rollout_gpu.sh                 # ~5 minutes on one H100/H200
#   HIDDEN=896 LAYERS=24 PROMPTS=512 bash benchmarks/rollout_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -c "import sglang, sgl_kernel, torch; assert torch.cuda.is_available()" || {
  echo "rollout_gpu.sh: needs a CUDA torch and SGLang's GPU install (sglang, sgl_kernel)" >&2
  exit 1
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PY" benchmarks/rollout.py \
  --device cuda --dtype bfloat16 \
  --hidden-size "${HIDDEN:-1024}" --layers "${LAYERS:-16}" \
  --prompts "${PROMPTS:-256}" --prompt-length "${PROMPT_LENGTH:-128}" \
  --new-tokens "${NEW_TOKENS:-256}" --concurrency "${CONCURRENCY:-1,64,256}" \
  --max-total-tokens "${MAX_TOTAL_TOKENS:-262144}" --mem-fraction-static "${MEM_FRACTION:-0.5}" \
  --modes "${MODES:-disk,tensor,distributed}" --sync-repeats 3
