"""Stage 2: the class-conditional target (LlamaGen c2i architecture, GPT-vvs-S) on tokenized photo crops."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.train.loop import Schedule, train


def train_target(labels: torch.Tensor, tokens: torch.Tensor, out_dir: Path, seed: int, steps: int = 1100,
                 batch: int = 32, lr: float = 1e-3) -> GPT:
    torch.manual_seed(seed)
    model = GPT(gpt_config("GPT-vvs-S"))
    null = model.config.null_class
    p_drop = model.config.class_dropout_prob

    def step_fn(step: int, gen: torch.Generator):
        pick = torch.randint(0, len(tokens), (batch,), generator=gen)
        cls = torch.where(torch.rand(batch, generator=gen) < p_drop, null, labels[pick])
        seq = tokens[pick]
        with torch.autocast("cpu", dtype=torch.bfloat16):  # about 1.5x faster on CPUs with bf16 support
            logits = model.teacher_forced(cls, seq[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), seq.flatten())
        return loss, {}

    train("target", model, step_fn, Schedule(steps=steps, lr=lr, warmup=100, weight_decay=0.05), out_dir, seed)
    return model
