"""The decode loop's in-place KV cache: the same keys and values as transformers' own."""

from __future__ import annotations

import torch
from transformers import Qwen2Config
from transformers.cache_utils import DynamicLayer

from rlkit.rollout.embedded.kv_cache import (
    InPlaceLayer,
    SharedPrefixLayer,
    in_place_cache,
    shared_prefix_cache,
)


def _both(ops) -> None:
    """Apply each op to a DynamicLayer and an InPlaceLayer of capacity 8; after each,
    both must hold exactly the same keys and values."""
    reference, layer = DynamicLayer(), InPlaceLayer(capacity=8)
    for op in ops:
        for cache in (reference, layer):
            out = op(cache)
        if out is not None:  # an update: what attention reads
            assert torch.equal(out[0], reference.keys) and torch.equal(out[1], reference.values)
        assert torch.equal(layer.keys, reference.keys)
        assert torch.equal(layer.values, reference.values)
        assert layer.get_seq_length() == reference.get_seq_length()


def test_the_in_place_layer_holds_what_transformers_dynamic_layer_holds():
    torch.manual_seed(0)
    kv = lambda rows, tokens: (torch.randn(rows, 2, tokens, 4), torch.randn(rows, 2, tokens, 4))  # noqa: E731
    prompt = kv(2, 5)  # 2 prompts, 5 positions (of capacity 8)
    steps = [kv(6, 1) for _ in range(2)] + [kv(4, 1) for _ in range(4)]
    _both(
        [
            lambda c: c.update(*prompt),
            lambda c: c.batch_repeat_interleave(3),  # 2 prompts x n = 3 rows
            lambda c: c.update(*steps[0]),
            lambda c: c.update(*steps[1]),  # 7 positions
            lambda c: c.batch_select_indices(torch.tensor([0, 2, 3, 5])),  # 2 rows stopped
            lambda c: c.update(*steps[2]),  # 8: the buffer is full
            lambda c: c.update(*steps[3]),  # 9: past the capacity, the buffer grows
            lambda c: c.update(*steps[4]),
            lambda c: c.update(*steps[5]),
        ]
    )


def test_the_buffer_doubles_up_to_the_capacity_and_is_written_in_place_between():
    layer = InPlaceLayer(capacity=8)
    ones = lambda tokens: torch.ones(1, 1, tokens, 2)  # noqa: E731
    layer.update(ones(3), ones(3))  # 3 filled: a buffer of 2 x 3 = 6
    buffer = layer.key_buffer
    layer.update(ones(2), ones(2))  # 5 of 6: written in place
    assert layer.key_buffer is buffer and buffer.shape[-2] == 6
    assert layer.keys.data_ptr() == buffer.data_ptr()
    layer.update(ones(3), ones(3))  # 8: doubling to 16 is capped at the capacity, 8
    assert layer.key_buffer.shape[-2] == 8
    layer.update(ones(1), ones(1))  # 9: past the capacity, it still doubles (to 18)
    assert layer.key_buffer.shape[-2] == 18 and layer.get_seq_length() == 9
    assert torch.equal(layer.keys, torch.ones(1, 1, 9, 2))


def test_only_full_attention_decoders_get_the_in_place_cache():
    plain = Qwen2Config(num_hidden_layers=3, hidden_size=16, num_attention_heads=2)
    cache = in_place_cache(plain, capacity=10)
    assert [type(layer) for layer in cache.layers] == [InPlaceLayer] * 3
    sliding = Qwen2Config(
        num_hidden_layers=3,
        hidden_size=16,
        num_attention_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
    )
    assert in_place_cache(sliding, capacity=10) is None  # transformers' own cache
    assert [type(layer) for layer in shared_prefix_cache(plain, 10).layers] == [
        SharedPrefixLayer
    ] * 3
    assert shared_prefix_cache(sliding, capacity=10) is None


def test_the_shared_prefix_layer_holds_each_prompt_once_and_each_rows_own_tokens():
    torch.manual_seed(0)
    kv = lambda rows, tokens: (torch.randn(rows, 2, tokens, 4), torch.randn(rows, 2, tokens, 4))  # noqa: E731
    reference, layer = InPlaceLayer(capacity=9), SharedPrefixLayer(capacity=9)
    prompt = kv(2, 5)  # 2 prompts of 5 positions, then n = 3 rows each, 4 new tokens
    for cache in (reference, layer):
        cache.update(*prompt)
        cache.batch_repeat_interleave(3)
    assert layer.prefix.keys.shape == (2, 2, 5, 4)  # once per prompt, not per row
    assert layer.get_seq_length() == reference.get_seq_length() == 5
    steps = [kv(6, 1), kv(6, 1), kv(4, 1), kv(4, 1)]
    for i, step in enumerate(steps):
        if i == 2:  # rows 1 and 4 stop: slots 0, 2, 3, 5 stay
            for cache in (reference, layer):
                cache.batch_select_indices(torch.tensor([0, 2, 3, 5]))
            assert layer.prefix.rows.tolist() == [0, 2, 3, 5]
        reference.update(*step)
        own_keys, own_values = layer.update(*step)  # only the rows' own tokens
        assert layer.unread  # until the attention reads the prompt
        prefix = layer.read_prefix()
        assert not layer.unread
        # The row's full keys: its group's prompt (slot // n), then its own tokens.
        group = prefix.slots() // prefix.n
        assert torch.equal(torch.cat([prefix.keys[group], own_keys], 2), reference.keys)
        assert torch.equal(torch.cat([prefix.values[group], own_values], 2), reference.values)
        assert layer.get_seq_length() == reference.get_seq_length() == 5 + i + 1
