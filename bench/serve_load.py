"""Load test: the same requests one by one, from concurrent threads on one Pipeline (continuous batching), and over
HTTP through vvs-serve (Ray Serve) with 1 and 2 replicas. Prints a markdown table of images/s and p50/p95 latency
and counts requests whose tokens differ from the one-by-one run; for the HTTP rows, the median of each phase the
replica reports (Server-Timing: request, tokens, pixels, encode) and the rest of the latency (HTTP and Ray's proxy).

    .venv/bin/vvs-export --model llamagen --force      # the shipped model's engine folder, once
    .venv/bin/python bench/serve_load.py --engine engines --mode vvs --requests 24
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from vvs.engines import load_engines
from vvs.runtime.pipeline import Pipeline


def load(call, requests, concurrency: int) -> tuple[float, list[float], list]:
    """Run ``call(request)`` for every request from ``concurrency`` threads; wall seconds, latencies, results."""
    def timed(request):
        start = time.perf_counter()
        out = call(request)
        return time.perf_counter() - start, out

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(timed, requests))
    return time.perf_counter() - start, [t for t, _ in done], [o for _, o in done]


def row(name: str, concurrency: int, wall: float, latencies: list[float], tokens: list, reference: list,
        phases: list[dict] | None = None) -> dict:
    q = statistics.quantiles(latencies, n=20, method="inclusive")
    out = {"setting": name, "clients": concurrency, "images_per_s": len(latencies) / wall,
           "p50_s": statistics.median(latencies), "p95_s": q[18], "wall_s": wall,
           "differ": sum(a != b for a, b in zip(tokens, reference))}
    if phases:
        out["server_p50_s"] = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
        out["outside_replica_p50_s"] = statistics.median(t - sum(p.values()) for t, p in zip(latencies, phases))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="engines")
    ap.add_argument("--mode", default="vvs")
    ap.add_argument("--requests", type=int, default=24, help="one image each: class i mod classes, seed i")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--out", default="bench/results/serve-load.json")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    pipe = Pipeline(load_engines(args.engine, "onnxruntime", threads=2), max_batch=args.max_batch)
    classes = pipe.engines.target.num_classes
    requests = [([i % classes], i) for i in range(args.requests)]
    pipe.generate([0], mode=args.mode, seed=10_000)  # warm-up

    def bare(request):
        return pipe.generate(request[0], mode=args.mode, seed=request[1]).tokens.tolist()

    rows = []
    wall, latencies, reference = load(bare, requests, 1)
    rows.append(row("Pipeline, one by one", 1, wall, latencies, reference, reference))
    for c in levels[1:]:
        wall, latencies, tokens = load(bare, requests, c)
        rows.append(row("Pipeline, continuous batching", c, wall, latencies, tokens, reference))
    pipe.close()

    import ray
    from ray import serve

    from vvs.serve.client import Client
    from vvs.serve.deployment import application, start_ray

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ray(num_cpus=2, logging_level="ERROR", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    client = Client(f"http://127.0.0.1:{port}", timeout=3600)

    def http(request):
        result = client.generate(request[0], mode=args.mode, seed=request[1])
        return result.tokens, result.server_seconds

    for replicas in [int(r) for r in args.replicas.split(",")]:
        serve.run(application(str(Path(args.engine).resolve()), backend="onnxruntime", max_batch=args.max_batch,
                              replicas=replicas, cpus_per_replica=2 / replicas), name="vvs")
        for _ in range(replicas * 2):
            http(([0], 10_000))  # warm-up, reaching every replica
        for c in levels:
            wall, latencies, answers = load(http, requests, c)
            rows.append(row(f"vvs-serve, {replicas} replica{'s' if replicas > 1 else ''}", c, wall, latencies,
                            [t for t, _ in answers], reference, [p for _, p in answers]))
        serve.delete("vvs")
    serve.shutdown()
    ray.shutdown()

    print(f"\n{args.requests} requests of one image, mode {args.mode}, ONNX Runtime CPU, max batch {args.max_batch}, "
          f"torch threads {torch.get_num_threads()}\n")
    print("| setting | clients | images/s | p50 latency s | p95 latency s | requests whose tokens differ |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['clients']} | {r['images_per_s']:.2f} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | "
              f"{r['differ']} |")
    print("\n| setting | clients | replica: request / tokens / pixels / encode ms (p50) | outside the replica ms |")
    print("|---|---|---|---|")
    for r in rows:
        if "server_p50_s" in r:
            split = " / ".join(f"{1000 * v:.1f}" for v in r["server_p50_s"].values())
            print(f"| {r['setting']} | {r['clients']} | {split} | {1000 * r['outside_replica_p50_s']:.1f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
