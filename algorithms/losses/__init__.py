"""Policy losses: one module per loss, all registered in ``POLICY_LOSSES``.

Every loss has the same signature::

    fn(old_log_prob, log_prob, advantages, response_mask, *,
       loss_agg_mode="token-mean", clip_ratio=0.2, clip_ratio_low=None,
       clip_ratio_high=None, clip_ratio_c=3.0, rollout_is_weights=None,
       num_tokens=None, num_seqs=None, norm_length=None, **options)
    -> (loss, metrics)

* tensors are (B, T); ``clip_ratio_low/high`` default to ``clip_ratio``;
* log-probs may hold anything at padding (even -inf): the losses zero it before
  use, so padding gets neither NaN values nor gradients; advantages must be
  finite everywhere (the estimators return 0 at padding);
* ``num_tokens``, ``num_seqs``, ``norm_length`` are the *mini-batch's* normalisers
  (``algorithms.global_normalizers``), so micro-batch losses sum to the batch loss;
* ``rollout_is_weights`` (B, T), detached, multiplies the per-token loss;
* loss-specific knobs are keyword options with documented defaults; an unknown
  option raises TypeError naming it;
* ``metrics`` holds detached 0-dim tensors ``pg_clipfrac``, ``ppo_kl``,
  ``pg_clipfrac_lower`` (token means over the micro-batch's valid tokens; 0
  where meaningless) plus loss-specific extras.

To add a loss, write a function with this signature in your own file and
decorate it with ``@POLICY_LOSSES.register("name")`` (or pass
``"package.module:function"`` wherever a loss name is expected).

Shared pieces: ``arguments`` (validation), ``ratio`` (Δ, r, PPO clip),
``covariance`` (kl_cov / clip_cov token selection), ``reduction`` (IS weights,
aggregation, metrics).
"""

from algorithms.losses.cispo import cispo
from algorithms.losses.clip_cov import clip_cov
from algorithms.losses.geo_mean import geo_mean
from algorithms.losses.gpg import gpg
from algorithms.losses.gspo import gspo
from algorithms.losses.kl_cov import kl_cov
from algorithms.losses.sapo import sapo
from algorithms.losses.vanilla import vanilla

__all__ = ["cispo", "clip_cov", "geo_mean", "gpg", "gspo", "kl_cov", "sapo", "vanilla"]
