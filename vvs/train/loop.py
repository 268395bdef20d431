"""A small resumable training loop: AdamW, warm-up + cosine schedule, JSONL log, periodic checkpoints."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm


@dataclass(frozen=True)
class Schedule:
    steps: int
    lr: float
    warmup: int = 100
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    final_lr_fraction: float = 0.1

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.final_lr_fraction + (1 - self.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


StepFn = Callable[[int, torch.Generator], tuple[torch.Tensor, dict[str, float]]]


def train(
    name: str,
    model: torch.nn.Module,
    step_fn: StepFn,
    schedule: Schedule,
    out_dir: Path,
    seed: int,
    checkpoint_every: int = 200,
    after_step: Callable[[int], None] | None = None,
) -> list[dict]:
    """Run ``schedule.steps`` optimisation steps of ``step_fn`` (loss, metrics); resume from ``out_dir`` if possible.

    The data generator is part of the checkpoint, so a resumed run sees the same batches as an uninterrupted one.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, log_path = out_dir / f"{name}.ckpt.pt", out_dir / f"{name}.log.jsonl"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=schedule.lr, betas=schedule.betas, weight_decay=schedule.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout
    start, log = 0, []
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        start = state["step"]
        log = [json.loads(line) for line in log_path.read_text().splitlines()][:start] if log_path.is_file() else []
    model.train()
    bar = tqdm(range(start, schedule.steps), desc=f"train {name}", initial=start, total=schedule.steps,
               dynamic_ncols=True)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = schedule.lr_at(step)
        loss, metrics = step_fn(step, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if schedule.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, schedule.grad_clip)
        opt.step()
        if after_step is not None:
            after_step(step)
        record = {"step": step, "loss": loss.detach().item(), "lr": schedule.lr_at(step), **metrics}
        log.append(record)
        bar.set_postfix(loss=f"{record['loss']:.4f}")
        if (step + 1) % checkpoint_every == 0 or step + 1 == schedule.steps:
            _atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                          "torch_rng": torch.get_rng_state(), "step": step + 1}, ckpt_path)
            log_path.write_text("".join(json.dumps(r) + "\n" for r in log))
    model.eval()
    return log


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:  # interrupted mid-write: the previous checkpoint stays, no partial file beside it
        tmp.unlink(missing_ok=True)


def plot_curves(logs: dict[str, list[dict]], path: Path) -> None:
    """One panel per stage: loss (smoothed) against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(logs), figsize=(4 * len(logs), 3.2), squeeze=False)
    for ax, (name, log) in zip(axes[0], logs.items()):
        steps = [r["step"] for r in log]
        loss = torch.tensor([r["loss"] for r in log])
        k = max(1, len(loss) // 50)
        smooth = torch.nn.functional.avg_pool1d(loss[None, None], k, 1, padding=0)[0, 0] if len(loss) > k else loss
        ax.plot(steps[: len(smooth)], smooth.tolist())
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
