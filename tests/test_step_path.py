"""The path of a training step is short: from ``RLTrainer.step`` to PPO's clip arithmetic
(``vanilla_terms``, the plain math) takes at most five calls, and the Updater never calls
back into a role."""

from __future__ import annotations

import sys
from pathlib import Path

import algorithms
import estimators
from tests.experiment_factory import run_one_step, small_experiment

REPO = Path(__file__).resolve().parents[1]
OWN = tuple(str(REPO / d) for d in ("rlkit", "algorithms", "estimators"))


def _own_frames(frame) -> list[str]:
    """``module.function`` of each rlkit frame from ``frame`` up to ``RLTrainer.step``."""
    chain = []
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(OWN):
            chain.append(f"{Path(code.co_filename).stem}.{code.co_name}")
            if code.co_name == "step" and code.co_filename.endswith("trainer.py"):
                return chain[::-1]
        frame = frame.f_back
    return []


def test_step_reaches_the_clip_in_five_calls_with_no_call_back_into_a_role(
    demo_model_dir, tmp_path
):
    chains: list[list[str]] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "vanilla_terms":
            chains.append(_own_frames(frame))

    cfg = small_experiment(
        demo_model_dir, tmp_path / "run", algorithm={"math": "plain"}, trainer={"total_steps": 1}
    )

    def trace(trainer):
        sys.setprofile(profile)

    try:
        run_one_step(cfg, prepare=trace)
    finally:
        sys.setprofile(None)
        algorithms.set_math("fused")  # the process-wide default, for the tests after this
        estimators.set_math("fused")
    assert chains, "the step never reached vanilla_terms"
    chain = chains[0]
    assert chain == [
        "trainer.step",
        "actor.update",
        "updater.optimize",
        "algorithm.actor_loss",
        "vanilla.vanilla",
        "vanilla.vanilla_terms",
    ], chain
    assert len(chain) - 1 <= 5
    assert all(c == chain for c in chains)  # every micro-batch's loss, the same way
