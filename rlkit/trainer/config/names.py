"""The names a configuration refers to: registered names and user modules, resolved before
the model loads so that a typo or a broken file stops the run at once.

An unknown name raises the registry's own error (listing the known names and the nearest
match); the other checks raise ``ValueError`` or ``TypeError`` naming the setting.
"""

from __future__ import annotations

from typing import Any

from rlkit.trainer.config.data import DataConfig
from rlkit.trainer.config.rollout import RolloutConfig
from rlkit.trainer.config.training import AlgorithmConfig


def reward_reads_reward_model(reward: str, options: dict[str, Any]) -> bool | None:
    """Whether the configured reward reads the reward model's score: ``True`` (the
    ``reward_model`` reward, or a ``weighted`` term of it), ``False`` (registered rewards
    that do not), ``None`` (a user function, which may read ``context``: unknown)."""
    from rlkit.registry import REWARDS

    if ":" in reward:
        return None
    if reward == "weighted":
        terms = options.get("terms", ())
        terms = terms if isinstance(terms, list | tuple) else ()
        names = [t.get("reward") if isinstance(t, dict) else t for t in terms]
        reads = [reward_reads_reward_model(n, {}) for n in names if isinstance(n, str)]
        return True if True in reads else (None if None in reads else False)
    try:
        entry = REWARDS.entry(reward)
    except LookupError:  # an unknown name is reported by check_registered_names
        return None
    return bool(entry.extra.get("needs_reward_model"))


IMPORT_CHECK_TIMEOUT_S = 120.0
"""How long importing a user's module in a child process may take at configuration."""


def check_imports_alone(name: str, setting: str) -> None:
    """Import the module of ``name`` (``path/to/file.py:fn`` or ``pkg.module:fn``) in a
    child process first: a module that ends the process while it is imported
    (``os._exit``, ``SystemExit``, a crash) is then named, instead of ending the run.

    Raises:
        ValueError: the child did not finish the import; the message names ``setting``,
            the exit status and the end of its output.
    """
    import subprocess
    import sys

    code = (
        "import sys\nfrom rlkit.registry import REWARDS\n"
        "try:\n    REWARDS.entry(sys.argv[1])\nexcept Exception:\n    pass\n"
        "print('rlkit: import finished', flush=True)\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, name],
            capture_output=True,
            text=True,
            timeout=IMPORT_CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"{setting} {name!r}: importing its module took over {IMPORT_CHECK_TIMEOUT_S:g} s; "
            f"a module should only define functions when imported"
        ) from None
    if "rlkit: import finished" not in proc.stdout:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ValueError(
            f"{setting} {name!r}: importing its module ended the process (exit status "
            f"{proc.returncode}){': ' + ' | '.join(tail) if tail else ''}; a module must not "
            f"exit or crash when imported (move that code under `if __name__ == '__main__':`)"
        )


def check_registered_names(
    algorithm: AlgorithmConfig, data: DataConfig, rollout: RolloutConfig
) -> None:
    """Resolve every registry name the configuration uses; an unknown one raises the
    registry's error (which lists the known names and the nearest match).

    The reward may be a file path (``"my_reward.py:score"``): a missing file or function,
    or a file that raises on import, stops here, before the model loads. A reward
    registered with ``check_options=fn`` (``combined``, ``weighted``, ``final_turn``)
    has ``DataConfig.reward_options`` checked by ``fn`` too (the rewards it names)."""
    from rlkit.registry import (
        AGENT_LOOPS,
        AGGREGATIONS,
        ESTIMATORS,
        KL_PENALTIES,
        POLICY_LOSSES,
        REWARDS,
        ROLES,
        ROLLOUT_CORRECTIONS,
        ROLLOUT_ENGINES,
        TOOLS,
        VALUE_LOSSES,
    )

    ESTIMATORS.entry(algorithm.adv_estimator)
    for role in algorithm.roles:  # a user's role file fails here, before the model loads
        ROLES.entry(role)
    POLICY_LOSSES.entry(algorithm.policy_loss)
    VALUE_LOSSES.entry(algorithm.value_loss)
    AGGREGATIONS.entry(algorithm.loss_agg_mode)
    if algorithm.use_kl_loss:
        KL_PENALTIES.entry(algorithm.kl_loss_type)
    if algorithm.use_kl_in_reward:
        KL_PENALTIES.entry(algorithm.kl_penalty)
    if ":" in data.reward:
        check_imports_alone(data.reward, "DataConfig.reward")
    reward = REWARDS.entry(data.reward)
    if ":" in data.reward and not reward.extra.get("batched"):
        # A user's function: a signature that cannot take the call fails now, not after
        # the model loads (verl's compute_score is recognised and called by keyword).
        from rewards.batched_reward import is_batched
        from rewards.verl_signature import check_reward_signature

        if not is_batched(reward.fn, reward):
            check_reward_signature(reward.fn, data.reward_options, label=data.reward)
    check_options = reward.extra.get("check_options")
    if check_options is not None:
        check_options(dict(data.reward_options))
    if algorithm.rollout_is_level is not None:
        ROLLOUT_CORRECTIONS.entry(algorithm.rollout_is_mode)
    engine_option_check(ROLLOUT_ENGINES.entry(rollout.engine).fn, rollout.engine_options)
    AGENT_LOOPS.entry(rollout.agent_loop)
    tools = rollout.agent.get("tools", ()) if isinstance(rollout.agent, dict) else ()
    for tool in (tools,) if isinstance(tools, str) else tools:
        TOOLS.entry(tool)


def engine_option_check(factory: Any, options: dict[str, Any]) -> None:
    """Refuse ``RolloutConfig.engine_options`` the engine factory does not take, before the
    model loads (the factory itself runs after it). A factory whose catch-all is
    ``**unused`` takes only its named options; one whose catch-all forwards options
    elsewhere (``**engine_options``) takes those its ``forwarded_options()`` names, or is
    left to check them itself when it names none."""
    import inspect

    if not isinstance(options, dict):
        raise TypeError(
            f"RolloutConfig.engine_options must be a dict of the engine's keyword options "
            f"(e.g. {{'device': 'cpu'}}), got {options!r}"
        )

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    rest = [p.name for p in params.values() if p.kind is p.VAR_KEYWORD]
    forwarded: set[str] = set()
    if rest and rest[0] != "unused":
        if not hasattr(factory, "forwarded_options"):
            return
        try:
            forwarded = set(factory.forwarded_options())
        except ImportError:  # the engine's packages are missing: it reports that itself
            return
    passed = {"model_path", "tokenizer", "weights", "seed", "run"}  # the trainer's own arguments
    known = [n for n, p in params.items() if p.kind is not p.VAR_KEYWORD and n not in passed]
    known += sorted(forwarded - set(known))
    unknown = sorted(set(options) - set(known))
    if unknown:
        import difflib

        near = [m for u in unknown for m in difflib.get_close_matches(u, known, n=1)]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise TypeError(
            f"RolloutConfig.engine_options has unknown option(s) {unknown}{hint}; the "
            f"engine takes: {', '.join(known) or 'none'}"
        )
