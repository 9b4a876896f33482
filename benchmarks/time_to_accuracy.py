"""Time to held-out accuracy: rlkit's GRPO vs TRL's ``GRPOTrainer``, compute-matched.

Both frameworks train the demo's warm-started model (``arithmetic_sft_model``, the cached
``runs/demo/sft_model``) on the demo's task (two-digit addition, exact-match reward) with
the same GRPO run (``benchmarks/e2e_workloads.py``): prompts per step, group size,
completion length, learning rate, AdamW (fused, no weight decay), clipping at 1.0, one
optimizer step per RL step, token-mean loss over the step, group-std advantages, no KL,
float32, the same threads. Every ``--eval-every`` steps one evaluator, shared by both,
samples ``--eval-samples`` answers per held-out prompt at temperature 1 with the policy's
own ``generate`` and scores them with the same reward (mean@k over 256 pairs never seen in
training); its time is left out of the clock. The clock is the wall time of training
itself: from the first step to each evaluation, less the evaluations before it.

    .venv/bin/python benchmarks/time_to_accuracy.py --steps 500 --eval-every 25   # 17 min
    .venv/bin/python benchmarks/time_to_accuracy.py --seeds 0 --steps 20 --eval-every 10

Prints, per framework, the median over seeds of the training seconds to reach each
threshold (first evaluation at or above it; "-" when a seed never reached it), the ratio
TRL / rlkit, and each run's accuracy curve. What is matched and what is not:
docs/benchmarks.md ("Time to accuracy").
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
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks.host_cpu import cpu_name  # noqa: E402

FRAMEWORKS = ("rlkit", "trl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--thresholds", default="0.6,0.7,0.8")
    p.add_argument("--prompts-per-step", type=int, default=64)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=6)
    p.add_argument("--micro-batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-prompts", type=int, default=256)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--frameworks", default="rlkit,trl")
    p.add_argument("--model", help="a model directory (default: the demo's warm-up model)")
    p.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    args.threshold_list = [float(t) for t in args.thresholds.split(",")]
    args.framework_list = args.frameworks.split(",")
    if not set(args.framework_list) <= set(FRAMEWORKS):
        p.error(f"--frameworks: some of {FRAMEWORKS}; got {args.framework_list}")
    return args


# ------------------------------------------------------------------ evaluator
def held_out_rows(limit: int) -> list[dict[str, Any]]:
    """The demo's held-out pairs (the ``val`` split, never trained on), first ``limit``."""
    from rlkit.tasks.arithmetic import arithmetic_dataset

    return list(arithmetic_dataset("val", limit=limit, seed=0))


