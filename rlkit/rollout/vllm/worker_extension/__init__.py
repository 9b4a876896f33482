"""Code that runs inside vLLM's server process, not in the trainer.

This folder is put on the server's ``PYTHONPATH`` (vLLM lives in an environment of its
own, without rlkit), so its modules import nothing but the standard library and torch;
:mod:`rlkit_vllm_worker` is loaded there as a top-level module by
``--worker-extension-cls``.
"""
