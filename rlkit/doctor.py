"""``rlkit doctor``: the platform, the software versions, and the kernel chosen per op.

Usage: ``rlkit doctor`` (this machine), ``rlkit doctor --all`` (also every
candidate kernel and why it is or is not usable), ``rlkit doctor --platform npu``
(the choice on another platform).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform as python_platform

import torch

import rlkit.device
from rlkit.device.platform import Platform
from rlkit.kernels import KernelUnavailableError, choose, describe
from rlkit.tools.isolation import describe_isolation

#: Packages whose presence changes which kernels can run.
_PACKAGES = ("torch", "transformers", "torch_npu", "flash_attn", "liger_kernel", "gin-config")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _platform_section(platform: Platform, source: str) -> list[str]:
    lines = [f"platform        {platform.name} ({source})"]
    why = platform.unavailable_reason()
    if why is not None:
        return [*lines, f"                not available here: {why}"]
    bf16 = platform.peak_flops(torch.bfloat16)
    lines += [
        f"devices         {platform.device_count()} x {platform.device_name(0)}",
        f"torch.device    {platform.device()}",
        f"dist backend    {platform.dist_backend}",
        f"visible env     {platform.visible_devices_env or '(none)'}",
        f"peak bf16       {f'{bf16 / 1e12:.1f} TFLOP/s' if bf16 else 'unknown (no MFU)'}",
    ]
    stats = platform.memory_stats()
    lines.append("memory (GiB)    " + ", ".join(f"{k}={v:.2f}" for k, v in stats.items()))
    return lines


def _other_platforms(active: Platform) -> list[str]:
    lines = []
    for name in rlkit.device.platform_names():
        if name == active.name:
            continue
        why = rlkit.device.get_platform(name).unavailable_reason()
        lines.append(f"  {name:<6} {'available' if why is None else 'unavailable: ' + why}")
    return lines


def _kernel_section(platform: Platform, show_all: bool) -> list[str]:
    statuses = describe(platform)
    chosen_rows = [("op", "kernel", "why")]
    for op in dict.fromkeys(s.op for s in statuses):
        try:
            choice = choose(op, platform)
        except (KernelUnavailableError, LookupError) as exc:
            chosen_rows.append((op, "(none)", str(exc)))
            continue
        chosen_rows.append((op, choice.name, choice.reason))
    lines = [f"kernels on {platform.name}:", _table(chosen_rows)]
    if show_all:
        rows = [("op", "kernel", "prio", "platforms", "status / summary")]
        for s in statuses:
            status = "usable" if s.why_unavailable is None else s.why_unavailable
            mark = "*" if s.chosen else " "
            rows.append(
                (
                    s.op,
                    mark + s.name,
                    str(s.priority),
                    ",".join(s.platforms),
                    f"{status} - {s.summary}",
                )
            )
        lines += ["", "all candidates (* = chosen):", _table(rows)]
    return lines


def main(argv: list[str]) -> int:
    """Print the platform report; returns a process exit code (2 on a bad platform name)."""
    parser = argparse.ArgumentParser(prog="rlkit doctor", description=__doc__.split("\n")[0])
    parser.add_argument("--platform", help="report kernel choice for this platform name")
    parser.add_argument("--all", action="store_true", help="list every candidate kernel")
    args = parser.parse_args(argv)
    if args.platform is not None:
        try:
            platform = rlkit.device.get_platform(args.platform)
        except rlkit.device.PlatformError as exc:
            print(f"rlkit doctor: {exc}")
            return 2
        source = "asked for with --platform"
    else:
        platform, source = rlkit.device.current(), rlkit.device.platform_source()
    lines = _platform_section(platform, source)
    lines.append("other platforms:")
    lines += _other_platforms(platform)
    lines.append(
        "versions        "
        + f"python={python_platform.python_version()}, "
        + ", ".join(f"{p}={_version(p)}" for p in _PACKAGES)
    )
    lines.append("sandbox         " + describe_isolation())
    lines.append("")
    lines += _kernel_section(platform, args.all)
    print("\n".join(lines))
    return 0
