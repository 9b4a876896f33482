"""The checks that combine fields, one function per concern, each returning its problems.

:meth:`~rlkit.trainer.config.ExperimentConfig.validate` runs them in a fixed order after
every field's own rule, so that a configuration's problems are always listed in the same
order; the checks read files (``config.json``) but load no model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from rlkit.trainer.config.data import DataConfig
from rlkit.trainer.config.models import ModelConfig, PrimeConfig, RewardModelConfig
from rlkit.trainer.config.names import reward_reads_reward_model
from rlkit.trainer.config.rollout import RolloutConfig
from rlkit.trainer.config.rules import field_problems
from rlkit.trainer.config.training import (
    ROLLOUT_MODES,
    AlgorithmConfig,
    OptimConfig,
    TrainerConfig,
)


class RunSections(Protocol):
    """What the rollout-mode checks read of an :class:`~rlkit.trainer.config.ExperimentConfig`:
    a structural type, since that class runs these checks and importing it here would
    make an import cycle."""

    data: DataConfig
    rollout: RolloutConfig
    algorithm: AlgorithmConfig
    optim: OptimConfig
    trainer: TrainerConfig


def batch_problems(data: DataConfig, optim: OptimConfig) -> list[str]:
    """The global batch splits into whole mini-batches (once both sizes are valid)."""
    batch, mini = data.train_batch_size, optim.ppo_mini_batch_size
    if field_problems(DataConfig, {"train_batch_size": batch}) or field_problems(
        OptimConfig, {"ppo_mini_batch_size": mini}
    ):
        return []
    if batch % mini:
        return [
            f"DataConfig.train_batch_size ({batch}) must be a multiple of "
            f"OptimConfig.ppo_mini_batch_size ({mini})"
        ]
    gen = data.gen_batch_size
    if isinstance(gen, int) and gen >= 1 and gen < batch:
        return [
            f"DataConfig.gen_batch_size ({gen}) must be at least DataConfig.train_batch_size "
            f"({batch}): each generation round draws it, a step trains on train_batch_size"
        ]
    return []


def reward_time_problems(data: DataConfig) -> list[str]:
    """The reward phase's deadline leaves room for one call's whole time limit."""
    limit, deadline = data.reward_timeout_s, data.reward_deadline_s
    checked = {"reward_timeout_s": limit, "reward_deadline_s": deadline}
    if deadline is None or limit is None or field_problems(DataConfig, checked):
        return []
    if deadline < limit:
        return [
            f"DataConfig.reward_deadline_s ({deadline:g}) is shorter than one call's limit, "
            f"DataConfig.reward_timeout_s ({limit:g}): raise the deadline or lower the limit"
        ]
    return []


def rollout_problems(rollout: RolloutConfig) -> list[str]:
    """Greedy validation asked for several responses per prompt; agent-loop settings its
    :class:`~rlkit.rollout.agent_loop.AgentConfig` refuses."""
    problems = []
    if not rollout.val_do_sample and rollout.val_n != 1:
        problems.append(
            f"RolloutConfig.val_do_sample = False validates greedily: one response per "
            f"prompt, so RolloutConfig.val_n must be 1, got {rollout.val_n}"
        )
    if rollout.agent_loop != "single_turn" or rollout.agent:
        from rlkit.rollout.agent_loop import agent_config

        try:
            problems += agent_config(rollout.agent).problems()
        except (TypeError, ValueError) as exc:
            problems.append(str(exc))
    return problems


def single_response_problems(rollout: RolloutConfig, algorithm: AlgorithmConfig) -> list[str]:
    """One response per prompt under an estimator that gives a response alone in its group
    advantage 0 (the ``singleton_group_zero`` property of the estimator kit, which every
    estimator has unless its registration exempts it): nothing would be learned."""
    if rollout.n != 1:
        return []
    from rlkit.registry import ESTIMATORS, UnknownNameError

    try:
        entry = ESTIMATORS.entry(algorithm.adv_estimator)
    except UnknownNameError:
        return []  # reported by the name check
    if "singleton_group_zero" in entry.extra.get("properties_exempt", ()):
        return []
    able = sorted(
        e.name
        for e in ESTIMATORS.describe()
        if "singleton_group_zero" in e.extra.get("properties_exempt", ())
    )
    return [
        f"RolloutConfig.n = 1 with AlgorithmConfig.adv_estimator = {algorithm.adv_estimator!r}, "
        f"which compares each response with the others of its prompt: alone in its group, "
        f"every response gets advantage 0 and nothing is learned. Set RolloutConfig.n >= 2, "
        f"or use an estimator that needs no group ({', '.join(able)})"
    ]


def source_problems(model: ModelConfig, data: DataConfig) -> list[str]:
    """No model or no training prompts to start from, or a chat template that names
    neither a built-in template nor Jinja text."""
    problems = []
    if not model.path:
        problems.append("ModelConfig.path is empty: give a local Hugging Face model directory")
    if model.chat_template is not None:
        from rlkit.data.chat_templates import resolve_chat_template

        try:
            resolve_chat_template(model.chat_template)
        except ValueError as exc:
            problems.append(str(exc))
    if not (data.train_files or data.dataset_fn):
        problems.append("set DataConfig.train_files or DataConfig.dataset_fn")
    return problems


def reward_model_problems(reward_model: RewardModelConfig, data: DataConfig) -> list[str]:
    """A reward model that nothing reads, a reward that reads a missing one, a directory
    that is not a one-label sequence classifier."""
    rm, reward = reward_model, data.reward
    wants = reward_reads_reward_model(reward, data.reward_options)
    if not rm.path:
        return (
            [
                f"DataConfig.reward {reward!r} reads the reward model's score: set "
                "RewardModelConfig.path to a local AutoModelForSequenceClassification directory"
            ]
            if wants
            else []
        )
    problems = []
    if wants is False:
        problems.append(
            f"RewardModelConfig.path is set but DataConfig.reward {reward!r} does not use "
            "its score: use DataConfig.reward = 'reward_model', or a 'weighted' term "
            "{'reward': 'reward_model', 'weight': w}"
        )
    from rlkit.models.loading import check_reward_model_dir

    try:
        check_reward_model_dir(rm.path)
    except (FileNotFoundError, ValueError) as exc:
        problems.append(str(exc))
    if rm.chat_template is not None:
        from rlkit.data.chat_templates import resolve_chat_template

        try:
            resolve_chat_template(rm.chat_template)
        except ValueError as exc:
            problems.append(f"RewardModelConfig.chat_template: {exc}")
    return problems


def prime_problems(prime: PrimeConfig) -> list[str]:
    """A PRM initialisation that is not a model directory."""
    problems = []
    if prime.model_path:
        from rlkit.models.loading import check_model_dir

        try:
            check_model_dir(prime.model_path)
        except FileNotFoundError as exc:
            problems.append(f"PrimeConfig.model_path: {exc}")
    return problems


def _model_paths(model: ModelConfig, prime: PrimeConfig) -> tuple[tuple[str, str | None], ...]:
    """``(setting, directory)`` of every model a run trains or scores with."""
    return (
        ("ModelConfig.path", model.path),
        ("ModelConfig.critic_path", model.critic_path),
        ("PrimeConfig.model_path", prime.model_path),
    )


def model_family_problems(model: ModelConfig, prime: PrimeConfig) -> list[str]:
    """Models whose forward rlkit cannot reproduce exactly (docs/models.md), read from
    each existing directory's ``config.json`` before anything loads."""
    from rlkit.models.attention_features import UnsupportedModelError
    from rlkit.models.loading import check_model_family

    problems = []
    for setting, path in _model_paths(model, prime):
        try:
            if path:
                check_model_family(path, setting)
        except UnsupportedModelError as exc:
            problems.append(str(exc))
    return problems


