"""Exercise TrainingBackend in one process group and write what happened to OUT.

Launched by tests/distributed/test_backend_distributed.py, either as
``accelerate launch --multi_gpu --num_processes 2 ... backend_checks.py`` or with plain
``python backend_checks.py`` (one process). For each tiny model (tied and untied embeddings):

1. generation before any training forward, inside ``generation_context``, vs the unsharded
   Hugging Face model's greedy output;
2. one SGD step on this process's half of a fixed global batch (loss normalised by the
   global token count, times num_processes), with gradient clipping; full gradients and
   updated parameters are saved for comparison across process counts;
3. resume: AdamW for 2k steps straight vs k steps, save_sharded, load into a fresh model and
   optimizer, k more steps;
4. export_hf of the trained model, reloaded with ``from_pretrained`` on every process, and
   greedy generation of the trained sharded model vs that reload.

Writes OUT/result_rank{r}.json and, on the main process, OUT/{model}_*.pt tensors.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tiny_actor import TinyActor, global_batch, global_loss_of_slice
from torch.distributed.tensor import DTensor, Shard
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.distributed.collectives import all_reduce
from rlkit.distributed.process_exit import exit_process
from rlkit.kernels.attention import grouped_sdpa_attention, set_attention_implementation
from rlkit.rollout.embedded.kv_decode import decode
from rlkit.trainer.backend import TrainingBackend

RESUME_STEPS = 2  # k: the resume check runs k + k vs 2k steps


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu().clone()


def sharding_facts(backend: TrainingBackend, model: torch.nn.Module) -> dict:
    params = list(model.parameters())
    dtensors = [p for p in params if isinstance(p, DTensor)]
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
    full = sum(p.numel() for p in params)  # a DTensor reports its global size
    local_sum = all_reduce(torch.tensor(local), "sum").item()
    mesh_sizes = sorted({p.device_mesh.size() for p in dtensors})
    return {
        "num_params": len(params),
        "num_dtensor_params": len(dtensors),
        "all_placements_shard0": all(p.placements == (Shard(0),) for p in dtensors),
        "mesh_sizes": mesh_sizes,
        "local_numel": local,
        "full_numel": full,
        "local_numel_summed_over_ranks": local_sum,
    }


def greedy(backbone, prompts: torch.Tensor, mask: torch.Tensor, **extra) -> list[list[int]]:
    # Rank 0 stops after 3 tokens, rank 1 after 6: without synced_gpus rank 1 would wait
    # forever for rank 0's share of the next all-gather.
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    out = backbone.generate(
        input_ids=prompts,
        attention_mask=mask,
        max_new_tokens=3 + 3 * (rank % 2),
        do_sample=False,
        pad_token_id=0,
        **extra,
    )
    return out[:, prompts.shape[1] :].tolist()


def rank_prompts(tokenizer, rank: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    # Different prompts (and counts) per rank, so ranks may finish at different steps.
    texts = [["1+2=", "hello world"], ["abc", "7*8=5", "zz"]][rank % 2]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def check_generation(backend, actor, reference, tokenizer) -> dict:
    prompts, mask = rank_prompts(tokenizer, backend.process_index, backend.device)
    with backend.generation_context(actor) as extra:
        sharded = greedy(actor.backbone, prompts, mask, **extra)
    expected = greedy(reference.to(backend.device), prompts, mask)
    return {"extra_kwargs": extra, "sharded": sharded, "unsharded": expected}


def check_kv_decode(backend, actor, reference, tokenizer) -> dict:
    """rlkit's decode loop under FSDP, where ranks finish at different steps.

    ``stopping``: rank 0's rows all stop at their first token (its stop ids are its own
    greedy first tokens) while rank 1 runs to 6 tokens. ``idle``: rank 0 has no
    prompts at all. Either way rank 0 must keep joining rank 1's all-gathers.
    ``shared_prefix``: as ``stopping`` with prompts 12 times as long, over the
    shared-prefix KV cache under the grouped_sdpa kernel.
    """
    rank = backend.process_index
    texts = [["1+2=", "hello world"], ["abc", "7*8=5", "zz"]][rank % 2]
    prompts = [tokenizer(t).input_ids for t in texts]
    ref = reference.to(backend.device)
    options = {"n": 2, "max_new_tokens": 6, "pad_token_id": 0, "warp": None, "greedy": True}
    free = decode(ref, prompts, stop_token_ids=[], **options)
    stops = sorted({r[0] for r in free.response_ids}) if rank % 2 == 0 else []
    expected = decode(ref, prompts, stop_token_ids=stops, **options)
    idle_prompts = [] if rank % 2 == 0 else prompts
    # Prompts past SHARED_PREFIX_MIN_TOKENS, decoded over the shared-prefix KV cache.
    long_prompts = [p * 12 for p in prompts]
    long_free = decode(ref, long_prompts, stop_token_ids=[], **options)
    long_stops = sorted({r[0] for r in long_free.response_ids}) if rank % 2 == 0 else []
    long_expected = decode(ref, long_prompts, stop_token_ids=long_stops, **options)
    attention = actor.backbone.config._attn_implementation
    with backend.generation_context(actor) as extra:
        synced = bool(extra.get("synced_gpus"))
        stopping = decode(actor.backbone, prompts, stop_token_ids=stops, synced=synced, **options)
        idle = decode(actor.backbone, idle_prompts, stop_token_ids=[], synced=synced, **options)
        grouped_sdpa_attention(actor.backbone)
        shared = decode(
            actor.backbone,
            long_prompts,
            stop_token_ids=long_stops,
            synced=synced,
            shared_prefix=True,
            **options,
        )
        set_attention_implementation(actor.backbone, attention)
    return {
        "stopping": stopping.response_ids,
        "stopping_expected": expected.response_ids,
        "idle": idle.response_ids,
        "idle_expected": free.response_ids if idle_prompts else [],
        "shared_prefix": shared.response_ids,
        "shared_prefix_expected": long_expected.response_ids,
    }


def sgd_step(backend, actor, optimizer, batch, rows) -> dict:
    loss = global_loss_of_slice(actor, batch, rows, backend.num_processes)
    backend.backward(loss)
    grads = {  # named as in the state dict: without activation checkpointing's prefix
        n.replace("._checkpoint_wrapped_module", ""): full_value(p.grad)
        for n, p in actor.named_parameters()
    }
    norm = backend.clip_grad_norm_(actor, max_norm=0.05)
    optimizer.step()
    optimizer.zero_grad()
    return {
        "sharding": sharding_facts(backend, actor),
        "loss_global": all_reduce(loss.detach().clone(), "mean").item(),
        "grad_norm": norm.item(),
        "grads": grads,
        "state": backend.full_state_dict(actor),
    }


def adamw_steps(backend, actor, opt, batch, rows, steps: int) -> None:
    for _ in range(steps):
        loss = global_loss_of_slice(actor, batch, rows, backend.num_processes)
        backend.backward(loss)
        backend.clip_grad_norm_(actor, max_norm=1.0)
        opt.step()
        opt.zero_grad()


def check_resume(backend, model_dir, batch, rows, ckpt: Path) -> dict:
    def fresh():
        return backend.prepare(
            TinyActor(model_dir), lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)
        )

    straight, straight_opt = fresh()
    adamw_steps(backend, straight, straight_opt, batch, rows, 2 * RESUME_STEPS)
    first, first_opt = fresh()
    adamw_steps(backend, first, first_opt, batch, rows, RESUME_STEPS)
    if backend.is_main_process:
        ckpt.mkdir(parents=True, exist_ok=True)
    backend.barrier()
    backend.save_sharded(str(ckpt), first, first_opt)
    resumed, resumed_opt = fresh()
    backend.load_sharded(str(ckpt), resumed, resumed_opt)
    adamw_steps(backend, resumed, resumed_opt, batch, rows, RESUME_STEPS)
    a, b = backend.full_state_dict(straight), backend.full_state_dict(resumed)
    if not backend.is_main_process:
        return {}
    diffs = [(a[k] - b[k]).abs().max().item() for k in a]
    return {
        "same_keys": sorted(a) == sorted(b),
        "bitwise_equal": all(torch.equal(a[k], b[k]) for k in a),
        "max_abs_diff": max(diffs),
        "checkpoint_files": sorted(p.name for p in ckpt.iterdir()),
    }


def check_export(backend, actor, tokenizer, export_dir: Path, state) -> dict:
    backend.export_hf(actor, tokenizer, str(export_dir))
    reloaded = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    facts = {
        "files": sorted(p.name for p in export_dir.iterdir()),
        "staging_left_over": sorted(
            p.name for p in export_dir.parent.iterdir() if p.name.startswith(".")
        ),
    }
    if backend.is_main_process:
        reloaded_state = reloaded.state_dict()
        facts["max_abs_diff_vs_full_state_dict"] = max(
            (reloaded_state[k[len("backbone.") :]] - v).abs().max().item() for k, v in state.items()
        )
    prompts, mask = rank_prompts(tokenizer, backend.process_index, backend.device)
    with backend.generation_context(actor) as extra:
        facts["trained_sharded"] = greedy(actor.backbone, prompts, mask, **extra)
    facts["trained_reloaded"] = greedy(reloaded.to(backend.device), prompts, mask)
    return facts


def check_frozen(backend, model_dir, batch, rows) -> dict:
    frozen, optimizer = backend.prepare(TinyActor(model_dir).requires_grad_(False))
    plain = TinyActor(model_dir).to(backend.device)
    args = (batch["input_ids"][rows], batch["attention_mask"][rows])
    with torch.no_grad():
        diff = (frozen(*args) - plain(*args)).abs().max().item()
    return {
        "optimizer_is_none": optimizer is None,
        "max_abs_diff_log_probs": diff,
        # FSDP2 registers the DTensor shard again once a unit is resharded.
        "root_resharded_after_forward": isinstance(
            frozen.backbone.model.embed_tokens.weight, DTensor
        ),
    }


def run_model(backend, name: str, model_dir: str, out: Path) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = {k: v.to(backend.device) for k, v in global_batch(reference.config.vocab_size).items()}
    per_rank = batch["input_ids"].shape[0] // backend.num_processes
    rows = slice(backend.process_index * per_rank, (backend.process_index + 1) * per_rank)
    result: dict = {"frozen": check_frozen(backend, model_dir, batch, rows)}

    actor, optimizer = backend.prepare(TinyActor(model_dir), lambda ps: torch.optim.SGD(ps, lr=0.5))
    # Generate before the wrapper ever ran a forward, then train the same model.
    result["generation_before_training"] = check_generation(backend, actor, reference, tokenizer)
    result["kv_decode"] = check_kv_decode(backend, actor, reference, tokenizer)
    step = sgd_step(backend, actor, optimizer, batch, rows)
    result |= {k: step[k] for k in ("sharding", "loss_global", "grad_norm")}
    result["checkpoint_wrapped_layers"] = sum(
        type(m).__name__.endswith("CheckpointWrapper")
        for m in actor.modules()  # FSDP renames
    )
    if backend.is_main_process:
        torch.save(step["grads"], out / f"{name}_grads.pt")
        torch.save(step["state"], out / f"{name}_params.pt")
        result["full_state_dict_keys"] = sorted(step["state"])
    else:
        result["full_state_dict_keys_off_main"] = sorted(step["state"])
    result["resume"] = check_resume(backend, model_dir, batch, rows, out / f"{name}_ckpt")
    result["export"] = check_export(
        backend, actor, tokenizer, out / f"{name}_export", step["state"]
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="+", required=True, help="name=dir pairs")
    parser.add_argument("--expect-none-refused", action="store_true")
    parser.add_argument("--activation-checkpointing", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    refusal = None
    if args.expect_none_refused:
        try:
            TrainingBackend(strategy="none")
        except ValueError as error:
            refusal = str(error)
    backend = TrainingBackend(
        strategy=args.strategy, seed=0, activation_checkpointing=args.activation_checkpointing
    )
    out = Path(args.out)
    result = {
        "process_index": backend.process_index,
        "num_processes": backend.num_processes,
        "is_sharded": backend.is_sharded,
        "distributed_type": str(backend.accelerator.distributed_type),
        "device": str(backend.device),
        "all_reduce": {
            op: all_reduce(torch.tensor([backend.process_index + 1.0, 3.0]), op).tolist()
            for op in ("sum", "mean", "max", "min")
        },
        "strategy_none_refusal": refusal,
        "models": {},
    }
    for pair in args.models:
        name, model_dir = pair.split("=", 1)
        result["models"][name] = run_model(backend, name, model_dir, out)
    result["seconds"] = time.perf_counter() - start
    (out / f"result_rank{backend.process_index}.json").write_text(json.dumps(result, indent=1))
    backend.close()


if __name__ == "__main__":
    main()
    exit_process(0)  # launched: no interpreter teardown racing gloo's threads
