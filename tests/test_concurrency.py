"""One Pipeline, many threads: each call gets exactly the tokens it gets alone (issue 14's first step; the
generations share engines and sessions, never cache buffers)."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from vvs.engines import load_engines
from vvs.runtime.pipeline import Pipeline

REQUESTS = [([1, 2], 0, "vvs"), ([3, 4], 10, "sd"), ([5, 6], 20, "vvs"), ([7, 8], 30, "ar"), ([9, 0], 40, "lantern"),
            ([2, 5], 50, "vvs")]


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_concurrent_generations_equal_sequential_ones(tiny_folder, backend):
    pipe = Pipeline(load_engines(tiny_folder, backend, threads=1))
    opts = dict(temperature=1.0, cfg_scale=2.0, decode_images=False)

    def run(request):
        classes, seed, mode = request
        skips = {"skip_interval": 2} if mode == "vvs" else {}  # an option the mode does not read is refused
        return pipe.generate(torch.tensor(classes), mode=mode, seed=seed, **opts, **skips).tokens

    alone = [run(r) for r in REQUESTS]
    with ThreadPoolExecutor(max_workers=len(REQUESTS)) as pool:
        together = list(pool.map(run, REQUESTS * 2))
    for i, tokens in enumerate(together):
        assert torch.equal(tokens, alone[i % len(REQUESTS)]), f"request {i} was corrupted by another thread"
