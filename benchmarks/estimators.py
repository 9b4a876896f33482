"""Time every registered advantage estimator: plain vs fused math, a loop reference, a copy floor.

Run from the repository root::

    .venv/bin/python benchmarks/estimators.py                 # B=512, T=4096, float32
    .venv/bin/python benchmarks/estimators.py --sizes 64x1024 512x4096 --clock cpu
    .venv/bin/python benchmarks/estimators.py --batch 64 --length 512 --mask multi_turn

For each size and estimator it prints one Markdown row: the median time of the
estimator with the default math (the fused scan where the estimator keeps one,
``estimators.math_mode.FUSED_PATHS``) and, for those, with the plain loop over time
(``estimators.plain_math()``) and their ratio (a fused path stays only while plain /
fused >= 1.2 at realistic sizes); the memory-copy floor (cloning the tensors that
estimator reads); the loop reference in ``estimators/reference/estimator_loops.py``
(verl's formulas, step by step); their ratios; and the largest difference from the
reference on valid tokens (a sanity check that both computed the same thing). The
variants and the floor are timed alternately, so background load hits all alike.
Slow loop references can be timed on the first ``--reference-rows`` rows and scaled
linearly to the full batch (marked "scaled" in the table). Each table is headed by
the CPU's model name (``/proc/cpuinfo``).
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
from benchmarks.host_cpu import cpu_name  # noqa: E402
from estimators import math_mode  # noqa: E402
from estimators.reference import estimator_loops  # noqa: E402
from rlkit.registry import ESTIMATORS  # noqa: E402

#: Estimator-specific settings used in the benchmark (others take the defaults).
SETTINGS: dict[str, dict[str, float]] = {
    "gae": {"gamma": 0.99, "lam": 0.95},
    "reinforce_plus_plus": {"gamma": 0.99},
}
#: The ratio to the copy floor every estimator should stay within.
TARGET_RATIO = 10.0
#: The least plain / fused ratio for which a fused path is worth keeping.
KEEP_FUSED_RATIO = 1.2
GROUP_SIZE = 8


def parse_size(text: str) -> tuple[int, int]:
    """``"64x1024"`` -> (64, 1024)."""
    batch, _, length = text.lower().partition("x")
    return int(batch), int(length)


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


def _with_math(mode: str, run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` wrapped to execute with ``mode``'s math (``estimators.math_mode``)."""

    def call() -> Any:
        with math_mode.use_math(mode):
            return run()

    return call


def benchmark_one(
    name: str, inputs: dict[str, Any], repeats: int, reference_rows: int
) -> dict[str, Any]:
    """Median timings of one estimator (default and plain math), its copy floor and
    its loop reference.

    Returns:
        name, ms (default math), plain_ms (None without a fused path), floor_ms,
        reference_ms, reference_scaled (bool) and max_diff (largest |ours - reference|
        on valid tokens, relative to max(1, |ref|)).
    """
    fn = estimators.get(name)
    settings = SETTINGS.get(name, {})
    inputs = _with_declared(name, inputs)
    read = _read_inputs(name, inputs)
    run = lambda: fn(**inputs, **settings)  # noqa: E731
    variants = {
        "floor_ms": lambda: [t.clone() for t in read],
        "ms": _with_math("fused", run),
    }
    if name in math_mode.FUSED_PATHS:
        variants["plain_ms"] = _with_math("plain", run)
    for call in variants.values():
        call()  # warm-up
    times: dict[str, list[float]] = {key: [] for key in variants}
    for _ in range(repeats):
        for key, call in variants.items():
            times[key].append(_seconds(call))
    medians = {key: statistics.median(t) * 1e3 for key, t in times.items()}
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
        "ms": medians["ms"],
        "plain_ms": medians.get("plain_ms"),
        "floor_ms": medians["floor_ms"],
        "reference_ms": ref_ms,
        "reference_scaled": rows < batch,
        "max_diff": _max_difference(ours_out, ref_out, sub["response_mask"]),
    }


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown table of :func:`benchmark_one` results, one row per estimator."""
    lines = [
        "| estimator | default path | ms | plain ms | plain / fused | copy floor ms | x floor "
        "| loop ref. ms | loop / ours | max diff vs loop |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = r["ms"] / r["floor_ms"] if r["floor_ms"] > 0 else float("inf")
        flag = "" if ratio <= TARGET_RATIO else " (over target)"
        scaled = " (scaled)" if r["reference_scaled"] else ""
        plain = r["plain_ms"]
        plain_cells = (
            f"fused | {r['ms']:.2f} | {plain:.2f} | {plain / r['ms']:.2f}"
            if plain is not None
            else f"plain only | {r['ms']:.2f} | - | -"
        )
        lines.append(
            f"| {r['name']} | {plain_cells} | {r['floor_ms']:.2f} | {ratio:.1f}{flag} | "
            f"{r['reference_ms']:.1f}{scaled} | {r['reference_ms'] / r['ms']:.0f}x | "
            f"{r['max_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run every registered estimator, print the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512, help="B (default 512)")
    parser.add_argument("--length", type=int, default=4096, help="T (default 4096)")
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help="sizes BxT to run in turn, e.g. 64x1024 512x4096 (overrides --batch/--length)",
    )
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
    names = args.only or estimators.names()
    sizes = [parse_size(t) for t in args.sizes] if args.sizes else [(args.batch, args.length)]
    for batch, length in sizes:
        inputs = make_inputs(batch, length, args.mask)
        print(
            f"B={batch} T={length} float32, {args.mask} bool mask, {cpu_name()}, "
            f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), "
            f"{args.clock} clock, median of {args.repeats}; ms: the default math (the "
            f"fused scan where the estimator keeps one)"
        )
        print()
        results = [benchmark_one(n, inputs, args.repeats, args.reference_rows) for n in names]
        print(format_table(results))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
