"""Time every registered advantage estimator against its loop reference and a copy floor.

Run from the repository root::

    .venv/bin/python benchmarks/estimators.py                 # B=512, T=4096, float32
    .venv/bin/python benchmarks/estimators.py --batch 64 --length 512 --mask multi_turn

For each estimator it prints one Markdown row: the median time of the
vectorised estimator, of the memory-copy floor (cloning the tensors that
estimator reads), of the loop reference in ``tests/reference/estimator_loops.py``
(verl's formulas, step by step), their ratios, and the largest difference from
the reference on valid tokens (a sanity check that both computed the same
thing). Floor and estimator are timed alternately, so background load hits
both alike. Slow loop references can be timed on the first ``--reference-rows``
rows and scaled linearly to the full batch (marked "scaled" in the table).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path, and its own name
# ("estimators") would shadow the package it benchmarks.
if sys.path and Path(sys.path[0]).resolve() == _ROOT / "benchmarks":
    sys.path[0] = str(_ROOT)
elif str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402

import estimators  # noqa: E402
from rlkit.registry import ESTIMATORS  # noqa: E402
from tests.reference import estimator_loops  # noqa: E402

#: Estimator-specific settings used in the benchmark (others take the defaults).
SETTINGS: dict[str, dict[str, float]] = {
    "gae": {"gamma": 0.99, "lam": 0.95},
    "reinforce_plus_plus": {"gamma": 0.99},
}
#: The ratio to the copy floor every estimator should stay within.
TARGET_RATIO = 10.0
GROUP_SIZE = 8


def make_inputs(batch: int, length: int, mask_kind: str, seed: int = 0) -> dict[str, Any]:
    """Synthetic RL batch: groups of 8, random response lengths, dense rewards, a critic.

    Args:
        batch: B.
        length: T.
        mask_kind: "right_padded" (one response per row, then padding) or
            "multi_turn" (also interior mask-0 observation spans).
        seed: torch seed.

    Returns:
        The estimator keyword inputs: token_level_rewards, response_mask (bool),
        index, values, reward_baselines.
    """
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(length // 4, 1), length + 1, (batch,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    if mask_kind == "multi_turn":
        # Observation spans: every 64-token block after the first is masked with prob. 1/3.
        blocks = torch.rand(batch, -(-length // 64), generator=gen) < 1 / 3
        blocks[:, 0] = False
        mask &= ~blocks.repeat_interleave(64, dim=1)[:, :length]
    rewards = 0.01 * torch.randn(batch, length, generator=gen) * mask
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    rewards += last * torch.randint(0, 2, (batch, 1), generator=gen)
    return {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": torch.arange(batch) // GROUP_SIZE,
        "values": torch.randn(batch, length, generator=gen),
        "reward_baselines": torch.rand(batch, generator=gen),
    }


#: "wall": elapsed time; "cpu": CPU time of this process (all threads), which
#: background load on a shared machine does not inflate.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


def _seconds(fn: Callable[[], Any]) -> float:
    start = _clock()
    fn()
    return _clock() - start


def _read_inputs(name: str, inputs: dict[str, Any]) -> list[torch.Tensor]:
    tensors = [inputs["token_level_rewards"], inputs["response_mask"]]
    if name == "gae":
        tensors.append(inputs["values"])
    if name == "remax":
        tensors.append(inputs["reward_baselines"])
    return tensors + [inputs[key] for key in _declared(name)]


def _declared(name: str) -> tuple[str, ...]:
    """The extra (B, T) inputs the estimator declares with ``inputs=(...)``."""
    return tuple(ESTIMATORS.entry(name).extra.get("inputs", ()))


def _with_declared(name: str, inputs: dict[str, Any], seed: int = 1) -> dict[str, Any]:
    """``inputs`` plus a small dense (B, T) tensor for each input the estimator declares."""
    gen = torch.Generator().manual_seed(seed)
    mask = inputs["response_mask"]
    extra = {key: 0.01 * torch.randn(mask.shape, generator=gen) * mask for key in _declared(name)}
    return {**inputs, **extra}


def _rows(inputs: dict[str, Any], rows: int) -> dict[str, Any]:
    return {key: value[:rows] for key, value in inputs.items()}


def _max_difference(ours: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> float:
    if not mask.any():
        return 0.0
    scale = max(1.0, reference[mask].abs().max().item())
    return ((ours - reference)[mask].abs().max() / scale).item()


def benchmark_one(
    name: str, inputs: dict[str, Any], repeats: int, reference_rows: int
) -> dict[str, Any]:
    """Median timings of one estimator, its copy floor and its loop reference.

    Returns:
        name, ms, floor_ms, reference_ms, reference_scaled (bool) and max_diff
        (largest |ours - reference| on valid tokens, relative to max(1, |ref|)).
    """
    fn = estimators.get(name)
    settings = SETTINGS.get(name, {})
    inputs = _with_declared(name, inputs)
    read = _read_inputs(name, inputs)
    run = lambda: fn(**inputs, **settings)  # noqa: E731
    copy = lambda: [t.clone() for t in read]  # noqa: E731
    run(), copy()  # warm-up
    ours, floor = [], []
    for _ in range(repeats):
        floor.append(_seconds(copy))
        ours.append(_seconds(run))
    batch = inputs["response_mask"].shape[0]
    # Whole groups only: a cut group would be a singleton, where verl differs on purpose.
    rows = min(batch, max(GROUP_SIZE, reference_rows - reference_rows % GROUP_SIZE))
    sub = _rows(inputs, rows)
    reference = lambda: estimator_loops.call(name, sub, **settings)  # noqa: E731
    ref_times = [_seconds(reference) for _ in range(max(1, min(repeats, 3)))]
    ref_ms = statistics.median(ref_times) * 1e3 * batch / max(rows, 1)
    ours_out, ref_out = fn(**sub, **settings)[0], reference()[0]
    return {
        "name": name,
        "ms": statistics.median(ours) * 1e3,
        "floor_ms": statistics.median(floor) * 1e3,
        "reference_ms": ref_ms,
        "reference_scaled": rows < batch,
        "max_diff": _max_difference(ours_out, ref_out, sub["response_mask"]),
    }


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown table of :func:`benchmark_one` results, one row per estimator."""
    lines = [
        "| estimator | ms | copy floor ms | x floor | loop ref. ms | loop / ours | max diff vs loop |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = r["ms"] / r["floor_ms"] if r["floor_ms"] > 0 else float("inf")
        flag = "" if ratio <= TARGET_RATIO else " (over target)"
        scaled = " (scaled)" if r["reference_scaled"] else ""
        lines.append(
            f"| {r['name']} | {r['ms']:.2f} | {r['floor_ms']:.2f} | {ratio:.1f}{flag} | "
            f"{r['reference_ms']:.1f}{scaled} | {r['reference_ms'] / r['ms']:.0f}x | "
            f"{r['max_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run every registered estimator, print the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512, help="B (default 512)")
    parser.add_argument("--length", type=int, default=4096, help="T (default 4096)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per estimator")
    parser.add_argument("--mask", choices=("right_padded", "multi_turn"), default="right_padded")
    parser.add_argument(
        "--reference-rows",
        type=int,
        default=512,
        help="time loop references on this many rows and scale linearly to B",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall time, or process CPU time (robust to other load on a shared machine)",
    )
    parser.add_argument(
        "--only", nargs="*", default=None, help="estimator names (default: all registered)"
    )
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    inputs = make_inputs(args.batch, args.length, args.mask)
    names = args.only or estimators.names()
    print(
        f"B={args.batch} T={args.length} float32, {args.mask} bool mask, "
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), "
        f"{args.clock} clock, median of {args.repeats}"
    )
    print()
    results = [benchmark_one(n, inputs, args.repeats, args.reference_rows) for n in names]
    print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
