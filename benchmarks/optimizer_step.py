"""Benchmark one AdamW step under each ``OptimConfig.optimizer_implementation``.

Usage::

    .venv/bin/python benchmarks/optimizer_step.py [--hidden-size 512 --layers 8
        --intermediate-size 2048 --kv-size 256 --vocab 259 --repeats 5 --threads 1]

The parameters are those of a Qwen2 decoder of the given sizes (per layer: q, k, v, o,
gate, up and down projections with the q/k/v biases, two norms; then the embedding, the
final norm, an untied LM head), with random gradients; the defaults are the ``realistic``
workload's model of ``benchmarks/e2e_grpo_vs_trl.py`` (31.7M parameters). Every
implementation steps its own copy of the same parameters, rounds alternating the order,
and the table gives the median process CPU time of one step, its ratio to PyTorch's
default (``torch``) and the largest difference of the updated parameters from it after
the timed steps (the same update to float rounding). Target: ``fused`` at most half of
``torch``'s time on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlkit.trainer.config import OPTIMIZER_IMPLEMENTATIONS  # noqa: E402
from rlkit.trainer.optimizer import adamw  # noqa: E402


def decoder_shapes(args: argparse.Namespace) -> list[tuple[int, ...]]:
    """Parameter shapes of a Qwen2 decoder with an untied LM head."""
    h, f, kv = args.hidden_size, args.intermediate_size, args.kv_size
    layer = [(h, h), (h,), (kv, h), (kv,), (kv, h), (kv,), (h, h), (f, h), (f, h), (h, f)]
    layer += [(h,), (h,)]
    return [(args.vocab, h)] + layer * args.layers + [(h,), (args.vocab, h)]


def make_optimizers(args: argparse.Namespace) -> dict[str, tuple[list, torch.optim.Optimizer]]:
    """Per implementation, its own copy of the same parameters and gradients."""
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen) * 0.02 for s in decoder_shapes(args)]
    grads = [torch.randn(s, generator=gen) for s in decoder_shapes(args)]
    out = {}
    for name in OPTIMIZER_IMPLEMENTATIONS:
        params = [torch.nn.Parameter(v.clone()) for v in values]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        out[name] = (
            params,
            adamw(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01, implementation=name),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--intermediate-size", type=int, default=2048)
    parser.add_argument("--kv-size", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=259)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    optimizers = make_optimizers(args)
    names = list(optimizers)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # the first step allocates the moment buffers: not timed
        optimizers[name][1].step()
    for round_ in range(args.repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.process_time()
            optimizers[name][1].step()
            seconds[name].append(time.process_time() - start)
    count = sum(p.numel() for p in optimizers["torch"][0])
    baseline = statistics.median(seconds["torch"])
    print(
        f"AdamW step, {count / 1e6:.1f}M float32 parameters, {args.threads} thread(s), "
        f"median of {args.repeats}\n"
    )
    print("| implementation | step ms | / torch | max abs diff vs torch |")
    print("|---|---:|---:|---:|")
    reference = optimizers["torch"][0]
    for name in names:
        median = statistics.median(seconds[name])
        diff = max(
            float((p - r).detach().abs().max()) for p, r in zip(optimizers[name][0], reference)
        )
        print(f"| {name} | {median * 1e3:.1f} | {median / baseline:.2f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
