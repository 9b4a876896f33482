"""Rollout throughput, HF engine (both decode loops) vs SGLang engine, and SGLang weight-sync time.

Both engines generate from the same locally built random Qwen2 (no hub access), the
same prompts and the same sampling settings; tokens/s counts the response tokens
actually generated (a response may stop early at EOS). "concurrency" is the number
of sequences in flight: the HF engine's ``generation_batch_size`` and the SGLang
engine's ``max_concurrency`` (one request per sequence, ``n = 1``). The HF engine runs
with its default decode loop (``rlkit``: finished rows leave the batch) and with
``decode_loop="generate"`` (``transformers``' ``generate``).

    .venv/bin/python benchmarks/rollout.py                      # CPU: tiny model, 1 server
    .venv/bin/python benchmarks/rollout.py --hidden-size 256 --layers 4 --new-tokens 128
    .venv/bin/python benchmarks/rollout.py --device cuda --dtype bfloat16 --hidden-size 1024 \\
        --layers 16 --prompts 256 --concurrency 1,64,256   # GPU (benchmarks/rollout_gpu.sh)

Prints a Markdown table of tokens/s and one of weight-sync times (median of
``--sync-repeats``) for each sync mode (``distributed`` uses gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer  # noqa: E402
from rlkit.registry import ROLLOUT_ENGINES  # noqa: E402
from rlkit.rollout.base import SamplingParams  # noqa: E402
from tests.sglang.local_policy import LocalPolicyWeights  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,16,32")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--sync-repeats", type=int, default=3)
    p.add_argument("--modes", default="disk,tensor,distributed")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument(
        "--busy-poll",
        action="store_true",
        help="start the server without --sleep-on-idle (SGLang's default; on by default on CPU)",
    )
    return p.parse_args()


def build_model(args: argparse.Namespace, root: Path) -> tuple[Path, torch.nn.Module, object]:
    tok = train_byte_tokenizer()
    heads = max(args.hidden_size // 64, 1)
    path = build_tiny_qwen2(
        root / "model",
        tok,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=heads,
        num_kv_heads=max(heads // 2, 1),
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=max(512, args.prompt_length + args.new_tokens + 8),
    )
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    return path, model, tok


def prompts(args: argparse.Namespace) -> list[list[int]]:
    # Deterministic byte-token prompts (ids 3..258), BOS first.
    return [
        [1] + [3 + (17 * i + 5 * j) % 256 for j in range(args.prompt_length - 1)]
        for i in range(args.prompts)
    ]


def tokens_per_s(engine, batch_prompts, params) -> float:
    engine.generate(batch_prompts[:2], params)  # warm-up
    start = time.perf_counter()
    batch = engine.generate(batch_prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(r) for r in batch.response_ids) / elapsed


def main() -> None:
    args = parse_args()
    conc = [int(c) for c in args.concurrency.split(",")]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=args.temperature)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path, model, tok = build_model(args, root)
        weights = LocalPolicyWeights(model, version=1)
        ps = prompts(args)
        import rlkit.rollout.sglang  # noqa: F401  (registers "sglang")

        rows = []
        sglang = ROLLOUT_ENGINES.get("sglang")(
            model_path=str(path),
            tokenizer=tok,
            num_servers=1,
            device=args.device,
            dtype=args.dtype,
            max_total_tokens=args.max_total_tokens,
            mem_fraction_static=args.mem_fraction_static,
            attention_backend="torch_native" if args.device == "cpu" else None,
            log_dir=str(root / "logs"),
            verify_tolerance=float("inf"),
            sleep_on_idle=not args.busy_poll,
        )
        try:
            for c in conc:
                sglang.max_concurrency = c
                sg = tokens_per_s(sglang, ps, params)
                hf = {loop: float("nan") for loop in ("rlkit", "generate")}
                if not args.skip_hf:
                    from rlkit.rollout.hf_engine import HFEngine

                    for loop in hf:
                        hf_engine = HFEngine(
                            weights,
                            pad_token_id=0,
                            eos_token_ids=[2],
                            generation_batch_size=c,
                            decode_loop=loop,
                        )
                        hf[loop] = tokens_per_s(hf_engine, ps, params)
                rows.append((c, hf, sg))
            sync_rows = []
            for mode in args.modes.split(","):
                sglang.weight_sync_mode = mode
                times = []
                for r in range(args.sync_repeats):
                    m = sglang.sync_weights(
                        LocalPolicyWeights(model, version=2 + r + 10 * len(sync_rows))
                    )
                    times.append(m["timing_s/weight_sync"])
                diff = m["weight_sync/logprob_max_abs_diff"]
                sync_rows.append((mode, statistics.median(times), diff))
        finally:
            sglang.close()
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    print(
        f"\nmodel: Qwen2 hidden {args.hidden_size}, {args.layers} layers, {size:.1f} MiB "
        f"({args.dtype}, {args.device}); {args.prompts} prompts x {args.prompt_length} tokens, "
        f"{args.new_tokens} new tokens, temperature {args.temperature}\n"
    )
    print(
        "| concurrent sequences | HF engine, rlkit loop tokens/s | HF engine, generate loop "
        "tokens/s | SGLang engine tokens/s | rlkit loop / generate loop | SGLang / rlkit loop |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for c, hf, sg in rows:
        ours, theirs = hf["rlkit"], hf["generate"]
        print(
            f"| {c} | {ours:,.0f} | {theirs:,.0f} | {sg:,.0f} | {ours / theirs:.2f}x "
            f"| {sg / ours:.2f}x |"
        )
    print("\n| weight sync mode | median time (s) | max abs log-prob diff after sync |")
    print("|---|---:|---:|")
    for mode, t, diff in sync_rows:
        print(f"| {mode} | {t:.3f} | {diff:.2e} |")


if __name__ == "__main__":
    main()
