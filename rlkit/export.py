"""``rlkit export CHECKPOINT_DIR OUT_DIR``: a training checkpoint as a Hugging Face model.

A checkpoint (``<output_dir>/checkpoints/global_step_N``) holds the actor in
``torch.distributed.checkpoint`` format, one shard per process that saved it. This command
reads it in ONE plain process, whatever number of processes wrote it (DCP reassembles
full tensors from the shards' metadata; no process group is needed), and writes a
directory ``AutoModelForCausalLM.from_pretrained`` (a vision-language model:
``AutoModelForImageTextToText``, with its image processor) loads: ``model.safetensors``,
``config.json``, ``generation_config.json`` and the tokenizer.

Architecture and tokenizer come from the run: ``<output_dir>/resolved_config.json`` names
``ModelConfig.path`` (the model the run started from: its ``config.json`` and
``generation_config.json``), ``ModelConfig.tokenizer_path`` and ``ModelConfig.chat_template``
(written into the exported tokenizer, as ``TrainerConfig.export_hf_at_end`` does).
``--model`` / ``--tokenizer`` override them, e.g. when the run directory was moved to
another machine. LoRA adapters (``ModelConfig.lora_rank > 0``) are merged into the base
weights, so the export is a plain model. Only the actor is exported (not a critic or PRM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch

from rlkit.trainer.checkpoint import (
    COMPLETE,
    LATEST,
    CheckpointError,
    unreadable_as_error,
    verify_checkpoint,
)
from rlkit.trainer.run_dir import RESOLVED_CONFIG

ACTOR = "actor"
_MODEL_PREFIX = "model."  # TrainingBackend.save_sharded saves {"model": ..., "optimizer": ...}


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory ``path`` names: itself, or the latest complete one when
    ``path`` is a run directory or its ``checkpoints/`` directory.

    Raises:
        FileNotFoundError: no complete checkpoint there.
    """
    path = Path(path)
    if (path / COMPLETE).exists():
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    pointer = root / LATEST
    if pointer.exists() and (root / pointer.read_text().strip() / COMPLETE).exists():
        return root / pointer.read_text().strip()
    complete = [p for p in root.glob("global_step_*") if (p / COMPLETE).exists()]
    if complete:
        return max(complete, key=lambda p: int(p.name.rsplit("_", 1)[-1]))
    raise FileNotFoundError(
        f"{path} is not a complete rlkit checkpoint (no {COMPLETE} marker) and holds none; "
        "give <output_dir>/checkpoints/global_step_N, or the run's output_dir for its latest"
    )


def run_model_config(checkpoint: Path) -> dict[str, Any]:
    """``ModelConfig`` of the run that wrote ``checkpoint``, from its ``resolved_config.json``
    (``<output_dir>/checkpoints/global_step_N`` -> ``<output_dir>``); ``{}`` when absent."""
    resolved = checkpoint.parent.parent / RESOLVED_CONFIG
    if not resolved.is_file():
        return {}
    return dict(json.loads(resolved.read_text()).get("model") or {})


