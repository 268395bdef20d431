"""The process's peak resident memory, which ``vvs-run`` and ``vvs-bench`` report: what a machine needs to hold a
folder's sessions and a decode (the weights as each backend keeps them, caches, buffers) at once."""
from __future__ import annotations

import resource
import sys


def peak_resident_bytes() -> int:
    """The most physical memory this process has held so far. On Linux that is the address space's high-water mark
    (``VmHWM``): ``ru_maxrss`` survives ``exec``, so a process started by a larger one (a benchmark's parent, a test
    worker) would report its parent's peak as its own. Elsewhere ``ru_maxrss`` (bytes on macOS)."""
    if sys.platform.startswith("linux"):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def describe_peak() -> str:
    return f"peak resident memory {peak_resident_bytes() / 2**30:.2f} GiB"
