"""How far rollout and trainer log-probs drift apart, per precision and attention path.

Usage::

    .venv/bin/python benchmarks/logprob_gap.py [--workload tiny|realistic|gsm8k_like]
        [--gap-steps 3] [any size flag of e2e_grpo_vs_trl.py]

Runs rlkit's ``RLTrainer`` on the end-to-end benchmark's workload for ``--gap-steps`` steps
four times: float32 and bf16 compute (``TrainerConfig.mixed_precision``), each with rlkit's
CPU attention (:func:`rlkit.kernels.attention_math.cpu_attention`: float32, a decode step's
single query as matrix products) and with plain SDPA in autocast's dtype
(:func:`~rlkit.kernels.attention_math.sdpa_attention`). Prints each step's
``rollout/logprob_abs_diff_mean`` (the mean ``|log pi_train - log pi_rollout|`` over the
response tokens; at step 1 both sides hold the same weights, so it is rounding alone) and
the bound the trainer's guard checks it against (``rlkit.trainer.logprob_guard``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The repository root first (see e2e_grpo_vs_trl.py), this folder last.
sys.path.insert(0, str(_HERE.parent))
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

from e2e_grpo_vs_trl import parse_args, prepare_model  # noqa: E402
from e2e_workloads import Workload, rlkit_config  # noqa: E402

ATTENTION = ("cpu_attention", "plain sdpa")


def gaps(workload: Workload, attention: str, out_dir: str) -> list[float]:
    """``rollout/logprob_abs_diff_mean`` of each of ``workload.steps`` steps."""
    import torch

    from rlkit.kernels import attention_math
    from rlkit.trainer.trainer import RLTrainer

    rlkit_attention = attention_math.cpu_attention
    if attention == "plain sdpa":
        attention_math.cpu_attention = attention_math.sdpa_attention
    try:
        trainer = RLTrainer(rlkit_config(workload, out_dir))
        trainer.setup()
        torch.set_num_threads(workload.threads)
        try:
            return [trainer.step()["rollout/logprob_abs_diff_mean"] for _ in range(workload.steps)]
        finally:
            trainer.cleanup()
    finally:
        attention_math.cpu_attention = rlkit_attention


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--gap-steps", type=int, default=3, help="steps per run")
    mine, rest = own.parse_known_args(argv)
    if mine.gap_steps < 1:
        own.error("--gap-steps must be >= 1")
    args = parse_args(rest)
    from rlkit.trainer.logprob_guard import BOUNDS

    model_dir = prepare_model(args)
    print(
        f"rollout/logprob_abs_diff_mean per step; model hidden {args.hidden_size} x "
        f"{args.layers} layers, {args.sft_steps} warm-up steps, {args.prompts_per_step} x "
        f"{args.group_size} rows, <= {args.max_completion_length} new tokens\n"
    )
    steps = " | ".join(f"step {i + 1}" for i in range(mine.gap_steps))
    print(f"| precision | attention | {steps} | guard's bound |")
    print("|---|---|" + "---:|" * (mine.gap_steps + 1))
    for precision, dtype in (("no", "float32"), ("bf16", "bfloat16")):
        for attention in ATTENTION:
            workload = Workload.from_args(
                args, model_dir=model_dir, steps=mine.gap_steps, mixed_precision=precision
            )
            with tempfile.TemporaryDirectory(prefix="logprob_gap_") as out_dir:
                values = gaps(workload, attention, out_dir)
            cells = " | ".join(f"{v:.2e}" for v in values)
            print(f"| {dtype} | {attention} | {cells} | {BOUNDS[dtype]:.0e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
