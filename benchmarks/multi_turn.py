"""Multi-turn tool rollouts: what a slow tool costs, and what continuing the KV cache saves.

A tiny Qwen2 is warmed up locally to call the calculator on multiplication prompts
(``rlkit.tasks.tool_arithmetic``), then the ``tool_agent`` loop rolls out one
trajectory per prompt, sampled at ``--temperature`` (responses of different lengths
reach their tool calls at different times, as in RL; ``--temperature 0`` gives the
same conversations in every run), with the calculator answering at once or after
``--tool-latency-s`` seconds. Rows waiting for the tool overlap with rows decoding,
so the latency should cost little: ``slow / instant`` is the ratio of the wall time
per policy token, slow tool over instant tool, in the same run. Engines:

* ``embedded``: the trainer's model with its continuous batcher (each trajectory's
  KV cache continued across turns);
* ``embedded, re-prefill``: the same model through ``generate`` only (each turn's
  turns batched and their whole context prefilled again), the baseline of the
  ``vs re-prefill`` column (tokens/s ratio at the same tool latency);
* ``sglang``: one CPU SGLang server, each turn its own request (``--skip-sglang``
  leaves it out).

    .venv/bin/python benchmarks/multi_turn.py                   # 16 and 64 trajectories
    .venv/bin/python benchmarks/multi_turn.py --trajectories 16 --skip-sglang

Tokens/s counts the policy's tokens (not the inserted tool results).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlkit.registry import ROLLOUT_ENGINES  # noqa: E402
from rlkit.rollout.agent_loop import AgentConfig, AgentRequest, tool_agent  # noqa: E402
from rlkit.rollout.base import RolloutEngine, SamplingParams  # noqa: E402
from rlkit.rollout.embedded.engine import HFEngine  # noqa: E402
from rlkit.rollout.turns import GenerateOnly  # noqa: E402
from rlkit.tasks.tool_arithmetic import tool_sft_model  # noqa: E402
from rlkit.tools import Tool, as_tool, schemas  # noqa: E402
from tests.sglang.local_policy import LocalPolicyWeights  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trajectories", default="16,64", help="concurrent trajectories per run")
    p.add_argument("--tool-latency-s", type=float, default=0.1)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--hidden-size", type=int, default=64, help="of the warmed-up model")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4, help="attention heads of the warmed-up model")
    p.add_argument("--repeats", type=int, default=5, help="runs per cell; the median is shown")
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument(
        "--model-dir", default=None, help="where the warmed-up model is built (reused if there)"
    )
    p.add_argument("--skip-sglang", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    return p.parse_args()


def calculator_with_latency(latency_s: float) -> Tool:
    """The built-in calculator, answering after ``latency_s`` seconds."""
    real = as_tool("calculator")

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: the expression, e.g. ``"23*7"``.
        """
        time.sleep(latency_s)
        return real.fn(expression=expression)

    return as_tool(calculator)


def requests_for(tokenizer, count: int) -> list[AgentRequest]:
    tools = schemas(["calculator"])
    out = []
    for i in range(count):
        a, b = 11 + (i * 37) % 89, 2 + i % 8
        messages = [{"role": "user", "content": f"{a}*{b}"}]
        text = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(AgentRequest(ids, messages))
    return out


def timed(
    engine, requests, tokenizer, tool: Tool, args: argparse.Namespace, seed: int
) -> tuple[float, int, int]:
    """Wall seconds, policy tokens and tool calls of one ``tool_agent`` rollout."""
    config = AgentConfig(tools=(tool,), max_turns=3, max_parallel_tools=len(requests))
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed
    )
    torch.manual_seed(seed)
    start = time.perf_counter()
    trajectories, _ = tool_agent(
        engine, requests, params, tokenizer=tokenizer, config=config, policy_version=0
    )
    wall = time.perf_counter() - start
    tokens = sum(t.num_generated for t in trajectories)
    calls = int(sum(t.stats["tool_calls"] for t in trajectories))
    return wall, tokens, calls


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="rlkit_multi_turn_"))
    model_dir = tool_sft_model(
        args.model_dir or str(work / "model"),
        steps=args.sft_steps,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    embedded = HFEngine(
        LocalPolicyWeights(model, version=0),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
    )
    engines: dict[str, RolloutEngine] = {
        "embedded": embedded,
        "embedded, re-prefill": GenerateOnly(embedded),
    }
    if not args.skip_sglang:
        from rlkit.rollout import sglang  # noqa: F401  (registers "sglang")

        engines["sglang"] = ROLLOUT_ENGINES.get("sglang")(
            model_path=model_dir,
            tokenizer=tokenizer,
            seed=0,
            num_servers=1,
            log_dir=str(work / "sglang"),
            device="cpu",
            dtype="float32",
            attention_backend="torch_native",
            max_total_tokens=32768,
            max_concurrency=256,
            extra_stop_token_ids=[tokenizer.eos_token_id],
        )
    tools = {
        "instant": calculator_with_latency(0.0),
        "slow": calculator_with_latency(args.tool_latency_s),
    }
    rows = []
    try:
        for count in [int(c) for c in args.trajectories.split(",")]:
            requests = requests_for(tokenizer, count)
            cell: dict[tuple[str, str], tuple[float, int, int]] = {}
            for name, engine in engines.items():
                timed(engine, requests[:2], tokenizer, tools["instant"], args, 0)  # warm-up
                runs: dict[str, list[tuple[float, int, int]]] = {speed: [] for speed in tools}
                for seed in range(args.repeats):  # instant and slow alternate, same seeds
                    for speed, tool in tools.items():
                        runs[speed].append(timed(engine, requests, tokenizer, tool, args, seed))
                for speed, got in runs.items():
                    # The median run by seconds per token; its tokens and calls are shown.
                    cell[(name, speed)] = sorted(got, key=lambda r: r[0] / r[1])[len(got) // 2]
            base_wall, base_tokens, _ = cell[("embedded, re-prefill", "slow")]
            for name in engines:
                fast, fast_tokens, _ = cell[(name, "instant")]
                slow, tokens, calls = cell[(name, "slow")]
                rows.append(
                    (
                        name, count, calls, tokens, fast, slow,
                        (slow / tokens) / (fast / fast_tokens), tokens / slow,
                        (tokens / slow) / (base_tokens / base_wall),
                    )
                )  # fmt: skip
    finally:
        for engine in engines.values():
            engine.close()
    print(
        f"\ntool latency {args.tool_latency_s:g} s, temperature {args.temperature:g}, "
        f"max_new_tokens {args.max_new_tokens}, model hidden {args.hidden_size} x "
        f"{args.layers} layers, threads {torch.get_num_threads()}, median of {args.repeats}\n"
    )
    print(
        "| engine | trajectories | tool calls (slow) | policy tokens (slow) | wall instant (s) | "
        "wall slow (s) | slow / instant (s per token) | tokens/s (slow) | vs re-prefill |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, count, calls, tokens, fast, slow, ratio, rate, vs in rows:
        print(
            f"| {name} | {count} | {calls} | {tokens} | {fast:.2f} | {slow:.2f} | "
            f"{ratio:.2f}x | {rate:,.0f} | {vs:.2f}x |"
        )


if __name__ == "__main__":
    main()
