"""The diffusion head on ONNX Runtime: the whole sampler as one graph (what ``vvs-export --model mar`` ships)
against one graph call per denoising step with the schedule arithmetic in the runtime (the alternative).

Usage: python bench/mar_head.py [--tokens 8,64,512] [--repeats 7] [--threads N] [--work /tmp/vvs-mar-head]

Exports the shipped target's head both ways, checks they give the same sample, and prints the median seconds
per call of each for several token counts (one image's step of the shipped schedule is ~8 tokens; a
verification of 8 draft steps ~64; a batch of 8 images' verifications ~512).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vvs.engines.onnxruntime_backend import open_session  # noqa: E402
from vvs.export.onnx_export import export_graph  # noqa: E402
from vvs.families.mar.graphs import HeadGraph, mar_graph_specs  # noqa: E402
from vvs.export.spec import GraphSpec, TensorSpec  # noqa: E402
from vvs.families.mar.bundle import load_mar_bundle  # noqa: E402


class NetGraph(nn.Module):
    """One step of the head: epsilon (guided) and the variance values, at one original timestep per token."""

    def __init__(self, diffloss):
        super().__init__()
        self.net, self.c = diffloss.net, diffloss.in_channels

    def forward(self, x, t, z_cond, z_uncond, cfg):
        n = x.shape[0]
        out = self.net(torch.cat([x, x]), torch.cat([t, t]), torch.cat([z_cond, z_uncond]))
        eps = out[n:, : self.c] + cfg[:, None] * (out[:n, : self.c] - out[n:, : self.c])
        return eps, out[:n, self.c :]


def net_spec(d: int, c: int) -> GraphSpec:
    return GraphSpec("head_step", (
        TensorSpec("x", "float32", ("tokens", c)), TensorSpec("t", "float32", ("tokens",)),
        TensorSpec("z_cond", "float32", ("tokens", d)), TensorSpec("z_uncond", "float32", ("tokens", d)),
        TensorSpec("cfg", "float32", ("tokens",)),
    ), (TensorSpec("eps", "float32", ("tokens", c)), TensorSpec("var_values", "float32", ("tokens", c))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="8,64,512")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--work", default="/tmp/vvs-mar-head")
    args = parser.parse_args()
    bundle = load_mar_bundle()
    model = bundle.target
    cfg = model.config
    d, c = cfg.decoder_embed_dim, cfg.token_embed_dim
    schedule = model.diffloss.sample_schedule
    work = Path(args.work)
    loop_spec = mar_graph_specs(cfg, cfg, bundle.image_size)["target_head"]
    for name, module, spec in (("loop", HeadGraph(model), loop_spec), ("step", NetGraph(model.diffloss),
                                                                        net_spec(d, c))):
        if not (work / f"{name}.onnx").is_file():  # the unrolled sampler takes minutes to export
            start = time.perf_counter()
            export_graph(module.eval(), spec, work / f"{name}.onnx", 2, 0)
            print(f"exported {name}.onnx in {time.perf_counter() - start:.0f} s")
    cpu = torch.device("cpu")
    loop = open_session(work / "loop.onnx", loop_spec, cpu, args.threads)
    step = open_session(work / "step.onnx", net_spec(d, c), cpu, args.threads)

    def by_steps(z_cond, z_uncond, cfg, temperature, noise, step_noise):
        x = noise
        for k in range(schedule.num_steps):
            i = schedule.num_steps - 1 - k
            t = torch.full((len(x),), float(schedule.timesteps[i]))
            out = step.run(x=x, t=t, z_cond=z_cond, z_uncond=z_uncond, cfg=cfg)
            mean, log_var = schedule.gaussian(out["eps"], out["var_values"], x, i, model.diffloss.clip)
            std = torch.exp(0.5 * log_var) * temperature[:, None]
            x = mean + std * step_noise[:, k]
        return x

    print(f"| tokens per call | whole sampler, 1 call (ms) | {schedule.num_steps} step calls (ms) | ratio |")
    print("|---|---|---|---|")
    for n in (int(v) for v in args.tokens.split(",")):
        gen = torch.Generator().manual_seed(n)
        inputs = dict(z_cond=torch.randn(n, d, generator=gen), z_uncond=torch.randn(n, d, generator=gen),
                      cfg=torch.full((n,), 2.0), temperature=torch.ones(n), noise=torch.randn(n, c, generator=gen),
                      step_noise=torch.randn(n, schedule.num_steps, c, generator=gen))
        torch.testing.assert_close(by_steps(**inputs), loop.run(**inputs)["sample"], atol=1e-3, rtol=1e-3)
        times = {"loop": [], "steps": []}
        for _ in range(args.repeats):
            for name, fn in (("loop", lambda: loop.run(**inputs)), ("steps", lambda: by_steps(**inputs))):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        a, b = (statistics.median(times[k]) * 1e3 for k in ("loop", "steps"))
        print(f"| {n} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
