"""Continuous batching of policy turns over one KV cache, continued across turns.

The embedded engine's :class:`~rlkit.rollout.turns.TurnGenerator`. Trajectories ask
for turns at different times (one waits for its tool while others decode); each
iteration of the driver

1. **admits** the turns asked for since the last iteration in one forward pass. A
   trajectory seen before brings back the KV cache it left with, so only the ids
   appended since (the end of its turn, the tool or user message, the next
   assistant header) are run: no re-prefill of the conversation. New trajectories
   with the same context (the ``n`` samples of a prompt) are run once and repeated;
2. **samples** one token for every row in the batch (warpers and log-probs as in
   :mod:`rlkit.rollout.embedded.kv_decode`);
3. **decodes** the rows that go on. A row whose turn ended leaves the batch; its
   cache is kept, compacted, under its trajectory's key until the trajectory asks
   again or is released.

Rows of different lengths share the batch through the attention mask: the cache is
left-padded to the longest row, and a row's own padding (between its cached part and
the ids admitted with it) is masked too. Position ids are explicit, so every token
sits at its position in its own trajectory, and a row's log-probs are those of the
plain, unbatched forward pass up to float rounding.

Under FSDP (``synced``) every process runs the same forward passes in lock step: each
iteration the processes agree whether anyone admits, decodes or still has work; a
process with nothing of its own to run joins with a one-token pass, as
``generate(synced_gpus=True)`` does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from rlkit.rollout.base import PolicyWeights, SamplingParams
from rlkit.rollout.embedded.kv_decode import Warp, sample_categorical
from rlkit.rollout.turns import TurnGenerator, TurnResult

T = TypeVar("T")
KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer ``(keys, values)``, each (rows, heads, width, head_dim)."""


@dataclass
class _Kept:
    """A trajectory's cache between its turns: ``tokens`` are the ids ``kv`` covers."""

    tokens: list[int]
    kv: KV


@dataclass
class _Ask:
    key: int
    context_ids: list[int]
    max_new_tokens: int
    future: asyncio.Future[TurnResult]


@dataclass
class _Row:
    """A row of the batch: one trajectory's turn being decoded."""

    ask: _Ask
    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)


def _cache_layers(cache: Any) -> list[Any]:
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        raise TypeError(
            f"multi-turn decoding continues each row's cache, which needs a DynamicCache of "
            f"full-attention layers; this model returned {type(cache).__name__} "
            f"{[type(x).__name__ for x in layers or ()]}: use the hf engine's "
            f"decode_loop='generate' (RolloutConfig.engine_options)"
        )
    return layers


def _as_kv(cache: Any) -> KV:
    return [(layer.keys, layer.values) for layer in _cache_layers(cache)]


def _to_cache(kv: KV) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=kv)


def _left_pad(kv: KV, mask: torch.Tensor, width: int) -> tuple[KV, torch.Tensor]:
    """``kv`` and ``mask`` (rows, w) widened to ``width`` with masked zeros on the left."""
    extra = width - mask.shape[1]
    if extra <= 0:
        return kv, mask
    pad_kv = []
    for k, v in kv:
        zeros = k.new_zeros((*k.shape[:2], extra, k.shape[3]))
        pad_kv.append((torch.cat([zeros, k], 2), torch.cat([zeros.to(v.dtype), v], 2)))
    return pad_kv, torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], 1)


def _stack(parts: Sequence[tuple[KV, torch.Tensor]]) -> tuple[KV, torch.Tensor]:
    """Rows of several ``(kv, mask)`` in one, left-padded to the widest."""
    width = max(mask.shape[1] for _, mask in parts)
    padded = [_left_pad(kv, mask, width) for kv, mask in parts]
    layers = len(padded[0][0])
    kv = [
        (
            torch.cat([p[0][i][0] for p in padded], 0),
            torch.cat([p[0][i][1] for p in padded], 0),
        )
        for i in range(layers)
    ]
    return kv, torch.cat([mask for _, mask in padded], 0)


