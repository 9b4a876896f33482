"""Where one GRPO step's time goes, phase by phase: ``torch.profiler`` on a warm rlkit step.

Usage::

    .venv/bin/python benchmarks/profile_step.py [--workload tiny|realistic|gsm8k_like]
        [--warm-steps 3] [--profiled-steps 2] [any size flag of e2e_grpo_vs_trl.py]

Runs rlkit's ``RLTrainer`` on the same workload as ``benchmarks/e2e_grpo_vs_trl.py`` (same
flags, same model) in this process, one torch thread by default. After ``--warm-steps``
unprofiled steps it times ``--profiled-steps`` more twice: plain (wall seconds per phase
and the minor page faults each phase takes, i.e. fresh memory the allocator had to fault
in), then under ``torch.profiler``. Each phase is a profiler range (``phase/<name>``,
:class:`rlkit.trainer.timing.PhaseTimer`); every operator's own (self) time is charged to
the phase it started in and sorted into a category:

- matmul: ``mm``/``addmm``/``bmm`` and linear layers on packed weights, with the GFLOP/s
  they reached (from their shapes) against this machine's 1024 x 1024 rate (:func:`e2e_grpo_vs_trl.matmul_bound`);
- attention: the scaled-dot-product kernels, forward and backward;
- optimizer: everything inside ``Optimizer.step``;
- elementwise: arithmetic, norms, activations, reductions and their backward ops;
- data movement: copies, indexing, concatenation, fills;
- tensor bookkeeping: views, strides, empty allocations (no arithmetic);
- outside operators: the phase's wall time that no operator accounts for, i.e. Python,
  the autograd engine's own work and the profiler's per-operator cost.

Prints the table per phase (profiled milliseconds and shares; the plain run's milliseconds
beside them show how much the profiler itself added) and each phase's top operators.
"""

from __future__ import annotations

import argparse
import collections
import math
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The repository root first (see e2e_grpo_vs_trl.py), this folder last.
sys.path.insert(0, str(_HERE.parent))
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

from e2e_grpo_vs_trl import matmul_bound, parse_args, prepare_model  # noqa: E402
from e2e_workloads import Workload, rlkit_config  # noqa: E402

MATMUL_OPS = frozenset(
    {
        "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmm_",
        "mkldnn::_linear_pointwise",  # a linear layer on a packed weight (packed_linear.py)
    }
)  # fmt: skip
MOVEMENT_OPS = frozenset(
    {
        "aten::copy_", "aten::index", "aten::_index_put_impl_", "aten::index_select",
        "aten::cat", "aten::fill_", "aten::zero_", "aten::clone", "aten::gather",
        "aten::scatter", "aten::scatter_add_", "aten::index_add_", "aten::masked_fill_",
        "aten::embedding_dense_backward", "aten::_to_copy", "aten::contiguous",
        "aten::_unsafe_index", "aten::masked_select", "aten::nonzero",
        "mkldnn::_reorder_linear_weight",
    }
)  # fmt: skip
BOOKKEEPING_OPS = frozenset(
    {
        "aten::view", "aten::as_strided", "aten::transpose", "aten::slice", "aten::reshape",
        "aten::t", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::expand",
        "aten::permute", "aten::empty", "aten::empty_strided", "aten::_unsafe_view",
        "aten::detach", "detach", "aten::alias", "aten::to", "aten::resize_", "aten::split",
        "aten::narrow", "aten::unbind", "aten::chunk", "aten::flatten", "aten::empty_like",
        "aten::new_empty", "aten::new_empty_strided", "aten::result_type", "aten::lift_fresh",
        "aten::split_with_sizes", "aten::_reshape_alias", "aten::matmul", "aten::linear",
        "aten::scaled_dot_product_attention", "aten::item", "aten::_local_scalar_dense",
    }
)  # fmt: skip
CATEGORIES = (
    "matmul", "attention", "optimizer", "elementwise", "data movement",
    "tensor bookkeeping", "outside operators",
)  # fmt: skip


def category(name: str, in_optimizer: bool) -> str:
    """The category of an operator (see the module docs)."""
    if in_optimizer:
        return "optimizer"
    if name in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in name:
        return "attention"
    if name in MOVEMENT_OPS:
        return "data movement"
    if name in BOOKKEEPING_OPS:
        return "tensor bookkeeping"
    return "elementwise"


def matmul_flops(name: str, shapes: list) -> int:
    """FLOPs of one ``mm``/``addmm``/``bmm``/packed linear from its recorded input shapes
    (0 if unknown)."""
    try:
        if name == "mkldnn::_linear_pointwise":  # input (..., k), packed weight (n, k)
            *rows, k = shapes[0]
            return 2 * math.prod(rows) * k * shapes[1][0]
        if name in ("aten::mm",):
            (m, k), (_, n) = shapes[0], shapes[1]
            return 2 * m * k * n
        if name in ("aten::addmm", "aten::addmm_"):
            (m, k), (_, n) = shapes[1], shapes[2]
            return 2 * m * k * n
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (shapes[0], shapes[1]) if name == "aten::bmm" else (shapes[1], shapes[2])
            return 2 * a[0] * a[1] * a[2] * b[2]
    except (IndexError, TypeError, ValueError):
        return 0
    return 0


@contextmanager
def counting_faults(faults: dict[str, int]) -> Iterator[None]:
    """Adds each phase's minor page faults to ``faults`` while the block runs."""
    from rlkit.trainer import timing

    plain = timing.PhaseTimer.__call__

    @contextmanager
    def counted(self: timing.PhaseTimer, phase: str) -> Iterator[None]:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with plain(self, phase):
            yield
        after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        faults[phase] = faults.get(phase, 0) + after - before

    timing.PhaseTimer.__call__ = counted
    try:
        yield
    finally:
        timing.PhaseTimer.__call__ = plain


