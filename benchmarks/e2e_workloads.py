"""One GRPO workload, run by rlkit's ``RLTrainer`` or by TRL's ``GRPOTrainer``, with a step clock.

Both runners train the same local model directory on the same arithmetic prompts
(``"a+b="``, rendered by the model's plain chat template) with the same group
size, prompts per step, completion length, sampling settings, optimiser and
micro-batch size, one optimizer step per RL step, no KL term and no reference
model, a token-mean policy loss and the exact-match reward. Each returns a
:class:`StepRecord` per step: wall and CPU seconds since the previous step ended,
and the tokens the step processed (prompt + generated tokens, EOS included,
padding excluded: each framework's own counter, both defined this way).

Used by ``benchmarks/e2e_grpo_vs_trl.py``, which runs each framework in its own
subprocess; see ``docs/benchmarks.md`` for what differs between the two sides.
"""

from __future__ import annotations

import functools
import json
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

FRAMEWORKS = ("rlkit", "trl")


@dataclass
class Workload:
    """The GRPO run both frameworks perform."""

    model_dir: str
    """Local Hugging Face model directory (the same files for both frameworks)."""
    num_prompts: int = 256
    """Size of the prompt pool (a seeded subset of the arithmetic train split)."""
    prompts_per_step: int = 16
    group_size: int = 8
    """Completions per prompt."""
    max_completion_length: int = 8
    micro_batch_size: int = 32
    """Sequences per forward/backward pass; must divide ``prompts_per_step * group_size``."""
    steps: int = 6
    lr: float = 1e-5
    seed: int = 0
    threads: int = 1
    """torch intra-op threads in each worker."""
    rlkit_decode_loop: str = "rlkit"
    """rlkit's HF engine decode loop: ``"rlkit"`` (its own) or ``"generate"`` (as TRL)."""
    rlkit_linear_weights: str = "auto"
    """rlkit's HF engine ``linear_weights``: ``"auto"`` (bf16 layers laid out once per
    rollout for oneDNN, the default), ``"packed"`` (float32 ones too) or ``"plain"``."""
    prompt_tokens: int = 0
    """Lengthen every prompt by a fixed preamble of this many characters before the question
    (0: the bare ``"a+b="``), as long GSM8K-style prompts are; the byte-level tokenizer of
    :func:`build_model` makes one token of a character."""
    mixed_precision: str = "no"
    """``"no"`` (float32) or ``"bf16"``: float32 parameters, bf16 compute, in both
    frameworks (rlkit's ``TrainerConfig.mixed_precision``, TRL's ``bf16``)."""
    rlkit_kernels: dict[str, str] = field(default_factory=dict)
    """rlkit's kernel per op where it should not choose itself, e.g.
    ``{"rms_norm": "torch_lean"}`` (``ModelConfig.kernel_overrides``; ``rlkit doctor``
    lists the ops and implementations). TRL runs the model's own code either way."""

    def __post_init__(self) -> None:
        rows = self.prompts_per_step * self.group_size
        problems = []
        if self.group_size < 2:
            problems.append(f"group_size must be >= 2 (TRL needs a group), got {self.group_size}")
        if self.micro_batch_size < 1 or rows % self.micro_batch_size:
            problems.append(
                f"micro_batch_size ({self.micro_batch_size}) must divide prompts_per_step x "
                f"group_size ({rows}); pick a divisor"
            )
        if self.steps < 1 or self.max_completion_length < 1 or self.threads < 1:
            problems.append("steps, max_completion_length and threads must be >= 1")
        if self.prompt_tokens < 0:
            problems.append(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.mixed_precision not in ("no", "bf16"):
            problems.append(f"mixed_precision must be no|bf16, got {self.mixed_precision!r}")
        problems += [f"rlkit_kernels: {p}" for p in kernel_problems(self.rlkit_kernels)]
        if self.num_prompts < self.prompts_per_step:
            problems.append(
                f"num_prompts ({self.num_prompts}) must be >= prompts_per_step "
                f"({self.prompts_per_step})"
            )
        if problems:
            raise ValueError("invalid workload: " + "; ".join(problems))

    @classmethod
    def from_args(cls, args: Any, **given: Any) -> Workload:
        """The workload of the fields an argparse namespace names (``given`` wins)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names} | given)

    @property
    def rows_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Workload:
        return cls(**json.loads(text))


def kernel_problems(kernels: dict[str, str]) -> list[str]:
    """What is wrong with a kernel override mapping here, as rlkit's kernel registry says
    it: unknown ops, unknown implementations, implementations this machine cannot run."""
    from rlkit.kernels import KernelUnavailableError, choose

    problems = []
    for op, name in kernels.items():
        try:
            choose(op, override=name)
        except (KernelUnavailableError, LookupError) as exc:
            problems.append(str(exc))
    return problems


@dataclass
class StepRecord:
    """One RL step as seen from outside the trainer."""

    wall_s: float
    """Wall seconds since the previous step ended (the first: since training started)."""
    cpu_s: float
    """This process's CPU seconds over the same interval (all threads)."""
    tokens: int
    """Prompt + generated tokens of the step's rollout (EOS counted, padding not)."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """The trainer's own per-phase wall seconds, where it reports them (rlkit's ``timing_s/*``)."""
    lengths: dict[str, float] = field(default_factory=dict)
    """The step's batch where the trainer reports it: ``rows``, ``prompt_mean`` and
    ``response_mean`` tokens (rlkit's ``prompt_length/mean``, ``response_length/mean``)."""
    peak_rss_mib: float = 0.0
    """This process's peak resident set so far (``ru_maxrss``) when the step ended: how it
    grows from step to step shows memory a run keeps piling up."""


class StepClock:
    """Marks step boundaries; each ``tick`` closes one :class:`StepRecord`."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self._wall = self._cpu = None

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def tick(
        self,
        tokens: int,
        phases_s: dict[str, float] | None = None,
        lengths: dict[str, float] | None = None,
    ) -> None:
        if self._wall is None:
            raise RuntimeError("StepClock.tick before start(): the first step has no start time")
        wall, cpu = time.perf_counter(), time.process_time()
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        self.records.append(
            StepRecord(
                wall - self._wall,
                cpu - self._cpu,
                int(tokens),
                dict(phases_s or {}),
                lengths or {},
                peak_mib,
            )
        )
        self._wall, self._cpu = wall, cpu


def build_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    sft_steps: int = 60,
    seed: int = 0,
) -> str:
    """A tiny Qwen2 + byte tokenizer warmed up on noisy addition (``arithmetic_sft_model``).

    The warm-up makes the policy emit short answers and EOS, so rewards vary within
    groups and completions stop early, as in a real RLVR run. ``sft_steps=0`` keeps
    the random initialisation (completions then almost always run to the length limit).

    Returns:
        The model directory (cached: same settings, same directory -> reused).
    """
    from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
    from rlkit.tasks.arithmetic import PLAIN_CHAT_TEMPLATE, arithmetic_sft_model

    if sft_steps > 0:
        return arithmetic_sft_model(
            str(out_dir),
            steps=sft_steps,
            batch_size=64,
            hidden_size=hidden_size,
            num_layers=num_layers,
            seed=seed,
        )
    tokenizer = train_byte_tokenizer()
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return str(
        build_tiny_qwen2(
            out_dir,
            tokenizer,
            hidden_size=hidden_size,
            num_layers=num_layers,
            intermediate_size=4 * hidden_size,
            # Room for gsm8k_like's longest row (32 + 2 x 200 prompt + 128 response tokens):
            # the trainer refuses lengths past the model's positions.
            max_position_embeddings=1024,
            seed=seed,
        )
    )


PREAMBLE = "Read the question, think about it step by step, and give the final number. "


def benchmark_dataset(split: str, *, limit: int, seed: int, prompt_tokens: int = 0):
    """A seeded subset of the arithmetic ``split``; with ``prompt_tokens``, each question
    follows the :data:`PREAMBLE`, repeated and cut to ``prompt_tokens`` characters (one
    token each with the byte-level tokenizer of :func:`build_model`)."""
    from rlkit.tasks.arithmetic import arithmetic_dataset

    data = arithmetic_dataset(split, limit=limit, seed=seed)
    if prompt_tokens == 0:
        return data
    preamble = (PREAMBLE * (prompt_tokens // len(PREAMBLE) + 1))[:prompt_tokens]

    def lengthen(row: dict) -> dict:
        question = row["prompt"][0]["content"]
        return {"prompt": [{"role": "user", "content": preamble + question}]}

    return data.map(lengthen)


def prompt_dataset(w: Workload):
    """The prompt pool both frameworks draw from (:func:`benchmark_dataset` of the train split)."""
    return benchmark_dataset(
        "train", limit=w.num_prompts, seed=w.seed, prompt_tokens=w.prompt_tokens
    )


# --------------------------------------------------------------------- rlkit
def rlkit_config(w: Workload, out_dir: str | Path):
    """The :class:`ExperimentConfig` of the workload: GRPO, token-mean, no KL, nothing saved."""
    from rlkit.trainer.config import (
        AlgorithmConfig,
        DataConfig,
        ExperimentConfig,
        ModelConfig,
        OptimConfig,
        RolloutConfig,
        TrainerConfig,
    )

    return ExperimentConfig(
        model=ModelConfig(
            path=w.model_dir, dtype="float32", kernel_overrides=dict(w.rlkit_kernels)
        ),
        data=DataConfig(
            # The validation split is loaded by setup() but never generated from:
            # the benchmark drives step() only (val_limit keeps the load tiny).
            dataset_fn=functools.partial(
                benchmark_dataset, limit=w.num_prompts, seed=w.seed, prompt_tokens=w.prompt_tokens
            ),
            reward="exact_match",
            use_chat_template=True,
            max_prompt_length=32 + 2 * w.prompt_tokens,
            train_batch_size=w.prompts_per_step,
            val_limit=1,
        ),
        rollout=RolloutConfig(
            engine="hf",
            # One decode call for the whole step, as TRL's one generate call.
            engine_options={
                "generation_batch_size": w.rows_per_step,
                "decode_loop": w.rlkit_decode_loop,
                "linear_weights": w.rlkit_linear_weights,
            },
            n=w.group_size,
            max_response_length=w.max_completion_length,
            temperature=1.0,
            top_p=1.0,
            top_k=-1,
        ),
        algorithm=AlgorithmConfig(
            adv_estimator="grpo",
            estimator_options={"epsilon": 1e-4},  # TRL's group-std epsilon
            norm_adv_by_std_in_grpo=True,
            policy_loss="vanilla",
            loss_agg_mode="token-mean",
            clip_ratio=0.2,
            entropy_coeff=0.0,
            use_kl_loss=False,
            use_kl_in_reward=False,
        ),
        optim=OptimConfig(
            lr=w.lr,
            weight_decay=0.0,
            grad_clip=1.0,
            lr_schedule="constant",
            optimizer_implementation="fused",  # TRL's default optim, adamw_torch_fused
            ppo_epochs=1,
            ppo_mini_batch_size=w.prompts_per_step,  # one optimizer step per RL step
            micro_batch_size=w.micro_batch_size,
        ),
        trainer=TrainerConfig(
            total_steps=w.steps,
            test_freq=0,
            val_before_train=False,
            save_freq=0,
            save_at_end=False,
            output_dir=str(out_dir),
            resume_mode="disable",
            seed=w.seed,
            tensorboard=False,
            progress_bar=False,
            plot_learning_curve=False,
            num_threads=w.threads,
            mixed_precision=w.mixed_precision,
        ),
    )


def run_rlkit(w: Workload, out_dir: str | Path) -> list[StepRecord]:
    """Run ``w.steps`` RL steps with :class:`RLTrainer`; one record per step.

    ``step()`` is timed as rlkit's own ``train()`` loop calls it. The loop's only
    validation (one prompt, after the last step) falls outside every timed interval.
    """
    from rlkit.trainer.trainer import RLTrainer

    trainer = RLTrainer(rlkit_config(w, out_dir))
    clock = StepClock()
    trainer.setup()
    untimed_step = trainer.step

    def timed_step() -> dict[str, float]:
        metrics = untimed_step()
        phases = {
            k.removeprefix("timing_s/"): v for k, v in metrics.items() if k.startswith("timing_s/")
        }
        lengths = {
            "rows": float(w.rows_per_step),
            "prompt_mean": metrics.get("prompt_length/mean", 0.0),
            "response_mean": metrics.get("response_length/mean", 0.0),
        }
        clock.tick(int(metrics["perf/total_num_tokens"]), phases, lengths)
        return metrics

    trainer.step = timed_step  # the instance attribute shadows the method inside train()
    try:
        clock.start()
        trainer.train()
    finally:
        trainer.cleanup()
    return clock.records


# ----------------------------------------------------------------------- TRL
def exact_match_reward(completions: list, ground_truth: list[str], **_: Any) -> list[float]:
    """TRL reward function: rlkit's ``exact_match`` on each completion's text."""
    from rewards.exact_match import exact_match

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [exact_match(t, g)["score"] for t, g in zip(texts, ground_truth, strict=True)]


def trl_config(w: Workload, out_dir: str | Path):
    """The ``GRPOConfig`` matching :func:`rlkit_config` (see docs/benchmarks.md)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=w.mixed_precision == "bf16",  # GRPOConfig defaults to bf16; rlkit's is float32
        fp16=False,
        gradient_checkpointing=False,  # GRPOConfig defaults to True; rlkit's default is off
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=w.micro_batch_size,
        gradient_accumulation_steps=w.rows_per_step // w.micro_batch_size,
        num_generations=w.group_size,
        max_completion_length=w.max_completion_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,  # no KL term, so no reference model is loaded
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the whole accumulated batch = rlkit's token-mean
        scale_rewards="group",  # = rlkit's GRPO with norm_adv_by_std_in_grpo
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=w.steps,
        seed=w.seed,
        use_vllm=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        include_num_input_tokens_seen="no",  # GRPOTrainer counts the rollout's tokens itself
        log_completions=False,
    )


def run_trl(w: Workload, out_dir: str | Path) -> list[StepRecord]:
    """Run ``w.steps`` optimizer steps with TRL's ``GRPOTrainer``; one record per step.

    Tokens per step are the increase of ``state.num_input_tokens_seen``, which
    ``GRPOTrainer`` raises by the rollout's prompt + completion tokens.
    """
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    clock = StepClock()

    class StepClockCallback(TrainerCallback):
        seen = 0

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0 and not clock.records:
                clock.start()

        def on_step_end(self, args, state, control, **kwargs):
            clock.tick(state.num_input_tokens_seen - self.seen, {"gen": generation_s[0]})
            self.seen = state.num_input_tokens_seen
            generation_s[0] = 0.0

    tokenizer = AutoTokenizer.from_pretrained(w.model_dir)
    trainer = GRPOTrainer(
        model=w.model_dir,
        reward_funcs=exact_match_reward,
        args=trl_config(w, out_dir),
        train_dataset=prompt_dataset(w),
        processing_class=tokenizer,
        callbacks=[StepClockCallback()],
    )
    # TRL's rollout (generation, rewards, advantages) timed apart from the rest of its step.
    generation_s = [0.0]
    rollout = trainer._generate_and_score_completions

    def timed_rollout(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return rollout(*args, **kwargs)
        finally:
            generation_s[0] += time.perf_counter() - start

    trainer._generate_and_score_completions = timed_rollout
    trainer.train()
    return clock.records


RUNNERS = {"rlkit": run_rlkit, "trl": run_trl}
