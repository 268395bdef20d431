"""INT8 against fp32 on ONNX Runtime CPU: logit error and top-1 agreement of the verify graph on real decoding
inputs (for docs/performance.md; TPF and quality come from vvs-bench on both folders).

Usage: python bench/int8_report.py --fp32 engines --int8 engines-int8 [--images 8]

The inputs are the verify calls of an actual greedy SD run on the fp32 folder (trees over real prefixes), replayed
on both folders' verify graphs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402


class Recorder:
    def __init__(self, inner, keep: list):
        self.inner, self.spec, self.keep = inner, inner.spec, keep

    def run(self, **inputs):
        self.keep.append({k: v.clone() for k, v in inputs.items()})
        return self.inner.run(**inputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp32", default="engines")
    parser.add_argument("--int8", default="engines-int8")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    fp32 = load_engines(args.fp32, "onnxruntime", threads=args.threads)
    int8 = load_engines(args.int8, "onnxruntime", threads=args.threads)
    calls: list[dict] = []
    fp32.graphs["target_verify"] = Recorder(fp32.graphs["target_verify"], calls)
    labels = torch.arange(args.images) % fp32.target.num_classes
    Pipeline(fp32).generate(labels, mode="sd", temperature=0, seed=0, decode_images=False)
    errors, rel, agree = [], [], []
    for inputs in calls[:: max(1, len(calls) // 40)]:
        a = fp32.graphs["target_verify"].inner.run(**inputs)["logits"]
        b = int8.graphs["target_verify"].run(**inputs)["logits"]
        errors.append(float((a - b).abs().max()))
        rel.append(float((a - b).abs().max() / a.abs().max()))
        agree.append(float((a.argmax(-1) == b.argmax(-1)).float().mean()))
    print(f"verify calls compared: {len(errors)}")
    print(f"max |logit error|: median {statistics.median(errors):.3f}, worst {max(errors):.3f} "
          f"(relative to max |logit|: median {statistics.median(rel):.3%})")
    print(f"top-1 agreement with fp32: mean {statistics.fmean(agree):.3%}, worst call {min(agree):.3%}")


if __name__ == "__main__":
    main()
