"""Benchmark tensor parallelism on CPU: memory per process and step time, t = 1 vs t = 2.

Usage::

    .venv/bin/python benchmarks/tensor_parallel.py [--hidden-size 512 --layers 4
        --heads 8 --kv-heads 4 --vocab 8192 --rows 8 --tokens 256 --repeats 3]

Trains a random Qwen2 of the given shape (actor log-probs and entropy, AdamW) on one
fixed global batch of ``--rows`` sequences of ``--tokens`` tokens, through rlkit's
``TrainingBackend``, in three layouts, each its own ``torch.distributed.run`` job (gloo,
one thread per process):

* one process, unsplit (the baseline);
* 2 processes, FSDP2 (t = 1): each process its half of the rows, parameters sharded;
* 2 processes, t = 2 (FSDP2 over a 1-process data-parallel axis): both processes all
  rows, every layer split.

Per process it reports the bytes of its parameters, gradients and AdamW moments (the
local shards it keeps between steps), the activations autograd saves for the backward
pass (distinct storages, parameters left out), and the wall time of one optimizer step
(forward, backward, clip, AdamW; median of ``--repeats`` after one warm-up step). The
ratios are against the baseline (the first of ``--layouts``), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_cpu import cpu_name  # noqa: E402
from ulysses import _free_port  # noqa: E402

#: (key, name, processes, tensor-parallel size)
LAYOUTS = (
    ("one", "1 process", 1, 1),
    ("fsdp2", "2 processes, FSDP2", 2, 1),
    ("tp", "2 processes, t = 2", 2, 2),
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: one GPU per process (NCCL); needs 2 GPUs",
    )
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument(
        "--layouts",
        default="one,fsdp2,tp",
        help="comma-separated subset of one, fsdp2, tp (the first is the baseline)",
    )
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--worker-tp", type=int, default=1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------- measuring (in a worker)
@contextmanager
def saved_activation_bytes(box: list[int], parameters: set[int]):
    """Sum, into ``box[0]``, the bytes of the distinct storages autograd saves (a DTensor's
    local shard), leaving out the ``parameters``' storages."""
    from torch.distributed.tensor import DTensor

    seen: set[int] = set(parameters)

    def pack(t: torch.Tensor) -> torch.Tensor:
        local = t._local_tensor if isinstance(t, DTensor) else t
        try:
            storage = local.untyped_storage()
            ptr = storage.data_ptr()
        except RuntimeError:  # FSDP2's gathered weights: their storage is managed apart
            return t
        if ptr not in seen:
            seen.add(ptr)
            box[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def _local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def _batch(args: argparse.Namespace) -> tuple[dict, int]:
    prompt = args.tokens // 4
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (args.rows, args.tokens), generator=g)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(args.tokens).expand(args.rows, -1),
        "responses": ids[:, prompt:],
    }
    return batch, prompt


def worker(args: argparse.Namespace) -> None:
    from tiny_models import random_qwen2

    from rlkit.modeling.modules import ActorModule
    from rlkit.trainer.backend import TrainingBackend

    torch.set_num_threads(1)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    strategy = "fsdp2" if processes > 1 else "none"
    backend = TrainingBackend(strategy=strategy, tensor_parallel_size=args.worker_tp)
    backbone = random_qwen2(  # seeded: the same weights in every process
        vocab_size=args.vocab,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=2 * args.hidden_size,
        max_position_embeddings=args.tokens,
    )
    actor, optimizer = backend.prepare(
        ActorModule(backbone, share_prefix=False), lambda ps: torch.optim.AdamW(ps, lr=1e-5)
    )
    batch, prompt = _batch(args)
    rank, size = backend.data_parallel
    rows = slice(rank * args.rows // size, (rank + 1) * args.rows // size)
    local = {k: v[rows].to(backend.device) for k, v in batch.items()}
    params = [p for p in actor.parameters()]
    storages = {
        (p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr() for p in params
    }
    seconds, activations, grads = [], 0, 0
    for _ in range(args.repeats + 1):
        backend.barrier()
        start = time.perf_counter()
        box = [0]
        with saved_activation_bytes(box, storages):
            logp, ent = actor(local, prompt, 1.0, True)
        loss = -(logp.mean() + 0.01 * ent.mean())
        backend.backward(loss * backend.gradient_scale)
        grads = _local_bytes(p.grad for p in params if p.grad is not None)
        backend.clip_grad_norm_(actor, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        backend.barrier()
        if backend.device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        activations = box[0]
    state = [v for s in optimizer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    import resource

    result = {
        "params": _local_bytes(params),
        "grads": grads,
        "optimizer": _local_bytes(state),
        "activations": activations,
        "step_s": statistics.median(seconds[1:]),
        "peak": (
            torch.cuda.max_memory_allocated()
            if backend.device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        ),
    }
    gathered = [result] if processes == 1 else _gather(result)
    if backend.is_main_process:
        Path(args.worker_out).write_text(json.dumps(gathered))
    backend.close()


def _gather(result: dict) -> list[dict]:
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, result)
    return out


# ---------------------------------------------------------------- the table (launcher)
def _launch(argv: list[str], cuda: bool, processes: int, tp: int, out: Path) -> list[dict]:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU layouts, also on a GPU machine
    script = [str(Path(__file__).resolve()), *argv, "--worker-out", str(out)]
    script += ["--worker-tp", str(tp)]
    if processes == 1:
        command = [sys.executable, *script]
    else:
        command = [
            *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)),
            *("--master_port", str(_free_port())),
            *script,
        ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the benchmark's processes failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.worker_out:
        from rlkit.distributed.process_exit import exit_process

        worker(args)
        exit_process(0)  # past the interpreter teardown that can abort a finished gloo job
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        keys = args.layouts.split(",")
        unknown = sorted(set(keys) - {key for key, *_ in LAYOUTS})
        if unknown:
            raise SystemExit(f"unknown layouts {unknown} in --layouts; known: one, fsdp2, tp")
        for _, name, processes, tp in [layout for layout in LAYOUTS if layout[0] in keys]:
            ranks = _launch(
                argv, args.device == "cuda", processes, tp, Path(tmp) / f"{processes}_{tp}.json"
            )
            rows.append((name, {k: max(r[k] for r in ranks) for k in ranks[0]}))
    mib = 2.0**20
    where = "CUDA, NCCL" if args.device == "cuda" else f"gloo, 1 thread per process; {cpu_name()}"
    print(
        f"\nTensor parallelism, random Qwen2 hidden {args.hidden_size}, {args.layers} layers, "
        f"{args.heads} heads / {args.kv_heads} kv heads, vocab {args.vocab}; a global batch "
        f"of {args.rows} x {args.tokens} tokens; {where}; the larger process of each "
        f"layout; step: median of {args.repeats}\n"
    )
    peak = "peak CUDA MiB" if args.device == "cuda" else "peak RSS MiB"
    columns = (
        ("params", "parameters MiB"),
        ("grads", "gradients MiB"),
        ("optimizer", "AdamW moments MiB"),
        ("activations", "saved activations MiB"),
        ("peak", peak),
    )
    print("| layout | " + " | ".join(h for _, h in columns) + " | step s | step vs 1 process |")
    print("|---|" + "---:|" * (len(columns) + 2))
    base = rows[0][1]
    for name, r in rows:
        cells = [f"{r[k] / mib:.1f} ({r[k] / base[k]:.2f}x)" for k, _ in columns]
        ratio = r["step_s"] / base["step_s"]
        print(f"| {name} | " + " | ".join(cells) + f" | {r['step_s']:.2f} | {ratio:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps([{"layout": n} | r for n, r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
