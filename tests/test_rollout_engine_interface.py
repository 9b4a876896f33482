"""The engine interface beyond ``generate``: ``turns()``, and the metric names an engine
declares (``counters``, ``gauges``) against the ones it really emits.

Every registered engine must be checked here: the trainer logs only declared names, so
an engine that emits a name it does not declare loses that metric (with a warning).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.registry import ROLLOUT_ENGINES
from rlkit.rollout.base import (
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    split_engine_metrics,
)
from rlkit.rollout.embedded.engine import HFEngine
from rlkit.rollout.turns import BatchedTurns, GenerateOnly, TurnGenerator, TurnResult, run_turns
from tests.sglang.local_policy import LocalPolicyWeights

#: Every registered engine, and the test below that checks its declared metric names.
CHECKED_ENGINES = {
    "hf": "test_hf_engine_declares_every_metric_it_emits",
    "sglang": "test_server_engines_declare_every_metric_they_emit",
    "vllm": "test_server_engines_declare_every_metric_they_emit",
}


class CountingEngine(RolloutEngine):
    """An engine with ``generate`` alone: the default ``turns`` batches through it."""

    counters = ("test/calls",)

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        self.calls.append(len(prompt_ids))
        rows = [list(p) for p in prompt_ids]
        return RolloutBatch(
            prompt_ids=rows,
            response_ids=[[p[-1] + 1] for p in rows],
            rollout_log_probs=[[-0.5] for _ in rows],
            finish_reasons=["stop" for _ in rows],
            prompt_index=list(range(len(rows))),
            metrics={"test/calls": 1.0, "rollout/test_tokens_per_s": 10.0},
        )

    def sync_weights(self, weights: Any) -> dict[str, float]:
        return {}


def two_turns(turns: TurnGenerator, contexts: list[list[int]]) -> list[list[TurnResult]]:
    """Each context asks for a turn, then for one more after it: as an agent loop does."""

    async def trajectory(key: int, context: list[int]) -> list[TurnResult]:
        first = await turns.generate(key, context, 4)
        second = await turns.generate(key, context + first.response_ids + [3], 4)
        turns.release(key)
        return [first, second]

    async def main() -> list[list[TurnResult]]:
        return list(await asyncio.gather(*(trajectory(k, c) for k, c in enumerate(contexts))))

    return run_turns(turns, main())


def emitted(metrics: dict[str, float]) -> set[str]:
    """The names of ``metrics`` the trainer sorts: all but per-call rates."""
    return {name for name in metrics if not name.endswith("_per_s")}


def assert_declared(engine: Any, metrics: dict[str, float]) -> None:
    counters, gauges, undeclared = split_engine_metrics(engine, metrics)
    assert not undeclared, f"{type(engine).__name__} emits undeclared {sorted(undeclared)}"
    assert set(counters) | set(gauges) == emitted(metrics)


def test_the_default_turns_batch_the_waiting_turns_through_generate():
    engine = CountingEngine()
    turns = engine.turns(SamplingParams(max_new_tokens=4, n=3))
    assert isinstance(turns, BatchedTurns) and turns.params.n == 1
    results = two_turns(turns, [[10], [20]])
    assert [[r.response_ids for r in rs] for rs in results] == [[[11], [4]], [[21], [4]]]
    assert engine.calls == [2, 2]  # both trajectories' turns went together, twice
    # Counts add up over the calls; a per-call rate does not, so it is left out.
    assert turns.metrics == {"test/calls": 2.0}
    assert_declared(engine, turns.metrics)


def test_split_engine_metrics_sorts_by_declaration_and_leaves_rates_out():
    class Declares(CountingEngine):
        counters = ("rollout/num_requests",)
        gauges = ("rollout/servers_usable",)

    metrics = {
        "rollout/num_requests": 3.0,
        "rollout/servers_usable": 2.0,
        "rollout/new_count": 1.0,
        "rollout/response_tokens_per_s": 99.0,
    }
    counters, gauges, undeclared = split_engine_metrics(Declares(), metrics)
    assert counters == {"rollout/num_requests": 3.0}
    assert gauges == {"rollout/servers_usable": 2.0}
    assert undeclared == {"rollout/new_count": 1.0}
    assert RolloutEngine.counters == () and RolloutEngine.gauges == ()


def test_every_registered_engine_has_its_metric_names_checked():
    assert ROLLOUT_ENGINES.names() == sorted(CHECKED_ENGINES)
    for test in CHECKED_ENGINES.values():
        assert callable(globals()[test])


@pytest.mark.parametrize("decode_loop", ["rlkit", "generate"])
def test_hf_engine_declares_every_metric_it_emits(tiny_model_dir, decode_loop):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    engine = ROLLOUT_ENGINES.get("hf")(
        model_path=str(tiny_model_dir),
        tokenizer=tok,
        weights=LocalPolicyWeights(model, version=0),
        seed=0,
        decode_loop=decode_loop,
    )
    assert isinstance(engine, HFEngine)
    prompts = [tok("12+3=").input_ids, tok("7+70=").input_ids]
    params = SamplingParams(max_new_tokens=4, temperature=1.0, n=2)
    assert_declared(engine, engine.generate(prompts, params).metrics)

    turns = engine.turns(params)
    two_turns(turns, prompts)
    assert_declared(engine, turns.metrics)
    if decode_loop == "rlkit":  # the KV cache was continued: the counter is really emitted
        assert turns.metrics["rollout/kv_reused_tokens"] > 0

    # The re-prefill baseline declares the engine's names and batches through generate.
    baseline = GenerateOnly(engine)
    assert (baseline.counters, baseline.gauges) == (engine.counters, engine.gauges)
    turns = baseline.turns(params)
    assert isinstance(turns, BatchedTurns)
    two_turns(turns, prompts)
    assert_declared(baseline, turns.metrics)


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_server_engines_declare_every_metric_they_emit(monkeypatch, name):
    """The metrics ``generate`` and ``ServerTurns`` build, with the server answers
    replaced (no server: the address is never contacted)."""
    import rlkit.rollout  # noqa: F401 - registers the engines
    from rlkit.rollout.servers.engine import ServerRolloutEngine
    from rlkit.rollout.servers.sample import Sample

    # The vLLM engine checks at construction that attached servers answer /health.
    monkeypatch.setattr("rlkit.rollout.vllm.engine._check_attached", lambda urls, router: None)
    engine = ROLLOUT_ENGINES.get(name)(urls=["http://127.0.0.1:1"])
    assert isinstance(engine, ServerRolloutEngine)
    stats = Counter(requests=3, retries=1, duplicates=0)

    async def answers(prompts: list[list[int]], params: SamplingParams) -> Any:
        sample = Sample([5, 2], [-0.5, -0.25], "stop", "init")
        return [[sample] * params.n for _ in prompts], stats

    def one_turn(context_ids: Sequence[int], params: SamplingParams) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result((Sample([5], [-0.5], "length", "init"), stats))
        return future

    monkeypatch.setattr(engine, "_generate_all", answers)
    monkeypatch.setattr(engine, "submit_turn", one_turn)
    try:
        batch = engine.generate([[1, 2], [3]], SamplingParams(max_new_tokens=2, n=2))
        assert len(batch) == 4
        assert_declared(engine, batch.metrics)
        # Every declared name is emitted by generate: none is declared in vain.
        assert emitted(batch.metrics) == set(engine.counters) | set(engine.gauges)

        turns = engine.turns(SamplingParams(max_new_tokens=2))
        two_turns(turns, [[1, 2], [3]])
        assert turns.metrics["rollout/num_requests"] == 4 * 3.0
        assert_declared(engine, turns.metrics)
    finally:
        engine.close()


def test_weight_version_spans_give_each_token_the_version_that_sampled_it():
    from rlkit.rollout.servers.errors import RequestError
    from rlkit.rollout.sglang.client import span_versions

    # 5 tokens: 3 sampled by the initial weights ('init': the caller's version), then a
    # sync to version 7 under the running request, then 2 by version 7.
    spans = [{"version": "init", "start": 0, "end": 3}, {"version": "7", "start": 3, "end": 5}]
    assert span_versions({"weight_versions": spans}, 5) == [None, None, None, 7, 7]
    one = [{"version": "7", "start": 0, "end": 5}]
    assert span_versions({"weight_versions": one}, 5) is None  # one version: the call's
    assert span_versions({}, 5) is None
    with pytest.raises(RequestError, match="cover 5 of 6 tokens"):
        span_versions({"weight_versions": spans}, 6)
    gap = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 3, "end": 5}]
    with pytest.raises(RequestError, match="gap or overlap"):
        span_versions({"weight_versions": gap}, 5)


def test_reported_token_versions_reach_the_trajectories_and_the_rest_take_the_calls():
    from rlkit.rollout.sampling import RolloutBatch
    from rlkit.rollout.trajectory import trajectories_from_rollout

    batch = RolloutBatch(
        prompt_ids=[[1, 2], [1, 2]],
        response_ids=[[5, 6, 7], [8, 9]],
        rollout_log_probs=[[-0.1, -0.2, -0.3], [-0.4, -0.5]],
        finish_reasons=["length", "stop"],
        prompt_index=[0, 0],
        token_versions=[[None, 4, 4], [None, None]],
    )
    first, second = trajectories_from_rollout(batch, policy_version=3)
    assert first.policy_version == [3, 4, 4]  # begun under 3, continued under 4
    assert second.policy_version == [3, 3]
    batch.token_versions = [[4, 4, 4]]  # one row for two
    with pytest.raises(ValueError, match="token_versions has 1 rows, expected 2"):
        trajectories_from_rollout(batch, policy_version=3)
