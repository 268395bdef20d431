"""The shipped VQ decoder's corner artefact (for docs/performance.md).

Usage: python bench/vq_corners.py

Decodes 16 grids of one repeated code each, with the shipped decoder and with a randomly initialised decoder of the
same architecture, and prints how much more each 24 px corner patch deviates from the image's median colour than
the centre does (1.0 = no artefact).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.models.bundle import load_bundle  # noqa: E402
from vvs.models.vq import VQModel  # noqa: E402

CORNERS = {"top-left": (4, 4), "top-right": (4, -28), "bottom-left": (-28, 4), "bottom-right": (-28, -28)}


@torch.no_grad()
def corner_ratios(vq: VQModel, grid: int) -> dict[str, float]:
    codes = torch.randint(0, vq.config.codebook_size, (16, 1), generator=torch.Generator().manual_seed(5))
    img = vq.eval().decode_codes(codes.expand(-1, grid * grid), grid)
    median = img.flatten(2).median(-1).values[..., None, None]
    dev = (img - median).abs().mean(1)  # [16, H, W]
    size = dev.shape[-1]
    centre = dev[:, size // 2 - 24 : size // 2 + 24, size // 2 - 24 : size // 2 + 24].mean()
    out = {}
    for name, (r, c) in CORNERS.items():
        r, c = r % size, c % size
        out[name] = float(dev[:, r : r + 24, c : c + 24].mean() / centre)
    return out


def main():
    bundle = load_bundle()
    grid = bundle.target.config.grid_size
    torch.manual_seed(0)
    rows = {"shipped decoder": corner_ratios(bundle.vq.float(), grid),
            "random-init decoder": corner_ratios(VQModel(bundle.vq.config), grid)}
    print("| decoder | " + " | ".join(CORNERS) + " |")
    print("|---|" + "---|" * len(CORNERS))
    for name, ratios in rows.items():
        print(f"| {name} | " + " | ".join(f"{ratios[k]:.1f}x" for k in CORNERS) + " |")


if __name__ == "__main__":
    main()