def position_problems(model: ModelConfig, data: DataConfig, rollout: RolloutConfig) -> list[str]:
    """A prompt and response longer than the policy's positions (``max_position_embeddings``
    of its ``config.json``, read before anything loads): the model would generate past what
    it was trained on, or allocate for an absurd length."""
    import json

    config = Path(model.path) / "config.json" if model.path else None
    if config is None or not config.is_file():
        return []
    try:
        data_json = json.loads(config.read_text())
    except (OSError, ValueError):
        return []  # reported by the model checks
    text = data_json.get("text_config") or {}
    limit = data_json.get("max_position_embeddings") or text.get("max_position_embeddings")
    total = data.max_prompt_length + rollout.max_response_length
    if not isinstance(limit, int) or total <= limit:
        return []
    return [
        f"DataConfig.max_prompt_length ({data.max_prompt_length}) + "
        f"RolloutConfig.max_response_length ({rollout.max_response_length}) = {total} tokens, "
        f"past the {limit} positions of {model.path} (max_position_embeddings): lower them"
    ]


def sequence_parallel_problems(model: ModelConfig, prime: PrimeConfig) -> list[str]:
    """Ulysses settings it cannot honour: no packing, another attention kernel, a
    process count or head count it does not divide, a vision-language model."""
    k = model.ulysses_sequence_parallel_size
    if not isinstance(k, int) or k <= 1:
        return []
    from rlkit.distributed.process_exit import launched_world_size
    from rlkit.distributed.sequence_parallel import sequence_parallel_problem

    setting = f"ModelConfig.ulysses_sequence_parallel_size = {k}"
    problems = []
    if not model.use_remove_padding:
        problems.append(
            f"{setting} splits the packed sequence of use_remove_padding: set "
            f"ModelConfig.use_remove_padding = True"
        )
    attention = model.kernel_overrides.get("attention", "grouped_sdpa")
    if attention != "grouped_sdpa":
        problems.append(
            f"{setting} attends with rlkit's grouped_sdpa (it reads the split "
            f"segments), but ModelConfig.kernel_overrides sets attention = "
            f"{attention!r}: remove that override"
        )
    # Under a launcher the process count is known now; else the backend checks it.
    launched = "WORLD_SIZE" in os.environ
    problem = launched and sequence_parallel_problem(k, launched_world_size())
    if problem:
        problems.append(problem + " (accelerate launch --num_processes N)")
    for name, path in _model_paths(model, prime):
        problems += _ulysses_model_problems(path, k, name)
    return problems


