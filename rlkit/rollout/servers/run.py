"""What a training run tells the server engines it starts, and the defaults they draw from it.

A server engine built by the trainer receives a :class:`ServerRun` (keyword ``run``): the
run's directory, where server logs and weight snapshots go (``<output_dir>/servers``),
and the lengths and batch that size a CPU server's KV cache. Without one (an engine built
directly, ``rlkit diagnose``, the evaluation harness) logs go to the engine's
``default_log_dir`` and the KV cache gets the floor size.

On a CPU (the trainer's platform, :func:`rlkit.device.current`) a server engine with no
``device`` option serves on the CPU with a KV cache sized by :func:`kv_cache_tokens`:
enough for the run's concurrent sequences, never less than :data:`FLOOR_TOKENS`, and
never a fraction of the machine's memory (vLLM's CPU default reserves 92% of it and dies
when more than 8% is in use; SGLang's about 70%). An option the user gives always wins.

The trainer adds the keyword with :func:`run_keywords`, which gives it only to engines
registered with ``takes_run=True``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.rollout.servers.cpu_split import CpuSplit, servers_on_cpu

logger = logging.getLogger(__name__)

#: Smallest KV cache (tokens) a CPU server gets by default.
FLOOR_TOKENS = 16384
#: Where server logs (and, by default, weight snapshots) go inside a run's directory.
SERVERS_SUBDIR = "servers"


@dataclass(frozen=True)
class ServerRun:
    """The facts of a training run a server engine sizes and places its servers by.

    Attributes:
        output_dir: the run's directory (``TrainerConfig.output_dir``); server logs and
            weight snapshots go to ``output_dir/servers`` unless ``log_dir`` is given.
        max_prompt_length: longest prompt, in tokens.
        max_response_length: longest response (all turns), in tokens.
        prompts_per_step: prompts one step generates for (``train_batch_size``).
        samples_per_prompt: responses per prompt (``max(n, val_n)``).
        cpu_split: the cores started servers run on, when the trainer split them
            (:mod:`rlkit.rollout.servers.cpu_split`).
    """

    output_dir: str | Path | None = None
    max_prompt_length: int | None = None
    max_response_length: int | None = None
    prompts_per_step: int | None = None
    samples_per_prompt: int = 1
    cpu_split: CpuSplit | None = None

    def server_env(self, given: Mapping[str, str] | None) -> dict[str, str]:
        """Started servers' extra environment: the CPU split's variables (if any), then
        ``given`` (the user's ``server_env``, which wins)."""
        placed = self.cpu_split.server_env() if self.cpu_split else {}
        return placed | dict(given or {})

    @property
    def log_dir(self) -> Path | None:
        """``output_dir/servers``, or ``None`` without an output directory."""
        return Path(self.output_dir) / SERVERS_SUBDIR if self.output_dir is not None else None

    @property
    def sequence_length(self) -> int | None:
        """Prompt plus response: the longest context one sequence holds."""
        if self.max_prompt_length is None or self.max_response_length is None:
            return None
        return self.max_prompt_length + self.max_response_length


def server_run(config: Any, cpu_split: CpuSplit | None = None) -> ServerRun:
    """The :class:`ServerRun` of an experiment configuration (``ExperimentConfig``)."""
    rollout, data = config.rollout, config.data
    return ServerRun(
        cpu_split=cpu_split,
        output_dir=config.trainer.output_dir,
        max_prompt_length=data.max_prompt_length,
        max_response_length=rollout.max_response_length,
        prompts_per_step=data.train_batch_size,
        samples_per_prompt=max(rollout.n, rollout.val_n),
    )


def takes_run(engine: str) -> bool:
    """Whether the engine registered as ``engine`` is a server engine that takes a
    :class:`ServerRun` (``takes_run=True``)."""
    from rlkit.registry import ROLLOUT_ENGINES

    return bool(ROLLOUT_ENGINES.entry(engine).extra.get("takes_run"))


def starts_cpu_servers(rollout: Any, on_cpu: bool) -> bool:
    """Whether ``rollout`` (a ``RolloutConfig``) names a registered server engine that
    starts servers on this machine's CPU (``on_cpu``: the trainer's platform is the CPU)."""
    from rlkit.registry import ROLLOUT_ENGINES

    registered = rollout.engine in ROLLOUT_ENGINES and takes_run(rollout.engine)
    return servers_on_cpu(rollout.engine_options, registered, on_cpu)


def run_keywords(config: Any, cpu_split: CpuSplit | None = None) -> dict[str, ServerRun]:
    """``{"run": ServerRun}`` for an engine registered with ``takes_run=True``, else
    ``{}``: what the trainer adds to its engine factory call."""
    return {"run": server_run(config, cpu_split)} if takes_run(config.rollout.engine) else {}


def default_device() -> str:
    """A started server's device when the user names none: ``cpu`` where the trainer's
    platform is the CPU, else ``cuda`` (the servers' own default)."""
    from rlkit import device

    return "cpu" if device.current().name == "cpu" else "cuda"


def log_dir_option(engine_options: dict[str, Any], run: ServerRun | None) -> None:
    """Default ``engine_options["log_dir"]`` to the run's ``output_dir/servers`` (made
    absolute: weight snapshots under it are named to the servers by path); a ``log_dir``
    the user gave is kept."""
    if engine_options.get("log_dir") is None and run is not None and run.log_dir is not None:
        engine_options["log_dir"] = str(run.log_dir.absolute())


def concurrent_sequences(run: ServerRun | None, max_concurrency: int) -> int | None:
    """Sequences the servers hold at once: prompts in flight (at most
    ``max_concurrency``) times the samples of each; ``None`` when the run is unknown."""
    if run is None or run.prompts_per_step is None:
        return None
    return min(max_concurrency, run.prompts_per_step) * max(1, run.samples_per_prompt)


def kv_cache_tokens(run: ServerRun | None, max_concurrency: int) -> tuple[int, str]:
    """The KV cache (tokens) of a CPU server by default, and how it was reached (for the
    log line): the run's concurrent sequences times their longest length, at least
    :data:`FLOOR_TOKENS`."""
    sequences = concurrent_sequences(run, max_concurrency)
    length = run.sequence_length if run is not None else None
    if sequences is None or length is None:
        return FLOOR_TOKENS, f"the floor, {FLOOR_TOKENS} (run lengths unknown)"
    needed = sequences * length
    how = f"{sequences} sequences x {length} tokens = {needed}, floor {FLOOR_TOKENS}"
    return max(FLOOR_TOKENS, needed), how


def model_config(model_path: str | Path | None) -> dict[str, Any]:
    """``model_path/config.json`` (its ``text_config`` for vision-language models), or
    ``{}``."""
    if not model_path:
        return {}
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    return config.get("text_config", config) if isinstance(config, dict) else {}


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8}


def kv_bytes_per_token(config: Mapping[str, Any], dtype: str) -> int | None:
    """Bytes one token's keys and values take over all layers (``None``: the model
    config does not say)."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if dtype == "auto":
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    size = _DTYPE_BYTES.get(dtype.replace("torch.", ""), 4)
    return 2 * layers * kv_heads * head_dim * size


def round_up_mib(n_bytes: int) -> int:
    """``n_bytes`` rounded up to whole MiB."""
    mib = 1 << 20
    return int(math.ceil(n_bytes / mib)) * mib


def log_defaults(line: str) -> None:
    """Log the defaults a factory chose (one line, once per engine built)."""
    logger.warning(line)
