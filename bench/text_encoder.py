"""The text encoder at the size LlamaGen's t2i checkpoints use: export time and size of the ``text_encode`` graph
of a T5 encoder with FLAN-T5-XL's architecture (random weights: the real ones cannot be fetched here; export
and run time do not depend on the values), and prompt encoding time on ONNX Runtime CPU — uncached, and again
from the per-process cache.

    .venv/bin/python bench/text_encoder.py --size flan-t5-xl --out /tmp/t5-bench
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from vvs.engines.onnxruntime_backend import open_session
from vvs.export.spec import text_encode_spec
from vvs.text.encoder import TextEncoder
from vvs.text.export import export_text_encoder
from vvs.train.text_encoder import t5_encoder, train_tokenizer

# the T5 encoders LlamaGen-class t2i targets are trained with: vocabulary, width, layers, heads, head dim, ff width
SIZES = {
    "flan-t5-xl": dict(vocab_size=32128, width=2048, layers=24, heads=32, head_dim=64, ff=5120),
    "flan-t5-base": dict(vocab_size=32128, width=768, layers=12, heads=12, head_dim=64, ff=2048),
}
PROMPTS = ["a photo of a cat sitting on a wooden table next to a window",
           "two people riding bicycles along a river at sunset, with mountains behind them",
           "a bowl of ramen with an egg, spring onions and slices of pork",
           "an old red car parked in front of a brick house on a quiet street"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="flan-t5-xl")
    ap.add_argument("--slots", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="/tmp/t5-bench")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    out = Path(args.out)
    tokenizer = train_tokenizer(PROMPTS * 4, vocab_size=64)  # its ids are all the graph needs
    encoder = t5_encoder(**SIZES[args.size])
    config = encoder.config
    parameters = sum(p.numel() for p in encoder.parameters())
    work = out / "folder"
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    entry, files = export_text_encoder(encoder, tokenizer, work, args.slots)
    export_s = time.perf_counter() - start
    sizes = {p.relative_to(work).as_posix(): p.stat().st_size for p in files}
    del encoder

    spec = text_encode_spec(args.slots, config.d_model)
    engine = open_session(work / entry["file"], spec, torch.device("cpu"), threads=args.threads)
    text = TextEncoder(Tokenizer.from_file(str(work / "text" / "tokenizer.json")), engine, args.slots,
                       torch.device("cpu"))
    rows = {}
    for batch in (1, 4):
        cold, warm = [], []
        for r in range(args.repeats + 1):
            prompts = [f"{p} {r}" for p in PROMPTS[:batch]]  # new text each repeat: no cache hits
            t = time.perf_counter()
            text.encode(prompts)
            if r:  # the first call warms the session up
                cold.append((time.perf_counter() - t) / batch)
            t = time.perf_counter()
            text.encode(prompts)
            warm.append((time.perf_counter() - t) / batch)
        rows[batch] = {"uncached_ms_per_prompt": 1000 * statistics.median(cold),
                       "cached_ms_per_prompt": 1000 * statistics.median(warm[1:])}
    result = {"size": args.size, "parameters": parameters,
              "export_s": export_s, "files_bytes": sizes, "total_bytes": sum(sizes.values()),
              "threads": args.threads, "slots": args.slots, "encode": rows}
    print(json.dumps(result, indent=1))
    (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
