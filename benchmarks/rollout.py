"""Rollout throughput, HF engine (both decode loops) vs SGLang and vLLM engines, and weight-sync time.

Both engines generate from the same locally built random Qwen2 (no hub access), the
same prompts and the same sampling settings; tokens/s counts the response tokens
actually generated (a response may stop early at EOS). "concurrency" is the number
of sequences in flight: the HF engine's ``generation_batch_size`` and the server
engines' ``max_concurrency`` (one request per sequence, ``n = 1``). The HF engine runs
with its default decode loop (``rlkit``: finished rows leave the batch) and with
``decode_loop="generate"`` (``transformers``' ``generate``).

    .venv/bin/python benchmarks/rollout.py                      # CPU: tiny model, 1 server
    .venv/bin/python benchmarks/rollout.py --hidden-size 256 --layers 4 --new-tokens 128
    .venv/bin/python benchmarks/rollout.py --device cuda --dtype bfloat16 --hidden-size 1024 \\
        --layers 16 --prompts 256 --concurrency 1,64,256   # GPU (benchmarks/rollout_gpu.sh)

Prints a Markdown table of tokens/s and one of weight-sync times (median of
``--sync-repeats``) for each sync method: SGLang's modes (``distributed`` uses gloo on
CPU, NCCL on GPU) and vLLM's reload of a snapshot from disk.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from benchmarks.host_cpu import cpu_name  # noqa: E402
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer  # noqa: E402
from rlkit.registry import ROLLOUT_ENGINES  # noqa: E402
from rlkit.rollout.base import SamplingParams  # noqa: E402
from tests.sglang.local_policy import LocalPolicyWeights  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,16,32")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--sync-repeats", type=int, default=3)
    p.add_argument("--modes", default="disk,tensor,distributed")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--engines", default="sglang,vllm", help="server engines to time")
    p.add_argument(
        "--vllm-eager",
        action="store_true",
        help="start vLLM with --enforce-eager (no compiled graphs: faster start, slower decode)",
    )
    p.add_argument(
        "--busy-poll",
        action="store_true",
        help="start the server without --sleep-on-idle (SGLang's default; on by default on CPU)",
    )
    return p.parse_args()


def build_model(args: argparse.Namespace, root: Path) -> tuple[Path, torch.nn.Module, object]:
    tok = train_byte_tokenizer()
    heads = max(args.hidden_size // 64, 1)
    path = build_tiny_qwen2(
        root / "model",
        tok,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=heads,
        num_kv_heads=max(heads // 2, 1),
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=max(512, args.prompt_length + args.new_tokens + 8),
    )
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    return path, model, tok


def prompts(args: argparse.Namespace) -> list[list[int]]:
    # Deterministic byte-token prompts (ids 3..258), BOS first.
    return [
        [1] + [3 + (17 * i + 5 * j) % 256 for j in range(args.prompt_length - 1)]
        for i in range(args.prompts)
    ]


def tokens_per_s(engine, batch_prompts, params) -> float:
    engine.generate(batch_prompts[:2], params)  # warm-up
    start = time.perf_counter()
    batch = engine.generate(batch_prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(r) for r in batch.response_ids) / elapsed


def start_server_engine(name: str, args: argparse.Namespace, path: Path, tok, log_dir: Path):
    """The SGLang or vLLM engine with one server serving ``path``."""
    import rlkit.rollout  # noqa: F401  (registers "sglang" and "vllm")

    common = {
        "model_path": str(path),
        "tokenizer": tok,
        "num_servers": 1,
        "device": args.device,
        "dtype": args.dtype,
        "log_dir": str(log_dir / name),
        "verify_tolerance": float("inf"),
    }
    if name == "sglang":
        return ROLLOUT_ENGINES.get("sglang")(
            **common,
            max_total_tokens=args.max_total_tokens,
            mem_fraction_static=args.mem_fraction_static,
            attention_backend="torch_native" if args.device == "cpu" else None,
            sleep_on_idle=not args.busy_poll,
        )
    return ROLLOUT_ENGINES.get("vllm")(
        **common,
        gpu_memory_utilization=args.mem_fraction_static,
        server_args=["--enforce-eager"] if args.vllm_eager else [],
    )


def sync_times(engine, model, modes: list[str], repeats: int, first_version: int) -> list[tuple]:
    """(method, median seconds, log-prob diff after the sync) per weight-sync method."""
    rows = []
    for mode in modes:
        if hasattr(engine, "weight_sync_mode"):
            engine.weight_sync_mode = mode
        times = []
        for r in range(repeats):
            m = engine.sync_weights(LocalPolicyWeights(model, version=first_version + r))
            times.append(m["timing_s/weight_sync"])
        first_version += repeats
        rows.append((mode, statistics.median(times), m["weight_sync/logprob_max_abs_diff"]))
    return rows


def hf_tokens_per_s(weights, ps, params, concurrency: int) -> dict[str, float]:
    from rlkit.rollout.embedded.engine import HFEngine

    return {
        loop: tokens_per_s(
            HFEngine(
                weights,
                pad_token_id=0,
                eos_token_ids=[2],
                generation_batch_size=concurrency,
                decode_loop=loop,
            ),
            ps,
            params,
        )
        for loop in ("rlkit", "generate")
    }


#: The weight-sync methods of each server engine (vLLM reloads a snapshot from disk).
SYNC_METHODS = {"vllm": ["reload from disk"]}


def main() -> None:
    args = parse_args()
    conc = [int(c) for c in args.concurrency.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=args.temperature)
    nan = {"rlkit": float("nan"), "generate": float("nan")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path, model, tok = build_model(args, root)
        weights = LocalPolicyWeights(model, version=1)
        ps = prompts(args)
        speed = {c: {} for c in conc}
        for c in conc:
            speed[c].update(nan if args.skip_hf else hf_tokens_per_s(weights, ps, params, c))
        sync_rows = []
        for name in engines:
            engine = start_server_engine(name, args, path, tok, root / "logs")
            try:
                for c in conc:
                    engine.max_concurrency = c
                    speed[c][name] = tokens_per_s(engine, ps, params)
                modes = SYNC_METHODS.get(name, args.modes.split(","))
                version = 2 + 100 * len(sync_rows)
                sync_rows += [
                    (name, *row)
                    for row in sync_times(engine, model, modes, args.sync_repeats, version)
                ]
            finally:
                engine.close()
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    print(
        f"\nmodel: Qwen2 hidden {args.hidden_size}, {args.layers} layers, {size:.1f} MiB "
        f"({args.dtype}, {args.device}, {cpu_name()}); {args.prompts} prompts x "
        f"{args.prompt_length} tokens, {args.new_tokens} new tokens, temperature "
        f"{args.temperature}\n"
    )
    columns = ["HF engine, rlkit loop", "HF engine, generate loop"]
    columns += [f"{ENGINE_NAMES[e]} engine" for e in engines]
    ratios = ["rlkit loop / generate loop"] + [f"{ENGINE_NAMES[e]} / rlkit loop" for e in engines]
    print(
        "| concurrent sequences | "
        + " | ".join(f"{c} tokens/s" for c in columns)
        + " | "
        + " | ".join(ratios)
        + " |"
    )
    print("|---:" * (1 + len(columns) + len(ratios)) + "|")
    for c in conc:
        ours = speed[c]["rlkit"]
        values = [ours, speed[c]["generate"]] + [speed[c][e] for e in engines]
        cells = [f"{v:,.0f}" for v in values]
        cells += [f"{ours / speed[c]['generate']:.2f}x"]
        cells += [f"{speed[c][e] / ours:.2f}x" for e in engines]
        print(f"| {c} | " + " | ".join(cells) + " |")
    print("\n| engine | weight sync method | median time (s) | max abs log-prob diff after sync |")
    print("|---|---|---:|---:|")
    for name, mode, t, diff in sync_rows:
        print(f"| {ENGINE_NAMES[name]} | {mode} | {t:.3f} | {diff:.2e} |")


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


if __name__ == "__main__":
    main()