class ContinuousDecoder(TurnGenerator):
    """Turns of many trajectories, batched continuously over the trainer's model.

    Args:
        weights: the trainer's policy (its ``generation_context`` yields the model).
        params: sampling settings of every turn (``n`` is ignored: one per ask).
        pad_token_id: id fed at padded positions (masked, never attended).
        stop_token_ids: ids that end a turn (kept in its ids).
        warp: float32 logits -> the sampling distribution's scores; ``None`` = raw.
        linears: model -> the context the forwards run in (the engine's packed linear
            layers, :meth:`~rlkit.rollout.embedded.engine.HFEngine.linears`); ``None``: none.
    """

    def __init__(
        self,
        weights: PolicyWeights,
        params: SamplingParams,
        *,
        pad_token_id: int,
        stop_token_ids: Sequence[int],
        warp: Warp | None,
        linears: Callable[[torch.nn.Module], AbstractContextManager[object]] | None = None,
    ) -> None:
        super().__init__(params)
        self.weights, self.pad_token_id, self.warp = weights, pad_token_id, warp
        self.linears = linears or (lambda model: nullcontext())
        self.stops = sorted(set(stop_token_ids))
        self.greedy = params.temperature <= 0
        self._asks: list[_Ask] = []
        self._kept: dict[int, _Kept] = {}
        self._wake = asyncio.Event()
        self.tokens_reused = 0  # ids served from kept caches instead of being run again

    async def generate(self, key: int, context_ids: list[int], max_new_tokens: int) -> TurnResult:
        if max_new_tokens < 1:
            raise ValueError(f"a turn needs max_new_tokens >= 1, got {max_new_tokens}")
        if not context_ids:
            raise ValueError("a turn needs a non-empty context")
        future = asyncio.get_running_loop().create_future()
        self._asks.append(_Ask(key, list(context_ids), max_new_tokens, future))
        self._wake.set()
        return await future

    def release(self, key: int) -> None:
        self._kept.pop(key, None)

    async def run(self, main: Awaitable[T]) -> T:
        task = asyncio.ensure_future(main)
        with self.weights.generation_context() as (model, extra), self.linears(model):
            was_training = model.training
            model.eval()
            try:
                self._bind(model, bool(extra.get("synced_gpus")))
                await self._drive(task)
            except BaseException as exc:
                self._fail_all(exc)
                task.cancel()
                raise
            finally:
                model.train(was_training)
                self._kept.clear()
        self.metrics["rollout/kv_reused_tokens"] = float(self.tokens_reused)
        return task.result()

    # ------------------------------------------------------------------ driver
    def _bind(self, model: torch.nn.Module, synced: bool) -> None:
        self.model, self.synced = model, synced
        self.device = next(model.parameters()).device
        takes = inspect.signature(type(model).forward).parameters
        self.keep_last = {"logits_to_keep": 1} if "logits_to_keep" in takes else {}
        self.stop_tensor = torch.tensor(self.stops, dtype=torch.long, device=self.device)
        self.rows: list[_Row] = []
        self.kv: KV | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.positions = torch.zeros((0,), dtype=torch.long, device=self.device)
        self.logits: torch.Tensor | None = None

    async def _drive(self, task: asyncio.Future[Any]) -> None:
        """Iterate until the trajectories are done: admit, sample, decode.

        Each forward pass is decided by a vote (under FSDP), so every process runs
        the same passes; when no process has a pass to run, none runs one.
        """
        while True:
            await self._let_trajectories_ask()
            admit, busy = self._vote(bool(self._asks), not task.done())
            if not busy:
                return
            if admit:
                self._admit() if self._asks else self._dummy()
            if self.rows:
                self._sample()
            (decode,) = self._vote(bool(self.rows))
            if decode:
                self._decode() if self.rows else self._dummy()
            elif not admit:  # every trajectory waits for its tools
                if self.synced:
                    await asyncio.sleep(0.005)
                else:
                    await self._wait(task)

    async def _let_trajectories_ask(self) -> None:
        """Yield until no trajectory adds an ask (those whose turns just ended continue)."""
        for _ in range(8):
            before = len(self._asks)
            await asyncio.sleep(0)
            if len(self._asks) == before:
                return

    async def _wait(self, task: asyncio.Future[Any]) -> None:
        self._wake.clear()
        if self._asks or task.done():
            return
        waiter = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    def _vote(self, *flags: bool) -> tuple[bool, ...]:
        """``flags`` or'ed over every process under FSDP (one all-reduce)."""
        if not self.synced:
            return flags
        from rlkit.distributed.collectives import all_reduce

        agreed = all_reduce(torch.tensor([int(f) for f in flags]), "max")
        return tuple(bool(f) for f in agreed.tolist())

    def _fail_all(self, exc: BaseException) -> None:
        for ask in [*self._asks, *(row.ask for row in getattr(self, "rows", []))]:
            if not ask.future.done():
                ask.future.set_exception(exc)
        self._asks = []

    # ---------------------------------------------------------------- forwards
    @torch.no_grad()
    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, kv: KV | None
    ) -> tuple[torch.Tensor, KV]:
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask,
            position_ids=positions,
            past_key_values=_to_cache(kv) if kv is not None else None,
            use_cache=True,
            **self.keep_last,
        )
        return out.logits[:, -1], _as_kv(out.past_key_values)

    def _dummy(self) -> None:
        ids = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        with torch.no_grad():
            self.model(input_ids=ids, use_cache=False, **self.keep_last)

    def _admit(self) -> None:
        """One forward pass over every ask: its new ids after its kept cache (if any)."""
        asks, self._asks = self._asks, []
        units: list[tuple[_Kept | None, list[int]]] = []  # (kept cache, ids to run)
        unit_of: list[int] = []  # the unit each ask is served by
        fresh: dict[tuple[int, ...], int] = {}
        for ask in asks:
            kept = self._kept.pop(ask.key, None)
            start = len(kept.tokens) if kept is not None else 0
            if kept is not None and (
                start >= len(ask.context_ids) or ask.context_ids[:start] != kept.tokens
            ):
                kept, start = None, 0  # the context is not a continuation: run it whole
            if kept is None and tuple(ask.context_ids) in fresh:
                unit_of.append(fresh[tuple(ask.context_ids)])
                continue
            if kept is None:
                fresh[tuple(ask.context_ids)] = len(units)
            self.tokens_reused += start
            unit_of.append(len(units))
            units.append((kept, ask.context_ids[start:]))
        logits, kv, mask = self._prefill(units)
        if len(units) < len(asks):  # repeat each shared prefill for the asks it serves
            index = torch.tensor(unit_of, device=self.device)
            kv = [(k[index], v[index]) for k, v in kv]
            logits, mask = logits[index], mask[index]
        lengths = mask.sum(-1)
        new_rows = [_Row(ask) for ask in asks]
        self._join(new_rows, kv, mask, lengths, logits)

    def _prefill(
        self, units: list[tuple[_Kept | None, list[int]]]
    ) -> tuple[torch.Tensor, KV, torch.Tensor]:
        """Run each unit's new ids after its kept cache; return logits, cache and mask.

        The new ids are left-padded among themselves; a unit without a kept cache has
        an empty one, padded (masked) to the longest kept cache.
        """
        width = max(len(ids) for _, ids in units)
        ids = torch.full((len(units), width), self.pad_token_id, dtype=torch.long)
        new_mask = torch.zeros((len(units), width), dtype=torch.long, device=self.device)
        for i, (_, run) in enumerate(units):
            ids[i, width - len(run) :] = torch.as_tensor(run, dtype=torch.long)
            new_mask[i, width - len(run) :] = 1
        kept = [k for k, _ in units if k is not None]
        if kept:
            empty = [(k[:, :, :0], v[:, :, :0]) for k, v in kept[0].kv]
            past, past_mask = _stack(
                [
                    (k.kv, new_mask.new_ones((1, len(k.tokens))))
                    if k is not None
                    else (empty, new_mask.new_zeros((1, 0)))
                    for k, _ in units
                ]
            )
        else:
            past, past_mask = None, new_mask.new_zeros((len(units), 0))
        mask = torch.cat([past_mask, new_mask], 1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past_mask.shape[1] :]
        logits, kv = self._forward(ids, mask, positions, past)
        return logits, kv, mask

    def _join(
        self,
        rows: list[_Row],
        kv: KV,
        mask: torch.Tensor,
        lengths: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """Add admitted rows (their logits are ready) to the batch."""
        if self.rows:
            self.kv, self.mask = _stack([(self.kv, self.mask), (kv, mask)])
            self.positions = torch.cat([self.positions, lengths])
            self.logits = torch.cat([self.logits, logits])
        else:
            self.kv, self.mask, self.positions, self.logits = kv, mask, lengths, logits
        self.rows += rows

    def _sample(self) -> None:
        """A token for every row; rows whose turn ends leave the batch (cache kept)."""
        scores = self.logits.float()
        logp = torch.log_softmax(self.warp(scores) if self.warp is not None else scores, dim=-1)
        tokens = logp.argmax(-1) if self.greedy else sample_categorical(logp)
        chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
        stopped = torch.isin(tokens, self.stop_tensor).tolist()
        keep = []
        for i, (row, token, lp, stop) in enumerate(
            zip(self.rows, tokens.tolist(), chosen.tolist(), stopped)
        ):
            row.ids.append(token)
            row.log_probs.append(lp)
            if stop or len(row.ids) >= row.ask.max_new_tokens:
                self._finish(i, row, "stop" if stop else "length")
            else:
                keep.append(i)
        self.next_tokens = tokens
        if len(keep) < len(self.rows):
            self._select(keep)

    def _finish(self, i: int, row: _Row, reason: str) -> None:
        columns = self.mask[i].nonzero().squeeze(-1)
        kv = [(k[i : i + 1, :, columns], v[i : i + 1, :, columns]) for k, v in self.kv]
        # The cache covers the context and every sampled id but the last (not yet run).
        self._kept[row.ask.key] = _Kept(row.ask.context_ids + row.ids[:-1], kv)
        if not row.ask.future.done():
            row.ask.future.set_result(TurnResult(row.ids, row.log_probs, reason))

    def _select(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask[index]
        # Columns no remaining row uses (left of all of them) are dropped.
        used = mask.any(0).nonzero()
        first = int(used[0]) if len(used) else mask.shape[1]
        self.kv = [(k[index, :, first:], v[index, :, first:]) for k, v in self.kv]
        self.mask = mask[:, first:]
        self.positions = self.positions[index]
        self.logits = self.logits[index]
        self.next_tokens = self.next_tokens[index]

    def _decode(self) -> None:
        """One step of every row still in its turn."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], 1)
        self.logits, self.kv = self._forward(
            self.next_tokens[:, None], self.mask, self.positions[:, None], self.kv
        )
        self.positions = self.positions + 1
