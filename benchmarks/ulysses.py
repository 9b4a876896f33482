"""Benchmark Ulysses sequence parallelism: activation memory and exchange time per process.

Usage::

    .venv/bin/python benchmarks/ulysses.py [--tokens 8192 --hidden-size 256 --layers 4
        --heads 4 --kv-heads 2 --repeats 3]

Starts 2 CPU processes (``torch.distributed.run``, gloo, one thread each) and trains
one actor forward + backward over ONE sequence of ``--tokens`` tokens (an eighth prompt,
the rest response) on a random Qwen2 of the given shape:

* ``k = 1``: process 0 alone runs the whole packed sequence (the other waits);
* ``k = 2``: both processes split it (:mod:`rlkit.modeling.ulysses`).

Activation memory is what autograd keeps for the backward pass, summed over distinct
storages at the end of the forward (``torch.autograd.graph.saved_tensors_hooks``),
parameters left out: the activations a training forward holds at its peak. The exchange time is the all-to-all
calls' wall time in forward and backward (``_all_to_all``), the attention time that of
the segment attention's forward; both per decoder layer, medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_cpu import cpu_name  # noqa: E402


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------- measuring (in a worker)
@contextmanager
def saved_activation_bytes(box: list[int], parameters: set[int]):
    """Sum, into ``box[0]``, the bytes of the distinct storages autograd saves, leaving
    out the ``parameters``' storages (weights, not activations)."""
    seen: set[int] = set(parameters)

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            box[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


class Stopwatch:
    """Accumulated wall time of the calls of one function."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def _model(args: argparse.Namespace):
    from tiny_models import random_qwen2

    return random_qwen2(  # seeded: the same weights on both processes
        vocab_size=512,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=2 * args.hidden_size,
        max_position_embeddings=args.tokens,
    )


def _batch(tokens: int) -> tuple[dict, int]:
    prompt = tokens // 8
    ids = torch.randint(3, 512, (1, tokens), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.arange(tokens)[None],
        "responses": ids[:, prompt:],
    }
    return batch, prompt


def _step(actor, batch: dict, prompt: int) -> tuple[int, float]:
    """(activation bytes, seconds) of one forward + backward."""
    box = [0]
    parameters = {p.untyped_storage().data_ptr() for p in actor.parameters()}
    start = time.perf_counter()
    with saved_activation_bytes(box, parameters):
        logp, ent = actor(batch, prompt, 1.0, True)
    (-(logp.sum()) - 0.01 * ent.sum()).backward()
    actor.zero_grad(set_to_none=True)
    return box[0], time.perf_counter() - start


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    import rlkit.distributed.sequence_parallel as exchanges
    from rlkit.distributed.sequence_parallel import build_sequence_parallel
    from rlkit.kernels.attention import grouped_sdpa_attention
    from rlkit.kernels.segmented_attention import AttentionSegments
    from rlkit.modeling.modules import ActorModule

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    sp = build_sequence_parallel(2)
    batch, prompt = _batch(args.tokens)
    results: dict[str, list] = {"k1": [], "k2": [], "a2a": [], "attention": []}
    exchange, attention = Stopwatch(), Stopwatch()
    exchanges._all_to_all = exchange.wrap(exchanges._all_to_all)
    AttentionSegments.attend = attention.wrap(AttentionSegments.attend)
    plain_backbone = _model(args)
    grouped_sdpa_attention(plain_backbone)  # the same attention code as the split run
    plain = ActorModule(plain_backbone, remove_padding=True)
    split = ActorModule(_model(args), sequence_parallel=sp)
    for _ in range(args.repeats):
        if rank == 0:
            results["k1"].append(_step(plain, batch, prompt))
        dist.barrier()
        exchange.seconds = attention.seconds = 0.0
        results["k2"].append(_step(split, batch, prompt))
        results["a2a"].append(exchange.seconds / args.layers)
        results["attention"].append(attention.seconds / args.layers)
        dist.barrier()
    gathered = [None, None]
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the table (launcher)
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(argv: list[str], out: Path) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"),
        *("--master_port", str(_free_port()), str(Path(__file__).resolve())),
        *argv,
        *("--worker-out", str(out)),
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the benchmark's processes failed:\n{proc.stderr[-4000:]}")


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.worker_out:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        _launch(argv, out)
        ranks = json.loads(out.read_text())
    k1_bytes = _median([b for b, _ in ranks[0]["k1"]])
    k1_time = _median([s for _, s in ranks[0]["k1"]])
    k2_bytes = max(_median([b for b, _ in r["k2"]]) for r in ranks)
    k2_time = max(_median([s for _, s in r["k2"]]) for r in ranks)
    a2a = max(_median(r["a2a"]) for r in ranks)
    attn = max(_median(r["attention"]) for r in ranks)
    mib = 2.0**20
    print(
        f"\nUlysses, one sequence of {args.tokens} tokens, Qwen2 hidden {args.hidden_size}, "
        f"{args.layers} layers, {args.heads} heads / {args.kv_heads} kv heads; 2 processes, "
        f"gloo, 1 thread each; {cpu_name()}; medians of {args.repeats}\n"
    )
    print("| k | activation MiB per process | vs k = 1 | forward + backward s | vs k = 1 |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| 1 | {k1_bytes / mib:.1f} | 1.00x | {k1_time:.2f} | 1.00x |")
    print(
        f"| 2 | {k2_bytes / mib:.1f} | {k2_bytes / k1_bytes:.2f}x | {k2_time:.2f} "
        f"| {k2_time / k1_time:.2f}x |"
    )
    print("\n| per decoder layer (k = 2) | ms |")
    print("|---|---:|")
    print(f"| all-to-all, forward + backward | {a2a * 1e3:.2f} |")
    print(f"| attention, forward | {attn * 1e3:.2f} |")
    print(f"| all-to-all / attention | {a2a / attn:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
