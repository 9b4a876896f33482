"""vLLM as a rollout engine: servers in vLLM's own environment, completions protocol, weight sync.

Importing this package registers ``ROLLOUT_ENGINES["vllm"]`` (see
:mod:`rlkit.rollout.vllm.factory`); the engine itself (and aiohttp) is imported only
when an engine is built, and vLLM itself only ever in the server's process. Guide:
``docs/vllm.md``.
"""

from rlkit.rollout.vllm import factory  # noqa: F401  (registers "vllm")
