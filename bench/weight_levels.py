"""Which ``MatMulNBits`` accuracy level (how activations are multiplied with int8 / int4 weights) is fastest on
this CPU for a target call: a random GPT-B ``target_verify`` graph (16,384 codes) exported once, quantised to int8
and int4, then timed at levels 0 (float32 activations, weights dequantised), 2 (float16 where the CPU has it) and 4
(int8 activations quantised per block on the fly) against the float32 graph; one image with guidance (2 rows),
8 new positions after a full cache, medians of ``--repeats`` calls.

Usage: python bench/weight_levels.py [--size GPT-B] [--threads 2] [--repeats 15] [--dir /tmp/weight-levels]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from vvs.discrete.drafter import DrafterConfig  # noqa: E402
from vvs.discrete.graphs import TargetVerify, graph_specs  # noqa: E402
from vvs.export.onnx_export import export_graph  # noqa: E402
from vvs.families.llamagen.gpt import GPT, gpt_config  # noqa: E402
from vvs.models.vq import vq_config  # noqa: E402
from vvs.runtime.options import TreeShape  # noqa: E402


def with_level(path: Path, level: int, out: Path) -> Path:
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend(kept)
            if level:
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
    onnx.save_model(model, out, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)
    return out


def time_call(path: Path, cfg, threads: int, repeats: int) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rows, new, past = 2, 8, cfg.max_positions
    feed = {"input_ids": np.zeros((rows, new), np.int64),
            "position_ids": np.full((rows, new), cfg.max_positions - 1, np.int64),
            "attn_mask": np.ones((rows, 1, new, past + new), bool),
            "past_kv": np.zeros((cfg.n_layer, 2, rows, cfg.n_head, past, cfg.head_dim), np.float32),
            "cfg_mix": np.array([[3.0, -2.0]], np.float32)}
    session.run(None, feed)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feed)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="GPT-B")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dir", default="/tmp/weight-levels")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    target = GPT(gpt_config(args.size, vocab_size=16384)).eval()
    cfg = target.config
    spec = graph_specs(cfg, DrafterConfig.for_target(cfg), vq_config("VQ-tiny", codebook_size=16384),
                       TreeShape(4, 2, 1))["target_verify"]
    fp32 = folder / "target_verify.onnx"
    if not fp32.is_file():
        export_graph(TargetVerify(target).eval(), spec, fp32, cfg.vocab_size, cfg.max_positions - 1)
    print(f"fp32: {time_call(fp32, cfg, args.threads, args.repeats) * 1e3:.1f} ms", flush=True)
    for weights in ("int8", "int4"):
        quantised = folder / f"target_verify-{weights}.onnx"
        if not quantised.is_file():
            export_graph(TargetVerify(target).eval(), spec, quantised, cfg.vocab_size, cfg.max_positions - 1,
                         weights=weights)
        for level in (0, 2, 4):
            path = with_level(quantised, level, folder / f"target_verify-{weights}-level{level}.onnx")
            try:
                ms = f"{time_call(path, cfg, args.threads, args.repeats) * 1e3:.1f} ms"
            except Exception as err:  # a level this build of ONNX Runtime does not take
                ms = f"refused ({str(err).splitlines()[0][:120]})"
            print(f"{weights} level {level}: {ms}", flush=True)


if __name__ == "__main__":
    main()
