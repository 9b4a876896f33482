"""Wall-clock timing of the step's phases, reported as ``timing_s/<phase>``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates seconds per phase name; ``with timer("gen"): ...``.

    Each phase is also a ``torch.profiler`` range named ``phase/<name>``, so a profile of a
    step attributes every operator to its phase (``benchmarks/profile_step.py``).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f"phase/{phase}"):
                yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self, num_tokens: int, num_response_tokens: int | None = None) -> dict[str, float]:
        """``timing_s/*`` and ``timing_per_token_ms/*``: milliseconds per token the phase
        processed, as verl divides them: ``gen`` by the response tokens
        (``num_response_tokens``; ``num_tokens`` when not given), every other phase by
        all ``num_tokens`` (prompt + response)."""
        out = {f"timing_s/{k}": v for k, v in self.seconds.items()}
        if num_tokens > 0:
            for k, v in self.seconds.items():
                per = num_response_tokens if k == "gen" and num_response_tokens else num_tokens
                out[f"timing_per_token_ms/{k}"] = 1000 * v / per
        return out
