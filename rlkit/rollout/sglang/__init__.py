"""SGLang as a rollout engine: servers, native-protocol client, weight sync, load balancing.

Importing this package registers ``ROLLOUT_ENGINES["sglang"]`` (see
:mod:`rlkit.rollout.sglang.factory`); the engine itself (and aiohttp) is imported
only when an engine is built. Guide: ``docs/sglang.md``.
"""

from rlkit.rollout.sglang import factory  # noqa: F401  (registers "sglang")
