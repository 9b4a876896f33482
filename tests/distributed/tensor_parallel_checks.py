"""Run under ``torch.distributed.run --nproc_per_node N`` with ``argv = [out.json, t,
[--activation-checkpointing], family, ...]``: tensor parallelism (t processes split each layer, N / t data-parallel
groups under FSDP2) against the unsplit model in one process.

Every process holds each tiny model twice: an unsplit copy that computes the whole batch
(one process's view of the truth) and a copy prepared by the TrainingBackend, whose
actor and critic split every layer over the tensor-parallel group and take only their
data-parallel group's rows. It records the largest difference of log-probs, entropy,
values, the globally normalised loss, every gradient (gathered from its shards) and the
clipped gradient norm, with the tolerance ``2 gamma_D`` of the quantity's magnitude
(tests/numerics.py). Writes ``{case: {quantity: [diff, tol]}}`` as JSON on rank 0.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from rlkit.modeling.modules import ActorModule, CriticModule
from rlkit.trainer.backend import TrainingBackend
from tests.distributed.ulysses_checks import BATCHES, _rows
from tests.numerics import gamma, reduction_depth


def _diff(got: torch.Tensor, want: torch.Tensor, depth: int) -> list[float]:
    return [float((got - want).abs().max()), 2 * gamma(depth) * float(want.abs().max() or 1.0)]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _step(actor, critic, batch, p, mask, rows, scale):
    """Log-probs, entropy and values of ``rows``, and the loss of those rows normalised by
    the whole batch's tokens (times ``scale``), after its backward."""
    local = {k: v[rows] for k, v in batch.items()}
    logp, ent = actor(local, p, temperature=0.7)
    values = critic(local, p)
    advantages = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape)[rows]
    loss_mat = -advantages * logp - 0.01 * ent + 0.5 * values.square()
    loss = (loss_mat * mask[rows]).sum() / mask.sum()
    (loss * scale).backward()
    return logp, ent, values, loss


def _gathered_rows(tensor: torch.Tensor, backend: TrainingBackend) -> torch.Tensor:
    """Every data-parallel group's rows, in group order (one copy per group)."""
    parts = [torch.empty_like(tensor) for _ in range(backend.num_processes)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts[:: backend.row_replicas])


def _compare(model_dir: Path, backend: TrainingBackend, name: str) -> dict[str, dict]:
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain_actor, plain_critic = ActorModule(base), CriticModule(copy.deepcopy(base.model))
    torch.nn.init.normal_(
        plain_critic.value_head.weight, generator=torch.Generator().manual_seed(0)
    )  # a non-zero head, so value gradients flow into the trunk
    actor, critic = copy.deepcopy(plain_actor), copy.deepcopy(plain_critic)

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3)

    actor, actor_opt = backend.prepare(actor, adamw)
    critic, critic_opt = backend.prepare(critic, adamw)
    dp_rank, dp_size = backend.data_parallel
    out = {}
    for batch_name, (prompts, responses, width) in BATCHES.items():
        if len(prompts) % dp_size:
            continue
        batch, p, mask = _rows(prompts, responses, width, base.config.vocab_size)
        if not mask.any():  # no response token: no loss to normalise
            continue
        depth = reduction_depth(
            base.config, rows=len(prompts), positions=batch["input_ids"].shape[1]
        )
        per = len(prompts) // dp_size
        mine = slice(dp_rank * per, (dp_rank + 1) * per)
        for m in (plain_actor, plain_critic, actor, critic):
            m.zero_grad(set_to_none=True)
        want = _step(plain_actor, plain_critic, batch, p, mask, slice(None), 1.0)
        got = _step(actor, critic, batch, p, mask, mine, backend.gradient_scale)
        keep = mask.bool()
        case = {}
        for i, quantity in enumerate(("logp", "entropy", "values")):
            split = _gathered_rows(got[i].detach(), backend)
            case[quantity] = _diff(split[keep], want[i].detach()[keep], depth)
        loss = got[3].detach().clone()
        dist.all_reduce(loss)  # the data-parallel groups' parts, each counted t times
        case["loss"] = _diff(loss / backend.row_replicas, want[3].detach(), depth)
        grad_diffs = []
        for split_m, plain_m in ((actor, plain_actor), (critic, plain_critic)):
            grads = dict(plain_m.named_parameters())
            for pname, param in split_m.named_parameters():
                g = _full(param.grad) if param.grad is not None else None
                want_g = grads[pname.replace("_checkpoint_wrapped_module.", "")].grad
                if want_g is None:
                    want_g = torch.zeros(param.shape)
                grad_diffs.append(
                    _diff(torch.zeros_like(want_g) if g is None else g, want_g, depth)
                )
        worst = max(grad_diffs, key=lambda d: d[0] / d[1])
        case[f"grads (worst of {len(grad_diffs)})"] = worst
        plain_params = [q for q in plain_actor.parameters() if q.grad is not None]
        want_norm = torch.nn.utils.get_total_norm([q.grad for q in plain_params])
        got_norm = backend.clip_grad_norm_(actor, 1e9)
        case["grad_norm"] = _diff(got_norm, want_norm, depth)
        out[f"{name}/{batch_name}"] = case
    for optimizer in (actor_opt, critic_opt):  # the sharded AdamW steps run
        optimizer.step()
    return out


def main() -> None:
    out_path, tp, families = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    checkpointing = families[0] == "--activation-checkpointing"  # the backend's own
    families = families[checkpointing:]
    torch.set_num_threads(1)
    backend = TrainingBackend(
        strategy="fsdp2", seed=0, tensor_parallel_size=tp, activation_checkpointing=checkpointing
    )
    results = {}
    for family in families:
        results |= _compare(out_path.parent / "models" / family, backend, family)
    if backend.is_main_process:
        out_path.write_text(json.dumps(results, indent=1))
    backend.close()


if __name__ == "__main__":
    from rlkit.distributed.process_exit import exit_process

    main()
    exit_process(0)  # past the interpreter teardown that can abort a finished gloo job
