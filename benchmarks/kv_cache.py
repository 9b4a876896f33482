"""Benchmark the decode loop's KV cache: written in place vs transformers' ``DynamicCache``.

Usage::

    .venv/bin/python benchmarks/kv_cache.py [--shapes 6x64,206x128 --prompts 8 --n 8
        --hidden-size 512 --layers 8 --pairs 3 --threads 1]

rlkit's decode loop (:func:`rlkit.rollout.embedded.kv_decode.decode`) samples ``n`` responses to
each of ``--prompts`` random prompts on a random Qwen2 (the defaults are the ``realistic``
model of ``benchmarks/e2e_grpo_vs_trl.py``: hidden 512, 8 layers, 4 query and 2 key/value
heads of 128; 64 rows). No stop token, so every row runs to length. Each shape is
``<prompt tokens>x<new tokens>``: ``6x64`` is ``realistic``'s, ``206x128`` ``gsm8k_like``'s.

Each pair runs the loop twice with the same seed, once with the in-place cache
(:mod:`rlkit.rollout.embedded.kv_cache`, the default) and once with transformers' ``DynamicCache``
(the baseline: the loop falls back to it where ``in_place_cache`` returns ``None``, as for
sliding-window models), alternating which goes first. ``DynamicCache`` copies each
layer's whole cache at every decoded token; the in-place cache writes the token into a
buffer. The table gives each side's median wall seconds, their ratio per pair, and
whether the two sampled bitwise the same tokens and log-probs (they must).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

from tiny_models import random_qwen2  # noqa: E402

from rlkit.device.host_allocator import keep_freed_host_memory  # noqa: E402
from rlkit.rollout.embedded import kv_decode  # noqa: E402

CACHES = ("in place", "DynamicCache")


def build_model(args: argparse.Namespace, positions: int) -> torch.nn.Module:
    """A random Qwen2 decoder in eval mode (float32)."""
    return random_qwen2(
        vocab_size=args.vocab,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=positions,
    ).eval()


def run(model, prompts: list[list[int]], args, new_tokens: int, cache: str):
    """One rollout with ``cache``; returns (wall seconds, the decode result)."""
    real = kv_decode.in_place_cache
    if cache == "DynamicCache":
        kv_decode.in_place_cache = lambda config, capacity: None
    try:
        return timed_decode(model, prompts, args, new_tokens)
    finally:
        kv_decode.in_place_cache = real


def timed_decode(model, prompts: list[list[int]], args, new_tokens: int, **options):
    """One rollout of the decode loop, seed 1, no stop token, ``options`` passed on;
    returns (wall seconds, the decode result)."""
    torch.manual_seed(1)
    start = time.perf_counter()
    with torch.no_grad():
        result = kv_decode.decode(
            model,
            prompts,
            n=args.n,
            max_new_tokens=new_tokens,
            pad_token_id=0,
            stop_token_ids=[],
            warp=None,
            **options,
        )
    return time.perf_counter() - start, result


def add_decode_arguments(parser: argparse.ArgumentParser, shapes: str) -> None:
    """The decode-loop benchmarks' shared options: rollout shapes, model size, pairs."""
    parser.add_argument("--shapes", default=shapes)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=259)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_arguments(parser, shapes="6x64,206x128")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_host_memory()  # as the trainer does on CPU
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    model = build_model(args, max(p + t for p, t in shapes))
    print(
        f"decode loop, {args.prompts} prompts x n={args.n}, hidden {args.hidden_size}, "
        f"{args.layers} layers, {args.threads} thread(s), {args.pairs} pair(s) per shape\n"
    )
    print(
        "| prompt + new tokens | in place s | DynamicCache s | in place / DynamicCache "
        "per pair | median ratio | same samples |"
    )
    print("|---|---:|---:|---|---:|---|")
    generator = torch.Generator().manual_seed(0)
    for prompt_len, new_tokens in shapes:
        prompts = torch.randint(1, args.vocab, (args.prompts, prompt_len), generator=generator)
        prompts = prompts.tolist()
        run(model, prompts, args, min(new_tokens, 4), CACHES[0])  # warm-up, not timed
        seconds: dict[str, list[float]] = {c: [] for c in CACHES}
        same = True
        for pair in range(args.pairs):
            results = {}
            for cache in CACHES if pair % 2 == 0 else CACHES[::-1]:
                wall, results[cache] = run(model, prompts, args, new_tokens, cache)
                seconds[cache].append(wall)
            a, b = (results[c] for c in CACHES)
            same &= a.response_ids == b.response_ids and a.log_probs == b.log_probs
        ratios = [x / y for x, y in zip(*(seconds[c] for c in CACHES))]
        print(
            f"| {prompt_len} + {new_tokens} | {statistics.median(seconds[CACHES[0]]):.2f} | "
            f"{statistics.median(seconds[CACHES[1]]):.2f} | "
            f"{' / '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f}x | "
            f"{'yes' if same else 'NO'} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
