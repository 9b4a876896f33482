#!/usr/bin/env bash
# Install SGLang 0.5.23 into the active virtual environment for CPU-only use
# (tests, CI, laptops). Idempotent: a second run only checks and exits.
#
# Why --no-deps: sglang's declared dependencies pin a CUDA torch (2.14.1),
# flashinfer, sglang-kernel (CUDA-only; PyPI has no CPU build) and torchvision
# (PyPI's build does not import beside the CPU torch). We keep the environment's
# torch 2.13.0+cpu, transformers 5.19.0, numpy, accelerate and datasets untouched
# and add only the CPU-safe runtime modules that `python -m sglang.launch_server`
# imports, each pinned (found by starting a real server on a CPU-only machine).
#
# sgl_kernel and torchvision are replaced by import-only stand-ins in
# tools/sglang_cpu_standins/python. They are NOT installed into site-packages:
# rlkit puts that folder on the PYTHONPATH of a CPU server subprocess only, and
# only when the real package is missing, so they never shadow a real install.
#
# On a GPU machine install SGLang the normal way instead (pip install "sglang==0.5.23"
# in its own environment with its CUDA torch); see docs/sglang.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# The active venv's python; else $PYTHON; else the repository's .venv.
if [ -n "${VIRTUAL_ENV:-}" ]; then PY=python
elif [ -n "${PYTHON:-}" ]; then PY=$PYTHON
else PY=.venv/bin/python; fi

PINS=(
  "sglang==0.5.23"
  # the router for many servers (a Rust binary; its Python deps are below)
  "sglang-router==0.3.2"
  # imported at module level by sglang's server on CPU
  "triton==3.9.0"
  "apache-tvm-ffi==0.1.11"
  "xgrammar==0.2.7"
  "compressed-tensors==0.18.0" "loguru==0.7.3"
  "openai==2.8.0" "distro==1.9.0" "httpx==0.28.1" "httpcore==1.0.9" "jiter==0.19.0" "sniffio==1.3.1"
  "soundfile==0.13.1" "cffi==2.1.1" "pycparser==3.12"
  "sentencepiece==0.2.1"  # sglang's pin; its generated code runs on protobuf 6 (SwanLab's)
  "fastapi==0.165.0" "starlette==1.10.0" "uvicorn==0.54.0" "uvloop==0.23.0"
  "opentelemetry-api==1.45.2"
  "orjson==3.13.0" "msgspec==0.23.0" "pybase64==1.5.1" "python-multipart==0.0.34"
  "setproctitle==1.3.8" "interegular==0.3.3" "partial-json-parser==0.2.1.1.post7"
  "prometheus_client==0.26.0" "zstandard==0.25.0"
  # aiohttp: also rlkit's SGLang client
  "aiohttp==3.14.5" "aiohappyeyeballs==2.7.1" "aiosignal==1.4.0" "frozenlist==1.8.0"
  "multidict==7.2.1" "propcache==0.5.4" "yarl==1.25.1"
)

installed_ok() {
  "$PY" - "${PINS[@]}" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
missing = []
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if version(name) != want:
            missing.append(pin)
    except PackageNotFoundError:
        missing.append(pin)
sys.exit(1 if missing else 0)
PYEOF
}

if installed_ok; then
  echo "install_sglang: sglang 0.5.23 and its CPU runtime modules already installed"
  exit 0
fi
"$PY" -m pip install -q --no-deps "${PINS[@]}"

# PyPI's torchvision breaks `import transformers` beside the CPU torch: refuse it.
if "$PY" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('torchvision') is None)"; then
  if ! "$PY" -c "import torchvision" >/dev/null 2>&1; then
    echo "install_sglang: a broken torchvision is installed; run: $PY -m pip uninstall -y torchvision" >&2
    exit 1
  fi
fi
# Smoke check: the server's imports resolve with the stand-ins on the path.
PYTHONPATH="$PWD/tools/sglang_cpu_standins/python${PYTHONPATH:+:$PYTHONPATH}" SGLANG_USE_CPU_ENGINE=1 \
  "$PY" -c "import sglang.srt.entrypoints.http_server" >/dev/null 2>&1 \
  || { echo "install_sglang: 'import sglang.srt.entrypoints.http_server' fails; run it by hand to see why" >&2; exit 1; }
echo "install_sglang: ok"
