"""Is any corner of the decoded image special? (for docs/performance.md)

Usage: python bench/vq_corners.py [--vq OTHER.safetensors ...] [--crops 256] [--figure PATH]

For the shipped VQ tokenizer, any other tokenizer files given, and randomly initialised decoders of the shipped
architecture with zero and with reflection padding, prints per 24 px region (four corners, centre):
- how far grids of one repeated code decode from a flat colour (mean |pixel - median|, x 100);
- the mean absolute reconstruction error of held-out crops through their interior codes (x 100), the top-left's excess
  over the other corners' mean, and PSNR through the codes and through the continuous latents;
- the speck ratio (``top_left_speck_ratio``) of those reconstructions, each crop in one of its four mirror images so
  that the same content visits every corner.
With ``--figure``, also the same AR tokens of the shipped target (one image for every other class, seed 0 + i)
through each tokenizer file, one row per file, upscaled 2x.
The decoder from before the fix: ``git show 55a9ab5:vvs/weights/vq.safetensors > /tmp/vq-zeros.safetensors``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.discrete.engines import torch_engines  # noqa: E402
from vvs.families.llamagen.bundle import load_bundle  # noqa: E402
from vvs.families.mar.train import tokenizer_metrics  # noqa: E402
from vvs.models.loading import load_vq  # noqa: E402
from vvs.models.vq import VQModel, vq_config  # noqa: E402
from vvs.output import grid_image  # noqa: E402
from vvs.quality import top_left_speck_ratio  # noqa: E402
from vvs.runtime.options import DecodeOptions  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402
from vvs.shipped import shipped_info, shipped_path  # noqa: E402
from vvs.train.classifier import real_crops  # noqa: E402
from vvs.train.shipped import HELDOUT_SEED  # noqa: E402
from vvs.train.tokenizer import (REGIONS, flat_grid_deviation, interior_codes, region_errors,  # noqa: E402
                                 top_left_excess)

GRID = 16


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vq", action="append", default=[], help="another tokenizer file to measure")
    parser.add_argument("--crops", type=int, default=256, help="held-out crops (default 256)")
    parser.add_argument("--figure", help="write the same generated tokens through each tokenizer file here (PNG)")
    args = parser.parse_args()
    torch.manual_seed(0)
    decoders = {"shipped": load_vq(shipped_path("vq")).float()}
    decoders.update({Path(p).name: load_vq(p).float() for p in args.vq})
    for padding in ("zeros", "reflect"):
        decoders[f"random-init, {padding} padding"] = VQModel(vq_config("VQ-vvs-S", decoder_padding=padding)).eval()
    crops = real_crops(args.crops, HELDOUT_SEED)[0] * 2 - 1

    print("Grids of one repeated code: mean |pixel - median colour| x 100\n")
    print("| decoder | " + " | ".join(REGIONS) + " |\n|---|" + "---|" * len(REGIONS))
    for name, vq in decoders.items():
        dev = flat_grid_deviation(vq, GRID)
        print(f"| {name} | " + " | ".join(f"{100 * dev[k]:.2f}" for k in REGIONS) + " |")

    print(f"\n{args.crops} held-out crops: mean |reconstruction error| x 100 through the interior codes\n")
    print("| decoder | " + " | ".join(REGIONS) + " | top-left / other corners | PSNR codes | PSNR latents | specks |")
    print("|---|" + "---|" * (len(REGIONS) + 4))
    for name, vq in decoders.items():
        if name.startswith("random-init"):
            continue
        err, quality = region_errors(vq, crops), tokenizer_metrics(vq, crops)
        print(f"| {name} | " + " | ".join(f"{100 * err[k]:.2f}" for k in REGIONS)
              + f" | {top_left_excess(err):.3f} | {quality['heldout_psnr_db_codes']:.2f} dB"
              + f" | {quality['heldout_psnr_db_continuous']:.2f} dB | {reconstruction_specks(vq, crops):.2f} |")
    if args.figure:
        files = [name for name in decoders if not name.startswith("random-init")]
        write_figure([decoders[name] for name in files], args.figure)
        print(f"\nwrote {args.figure}: rows " + ", ".join(files))


@torch.no_grad()
def reconstruction_specks(vq: VQModel, crops: torch.Tensor, batch: int = 32) -> float:
    """Top-left speck ratio of reconstructions through the interior codes, crop i mirrored the (i mod 4)-th way."""
    flips = [[], [-1], [-2], [-2, -1]]
    mirrored = torch.stack([c.flip(flips[i % 4]) for i, c in enumerate(crops)])
    recon = [vq.decode_codes(interior_codes(vq, mirrored[i : i + batch]), GRID) for i in range(0, len(crops), batch)]
    return top_left_speck_ratio(torch.cat(recon))


def write_figure(tokenizers: list[VQModel], path: str) -> None:
    bundle = load_bundle()
    opts = DecodeOptions.from_dict(shipped_info()["decoding_defaults"]).updated(mode="ar")
    classes = list(range(0, bundle.target.config.num_classes, 2))
    tokens = Pipeline(torch_engines(bundle), opts).generate(classes, seed=0, decode_images=False).tokens
    with torch.no_grad():
        images = torch.cat([vq.decode_codes(tokens, GRID) for vq in tokenizers])
    grid = grid_image(images, columns=len(classes))
    grid.resize((grid.width * 2, grid.height * 2), 0).save(path)  # 0: nearest neighbour, pixels stay visible


if __name__ == "__main__":
    main()
