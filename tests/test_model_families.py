"""The model matrix: every supported family runs exactly, against its own eager forward.

For each tiny family of :mod:`rlkit.models.tiny_families` (windows of 4 tokens, prompts of
7 and 40 tokens, 24 sampled tokens per response: every sequence crosses every window),
the ground truth is transformers' own unpatched forward with eager attention, one row at
a time without padding. Rollout log-probs (rlkit's decode loop, and ``generate``) and
every training-side forward (attention kernel eager / sdpa / grouped_sdpa, shared-prefix
passes on and off, remove-padding on and off, rlkit's patched kernels) must equal it.

Tolerance: a log-prob is a chain of float32 sums no longer than ``reduction_depth`` (the
suite's numerics module): each path differs from the truth by at most ``2 gamma_D`` of
the log-probs' magnitude (about 1e-3 here; measured: under 2e-6). Every feature the
matrix covers changes the log-probs by far more than that when dropped
(:func:`test_each_family_feature_changes_the_log_probs_when_dropped`), so the comparison
can see a path that ignores one.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlkit.kernels.patching import apply_kernels
from rlkit.modeling.modules import ActorModule
from rlkit.models.attention_features import (
    UnsupportedModelError,
    attention_features,
    check_supported,
)
from rlkit.models.loading import check_model_family, load_causal_lm
from rlkit.models.tiny import train_byte_tokenizer
from rlkit.models.tiny_families import FAMILIES, build_tiny_family
from rlkit.rollout.base import SamplingParams
from rlkit.rollout.embedded.engine import HFEngine
from rlkit.rollout.embedded.kv_decode import decode
from tests.gin_files import arithmetic_gin
from tests.numerics import gamma, reduction_depth

REPO = Path(__file__).resolve().parents[1]

PROMPTS = [list(range(5, 12)), list(range(40, 80))]  # 7 and 40 tokens (shared decode from 32)
N, NEW_TOKENS = 3, 24


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, str]:
    tokenizer = train_byte_tokenizer()
    root = tmp_path_factory.mktemp("families")
    return {f: str(build_tiny_family(f, root / f, tokenizer)) for f in FAMILIES}


def _eager(path: str, **config_changes) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(path)
    for key, value in config_changes.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, attn_implementation="eager")
    return model.eval()


@torch.no_grad()
def _truth(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """(rows, tokens) log-probs of each response under ``model``'s own forward, one
    unpadded row at a time."""
    out = []
    for prompt, response in rows:
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
        log_probs = logits[len(prompt) - 1 : -1].log_softmax(-1)
        out.append(log_probs.gather(-1, torch.tensor(response)[:, None]).squeeze(-1))
    return torch.stack(out)


def _tolerance(config, truth: torch.Tensor) -> float:
    depth = reduction_depth(config, rows=1, positions=max(map(len, PROMPTS)) + NEW_TOKENS)
    return 2 * gamma(depth) * truth.abs().max().item()


@dataclass
class Rollout:
    rows: list[tuple[list[int], list[int]]]
    log_probs: torch.Tensor
    truth: torch.Tensor
    tol: float


@functools.cache
def _rollout(path: str) -> Rollout:
    """Responses sampled by rlkit's decode loop under the CPU kernels (grouped_sdpa,
    patched norms and rotary), and their ground truth."""
    policy = load_causal_lm(path).eval()
    apply_kernels(policy)
    torch.manual_seed(0)
    result = decode(
        policy,
        PROMPTS,
        n=N,
        max_new_tokens=NEW_TOKENS,
        pad_token_id=0,
        stop_token_ids=[],
        warp=None,
    )
    rows = [(PROMPTS[i // N], result.response_ids[i]) for i in range(len(PROMPTS) * N)]
    truth = _truth(_eager(path), rows)
    return Rollout(rows, torch.tensor(result.log_probs), truth, _tolerance(policy.config, truth))


def _training_batch(rows: list[tuple[list[int], list[int]]]) -> tuple[dict, int]:
    """Rows as the trainer lays them out: left-padded prompts, right-padded responses."""
    width = max(len(p) for p, _ in rows)
    ids = torch.zeros(len(rows), width + NEW_TOKENS, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (prompt, response) in enumerate(rows):
        ids[b, width - len(prompt) : width] = torch.tensor(prompt)
        ids[b, width : width + len(response)] = torch.tensor(response)
        mask[b, width - len(prompt) : width + len(response)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        "responses": ids[:, width:],
    }
    return batch, width


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rollout_log_probs_equal_the_models_eager_forward(family_dirs, family):
    rollout = _rollout(family_dirs[family])
    torch.testing.assert_close(rollout.log_probs, rollout.truth, rtol=0, atol=rollout.tol)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_rollout_log_probs_equal_the_models_eager_forward(family_dirs, family):
    path = family_dirs[family]
    policy = load_causal_lm(path).eval()
    apply_kernels(policy)

    class Weights:  # the PolicyWeights protocol over a plain model
        version = 0

        @contextmanager
        def generation_context(self):
            yield policy, {}

    engine = HFEngine(Weights(), pad_token_id=0, eos_token_ids=[2], decode_loop="generate")
    torch.manual_seed(0)
    batch = engine.generate(PROMPTS, SamplingParams(n=2, temperature=1.0, max_new_tokens=12))
    rows = list(zip(batch.prompt_ids, batch.response_ids))
    truth = _truth(_eager(path), rows)
    for got, want in zip(batch.rollout_log_probs, truth):
        torch.testing.assert_close(
            torch.tensor(got), want[: len(got)], rtol=0, atol=_tolerance(policy.config, truth)
        )


LEAN = {"rms_norm": "torch_lean", "swiglu": "torch_lean"}  # rlkit's patched CPU kernels
TRAINING_PATHS = [
    (kernel, share, unpad, {})
    for kernel in ("eager", "sdpa", "grouped_sdpa")
    for share in (False, True)
    for unpad in (False, True)
] + [("grouped_sdpa", share, False, LEAN) for share in (False, True)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_training_forward_equals_the_models_eager_forward(family_dirs, family):
    path = family_dirs[family]
    rollout = _rollout(path)
    batch, width = _training_batch(rollout.rows)
    errors = {}
    for kernel, share, unpad, patched in TRAINING_PATHS:
        model = load_causal_lm(path)
        chosen = apply_kernels(model, overrides={"attention": kernel, **patched})
        actor = ActorModule(model, remove_padding=unpad, share_prefix=share)
        with torch.no_grad():
            log_probs, _ = actor(batch, width)
        got = torch.stack([log_probs[b, : len(r)] for b, (_, r) in enumerate(rollout.rows)])
        key = (kernel, chosen["rms_norm"], chosen["swiglu"], share, unpad)
        errors[key] = float((got - rollout.truth).abs().max())
    wrong = {path: f"{e:.2e}" for path, e in errors.items() if e > rollout.tol}
    assert not wrong, f"paths off by more than {rollout.tol:.2e}: {wrong}"


DROPPED = {
    # family: {feature: config changes that drop it}
    "qwen2_window": {"window": {"layer_types": ["full_attention", "full_attention"]}},
    "mistral": {"window": {"sliding_window": None}},
    "phi3": {"window": {"sliding_window": None}},
    "gemma2": {
        "window": {"layer_types": ["full_attention", "full_attention"]},
        "attention soft-capping": {"attn_logit_softcapping": None},
        "final-logit soft-capping": {"final_logit_softcapping": None},
    },
    "gemma3": {"window": {"layer_types": ["full_attention", "full_attention"]}},
}


@pytest.mark.parametrize(
    ("family", "feature"), [(f, feature) for f, d in DROPPED.items() for feature in d]
)
def test_each_family_feature_changes_the_log_probs_when_dropped(family_dirs, family, feature):
    rollout = _rollout(family_dirs[family])
    dropped = _truth(_eager(family_dirs[family], **DROPPED[family][feature]), rollout.rows)
    # A path that ignored the feature would be off by this much: 10x the tolerance at least.
    assert float((dropped - rollout.truth).abs().max()) > 10 * rollout.tol


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_moe_routing_agrees_between_decode_and_training_forward(family_dirs, family):
    """Each token's experts, chosen once while it is decoded one step at a time over the
    KV cache and once in the training forward over the whole packed row, are the same
    wherever the k-th and (k+1)-th router scores differ by more than float rounding."""
    path = family_dirs[family]
    model = load_causal_lm(path).eval()
    apply_kernels(model)
    routers = [m for m in model.modules() if type(m).__name__.endswith("Router")]
    assert routers, f"{family}: no router module found"
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(module, args, output):
        logits, _, indices = output
        seen.append((logits.detach().float(), indices.detach()))

    handles = [r.register_forward_hook(record) for r in routers]
    prompt, response = _rollout(path).rows[-1]
    try:
        with torch.no_grad():  # decode: prefill, then one token per step over the cache
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            cache = out.past_key_values
            for token in response[:-1]:
                out = model(input_ids=torch.tensor([[token]]), past_key_values=cache)
                cache = out.past_key_values
        decoded = _per_layer_tokens(seen, len(routers))
        seen.clear()
        batch, width = _training_batch([(prompt, response)])
        with torch.no_grad():
            ActorModule(model, share_prefix=True)(batch, width)
        trained = _per_layer_tokens(seen, len(routers))
    finally:
        for h in handles:
            h.remove()
    tokens = len(prompt) + len(response) - 1
    compared = agreed = 0
    for (dec_logits, dec_idx), (tr_logits, tr_idx) in zip(decoded, trained):
        tr_logits, tr_idx = tr_logits[:tokens], tr_idx[:tokens]  # the decoded tokens
        k = dec_idx.shape[-1]
        top = dec_logits.sort(dim=-1, descending=True).values
        clear = (top[:, k - 1] - top[:, k]) > 1e-4  # margin far above float32 rounding
        same = (dec_idx.sort(-1).values == tr_idx.sort(-1).values).all(-1)
        compared += int(clear.sum())
        agreed += int((same & clear).sum())
        torch.testing.assert_close(tr_logits, dec_logits, rtol=1e-4, atol=1e-5)
    assert compared >= 0.9 * tokens * len(routers)
    assert agreed == compared


def _per_layer_tokens(seen, layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Router records (one per layer per forward, in call order) -> per layer, every
    token's logits and chosen experts in sequence order."""
    per_layer = [seen[i::layers] for i in range(layers)]
    return [
        (torch.cat([lg for lg, _ in calls]), torch.cat([ix for _, ix in calls]))
        for calls in per_layer
    ]


