"""The process's peak resident memory, which ``vvs-run`` and ``vvs-bench`` report: what a machine needs to hold a
folder's sessions and a decode (the weights as each backend keeps them, caches, buffers) at once."""
from __future__ import annotations

import resource
import sys
from pathlib import Path


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


def folder_weight_bytes(folder: Path) -> int:
    """The bytes of the weights an engine folder's graphs multiply by, each stored copy counted
    (:func:`vvs.export.shared_weights.weight_bytes`): what its sessions' memory is measured against."""
    from vvs.engines.manifest import read_manifest
    from vvs.export.shared_weights import weight_bytes

    manifest = read_manifest(Path(folder))
    return weight_bytes(Path(folder), [graph["file"] for graph in manifest["graphs"].values()])


def describe_peak(weights: int | None = None) -> str:
    """The peak, and with the folder's ``weights`` (bytes) how many times them the process held at most."""
    peak = peak_resident_bytes()
    text = f"peak resident memory {peak / 2**30:.2f} GiB"
    return text if not weights else text + f" ({peak / weights:.2f}x the folder's {weights / 2**30:.3f} GiB of weights)"
