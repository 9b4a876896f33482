"""The trainable modules over a Hugging Face backbone and the forward passes they run.

* :mod:`rlkit.modeling.modules`: the actor (per-token log-probs and entropy), the critic
  (values) and the frozen reward model, each wrapping the backbone at ``.backbone``.
* :mod:`rlkit.modeling.prefix_sharing`: shared-prefix passes, each prompt computed once
  for all of its responses.
* :mod:`rlkit.modeling.ulysses`: Ulysses packing, a micro-batch's packed sequence split
  over a sequence-parallel group.
"""
