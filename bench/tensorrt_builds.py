"""Build seconds and plan sizes per graph x precision with a real TensorRT builder (for docs/performance.md).

Usage: python bench/tensorrt_builds.py [--backend tensorrt-rtx] [--precisions fp32,fp16,int8]
       [--compute-capability 8.6,8.9,12.0] [--work /tmp/vvs-trt-builds]

Exports the shipped model at each precision and builds every graph through ``build_folder``, the path
``vvs-export --backend ...`` takes. TensorRT-RTX needs no GPU to build.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vvs.discrete.exporter import export_folder  # noqa: E402
from vvs.engines.tensorrt_build import build_folder, parse_compute_capabilities  # noqa: E402
from vvs.families.llamagen.bundle import load_bundle  # noqa: E402
from vvs.shipped import shipped_info  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="tensorrt-rtx")
    parser.add_argument("--precisions", default="fp32,fp16,int8")
    parser.add_argument("--compute-capability", default=None)
    parser.add_argument("--max-images", type=int, default=8)
    parser.add_argument("--work", default="/tmp/vvs-trt-builds")
    args = parser.parse_args()
    caps = parse_compute_capabilities(args.compute_capability)
    bundle = load_bundle()
    defaults = shipped_info()["decoding_defaults"]
    rows = []
    for precision in args.precisions.split(","):
        folder = Path(args.work) / precision
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        export_folder(bundle, folder, precision, decoding_defaults=defaults, progress=False)
        build_folder(folder, args.backend, args.max_images, caps,
                     progress=lambda name, s, size, p=precision: rows.append((p, name, s, size)))
    print(f"| precision | graph | build s | plan MB |  ({args.backend}, max images {args.max_images}, "
          f"compute capabilities {args.compute_capability or 'builder default'})")
    print("|---|---|---|---|")
    for precision, name, seconds, size in rows:
        print(f"| {precision} | {name} | {seconds:.1f} | {size / 1e6:.1f} |")


if __name__ == "__main__":
    main()
