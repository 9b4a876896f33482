"""Benchmark every registered policy loss: forward + backward at (B, T) float32.

Usage::

    .venv/bin/python benchmarks/losses.py [--batch 512 --length 4096 --repeats 5]
        [--threads 1] [--device cpu|cuda] [--no-loop]

For each loss it reports the median time of ``loss, _ = fn(...);
loss.backward()`` (process CPU time on CPU, synchronised wall time on CUDA),
the memory-copy floor (cloning the four (B, T) inputs, the least any loss must
touch; timed alternately with the loss so that machine load affects both
alike) and the ratio between them; the loop reference
(``tests/reference/loss_loops.py``) timed on a small float64 sub-batch and
scaled linearly to the full size (it would take days otherwise); and the
difference between the loss and its loop reference on that sub-batch. Prints a
Markdown table. Target: every loss within 20x the copy floor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import algorithms  # noqa: E402
from tests.reference import loss_loops  # noqa: E402

#: Loss-specific options (the defaults, spelt out).
OPTIONS: dict[str, dict[str, object]] = {
    "kl_cov": {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1},
    "clip_cov": {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
}
#: Tokens the loop reference is timed on (then scaled to B·T).
LOOP_TOKENS = 256


def make_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random (B, T) float32 inputs with ~20 % right padding and a few empty rows."""
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(batch, length, generator=gen) * 0.5 - 2.0
    new = old + 0.1 * torch.randn(batch, length, generator=gen)
    adv = torch.randn(batch, 1, generator=gen).expand(batch, length).contiguous()
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[: max(1, batch // 10)] = length  # some full-length rows
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return {"old": old, "new": new, "adv": adv, "mask": mask}


class Clock:
    """Process CPU time on CPU (robust to other jobs sharing the cores), or
    synchronised wall time on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.name = "CPU time" if device.type == "cpu" else "wall time (synchronised)"

    def now(self) -> float:
        if self.device.type == "cpu":
            return time.process_time()
        torch.cuda.synchronize(self.device)
        return time.perf_counter()


def median_ms(fn: Callable[[], object], repeats: int, clock: Clock) -> float:
    """Median time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = clock.now()
        fn()
        times.append(clock.now() - start)
    return 1e3 * statistics.median(times)


def paired_median_ms(
    fn: Callable[[], object], floor: Callable[[], object], repeats: int, clock: Clock
) -> tuple[float, float]:
    """Medians of ``fn`` and ``floor``, timed alternately so load affects both alike."""
    fn(), floor()
    fn_times, floor_times = [], []
    for _ in range(repeats):
        for call, times in ((floor, floor_times), (fn, fn_times)):
            start = clock.now()
            call()
            times.append(clock.now() - start)
    return 1e3 * statistics.median(fn_times), 1e3 * statistics.median(floor_times)


def copy_floor(inputs: dict[str, torch.Tensor]) -> Callable[[], object]:
    """Cloning every input once: a lower bound for any loss."""
    return lambda: [t.clone() for t in inputs.values()]


def time_loss(
    name: str, inputs: dict[str, torch.Tensor], repeats: int, clock: Clock
) -> tuple[float, float]:
    """Median ms of forward + backward of loss ``name``, and of the copy floor."""
    fn = algorithms.get_loss(name)
    options = dict(OPTIONS.get(name, {}))
    if name == "clip_cov":
        options["generator"] = torch.Generator(inputs["new"].device).manual_seed(0)
    new = inputs["new"].clone().requires_grad_()

    def step() -> None:
        new.grad = None
        loss, _ = fn(inputs["old"], new, inputs["adv"], inputs["mask"], **options)
        loss.backward()

    return paired_median_ms(step, copy_floor(inputs), repeats, clock)


def _loop_loss(name: str, sub: dict[str, torch.Tensor], new: torch.Tensor) -> torch.Tensor:
    ref = getattr(loss_loops, name)
    args = (sub["old"], new, sub["adv"], sub["mask"])
    if name == "clip_cov":
        return ref(*args, torch.Generator().manual_seed(0))[0]
    return ref(*args)[0]


def _vectorised_loss(name: str, sub: dict[str, torch.Tensor]) -> torch.Tensor:
    options = dict(OPTIONS.get(name, {}))
    if name == "clip_cov":
        options["generator"] = torch.Generator().manual_seed(0)
    return algorithms.get_loss(name)(sub["old"], sub["new"], sub["adv"], sub["mask"], **options)[0]


def loop_reference(
    name: str, batch: int, length: int, repeats: int, clock: Clock
) -> tuple[float, float] | None:
    """The loop reference on ~LOOP_TOKENS float64 tokens: (ms scaled to batch·length,
    |vectorised − loop| of the loss on that sub-batch)."""
    if not hasattr(loss_loops, name):
        return None
    sub_length = min(length, LOOP_TOKENS)
    sub_batch = max(1, min(batch, LOOP_TOKENS // sub_length))
    sub = {
        k: v.double() if v.is_floating_point() else v
        for k, v in make_inputs(sub_batch, sub_length, seed=1).items()
    }
    new = sub["new"].clone().requires_grad_()
    ms = median_ms(lambda: _loop_loss(name, sub, new).backward(), max(1, repeats // 2), clock)
    loop_loss = _loop_loss(name, sub, new).detach()
    difference = abs(float(_vectorised_loss(name, sub).detach()) - float(loop_loss))
    return ms * (batch * length) / (sub_batch * sub_length), difference


def run(
    batch: int, length: int, repeats: int, *, loop: bool = True, device: str = "cpu"
) -> list[dict[str, object]]:
    """Time every registered loss; one row per loss."""
    torch.manual_seed(0)
    clock, cpu = Clock(torch.device(device)), Clock(torch.device("cpu"))
    inputs = {k: v.to(device) for k, v in make_inputs(batch, length).items()}
    rows = []
    for name in algorithms.loss_names():
        ms, floor = time_loss(name, inputs, repeats, clock)
        ref = loop_reference(name, batch, length, repeats, cpu) if loop else None
        loop_ms, difference = ref if ref is not None else (None, None)
        rows.append(
            {"loss": name, "ms": ms, "floor_ms": floor, "loop_ms": loop_ms, "diff": difference}
        )
    return rows


def markdown(rows: list[dict[str, object]], batch: int, length: int, device: str) -> str:
    """The results as a Markdown table."""
    clock = Clock(torch.device(device)).name
    lines = [
        f"B={batch}, T={length}, float32, forward + backward on {device}, median {clock} "
        f"(torch threads={torch.get_num_threads()}); loop reference (CPU) timed on "
        f"{LOOP_TOKENS} float64 tokens and scaled linearly; last column: |loss − loop "
        f"reference's| on that sub-batch",
        "",
        "| loss | ms | copy floor ms | x floor | loop ref ms (scaled) | loop / vectorised "
        "| abs diff vs loop |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        loop = r["loop_ms"]
        loop_cells = (
            f"{loop:,.0f} | {loop / r['ms']:,.0f}x | {r['diff']:.1e}"
            if loop is not None
            else "- | - | -"
        )
        ratio = r["ms"] / r["floor_ms"]
        lines.append(
            f"| {r['loss']} | {r['ms']:.1f} | {r['floor_ms']:.1f} | {ratio:.1f} | {loop_cells} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: process CPU time then excludes OpenMP "
        "spin-waiting and stays meaningful when other jobs share the cores)",
    )
    parser.add_argument("--no-loop", action="store_true", help="skip the loop reference")
    args = parser.parse_args(argv)
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        rows = run(args.batch, args.length, args.repeats, loop=not args.no_loop, device=args.device)
        print(markdown(rows, args.batch, args.length, args.device))
    finally:
        torch.set_num_threads(previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
