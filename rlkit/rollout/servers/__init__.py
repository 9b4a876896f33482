"""The server layer every HTTP rollout engine (SGLang, vLLM) stands on.

Processes (:mod:`process`), the pool of endpoints with health checks and restarts
(:mod:`pool`), the HTTP client (:mod:`http_client`), disk snapshots (:mod:`snapshots`),
the post-sync log-prob check (:mod:`logprob_check`), the options every server engine
takes (:mod:`options`) and the engine base class with requests, retries and re-sending
(:mod:`engine`). An engine adds only its launch command, its request and response format
and its weight-sync calls.
"""
