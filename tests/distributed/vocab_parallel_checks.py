"""Run under ``torch.distributed.run --nproc_per_node 2`` (gloo): the vocabulary-parallel
log-prob/entropy op against the unsplit one; rank 0 writes the largest differences."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rlkit.ops.logprobs import logprobs_and_entropy_from_logits
from rlkit.ops.vocab_parallel import (
    gathered_logprobs_and_entropy,
    vocab_parallel_logprobs_and_entropy,
)

VOCAB, SPLIT = 50, 23  # uneven slices: [0, 23) and [23, 50)


def case(temperature: float, masked: bool) -> dict[str, float]:
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(0)  # the same full logits on both processes
    full = torch.randn(3, 7, VOCAB, generator=generator) * 4
    if masked:
        full[..., 40:] = float("-inf")  # a masked tail of the vocabulary (never a label)
    labels = torch.randint(0, 40, (3, 7), generator=generator)
    labels[0, 0], labels[0, 1] = SPLIT - 1, SPLIT  # both sides of the boundary
    g_logp, g_entropy = (
        torch.randn(3, 7, generator=generator),
        torch.randn(3, 7, generator=generator),
    )
    start, stop = (0, SPLIT) if rank == 0 else (SPLIT, VOCAB)

    def run(op, **kw):
        shard = full[..., start:stop].clone().requires_grad_(True)
        log_p, entropy = op(shard, labels, temperature=temperature, **kw)
        ((log_p * g_logp).sum() + (entropy * g_entropy).sum()).backward()
        return log_p.detach(), entropy.detach(), shard.grad

    parallel = run(vocab_parallel_logprobs_and_entropy, vocab_start=start)
    plain = run(gathered_logprobs_and_entropy)
    reference_logits = full.clone().requires_grad_(True)
    ref_logp, ref_entropy = logprobs_and_entropy_from_logits(
        reference_logits, labels, temperature=temperature
    )
    ((ref_logp * g_logp).sum() + (ref_entropy * g_entropy).sum()).backward()
    ref_grad = reference_logits.grad[..., start:stop]

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        finite = torch.isfinite(b)
        same_inf = bool((a[~finite] == b[~finite]).all())
        return float((a[finite] - b[finite]).abs().max()) if same_inf else float("inf")

    out = {
        "log_p": diff(parallel[0], ref_logp.detach()),
        "entropy": diff(parallel[1], ref_entropy.detach()),
        "grad": diff(parallel[2], ref_grad),
        "plain_log_p": diff(plain[0], ref_logp.detach()),
        "plain_grad": diff(plain[2], ref_grad),
        "grad_scale": float(ref_grad.abs().max()),
    }
    worst = torch.tensor([out[k] for k in sorted(out)])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the worse of the two slices
    return dict(zip(sorted(out), worst.tolist()))


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {f"T={t},masked={m}": case(t, m) for t in (1.0, 0.7) for m in (False, True)}
    if dist.get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
