"""Checkpoints with the output layer written out, for vLLM servers that reload weights.

A model with tied input and output embeddings (``tie_word_embeddings``) stores one
matrix. vLLM's CPU backend packs the output layer into its own layout when a server
starts, and ``reload_weights`` refreshes the embedding but not that packed copy: after a
sync the server would sample from the new body and the old output layer. Serving a copy
whose config says ``tie_word_embeddings: false`` and whose files hold ``lm_head.weight``
(equal to the embedding, so the function is the same) makes the output layer a weight of
its own that every reload writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

OUTPUT_LAYER = "lm_head.weight"
INDEX_FILE = "model.safetensors.index.json"


def is_tied(model_dir: str | Path) -> bool:
    """Whether ``model_dir``'s config ties the output layer to the input embedding."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", False))


def untie_in_place(model_dir: str | Path) -> bool:
    """Write ``lm_head.weight`` (a copy of the input embedding) into a tied checkpoint's
    safetensors files and untie its config. Returns whether anything changed."""
    model_dir = Path(model_dir)
    if not is_tied(model_dir):
        return False
    weight_map = _weight_map(model_dir)
    embedding = next((n for n in weight_map if n.endswith("embed_tokens.weight")), None)
    if embedding is None:
        raise ValueError(
            f"{model_dir} ties its embeddings but no *embed_tokens.weight tensor was found in "
            f"its safetensors files: save the model with safe_serialization=True"
        )
    if OUTPUT_LAYER not in weight_map:
        shard = model_dir / weight_map[embedding]
        tensors = load_file(shard)
        tensors[OUTPUT_LAYER] = tensors[embedding].clone()
        save_file(tensors, shard, metadata={"format": "pt"})
        _record_in_index(model_dir, weight_map[embedding])
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["tie_word_embeddings"] = False
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return True


def untied_copy(model_dir: str | Path, dest: str | Path) -> Path:
    """``model_dir`` if it is untied already, else an untied copy of it at ``dest``."""
    if not is_tied(model_dir):
        return Path(model_dir)
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(model_dir, dest)
    untie_in_place(dest)
    return dest


def _weight_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> the safetensors file (relative to ``model_dir``) that holds it."""
    index = model_dir / INDEX_FILE
    if index.exists():
        return dict(json.loads(index.read_text())["weight_map"])
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise ValueError(
            f"{model_dir} has no model.safetensors or {INDEX_FILE}: vLLM servers reload "
            f"safetensors checkpoints; save the model with safe_serialization=True"
        )
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        names = f.keys()
    return {name: single.name for name in names}


def _record_in_index(model_dir: Path, shard: str) -> None:
    index_path = model_dir / INDEX_FILE
    if not index_path.exists():
        return
    index = json.loads(index_path.read_text())
    index["weight_map"][OUTPUT_LAYER] = shard
    index_path.write_text(json.dumps(index, indent=2) + "\n")
