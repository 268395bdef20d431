"""How often a shipped text-to-image pair paints what its prompt describes (for docs/shipped_model.md): the LlamaGen
t2i pair's folder, the Janus-Pro pair's or the Lumina-mGPT pair's (all learnt the same captions).

    .venv/bin/python bench/t2i_quality.py --engine engines-t2i
    .venv/bin/python bench/t2i_quality.py --engine engines-janus
    .venv/bin/python bench/t2i_quality.py --engine engines-lumina

AR, the shipped decoding defaults, two images (seeds 0 and 16) per photograph and caption: for each of the four
captions of every photograph, the share of images the photo classifier of the quality instruments assigns to that
photograph (chance 1/16), and the top-left speck ratio of those 32 images (``vvs.quality.top_left_speck_ratio``);
then prompts that are not among the captions. The same rate per seed set and weight precision, against fp32's seed
spread: bench/weight_quality.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.quality import Instruments, photo_captions, top_left_speck_ratio  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402
from vvs.shipped import SHIPPED_DIR  # noqa: E402
from vvs.train.data import CLASS_NAMES  # noqa: E402
from vvs.train.shipped import load_classifier  # noqa: E402

UNSEEN = {"a cat": "chelsea", "a brick wall photo": "brick", "a cup of coffee": "coffee", "grass": "grass"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="engines-t2i")
    ap.add_argument("--backend", default="onnxruntime")
    args = ap.parse_args()
    torch.set_num_threads(2)
    pipe = Pipeline(load_engines(args.engine, backend=args.backend))
    instruments = Instruments(load_classifier(SHIPPED_DIR / "classifier.safetensors"))

    def hits(prompts: list[str], photos: torch.Tensor) -> tuple[float, float]:
        images = torch.cat([pipe.generate(prompts, mode="ar", seed=seed).images for seed in (0, 16)])
        share = instruments.evaluate(images, None, photos.repeat(2))["class_accuracy"]
        return share, top_left_speck_ratio(images)

    for k in range(4):
        share, specks = hits(*photo_captions(k))
        print(f"caption {k + 1} of each photograph: {share:.1%} of 32 images; top-left specks {specks:.2f}")
    unseen, _ = hits(list(UNSEEN), torch.tensor([CLASS_NAMES.index(n) for n in UNSEEN.values()]))
    print(f"prompts not among the captions ({', '.join(UNSEEN)}): {unseen:.1%} of 8 images")


if __name__ == "__main__":
    main()
