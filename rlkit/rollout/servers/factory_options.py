"""What the server engines' registry factories share: the stop ids every request carries,
and the names of the options a factory forwards to its engine."""

from __future__ import annotations

import inspect
from typing import Any

from rlkit.rollout.servers.options import server_option_names


def stop_token_ids(tokenizer: Any, engine_options: dict[str, Any]) -> list[int]:
    """Pop ``extra_stop_token_ids`` and ``extra_eos_token_ids`` (the HF engine's name for
    the same option) from ``engine_options``; with the tokenizer's EOS id, the ids that
    always end a response."""
    stops = list(engine_options.pop("extra_stop_token_ids", ()))
    stops += list(engine_options.pop("extra_eos_token_ids", ()))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        stops.append(int(tokenizer.eos_token_id))
    return stops


def forwarded_options(engine_cls: type, set_by_factory: set[str]) -> set[str]:
    """The ``engine_options`` a factory's ``**engine_options`` takes on to ``engine_cls``:
    the :class:`~rlkit.rollout.servers.options.ServerOptions` fields and the engine's own
    keywords (checked with the configuration, before a model loads)."""
    params = inspect.signature(engine_cls.__init__).parameters
    own = {"self", "options"} | set_by_factory
    names = {name for name in params if name not in own} | server_option_names()
    return (names - set_by_factory) | {"extra_eos_token_ids"}
