"""Where an AR step's time goes: ONNX Runtime's per-operator profile of one ``target_verify`` call at Janus-Pro-1B's
width (for docs/performance.md, "Beside transformers' own Janus-Pro generation").

    .venv/bin/python bench/step_ops.py [--layers 4] [--weights fp32|int8|int4|int4-head8] [--work runs/step-ops]

A random Janus target of Janus-Pro-1B's width (2,048, 16 heads of 128, feed-forward 5,632, 16,384 codes) with
``--layers`` of its 24 layers, 64 prompt slots and 24 x 24 codes, exported as vvs exports a folder's
``target_verify``; one new position with guidance (2 batch rows) against the whole static cache (the runtime passes
the full buffer, 657 slots), 2 threads. Prints the median of 10 calls, then each operator type's share of 8
profiled calls (profiling adds its own time, so the shares are read, not the sum).
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from vvs.discrete.graphs import TargetVerify, graph_specs  # noqa: E402
from vvs.export.onnx_export import export_graph  # noqa: E402
from vvs.engines.buckets import PAST_SLACK  # noqa: E402
from vvs.families.janus_pro.model import JanusGen, janus_config  # noqa: E402

PROMPT_SLOTS, GRID, ROWS, THREADS = 64, 24, 2, 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--weights", default="int4", choices=("fp32", "int8", "int4", "int4-head8"))
    parser.add_argument("--work", type=Path, default=Path("runs/step-ops"))
    args = parser.parse_args()
    config = janus_config("Janus-Pro-1B", n_layer=args.layers, cls_token_num=PROMPT_SLOTS, grid_size=GRID)
    torch.manual_seed(0)
    target = JanusGen(config).eval()
    vq = type("VQ", (), {"downsample": 16})()  # only the image size of vq_decode's spec reads it
    spec = graph_specs(config, None, vq, None)["target_verify"]
    path = args.work / f"target_verify-{args.weights}-{args.layers}.onnx"
    export_graph(TargetVerify(target), spec, path, config.vocab_size, config.max_positions - 1,
                 weights=None if args.weights == "fp32" else args.weights)
    slots = PROMPT_SLOTS + GRID * GRID + PAST_SLACK + 1
    inputs = {"input_ids": torch.zeros(ROWS, 1, dtype=torch.long), "position_ids": torch.full((ROWS, 1), 300),
              "attn_mask": torch.ones(ROWS, 1, 1, slots + 1, dtype=torch.bool),
              "past_kv": torch.randn(args.layers, 2, ROWS, config.n_head, slots, config.head_dim) * 0.1,
              "cfg_mix": torch.tensor([[5.0, -4.0]])}
    feeds = {name: value.numpy() for name, value in spec.graph_feeds(inputs).items()}  # the graph's own inputs
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    print(f"{args.weights}, {args.layers} layers: {statistics.median(times) * 1e3:.1f} ms per AR step (median of 10)")
    options.enable_profiling, options.profile_file_prefix = True, str(args.work / "profile")
    profiled = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(8):
        profiled.run(None, feeds)
    events = json.loads(Path(profiled.end_profiling()).read_text())
    spent, nodes = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            spent[event["args"]["op_name"]] += event["dur"]
            nodes[event["args"]["op_name"]] += 1
    total = sum(spent.values())
    for op, microseconds in spent.most_common(8):
        print(f"  {op:14s} {microseconds / total:6.1%}  ({nodes[op] // 8} nodes)")


if __name__ == "__main__":
    main()
