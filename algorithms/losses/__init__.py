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
  (the trainer passes them to every micro-batch; ``algorithms.global_normalizers``
  computes them from masks), so micro-batch losses sum to the batch loss;
* ``rollout_is_weights`` (B, T), detached, multiplies the per-token loss;
* loss-specific knobs are keyword options with documented defaults; an unknown
  option raises TypeError naming it;
* ``metrics`` holds detached 0-dim tensors ``pg_clipfrac``, ``ppo_kl``,
  ``pg_clipfrac_lower`` (token means over the micro-batch's valid tokens; 0
  where meaningless) plus loss-specific extras.

To add a loss, write a function with this signature in your own file and
decorate it with ``@POLICY_LOSSES.register("name")`` (or pass
``"package.module:function"`` wherever a loss name is expected).

Plain and fused math. Each loss's math is plain torch in its own module, with the
gradient left to autograd, so it reads like the paper and a debugger steps through
it: PPO's clip is ``vanilla.vanilla_terms``, GSPO's ``gspo.gspo_terms``, GMPO's
clip ``geo_mean.sign_aware_clip``. For those three (``clip_cov`` reuses vanilla's)
a fused twin with the same signature, a custom ``torch.autograd.Function`` whose
backward is one product, sits in ``fused`` and runs by default, because
``benchmarks/losses.py`` measured it at least 1.2x faster. ``algorithms.set_math
("plain")`` selects the plain math for the rest of the process, ``with
algorithms.plain_math():`` for a block (``algorithms.math_mode``; it is read on
every call, so it also reaches the trainer). The other losses have plain math only.

Shared pieces: ``arguments`` (validation), ``ratio`` (Δ with padding zeroed),
``covariance`` (kl_cov / clip_cov token selection), ``reduction`` (IS weights,
aggregation, metrics), ``fused`` (the fused twins).
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
