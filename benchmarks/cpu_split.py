"""The demo with a started CPU SGLang server: ``sync`` vs ``one_step_off`` at default settings.

Runs ``rlkit train experiments/demo_one_step_off.gin`` as a user would, once per mode, the
modes taking turns round by round. ``one_step_off`` overlaps generation with the update, so
the server and the trainer compute at once; ``RolloutConfig.server_cores = "auto"`` (the
default) gives each its own cores. ``one_step_off:off`` is the same run with
``server_cores = "off"``: both sides on every core, as before the split existed.

    .venv/bin/python benchmarks/cpu_split.py                    # 160 steps x 2 modes, ~7 min
    .venv/bin/python benchmarks/cpu_split.py --steps 30 --modes sync,one_step_off,one_step_off:off

Per run: median seconds per step after ``--warmup`` steps, the wall time of the whole
command, and held-out mean@4 at the last step (256 prompts, temperature 1). Then each
mode's median step time as a speed-up over ``sync`` (``sync`` step s / mode step s) per
round, and the held-out difference to ``sync``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks.host_cpu import cpu_name  # noqa: E402

EXPERIMENT = _ROOT / "experiments" / "demo_one_step_off.gin"
HELD_OUT = "val/arithmetic/mean@4"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--modes",
        default="sync,one_step_off",
        help="comma-separated, sync first; MODE:off runs MODE with server_cores = 'off'",
    )
    p.add_argument(
        "--final-validation-only",
        action="store_true",
        help="evaluate only at the end (no periodic held-out evaluations)",
    )
    p.add_argument("--model", help="a model directory (default: the demo's warm-up model)")
    args = p.parse_args(argv)
    args.modes = args.modes.split(",")
    if args.modes[0] != "sync":
        p.error(f"--modes: sync first; got {args.modes}")
    return args


def run(args: argparse.Namespace, mode: str, out: Path) -> dict[str, float]:
    """One ``rlkit train`` of the demo in ``mode``; its median step, wall time and final
    held-out accuracy."""
    rollout_mode, _, cores = mode.partition(":")
    bindings = [
        f"TrainerConfig.rollout_mode = '{rollout_mode}'",
        f"TrainerConfig.output_dir = '{out}'",
        f"TrainerConfig.total_steps = {args.steps}",
        "TrainerConfig.plot_learning_curve = False",
    ]
    if cores:
        bindings.append(f"RolloutConfig.server_cores = '{cores}'")
    if args.model:
        bindings.append(f"ModelConfig.path = '{args.model}'")
    if args.final_validation_only:
        bindings += ["TrainerConfig.test_freq = 0", "TrainerConfig.val_before_train = False"]
    command = [sys.executable, "-m", "rlkit.train", str(EXPERIMENT)]
    for b in bindings:
        command += ["--gin_param", b]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["timing_s/step"] for r in records if "timing_s/step" in r]
    held_out = [r[HELD_OUT] for r in records if HELD_OUT in r]
    return {
        "step_s": statistics.median(steps[args.warmup :] or steps),
        "wall_s": wall,
        "held_out": held_out[-1] if held_out else float("nan"),
        "split": float("CPU split:" in proc.stdout),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory(prefix="rlkit_cpu_split_") as tmp:
        for r in range(args.rounds):
            for mode in args.modes if r % 2 == 0 else args.modes[::-1]:
                res = run(args, mode, Path(tmp) / f"{mode.replace(':', '_')}_{r}")
                results[mode].append(res)
                print(
                    f"round {r + 1} {mode}: {res['step_s']:.3f} s/step, {res['wall_s']:.0f} s, "
                    f"held-out {res['held_out']:.1%}",
                    flush=True,
                )
    print(
        f"\n{cpu_name()}; experiments/demo_one_step_off.gin, {args.steps} steps "
        f"({args.warmup} warm-up), {args.rounds} round(s)\n"
    )
    print("| mode | cores split | step s | run s | held-out (last) | speed-up vs sync |")
    print("|---|---|---:|---:|---:|---:|")
    sync_step = statistics.median(x["step_s"] for x in results["sync"])
    for mode, runs in results.items():
        step = statistics.median(x["step_s"] for x in runs)
        wall = statistics.median(x["wall_s"] for x in runs)
        held = statistics.median(x["held_out"] for x in runs)
        split = "yes" if all(x["split"] for x in runs) else "no"
        print(
            f"| {mode} | {split} | {step:.3f} | {wall:.0f} | {held:.1%} | {sync_step / step:.2f}x |"
        )
    print()
    for mode in args.modes[1:]:
        ratios = [s["step_s"] / m["step_s"] for s, m in zip(results["sync"], results[mode])]
        gaps = [m["held_out"] - s["held_out"] for s, m in zip(results["sync"], results[mode])]
        print(
            f"{mode}: speed-up per round "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + "; held-out minus sync "
            + ", ".join(f"{100 * g:+.1f} points" for g in gaps)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
