"""Where the runtime's own time goes in a decoding cycle: torch's profiler over one ``vvs`` decode, with the
engine calls (drafter, verify) listed apart from the runtime's operators.

Usage: python bench/runtime_profile.py [--folder engines-random-GPT-B] [--tree 59x4x10] [--top-k 1000] [--rows 12]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.runtime.decode import Decoding  # noqa: E402
from vvs.runtime.loops import run, start  # noqa: E402
from vvs.runtime.options import DecodeOptions, TreeShape  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default="engines-random-GPT-B")
    parser.add_argument("--tree", default="59x4x10")
    parser.add_argument("--top-k", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tree = TreeShape(*(int(x) for x in args.tree.split("x")))
    engines = load_engines(Path(args.folder), "onnxruntime", threads=args.threads)
    for name in list(engines.graphs):  # each engine call shows as one labelled block
        engine = engines.graphs[name]
        engines.graphs[name] = _Labelled(engine, f"engine:{name}")
    engines.trees = {}
    loader = engines.tree_loader
    engines.tree_loader = lambda shape: _Labelled(loader(shape), "engine:draft_tree")
    opts = DecodeOptions.from_dict(engines.default_options).updated(
        mode="vvs", skip_policy="uniform", skip_interval=3, tree_size=tree.tree_size, depth=tree.depth,
        draft_top_k=tree.draft_top_k, top_k=args.top_k)
    run(start(Decoding(engines, torch.tensor([1]), opts, seeds=[1])))  # warm-up: buffers, tables, sessions
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # in this thread: the loop without the scheduler
        _, stats = run(start(Decoding(engines, torch.tensor([0]), opts, seeds=[0])))
    cycles = len(stats[0].trace)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e3
    engine = sum(e.cpu_time_total for e in events if e.key.startswith("engine:")) / 1e3
    print(f"{cycles} cycles; {total / cycles:.1f} ms of profiled CPU time per cycle, engines {engine / cycles:.1f} ms, "
          f"the runtime {(total - engine) / cycles:.1f} ms")
    rows = sorted((e for e in events if not e.key.startswith("engine:")), key=lambda e: -e.self_cpu_time_total)
    for e in rows[: args.rows]:
        print(f"  {e.key:40s} {e.self_cpu_time_total / 1e3 / cycles:6.2f} ms per cycle ({e.count // cycles} calls)")


class _Labelled:
    def __init__(self, inner, label):
        self.inner, self.label, self.spec = inner, label, inner.spec

    def run(self, **inputs):
        with record_function(self.label):
            return self.inner.run(**inputs)


if __name__ == "__main__":
    main()
