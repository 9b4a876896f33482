"""Peak memory and time of per-token log-prob + entropy: chunked kernel vs naive.

Forward + backward of ``token_logprobs_and_entropy`` (gradients w.r.t. the hidden
states and the LM-head weight, upstream gradients on both outputs) at the size of
Qwen2.5-0.5B's head: tokens = 4096, vocab = 151936, hidden = 896, float32.

Each variant runs in a fresh subprocess; its peak memory is the growth of the
process's peak resident set (``ru_maxrss``) over its resident set just before the
run (the inputs are already allocated), which counts every tensor torch makes,
the weight gradient included. (tracemalloc does not see torch's allocations.)
Rounds alternate the variants so that load from other processes spreads evenly;
the time reported is the fastest run of each variant.

    .venv/bin/python benchmarks/logprobs.py                     # the full size
    .venv/bin/python benchmarks/logprobs.py --tokens 512 --rounds 1   # a quick look

Target: peak memory <= 1/8 of naive at <= 1.3x naive time.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

import torch

from rlkit.device.host_memory import peak_rss_bytes, process_rss_bytes
from rlkit.ops import token_logprobs_and_entropy

GIB = float(1 << 30)


def _worker(args: argparse.Namespace) -> None:
    """Run one variant and print one JSON line: peak growth (bytes), times, checksums."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=gen).requires_grad_()
    weight = (0.05 * torch.randn(args.vocab, args.hidden, generator=gen)).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=gen)
    grad_lp = torch.randn(args.tokens, generator=gen) / args.tokens
    grad_ent = torch.randn(args.tokens, generator=gen) / args.tokens
    gc.collect()
    before = process_rss_bytes()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        lp, ent = token_logprobs_and_entropy(
            hidden, weight, labels, chunk_size=args.chunk, kernel=args.kernel
        )
        ((lp * grad_lp).sum() + (ent * grad_ent).sum()).backward()
        times.append(time.perf_counter() - start)
        checks = [
            lp.sum().item(),
            ent.sum().item(),
            hidden.grad.norm().item(),
            weight.grad.norm().item(),
        ]
        del lp, ent
        hidden.grad = weight.grad = None
    print(json.dumps({"peak": peak_rss_bytes() - before, "times": times, "checks": checks}))


def _run_variant(args: argparse.Namespace, kernel: str, chunk: int) -> dict:
    cmd = [
        sys.executable, __file__, "--worker",
        "--kernel", kernel, "--chunk", str(chunk), "--repeats", str(args.repeats),
        "--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden),
    ]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--chunks", default="256,512,1024", help="chunk sizes of the fused kernel")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of all variants")
    parser.add_argument("--repeats", type=int, default=1, help="runs per subprocess")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", default="naive", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=1024, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    variants = [("naive", 0)] + [("chunked", int(c)) for c in args.chunks.split(",")]
    peaks: dict[tuple[str, int], int] = {}
    times: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    checks: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for kernel, chunk in variants:
            result = _run_variant(args, kernel, max(chunk, 1))
            peaks[(kernel, chunk)] = max(peaks.get((kernel, chunk), 0), result["peak"])
            times[(kernel, chunk)] += result["times"]
            checks[(kernel, chunk)] = result["checks"]
    print(
        f"tokens={args.tokens} vocab={args.vocab} hidden={args.hidden} float32, forward+backward, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of "
        f"{args.rounds * args.repeats}"
    )
    print(
        f"{'variant':<16}{'peak GiB':>10}{'mem ratio':>11}{'time s':>9}{'time ratio':>12}  checksums"
    )
    base = ("naive", 0)
    for v in variants:
        name = v[0] if v == base else f"chunked/{v[1]}"
        mem_ratio = peaks[v] / peaks[base]
        time_ratio = min(times[v]) / min(times[base])
        check = ", ".join(f"{c:.6g}" for c in checks[v])
        print(
            f"{name:<16}{peaks[v] / GIB:>10.3f}{mem_ratio:>11.3f}{min(times[v]):>9.2f}"
            f"{time_ratio:>12.3f}  {check}"
        )


if __name__ == "__main__":
    main()
