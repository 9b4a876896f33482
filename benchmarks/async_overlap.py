"""GRPO steps with an SGLang server: ``rollout_mode = "sync"`` vs ``"one_step_off"`` and ``"async"``.

One CPU SGLang server (one thread) serves a locally built random Qwen2; the trainer
(one thread) attaches to it by URL and runs the same GRPO workload in each mode, the
modes alternating round by round so that drifting machine load hits both alike. On a
2-core machine each side has a core: in ``sync`` each waits for the other; in
``one_step_off`` the server generates the next batch while the trainer updates.

    .venv/bin/python benchmarks/async_overlap.py              # about 3 minutes on 2 cores
    .venv/bin/python benchmarks/async_overlap.py --hidden-size 128 --steps 6 --rounds 2
    # long-tailed response lengths (4 stop ids: mean about 60 of up to 256 tokens)
    .venv/bin/python benchmarks/async_overlap.py --modes sync,one_step_off,async \
        --new-tokens 256 --stop-ids 4

Per mode (medians over the steps after ``--warmup``, over all rounds): seconds per step,
tokens/s (prompt + response tokens of the batch / step seconds), the share of the step
the trainer spent waiting for generation (``sync``: ``timing_s/gen``; ``one_step_off``:
``timing_s/wait_for_rollout``) and the share the server was idle (1 - generation seconds
/ step seconds). Then tokens/s of each mode / sync per round.

``--stop-ids K`` makes K token ids end a response: the random model then stops after a
geometrically distributed number of tokens (with K = 4 on the default model: median
about 45, the longest of 64 about 256), the long-tailed lengths of reasoning rollouts,
where a synchronous step waits for its longest response.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks.host_cpu import cpu_name  # noqa: E402
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer  # noqa: E402
from rlkit.registry import ROLLOUT_ENGINES  # noqa: E402
from rlkit.trainer.trainer import RLTrainer  # noqa: E402
from tests.experiment_factory import small_experiment  # noqa: E402

MODES = ("sync", "one_step_off", "async")
STOP_BASE = 40  # the first of --stop-ids ids: plain byte tokens of the byte tokenizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="responses per prompt")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="sync,one_step_off", help="comma-separated, sync first")
    p.add_argument("--stop-ids", type=int, default=0, help="ids that end a response (long tail)")
    p.add_argument("--max-staleness", type=int, help="async: versions (default: two steps ahead)")
    p.add_argument("--partial-rollout", default="finish", choices=("finish", "continue"))
    p.add_argument("--model", help="a model directory (default: a random Qwen2 built here)")
    p.add_argument("--url", help="attach to this server, serving --model (default: start one)")
    args = p.parse_args(argv)
    args.modes = args.modes.split(",")
    if args.modes[0] != "sync" or not set(args.modes) <= set(MODES):
        p.error(f"--modes: sync first, then some of {MODES[1:]}; got {args.modes}")
    return args


def start_server(model_dir: Path, log_dir: Path) -> Any:
    """One managed CPU server with one compute thread."""
    from rlkit.rollout import sglang  # noqa: F401  (registers "sglang")

    return ROLLOUT_ENGINES.get("sglang")(
        model_path=str(model_dir),
        seed=0,
        num_servers=1,
        device="cpu",
        dtype="float32",
        max_total_tokens=16384,
        attention_backend="torch_native",
        server_env={"OMP_NUM_THREADS": "1"},
        log_dir=str(log_dir),
        startup_timeout_s=600.0,
    )


def run_mode(args: argparse.Namespace, mode: str, model_dir: Path, url: str, out: Path) -> list:
    cfg = small_experiment(
        model_dir,
        out,
        data={"train_batch_size": args.prompts, "max_prompt_length": 32, "reward_workers": 1},
        rollout={
            "engine": "sglang",
            "engine_options": {
                "num_servers": 0,
                "urls": [url],
                "device": "cpu",
                "extra_stop_token_ids": list(range(STOP_BASE, STOP_BASE + args.stop_ids)),
            },
            "n": args.n,
            "max_response_length": args.new_tokens,
        },
        algorithm={"use_kl_loss": False, "rollout_is_level": "token"},
        optim={"ppo_mini_batch_size": args.prompts, "micro_batch_size": args.prompts * args.n},
        trainer={
            "rollout_mode": mode,
            "max_staleness": args.max_staleness,
            "partial_rollout": args.partial_rollout if mode == "async" else "finish",
            "total_steps": args.steps,
            "val_before_train": False,
            "save_at_end": False,
            "num_threads": 1,
            "tensorboard": False,
        },
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    trainer.val_prompts = None  # no validation: only the steps are compared
    trainer.rollout.sync_weights()  # the server may hold an earlier run's weights
    try:
        return trainer.train()
    finally:
        trainer.cleanup()


def summarize(history: list[dict[str, float]], warmup: int) -> dict[str, list[float]]:
    steps = history[warmup:]
    out: dict[str, list[float]] = {"step_s": [], "tokens_per_s": [], "wait": [], "idle": []}
    for m in steps:
        step = m["timing_s/step"]
        out["step_s"].append(step)
        out["tokens_per_s"].append(m["perf/total_num_tokens"] / step)
        waited = m.get("timing_s/wait_for_rollout", m.get("timing_s/gen", 0.0))
        out["wait"].append(waited / step)
        out["idle"].append(max(0.0, 1.0 - m.get("timing_s/generate_sequences", 0.0) / step))
    return out


def random_model(args: argparse.Namespace, root: Path) -> Path:
    return build_tiny_qwen2(
        root / "model",
        train_byte_tokenizer(),
        seed=0,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        intermediate_size=3 * args.hidden_size,
    )


def compare(
    args: argparse.Namespace, model_dir: Path, url: str, root: Path
) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[float]]]:
    """Every round runs every mode (alternating the order); the per-step numbers of each
    mode, and the tokens/s ratio of each mode to sync, per round."""
    per_mode: dict[str, dict[str, list[float]]] = {m: {} for m in args.modes}
    ratios: dict[str, list[float]] = {m: [] for m in args.modes[1:]}
    for r in range(args.rounds):
        tps = {}
        for mode in args.modes if r % 2 == 0 else args.modes[::-1]:
            history = run_mode(args, mode, model_dir, url, root / f"{mode}_{r}")
            s = summarize(history, args.warmup)
            for k, v in s.items():
                per_mode[mode].setdefault(k, []).extend(v)
            tps[mode] = statistics.median(s["tokens_per_s"])
            print(f"round {r + 1} {mode}: {tps[mode]:,.0f} tokens/s", flush=True)
        for mode in ratios:
            ratios[mode].append(tps[mode] / tps["sync"])
    return per_mode, ratios


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlkit_async_") as tmp:
        root = Path(tmp)
        model_dir = Path(args.model) if args.model else random_model(args, root)
        engine = None if args.url else start_server(model_dir, root / "server")
        try:
            url = args.url or engine.sync_endpoints[0].url
            per_mode, ratios = compare(args, model_dir, url, root)
        finally:
            if engine is not None:
                engine.close()
    print(
        f"\n{cpu_name()}; model {args.model or f'hidden {args.hidden_size} x {args.layers} layers'}; "
        f"{args.prompts} prompts x {args.n} responses x up to {args.new_tokens} new tokens per "
        f"step{f' ({args.stop_ids} stop ids)' if args.stop_ids else ''}; "
        f"async: partial_rollout {args.partial_rollout}; "
        f"{args.steps} steps ({args.warmup} warm-up) x {args.rounds} rounds\n"
    )
    print("| mode | step s | tokens/s | trainer waiting | server idle |")
    print("|---|---:|---:|---:|---:|")
    for mode in args.modes:
        s = {k: statistics.median(v) for k, v in per_mode[mode].items()}
        print(
            f"| {mode} | {s['step_s']:.2f} | {s['tokens_per_s']:,.0f} | {s['wait']:.0%} | "
            f"{s['idle']:.0%} |"
        )
    print()
    for mode, values in ratios.items():
        print(f"{mode} / sync tokens/s per round: " + ", ".join(f"{r:.2f}" for r in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
