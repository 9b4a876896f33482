"""Micro-batching, the FSDP lock-step and optimizer steps, for every trainable role.

Every process holds the whole global batch; forward and backward passes run on each
process's share of its rows. Under FSDP every process must run the same number of
forward passes (their all-gathers are collectives), so the lock-step lives here, in one
place: the number of micro-batches is agreed across processes, a process short of rows
runs a dummy pass that adds nothing, and an optimizer step is taken by all or by none.

One micro-batch plan serves every pass (:meth:`Updater.micro_batches`): its units are
the prompt groups when shared-prefix passes are on (a prompt's rows stay together, so
its forward is shared) and single rows otherwise; units are filled into micro-batches
by a row budget (``micro_batch_size``) or a token budget (``use_dynamic_bsz``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlkit.distributed import collectives as comm
from rlkit.modeling.prefix_sharing import prompt_groups
from rlkit.trainer.balancing import balanced_partitions, contiguous_partitions
from rlkit.trainer.batch import TrainBatch, pad_rows_to_multiple
from rlkit.trainer.metrics import WeightedMeans
from rlkit.trainer.prompt_groups import grouped_row_split, grouped_token_split, whole_group_shares

ForwardFn = Callable[[Any, TrainBatch], Any]
"""``(module, micro_batch) -> outputs``: a module's pass over a micro-batch, with gradient."""

LossFn = Callable[[TrainBatch, Any, dict[str, Any]], tuple[torch.Tensor, dict, dict]]
"""``(micro_batch, outputs, normalisers) -> (loss, additive, parts)`` (see
:meth:`Updater.optimize`)."""


def policy_forward(temperature: float, entropy: bool) -> ForwardFn:
    """A policy module's ``(log_prob, entropy or None)`` of a micro-batch's responses."""

    def forward(module: Any, micro: TrainBatch) -> Any:
        return module(micro.model_inputs(), micro.prompt_width, temperature, entropy)

    return forward


def value_forward(module: Any, micro: TrainBatch) -> torch.Tensor:
    """A critic module's (b, T') values of a micro-batch's responses."""
    return module(micro.model_inputs(), micro.prompt_width)