def _ulysses_model_problems(path: str | None, k: int, setting: str) -> list[str]:
    """A model directory whose heads do not split ``k`` ways, or a vision-language one."""
    if not path or not (Path(path) / "config.json").is_file():
        return []  # a missing directory is reported by the model checks
    from transformers import AutoConfig

    from rlkit.modeling.ulysses import head_problems

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "vision_config", None) is not None:
        return [
            f"{setting} ({path}) is a vision-language model: ModelConfig."
            f"ulysses_sequence_parallel_size > 1 splits text-only sequences; set it to 1"
        ]
    return [f"{p} ({setting}: {path})" for p in head_problems(config, k)]


def tensor_parallel_problems(config: Any) -> list[str]:
    """Tensor-parallel settings rlkit cannot honour: with Ulysses, LoRA, rollouts ahead
    of training, a reward model, or a model, process count or head count it cannot split
    (:mod:`rlkit.distributed.tensor_parallel`)."""
    model, t = config.model, config.model.tensor_parallel_size
    if not isinstance(t, int) or t <= 1:
        return []
    from rlkit.distributed.process_exit import launched_world_size
    from rlkit.distributed.tensor_parallel import (
        combined_parallelism_problem,
        process_count_problem,
    )

    setting = f"ModelConfig.tensor_parallel_size = {t}"
    problems = []
    combined = combined_parallelism_problem(t, model.ulysses_sequence_parallel_size)
    if combined:
        problems.append(combined)
    if model.lora_rank > 0:
        problems.append(
            f"{setting} splits the model's own layers, which LoRA (ModelConfig.lora_rank = "
            f"{model.lora_rank}) wraps in adapters; set lora_rank = 0 or tensor_parallel_size = 1"
        )
    if config.trainer.rollout_mode != "sync":
        problems.append(
            f"{setting} runs with TrainerConfig.rollout_mode = 'sync' only (the split layers' "
            f"exchanges cannot overlap with rollouts running ahead); got "
            f"{config.trainer.rollout_mode!r}"
        )
    if config.reward_model.path:
        problems.append(
            f"{setting} does not split the reward model (RewardModelConfig.path); score with "
            "rule rewards or set tensor_parallel_size = 1"
        )
    launched = "WORLD_SIZE" in os.environ  # else the backend checks the count
    problem = launched and process_count_problem(t, launched_world_size())
    if problem:
        problems.append(problem)
    for name, path in _model_paths(model, config.prime):
        problems += _tensor_parallel_model_problems(path, t, name)
    return problems


