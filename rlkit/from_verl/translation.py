"""Hydra overrides of a verl launch to rlkit bindings.

Every override ends in exactly one of four lists of :class:`Translation`: a binding (the
key's rlkit field, :data:`~rlkit.from_verl.key_table.KEYS`), ``used`` (folded into a
combined setting: the rollout server's options, FSDP offload, the launch command, the
overlong buffer, the log-prob passes' micro-batches), ``unsupported`` (with the reason),
or ``unknown`` (not a key of verl's configuration, with the nearest one that is).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rlkit.from_verl.hydra_values import hydra_value
from rlkit.from_verl.key_table import ALIASES, KEYS, MATCHING, reason
from rlkit.from_verl.shell import ScriptReader
from rlkit.from_verl.verl_keys import is_verl_key, nearest, older_release

_PRESETS = {"gae": "ppo", "grpo": "grpo", "rloo": "rloo", "remax": "remax"}
_ROLLOUT = "actor_rollout_ref.rollout."
_SERVER_KEYS = (
    "tensor_model_parallel_size",
    "gpu_memory_utilization",
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
    "enforce_eager",
    "enable_expert_parallel",
    "data_parallel_size",
    "expert_parallel_size",
)
_OFFLOAD = re.compile(
    r"(actor_rollout_ref\.(actor|ref)\.fsdp_config|critic\.fsdp)\.(param|optimizer)_offload"
)
_LOG_PROB = re.compile(
    r"actor_rollout_ref\.(ref|rollout)\.log_prob_(use_dynamic_bsz|max_token_len_per_gpu|micro_batch_size(?:_per_gpu)?)"
)
#: the actor's setting each log-prob key stands beside
_LOG_PROB_PEER = {
    "use_dynamic_bsz": ("actor_rollout_ref.actor.use_dynamic_bsz", "OptimConfig.use_dynamic_bsz"),
    "max_token_len_per_gpu": (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "OptimConfig.max_token_len_per_micro_batch",
    ),
    "micro_batch_size_per_gpu": (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "OptimConfig.micro_batch_size",
    ),
    "micro_batch_size": (
        "actor_rollout_ref.actor.ppo_micro_batch_size",
        "OptimConfig.micro_batch_size",
    ),
}
_REWARD_MANAGERS = ("naive", "dapo", "batch", "prime")
_ULYSSES = (
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "critic.ulysses_sequence_parallel_size",
)


@dataclass(frozen=True)
class Override:
    """One ``key=value`` of a launch, after the shell has expanded it."""

    key: str  # without a leading +, ++ or ~
    text: str  # the value as Hydra receives it
    prefix: str = ""  # "+", "++" or "~"
    missing: tuple[str, ...] = ()  # what the shell could not expand in it
    written: str = ""  # the key as the script spells it, when another spelling is used

    @property
    def shown(self) -> str:
        """The key as the user wrote it."""
        return self.written or self.key

    @classmethod
    def parse(cls, word: str, missing: Iterable[str] = ()) -> Override:
        """``word`` is ``[+|++|~]key=value``."""
        raw_key, _, text = word.partition("=")
        key = raw_key.lstrip("+~")
        return cls(key, text, raw_key[: len(raw_key) - len(key)], tuple(missing))


def is_override(word: str) -> bool:
    """``word`` looks like a Hydra override of a dotted key (``a.b=1``, ``+a.b=1``)."""
    key = word.split("=", 1)[0].lstrip("+~")
    return "=" in word and key[:1].isalpha() and "." in key and " " not in key


def overrides_of(text: str, environ: dict[str, str] | None = None) -> list[Override]:
    """The Hydra overrides in a launch script (or in ``key=value`` words), expanded as
    bash would expand them starting from ``environ`` (default: none set)."""
    reader = ScriptReader(environ or {})
    found = []
    for command in reader.commands(text):
        found += [Override.parse(w.text, w.missing) for w in command.words if is_override(w.text)]
    return found


#: verl entry points that do not train with RL, and what rlkit offers instead.
NOT_RL_TRAINING = {
    "verl.trainer.main_generation": "generation for evaluation: use `rlkit eval` (docs/evaluation.md)",
    "verl.trainer.main_eval": "scoring generated files: use `rlkit eval` (docs/evaluation.md)",
    "verl.trainer.fsdp_sft_trainer": "supervised fine-tuning, which rlkit does not translate",
    "verl.trainer.sft_trainer": "supervised fine-tuning, which rlkit does not translate",
}


def entry_modules(text: str, environ: dict[str, str] | None = None) -> list[str]:
    """The modules the script runs with ``python -m``, in order."""
    modules = []
    for command in ScriptReader(environ or {}).commands(text):
        words = [w.text for w in command.words]
        modules += [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]
    return modules


@dataclass
class Launch:
    """How many processes the launch asks for (verl: ``trainer.nnodes`` x
    ``trainer.n_gpus_per_node``)."""

    nnodes: int = 1
    gpus_per_node: int = 1

    def command(self, gin_file: str) -> str:
        """The command that starts the translated run (on every node)."""
        processes = self.nnodes * self.gpus_per_node
        if processes <= 1:
            return f"rlkit train {gin_file}"
        if self.nnodes == 1:
            return f"accelerate launch --num_processes {processes} -m rlkit.train {gin_file}"
        return (
            f"accelerate launch --num_machines {self.nnodes} --num_processes {processes} "
            f"--machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR "
            f"--main_process_port 29500 -m rlkit.train {gin_file}"
        )


@dataclass
class Translation:
    """The bindings, and what became of every other override."""

    bindings: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    used: list[tuple[str, str, str]] = field(default_factory=list)  # (key, value, where)
    unsupported: list[tuple[str, str, str]] = field(default_factory=list)  # (key, value, why)
    unknown: list[tuple[str, str, str]] = field(default_factory=list)  # (key, value, nearest)
    launch: Launch = field(default_factory=Launch)

    def gin(self, source: str, gin_file: str = "THIS.gin") -> str:
        """The gin file; the launch command and every override that is not a binding are
        in comment blocks after the bindings."""
        lines = [f"# Translated from verl by `rlkit from-verl` ({source}); see docs/from_verl.md."]
        if self.preset:
            lines.append(f"include 'presets/{self.preset}.gin'")
        lines += [f"{k} = {v!r}" for k, v in self.bindings.items()]
        lines += ["", f"# Run with: {self.launch.command(gin_file)}"]
        blocks = (
            ("Used in the settings above (key = value: how)", self.used),
            ("Not translated (key = value: why)", self.unsupported),
            ("Not keys of verl's configuration (key = value: nearest key)", self.unknown),
        )
        for title, rows in blocks:
            if rows:
                lines += ["", f"# {title}:"] + [f"#   {k} = {v}: {why}" for k, v, why in rows]
        return "\n".join(lines) + "\n"


def translate(overrides: Iterable[Override | str]) -> Translation:
    """Map Hydra overrides to rlkit bindings (module docstring).

    Raises:
        ValueError: a value that has no rlkit counterpart, or that Hydra cannot read
            (names the key).
    """
    return _Translator().run(
        [o if isinstance(o, Override) else Override.parse(o) for o in overrides]
    )


class _Translator:
    def __init__(self) -> None:
        self.out = Translation()
        self.values: dict[str, Any] = {}  # key -> value, every override read
        self.server: dict[str, tuple[str, Any]] = {}  # rollout server keys
        self.folded: list[tuple[Override, Any]] = []  # settled once all are read

    def run(self, overrides: list[Override]) -> Translation:
        for item in overrides:
            self._one(item)
        for item, value in self.folded:
            self._fold(item, value)
        self._server_options()
        self._finish()
        return self.out

    def _one(self, item: Override) -> None:
        key = ALIASES.get(item.key, item.key)
        known = is_verl_key(key) or key in ALIASES.values() or older_release(key)
        if not (known or item.prefix.startswith("+")):
            self.out.unknown.append((key, item.text, nearest(key) or "none close"))
            return
        if item.missing:
            self.out.unsupported.append((key, item.text, _missing_reason(item.missing)))
            return
        try:
            value = hydra_value(item.text)
        except ValueError as exc:
            raise ValueError(f"{item.key}: {exc}") from None
        self.values[key] = value
        if key in KEYS:
            self.out.bindings[KEYS[key].target] = KEYS[key].convert(value)
        elif key in MATCHING and MATCHING[key][0] == value:
            self.out.used.append((key, item.text, MATCHING[key][1]))
        elif _is_folded(key):
            self.folded.append((Override(key, item.text, item.prefix, written=item.key), value))
        else:
            why = reason(key)
            if why is None and older_release(key):
                why = f"a key of verl {older_release(key)}, which 0.9.1 no longer has; no rlkit counterpart"
            if why is None and item.prefix.startswith("+") and not is_verl_key(key):
                why = "added with '+': not a key of verl's configuration, so nothing maps it"
            self.out.unsupported.append((key, item.text, why or "no rlkit counterpart"))

    def _used(self, item: Override, how: str) -> None:
        self.out.used.append((item.shown, item.text, how))

    def _fold(self, item: Override, value: Any) -> None:
        key = item.key
        if key.startswith(_ROLLOUT) and key.removeprefix(_ROLLOUT) in _SERVER_KEYS:
            self.server[key.removeprefix(_ROLLOUT)] = (item.text, value)
        elif _OFFLOAD.fullmatch(key):
            self._offload(item, value)
        elif m := _LOG_PROB.fullmatch(key):
            self._log_prob(item, value, m.group(2))
        elif key in _ULYSSES:
            self._ulysses(item, value)
        elif key in ("trainer.nnodes", "trainer.n_gpus_per_node"):
            setattr(
                self.out.launch, "nnodes" if key.endswith("nnodes") else "gpus_per_node", int(value)
            )
            self._used(item, "the 'Run with' command above")
        elif key == "reward_model.reward_manager":
            self._reward_manager(item, value)
        elif key == "data.filter_overlong_prompts":
            self._filter_overlong(item, value)
        elif key == "algorithm.rollout_correction.rollout_is_threshold":
            self._is_threshold(item, value)
        else:  # the overlong buffer's switches and its length
            self._overlong(item, value)

    def _offload(self, item: Override, value: Any) -> None:
        # One setting offloads every sharded model: the actor's keys decide it.
        if item.key.startswith("actor_rollout_ref.actor."):
            if value:
                self.out.bindings["TrainerConfig.cpu_offload"] = True
            self._used(
                item,
                "TrainerConfig.cpu_offload (parameters, gradients and optimizer state of "
                "every model rlkit shards, together)",
            )
            return
        actor = any(
            self.values.get(f"actor_rollout_ref.actor.fsdp_config.{kind}_offload")
            for kind in ("param", "optimizer")
        )
        if bool(value) == actor:
            self._used(item, f"TrainerConfig.cpu_offload = {actor}, the actor's: one for all")
        else:
            why = (
                f"rlkit offloads every sharded model or none; TrainerConfig.cpu_offload "
                f"follows the actor's fsdp_config ({actor})"
            )
            self.out.unsupported.append((item.shown, item.text, why))

    def _log_prob(self, item: Override, value: Any, setting: str) -> None:
        actor_key, target = _LOG_PROB_PEER[setting]
        how = f"rlkit's log-prob passes use the update's micro-batches ({target})"
        actor = self.values.get(actor_key)
        if actor is not None and actor != value:
            how += f"; {actor_key} = {actor} applies to them, not {value}"
        self._used(item, how)

    def _ulysses(self, item: Override, value: Any) -> None:
        actor = self.values.get("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1)
        if actor == value:
            self._used(item, "ModelConfig.ulysses_sequence_parallel_size: one size for every model")
        else:
            why = (
                f"rlkit uses one size for every model (ModelConfig.ulysses_sequence_"
                f"parallel_size = {actor}, the actor's)"
            )
            self.out.unsupported.append((item.shown, item.text, why))

    def _is_threshold(self, item: Override, value: Any) -> None:
        """verl's threshold: a float caps the weights (rlkit: truncate); ``"low_high"``
        masks tokens outside the bounds (IcePop; rlkit: mask)."""
        b = self.out.bindings
        if isinstance(value, str) and "_" in value:
            low, _, high = value.partition("_")
            b["AlgorithmConfig.rollout_is_mode"] = "mask"
            b["AlgorithmConfig.rollout_is_threshold_low"] = float(low)
            b["AlgorithmConfig.rollout_is_threshold"] = float(high)
            self._used(item, "AlgorithmConfig.rollout_is_mode = 'mask' with these bounds")
        else:
            b["AlgorithmConfig.rollout_is_threshold"] = float(value)
            self._used(item, "AlgorithmConfig.rollout_is_threshold (mode truncate)")

    def _reward_manager(self, item: Override, value: Any) -> None:
        if value not in _REWARD_MANAGERS:
            self.out.unsupported.append(
                (
                    item.shown,
                    item.text,
                    "a reward manager of your own: give its scoring as "
                    "DataConfig.custom_reward_path",
                )  # fmt: skip
            )
            return
        self._used(
            item,
            "DataConfig.reward's default scores each row by its data_source with verl's "
            "table, as this manager does; the overlong buffer is AlgorithmConfig's",
        )

    def _filter_overlong(self, item: Override, value: Any) -> None:
        if value:
            self.out.bindings["DataConfig.truncation"] = "filter"
            self._used(
                item,
                "DataConfig.truncation = 'filter' (prompts past max_prompt_length are "
                "dropped when the data loads; data.truncation then never applies)",
            )
        else:
            self._used(
                item, "verl's default: prompts past max_prompt_length follow data.truncation"
            )

    def _overlong(self, item: Override, value: Any) -> None:
        key = item.key
        if key == "reward_model.max_resp_len":
            length = self.values.get("data.max_response_length")
            if length is not None and int(value) != int(length):
                self.out.unsupported.append(
                    (
                        item.shown,
                        item.text,
                        f"rlkit measures the buffer from RolloutConfig."
                        f"max_response_length ({length}); a different length is not offered",
                    )  # fmt: skip
                )
                return
            self._used(item, "AlgorithmConfig's buffer ends at RolloutConfig.max_response_length")
        elif key.endswith(".enable"):
            self._used(item, "AlgorithmConfig.overlong_buffer_len > 0 turns the buffer on")
        else:  # .log
            self._used(item, "the overlong penalty is always logged (reward/overlong_penalty_sum)")

    def _server_options(self) -> None:
        if not self.server:
            return
        engine = self.out.bindings.get("RolloutConfig.engine", "hf")
        if engine not in ("vllm", "sglang"):
            why = (
                f"a rollout server's setting; RolloutConfig.engine is {engine!r} here (rlkit's "
                f"own decode loop, in the trainer's processes)"
            )
            for name, (text, _) in self.server.items():
                self.out.unsupported.append((_ROLLOUT + name, text, why))
            return
        options: dict[str, Any] = {}
        for name, (text, value) in self.server.items():
            how = _server_option(engine, name, value, options)
            if how is None:
                why = f"verl does not pass it to {engine} either"
                self.out.unsupported.append((_ROLLOUT + name, text, why))
            else:
                self.out.used.append((_ROLLOUT + name, text, how))
        if options:
            self.out.bindings["RolloutConfig.engine_options"] = options

    def _finish(self) -> None:
        b = self.out.bindings
        enabled = self.values.get("reward_model.overlong_buffer.enable") is True
        if b.get("AlgorithmConfig.overlong_buffer_len") and not enabled:
            b.pop("AlgorithmConfig.overlong_buffer_len")  # verl's buffer is off by default
            self.out.used.append(
                (
                    "reward_model.overlong_buffer.len",
                    str(self.values.get("reward_model.overlong_buffer.len")),
                    "off: overlong_buffer.enable is not true",
                )  # fmt: skip
            )
        preset = _PRESETS.get(str(b.get("AlgorithmConfig.adv_estimator", "gae")))
        if b.get("AlgorithmConfig.filter_groups") and preset == "grpo":
            preset = "dapo"
        self.out.preset = preset


def _server_option(engine: str, name: str, value: Any, options: dict[str, Any]) -> str | None:
    """Put verl's rollout setting ``name`` into ``options`` for ``engine``; how, or None
    when verl itself does not give it to that engine."""
    if engine == "sglang" and name in ("enable_chunked_prefill", "max_num_batched_tokens"):
        return None
    option = {
        "tensor_model_parallel_size": ("tp_size", int),
        "gpu_memory_utilization": (
            "gpu_memory_utilization" if engine == "vllm" else "mem_fraction_static",
            float,
        ),
        "enable_chunked_prefill": ("enable_chunked_prefill", bool),
        "max_model_len": ("max_model_len", int),
    }.get(name)
    if option is not None:
        if value is None:
            return "nothing to pass (verl's default: null)"
        options[option[0]] = option[1](value)
        return f"engine_options[{option[0]!r}]"
    if name in ("data_parallel_size", "expert_parallel_size"):
        return _parallel_flags(engine, name, value, options)
    flag = {
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "max_num_seqs": "--max-num-seqs" if engine == "vllm" else "--max-running-requests",
        "enforce_eager": "--enforce-eager" if engine == "vllm" else "--disable-cuda-graph",
        "enable_expert_parallel": "--enable-expert-parallel",
    }[name]
    if value is None or value is False:
        return "nothing to pass (verl's default)"
    added = [flag] if value is True else [flag, str(value)]
    options.setdefault("server_args", []).extend(added)
    return f"engine_options['server_args'] gets {added}"


def _parallel_flags(engine: str, name: str, value: Any, options: dict[str, Any]) -> str:
    """A server's data- or expert-parallel size as its own flags."""
    size = int(value or 1)
    if size <= 1:
        return "nothing to pass (1, verl's default)"
    if name == "data_parallel_size":
        added = ["--data-parallel-size" if engine == "vllm" else "--dp-size", str(size)]
    else:  # vLLM spreads experts over its TP x DP ranks; SGLang takes the size
        added = ["--enable-expert-parallel"] if engine == "vllm" else ["--ep-size", str(size)]
    options.setdefault("server_args", []).extend(added)
    return f"engine_options['server_args'] gets {added}"


