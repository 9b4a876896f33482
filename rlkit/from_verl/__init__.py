"""``rlkit from-verl``: a verl launch script as a gin experiment.

Layers, bottom up: :mod:`~rlkit.from_verl.shell` (the script read as bash reads it),
:mod:`~rlkit.from_verl.hydra_values` (each override's value read as Hydra reads it),
:mod:`~rlkit.from_verl.verl_keys` (the keys verl has), :mod:`~rlkit.from_verl.key_table`
(where each key goes), :mod:`~rlkit.from_verl.translation` and :mod:`~rlkit.from_verl.cli`.
"""

import shlex

from rlkit.from_verl.cli import main
from rlkit.from_verl.key_table import KEYS, UNSUPPORTED
from rlkit.from_verl.translation import Override, Translation, overrides_of, translate


def check_targets() -> list[str]:
    """``Section.field`` targets of :data:`KEYS` that rlkit's configuration lacks."""
    import dataclasses

    from rlkit.trainer.config import ExperimentConfig

    known = {
        f"{f.default_factory.__name__}.{g.name}"
        for f in dataclasses.fields(ExperimentConfig)
        for g in dataclasses.fields(f.default_factory)
    }
    targets = {k.target for k in KEYS.values()}
    targets |= {  # the settings folded keys are written to (rlkit.from_verl.translation)
        "TrainerConfig.cpu_offload",
        "RolloutConfig.engine_options",
        "DataConfig.truncation",
        "AlgorithmConfig.rollout_is_mode",
        "AlgorithmConfig.rollout_is_threshold",
        "AlgorithmConfig.rollout_is_threshold_low",
    }
    return sorted(targets - known)


__all__ = [
    "KEYS",
    "UNSUPPORTED",
    "Override",
    "Translation",
    "check_targets",
    "main",
    "overrides_of",
    "translate",
    "verl_binding_message",
]


def verl_binding_message(binding: str) -> str | None:
    """What to do instead, when a gin binding (``--gin_param``) is a verl override such as
    ``actor_rollout_ref.actor.optim.lr=1e-6``; None for anything else."""
    from rlkit.from_verl.verl_keys import is_verl_key, is_verl_root, nearest

    key, sep, value = binding.partition("=")
    key = key.strip().lstrip("+~")
    if not sep or not key[:1].islower() or "." not in key:
        return None
    if not is_verl_root(key) or not (is_verl_key(key) or nearest(key)):
        return None
    target = KEYS[key].target if key in KEYS else None
    setting = (
        f"rlkit's setting is {target} (--gin_param '{target} = {value.strip()}'), or "
        if target
        else ""
    )
    return (
        f"{binding.strip()!r} is a verl override, not a gin binding: {setting}translate verl "
        f"settings with `rlkit from-verl {shlex.quote(binding.strip())} ...` (or the whole "
        f"launch script)"
    )
