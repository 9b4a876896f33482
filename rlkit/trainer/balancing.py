"""Sequence-length balancing of a batch's rows across data-parallel processes.

Every process runs the same number of forward passes, so a step lasts as long as its most
loaded process. Splitting the rows into contiguous shards can give one process most of the
long responses; :func:`balanced_partitions` instead splits them into ``k`` equal-sized
parts of near-equal token totals, by the largest differencing method (Karmarkar and Karp,
"The differencing method of set partitioning", 1982) in its equal-cardinality form.
:func:`seqlen_balance_metrics` reports the token totals per process before and after, as
verl's ``global_seqlen/*``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def balanced_partitions(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Split row indices into ``k`` parts of ``len(lengths) // k`` rows with near-equal sums.

    Rows are sorted longest first and taken ``k`` at a time: each such tuple is a partial
    solution of ``k`` one-row parts. The two partial solutions whose parts differ most
    (largest max − min sum) are merged, pairing the heaviest part of one with the lightest
    of the other, until one solution is left. Deterministic: ties break by row index.

    Args:
        lengths: tokens per row (prompt + response), length n with ``n % k == 0``.
        k: number of parts (processes), >= 1.

    Returns:
        ``k`` lists of row indices, each ascending, ordered by their smallest index;
        together a permutation of ``range(n)``.

    Raises:
        ValueError: ``k < 1`` or ``n`` not a multiple of ``k``.
    """
    n = len(lengths)
    if k < 1 or n % k:
        raise ValueError(f"cannot split {n} rows into {k} equal parts")
    if n == 0:
        return [[] for _ in range(k)]
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for tag, start in enumerate(range(0, n, k)):
        parts = [(lengths[i], [i]) for i in order[start : start + k]]
        heapq.heappush(heap, (-_spread(parts), tag, parts))
    tag = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a = sorted(a, key=lambda p: (-p[0], p[1]))  # heaviest first
        b = sorted(b, key=lambda p: (p[0], p[1]))  # lightest first
        merged = [(sa + sb, ra + rb) for (sa, ra), (sb, rb) in zip(a, b)]
        heapq.heappush(heap, (-_spread(merged), tag, merged))
        tag += 1
    return sorted((sorted(rows) for _, rows in heap[0][2]), key=lambda rows: rows[0])


def _spread(parts: list[tuple[int, list[int]]]) -> int:
    sums = [s for s, _ in parts]
    return max(sums) - min(sums)


def contiguous_partitions(n: int, k: int) -> list[list[int]]:
    """The unbalanced split: part ``r`` holds rows ``[r n/k, (r+1) n/k)``."""
    if k < 1 or n % k:
        raise ValueError(f"cannot split {n} rows into {k} equal parts")
    per = n // k
    return [list(range(r * per, (r + 1) * per)) for r in range(k)]


def seqlen_balance_metrics(
    lengths: Sequence[int], balanced: Sequence[Sequence[int]]
) -> dict[str, float]:
    """verl's ``global_seqlen/*``: tokens per process of the contiguous split and of
    ``balanced`` (both with ``len(balanced)`` processes).

    Returns:
        ``global_seqlen/min``, ``max``, ``minmax_diff`` (contiguous shards),
        ``balanced_min``, ``balanced_max`` (the balanced parts) and ``mean`` (tokens per
        process, the same either way).
    """
    k = len(balanced)
    before = [sum(lengths[i] for i in rows) for rows in contiguous_partitions(len(lengths), k)]
    after = [sum(lengths[i] for i in rows) for rows in balanced]
    return {
        "global_seqlen/min": float(min(before)),
        "global_seqlen/max": float(max(before)),
        "global_seqlen/minmax_diff": float(max(before) - min(before)),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": sum(before) / k,
    }
