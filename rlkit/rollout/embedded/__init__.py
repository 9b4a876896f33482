"""The embedded rollout engine (``hf``, alias ``transformers``): sampling from the
trainer's own Hugging Face model, in the trainer's process.

The engine (:mod:`engine`), its decode loop, which prefills each prompt once for its
``n`` responses (:mod:`kv_decode`), the KV cache that loop writes in place and shares
across a prompt's rows (:mod:`kv_cache`), and the continuous batcher of multi-turn
loops, which continues each trajectory's cache across its turns
(:mod:`continuous_decode`). Importing this package registers the engine.
"""

from rlkit.rollout.embedded import engine  # noqa: F401  (registers "hf")
