"""A :class:`~rlkit.diagnose.run.Diagnosis` as a Markdown report, JSON and a figure."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlkit.diagnose.run import Diagnosis


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}"
    return str(value)


def verdict(d: Diagnosis) -> str:
    """One line: healthy, or the most likely cause first."""
    if d.passed:
        return (
            f"healthy: the engine and the trainer agree within the {d.precision} bound "
            f"(mean sampled-token gap {_num(d.tokens.get('overall', {}).get('gap_mean'))} "
            f"<= {d.bound:g})"
        )
    first = d.causes[0]
    return f"MISMATCH, most likely cause: {first['name']}: {first['evidence']}"


def markdown(d: Diagnosis) -> str:
    """The report as Markdown: verdict, token table, positions, turns, experts, weights,
    settings, causes."""
    overall = d.tokens.get("overall", {})
    lines = [
        "# rlkit diagnose",
        "",
        f"**{verdict(d)}**",
        "",
        f"Engine `{d.engine}`, trainer precision {d.precision} (bound on the mean "
        f"sampled-token gap {d.bound:g}, on the mean top-k KL {d.kl_bound:g}), "
        f"{d.prompts} prompts, top-k {d.top_k}.",
        "",
        "## Per token",
        "",
        "| tokens | gap mean | gap p50 | gap p90 | gap p99 | gap max | KL mean | KL max | top-1 agree | trainer mass on top-k |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        _token_row(overall),
        "",
        "## By position in the response",
        "",
        "| positions | tokens | gap mean | gap max | KL mean | top-1 agree |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, b in d.tokens.get("by_position", {}).items():
        lines.append(
            f"| {name} | {_num(b.get('tokens'))} | {_num(b.get('gap_mean'))} | "
            f"{_num(b.get('gap_max'))} | {_num(b.get('kl_mean'))} | {_num(b.get('top1_agree_mean'))} |"
        )
    lines += [
        "",
        f"Trainer's training pass against its plain forward (packing, shared prefix, "
        f"kernels): mean gap {_num(d.trainer_internal_gap)}.",
    ]
    if d.turns:
        lines += [
            "",
            "## Per turn",
            "",
            "| turn | tokens | gap mean | gap max |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {t['turn']} | {t['tokens']} | {_num(t['gap_mean'])} | {_num(t['gap_max'])} |"
            for t in d.turns
        ]
        lines += ["", f"Chat template reference: {d.template_reference}."]
        if d.template_differences:
            lines += [
                "",
                "| row | boundary | position | kind | trained tokens | template renders |",
                "|---:|---:|---:|---|---|---|",
            ]
            lines += [
                f"| {x['row']} | {x['turn']} | {x['position']} | {x['kind']} | "
                f"`{_escape(x['trained'])}` | `{_escape(x['rendered'])}` |"
                for x in d.template_differences[:20]
            ]
        if not any(x["kind"] == "template" for x in d.template_differences):
            lines += ["", "Every turn boundary renders as the model's own template does."]
    lines += ["", "## Mixture-of-experts routing", "", d.routing_note or "-"]
    if d.routing:
        lines += ["", "| router | same experts |", "|---|---:|"]
        lines += [f"| {name} | {value:.1%} |" for name, value in d.routing.items()]
    lines += ["", "## Weights", ""]
    lines += [f"- {k}: {_num(v)}" for k, v in d.weights.items()]
    lines += [
        "",
        "## Settings",
        "",
        "| setting | engine | trainer | differs | likely effect |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['name']} | {_escape(s['engine'])} | {_escape(s['trainer'])} | "
        f"{'yes' if s['differs'] else 'no'} | {s['effect']} |"
        for s in d.settings
    ]
    lines += ["", "## Likely causes, most likely first", ""]
    lines += [f"{i}. **{c['name']}**: {c['evidence']}" for i, c in enumerate(d.causes, 1)] or [
        "None: every measure is within its bound."
    ]
    if d.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d.notes]
    return "\n".join(lines) + "\n"


def _token_row(o: dict[str, Any]) -> str:
    keys = ("tokens", "gap_mean", "gap_p50", "gap_p90", "gap_p99", "gap_max", "kl_mean", "kl_max")
    cells = [_num(o.get(k)) for k in keys]
    cells += [_num(o.get("top1_agree_mean")), _num(o.get("mass_mean"))]
    return "| " + " | ".join(cells) + " |"


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "\\n")


def write(d: Diagnosis, out_dir: Path) -> list[Path]:
    """``report.md``, ``report.json`` and ``gap_by_position.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "report.md", out_dir / "report.json"]
    written[0].write_text(markdown(d))
    data = asdict(d) | {"passed": d.passed, "verdict": verdict(d)}
    written[1].write_text(json.dumps(data, indent=2, default=str, allow_nan=True) + "\n")
    if d.gap_by_position:
        from rlkit.logging.figures import use_headless_backend

        use_headless_backend()
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot(range(len(d.gap_by_position)), d.gap_by_position, marker=".")
        ax.axhline(d.bound, color="red", linestyle="--", label=f"{d.precision} bound")
        ax.set_yscale("log")
        ax.set_xlabel("position in the response")
        ax.set_ylabel("mean |log p_train - log p_engine|")
        ax.set_title(f"engine {d.engine} vs trainer")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "gap_by_position.png", dpi=100)
        plt.close(fig)
        written.append(out_dir / "gap_by_position.png")
    return written
