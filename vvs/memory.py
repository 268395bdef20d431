"""The process's peak resident memory, which ``vvs-run`` and ``vvs-bench`` report: what a machine needs to hold a
folder's sessions and a decode (the weights as each backend keeps them, caches, buffers) at once."""
from __future__ import annotations

import resource
import sys


def peak_resident_bytes() -> int:
    """The most physical memory this process has held so far (``ru_maxrss``: kibibytes on Linux, bytes on
    macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def describe_peak() -> str:
    return f"peak resident memory {peak_resident_bytes() / 2**30:.2f} GiB"
