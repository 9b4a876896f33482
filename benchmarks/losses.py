"""Benchmark every registered policy loss: forward + backward, plain vs fused math, at (B, T).

Usage::

    .venv/bin/python benchmarks/losses.py [--sizes 64x1024 512x4096 --repeats 5]
        [--batch 512 --length 4096] [--threads 1] [--device cpu|cuda] [--no-loop]

For each size and loss it reports, in float32:

* the median time of ``loss, _ = fn(...); loss.backward()`` with the default math
  (the fused path where the loss keeps one, ``algorithms.math_mode.FUSED_PATHS``) and,
  for those losses, with the plain math (``algorithms.plain_math()``), and their ratio:
  a fused path stays only while plain / fused >= 1.2 at realistic sizes. Process CPU
  time on CPU, synchronised wall time on CUDA; the variants are timed alternately,
  with the memory-copy floor (cloning the four (B, T) inputs, the least any loss must
  touch), so machine load affects all alike;
* the memory autograd keeps for the backward pass (the tensors saved by the forward,
  the inputs themselves not counted), for both maths;
* the loop reference (``algorithms/reference/policy_loss_loops.py``) timed on a small
  float64 sub-batch and scaled linearly to the full size (it would take days
  otherwise), and the difference between the loss and its loop reference there.

Prints one Markdown table per size, headed by the CPU's model name
(``/proc/cpuinfo``). Target: every loss within 20x the copy floor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import algorithms  # noqa: E402
from algorithms import math_mode  # noqa: E402
from algorithms.reference import policy_loss_loops  # noqa: E402
from benchmarks.host_cpu import cpu_name  # noqa: E402

#: Loss-specific options (the defaults, spelt out).
OPTIONS: dict[str, dict[str, object]] = {
    "kl_cov": {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1},
    "clip_cov": {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
}
#: Tokens the loop reference is timed on (then scaled to B·T).
LOOP_TOKENS = 256
#: The least plain / fused ratio for which a fused path is worth keeping.
KEEP_FUSED_RATIO = 1.2


def parse_size(text: str) -> tuple[int, int]:
    """``"64x1024"`` -> (64, 1024)."""
    batch, _, length = text.lower().partition("x")
    return int(batch), int(length)


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


def interleaved_median_ms(
    fns: Sequence[Callable[[], object]], repeats: int, clock: Clock
) -> list[float]:
    """Median ms of each of ``fns``, timed in turn within every repeat so that load
    affects all alike (one warm-up call each first)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times):
            start = clock.now()
            fn()
            bucket.append(clock.now() - start)
    return [1e3 * statistics.median(bucket) for bucket in times]


def copy_floor(inputs: dict[str, torch.Tensor]) -> Callable[[], object]:
    """Cloning every input once: a lower bound for any loss."""
    return lambda: [t.clone() for t in inputs.values()]


def _options(name: str, device: torch.device) -> dict[str, object]:
    options = dict(OPTIONS.get(name, {}))
    if name == "clip_cov":
        options["generator"] = torch.Generator(device).manual_seed(0)
    return options


def loss_step(name: str, inputs: dict[str, torch.Tensor], *, plain: bool) -> Callable[[], None]:
    """One forward + backward of loss ``name``, with the plain or the default math."""
    fn = algorithms.get_loss(name)
    new = inputs["new"].clone().requires_grad_()

    def step() -> None:
        new.grad = None
        with math_mode.use_math("plain" if plain else "fused"):
            options = _options(name, new.device)
            loss, _ = fn(inputs["old"], new, inputs["adv"], inputs["mask"], **options)
        loss.backward()

    return step


def saved_megabytes(name: str, inputs: dict[str, torch.Tensor], *, plain: bool) -> float:
    """MB of the tensors autograd saves for the backward pass (inputs not counted)."""
    new = inputs["new"].clone().requires_grad_()
    known = {t.untyped_storage().data_ptr() for t in (*inputs.values(), new)}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in known:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
    with hooks, math_mode.use_math("plain" if plain else "fused"):
        options = _options(name, new.device)
        loss, _ = algorithms.get_loss(name)(
            inputs["old"], new, inputs["adv"], inputs["mask"], **options
        )
    loss.backward()
    return sum(saved.values()) / 2**20


