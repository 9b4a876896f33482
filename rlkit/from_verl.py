"""``rlkit from-verl SCRIPT_OR_OVERRIDES... [-o FILE.gin]``: a verl launch as a gin file.

Reads a verl launch script (``python3 -m verl.trainer.main_ppo key=value ... \\``) or the
Hydra overrides themselves, and writes the gin experiment that runs the same settings in
rlkit. Every key is either mapped (:data:`KEYS`) or listed, with the reason, in a comment
block of the output (:data:`UNSUPPORTED`, or "no rlkit equivalent"). Shell variables
(``$HOME``, ``${MODEL}``) are kept as written: replace them before training.

Exit status: 0 translated; 2 nothing to translate (no ``key=value`` found) or a value that
cannot be translated (it names the key).
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

USER_ERROR_EXIT = 2

Convert = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _files(value: Any) -> Any:
    # verl takes one path or a list of them; rlkit takes the same (a list is concatenated).
    return list(value) if isinstance(value, list | tuple) else str(value)


def _loggers(value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else list(value)
    out = ["jsonl"] + [n for n in names if n in ("console", "wandb", "mlflow", "swanlab")]
    if "tensorboard" in names:
        out.append("tensorboard")
    return tuple(dict.fromkeys(out))


def _truncation(value: Any) -> str:
    if value not in ("error", "left"):
        raise ValueError(f"data.truncation={value!r}: rlkit truncates 'left' or refuses ('error')")
    return str(value)


def _filter_metric(value: Any) -> str:
    if value not in ("acc", "score"):
        raise ValueError(f"algorithm.filter_groups.metric={value!r}: rlkit filters on acc | score")
    return str(value)


def _max_gen(value: Any) -> int:
    if int(value) < 1:
        raise ValueError(
            "algorithm.filter_groups.max_num_gen_batches <= 0 (endless in verl): rlkit needs "
            "a limit >= 1"
        )
    return int(value)


def _engine(value: Any) -> str:
    if value not in ("vllm", "sglang", "hf"):
        raise ValueError(
            f"actor_rollout_ref.rollout.name={value!r}: rlkit's engines are 'hf' (its own "
            f"decode loop), 'vllm' and 'sglang'"
        )
    return str(value)


@dataclass(frozen=True)
class Key:
    """Where one verl key goes: an rlkit ``Section.field`` and how its value converts."""

    target: str
    convert: Convert = field(default=_same)
    note: str = ""


KEYS: dict[str, Key] = {
    # data
    "data.train_files": Key("DataConfig.train_files", _files, "a list is concatenated"),
    "data.val_files": Key("DataConfig.val_files", _files),
    "data.train_batch_size": Key("DataConfig.train_batch_size", int, "prompts per step"),
    "data.gen_batch_size": Key("DataConfig.gen_batch_size", int, "DAPO: prompts per round"),
    "data.max_prompt_length": Key("DataConfig.max_prompt_length", int),
    "data.max_response_length": Key("RolloutConfig.max_response_length", int),
    "data.truncation": Key("DataConfig.truncation", _truncation),
    "data.shuffle": Key("DataConfig.shuffle", bool),
    "data.seed": Key("TrainerConfig.seed", int),
    "custom_reward_function.path": Key("DataConfig.custom_reward_path", str),
    "custom_reward_function.name": Key("DataConfig.custom_reward_name", str),
    # model
    "actor_rollout_ref.model.path": Key("ModelConfig.path", str),
    "actor_rollout_ref.model.use_remove_padding": Key("ModelConfig.use_remove_padding", bool),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": Key(
        "ModelConfig.ulysses_sequence_parallel_size", int
    ),
    "actor_rollout_ref.actor.freeze_vision_tower": Key("ModelConfig.freeze_vision_tower", bool),
    "actor_rollout_ref.model.enable_gradient_checkpointing": Key(
        "ModelConfig.gradient_checkpointing", bool
    ),
    "actor_rollout_ref.model.lora_rank": Key("ModelConfig.lora_rank", int),
    "actor_rollout_ref.model.lora_alpha": Key("ModelConfig.lora_alpha", int),
    "actor_rollout_ref.model.target_modules": Key("ModelConfig.lora_target_modules", _same),
    "critic.model.path": Key("ModelConfig.critic_path", str),
    # actor
    "actor_rollout_ref.actor.optim.lr": Key("OptimConfig.lr", float),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": Key("OptimConfig.warmup_steps", int),
    "actor_rollout_ref.actor.optim.weight_decay": Key("OptimConfig.weight_decay", float),
    "actor_rollout_ref.actor.ppo_mini_batch_size": Key(
        "OptimConfig.ppo_mini_batch_size", int, "prompts per optimizer step, as in verl"
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": Key(
        "OptimConfig.micro_batch_size", int, "sequences per forward on each process"
    ),
    "actor_rollout_ref.actor.use_dynamic_bsz": Key("OptimConfig.use_dynamic_bsz", bool),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": Key(
        "OptimConfig.max_token_len_per_micro_batch", int
    ),
    "actor_rollout_ref.actor.ppo_epochs": Key("OptimConfig.ppo_epochs", int),
    "actor_rollout_ref.actor.grad_clip": Key("OptimConfig.grad_clip", float),
    "actor_rollout_ref.actor.clip_ratio": Key("AlgorithmConfig.clip_ratio", float),
    "actor_rollout_ref.actor.clip_ratio_low": Key("AlgorithmConfig.clip_ratio_low", float),
    "actor_rollout_ref.actor.clip_ratio_high": Key("AlgorithmConfig.clip_ratio_high", float),
    "actor_rollout_ref.actor.clip_ratio_c": Key("AlgorithmConfig.clip_ratio_c", float),
    "actor_rollout_ref.actor.loss_agg_mode": Key("AlgorithmConfig.loss_agg_mode", str),
    "actor_rollout_ref.actor.policy_loss.loss_mode": Key("AlgorithmConfig.policy_loss", str),
    "actor_rollout_ref.actor.entropy_coeff": Key("AlgorithmConfig.entropy_coeff", float),
    "actor_rollout_ref.actor.use_kl_loss": Key("AlgorithmConfig.use_kl_loss", bool),
    "actor_rollout_ref.actor.kl_loss_coef": Key("AlgorithmConfig.kl_loss_coef", float),
    "actor_rollout_ref.actor.kl_loss_type": Key("AlgorithmConfig.kl_loss_type", str),
    # rollout
    "actor_rollout_ref.rollout.name": Key("RolloutConfig.engine", _engine),
    "actor_rollout_ref.rollout.n": Key("RolloutConfig.n", int),
    "actor_rollout_ref.rollout.temperature": Key("RolloutConfig.temperature", float),
    "actor_rollout_ref.rollout.top_p": Key("RolloutConfig.top_p", float),
    "actor_rollout_ref.rollout.top_k": Key("RolloutConfig.top_k", int),
    "actor_rollout_ref.rollout.val_kwargs.n": Key("RolloutConfig.val_n", int),
    "actor_rollout_ref.rollout.val_kwargs.temperature": Key("RolloutConfig.val_temperature", float),
    "actor_rollout_ref.rollout.val_kwargs.top_p": Key("RolloutConfig.val_top_p", float),
    "actor_rollout_ref.rollout.val_kwargs.top_k": Key("RolloutConfig.val_top_k", int),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": Key("RolloutConfig.val_do_sample", bool),
    # algorithm
    "algorithm.adv_estimator": Key("AlgorithmConfig.adv_estimator", str),
    "algorithm.gamma": Key("AlgorithmConfig.gamma", float),
    "algorithm.lam": Key("AlgorithmConfig.lam", float),
    "algorithm.norm_adv_by_std_in_grpo": Key("AlgorithmConfig.norm_adv_by_std_in_grpo", bool),
    "algorithm.use_kl_in_reward": Key("AlgorithmConfig.use_kl_in_reward", bool),
    "algorithm.kl_penalty": Key("AlgorithmConfig.kl_penalty", str),
    "algorithm.kl_ctrl.type": Key("AlgorithmConfig.kl_ctrl_type", str),
    "algorithm.kl_ctrl.kl_coef": Key("AlgorithmConfig.kl_coef", float),
    "algorithm.kl_ctrl.target_kl": Key("AlgorithmConfig.kl_target", float),
    "algorithm.kl_ctrl.horizon": Key("AlgorithmConfig.kl_horizon", int),
    "algorithm.filter_groups.enable": Key("AlgorithmConfig.filter_groups", bool),
    "algorithm.filter_groups.metric": Key("AlgorithmConfig.filter_metric", _filter_metric),
    "algorithm.filter_groups.max_num_gen_batches": Key(
        "AlgorithmConfig.max_num_gen_batches", _max_gen
    ),
    "reward_model.overlong_buffer.len": Key(
        "AlgorithmConfig.overlong_buffer_len", int, "only with reward_model.overlong_buffer.enable"
    ),
    "reward_model.overlong_buffer.penalty_factor": Key(
        "AlgorithmConfig.overlong_penalty_factor", float
    ),
    # critic
    "critic.optim.lr": Key("OptimConfig.critic_lr", float),
    "critic.cliprange_value": Key("OptimConfig.cliprange_value", float),
    # trainer
    "trainer.total_epochs": Key("TrainerConfig.total_epochs", int),
    "trainer.total_training_steps": Key("TrainerConfig.total_steps", int),
    "trainer.test_freq": Key("TrainerConfig.test_freq", lambda v: max(0, int(v))),
    "trainer.save_freq": Key("TrainerConfig.save_freq", lambda v: max(0, int(v))),
    "trainer.val_before_train": Key("TrainerConfig.val_before_train", bool),
    "trainer.project_name": Key("TrainerConfig.project_name", str),
    "trainer.experiment_name": Key("TrainerConfig.experiment_name", str),
    "trainer.logger": Key("TrainerConfig.loggers", _loggers),
    "trainer.default_local_dir": Key("TrainerConfig.output_dir", str),
    "trainer.resume_mode": Key("TrainerConfig.resume_mode", str),
    "trainer.max_actor_ckpt_to_keep": Key("TrainerConfig.max_checkpoints_to_keep", int),
    "trainer.critic_warmup": Key("AlgorithmConfig.critic_warmup", int),
    "trainer.balance_batch": Key("TrainerConfig.balance_batch", bool),
}
"""verl key -> rlkit field; see docs/from_verl.md for the table."""

UNSUPPORTED: dict[str, str] = {
    "data.prompt_key": "rlkit reads verl's 'prompt' column itself",
    "data.filter_overlong_prompts": "use DataConfig.truncation = 'filter' (set below if true)",
    "data.return_raw_chat": "rlkit always keeps the chat messages",
    "data.dataloader_num_workers": "prompts are tokenized once, in memory",
    "reward_model.reward_manager": "rlkit scores each row itself (DataConfig.reward)",
    "reward_model.overlong_buffer.enable": "AlgorithmConfig.overlong_buffer_len > 0 enables it",
    "reward_model.overlong_buffer.log": "the penalty is always logged",
    "reward_model.enable": "a reward model is RewardModelConfig.path",
    "actor_rollout_ref.rollout.mode": "rlkit's engines run in the trainer's processes",
    "actor_rollout_ref.rollout.gpu_memory_utilization": (
        "RolloutConfig.engine_options = {'gpu_memory_utilization': x} (vllm), "
        "{'mem_fraction_static': x} (sglang)"
    ),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": (
        "RolloutConfig.engine_options = {'tp_size': x} (vllm, sglang)"
    ),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": (
        "forwards use OptimConfig.micro_batch_size"
    ),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": (
        "forwards use OptimConfig.micro_batch_size"
    ),
    "actor_rollout_ref.rollout.enable_chunked_prefill": (
        "vllm: RolloutConfig.engine_options = {'enable_chunked_prefill': x}"
    ),
    "actor_rollout_ref.rollout.max_num_batched_tokens": (
        "a server flag: engine_options = {'server_args': ['--max-num-batched-tokens', 'x']}"
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size": "give the per-GPU size instead",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "use OptimConfig.warmup_steps",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": (
        "one size for every model: ModelConfig.ulysses_sequence_parallel_size"
    ),
    "critic.ulysses_sequence_parallel_size": (
        "one size for every model: ModelConfig.ulysses_sequence_parallel_size"
    ),
    "critic.ppo_micro_batch_size_per_gpu": "the critic uses OptimConfig.micro_batch_size",
    "critic.model.enable_gradient_checkpointing": "ModelConfig.gradient_checkpointing",
    "critic.model.use_remove_padding": "ModelConfig.use_remove_padding",
    "trainer.n_gpus_per_node": "processes come from `accelerate launch`",
    "trainer.nnodes": "processes come from `accelerate launch`",
    "trainer.save_contents": "checkpoints hold the whole training state",
    "trainer.log_val_generations": "validation metrics only",
    "trainer.val_only": "use `rlkit eval`",
}
"""verl keys with no rlkit field, and why (prefixes under ``fsdp_config`` are added)."""

_PREFIX_REASONS = (
    (".fsdp_config.", "FSDP2 is configured by TrainerConfig.backend_strategy / cpu_offload"),
    ("actor_rollout_ref.actor.checkpoint.", "checkpoints hold the whole training state"),
)

_PRESETS = {"gae": "ppo", "grpo": "grpo", "rloo": "rloo", "remax": "remax"}


@dataclass
class Translation:
    """The gin text and what could not be translated."""

    bindings: dict[str, Any]
    preset: str | None
    unsupported: list[tuple[str, str, str]]  # (key, value, reason)

    def gin(self, source: str) -> str:
        """The gin file, with the unsupported keys in a comment block."""
        lines = [f"# Translated from verl by `rlkit from-verl` ({source}); see docs/from_verl.md."]
        if self.preset:
            lines.append(f"include 'presets/{self.preset}.gin'")
        lines += [f"{k} = {v!r}" for k, v in self.bindings.items()]
        if self.unsupported:
            lines.append("")
            lines.append("# Not translated (key = value: why):")
            lines += [f"#   {k} = {v}: {why}" for k, v, why in self.unsupported]
        return "\n".join(lines) + "\n"


_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")
_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    """``text`` with ``$X``, ``${X}``, ``${X:-default}`` and ``$((a * b))`` replaced where
    known (an unknown variable stays as written)."""

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        return env.get(name, m.group(2) if m.group(2) is not None else m.group(0))

    text = _VAR.sub(var, text)

    def arith(m: re.Match[str]) -> str:
        # Inside $((...)) the shell reads bare names as variables.
        expr = re.sub(r"[A-Za-z_]\w*", lambda n: env.get(n.group(), n.group()), m.group(1))
        if not re.fullmatch(r"[\d\s+*/()-]+", expr):  # only integer arithmetic is evaluated
            return m.group(0)
        return str(int(eval(expr, {"__builtins__": {}})))  # noqa: S307

    return _ARITH.sub(arith, text)


def _assignment(line: str, env: dict[str, str]) -> tuple[str, str] | None:
    """``(NAME, value)`` of a shell ``NAME=value`` line (not ``NAME=value command ...``),
    its value expanded with ``env``; else ``None``."""
    m = _ASSIGN.match(line)
    if m is None:
        return None
    try:
        words = shlex.split(_expand(m.group(2), env), comments=True)
    except ValueError:
        return None
    return (m.group(1), words[0] if words else "") if len(words) <= 1 else None


def overrides_of(text: str) -> list[str]:
    """The ``key=value`` overrides in a launch script or a list of them (line continuations
    and comments allowed); the command and shell lines around them are ignored. The
    script's own ``NAME=value`` assignments are substituted into the values."""
    text = text.replace("\\\n", " ")
    env: dict[str, str] = {}
    out: list[str] = []
    for line in text.splitlines():
        assigned = _assignment(line, env)
        if assigned is not None:
            env[assigned[0]] = assigned[1]
            continue
        line = _expand(line, env)
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        out += [w for w in words if "=" in w and w.split("=", 1)[0].lstrip("+~")[:1].isalpha()]
    # Shell assignments (MODEL=...) are not overrides: verl keys have a dot.
    return [w for w in out if "." in w.split("=", 1)[0]]


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def translate(overrides: Iterable[str]) -> Translation:
    """Map Hydra ``key=value`` overrides to rlkit bindings.

    Raises:
        ValueError: a value that has no rlkit counterpart (names the key).
    """
    bindings: dict[str, Any] = {}
    unsupported: list[tuple[str, str, str]] = []
    for item in overrides:
        raw_key, _, raw = item.partition("=")
        key, value = raw_key.lstrip("+~"), _value(raw)
        if "$" in raw:
            unsupported.append((key, raw, "a shell value this script does not set"))
        elif key in KEYS:
            bindings[KEYS[key].target] = KEYS[key].convert(value)
        elif key == "data.filter_overlong_prompts" and value is True:
            bindings["DataConfig.truncation"] = "filter"
        else:
            unsupported.append((key, raw, _reason(key)))
    if bindings.get("AlgorithmConfig.overlong_buffer_len") and not any(
        k == "reward_model.overlong_buffer.enable" and v.lower() == "true"
        for k, v, _ in unsupported
    ):
        bindings.pop("AlgorithmConfig.overlong_buffer_len")  # verl's buffer is off by default
    preset = _PRESETS.get(str(bindings.get("AlgorithmConfig.adv_estimator", "gae")))
    if bindings.get("AlgorithmConfig.filter_groups") and preset == "grpo":
        preset = "dapo"
    return Translation(bindings, preset, unsupported)


