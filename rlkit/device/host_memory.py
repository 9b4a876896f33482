"""Resident memory of this process, without psutil."""

from __future__ import annotations

import os
import resource
import sys


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def process_rss_bytes() -> int:
    """Current resident set size of this process, in bytes.

    Read from ``/proc/self/statm`` where it exists (Linux); elsewhere the peak from
    :func:`peak_rss_bytes` is the best portable answer.
    """
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return peak_rss_bytes()
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
