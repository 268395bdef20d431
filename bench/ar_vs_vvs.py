"""The README's side-by-side figure: the same classes and seeds decoded with AR and with VVS.

    .venv/bin/python bench/ar_vs_vvs.py --engine engines --skip-policy uniform --out docs/img/ar_vs_vvs.png

One image per class (seed 0 + class id), AR in the upper row of each pair of rows and VVS below it, and for each
VVS image the share of its tokens equal to AR's at the same position. VVS changes the output distribution by
design, so the two rows differ; the figure shows how.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.output import grid_image  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402

COLUMNS = 8
LABEL_W = 44


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="engines")
    ap.add_argument("--backend", default="onnxruntime")
    ap.add_argument("--skip-policy", default="uniform", choices=["uniform", "dynamic"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/img/ar_vs_vvs.png")
    args = ap.parse_args()
    torch.set_num_threads(2)
    engines = load_engines(args.engine, backend=args.backend)
    pipe = Pipeline(engines)
    classes = list(range(engines.target.num_classes))
    runs = {"ar": pipe.generate(classes, mode="ar", seed=args.seed),
            "vvs": pipe.generate(classes, mode="vvs", seed=args.seed, skip_policy=args.skip_policy)}
    same = (runs["ar"].tokens == runs["vvs"].tokens).float().mean(1)
    rows = []
    for start in range(0, len(classes), COLUMNS):
        for mode in runs:
            rows.append((mode, grid_image(runs[mode].images[start : start + COLUMNS], columns=COLUMNS)))
    width, height = rows[0][1].width, rows[0][1].height
    figure = Image.new("RGB", (LABEL_W + width, height * len(rows)), "white")
    draw = ImageDraw.Draw(figure)
    for i, (mode, row) in enumerate(rows):
        figure.paste(row, (LABEL_W, i * height))
        draw.text((4, i * height + height // 2 - 6), "AR" if mode == "ar" else "VVS", fill="black")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.save(args.out)
    tpf = runs["vvs"].aggregate()["tokens_per_target_forward"]
    print(f"wrote {args.out}: classes {classes[0]}-{classes[-1]}, seed {args.seed} + class; vvs ({args.skip_policy} "
          f"skips) TPF {tpf:.2f}; "
          f"tokens equal to AR's at the same position: median {same.median():.1%} "
          f"[{same.min():.1%}-{same.max():.1%}]")


if __name__ == "__main__":
    main()