class Updater:
    """Runs passes over a global :class:`TrainBatch` on this process's share of it.

    Args:
        config: the :class:`~rlkit.trainer.config.ExperimentConfig`.
        backend: the run's :class:`~rlkit.trainer.backend.TrainingBackend`.
        algorithm: the :class:`~rlkit.trainer.algorithm.Algorithm` (loss normalisers).
        report: prints a line on the main process (skipped updates).
    """

    def __init__(
        self, config: Any, backend: Any, algorithm: Any, report: Callable[[str], None]
    ) -> None:
        self.cfg, self.backend, self.algorithm, self.report = config, backend, algorithm, report
        # Rows are shared out among data-parallel groups; the k processes of a Ulysses
        # group (rlkit/modeling/ulysses.py) hold the same rows and split each sequence,
        # those of a tensor-parallel group hold the same rows and split each layer.
        self.sp = backend.sequence_parallel
        self.rank, self.world = backend.data_parallel
        self.replicas = backend.row_replicas

    # ------------------------------------------------------------ the plan
    def shares(self, batch: TrainBatch) -> tuple[TrainBatch, list[list[int]]]:
        """``batch`` padded to a multiple of the process count, and each process's rows:
        whole prompt groups where they split evenly (shared-prefix passes), else of
        near-equal token totals (``TrainerConfig.balance_batch``) or contiguous."""
        if self.world == 1:
            return batch, [list(range(len(batch)))]
        padded = pad_rows_to_multiple(batch, self.world)
        lengths = (padded.prompt_lengths + padded.response_lengths).tolist()
        if self.cfg.model.share_prompt_prefix:
            groups = prompt_groups(padded.input_ids, padded.attention_mask, padded.prompt_width)
            whole = whole_group_shares(groups, lengths, self.world, self.cfg.trainer.balance_batch)
            if whole is not None:
                return padded, whole
        if self.cfg.trainer.balance_batch:
            return padded, balanced_partitions(lengths, self.world)
        return padded, contiguous_partitions(len(padded), self.world)

    def local_share(self, batch: TrainBatch) -> TrainBatch:
        """This process's rows of ``batch`` (:meth:`shares`), on the training device."""
        padded, shares = self.shares(batch)
        return padded.select(shares[self.rank]).to(self.backend.device)

    def micro_batches(self, local: TrainBatch) -> list[torch.Tensor]:
        """Row indices of each micro-batch of ``local``, as many on every process (empty
        ones pad: they run a dummy pass)."""
        o = self.cfg.optim
        prompts, responses = local.prompt_lengths.tolist(), local.response_lengths.tolist()
        if self.cfg.model.share_prompt_prefix:
            units = prompt_groups(local.input_ids, local.attention_mask, local.prompt_width)
        else:
            units = [[row] for row in range(len(local))]

        def plan(min_parts: int) -> list[torch.Tensor]:
            if o.use_dynamic_bsz:
                # The budget is per process: a Ulysses group's k processes share a micro-batch.
                budget = o.max_token_len_per_micro_batch * self.sp.size
                return grouped_token_split(units, prompts, responses, budget, min_parts)
            parts = grouped_row_split(units, responses, o.micro_batch_size)
            return parts + [torch.zeros(0, dtype=torch.long)] * (min_parts - len(parts))

        return plan(comm.same_everywhere(len(plan(1)), "max"))

    def micro_batch(self, local: TrainBatch, rows: torch.Tensor) -> TrainBatch:
        """The micro-batch ``rows`` of ``local``, trimmed to its own width; for no rows, a
        dummy of row 0 whose loss mask is zero (it keeps processes in step, adds nothing)."""
        micro = local.select(rows if len(rows) else [0]).trimmed()
        if not len(rows):
            micro.loss_mask = torch.zeros_like(micro.loss_mask)
        return micro

    # ------------------------------------------------------------ passes
    @torch.no_grad()
    def forward_rows(
        self, module: Any, batch: TrainBatch, fn: Callable[[Any, TrainBatch], torch.Tensor]
    ) -> torch.Tensor:
        """``fn(module, micro_batch) -> (b, T, ...)`` over this process's share, gathered
        into (B, T, ...) for the whole batch in its row order."""
        padded, shares = self.shares(batch)
        local = padded.select(shares[self.rank]).to(self.backend.device)
        width = local.responses.shape[1]
        out: torch.Tensor | None = None
        for rows in self.micro_batches(local):
            value = fn(module, self.micro_batch(local, rows)).float().cpu()  # T' <= T
            if out is None:
                out = torch.zeros((len(local), width, *value.shape[2:]), dtype=torch.float32)
            if len(rows):
                out[rows, : value.shape[1]] = value
        gathered = comm.gather_rows(out)  # the processes' shares, one after another
        if self.replicas > 1:  # a Ulysses or TP group's processes computed the same rows
            gathered = gathered.unflatten(0, (-1, len(local)))[:: self.replicas].flatten(0, 1)
        in_order = torch.empty_like(gathered)
        in_order[torch.tensor([i for rows in shares for i in rows])] = gathered
        return in_order[: len(batch)]

    def log_probs(
        self, module: Any, batch: TrainBatch, *, entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """A policy module's (B, T) log-probs of the responses at the rollout temperature,
        and with ``entropy`` the (B, T) entropy too."""
        forward = policy_forward(self.cfg.rollout.temperature, entropy)
        if not entropy:
            return self.forward_rows(module, batch, lambda m, mb: forward(m, mb)[0])
        pair = self.forward_rows(
            module, batch, lambda m, mb: torch.stack(forward(m, mb), dim=-1)
        )  # (B, T, 2)
        return pair[..., 0].contiguous(), pair[..., 1].contiguous()

    # ------------------------------------------------------------ updates
    def minibatches(self, batch: TrainBatch, step: int) -> list[TrainBatch]:
        """The policy update's mini-batches: ``ppo_mini_batch_size`` prompts' rows each,
        ``ppo_epochs`` times over the batch, shuffled per (seed, step, epoch)."""
        o = self.cfg.optim
        rows = o.ppo_mini_batch_size * self.cfg.rollout.n
        out = []
        for epoch in range(o.ppo_epochs):
            if o.shuffle:
                seed = self.cfg.trainer.seed * 7919 + step * 101 + epoch
                order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(seed))
            else:
                order = torch.arange(len(batch))
            out += [batch.select(mb) for mb in order.split(rows)]
        return out

    def optimize(
        self,
        prefix: str,
        module: Any,
        optimizer: Any,
        scheduler: Any,
        minibatches: list[TrainBatch],
        forward: ForwardFn,
        loss_fn: LossFn,
        step: int,
    ) -> tuple[dict[str, float], int]:
        """One optimizer step per mini-batch, its gradient accumulated over micro-batches.

        ``forward(module, micro)`` gives the outputs of each micro-batch, with gradient;
        ``loss_fn(micro, outputs, norms) -> (loss, additive, parts)``: ``loss`` is
        normalised by the global mini-batch (so micro-batch terms of all processes add up
        to the mini-batch loss), ``additive`` holds such summable values (reported as
        their mini-batch total, averaged over mini-batches), ``parts`` token-mean metrics.

        Returns:
            (``{prefix}/*`` metrics, number of optimizer steps applied).
        """
        means, skipped, totals = WeightedMeans(), 0, []
        for mini in minibatches:
            norms = self.algorithm.normalisers(mini)
            local = self.local_share(mini)
            finite, sums = True, {}
            for rows in self.micro_batches(local):
                micro = self.micro_batch(local, rows)
                loss, additive, parts = loss_fn(micro, forward(module, micro), norms)
                finite &= bool(torch.isfinite(loss))
                if finite:
                    # FSDP averages gradients over its processes (module docs of backend.py
                    # and, for a Ulysses group's partial gradients, of ulysses.py).
                    self.backend.backward(loss * self.backend.gradient_scale)
                for key, value in additive.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
                means.add(parts, weight=float(micro.loss_mask.sum()))
            grad_norm, ok = self._optimizer_step(module, optimizer, finite)
            skipped += int(not ok)
            keys = sorted(sums)
            packed = comm.all_reduce(torch.tensor([sums[k] for k in keys], dtype=torch.float64))
            packed /= self.replicas  # each group's processes added the same sums
            totals.append(dict(zip(keys, packed.tolist())))
            means.add({f"{prefix}/grad_norm": grad_norm}, weight=1.0 / self.backend.num_processes)
        out = means.reduced(comm.all_reduce)
        for key in totals[0] if totals else ():
            out[key] = float(np.mean([t[key] for t in totals]))
        out[f"{prefix}/lr"] = _step_scheduler(scheduler)
        out[f"{prefix}/nan_skipped_updates"] = float(skipped)
        if skipped:
            self.report(
                f"step {step}: {skipped} {prefix} update(s) skipped (non-finite loss or gradient)"
            )
        return out, len(minibatches) - skipped

    def _optimizer_step(self, module: Any, optimizer: Any, finite: bool) -> tuple[float, bool]:
        """Clip, then step unless the loss or the gradient is not finite (decided by all
        processes together)."""
        grad_norm = float(self.backend.clip_grad_norm_(module, self.cfg.optim.grad_clip))
        ok = comm.same_everywhere(int(finite and math.isfinite(grad_norm)), "min") == 1
        if ok:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, ok


def _step_scheduler(scheduler: Any) -> float:
    """Advance the learning-rate schedule one RL step; returns the rate this step used."""
    lr = scheduler.get_last_lr()[0]
    with warnings.catch_warnings():
        # The schedule counts RL steps, including one whose updates were all skipped
        # (NaN loss); torch warns when that happens before any optimizer.step().
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step")
        scheduler.step()
    return lr
