"""``rlkit diagnose``: the rollout engine's distribution against the trainer's, measured and
explained before a run spends a step on a mismatch.

:mod:`~rlkit.diagnose.comparison` (per-token gap, top-k KL, top-1 agreement, position
buckets), :mod:`~rlkit.diagnose.turns` (multi-turn contexts against the chat template),
:mod:`~rlkit.diagnose.experts` (mixture-of-experts routing), :mod:`~rlkit.diagnose.settings`
(what each side uses, causes ranked), :mod:`~rlkit.diagnose.run` (the phases),
:mod:`~rlkit.diagnose.report` (Markdown, JSON, figure), :mod:`~rlkit.diagnose.cli`.
"""
