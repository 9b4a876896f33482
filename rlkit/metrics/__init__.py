"""Metric math with no dependencies on the rest of rlkit: pass@k (used by evaluation and the
trainer), training FLOPs, and interval estimates and paired tests (``intervals``: t and
Wilson intervals, the paired t-test; used by ``rlkit eval`` and ``rlkit sweep``)."""