def load_actor_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The actor's full model state (wrapper keys, e.g. ``backbone.model.norm.weight``) as
    plain CPU tensors, read from its DCP shards by this one process.

    Only the model's tensors are requested from the checkpoint, so the optimizer state
    (twice the model's size for Adam) is never read.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    directory = checkpoint / ACTOR
    if not (directory / ".metadata").is_file():
        raise FileNotFoundError(
            f"{directory} holds no actor state (.metadata missing); was {checkpoint} written "
            "by rlkit's trainer?"
        )
    metadata = dcp.FileSystemReader(str(directory)).read_metadata()
    model: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(_MODEL_PREFIX) and isinstance(meta, TensorStorageMetadata):
            model[key[len(_MODEL_PREFIX) :]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not model:
        raise ValueError(f"{directory} holds no model tensors")
    with warnings.catch_warnings():
        # Without a process group DCP warns that it assumes a single process: it is one.
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process")
        dcp.load({"model": model}, checkpoint_id=str(directory), no_dist=True)
    return model


def hf_state_dict(state: dict[str, torch.Tensor], *, lora_alpha: float) -> dict[str, torch.Tensor]:
    """The Hugging Face model's own state dict from the actor wrapper's, LoRA merged.

    Args:
        state: wrapper keys (``backbone.`` + the backbone's names; under LoRA peft's
            ``base_model.model.<name>.base_layer.weight`` and ``lora_A/lora_B`` beside it).
        lora_alpha: ``ModelConfig.lora_alpha``; the adapter's scale is ``alpha / rank``
            (peft's default, the one :func:`rlkit.models.loading.add_lora` uses).
    """
    from rlkit.trainer.policy_weights import _hf_name

    backbone = {
        k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")
    }
    if not backbone:
        raise ValueError("the checkpoint's actor has no backbone.* tensors")
    lora_a = {k: v for k, v in backbone.items() if ".lora_A." in k}
    other = [k for k in backbone if "lora_" in k and ".lora_A." not in k and ".lora_B." not in k]
    if other:
        raise NotImplementedError(
            f"merging these LoRA tensors is not supported: {other[:3]}; only linear layers' "
            "lora_A/lora_B adapters are"
        )
    merged = {k: v for k, v in backbone.items() if "lora_" not in k}
    for key_a, a in lora_a.items():
        module, _, adapter = key_a.partition(".lora_A.")
        b = backbone[f"{module}.lora_B.{adapter}"]
        base_key = f"{module}.base_layer.weight"
        base = merged[base_key]
        delta = (b.double() @ a.double()) * (lora_alpha / a.shape[0])
        merged[base_key] = (base.double() + delta).to(base.dtype)
    return {_hf_name(k): v for k, v in merged.items()}


def export_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    model_path: str | None = None,
    tokenizer_path: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``checkpoint``'s actor as a Hugging Face model directory ``out_dir``.

    Args:
        checkpoint: a checkpoint directory, or a run directory (its latest checkpoint).
        out_dir: destination; written into a temporary sibling and renamed into place, so it
            never holds a half-written model.
        model_path: the model the run started from (default: the run's ``ModelConfig.path``).
        tokenizer_path: tokenizer directory (default: the run's ``ModelConfig.tokenizer_path``,
            else the model directory).
        overwrite: replace an existing ``out_dir`` (otherwise refused).

    Returns:
        The checkpoint directory that was exported.
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from rlkit.models.loading import causal_lm_class, load_image_processor

    ckpt = find_checkpoint(checkpoint)
    verify_checkpoint(ckpt)  # never export weights whose bytes changed since the save
    target = Path(out_dir)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty; pass --overwrite to replace it")
    run = run_model_config(ckpt)
    model_path = model_path or run.get("path")
    if not model_path:
        raise ValueError(
            f"no {RESOLVED_CONFIG} beside {ckpt.parent} names the run's model; pass --model "
            "with the model directory the run started from"
        )
    if not Path(model_path).is_dir():
        raise FileNotFoundError(
            f"model directory {model_path!r} (the run's ModelConfig.path) does not exist here; "
            "pass --model with a copy of it (its config.json gives the architecture)"
        )
    gguf_file = None if model_path != run.get("path") else run.get("gguf_file")
    with unreadable_as_error(ckpt):  # a damaged shard without a manifest to say so
        actor_state = load_actor_state(ckpt)
    state = hf_state_dict(actor_state, lora_alpha=float(run.get("lora_alpha") or 16))

    config = AutoConfig.from_pretrained(model_path, gguf_file=gguf_file)
    dtype = next(iter(state.values())).dtype
    # Built on the meta device: no memory or random initialisation for weights that the
    # checkpoint's tensors then replace (assign=True).
    with torch.device("meta"):
        model = causal_lm_class(config).from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    # Tied weights (lm_head = embed_tokens) may be saved under one name only.
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {ckpt} does not fit the architecture of {model_path}: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}; pass --model with the run's model"
        )
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    unset = [name for name, t in model.state_dict().items() if t.is_meta]
    if unset:
        raise ValueError(f"checkpoint {ckpt} holds no values for {unset[:5]}")

    tokenizer_source = tokenizer_path or run.get("tokenizer_path") or model_path
    tokenizer_gguf = None if tokenizer_path or run.get("tokenizer_path") else gguf_file
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, gguf_file=tokenizer_gguf)
    if tokenizer.pad_token_id is None:  # as the trainer does, so generation can pad
        tokenizer.pad_token = tokenizer.eos_token
    if run.get("chat_template") is not None:
        from rlkit.data.chat_templates import resolve_chat_template

        tokenizer.chat_template = resolve_chat_template(run["chat_template"])

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    try:
        # Without a generation_config.json keep the one derived from config.json.
        with contextlib.suppress(OSError):
            model.generation_config = GenerationConfig.from_pretrained(model_path)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        processor = None if gguf_file else load_image_processor(model_path)
        if processor is not None:  # a vision-language model renders images with it
            processor.save_pretrained(staging)
        if target.exists():
            retired = target.parent / f".{target.name}.old-{uuid.uuid4().hex}"
            target.rename(retired)
            staging.rename(target)
            shutil.rmtree(retired)
        else:
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ckpt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlkit export",
        description=(
            "Write a training checkpoint's actor (saved by any number of processes) as a "
            "Hugging Face model directory: safetensors, config and tokenizer."
        ),
    )
    parser.add_argument(
        "checkpoint",
        help="<output_dir>/checkpoints/global_step_N, or a run's output_dir (its latest)",
    )
    parser.add_argument("out_dir", help="the Hugging Face model directory to write")
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="the model directory the run started from (default: ModelConfig.path in the "
        f"run's {RESOLVED_CONFIG})",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer directory (default: the run's ModelConfig.tokenizer_path, else the model)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    args = parser.parse_args(argv)
    try:
        ckpt = export_checkpoint(
            args.checkpoint,
            args.out_dir,
            model_path=args.model,
            tokenizer_path=args.tokenizer,
            overwrite=args.overwrite,
        )
    except (
        FileNotFoundError,
        FileExistsError,
        ValueError,
        NotImplementedError,
        CheckpointError,
    ) as exc:
        print(f"rlkit export: {exc}", file=sys.stderr)
        return 2
    print(f"rlkit export: {ckpt} -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
