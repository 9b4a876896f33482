"""A KV cache for the decode loop that is written in place instead of grown by copies.

transformers' ``DynamicLayer`` appends each decoded token with ``torch.cat``, which copies
the layer's whole cache at every step: over a rollout of ``T`` new tokens after a prompt
of ``P``, about ``T * (P + T / 2)`` positions per row and layer are copied, for keys and
values. With long prompts that copy rivals the attention itself: 64 rows after 206-token
prompts, 8 layers of 2 KV heads of 128, copy about 280 MB per decoded token in float32.

:class:`InPlaceLayer` holds one buffer per layer and writes each token into it;
attention reads a view of the filled part. The buffer doubles when full, up to the
rollout's length (prompt width + new tokens), so a rollout copies its cache a few times
rather than at every token. The decode loop's two batch operations also copy the filled
part once each, as ``DynamicLayer`` does: repeating the prefilled prompts ``n`` times, and
dropping finished rows.

:class:`SharedPrefixLayer` goes further for ``n`` responses per prompt: repeating the
prefilled prompts keeps one copy of each, and each row's own tokens go to a buffer of
their own; the decode step's attention
(:func:`~rlkit.kernels.shared_prefix_decode.shared_prefix_attention`) then reads each
prompt once per group instead of once per row.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from rlkit.kernels.shared_prefix_decode import PrefixReader, SharedPrefix


class InPlaceLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers
    (batch, kv_heads, positions, head_dim) written in place (keys and values each with
    their own head size: multi-head latent attention's differ).

    The buffer doubles when full, up to ``capacity`` positions (the rollout's prompt width
    plus new tokens); a write past ``capacity`` still doubles it, so the layer never
    refuses a token.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None
        self.length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self.key_buffer is None or end > self.key_buffer.shape[-2]:
            # Doubling, capped at the rollout's length: a rollout copies its cache a few
            # times in all, and holds at most twice what is filled (rows that stop early
            # never claim the whole capacity).
            size = min(2 * end, self.capacity) if end <= self.capacity else 2 * end
            self._reallocate(key_states.shape[0], size, key_states, value_states)
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def _reallocate(
        self, rows: int, capacity: int, key_like: torch.Tensor, value_like: torch.Tensor
    ) -> None:
        """New buffers of ``capacity`` positions for ``rows`` rows, holding the filled part."""
        keys = key_like.new_empty(rows, key_like.shape[1], capacity, key_like.shape[-1])
        values = value_like.new_empty(rows, value_like.shape[1], capacity, value_like.shape[-1])
        if self.length:
            keys[:, :, : self.length] = self.keys
            values[:, :, : self.length] = self.values
        self.key_buffer, self.value_buffer = keys, values

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self.key_buffer[:, :, :length]
        self.values = self.value_buffer[:, :, :length]

    def _reindex_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the rows by ``keys``/``values`` (the filled part of each new row)."""
        capacity = self.key_buffer.shape[-2]
        self.key_buffer = self.value_buffer = None
        self.length = 0
        self._reallocate(keys.shape[0], capacity, keys, values)
        self.key_buffer[:, :, : keys.shape[-2]] = keys
        self.value_buffer[:, :, : keys.shape[-2]] = values
        self._set_length(keys.shape[-2])

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length > 0:
            self._reindex_rows(
                self.keys.repeat_interleave(repeats, dim=0),
                self.values.repeat_interleave(repeats, dim=0),
            )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length > 0:
            self._reindex_rows(self.keys[indices], self.values[indices])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            self._set_length(max(0, self.length + tokens_to_remove))
        elif 0 < tokens_to_remove < self.length:  # the legacy form: the length to keep
            self._set_length(tokens_to_remove)

    def reset(self) -> None:
        super().reset()
        self.key_buffer = self.value_buffer = None
        self.length = 0


class SharedPrefixLayer(InPlaceLayer):
    """An :class:`InPlaceLayer` whose prefilled prompts, once repeated ``n`` times, are
    held once per group: :attr:`prefix` (a
    :class:`~rlkit.kernels.shared_prefix_decode.SharedPrefix`), while the buffer holds
    only each row's own tokens.

    ``update`` then returns only the row's own keys and values, so the attention must
    read the prompt with :meth:`read_prefix`: the decode loop passes
    :func:`prefix_reader` to the model, and :func:`check_prefixes_read` fails loudly
    after a forward whose attention function did not read it. ``get_seq_length`` counts
    the prompt too, so transformers builds masks over prompt + own tokens.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.prefix: SharedPrefix | None = None
        self.unread = False

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.unread = self.prefix is not None
        return super().update(key_states, value_states)

    def read_prefix(self) -> SharedPrefix:
        if self.prefix is None:
            raise RuntimeError("this KV-cache layer holds no shared prompt prefix yet")
        self.unread = False
        return self.prefix

    def get_seq_length(self) -> int:
        prompt = 0 if self.prefix is None else self.prefix.keys.shape[-2]
        return prompt + self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.prefix is not None:
            raise RuntimeError("the shared prompt prefix is already repeated")
        if self.length == 0:
            return
        self.prefix = SharedPrefix(self.keys, self.values, repeats)
        self.capacity = max(1, self.capacity - self.length)  # the rows' own tokens
        self.key_buffer = self.value_buffer = None
        self.keys, self.values = self.keys[:, :, :0], self.values[:, :, :0]
        self.length = 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.prefix is not None:
            slots = self.prefix.slots()[indices.to(self.prefix.keys.device)]
            self.prefix = dataclasses.replace(self.prefix, rows=slots)
        super().batch_select_indices(indices)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "a shared-prefix KV cache is for rlkit's decode loop only and cannot be cropped"
        )

    def reset(self) -> None:
        super().reset()
        self.prefix, self.unread = None, False


def _full_attention_cache(config: object, layer: type[InPlaceLayer], capacity: int):
    cache = DynamicCache(config=config)
    if not cache.layers or any(type(each) is not DynamicLayer for each in cache.layers):
        return None
    cache.layers = [layer(capacity) for _ in cache.layers]
    return cache


def in_place_cache(config: object, capacity: int) -> DynamicCache | None:
    """A ``DynamicCache`` of :class:`InPlaceLayer` for ``config``'s decoder, or
    ``None`` where its layers are not all full-attention ``DynamicLayer`` (sliding-window,
    linear-attention or other layers keep transformers' own cache)."""
    return _full_attention_cache(config, InPlaceLayer, capacity)


def shared_prefix_cache(config: object, capacity: int) -> DynamicCache | None:
    """A ``DynamicCache`` of :class:`SharedPrefixLayer`, where :func:`in_place_cache`
    would give one of :class:`InPlaceLayer`; ``None`` elsewhere."""
    return _full_attention_cache(config, SharedPrefixLayer, capacity)


def prefix_reader(cache: DynamicCache) -> PrefixReader:
    """The callable the attention function reads each layer's shared prompt with."""
    return lambda layer_idx: cache.layers[layer_idx].read_prefix()


def check_prefixes_read(cache: DynamicCache, model: object) -> None:
    """Raise if a forward over ``cache`` left a layer's shared prompt unread: the model's
    attention function then attended to the rows' own tokens alone."""
    if any(getattr(layer, "unread", False) for layer in cache.layers):
        implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise RuntimeError(
            f"the attention implementation {implementation!r} did not read the KV cache's "
            f"shared prompt prefix; decode with the in-place cache (shared_prefix=False) or "
            f"select the grouped_sdpa attention kernel"
        )
