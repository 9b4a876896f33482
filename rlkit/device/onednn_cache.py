"""Caps on the caches of compiled CPU kernels that bf16 matrix products fill, one entry per shape.

PyTorch runs bf16 matrix products on a CPU through oneDNN. The first time it meets a shape,
two caches each keep an entry for it:

- oneDNN's primitive cache (a kernel specialised to the shape), up to 1,024 entries
  (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``);
- the computation cache of ideep, PyTorch's layer over oneDNN, up to 1,024 entries as well
  (``LRU_CACHE_CAPACITY``), about a quarter of a MiB each for a 512 x 1376 layer.

The update's micro-batches bring a new token count almost every time (prompt groups packed
together, rows trimmed to their longest), so each step adds entries for every layer shape at
that count, and neither cache evicts until it holds 1,024. Under bf16 on the ``realistic``
GRPO workload rlkit's peak resident set rose from 1,421 to 1,943 MiB over 12 steps with
the primitive cache alone capped; with both held to 64 entries it levels off after the
second step, 1.07x TRL's peak, at the same speed
(``python benchmarks/e2e_grpo_vs_trl.py --workload realistic --mixed-precision bf16``,
docs/performance.md). Float32 products go through MKL and fill neither cache.
:func:`cap_onednn_kernel_caches` sets both caps, each unless the environment already sets
it.

Each cache reads its variable once, when it is first used; the trainer sets them before
loading the model, which is too late only for a process that already ran bf16 products (a
notebook that ran some before building the trainer).
"""

from __future__ import annotations

import os

SMALLEST = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": 0, "LRU_CACHE_CAPACITY": 1}
"""The environment variable each cache (oneDNN's primitives, ideep's computations) takes its
capacity from, and the smallest capacity it takes: 0 turns oneDNN's off, while ideep's at 0
makes the first bf16 product crash the process (a segmentation fault)."""
CAPACITY_VARIABLES = tuple(SMALLEST)
"""The two variables, oneDNN's first."""
CAPACITY = 64
"""The cap rlkit sets on each: room for every layer shape of a few micro-batch token counts."""


class KernelCacheSettingError(ValueError):
    """A cache capacity in the environment that the cache cannot take."""


def cap_onednn_kernel_caches(capacity: int = CAPACITY) -> dict[str, str]:
    """Cap both caches at ``capacity`` entries, each unless the environment sets its
    variable; returns each variable's value in force (the user's, where set).

    Raises:
        ValueError: ``capacity`` below 1.
        KernelCacheSettingError: a variable the environment sets to anything but a whole
            number of at least :data:`SMALLEST` (raised before any product runs).
    """
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    in_force = {name: os.environ.setdefault(name, str(capacity)) for name in CAPACITY_VARIABLES}
    for name, value in in_force.items():
        if not value.strip().isdigit() or int(value) < SMALLEST[name]:
            raise KernelCacheSettingError(
                f"{name}={value!r} in the environment: it must be a whole number of at "
                f"least {SMALLEST[name]} (the kernel cache's capacity in entries); set it "
                f"so, or unset it and rlkit caps the cache at {capacity}"
            )
    return in_force
