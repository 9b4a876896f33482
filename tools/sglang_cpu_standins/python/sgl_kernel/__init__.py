"""IMPORT-ONLY STAND-IN for ``sgl_kernel`` (SGLang's CUDA kernels). Test/CI tooling.

Lets ``sglang`` import on a CPU-only machine; every function raises when called.
It registers no ``torch.ops.sgl_kernel`` operators, so SGLang's
``_is_intel_amx_backend_available()`` is False and its CPU path uses plain torch.
See ``tools/sglang_cpu_standins/README.md``.
"""

import sglang_cpu_standin

sglang_cpu_standin.install(__import__(__name__), version="0.0.0+cpu-standin")