def _is_folded(key: str) -> bool:
    return bool(
        (key.startswith(_ROLLOUT) and key.removeprefix(_ROLLOUT) in _SERVER_KEYS)
        or _OFFLOAD.fullmatch(key)
        or _LOG_PROB.fullmatch(key)
        or key in _ULYSSES
        or key
        in (
            "trainer.nnodes",
            "trainer.n_gpus_per_node",
            "reward_model.reward_manager",
            "data.filter_overlong_prompts",
            "reward_model.overlong_buffer.enable",
            "reward_model.overlong_buffer.log",
            "reward_model.max_resp_len",
            "algorithm.rollout_correction.rollout_is_threshold",
        )
    )


def _missing_reason(missing: tuple[str, ...]) -> str:
    commands = [m for m in missing if m.startswith(("$(", "`"))]
    tests = sorted({m.removeprefix("the test ") for m in missing if m.startswith("the test ")})
    names = sorted(set(missing) - set(commands) - {f"the test {t}" for t in tests})
    parts = []
    if names:
        parts.append(
            f"it uses {', '.join(names)}, which neither the script nor this shell sets "
            f"(export it and run again)"
        )
    if commands:
        parts.append(f"it needs the output of {', '.join(commands)}, which is not run")
    if tests:
        parts.append(f"it is set under `if {', '.join(tests)}`, a test that is not evaluated")
    return "; ".join(parts)