def test_the_feature_notes_name_what_changes_for_each_family(family_dirs):
    notes = {
        f: " ".join(attention_features(AutoConfig.from_pretrained(family_dirs[f])).notes())
        for f in FAMILIES
    }
    assert notes["qwen2"] == notes["qwen3"] == notes["llama3"] == ""
    assert "sliding-window" in notes["mistral"] and "sliding-window" in notes["gemma3"]
    assert "soft-capping" in notes["gemma2"]
    assert "latent" in notes["deepseek_v3"] and "experts" in notes["deepseek_v3"]
    assert "auxiliary load-balancing loss is not added" in notes["qwen3_moe"]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"use_bidirectional_attention": True}, "bidirectional attention"),
        ({"layer_types": ["chunked_attention", "full_attention"]}, "chunked_attention"),
        ({"logit_scale": 0.0625}, "logit_scale=0.0625"),
    ],
)
def test_a_family_feature_rlkit_cannot_run_exactly_is_refused_before_loading(
    family_dirs, tmp_path, changes, named
):
    config = AutoConfig.from_pretrained(family_dirs["gemma3"])
    for key, value in changes.items():
        setattr(config, key, value)
    config.save_pretrained(tmp_path)  # config.json only: refused before any weight is read
    with pytest.raises(UnsupportedModelError, match=named) as err:
        check_model_family(str(tmp_path))
    assert "ModelConfig.path" in str(err.value) and "docs/models.md" in str(err.value)
    with pytest.raises(UnsupportedModelError):
        check_supported(config)


def test_rlkit_train_refuses_such_a_family_with_one_message_and_exit_2(family_dirs, tmp_path):
    config = AutoConfig.from_pretrained(family_dirs["gemma3"])
    config.use_bidirectional_attention = True
    model = tmp_path / "model"
    config.save_pretrained(model)  # no weights: the refusal comes before any load
    gin_file = tmp_path / "run.gin"
    gin_file.write_text(
        arithmetic_gin(model, tmp_path / "run", {"OptimConfig.ppo_mini_batch_size": 2})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.train", str(gin_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "ModelConfig.path: a gemma3_text model with bidirectional attention" in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing written
