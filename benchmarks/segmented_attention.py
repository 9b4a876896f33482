"""Benchmark the shared-prefix passes' attention: query runs vs one row per segment.

Usage::

    .venv/bin/python benchmarks/segmented_attention.py [--shapes 6x64x8,206x128x8
        --segments 2 --heads 4 --kv-heads 2 --head-dim 128 --repeats 5 --threads 1]

Each shape is ``<prompt tokens>x<response tokens>x<responses>``: ``--segments`` packed
sequences of one prompt followed by its responses (each response sees the prompt and
its own earlier tokens), as the shared-prefix update packs a prompt group
(:mod:`rlkit.modeling.prefix_sharing`). ``6x64x8`` is the ``realistic`` workload's group
of ``benchmarks/e2e_grpo_vs_trl.py``, ``206x128x8`` the ``gsm8k_like`` one; the head
sizes are those workloads' model's (4 query and 2 key/value heads of 128).

:class:`~rlkit.kernels.segmented_attention.AttentionSegments` attends them in one SDPA
call, either as one padded row per segment over its whole ``l x l`` mask (the baseline,
``query_runs=False``) or with the rows it picks from the segments' query runs (each
response over the prompt's and its own keys). The table gives each layout's padded
batch (rows x queries x keys), the median milliseconds of one forward and backward,
their ratio in the same run, and the largest difference of the outputs and the
gradients of the query, key and value between the two layouts (the same to float
rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlkit.kernels.segmented_attention import AttentionSegments  # noqa: E402

LAYOUTS = {"one row per segment": False, "query runs": True}


def shared_prompt_masks(prompt: int, response: int, responses: int, segments: int) -> list:
    """``segments`` (1, 1, l, l) masks of a prompt followed by its responses: causal, and
    a response token sees the prompt and its own response only."""
    owner = torch.tensor(
        [0] * prompt + [i for i in range(1, responses + 1) for _ in range(response)]
    )
    causal = torch.ones(len(owner), len(owner), dtype=torch.bool).tril()
    q, k = owner[:, None], owner[None, :]
    mask = (causal & ((k == 0) | (k == q)))[None, None]
    return [mask] * segments


def forward_backward(
    segments: AttentionSegments, inputs: list[torch.Tensor], weights: torch.Tensor
) -> list[torch.Tensor]:
    """One attention forward and backward (the loss: the output projected on ``weights``);
    returns the output and the query's, key's and value's gradients."""
    for x in inputs:
        x.grad = None
    out = segments.attend(*inputs)
    (out * weights).sum().backward()
    return [out.detach(), *(x.grad for x in inputs)]


def time_layout(
    segments: AttentionSegments, inputs: list[torch.Tensor], weights: torch.Tensor
) -> float:
    """Milliseconds of one :func:`forward_backward`."""
    start = time.perf_counter()
    forward_backward(segments, inputs, weights)
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="6x64x8,206x128x8")
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"shared-prompt attention, {args.segments} segments per shape, {args.heads} query / "
        f"{args.kv_heads} key-value heads of {args.head_dim}, forward + backward, "
        f"{args.threads} thread(s), {args.repeats} repeats\n"
    )
    print(
        "| prompt x response x n | one row per segment: batch | ms | query runs: batch | ms "
        "| runs / segment rows | largest difference |"
    )
    print("|---|---|---:|---|---:|---:|---:|")
    generator = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        prompt, response, responses = (int(x) for x in shape.split("x"))
        masks = shared_prompt_masks(prompt, response, responses, args.segments)
        layouts = {
            name: AttentionSegments.from_masks(masks, runs) for name, runs in LAYOUTS.items()
        }
        tokens = layouts["query runs"].length
        inputs = [
            torch.randn(1, heads, tokens, args.head_dim, generator=generator).requires_grad_()
            for heads in (args.heads, args.kv_heads, args.kv_heads)
        ]
        weights = torch.randn(1, tokens, args.heads, args.head_dim, generator=generator)
        results = {n: forward_backward(s, inputs, weights) for n, s in layouts.items()}  # warm-up
        diff = max((a - b).abs().max().item() for a, b in zip(*(results[name] for name in LAYOUTS)))
        times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
        for repeat in range(args.repeats):
            for name in LAYOUTS if repeat % 2 == 0 else list(LAYOUTS)[::-1]:
                times[name].append(time_layout(layouts[name], inputs, weights))
        ms = {name: statistics.median(t) for name, t in times.items()}
        cells = [
            f"{'x'.join(str(d) for d in layouts[name].batch_shape)} | {ms[name]:.1f}"
            for name in LAYOUTS
        ]
        ratio = ms["query runs"] / ms["one row per segment"]
        print(f"| {shape} | {' | '.join(cells)} | {ratio:.2f}x | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
