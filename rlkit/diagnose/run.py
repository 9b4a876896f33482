"""One diagnosis: build the run as ``rlkit train`` would, sample a batch, compare.

:func:`diagnose` takes a validated configuration and returns a :class:`Diagnosis`; the
command (:mod:`rlkit.diagnose.cli`) parses the gin files and writes the report. The
phases, in order:

1. **weights**: a server engine compares its servers' weights with the trainer's
   (checksums or slices, :mod:`rlkit.rollout.servers.weight_check`), then syncs once,
   which checks them again through the sync path the run uses;
2. **tokens**: ``--prompts`` prompts of the training set, one response each with the
   engine's top-k log-probs; the trainer scores the same ids twice, with its training
   pass (the log-probs the loss would see: packing, shared prefix, kernels as configured)
   and with a plain forward (the full distribution, for the KL and top-1 agreement);
3. **turns** (multi-turn agent loops): the run's agent loop on the same prompts; each
   trajectory's trained tokens against the model's own chat template rendering its
   conversation, and the sampled-token gap per turn;
4. **experts** (mixture-of-experts models on the embedded engine): the experts each
   router chose in the engine's decode against the trainer's forward;
5. **settings**: what each side uses, and the causes ranked against the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rlkit.diagnose import comparison, experts, settings, turns
from rlkit.rollout.sampling import RolloutBatch, SamplingParams
from rlkit.rollout.trajectory import Trajectory, trajectories_from_rollout
from rlkit.trainer.batch import build_batch
from rlkit.trainer.logprob_guard import BOUNDS, lowest_precision

SERVER_TOP_K = 20
"""Top-k asked of a server engine when ``--top-k`` is not given (vLLM's default limit)."""

FULL_VOCAB_LIMIT = 2**25
"""Most (tokens x vocabulary) log-probs the embedded engine records for a full-vocabulary
comparison (128 MiB of float32 values, twice that of int64 ids); past it the top
1024 are compared."""


class DiagnoseError(ValueError):
    """A run ``rlkit diagnose`` cannot compare (named, with what to do instead)."""


@dataclass
class Diagnosis:
    """What ``rlkit diagnose`` found (the JSON report is this, as a dict)."""

    engine: str
    precision: str
    bound: float
    kl_bound: float
    top_k: int
    prompts: int
    tokens: dict[str, Any] = field(default_factory=dict)
    trainer_internal_gap: float | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)
    template_differences: list[dict[str, Any]] = field(default_factory=list)
    template_reference: str = ""
    routing: dict[str, float] | None = None
    routing_note: str = ""
    weights: dict[str, Any] = field(default_factory=dict)
    settings: list[dict[str, Any]] = field(default_factory=list)
    causes: list[dict[str, Any]] = field(default_factory=list)
    gap_by_position: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No cause found: the engine and the trainer compute the same distribution."""
        return not self.causes


def diagnose(cfg: Any, *, prompts: int = 16, top_k: int | None = None) -> Diagnosis:
    """Diagnose ``cfg``'s run (its ``TrainerConfig.output_dir`` should be a scratch folder:
    the trainer is set up there). Single-process."""
    from rlkit.trainer.trainer import RLTrainer

    trainer = RLTrainer(cfg)
    try:
        trainer.setup()
        return _Diagnoser(trainer, prompts, top_k).run()
    finally:
        trainer.cleanup(finished=False)


class _Diagnoser:
    def __init__(self, trainer: Any, prompts: int, top_k: int | None) -> None:
        if trainer.world > 1:
            raise DiagnoseError(
                "rlkit diagnose runs in one process: start it with `rlkit diagnose` (or "
                "`python -m rlkit.cli diagnose`), not under `accelerate launch`"
            )
        if trainer.train_prompts.multimodal and any(trainer.train_prompts.multimodal):
            raise DiagnoseError(
                "rlkit diagnose compares text prompts only; this run's prompts carry "
                "images. Diagnose the same model on a text dataset (DataConfig) instead"
            )
        self.trainer, self.cfg = trainer, trainer.cfg
        # Generating ahead (one_step_off, async) wraps the rollout; diagnose drives it directly.
        self.rollout = getattr(trainer.rollout, "source", trainer.rollout)
        self.prompts = max(1, min(prompts, len(trainer.train_prompts)))
        self.server = settings.holds_own_weights(self.cfg.rollout.engine)
        precision = lowest_precision([self.cfg.model.dtype, self.cfg.trainer.mixed_precision])
        self.top_k = top_k if top_k is not None else self._default_top_k()
        self.report = Diagnosis(
            engine=self.cfg.rollout.engine,
            precision=precision,
            bound=BOUNDS[precision],
            kl_bound=BOUNDS[precision] ** 2,
            top_k=self.top_k,
            prompts=self.prompts,
        )

    def _default_top_k(self) -> int:
        if self.server:
            return SERVER_TOP_K
        vocab = int(self.trainer.roles["actor"].backbone.config.get_text_config().vocab_size)
        tokens = self.prompts * self.cfg.rollout.max_response_length
        return vocab if tokens * vocab <= FULL_VOCAB_LIMIT else 1024

    # ------------------------------------------------------------------ phases
    def run(self) -> Diagnosis:
        self._weights()
        indices = list(range(self.prompts))
        prompt_ids = [self.trainer.train_prompts.token_ids[i] for i in indices]
        self._tokens(prompt_ids)
        if self.cfg.rollout.agent_loop != "single_turn":
            self._turns(indices)
        self._experts(prompt_ids[:4])
        self._settings()
        return self.report

    def _weights(self) -> None:
        from rlkit.rollout.servers.errors import ProbeMismatchError, WeightSyncError

        engine = self.trainer.engine
        if not self.server:
            self.report.weights = {
                "method": "shared",
                "note": "the engine samples from the trainer's own module",
            }
            return
        out: dict[str, Any] = {"method": getattr(engine, "weight_check", "none")}
        try:
            out["compared_at_start"] = engine.check_weights(self.trainer.weights)
            metrics = self.rollout.sync_weights()
            out["compared_after_sync"] = metrics.get("weight_sync/params_checked", 0.0)
            out["logprob_probe_max_abs_diff"] = metrics.get("weight_sync/logprob_max_abs_diff")
            out["check_s"] = metrics.get("timing_s/weight_check", 0.0)
        except ProbeMismatchError as exc:
            # The weights compared equal (or could not be compared): the server computes
            # with them differently; the token comparison below says how.
            out["probe_error"] = str(exc)
        except WeightSyncError as exc:
            out["error"] = str(exc)
        self.report.weights = out

    def _sampling(self, top_k: int) -> SamplingParams:
        return replace(self.rollout.sampling(), n=1, top_logprobs=top_k)

    def _tokens(self, prompt_ids: list[list[int]]) -> None:
        batch = self.trainer.engine.generate(prompt_ids, self._sampling(self.top_k))
        rows = trajectories_from_rollout(batch, policy_version=0)
        trained = self._training_pass(rows)
        full = self._plain_forward(rows)
        stats = []
        internal = []
        for i, row in enumerate(rows):
            n = len(row.response_ids)
            plain_sampled = full[i].gather(-1, torch.tensor(row.response_ids)[:, None]).squeeze(-1)
            internal.append((trained[i, :n].double() - plain_sampled.double()).abs())
            top = batch.top_log_probs[i] if batch.top_log_probs is not None else None
            stats.append(
                comparison.token_stats(
                    torch.tensor(row.rollout_log_probs),
                    trained[i, :n],
                    None if top is None else top.ids,
                    None if top is None else top.log_probs,
                    full[i],
                )
            )
        if batch.top_log_probs is None:
            self.report.notes.append(
                f"the {self.cfg.rollout.engine} engine reported no top-k log-probs: the KL "
                f"and top-1 agreement are not computed"
            )
        self.report.tokens = comparison.summarize(stats)
        joined = torch.cat(internal) if internal else torch.zeros(0)
        self.report.trainer_internal_gap = float(joined.mean()) if joined.numel() else None
        self.report.gap_by_position = _mean_by_position(stats)

    def _training_pass(self, rows: list[Trajectory]) -> torch.Tensor:
        """(B, T) log-probs of the rows' tokens as the actor's log-prob pass computes them."""
        width = max(1, max(len(r.response_ids) for r in rows))
        zeros = [0.0] * len(rows)
        batch = build_batch(
            rows,
            pad_token_id=self.trainer.tokenizer.pad_token_id,
            response_width=width,
            index=list(range(len(rows))),
            scores=zeros,
            acc=zeros,
            data_sources=["diagnose"] * len(rows),
        )
        with torch.no_grad():
            return self.trainer.updater.log_probs(self.trainer.roles["actor"].module, batch).cpu()

    @torch.no_grad()
    def _plain_forward(self, rows: list[Trajectory]) -> list[torch.Tensor]:
        """Per row, (L, V) log-softmax of the trainer's model at the rollout temperature."""
        temperature = self.cfg.rollout.temperature or 1.0
        out = []
        with self.trainer.weights.generation_context() as (model, _):
            device = next(model.parameters()).device
            for row in rows:
                ids = torch.tensor([row.prompt_ids + row.response_ids], device=device)
                p, n = len(row.prompt_ids), len(row.response_ids)
                logits = model(input_ids=ids).logits[0, p - 1 : p + n - 1].float()
                out.append(torch.log_softmax(logits / temperature, -1).cpu())
        return out

    def _turns(self, indices: list[int]) -> None:
        from transformers import AutoTokenizer

        from rlkit.trainer.builders import tool_schemas
        from rlkit.trainer.timing import PhaseTimer

        rollout = self.rollout
        params = replace(rollout.sampling(), n=1)
        scored = rollout.generate(self.trainer.train_prompts, indices, params, PhaseTimer())
        trajectories = scored.trajectories
        reference, source = self._reference_tokenizer(AutoTokenizer)
        self.report.template_reference = source
        tools = tool_schemas(self.trainer.agent)
        differences = []
        for i, traj in enumerate(trajectories):
            differences += turns.compare_rendering(i, traj, reference, tools)
        self.report.template_differences = [vars(d) for d in differences]
        trained = self._training_pass(trajectories)
        per_turn: dict[int, list[torch.Tensor]] = {}
        for i, traj in enumerate(trajectories):
            n = len(traj.response_ids)
            gap = (trained[i, :n].double() - torch.tensor(traj.rollout_log_probs).double()).abs()
            mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
            turn = torch.cumsum(torch.cat([mask[:1], mask[1:] & ~mask[:-1]]).long(), 0)
            for t in turn[mask].unique().tolist():
                per_turn.setdefault(int(t), []).append(gap[mask & (turn == t)])
        self.report.turns = [
            {
                "turn": t,
                "tokens": int(sum(g.numel() for g in gaps)),
                "gap_mean": float(torch.cat(gaps).mean()),
                "gap_max": float(torch.cat(gaps).max()),
            }
            for t, gaps in sorted(per_turn.items())
        ]

    def _reference_tokenizer(self, auto: Any) -> tuple[Any, str]:
        """The model directory's own tokenizer and template, or the run's when the model
        directory has none."""
        m = self.cfg.model
        try:
            own = auto.from_pretrained(m.path)
        except (OSError, ValueError):
            own = None
        if own is not None and getattr(own, "chat_template", None):
            return own, f"{m.path} (the model's own)"
        return self.trainer.tokenizer, _template_source(self.cfg)

    def _experts(self, prompt_ids: list[list[int]]) -> None:
        with self.trainer.weights.generation_context() as (model, _):
            routers = experts.router_modules(model)
        if not routers:
            self.report.routing_note = "not a mixture-of-experts model"
            return
        if self.server:
            self.report.routing_note = (
                f"the {self.cfg.rollout.engine} server does not report the experts it routes "
                f"to: routing not compared"
            )
            return
        lowest: dict[str, float] = {}
        for prompt in prompt_ids:
            with experts.RoutingRecorder(model) as engine_side:
                batch: RolloutBatch = self.trainer.engine.generate([prompt], self._sampling(0))
            ids = torch.tensor([prompt + batch.response_ids[0]])
            with (
                experts.RoutingRecorder(model) as trainer_side,
                torch.no_grad(),
                self.trainer.weights.generation_context() as (module, _),
            ):
                module(input_ids=ids.to(next(module.parameters()).device))
            for name, value in experts.agreement(engine_side, trainer_side).items():
                lowest[name] = min(value, lowest.get(name, 1.0))
        self.report.routing = lowest
        self.report.routing_note = f"{len(routers)} routers compared on {len(prompt_ids)} responses"

    def _settings(self) -> None:
        r = self.report
        source = _template_source(self.cfg)
        reference = r.template_reference or source
        listed = settings.run_settings(
            self.cfg,
            source,
            reference.removesuffix(" (the model's own)"),
            getattr(self.trainer, "kernel_choices", None),
        )
        overall = r.tokens.get("overall", {})
        evidence = {
            "weights": r.weights.get("error"),
            "turn_differences": sum(d["kind"] == "template" for d in r.template_differences),
            "gap_mean": overall.get("gap_mean", 0.0),
            "kl_mean": overall.get("kl_mean", 0.0),
            "bound": r.bound,
            "kl_bound": r.kl_bound,
            "growth": comparison.growth_with_position(r.tokens) if r.tokens else math.nan,
            "routing_agreement": min(r.routing.values()) if r.routing else None,
            "trainer_internal_gap": r.trainer_internal_gap,
        }
        if self.cfg.rollout.top_p < 1 or self.cfg.rollout.top_k > 0:
            evidence["bound"] = math.inf  # the sampled-token gap is by design; the KL judges
        r.settings = [vars(s) for s in listed]
        r.causes = [vars(c) for c in settings.rank_causes(listed, evidence)]


def _template_source(cfg: Any) -> str:
    m = cfg.model
    if m.chat_template is not None:
        return f"ModelConfig.chat_template ({str(m.chat_template)[:40]!r})"
    return m.tokenizer_path or m.path


def _mean_by_position(stats: list[comparison.TokenStats]) -> list[float]:
    longest = max((int(s.gap.numel()) for s in stats), default=0)
    out = []
    for t in range(longest):
        values = [s.gap[t] for s in stats if s.gap.numel() > t]
        out.append(float(torch.stack(values).mean()))
    return out


def scratch_output_dir(report_dir: Path) -> str:
    """Where the diagnosed run's trainer is set up (never the run's own directory)."""
    return str(report_dir / "trainer")
