"""File modes: what vvs writes follows the umask, as files other tools write do.

Some writers create private files (safetensors writes 0600, ``tempfile.mkdtemp`` makes 0700 folders), which would
keep an engine folder exported by one account from being served by another — the usual deployment.
"""
from __future__ import annotations

import os
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it where Linux allows (``os.umask`` sets it process-wide)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give ``path`` (and, for a folder, everything in it) the mode a plain ``open``/``mkdir`` would have given."""
    mask = umask()
    path = Path(path)
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in items:
        if not item.is_symlink():
            os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)
