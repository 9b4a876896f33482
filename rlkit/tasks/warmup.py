"""Supervised warm-up of a tiny model, and the cache that keeps it between runs.

The built-in tasks build a tiny Qwen2 and train it briefly on demonstrations so that
RL starts from a policy that knows the answer format. A model directory trained with
the same settings is reused (``rlkit_sft.json`` records them); a new one is written
beside it and renamed into place only when complete.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MARKER = "rlkit_sft.json"


_BUILDING: dict[Path, int] = {}
"""Lock files held by this process while it builds the model of a directory."""


def cached(out: Path, settings: dict[str, Any]) -> bool:
    """True when ``out`` holds a model trained with exactly ``settings``.

    Otherwise this process now builds it: it holds ``out``'s lock until :func:`publish`
    (or its exit), so the processes of a multi-process launch, which all evaluate the
    experiment's model reference, build it once: the others wait here and then find it.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.with_name(out.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    marker = out / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("settings") == settings:
        os.close(fd)  # closing releases the lock
        return True
    _BUILDING[out.resolve()] = fd
    return False


def fresh_model(
    out: Path,
    tokenizer: Any,
    *,
    hidden_size: int,
    num_layers: int,
    max_positions: int,
    seed: int,
    num_heads: int = 4,
) -> tuple[torch.nn.Module, Path]:
    """A random tiny Qwen2 (MLP width 4 x hidden, ``num_heads`` query heads over two
    key/value heads, or one when there is one query head) saved beside ``out`` and loaded
    back, with torch seeded to ``seed`` for the warm-up; returns (model, the temporary
    dir)."""
    from transformers import AutoModelForCausalLM

    from rlkit.models.tiny import build_tiny_qwen2

    tmp = out.with_name(out.name + ".tmp")
    build_tiny_qwen2(
        tmp,
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=min(2, num_heads),
        intermediate_size=4 * hidden_size,
        max_position_embeddings=max_positions,
        seed=seed,
    )
    model = AutoModelForCausalLM.from_pretrained(tmp)
    torch.manual_seed(seed)
    return model, tmp


def supervised_warmup(
    model: torch.nn.Module,
    next_batch: Callable[[], Any],
    *,
    steps: int,
    lr: float,
    pad_token_id: int,
    tag: str = "sft",
    log_every: int = 250,
    loss_of: Callable[[Any], torch.Tensor] | None = None,
) -> None:
    """AdamW with a one-cycle schedule on ``next_batch()`` = (ids, labels), labels -100
    where nothing is trained; gradients clipped at 1. ``loss_of(batch)``: the loss of
    another kind of batch (default: the model's own loss of right-padded ids)."""

    def padded_rows_loss(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, labels = batch
        return model(input_ids=ids, attention_mask=(ids != pad_token_id).long(), labels=labels).loss

    loss_of = loss_of or padded_rows_loss
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        loss = loss_of(next_batch())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            print(f"[{tag}] step {step:4d}/{steps} loss {loss.item():.4f}", flush=True)


def publish(model: torch.nn.Module, tmp: Path, out: Path, settings: dict[str, Any]) -> str:
    """Save ``model`` in ``tmp`` with its settings, then move it to ``out``; return ``out``."""
    model.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps({"settings": settings}))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    fd = _BUILDING.pop(out.resolve(), None)
    if fd is not None:
        os.close(fd)
    return str(out)


def right_padded(
    rows: list[tuple[list[int], list[int]]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels) rows right-padded into two (B, L) tensors (labels padded with -100)."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, lab) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
    return ids, labels
