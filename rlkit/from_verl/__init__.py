"""``rlkit from-verl``: a verl launch script as a gin experiment.

Layers, bottom up: :mod:`~rlkit.from_verl.shell` (the script read as bash reads it),
:mod:`~rlkit.from_verl.hydra_values` (each override's value read as Hydra reads it),
:mod:`~rlkit.from_verl.verl_keys` (the keys verl has), :mod:`~rlkit.from_verl.key_table`
(where each key goes), :mod:`~rlkit.from_verl.translation` and :mod:`~rlkit.from_verl.cli`.
"""

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
    targets |= {
        "TrainerConfig.cpu_offload",
        "RolloutConfig.engine_options",
        "DataConfig.truncation",
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
]