def time_loss(
    name: str, inputs: dict[str, torch.Tensor], repeats: int, clock: Clock
) -> dict[str, float | None]:
    """Median ms of the default math, the plain math (None without a fused path) and
    the copy floor; saved-for-backward MB of each math."""
    has_fused = name in math_mode.FUSED_PATHS
    steps = [copy_floor(inputs), loss_step(name, inputs, plain=False)]
    if has_fused:
        steps.append(loss_step(name, inputs, plain=True))
    floor, ms, *plain = interleaved_median_ms(steps, repeats, clock)
    return {
        "ms": ms,
        "floor_ms": floor,
        "plain_ms": plain[0] if plain else None,
        "saved_mb": saved_megabytes(name, inputs, plain=False),
        "plain_saved_mb": saved_megabytes(name, inputs, plain=True) if has_fused else None,
    }


def _loop_loss(name: str, sub: dict[str, torch.Tensor], new: torch.Tensor) -> torch.Tensor:
    ref = getattr(policy_loss_loops, name)
    args = (sub["old"], new, sub["adv"], sub["mask"])
    if name == "clip_cov":
        return ref(*args, torch.Generator().manual_seed(0))[0]
    return ref(*args)[0]


def _vectorised_loss(name: str, sub: dict[str, torch.Tensor]) -> torch.Tensor:
    options = _options(name, torch.device("cpu"))
    return algorithms.get_loss(name)(sub["old"], sub["new"], sub["adv"], sub["mask"], **options)[0]


def loop_reference(
    name: str, batch: int, length: int, repeats: int, clock: Clock
) -> tuple[float, float] | None:
    """The loop reference on ~LOOP_TOKENS float64 tokens: (ms scaled to batch·length,
    |vectorised − loop| of the loss on that sub-batch)."""
    if not hasattr(policy_loss_loops, name):
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
    """Time every registered loss at (batch, length); one row per loss."""
    torch.manual_seed(0)
    clock, cpu = Clock(torch.device(device)), Clock(torch.device("cpu"))
    inputs = {k: v.to(device) for k, v in make_inputs(batch, length).items()}
    rows = []
    for name in algorithms.loss_names():
        row: dict[str, object] = {"loss": name, **time_loss(name, inputs, repeats, clock)}
        ref = loop_reference(name, batch, length, repeats, cpu) if loop else None
        row["loop_ms"], row["diff"] = ref if ref is not None else (None, None)
        rows.append(row)
    return rows


def _cells(row: dict[str, object]) -> list[str]:
    ms, floor, plain = row["ms"], row["floor_ms"], row["plain_ms"]
    path = "fused" if plain is not None else "plain only"
    cells = [str(row["loss"]), path, f"{ms:.1f}"]
    if plain is None:
        cells += ["-", "-", f"{row['saved_mb']:.1f}", "-"]
    else:
        cells += [
            f"{plain:.1f}",
            f"{plain / ms:.2f}",
            f"{row['saved_mb']:.1f}",
            f"{row['plain_saved_mb']:.1f}",
        ]
    cells += [f"{floor:.1f}", f"{ms / floor:.1f}"]
    loop = row["loop_ms"]
    if loop is None:
        return cells + ["-", "-", "-"]
    return cells + [f"{loop:,.0f}", f"{loop / ms:,.0f}x", f"{row['diff']:.1e}"]


def markdown(rows: list[dict[str, object]], batch: int, length: int, device: str) -> str:
    """The results as a Markdown table."""
    clock = Clock(torch.device(device)).name
    lines = [
        f"B={batch}, T={length}, float32, forward + backward on {device} ({cpu_name()}), "
        f"median {clock} (torch {torch.__version__}, threads={torch.get_num_threads()}); "
        f"ms: the default math (fused where the loss keeps a fused path); saved MB: "
        f"tensors kept for backward, inputs excluded; loop reference (CPU) timed on "
        f"{LOOP_TOKENS} float64 tokens and scaled linearly; last column: |loss − loop "
        f"reference's| on that sub-batch",
        "",
        "| loss | default path | ms | plain ms | plain / fused | saved MB | plain saved MB "
        "| copy floor ms | x floor | loop ref ms (scaled) | loop / vectorised "
        "| abs diff vs loop |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help="sizes BxT to run in turn, e.g. 64x1024 512x4096 (overrides --batch/--length)",
    )
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
    sizes = [parse_size(s) for s in args.sizes] if args.sizes else [(args.batch, args.length)]
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        for batch, length in sizes:
            rows = run(batch, length, args.repeats, loop=not args.no_loop, device=args.device)
            print(markdown(rows, batch, length, args.device))
            print()
    finally:
        torch.set_num_threads(previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
