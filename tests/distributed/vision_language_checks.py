"""One clipped SGD step of a vision-language actor on a fixed global batch of image rows,
in one plain process or under ``accelerate launch --num_processes 2`` (FSDP2 over gloo).

Launched by tests/distributed/test_vision_language_two_processes.py. The actor is rlkit's
own (:class:`~rlkit.modeling.modules.ActorModule` over the loaded Qwen2.5-VL, prepared by
:class:`~rlkit.trainer.backend.TrainingBackend`), the rows the trainer's own
(:func:`~rlkit.trainer.batch.build_batch` of image-prompt trajectories), so the images go
through the vision tower, the multimodal positions and the packed or padded forward as in
a training step. Each process takes its half of the rows; the loss is normalised by the
global token count and scaled by the process count, so the averaged gradient is the
global batch's. Writes OUT/result_rank{r}.json and, on the main process, OUT/grads.pt and
OUT/params.pt (full tensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from transformers import AutoTokenizer

from rlkit.data.image_prompts import ImagePromptRenderer
from rlkit.distributed.process_exit import exit_process
from rlkit.modeling.modules import ActorModule
from rlkit.models.loading import load_causal_lm
from rlkit.rollout.trajectory import Trajectory
from rlkit.tasks.colour_shapes import colour_dataset
from rlkit.trainer.backend import TrainingBackend
from rlkit.trainer.batch import build_batch
from rlkit.trainer.prompts import tokenize_prompts

ROWS, LR, CLIP = 4, 0.5, 0.05


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def global_batch(model_dir: str, mixed: bool = False):
    """Four image prompts, each answered by its colour's name (+ EOS), with fixed weights;
    ``mixed``: the last two rows without their image (text prompts), so that one of two
    processes holds text rows only."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = tokenize_prompts(
        colour_dataset("val", limit=ROWS),
        tokenizer,
        max_prompt_length=32,
        truncation="error",
        use_chat_template=True,
        name="val",
        images=ImagePromptRenderer.for_model(model_dir, tokenizer),
    )
    text_prompt = tokenizer("colour?", add_special_tokens=False)["input_ids"]
    trajectories = []
    for i in range(ROWS):
        answer = tokenizer(prompts.ground_truths[i], add_special_tokens=False)["input_ids"]
        response = [*answer, tokenizer.eos_token_id]
        text = mixed and i >= ROWS // 2
        trajectories.append(
            Trajectory(
                prompt_ids=text_prompt if text else prompts.token_ids[i],
                response_ids=response,
                loss_mask=[1] * len(response),
                rollout_log_probs=[0.0] * len(response),
                policy_version=[0] * len(response),
                prompt_index=i,
                multimodal_inputs=None if text else prompts.multimodal[i],
            )
        )
    batch = build_batch(
        trajectories,
        pad_token_id=tokenizer.pad_token_id,
        response_width=max(len(t.response_ids) for t in trajectories),
        index=list(range(ROWS)),
        scores=[0.0] * ROWS,
        acc=[0.0] * ROWS,
        data_sources=["colour_shapes"] * ROWS,
    )
    weights = torch.randn(ROWS, generator=torch.Generator().manual_seed(0))
    return batch, weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--remove-padding", action="store_true")
    parser.add_argument("--mixed", action="store_true", help="two rows without images")
    args = parser.parse_args()
    backend = TrainingBackend(strategy="auto", seed=0)
    rank, world = backend.process_index, backend.num_processes
    actor = ActorModule(
        load_causal_lm(args.model), chunk_size=64, remove_padding=args.remove_padding
    )
    actor, optimizer = backend.prepare(actor, lambda p: torch.optim.SGD(p, lr=LR))
    batch, weights = global_batch(args.model, args.mixed)
    mask = batch.loss_mask.float()
    per = ROWS // world
    mine = list(range(rank * per, (rank + 1) * per))
    part = batch.select(mine).to(backend.device)
    log_probs, _ = actor(part.model_inputs(), part.prompt_width, compute_entropy=False)
    loss = -(weights[mine, None] * log_probs * mask[mine]).sum() / mask.sum() * world
    backend.backward(loss)
    grads = {n: full_value(p.grad) for n, p in actor.named_parameters()}
    norm = backend.clip_grad_norm_(actor, max_norm=CLIP)
    optimizer.step()
    params = {n: full_value(p) for n, p in actor.named_parameters()}
    out = Path(args.out)
    if backend.is_main_process:
        torch.save(grads, out / "grads.pt")
        torch.save(params, out / "params.pt")
    facts = {
        "processes": world,
        "grad_norm": float(norm),
        "sharded": any(isinstance(p, DTensor) for p in actor.parameters()),
    }
    (out / f"result_rank{rank}.json").write_text(json.dumps(facts))
    backend.barrier()


if __name__ == "__main__":
    main()
    exit_process(0)
