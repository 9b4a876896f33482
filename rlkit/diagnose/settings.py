"""The settings that explain a gap between engine and trainer, and the causes ranked.

:func:`run_settings` lists, for a run's configuration, what the engine and the trainer
use for each setting that can make their distributions differ, and what each difference
typically does. :func:`rank_causes` weighs those differences against what was measured
(the gap and its growth with position, the turn boundaries, the routing, the weights)
and orders the likely causes, strongest evidence first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def holds_own_weights(engine: str) -> bool:
    """Whether the engine computes on its own copy of the weights, with its own kernels
    (its registry entry says ``holds_own_weights``: SGLang, vLLM), rather than the
    trainer's module."""
    from rlkit.registry import ROLLOUT_ENGINES

    return bool(ROLLOUT_ENGINES.entry(engine).extra.get("holds_own_weights"))


#: Server flags that make the engine load another model configuration than the trainer's.
CONFIG_OVERRIDE_FLAGS = (
    "--hf-overrides",
    "--json-model-override-args",
    "--rope-scaling",
    "--rope-theta",
    "--max-model-len",
    "--context-length",
)


@dataclass
class Setting:
    """One setting as each side uses it.

    Attributes:
        name: what it is (``dtype``, ``attention``, ...).
        engine: the engine's value, as text.
        trainer: the trainer's value, as text.
        differs: whether the two sides differ in a way that changes the distribution.
        effect: what a difference typically does to the gap.
    """

    name: str
    engine: str
    trainer: str
    differs: bool
    effect: str


@dataclass
class Cause:
    """A likely cause of the measured gap: the setting or fault, and the evidence."""

    name: str
    evidence: str
    weight: float


def _checkpoint_dtype(model_path: str) -> str:
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return "float32"
    data = json.loads(config.read_text())
    return str(data.get("dtype") or data.get("torch_dtype") or "float32")


def engine_dtype(cfg: Any) -> str:
    """The dtype the engine computes in: the trainer's module for the embedded engine; a
    server's ``dtype`` option, with ``auto`` resolved to the checkpoint's dtype."""
    if not holds_own_weights(cfg.rollout.engine):
        return trainer_dtype(cfg)
    value = str(cfg.rollout.engine_options.get("dtype", "auto"))
    return _checkpoint_dtype(cfg.model.path) if value == "auto" else value


def trainer_dtype(cfg: Any) -> str:
    """The dtype the trainer's forward computes in: its mixed precision, or the model's."""
    mixed = cfg.trainer.mixed_precision
    return {"bf16": "bfloat16", "fp16": "float16"}.get(str(mixed), cfg.model.dtype)


def config_overrides(cfg: Any) -> list[str]:
    """The engine's server flags that change the model configuration it loads."""
    args = [str(a) for a in cfg.rollout.engine_options.get("server_args", ()) or ()]
    found = []
    for i, arg in enumerate(args):
        flag = arg.split("=", 1)[0]
        if flag in CONFIG_OVERRIDE_FLAGS:
            value = (
                arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            )
            found.append(f"{flag} {value}".strip())
    return found


def run_settings(
    cfg: Any, template_source: str, own_template: str, kernels: dict[str, str] | None = None
) -> list[Setting]:
    """The settings of ``cfg``'s run that can separate engine and trainer.

    Args:
        cfg: the run's :class:`~rlkit.trainer.config.ExperimentConfig`.
        template_source: where the run's chat template comes from.
        own_template: where the model's own template comes from (the reference).
        kernels: the trainer's kernel per op, as chosen for this model and platform.
    """
    r, m = cfg.rollout, cfg.model
    server = holds_own_weights(r.engine)
    e_dtype, t_dtype = engine_dtype(cfg), trainer_dtype(cfg)
    chosen = kernels if kernels else m.kernel_overrides
    kernels_text = ", ".join(f"{k}={v}" for k, v in sorted(chosen.items())) or "defaults"
    filtered = r.top_p < 1 or r.top_k > 0
    overrides = config_overrides(cfg)
    return [
        Setting(
            "dtype",
            e_dtype,
            t_dtype,
            e_dtype != t_dtype,
            "every layer rounds to the lower precision: bfloat16 about 2^-8 relative, "
            "float16 2^-11; a per-token gap of 1e-2 (bfloat16) instead of float32's 1e-6",
        ),
        Setting(
            "model configuration",
            "; ".join(overrides) if overrides else "the checkpoint's config.json",
            "the checkpoint's config.json",
            bool(overrides),
            "the engine runs another model: a changed rope_theta or rope_scaling moves "
            "positional encodings, so the gap grows with the token's position",
        ),
        Setting(
            "attention and kernels",
            f"{r.engine} server kernels" if server else "the trainer's module",
            f"rlkit kernels ({kernels_text})",
            server,
            "float rounding only (1e-7 to 1e-5 per token in float32); a large gap is "
            "never this alone unless a kernel drops a feature (window, soft-cap)",
        ),
        Setting(
            "sampling",
            f"temperature {r.temperature}, top_p {r.top_p}, top_k {r.top_k}",
            f"temperature {r.temperature}, unfiltered",
            filtered,
            "the engine's log-probs are of the top-k/top-p filtered distribution, the "
            "trainer's of the whole one: the sampled-token gap is the log of the kept "
            "mass by design; the KL over the engine's top-k (renormalised) still applies",
        ),
        Setting(
            "chat template",
            template_source,
            own_template,
            template_source != own_template,
            "multi-turn contexts differ from what the model's own template renders at "
            "turn boundaries (a dropped or added newline per turn)",
        ),
        Setting(
            "shared prefix / remove padding",
            "shared prefill per prompt group" if not server else "the server's prefix cache",
            f"share_prompt_prefix={m.share_prompt_prefix}, "
            f"use_remove_padding={m.use_remove_padding}",
            False,
            "float rounding only; the trainer's training pass is compared with its plain "
            "forward to isolate it",
        ),
    ]


