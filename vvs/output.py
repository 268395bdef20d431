"""Writing what ``vvs-run`` produces: PNGs, a grid per mode, statistics JSON, token ids, a summary table.

Every file is written under a temporary name and renamed, so an interrupted run leaves no half-written file.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vvs.errors import VVSError
from vvs.runtime.stats import aggregate


def atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_png(image: Image.Image, path: Path) -> None:
    atomic_write(path, lambda tmp: image.save(tmp, format="PNG"))


def grid_image(images: torch.Tensor, columns: int | None = None, pad: int = 2) -> Image.Image:
    """``images [n, 3, H, W]`` in [0, 1] -> one PIL image, row-major."""
    n, _, h, w = images.shape
    cols = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    canvas = torch.ones(3, rows * (h + pad) + pad, cols * (w + pad) + pad)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        canvas[:, pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = img
    arr = (canvas.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(arr))


def ensure_writable_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".vvs-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise VVSError(f"{path}: cannot write output there ({err.strerror or err}); choose another folder") from None


class RunWriter:
    def __init__(self, out: Path, stats_json: str | None, save_tokens: str | None):
        self.out = Path(out)
        ensure_writable_dir(self.out)
        self.stats_json = Path(stats_json) if stats_json else None
        self.save_tokens = Path(save_tokens) if save_tokens else None
        for extra in (self.stats_json, self.save_tokens):
            if extra is not None:
                ensure_writable_dir(extra.parent if str(extra.parent) else Path("."))
        self.images: list[dict] = []
        self.by_mode: dict[str, list] = {}
        self.tokens: list[torch.Tensor] = []

    def add(self, mode: str, labels: list[int], results: list, names: list[str] | None) -> None:
        images = torch.cat([r.images for r in results])
        tokens = torch.cat([r.tokens for r in results])
        stats = [s for r in results for s in r.stats]
        pictures = [p for r in results for p in r.pil_images()]
        for i, (img, label, s) in enumerate(zip(pictures, labels, stats)):
            name = names[label] if names else f"class{label}"
            save_png(img, self.out / f"{mode}_{i:03d}_{name}.png")
            self.images.append({"mode": mode, "index": i, "class": label, "class_name": name, **s.to_dict()})
        save_png(grid_image(images), self.out / f"{mode}_grid.png")
        self.by_mode[mode] = stats
        self.tokens.append(tokens)

    def finish(self, backend: str) -> None:
        rows = [f"{'mode':8} {'images':>6} {'TPF':>6} {'target fwd/img':>15} {'skipped/img':>12} "
                f"{'accept len':>10} {'s/img':>8}"]
        summary = {}
        for mode, stats in self.by_mode.items():
            agg = aggregate(stats)
            summary[mode] = agg
            n = agg["images"]
            rows.append(f"{mode:8} {n:6d} {agg['tokens_per_target_forward']:6.2f} {agg['target_forwards'] / n:15.1f} "
                        f"{agg['skipped_verifications'] / n:12.1f} {agg['mean_accept_length']:10.2f} "
                        f"{agg['seconds_per_image']:8.3f}")
        print("\n".join(rows))
        print(f"backend {backend}; images and grids in {self.out}/")
        if self.stats_json:
            payload = {"backend": backend, "images": self.images,
                       "aggregate": summary[next(iter(summary))] if len(summary) == 1 else summary}
            atomic_write(self.stats_json, lambda tmp: tmp.write_text(json.dumps(payload, indent=1) + "\n"))
        if self.save_tokens:
            arr = torch.cat(self.tokens).numpy()
            def write(tmp: Path) -> None:
                with open(tmp, "wb") as f:
                    np.save(f, arr)

            atomic_write(self.save_tokens, write)