def _reason(key: str) -> str:
    if key in UNSUPPORTED:
        return UNSUPPORTED[key]
    for part, why in _PREFIX_REASONS:
        if part in key:
            return why
    return "no rlkit equivalent"


def check_targets() -> list[str]:
    """``Section.field`` targets of :data:`KEYS` that rlkit's configuration lacks."""
    import dataclasses

    from rlkit.trainer.config import ExperimentConfig

    known = {
        f"{f.default_factory.__name__}.{g.name}"
        for f in dataclasses.fields(ExperimentConfig)
        for g in dataclasses.fields(f.default_factory)
    }
    return sorted({k.target for k in KEYS.values()} - known)


def main(argv: list[str] | None = None) -> int:
    """``rlkit from-verl``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="rlkit from-verl", description=__doc__)
    parser.add_argument("inputs", nargs="+", help="a verl launch script, or key=value overrides")
    parser.add_argument("-o", "--output", default=None, help="gin file to write (default: stdout)")
    args = parser.parse_args(argv)
    if len(args.inputs) == 1 and Path(args.inputs[0]).is_file():
        try:
            text = Path(args.inputs[0]).read_text()
        except UnicodeDecodeError:
            print(
                f"rlkit from-verl: {args.inputs[0]} is not a text file (not UTF-8): give a "
                f"verl launch script or key=value overrides",
                file=sys.stderr,
            )
            return USER_ERROR_EXIT
        source, overrides = args.inputs[0], overrides_of(text)
    else:
        source, overrides = "command line", overrides_of(shlex.join(args.inputs))
    if not overrides:
        print("rlkit from-verl: no verl key=value overrides found", file=sys.stderr)
        return USER_ERROR_EXIT
    try:
        result = translate(overrides)
    except (ValueError, TypeError) as exc:
        print(f"rlkit from-verl: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    text = result.gin(source)
    if args.output:
        Path(args.output).write_text(text)
        print(f"rlkit from-verl: wrote {args.output} ({len(result.bindings)} settings, "
              f"{len(result.unsupported)} not translated)")  # fmt: skip
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
