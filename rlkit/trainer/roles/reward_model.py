"""The reward model as a trainer role: frozen, sharded like the reference policy.

Each process scores its own rollouts. A response is decoded and re-rendered with the
reward model's own tokenizer and chat template (the policy's token ids mean nothing
to a model with another vocabulary or format): the prompt's messages plus the
response, or a multi-turn rollout's whole conversation. Rows are grouped into
micro-batches by a token budget; under FSDP2 every process runs the same number of
forwards (an empty share runs a one-token dummy), as collective all-gathers require.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.distributed import collectives as comm
from rlkit.registry import ROLES
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.batch import token_budget_split
from rlkit.trainer.config import RewardModelConfig
from rlkit.trainer.prompts import PromptSet
from rlkit.trainer.roles.role import Role, RoleContext


@ROLES.register("reward_model", summary="a frozen sequence classifier scoring each rollout")
class RewardModelRole(Role):
    """``RewardModelConfig.path``'s model scores every rollout (:class:`RewardModelScorer`);
    the ``reward_model`` reward reads the score from the reward context."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.scorer = RewardModelScorer(ctx.config.reward_model, ctx.backend)

    def score(
        self, trajectories: list[Trajectory], responses: list[str], prompts: PromptSet
    ) -> list[float]:
        return self.scorer.score(trajectories, responses, prompts)


class RewardModelScorer:
    """Score rollouts with a frozen ``AutoModelForSequenceClassification``.

    Args:
        config: the :class:`RewardModelConfig` (``path`` set).
        backend: the run's :class:`~rlkit.trainer.backend.TrainingBackend`; the model is
            prepared (sharded under FSDP2) like the reference policy.
    """

    def __init__(self, config: RewardModelConfig, backend: Any) -> None:
        from transformers import AutoTokenizer

        from rlkit.modeling.modules import RewardModelModule
        from rlkit.models.loading import load_reward_model

        self.cfg, self.backend = config, backend
        tok = AutoTokenizer.from_pretrained(config.tokenizer_path or config.path)
        if config.chat_template is not None:
            from rlkit.data.chat_templates import resolve_chat_template

            tok.chat_template = resolve_chat_template(config.chat_template)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        self.tokenizer = tok
        backbone = load_reward_model(config.path, dtype=config.dtype)
        self.module, _ = backend.prepare(RewardModelModule(backbone), None)

    def texts(
        self, trajectories: list[Trajectory], responses: list[str], prompts: PromptSet
    ) -> list[str]:
        """What the reward model reads for each trajectory (``responses``: decoded)."""
        from rewards.reward_model import conversation_text, reward_model_text

        out = []
        for traj, response in zip(trajectories, responses):
            i = traj.prompt_index
            if traj.conversation is not None:
                out.append(conversation_text(self.tokenizer, traj.conversation))
                continue
            prompt = list(prompts.messages[i]) if prompts.messages else prompts.texts[i]
            out.append(reward_model_text(self.tokenizer, prompt, response))
        return out

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text; a template already adds special tokens, plain text gets the
        tokenizer's; longer than ``max_length``: the start is dropped."""
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        rows = self.tokenizer(texts, add_special_tokens=not has_template)["input_ids"]
        limit = self.cfg.max_length
        return [list(r[-limit:]) if limit else list(r) for r in rows]

    @torch.no_grad()
    def score_ids(self, rows: list[list[int]]) -> list[float]:
        """The score of each row of token ids (this process's share)."""
        lengths = torch.tensor([max(1, len(r)) for r in rows], dtype=torch.long)
        budget = self.cfg.max_token_len_per_micro_batch
        agreed = comm.same_everywhere(len(token_budget_split(lengths, budget)), "max")
        scores = [0.0] * len(rows)
        for part in token_budget_split(lengths, budget, min_parts=agreed):
            chosen = [rows[i] for i in part.tolist()] or [[self.tokenizer.pad_token_id]]
            values = self._forward(chosen)
            for i, value in zip(part.tolist(), values):
                scores[i] = value
        return scores

    def _forward(self, rows: list[list[int]]) -> list[float]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[k, : len(r)] = 1
        positions = torch.arange(width).expand(len(rows), width)
        device = self.backend.device
        out = self.module(ids.to(device), mask.to(device), positions.to(device))
        return out.cpu().tolist()

    def score(
        self, trajectories: list[Trajectory], responses: list[str], prompts: PromptSet
    ) -> list[float]:
        """The reward model's score of each trajectory (this process's share)."""
        return self.score_ids(self.encode(self.texts(trajectories, responses, prompts)))

    def close(self) -> None:
        self.module = None
