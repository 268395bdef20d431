"""Quality of AR images from a class-conditional target and tokenizer: top-left specks, class accuracy, domain FID
and NLL, per seed set (for docs/performance.md, "Specks in generated images").

    .venv/bin/python bench/generated_quality.py [--target FILE] [--vq FILE] [--seed-sets 3]

Torch backend, the shipped decoding defaults, AR; seed set k is images k*32 .. k*32+31 (image i gets seed i),
classes 0-15 twice (``vvs.quality.class_sets``). Without arguments: the shipped target and tokenizer. The shipped
model's exported folders per weight precision, on ONNX Runtime: bench/weight_quality.py.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.discrete.engines import torch_engines  # noqa: E402
from vvs.families.llamagen.bundle import load_bundle  # noqa: E402
from vvs.quality import Instruments, class_sets, top_left_speck_ratio  # noqa: E402
from vvs.runtime.options import DecodeOptions  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402
from vvs.shipped import SHIPPED_DIR, shipped_info  # noqa: E402
from vvs.train.shipped import load_classifier  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="class-conditional target (default: the shipped one)")
    ap.add_argument("--vq", help="tokenizer (default: the shipped one)")
    ap.add_argument("--seed-sets", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    bundle = load_bundle(checkpoint=args.target, vq=args.vq, no_drafter=True)
    opts = DecodeOptions.from_dict(shipped_info()["decoding_defaults"]).updated(mode="ar")
    pipe = Pipeline(torch_engines(bundle), opts)
    instruments = Instruments(load_classifier(SHIPPED_DIR / "classifier.safetensors"), bundle.target)
    sets = class_sets(bundle.target.config.num_classes)
    labels = sets.conditions
    rows, images = [], []
    for k in range(args.seed_sets):
        gen = pipe.generate(labels, seed=sets.seed(k))
        images.append(gen.images)
        rows.append({"specks": top_left_speck_ratio(gen.images), **instruments.evaluate(gen.images, gen.tokens, labels)})
        r = rows[-1]
        print(f"seeds {sets.seed(k)}-{sets.seed(k) + len(sets) - 1}: specks {r['specks']:.2f}  "
              f"class accuracy {r['class_accuracy']:.3f}  domain FID {r['domain_fid']:.1f}  NLL {r['nll']:.2f}",
              flush=True)
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    print(f"median: specks {med['specks']:.2f}  class accuracy {med['class_accuracy']:.3f}  "
          f"domain FID {med['domain_fid']:.1f}  NLL {med['nll']:.2f};  specks over all "
          f"{len(rows) * len(sets)} images {top_left_speck_ratio(torch.cat(images)):.2f}")


if __name__ == "__main__":
    main()