def phase_breakdown(events: list) -> dict[str, dict]:
    """Per phase: wall µs, self µs per category, matmul FLOPs and the top operators."""
    ranges = [
        (e.name[len("phase/") :], e.time_range) for e in events if e.name.startswith("phase/")
    ]
    optimizer = [e.time_range for e in events if e.name.startswith("Optimizer.step")]
    out: dict[str, dict] = {}
    for phase, span in ranges:
        if phase in ("step", "generate_sequences"):
            continue  # "step" holds every phase; "generate_sequences" is "gen" again
        row = out.setdefault(
            phase,
            {"wall": 0.0, "cats": collections.Counter(), "flops": 0, "ops": collections.Counter()},
        )
        row["wall"] += span.end - span.start
    for e in events:
        if e.name.startswith("phase/") or e.name.startswith("Optimizer.step"):
            continue
        start = e.time_range.start
        phase = next((p for p, s in ranges if p in out and s.start <= start < s.end), None)
        if phase is None:
            continue
        in_opt = any(s.start <= start < s.end for s in optimizer)
        cat = category(e.name, in_opt)
        row = out[phase]
        row["cats"][cat] += e.self_cpu_time_total
        row["ops"][e.name] += e.self_cpu_time_total
        if cat == "matmul":
            row["flops"] += matmul_flops(e.name, e.input_shapes)
    for row in out.values():
        row["cats"]["outside operators"] = max(0.0, row["wall"] - sum(row["cats"].values()))
    return out


def report(
    breakdown: dict[str, dict], plain_s: dict[str, float], faults: dict[str, int],
    bound: float, steps: int,
) -> str:  # fmt: skip
    """The per-phase category table and top operators, as Markdown (per step)."""
    lines = [
        f"matmul bound (1024 x 1024, this machine, same threads): {bound / 1e9:.1f} GFLOP/s; "
        f"times per step, mean of {steps} profiled step(s)",
        "",
        "| phase | plain ms | profiled ms | page faults | "
        + " | ".join(CATEGORIES)
        + " | matmul GFLOP/s | of bound |",
        "|---|---:|---:|---:|" + "---:|" * len(CATEGORIES) + "---:|---:|",
    ]
    for phase, row in sorted(breakdown.items(), key=lambda kv: -kv[1]["wall"]):
        wall = row["wall"]
        if wall < 1000 * steps:  # under 1 ms a step: nothing to see
            continue
        cells = [
            f"{row['cats'][c] / 1e3 / steps:,.0f} ({row['cats'][c] / wall:.0%})" for c in CATEGORIES
        ]
        mm_us = row["cats"]["matmul"]
        rate = row["flops"] / (mm_us * 1e-6) if mm_us else 0.0
        lines.append(
            f"| {phase} | {1e3 * plain_s.get(phase, 0.0) / steps:,.0f} | {wall / 1e3 / steps:,.0f} | "
            f"{faults.get(phase, 0) // steps:,} | "
            + " | ".join(cells)
            + f" | {rate / 1e9:.1f} | {rate / bound:.0%} |"
        )
    for phase, row in sorted(breakdown.items(), key=lambda kv: -kv[1]["wall"]):
        if row["wall"] < 1000 * steps:
            continue
        lines += ["", f"top operators in {phase} (self ms per step):"]
        for name, us in row["ops"].most_common(12):
            lines.append(f"  {name:60s} {us / 1e3 / steps:9.1f}  {us / row['wall']:5.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--warm-steps", type=int, default=3, help="unprofiled steps first")
    own.add_argument("--profiled-steps", type=int, default=2, help="steps timed and profiled")
    mine, rest = own.parse_known_args(argv)
    if mine.warm_steps < 1 or mine.profiled_steps < 1:
        own.error("--warm-steps and --profiled-steps must be >= 1")
    args = parse_args(rest)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlkit.trainer.trainer import RLTrainer

    torch.set_num_threads(args.threads)
    total = mine.warm_steps + 2 * mine.profiled_steps
    workload = Workload.from_args(args, model_dir=prepare_model(args), steps=total)
    with tempfile.TemporaryDirectory(prefix="profile_step_") as out_dir:
        trainer = RLTrainer(rlkit_config(workload, out_dir))
        trainer.setup()
        try:
            for _ in range(mine.warm_steps):
                trainer.step()
            plain_s: dict[str, float] = collections.Counter()
            faults: dict[str, int] = {}
            with counting_faults(faults):
                for _ in range(mine.profiled_steps):
                    metrics = trainer.step()
                    for key, value in metrics.items():
                        if key.startswith("timing_s/"):
                            plain_s[key.removeprefix("timing_s/")] += value
            started = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                for _ in range(mine.profiled_steps):
                    trainer.step()
            profiled_wall = time.perf_counter() - started
        finally:
            trainer.cleanup()
    print(
        f"GRPO step, {workload.rows_per_step} rows, <= {workload.max_completion_length} new "
        f"tokens, hidden {args.hidden_size} x {args.layers} layers, mixed precision "
        f"{workload.mixed_precision!r}, {args.threads} thread(s); profiled steps took "
        f"{profiled_wall / mine.profiled_steps:.2f} s each, plain ones "
        f"{plain_s['step'] / mine.profiled_steps:.2f} s\n"
    )
    bound = matmul_bound(args.threads, workload.mixed_precision)
    print(report(phase_breakdown(prof.events()), plain_s, faults, bound, mine.profiled_steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
