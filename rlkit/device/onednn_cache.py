"""A cap on oneDNN's cache of compiled CPU kernels, for bf16 compute on a CPU.

PyTorch runs bf16 matrix products on a CPU through oneDNN, which compiles a primitive (a
kernel specialised to one shape) the first time it meets a shape and keeps up to 1,024 of
them (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``). The update's micro-batches bring a new token
count almost every time (prompt groups packed together, rows trimmed to their longest), so
each step adds primitives for every layer shape at that count, and the cache never
evicts: under bf16 rlkit's peak resident set measured 1.16x TRL's on the same GRPO run,
1.08x with the cache held to 64 primitives at the same speed
(``python benchmarks/e2e_grpo_vs_trl.py --mixed-precision bf16``, docs/performance.md).
:func:`cap_onednn_primitive_cache` sets that cap unless the environment already sets one.

oneDNN reads the variable once, when it builds its cache for the first product; the
trainer sets it before loading the model, which is too late only for a process that
already ran bf16 products (a notebook that ran some before building the trainer).
"""

from __future__ import annotations

import os

CAPACITY_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
"""The environment variable oneDNN takes its primitive cache's capacity from."""
CAPACITY = 64
"""The cap rlkit sets: room for every layer shape of a few micro-batch token counts."""


def cap_onednn_primitive_cache(capacity: int = CAPACITY) -> str:
    """Cap oneDNN's primitive cache at ``capacity`` entries unless the environment sets
    :data:`CAPACITY_VARIABLE`; returns the capacity in force (the user's, if set)."""
    return os.environ.setdefault(CAPACITY_VARIABLE, str(capacity))
