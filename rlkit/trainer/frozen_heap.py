"""Keep Python's full garbage collections from rescanning what setup made.

After a trainer's setup the cyclic garbage collector tracks some 10^5-10^6 objects:
imported modules, the model's modules and parameters, the tokenizer, the prompt rows.
A full (oldest-generation) collection walks every one of them. Training makes enough
long-lived objects that such collections recur, each costing about 0.2 s on one core
of a 2-core x86-64 CPU, longer than a whole RL step of a small model
(``python benchmarks/e2e_grpo_vs_trl.py`` with its ``tiny`` workload).

:func:`frozen_heap` collects once and moves the survivors to the collector's permanent
generation (:func:`gc.freeze`) while training runs, so full collections walk only what
training made; afterwards :func:`gc.unfreeze` hands them back, and any of them that has
become garbage is reclaimed as usual. Nothing is freed later than it would be otherwise,
except a reference cycle among objects made before training that becomes garbage
during it: that waits for the end of training.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[int]:
    """Freeze the objects alive on entry for the ``with`` block; yields how many were frozen.

    A process that froze objects itself (``gc.get_freeze_count() > 0`` on entry) manages
    its own collector: then nothing is collected, frozen or unfrozen, and 0 is yielded.
    """
    if gc.get_freeze_count():
        yield 0
        return
    gc.collect()  # freeze only what is alive: garbage frozen now would wait for unfreeze
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()