def _tensor_parallel_model_problems(path: str | None, t: int, setting: str) -> list[str]:
    if not path or not (Path(path) / "config.json").is_file():
        return []  # a missing directory is reported by the model checks
    from transformers import AutoConfig

    from rlkit.models.tensor_parallel_plans import tensor_parallel_problem

    problem = tensor_parallel_problem(AutoConfig.from_pretrained(path), t)
    return [f"{problem} ({setting}: {path})"] if problem else []


def vision_language_problems(model: ModelConfig, rollout: RolloutConfig) -> list[str]:
    """A vision-language policy with an engine other than the embedded one, which
    rlkit does not roll image prompts out on (docs/vision_language.md)."""
    path = model.path
    if not path or not (Path(path) / "config.json").is_file():
        return []
    from transformers import AutoConfig

    from rlkit.models.vision_language import is_vision_language

    if not is_vision_language(AutoConfig.from_pretrained(path)):
        return []
    engine = rollout.engine
    if engine in ("hf", "transformers"):
        return []
    return [
        f"ModelConfig.path ({path}) is a vision-language model, which rlkit rolls out "
        f"on the embedded engine only; RolloutConfig.engine = {engine!r} cannot serve "
        f"it: set RolloutConfig.engine = 'hf'"
    ]


def rollout_mode_problems(config: RunSections) -> list[str]:
    """``one_step_off`` and ``async`` generate and score while the actor trains: they need
    an engine that samples from its own copy of the weights, one process (the rollout
    threads gather nothing), and reward worker processes (time limits by ``SIGALRM`` need
    the main thread). ``async`` also needs a ``max_staleness`` of at least one step's
    optimizer steps, and draws no prompts outside step order (no DAPO refills)."""
    mode, engine = config.trainer.rollout_mode, config.rollout.engine
    if mode != "async" and config.trainer.partial_rollout != "finish":
        return [
            f"TrainerConfig.partial_rollout = {config.trainer.partial_rollout!r} applies to "
            f"rollout_mode = 'async' (in {mode!r} no generation runs during a weight sync): "
            f"set rollout_mode = 'async', or leave partial_rollout at 'finish'"
        ]
    if mode not in ROLLOUT_MODES[1:]:
        return []
    from rlkit.registry import ROLLOUT_ENGINES, UnknownNameError

    setting = f"TrainerConfig.rollout_mode = {mode!r}"
    problems = []
    try:
        entry = ROLLOUT_ENGINES.entry(engine)
    except UnknownNameError:
        entry = None  # reported with the engine's own check
    if entry is not None and not entry.extra.get("holds_own_weights"):
        able = [e.name for e in ROLLOUT_ENGINES.describe() if e.extra.get("holds_own_weights")]
        problems.append(
            f"{setting} generates the next batch while the actor trains, but "
            f"RolloutConfig.engine = {engine!r} samples from the trainer's own weights; use an "
            f"engine with its own copy ({', '.join(able)}), or rollout_mode = 'sync'"
        )
    if config.data.reward_workers == 0:
        problems.append(
            f"{setting} scores rewards in its rollout threads, where the in-process reward "
            "time limits cannot run: set DataConfig.reward_workers >= 1 (worker processes, "
            "whose hung calls are killed)"
        )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        problems.append(
            f"{setting} runs in one process; this launch has WORLD_SIZE="
            f"{os.environ['WORLD_SIZE']}: use rollout_mode = 'sync' with several"
        )
    if mode == "async":
        problems += _async_problems(config)
    return problems


