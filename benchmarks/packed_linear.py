"""Benchmark a decode step's layer products on plain weights vs weights packed for oneDNN.

Usage::

    .venv/bin/python benchmarks/packed_linear.py [--models 512x8,384x6 --rows 64
        --rounds 3 --seconds 1 --threads 1]

Each model ``<hidden>x<layers>`` is the end-to-end benchmark's random Qwen2 of that size
(4 query and 2 key/value heads, intermediate 4 x hidden): ``512x8`` is ``realistic``'s,
``384x6`` the 6-layer workload's. One decode step runs every layer's q, k, v, o, gate, up
and down products in order at ``--rows`` rows, each weight used once, so the weights
stream from memory as in generation (``streamed_bound`` of ``e2e_grpo_vs_trl.py``).
``plain`` is ``F.linear``, which has oneDNN reorder a bf16 weight at every call;
``packed`` runs the layers inside :func:`rlkit.kernels.packed_linear.packed_linears`, as
the rollout engine does for bf16 layers by default and for float32 ones with
``linear_weights="packed"``. Rounds alternate which goes first; the table gives each
side's median GFLOP/s, the ratio packed / plain, and how far one product's results differ
(bf16: bitwise equal; float32: another kernel's rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

from e2e_grpo_vs_trl import streamed_bound  # noqa: E402
from host_cpu import cpu_name  # noqa: E402

from rlkit.kernels.packed_linear import packed_linears  # noqa: E402


def qwen2_config(hidden: int, layers: int):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=259, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip


def largest_difference(hidden: int, rows: int, dtype: torch.dtype) -> float:
    """max |packed - plain| of one gate projection's output, relative to its largest entry."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(hidden, 4 * hidden).to(dtype)
    x = torch.randn(rows, hidden, dtype=dtype)
    with torch.no_grad():
        plain = layer(x).float()
        with packed_linears(layer):
            packed = layer(x).float()
    return ((packed - plain).abs().max() / plain.abs().max()).item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="512x8,384x6", help="<hidden>x<layers>, ...")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    dtypes = ["float32"]
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        dtypes.append("bf16")
    print(
        f"One decode step's layer products, weights streamed, {args.rows} rows, "
        f"{args.threads} thread(s), {cpu_name()}\n"
    )
    print("| model | dtype | plain GFLOP/s | packed GFLOP/s | packed / plain | max rel. diff |")
    print("|---|---|---:|---:|---:|---:|")
    for model in args.models.split(","):
        hidden, layers = (int(x) for x in model.split("x"))
        config = qwen2_config(hidden, layers)
        for dtype in dtypes:
            rates: dict[bool, list[float]] = {False: [], True: []}
            for r in range(args.rounds):
                for packed in (False, True) if r % 2 == 0 else (True, False):
                    rate = streamed_bound(
                        config, args.rows, args.threads, dtype, args.seconds, packed=packed
                    )
                    rates[packed].append(rate)
            plain, packed = (statistics.median(rates[p]) for p in (False, True))
            kind = torch.bfloat16 if dtype == "bf16" else torch.float32
            diff = largest_difference(hidden, args.rows, kind)
            print(
                f"| {model} | {dtype} | {plain / 1e9:.1f} | {packed / 1e9:.1f} | "
                f"{packed / plain:.2f} | {diff:.1e} |"
            )
    if "bf16" not in dtypes:
        print("\nbf16 skipped: oneDNN has no bf16 kernels on this CPU.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
