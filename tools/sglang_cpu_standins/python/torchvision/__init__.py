"""IMPORT-ONLY STAND-IN for ``torchvision``. Test/CI tooling.

SGLang imports torchvision for its vision models at module level; PyPI's
torchvision does not import beside the CPU torch. Text-only models never call it;
every function raises when called. See ``tools/sglang_cpu_standins/README.md``.
"""

import sglang_cpu_standin

sglang_cpu_standin.install(__import__(__name__), version="0.0.0+cpu-standin")