def optimizer_steps_per_step(config: RunSections) -> int:
    """The actor's optimizer steps in one RL step (weight versions a step adds):
    ``ppo_epochs`` passes over ``ceil(train_batch_size / ppo_mini_batch_size)``
    mini-batches."""
    o = config.optim
    return o.ppo_epochs * -(-config.data.train_batch_size // o.ppo_mini_batch_size)


def async_depth(config: RunSections) -> tuple[int, int]:
    """``(steps generated ahead, max_staleness)`` of an ``async`` run."""
    per_step = optimizer_steps_per_step(config)
    bound = config.trainer.max_staleness
    bound = 2 * per_step if bound is None else bound
    return bound // per_step, bound


def _async_problems(config: RunSections) -> list[str]:
    per_step = optimizer_steps_per_step(config)
    depth, bound = async_depth(config)
    problems = []
    if config.trainer.partial_rollout == "continue":
        from rlkit.registry import ROLLOUT_ENGINES, UnknownNameError

        try:
            able = ROLLOUT_ENGINES.entry(config.rollout.engine).extra.get("continues_in_flight")
        except UnknownNameError:
            able = True  # reported with the engine's own check
        if not able:
            names = [
                e.name for e in ROLLOUT_ENGINES.describe() if e.extra.get("continues_in_flight")
            ]
            problems.append(
                f"TrainerConfig.partial_rollout = 'continue' syncs weights under running "
                f"generations, which RolloutConfig.engine = {config.rollout.engine!r} cannot "
                f"do; use {', '.join(names)}, or partial_rollout = 'finish'"
            )
    if depth < 1:
        problems.append(
            f"TrainerConfig.max_staleness = {bound} is below the {per_step} optimizer steps of "
            f"one step (OptimConfig.ppo_epochs x train_batch_size / ppo_mini_batch_size), so "
            f"rollout_mode = 'async' could not generate any batch ahead: set max_staleness "
            f">= {per_step} (one step ahead) or {2 * per_step} (two), or rollout_mode = 'sync'"
        )
    if config.algorithm.filter_groups and depth > 1:
        problems.append(
            "rollout_mode = 'async' with AlgorithmConfig.filter_groups: DAPO's extra "
            "generation rounds would draw prompts while later steps draw theirs, so a resume "
            "could not tell which were trained; use rollout_mode = 'one_step_off', or "
            f"max_staleness < {2 * per_step} (one step ahead)"
        )
    return problems


def server_cores_problems(config: RunSections) -> list[str]:
    """``RolloutConfig.server_cores`` as a count: the engine must start servers on this
    CPU (the count would place nothing otherwise) and leave the trainer a core."""
    from rlkit import device
    from rlkit.rollout.servers import cpu_split
    from rlkit.rollout.servers.run import starts_cpu_servers

    setting = config.rollout.server_cores
    if not isinstance(setting, int) or isinstance(setting, bool) or setting < 1:
        return []
    on_cpu = (config.trainer.platform or device.current().name) == "cpu"
    if not starts_cpu_servers(config.rollout, on_cpu):
        return [
            f"RolloutConfig.server_cores = {setting} places servers the engine starts on "
            f"this CPU; engine {config.rollout.engine!r} with these engine_options starts "
            f"none: leave it at 'auto'"
        ]
    found = cpu_split.problem(setting, cpu_split.available_cores())
    return [found] if found else []
