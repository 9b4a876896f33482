"""Benchmark decoding with each prompt's KV cache shared by its group (cascade attention).

Usage::

    .venv/bin/python benchmarks/shared_prefix_decode.py [--widths 16,32,64,128,206
        --own 1,64 --shapes 6x64,32x64,206x128 --prompts 8 --n 8 --hidden-size 512
        --layers 8 --pairs 3 --threads 1]

Two tables, both on the ``realistic`` model's attention shape by default (4 query and 2
key/value heads of 128; 8 prompts x n = 8 rows):

1. **One decode step's attention**, per prompt width and number of the row's own tokens:
   SDPA over each row's full cache, the prompt copied per row (what the in-place cache
   holds; the ``grouped_sdpa`` kernel's call), against
   :func:`~rlkit.kernels.shared_prefix_decode.shared_prefix_attention` over the prompt
   held once per group. Median microseconds of ``--repeats`` calls, the ratio, and the
   largest difference of the outputs.
2. **The decode loop** (:func:`rlkit.rollout.embedded.kv_decode.decode`) on a random Qwen2 under
   the ``grouped_sdpa`` kernel, ``--shapes`` of ``<prompt tokens>x<new tokens>``, no stop
   token: ``shared_prefix=False`` (the in-place cache) against ``True``, pairs with the
   same seed, alternating which goes first. Whether both sampled the same tokens, and the
   largest difference of their recorded log-probs (the two sum in different orders, so
   equal up to float rounding; a draw on the boundary of two tokens could differ).
   ``6x64`` is ``realistic``'s shape, below the loop's default threshold
   (``SHARED_PREFIX_MIN_TOKENS``); ``206x128`` is ``gsm8k_like``'s.
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

from kv_cache import add_decode_arguments, build_model, timed_decode  # noqa: E402

from rlkit.device.host_allocator import keep_freed_host_memory  # noqa: E402
from rlkit.kernels.attention import grouped_sdpa_attention  # noqa: E402
from rlkit.kernels.shared_prefix_decode import (  # noqa: E402
    SharedPrefix,
    shared_prefix_attention,
)

HEADS, KV_HEADS = 4, 2


def _median_us(fn, repeats: int) -> float:
    fn()  # the first call pays one-off costs
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def attention_row(args: argparse.Namespace, width: int, own: int) -> str:
    """One table row: a decode step's attention with the prompt copied vs shared."""
    groups, n, dim = args.prompts, args.n, args.hidden_size // HEADS
    rows = groups * n
    gen = torch.Generator().manual_seed(width * 1000 + own)
    prompt_kv = [torch.randn(groups, KV_HEADS, width, dim, generator=gen) for _ in range(2)]
    own_kv = [torch.randn(rows, KV_HEADS, own, dim, generator=gen) for _ in range(2)]
    query = torch.randn(rows, HEADS, 1, dim, generator=gen)
    mask = torch.ones(rows, 1, 1, width + own, dtype=torch.bool)
    mask[: rows // 2, ..., : width // 4] = False  # half the prompts left-padded by a quarter
    full_k, full_v = (
        torch.cat([p.repeat_interleave(n, 0), o], dim=2) for p, o in zip(prompt_kv, own_kv)
    )
    prefix = SharedPrefix(prompt_kv[0], prompt_kv[1], n)

    def copied():
        return torch.nn.functional.scaled_dot_product_attention(
            query, full_k, full_v, attn_mask=mask, enable_gqa=True
        ).transpose(1, 2)

    def shared():
        return shared_prefix_attention(query, prefix, own_kv[0], own_kv[1], mask)

    diff = (copied() - shared()).abs().max().item()
    a, b = _median_us(copied, args.repeats), _median_us(shared, args.repeats)
    return f"| {width} | {own} | {a:.0f} | {b:.0f} | {b / a:.2f}x | {diff:.1e} |"


def decode_row(model, args: argparse.Namespace, prompt_len: int, new_tokens: int) -> str:
    """One table row: the decode loop with the in-place cache vs the shared prefix."""
    gen = torch.Generator().manual_seed(prompt_len)
    prompts = torch.randint(1, args.vocab, (args.prompts, prompt_len), generator=gen).tolist()
    timed_decode(model, prompts, args, min(new_tokens, 4), shared_prefix=True)  # warm-up, not timed
    seconds: dict[bool, list[float]] = {False: [], True: []}
    same, diff = True, 0.0
    for pair in range(args.pairs):
        results = {}
        for shared in (False, True) if pair % 2 == 0 else (True, False):
            wall, results[shared] = timed_decode(
                model, prompts, args, new_tokens, shared_prefix=shared
            )
            seconds[shared].append(wall)
        a, b = results[False], results[True]
        same &= a.response_ids == b.response_ids
        diff = max(
            [diff] + [abs(x - y) for p, q in zip(a.log_probs, b.log_probs) for x, y in zip(p, q)]
        )
    ratios = [s / c for c, s in zip(seconds[False], seconds[True])]
    return (
        f"| {prompt_len} + {new_tokens} | {statistics.median(seconds[False]):.2f} | "
        f"{statistics.median(seconds[True]):.2f} | {' / '.join(f'{r:.2f}' for r in ratios)} | "
        f"{statistics.median(ratios):.2f}x | {'yes' if same else 'NO'} | {diff:.1e} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="16,32,64,128,206")
    parser.add_argument("--own", default="1,64")
    parser.add_argument("--repeats", type=int, default=50)
    add_decode_arguments(parser, shapes="6x64,32x64,206x128")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_host_memory()  # as the trainer does on CPU
    print(
        f"{args.prompts} prompts x n={args.n}, {HEADS} query / {KV_HEADS} key-value heads of "
        f"{args.hidden_size // HEADS}, {args.threads} thread(s)\n\nOne decode step's attention "
        f"(median of {args.repeats} calls):\n"
    )
    print(
        "| prompt tokens | own tokens | prompt copied us | shared us | shared / copied | max diff |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for width in (int(w) for w in args.widths.split(",")):
            for own in (int(o) for o in args.own.split(",")):
                print(attention_row(args, width, own), flush=True)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    model = build_model(args, max(p + t for p, t in shapes))
    grouped_sdpa_attention(model)
    print(
        f"\nThe decode loop, hidden {args.hidden_size}, {args.layers} layers, grouped_sdpa, "
        f"{args.pairs} pair(s) per shape:\n"
    )
    print(
        "| prompt + new tokens | in place s | shared prefix s | shared / in place per pair "
        "| median ratio | same tokens | max log-prob diff |"
    )
    print("|---|---:|---:|---|---:|---|---:|")
    for prompt_len, new_tokens in shapes:
        print(decode_row(model, args, prompt_len, new_tokens), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
