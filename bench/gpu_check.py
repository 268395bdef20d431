"""Every GPU check in one script: run it on a machine with a CUDA GPU and torch (nothing else needed beyond the
wheels named in docs/performance.md). Prints a short table and writes gpu_check.json (to $OUT when set).

1. the tests marked ``gpu`` (CUDA-graph replay == eager, per graph, per captured speculative cycle and for whole
   decodes; at most one synchronising call per cycle);
2. per-step latency, eager vs CUDA graphs: the draft_tree call and verify at every bucket, and the AR step;
3. end-to-end seconds per image for ar, sd, lantern, vvs and the drafter-free sjd, sjd-pac and gsd (their
   papers' windows: 16, 64, 16 tokens), eager vs graphs (speculative cycles captured whole, the window modes'
   verify forward replayed at its window bucket);
for the shipped model and for it inflated to GPT-B (fp32) and GPT-XL (fp16) size — the scale benchmark: official
per-call costs with the shipped pair's acceptance (:mod:`vvs.families.llamagen.inflate`; the vocabulary stays 1024 codes).

Usage: PYTHONPATH=. python3 bench/gpu_check.py [--images 2] [--skip-xl]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from vvs.discrete.bundle import ModelBundle  # noqa: E402
from vvs.discrete.engines import torch_engines  # noqa: E402
from vvs.engines.buckets import buckets  # noqa: E402
from vvs.engines.cuda_graphs import GraphedEngine, capture_graphs  # noqa: E402
from vvs.export.spec import sample_inputs  # noqa: E402
from vvs.families.llamagen.bundle import load_bundle  # noqa: E402
from vvs.families.llamagen.inflate import inflate_bundle  # noqa: E402
from vvs.runtime.cache import KVCache  # noqa: E402
from vvs.runtime.options import DecodeOptions  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402
from vvs.shipped import shipped_info  # noqa: E402

MODES = ("ar", "sd", "lantern", "vvs", "sjd", "sjd-pac", "gsd")


def median_ms(fn, repeats: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def step_latencies(engines, opts: DecodeOptions) -> list[dict]:
    cfg = engines.target
    past = KVCache.slots(cfg.max_positions + 2 * opts.max_path_tokens)
    rows = []
    for name in ("draft_tree", "target_verify"):
        eager = engines.draft_tree(opts.tree) if name == "draft_tree" else engines.graphs[name]
        graphed = GraphedEngine(eager)
        for new in buckets(name, cfg.cls_token_num, opts):
            inputs = sample_inputs(eager.spec, cfg.vocab_size, cfg.max_positions - 1,
                                   dict(batch=2, images=1, new=new, past=past))
            inputs = {k: v.cuda().to(engines.dtype) if v.is_floating_point() and k in ("features", "past_kv")
                      else v.cuda() for k, v in zip(eager.spec.input_names, inputs)}
            rows.append({"graph": name, "new": new, "eager_ms": median_ms(lambda: eager.run(**inputs)),
                         "graphs_ms": median_ms(lambda: graphed.run(**inputs))})
    return rows


def end_to_end(bundle: ModelBundle, dtype, opts: DecodeOptions, images: int) -> list[dict]:
    pipes = {"eager": Pipeline(torch_engines(copy.deepcopy(bundle), "cuda", dtype), opts),
             "graphs": Pipeline(capture_graphs(torch_engines(copy.deepcopy(bundle), "cuda", dtype), opts), opts)}
    rows = []
    n_classes = bundle.target.config.num_classes
    for mode in MODES:
        row = {"mode": mode}
        for kind, pipe in pipes.items():
            pipe.generate(torch.tensor([0]), mode=mode, seed=99, decode_images=False)  # warm-up (and capture)
            seconds, tpf = [], []
            for i in range(images):
                g = pipe.generate(torch.tensor([i % n_classes]), mode=mode, seed=i, decode_images=False)
                seconds.append(g.stats[0].seconds)
                tpf.append(g.stats[0].tokens_per_target_forward)
            row[f"{kind}_s_per_image"] = statistics.median(seconds)
            row["tpf"] = statistics.fmean(tpf)
        rows.append(row)
    return rows


def run_gpu_tests() -> dict:
    start = time.time()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py"], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    return {"returncode": proc.returncode, "summary": last, "seconds": round(time.time() - start, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--skip-xl", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device")
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    print(f"{report['gpu']}, torch {report['torch']}")
    report["gpu_tests"] = run_gpu_tests()
    print(f"tests marked gpu: {report['gpu_tests']['summary']}")
    shipped = load_bundle()
    opts = DecodeOptions.from_dict(shipped_info()["decoding_defaults"])
    models = {"shipped": (shipped, torch.float32, opts),
              "GPT-B (inflated shipped)": (inflate_bundle(shipped, "GPT-B"), torch.float32, opts)}
    if not args.skip_xl:
        models["GPT-XL (inflated shipped)"] = (inflate_bundle(shipped, "GPT-XL"), torch.float16, opts)
    for name, (bundle, dtype, opts) in models.items():
        engines = torch_engines(copy.deepcopy(bundle), "cuda", dtype)
        steps = step_latencies(engines, opts)
        e2e = end_to_end(bundle, dtype, opts, args.images)
        report[name] = {"steps": steps, "end_to_end": e2e}
        print(f"\n{name} ({str(dtype).removeprefix('torch.')})")
        print(f"{'step':24} {'eager ms':>9} {'graphs ms':>10}")
        for r in steps:
            label = f"{r['graph']}[new={r['new']}]" + (" (AR step)" if r["new"] == 1 else "")
            print(f"{label:24} {r['eager_ms']:9.3f} {r['graphs_ms']:10.3f}")
        print(f"{'mode':8} {'TPF':>5} {'eager s/img':>12} {'graphs s/img':>13}")
        for r in e2e:
            print(f"{r['mode']:8} {r['tpf']:5.2f} {r['eager_s_per_image']:12.3f} {r['graphs_s_per_image']:13.3f}")
        del engines
        torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT", "."))
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    sys.exit(report["gpu_tests"]["returncode"])


if __name__ == "__main__":
    main()