def rank_causes(settings: list[Setting], evidence: dict[str, Any]) -> list[Cause]:
    """The likely causes, strongest evidence first.

    ``evidence`` keys (all optional): ``weights`` (a weight-check failure message),
    ``turn_differences`` (count), ``gap_mean``, ``bound``, ``growth`` (last position
    bucket's gap over the first's), ``routing_agreement`` (lowest per layer),
    ``trainer_internal_gap`` (training pass vs plain forward), ``kl_mean``,
    ``kl_bound``.
    """
    by_name = {s.name: s for s in settings}
    gap, bound = evidence.get("gap_mean", 0.0), evidence.get("bound", float("inf"))
    kl, kl_bound = evidence.get("kl_mean", 0.0), evidence.get("kl_bound", float("inf"))
    growth = evidence.get("growth", float("nan"))
    off = gap > bound or kl > kl_bound
    causes: list[Cause] = []
    if evidence.get("weights"):
        causes.append(Cause("weights", str(evidence["weights"]), 100))
    if evidence.get("turn_differences"):
        t = by_name["chat template"]
        causes.append(
            Cause(
                "chat template",
                f"{evidence['turn_differences']} turn boundaries differ from the model's own "
                f"template (run's template: {t.engine}; reference: {t.trainer})",
                90,
            )
        )
    if by_name["model configuration"].differs:
        rising = growth == growth and growth > 2
        causes.append(
            Cause(
                "model configuration",
                f"the engine overrides the model's configuration ({by_name['model configuration'].engine})"
                + (
                    f"; the gap grows {growth:.1f}x from the first to the last positions"
                    if rising
                    else ""
                ),
                85 if rising else 75,
            )
        )
    if by_name["dtype"].differs and off:
        causes.append(
            Cause(
                "dtype",
                f"the engine computes in {by_name['dtype'].engine}, the trainer in "
                f"{by_name['dtype'].trainer}; mean gap {gap:.3g} against {bound:g}",
                80,
            )
        )
    agreement = evidence.get("routing_agreement")
    if agreement is not None and agreement < 1.0:
        causes.append(
            Cause(
                "MoE routing",
                f"as few as {agreement:.1%} of tokens go to the same experts in both passes",
                78,
            )
        )
    internal = evidence.get("trainer_internal_gap")
    if internal is not None and internal > bound:
        causes.append(
            Cause(
                "trainer's packing path",
                f"the training pass and a plain forward of the same model differ by "
                f"{internal:.3g} per token (shared prefix / remove padding / kernels)",
                60,
            )
        )
    if by_name["sampling"].differs and gap > bound and kl <= kl_bound:
        causes.append(Cause("sampling", by_name["sampling"].effect, 40))
    if off and growth == growth and growth > 2 and not by_name["model configuration"].differs:
        causes.append(
            Cause(
                "positions",
                f"the gap grows {growth:.1f}x from the first to the last positions: rope "
                f"scaling, a sliding window or a context limit differs between the sides",
                30,
            )
        )
    if off and by_name["attention and kernels"].differs and not causes:
        causes.append(Cause("attention and kernels", by_name["attention and kernels"].effect, 10))
    return sorted(causes, key=lambda c: -c.weight)