def held_out_accuracy(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], samples: int, max_new_tokens: int
) -> float:
    """mean@``samples``: the share of sampled answers (temperature 1, no top-k / top-p)
    that the exact-match reward scores right, with the model's own ``generate``."""
    import torch

    from rewards.exact_match import exact_match

    prompts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        for r in rows
    ]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    tokenizer.padding_side = side
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=samples,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = [
        exact_match(t, rows[i // samples]["ground_truth"])["score"] for i, t in enumerate(texts)
    ]
    return sum(scores) / len(scores)


class Curve:
    """Accuracy against training seconds: the clock runs while training, not evaluating."""

    def __init__(self, evaluate: Any, every: int) -> None:
        self.evaluate, self.every = evaluate, every
        self.points: list[tuple[int, float, float]] = []  # (step, training s, accuracy)
        self.start = self.evaluating = 0.0

    def begin(self, model: Any) -> None:
        self.points.append((0, 0.0, self.evaluate(model)))
        self.start = time.perf_counter()

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def after_step(self, step: int, model: Any) -> None:
        if not self.due(step):
            return
        paused = time.perf_counter()
        trained = paused - self.start - self.evaluating
        self.points.append((step, trained, self.evaluate(model)))
        self.evaluating += time.perf_counter() - paused


# ---------------------------------------------------------------------- runs
def run_rlkit(w: Any, curve: Curve) -> None:
    from benchmarks.e2e_workloads import rlkit_config
    from rlkit.trainer.trainer import RLTrainer

    with tempfile.TemporaryDirectory(prefix="rlkit_tta_") as out:
        trainer = RLTrainer(rlkit_config(w, out))
        trainer.setup()
        untimed_step = trainer.step

        def step() -> dict[str, float]:
            metrics = untimed_step()
            if curve.due(trainer.step_count):
                with trainer.weights.generation_context() as (model, _):  # the HF model
                    curve.after_step(trainer.step_count, model)
            return metrics

        trainer.step = step  # the instance attribute shadows the method inside train()
        try:
            with trainer.weights.generation_context() as (model, _):
                curve.begin(model)
            trainer.train()
        finally:
            trainer.cleanup()


def run_trl(w: Any, curve: Curve) -> None:
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from benchmarks.e2e_workloads import exact_match_reward, prompt_dataset, trl_config

    class Evaluations(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            curve.begin(model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            curve.after_step(state.global_step, model)

    with tempfile.TemporaryDirectory(prefix="trl_tta_") as out:
        trainer = GRPOTrainer(
            model=w.model_dir,
            reward_funcs=exact_match_reward,
            args=trl_config(w, out),
            train_dataset=prompt_dataset(w),
            processing_class=AutoTokenizer.from_pretrained(w.model_dir),
            callbacks=[Evaluations()],
        )
        trainer.train()


def worker(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from benchmarks.e2e_workloads import Workload

    torch.set_num_threads(args.threads)
    w = Workload.from_args(args, model_dir=args.model, num_prompts=10_000)  # all of train
    tokenizer = AutoTokenizer.from_pretrained(w.model_dir)
    rows = held_out_rows(args.eval_prompts)

    def evaluate(model: Any) -> float:
        torch.manual_seed(args.seed)  # the same draws for both frameworks' equal weights
        return held_out_accuracy(
            model, tokenizer, rows, args.eval_samples, args.max_completion_length
        )

    curve = Curve(evaluate, args.eval_every)
    {"rlkit": run_rlkit, "trl": run_trl}[args.worker](w, curve)
    Path(args.out).write_text(json.dumps(curve.points))
    return 0


def run_worker(args: argparse.Namespace, framework: str, seed: int, out: Path) -> list:
    command = [sys.executable, __file__, "--worker", framework, "--seed", str(seed)]
    command += ["--out", str(out), "--model", args.model]
    for flag in ("steps", "eval_every", "prompts_per_step", "group_size"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for flag in ("max_completion_length", "micro_batch_size", "lr", "threads"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    command += ["--eval-prompts", str(args.eval_prompts), "--eval-samples", str(args.eval_samples)]
    proc = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{framework} seed {seed} failed:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


# -------------------------------------------------------------------- report
def time_to(points: list, threshold: float) -> float | None:
    """Training seconds at the first evaluation at or above ``threshold``."""
    return next((t for _, t, acc in points if acc >= threshold), None)


def median_time(curves: list[list], threshold: float) -> tuple[float | None, int]:
    """Median seconds over the runs that reached ``threshold`` (``None`` unless all did),
    and how many reached it."""
    times = [time_to(c, threshold) for c in curves]
    reached = [t for t in times if t is not None]
    return (statistics.median(reached) if len(reached) == len(times) else None), len(reached)


def report(args: argparse.Namespace, curves: dict[str, list[list]]) -> None:
    n = len(args.seed_list)
    print(
        f"\n{cpu_name()}; {args.threads} threads; {args.prompts_per_step} prompts x "
        f"{args.group_size} per step, <= {args.max_completion_length} new tokens, lr "
        f"{args.lr:g}, {args.steps} steps; held-out mean@{args.eval_samples} over "
        f"{args.eval_prompts} pairs every {args.eval_every} steps; seeds {args.seeds}\n"
    )
    header = " | ".join(f"to {t:.0%} (s)" for t in args.threshold_list)
    print(f"| framework | {header} | final accuracy | training s |")
    print("|---|" + "---:|" * (len(args.threshold_list) + 2))
    medians: dict[str, list[float | None]] = {}
    for fw, runs in curves.items():
        cells, medians[fw] = [], []
        for t in args.threshold_list:
            m, reached = median_time(runs, t)
            medians[fw].append(m)
            cells.append(f"{m:.1f}" if m is not None else f"- ({reached}/{n} reached)")
        final = statistics.median(r[-1][2] for r in runs)
        total = statistics.median(r[-1][1] for r in runs)
        print(f"| {fw} | " + " | ".join(cells) + f" | {final:.1%} | {total:.1f} |")
    if {"rlkit", "trl"} <= set(medians):
        ratios = [
            f"{t:.0%}: {b / a:.2f}" if a and b else f"{t:.0%}: -"
            for t, a, b in zip(args.threshold_list, medians["rlkit"], medians["trl"])
        ]
        print("\nTRL time / rlkit time: " + ", ".join(ratios))
    print()
    for fw, runs in curves.items():
        for seed, points in zip(args.seed_list, runs):
            trace = ", ".join(f"{s}:{acc:.1%}@{t:.0f}s" for s, t, acc in points)
            print(f"{fw} seed {seed}: {trace}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:  # the demo's own warm-up (experiments/demo.gin), cached
        from rlkit.tasks.arithmetic import arithmetic_sft_model

        args.model = arithmetic_sft_model(str(_ROOT / "runs" / "demo" / "sft_model"))
    if args.worker:
        return worker(args)
    curves: dict[str, list[list]] = {fw: [] for fw in args.framework_list}
    with tempfile.TemporaryDirectory(prefix="tta_") as tmp:
        for i, seed in enumerate(args.seed_list):
            order = args.framework_list if i % 2 == 0 else args.framework_list[::-1]
            for fw in order:
                points = run_worker(args, fw, seed, Path(tmp) / f"{fw}_{seed}.json")
                curves[fw].append(points)
                print(f"{fw} seed {seed}: final {points[-1][2]:.1%} after {points[-1][1]:.0f} s")
    report(args, curves)
    return 0


if __name__ == "__main__":
    sys.exit(main())
