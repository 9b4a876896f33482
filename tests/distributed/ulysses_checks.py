"""Run under ``torchrun --nproc_per_node 2``: Ulysses (k = 2) against the unsplit forward.

Each process holds the same tiny model twice: an unsplit copy (plain padded rows, one
process's view of the truth) and a copy whose actor and critic split the packed sequence
with the other process. For each model, batch and module it records the largest
difference of log-probs, entropy, values, the five aggregated losses and every gradient
(the group's partial gradients summed), with the tolerance ``2 gamma_D`` of the
quantity's magnitude (tests/numerics.py). Writes ``{case: {quantity: [diff, tol]}}`` as
JSON to ``argv[1]`` on rank 0.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from algorithms import aggregation  # noqa: F401  (registers the modes)
from rlkit.distributed.sequence_parallel import build_sequence_parallel
from rlkit.modeling.modules import ActorModule, CriticModule
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from rlkit.models.tiny_families import build_tiny_family
from rlkit.registry import AGGREGATIONS
from rlkit.testing.loss_checks import MODES
from tests.numerics import gamma, reduction_depth

FAMILIES = ("qwen2", "qwen2_window", "llama3", "mistral", "gemma2", "gemma3", "qwen3_moe")


def _rows(prompts: list[int], responses: list[int], response_width: int, vocab: int):
    """Model inputs of rows with prompts / responses of these lengths (left-padded
    prompts, right-padded responses, as TrainBatch lays them out) and a response mask."""
    g = torch.Generator().manual_seed(sum(prompts) * 31 + sum(responses))
    width = max(prompts)
    b = len(prompts)
    ids = torch.zeros(b, width + response_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (p, r) in enumerate(zip(prompts, responses)):
        ids[row, width - p : width + r] = torch.randint(3, vocab, (p + r,), generator=g)
        mask[row, width - p : width + r] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        "responses": ids[:, width:],
    }
    return batch, width, mask[:, width:].float()


#: (prompt lengths, response lengths, response width): odd totals, rows shorter than k
#: tokens (a 1-token prompt with an empty response), a micro-batch of one real token
#: (process 1 holds only padding).
BATCHES = {
    "mixed": ([3, 1, 5, 2], [4, 1, 6, 3], 6),
    "short_rows": ([1, 4, 1], [0, 3, 1], 3),
    "one_token": ([1], [0], 1),
}


def _diff(got: torch.Tensor, want: torch.Tensor, depth: int) -> list[float]:
    if want.numel() == 0:  # nothing to predict (a micro-batch of one token)
        return [float(got.numel()), 1.0]
    return [float((got - want).abs().max()), 2 * gamma(depth) * float(want.abs().max() or 1.0)]


def _losses(logp, ent, values, mask) -> dict[str, torch.Tensor]:
    """A loss per aggregation mode of a policy-gradient-like matrix, plus value and
    entropy terms, so every output reaches the gradients."""
    advantages = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape)
    loss_mat = -advantages * logp - 0.01 * ent + 0.5 * values.square()
    return {m: AGGREGATIONS.get(m)(loss_mat, mask) for m in MODES}


def _compare(
    model_dir: Path, sp, name: str, checkpointing: bool = False
) -> dict[str, dict[str, list[float]]]:
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base.config._attn_implementation = "eager"  # the unsplit truth: transformers' own
    split_backbone = copy.deepcopy(base)
    if checkpointing:  # the backward recomputes each layer, exchanges included
        split_backbone.train()
        split_backbone.gradient_checkpointing_enable({"use_reentrant": False})
    plain_actor, plain_critic = ActorModule(base), CriticModule(copy.deepcopy(base.model))
    actor = ActorModule(split_backbone, sequence_parallel=sp)
    critic = CriticModule(copy.deepcopy(base.model), sequence_parallel=sp)
    critic.value_head.load_state_dict(plain_critic.value_head.state_dict())
    for module in (plain_critic, critic):  # a non-zero head, so value gradients flow
        torch.nn.init.normal_(module.value_head.weight, generator=torch.Generator().manual_seed(0))
    out = {}
    for batch_name, (prompts, responses, width) in BATCHES.items():
        batch, p, mask = _rows(prompts, responses, width, base.config.vocab_size)
        depth = reduction_depth(
            base.config, rows=len(prompts), positions=batch["input_ids"].shape[1]
        )
        got, want = {}, {}
        for side, (a, c) in {
            "split": (actor, critic),
            "plain": (plain_actor, plain_critic),
        }.items():
            for m in (a, c):
                m.zero_grad(set_to_none=True)
            logp, ent = a(batch, p, temperature=0.7)
            values = c(batch, p)
            losses = _losses(logp, ent, values, mask)
            sum(losses.values()).backward()
            keep = mask.bool()
            record = {"logp": logp[keep], "entropy": ent[keep], "values": values[keep]}
            record |= {f"loss/{m}": v.detach() for m, v in losses.items()}
            grads = {}
            for module_name, m in (("actor", a), ("critic", c)):
                for pname, param in m.named_parameters():
                    g = param.grad if param.grad is not None else torch.zeros_like(param)
                    grads[f"grad/{module_name}/{pname}"] = g
            if side == "split":  # each process holds the gradient of its part: sum them
                for g in grads.values():
                    dist.all_reduce(g, group=sp.group)
            (got if side == "split" else want).update(
                {k: v.detach() for k, v in (record | grads).items()}
            )
        case = {k: _diff(got[k], want[k], depth) for k in want if not k.startswith("grad/")}
        grad_diffs = [_diff(got[k], want[k], depth) for k in want if k.startswith("grad/")]
        worst = max(grad_diffs, key=lambda d: d[0] / d[1])
        case[f"grads (worst of {len(grad_diffs)})"] = worst
        out[f"{name}/{batch_name}"] = case
    return out


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    out_path, root = Path(sys.argv[1]), Path(sys.argv[1]).parent / "ulysses_models"
    sp = build_sequence_parallel(2)
    if dist.get_rank() == 0:
        tokenizer = train_byte_tokenizer()
        for family in FAMILIES:
            build_tiny_family(family, root / family, tokenizer, seed=0)
        # One key/value head for two processes: it is repeated, one copy each.
        build_tiny_qwen2(root / "qwen2_one_kv_head", tokenizer, num_heads=2, num_kv_heads=1)
    dist.barrier()
    results = {}
    for name in (*FAMILIES, "qwen2_one_kv_head"):
        results |= _compare(root / name, sp, name)
    results |= _compare(root / "qwen2", sp, "qwen2_checkpointing", checkpointing=True)
    if dist.get_rank() == 0:
        out_path.write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
