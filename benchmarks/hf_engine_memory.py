"""Peak memory of the HF rollout engine vs ``generate(output_scores=True)``, by response length.

All variants generate the same rows with the same random Qwen2 (vocabulary 49,152, as
SmolLM2's; EOS is never sampled on purpose, so every row runs to
``max_new_tokens``) and return each sampled token's log-prob:

* ``rlkit loop``: ``ROLLOUT_ENGINES.get("hf")`` with its default decode loop
  (:mod:`rlkit.rollout.embedded.kv_decode`): one (rows x vocabulary) tensor at a time.
* ``generate loop``: the same engine with ``decode_loop="generate"``, which gathers the
  log-probs step by step inside ``generate`` (``SampledTokenLogProbs``).
* ``output_scores``: the common recipe:
  ``generate(output_scores=True, return_dict_in_generate=True)``, stack the scores,
  ``log_softmax``, gather; it holds (rows x steps x vocabulary) floats.

Each variant and length runs in a fresh subprocess; its peak is the growth of the
process's peak resident set over its resident set just before generating (model
loaded). The table prints the peaks, the rlkit loop / output_scores ratio, and the
difference of the generate loop's and output_scores' summed log-probs: both call
``generate`` with the same seed and sample the same tokens, so it is ~0 when the
step-by-step log-probs are right. (The rlkit loop samples differently; its log-probs
are checked against teacher forcing in ``tests/test_kv_decode.py``.)

    .venv/bin/python benchmarks/hf_engine_memory.py
    .venv/bin/python benchmarks/hf_engine_memory.py --rows 4 --lengths 16 32   # a quick look
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

MIB = float(1 << 20)
VOCAB = 49152
EOS = VOCAB - 1  # suppressed while generating, so rows always reach max_new_tokens


def build_model() -> torch.nn.Module:
    from tiny_models import random_qwen2

    model = random_qwen2(
        vocab_size=VOCAB,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=4096,
    ).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    return model


class _Weights:
    version = 0

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @contextmanager
    def generation_context(self):
        yield self.model, {"suppress_tokens": [EOS]}


def run_engine(
    model: torch.nn.Module, prompts: list[list[int]], length: int, decode_loop: str
) -> float:
    from rlkit.registry import ROLLOUT_ENGINES
    from rlkit.rollout.base import SamplingParams

    class Tokenizer:
        # generate suppresses EOS (_Weights' extra); the rlkit loop is given no stop id.
        eos_token_id = EOS if decode_loop == "generate" else None
        pad_token_id = 0

    engine = ROLLOUT_ENGINES.get("hf")(
        tokenizer=Tokenizer(), weights=_Weights(model), decode_loop=decode_loop
    )
    out = engine.generate(prompts, SamplingParams(max_new_tokens=length, temperature=1.0))
    assert all(len(r) == length for r in out.response_ids), "a row stopped early"
    return float(sum(sum(lp) for lp in out.rollout_log_probs))


def run_output_scores(model: torch.nn.Module, prompts: list[list[int]], length: int) -> float:
    from transformers import GenerationConfig

    ids = torch.tensor(prompts)
    config = GenerationConfig(
        max_new_tokens=length,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=0,
        suppress_tokens=[EOS],
        output_scores=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        gen = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
        )
        scores = torch.stack(gen.scores, dim=1).float()
        new = gen.sequences[:, ids.shape[1] :]
        logprobs = torch.log_softmax(scores, -1).gather(-1, new[..., None]).squeeze(-1)
    assert new.shape[1] == length, "a row stopped early"
    return float(logprobs.sum())


RUNNERS = {
    "rlkit": lambda model, prompts, length: run_engine(model, prompts, length, "rlkit"),
    "generate": lambda model, prompts, length: run_engine(model, prompts, length, "generate"),
    "output_scores": run_output_scores,
}


def _worker(args: argparse.Namespace) -> None:
    from rlkit.device.host_memory import peak_rss_bytes, process_rss_bytes

    torch.set_num_threads(1)
    model = build_model()
    prompts = [[1 + (i * 7 + j) % 1000 for j in range(8)] for i in range(args.rows)]
    run = RUNNERS[args.worker]
    run(model, prompts, 2)  # warm up allocator and code paths
    base = process_rss_bytes()
    checksum = run(model, prompts, args.length)
    # ru_maxrss is a high-water mark updated lazily: never below the RSS read just now or
    # before generating, so a growth below its resolution reads 0, not a negative number.
    peak = max(peak_rss_bytes(), process_rss_bytes(), base)
    print(json.dumps({"peak": peak - base, "checksum": checksum}))


def _measure(variant: str, rows: int, length: int) -> tuple[float, float]:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        variant,
        "--rows",
        str(rows),
        "--length",
        str(length),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} at length {length} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["peak"] / MIB, result["checksum"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--worker", choices=tuple(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    print(f"rows = {args.rows}, vocabulary = {VOCAB}, float32; peak RSS growth while generating")
    print()
    print(
        "| max_new_tokens | rlkit loop (MiB) | generate loop (MiB) | output_scores (MiB) "
        "| rlkit loop / output_scores | generate loop vs output_scores summed log-prob diff |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        ours, _ = _measure("rlkit", args.rows, length)
        loop, loop_sum = _measure("generate", args.rows, length)
        theirs, their_sum = _measure("output_scores", args.rows, length)
        ratio = ours / max(theirs, 1e-9)
        diff = abs(loop_sum - their_sum)
        print(f"| {length} | {ours:.1f} | {loop:.1f} | {theirs:.1f} | {ratio:.3f} | {diff:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
