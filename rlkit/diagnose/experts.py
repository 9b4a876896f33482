"""Mixture-of-experts routing in the engine's pass against the trainer's.

The same token can be routed to other experts by the engine than by training: another
kernel rounds a router logit differently and a near-tie flips, or one path adds noise
(jitter) the other does not. The log-prob gap then grows with no dtype or weight cause.
:class:`RoutingRecorder` hooks every router module of a model and records, per forward
call, the experts chosen for each token; :func:`agreement` compares the engine's choices
with the trainer's, layer by layer.

A router is a module whose class name ends in ``Router`` and whose output is a tuple
ending in an integer tensor of shape ``(tokens, top_k)`` (transformers' Qwen3-MoE,
Qwen2-MoE, OLMoE ...). Models whose routers do not look like that are reported as not
inspectable, never guessed at.
"""

from __future__ import annotations

from typing import Any

import torch


def router_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of the routers of ``model``, in layer order."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("Router")]


class RoutingRecorder:
    """Records the experts each router chose, per forward call, while entered.

    ``calls[layer]`` is a list of ``(tokens, top_k)`` tensors, one per forward call (a
    prefill, then one per decode step), with the experts of each token sorted.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = router_modules(model)
        self.calls: dict[str, list[torch.Tensor]] = {name: [] for name, _ in self.routers}
        self._handles: list[Any] = []

    def __enter__(self) -> RoutingRecorder:
        for name, module in self.routers:
            self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, name: str) -> Any:
        def record(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            chosen = output[-1] if isinstance(output, tuple) else None
            if isinstance(chosen, torch.Tensor) and not chosen.is_floating_point():
                self.calls[name].append(
                    chosen.detach().reshape(-1, chosen.shape[-1]).sort(-1)[0].cpu()
                )

        return record

    def per_token(self, name: str) -> torch.Tensor | None:
        """The layer's choices of every recorded token in call order, ``(tokens, top_k)``."""
        calls = self.calls[name]
        return torch.cat(calls) if calls else None


def agreement(
    engine: RoutingRecorder, trainer: RoutingRecorder, start: int = 0
) -> dict[str, float]:
    """Per layer, the fraction of tokens from position ``start`` on routed to the same set
    of experts by both passes, over the tokens both passes saw: the engine feeds the
    prompt, then each sampled token but the last; the trainer the whole sequence."""
    out = {}
    for name, _ in engine.routers:
        a, b = engine.per_token(name), trainer.per_token(name)
        if a is None or b is None:
            continue
        n = min(a.shape[0], b.shape[0])
        if n <= start:
            continue
        out[name] = float((a[start:n] == b[start:n]).all(-1).double().mean())
    return out
