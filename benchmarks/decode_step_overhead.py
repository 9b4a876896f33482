"""Benchmark what transformers' per-layer code costs rlkit's decode loop.

Usage::

    .venv/bin/python benchmarks/decode_step_overhead.py [--mixed-precision bf16]
        [--hidden-size 384 --layers 6 --max-new-tokens 48 --rounds 6 --threads 1]

rlkit's decode loop (:func:`rlkit.rollout.embedded.kv_decode.decode`) runs each decode step
through the model's own ``forward``: transformers builds the attention mask, looks the
attention function up by name in every layer, passes its keyword arguments down through
the model, each decoder layer and its attention, and wraps the result in output objects.
``direct`` runs the same decode step on the same modules without that code around them:
the same embedding, norms, projections, rotary embedding (the modeling module's own
``apply_rotary_pos_emb``), KV-cache update, attention function and MLP, in the same order.
Its log-probs must be bitwise those of ``model`` (the script exits 1 otherwise), so the
time between the two is that code alone, not other arithmetic.

The model is the end-to-end benchmark's random Qwen2 (4 query and 2 key/value heads,
intermediate 4 x hidden); the defaults are its 6-layer workload (8 prompts of 5 tokens x 8
responses, 48 new tokens), ``--hidden-size 512 --layers 8 --max-new-tokens 64`` is
``realistic``'s. As in the engine: rlkit's CPU attention kernel (``grouped_sdpa``; prompts
of 32 tokens or more have each group's prompt read once, as the decode loop does), and
under ``--mixed-precision bf16`` one autocast region with the layers oneDNN serves exactly
packed once per rollout (``linear_weights="auto"``). Rounds alternate which step runs first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

from host_cpu import cpu_name  # noqa: E402
from tiny_models import random_qwen2  # noqa: E402

from rlkit.kernels.attention import grouped_sdpa_attention  # noqa: E402
from rlkit.kernels.packed_linear import packed_linears  # noqa: E402
from rlkit.kernels.shared_prefix_decode import SHARED_PREFIX_KWARG  # noqa: E402
from rlkit.rollout.embedded import kv_decode  # noqa: E402
from rlkit.rollout.embedded.kv_cache import check_prefixes_read, prefix_reader  # noqa: E402

VOCAB = 259


def direct_step(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """A ``_Stepper.decode`` for a ``Qwen2ForCausalLM`` that calls its modules directly:
    ``(stepper, tokens (B,), mask (B, k), positions (B,), cache) -> last logits (B, V)``."""
    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    core = model.model
    rope = sys.modules[type(core.layers[0].self_attn).__module__].apply_rotary_pos_emb
    attention = ALL_ATTENTION_FUNCTIONS[core.config._attn_implementation]

    def step(stepper, tokens, mask, positions, cache):
        # Long prompts: each group's prompt is held once in the cache and read once.
        shared = {SHARED_PREFIX_KWARG: prefix_reader(cache)} if stepper.shared else {}
        x = core.embed_tokens(tokens[:, None])
        positions = positions[:, None]
        attention_mask = create_causal_mask(
            config=core.config, inputs_embeds=x, attention_mask=mask,
            past_key_values=cache, position_ids=positions,
        )  # fmt: skip
        cos, sin = core.rotary_emb(x, positions)
        for layer in core.layers:
            attn = layer.self_attn
            heads = (x.shape[0], 1, -1, attn.head_dim)
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(heads).transpose(1, 2)
            k = attn.k_proj(h).view(heads).transpose(1, 2)
            v = attn.v_proj(h).view(heads).transpose(1, 2)
            q, k = rope(q, k, cos, sin)
            k, v = cache.update(k, v, attn.layer_idx)
            out, _ = attention(
                attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling, **shared
            )
            x = x + attn.o_proj(out.reshape(x.shape[0], 1, -1).contiguous())
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if shared:
            check_prefixes_read(cache, model)
        return model.lm_head(core.norm(x))[:, -1]

    return step


def rollout(model, prompts, args, step) -> tuple[float, list[list[float]]]:
    """One decode of every prompt with ``step`` as the loop's forward: (seconds, log-probs)."""
    bf16 = args.mixed_precision == "bf16"
    kv_decode._Stepper.decode = step
    torch.manual_seed(1)
    started = time.perf_counter()
    # The engine's default linear_weights="auto": only layers packed exactly (bf16 ones).
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
        packed_linears(model, exact_only=True),
    ):
        result = kv_decode.decode(
            model, prompts, n=args.group_size, max_new_tokens=args.max_new_tokens,
            pad_token_id=0, stop_token_ids=[], warp=None,
        )  # fmt: skip
    return time.perf_counter() - started, result.log_probs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden-size", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--mixed-precision", choices=("no", "bf16"), default="no")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.mixed_precision == "bf16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        parser.error("--mixed-precision bf16: oneDNN has no bf16 kernels on this CPU")
    torch.set_num_threads(args.threads)
    model = random_qwen2(
        vocab_size=VOCAB, hidden_size=args.hidden_size, num_layers=args.layers, num_heads=4,
        num_kv_heads=2, intermediate_size=4 * args.hidden_size, max_position_embeddings=1024,
    ).eval()  # fmt: skip
    grouped_sdpa_attention(model)
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, VOCAB, (args.prompt_tokens,), generator=generator).tolist()
        for _ in range(args.prompts)
    ]
    steps = {"model": kv_decode._Stepper.decode, "direct": direct_step(model)}
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    log_probs = {}
    try:
        for name, step in steps.items():  # warm-up
            log_probs[name] = rollout(model, prompts, args, step)[1]
        for r in range(args.rounds):
            for name in steps if r % 2 == 0 else reversed(steps):
                took, log_probs[name] = rollout(model, prompts, args, steps[name])
                seconds[name].append(took)
    finally:
        kv_decode._Stepper.decode = steps["model"]
    same = log_probs["direct"] == log_probs["model"]
    print(
        f"rlkit's decode loop, {args.prompts} prompts x {args.group_size} rows, "
        f"<= {args.max_new_tokens} new tokens, hidden {args.hidden_size} x {args.layers} "
        f"layers, mixed precision {args.mixed_precision!r}, {args.threads} thread(s), "
        f"{cpu_name()}; median of {args.rounds} rounds\n"
    )
    print("| decode step | median s | / model's forward | log-probs |")
    print("|---|---:|---:|---|")
    base = statistics.median(seconds["model"])
    for name in steps:
        median = statistics.median(seconds[name])
        verdict = "reference" if name == "model" else ("bitwise the same" if same else "DIFFER")
        print(f"| {name} | {median:.3f} | {median / base:.3f} | {verdict} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
